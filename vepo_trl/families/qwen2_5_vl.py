"""Qwen2.5-VL, the paper's model: patch rows `(sum t*h*w, 3*2*14*14)` + `image_grid_thw`, CLIP's normalisation.

Its tiny model is the project's default one (`vepo_trl.testing.build_tiny_qwen2_5_vl`): every width of
`TinyModelConfig` applies to it, the vision tower's included, and its images are bounded by the config's pixels."""

from . import _qwen
from .base import CLIP_MEAN, CLIP_STD, Derived, Family, RealProcessor, TinyRecipe, patch_rows_layout


def _check_widths(build) -> None:
    if build.head_dim % 16:
        raise ValueError(
            f"hidden_size / num_attention_heads must be a multiple of 16 for M-RoPE, got {build.head_dim}"
        )


FAMILY = Family(
    "qwen2.5-vl",
    order=20,
    model_types=("qwen2_5_vl",),
    model_classes=("Qwen2_5_VLForConditionalGeneration",),
    pixel_values="patch rows `(sum t*h*w, 3*2*14*14)` + `image_grid_thw`",
    make_layout=patch_rows_layout,
    reference=("Qwen/Qwen2.5-VL-7B-Instruct", CLIP_STD),
    recipes=("Qwen2.5-VL-7B-Instruct/", "Qwen2.5-VL-3B-Instruct/"),
    tiny=TinyRecipe(
        model="Qwen2_5_VLForConditionalGeneration",
        config="Qwen2_5_VLConfig",
        processor="Qwen2_5_VLProcessor",
        **_qwen.TOKENS,
        chat_template=_qwen.QWEN2_5_VL_CHAT_TEMPLATE,
        image_processor=(
            "Qwen2VLImageProcessor",
            {
                "min_pixels": Derived(lambda build: build.config.min_pixels),
                "max_pixels": Derived(lambda build: build.config.max_pixels),
            },
        ),
        parts={"video_processor": ("Qwen2VLVideoProcessor", {})},
        text={
            **_qwen.TEXT,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": _qwen.MROPE_SECTION},
        },
        vision={
            "depth": Derived(lambda build: build.config.vision_depth),
            "hidden_size": Derived(lambda build: build.config.vision_hidden_size),
            "intermediate_size": Derived(lambda build: build.config.vision_hidden_size * 2),
            "num_heads": Derived(lambda build: build.config.vision_num_heads),
            "out_hidden_size": Derived(lambda build: build.config.hidden_size),
            "fullatt_block_indexes": Derived(lambda build: [build.config.vision_depth - 1]),
            "initializer_range": Derived(lambda build: build.config.initializer_range),
        },
        shared_vision=False,
        top=_qwen.IMAGE_TOKENS,
        **_qwen.GENERATION,
        generation_bos="<|endoftext|>",
        check=_check_widths,
    ),
)


# Qwen/Qwen2.5-VL-7B-Instruct preprocessor_config.json (read: the copy in github
# remodlai/qwen-2.5-vl-7b-instruct-lexiq): Qwen2_5_VLImageProcessor, min_pixels 3136, max_pixels 12845056, patch
# 14, temporal 2, merge 2, CLIP mean/std. config.json vision patch_size 14
REAL_PROCESSOR = RealProcessor(
    "Qwen/Qwen2.5-VL-7B-Instruct",
    "Qwen2VLImageProcessor",
    dict(
        min_pixels=3136,
        max_pixels=12845056,
        patch_size=14,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=CLIP_MEAN,
        image_std=list(CLIP_STD),
    ),
    "Qwen2_5_VLConfig",
    {"vision_config": {"patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}},
)
