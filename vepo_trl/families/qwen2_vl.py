"""Qwen2-VL: patch rows `(sum t*h*w, 3*2*14*14)` + `image_grid_thw`, CLIP's normalisation."""

from . import _qwen
from .base import CLIP_MEAN, CLIP_STD, Derived, Family, RealProcessor, TinyRecipe, patch_rows_layout


FAMILY = Family(
    "qwen2-vl",
    order=10,
    model_types=("qwen2_vl",),
    model_classes=("Qwen2VLForConditionalGeneration",),
    pixel_values="patch rows `(sum t*h*w, 3*2*14*14)` + `image_grid_thw`",
    make_layout=patch_rows_layout,
    reference=("Qwen/Qwen2-VL-7B-Instruct", CLIP_STD),
    tiny=TinyRecipe(
        model="Qwen2VLForConditionalGeneration",
        config="Qwen2VLConfig",
        processor="Qwen2VLProcessor",
        **_qwen.TOKENS,
        chat_template=_qwen.QWEN2_5_VL_CHAT_TEMPLATE,
        image_processor=_qwen.image_processor(14),
        parts={"video_processor": ("Qwen2VLVideoProcessor", {})},
        text={
            **_qwen.TEXT,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": _qwen.MROPE_SECTION},
        },
        vision={
            "depth": 2,
            "embed_dim": 32,
            "hidden_size": Derived(lambda build: build.config.hidden_size),
            "num_heads": 2,
            "mlp_ratio": 2,
        },
        shared_vision=False,
        top=_qwen.IMAGE_TOKENS,
        **_qwen.GENERATION,
    ),
)


# Qwen/Qwen2-VL-7B-Instruct preprocessor_config.json: Qwen2VLImageProcessor, min_pixels 3136, max_pixels 12845056,
# patch_size 14, temporal_patch_size 2, merge_size 2, CLIP mean/std (card: Qwen2.5-VL's file below, read, has the
# same; patch, merge, temporal and stats are also the class defaults, max_pixels not: 1003520 there). config.json
# vision patch_size 14
REAL_PROCESSOR = RealProcessor(
    "Qwen/Qwen2-VL-7B-Instruct",
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
    "Qwen2VLConfig",
    {"vision_config": {"patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}},
)
