"""Qwen2.5-VL, the paper's model: patch rows `(sum t*h*w, 3*2*14*14)` + `image_grid_thw`, CLIP's normalisation.

Its tiny model is the project's default one (`vepo_trl.builtin.tiny_models.build_tiny_qwen2_5_vl`): every width of
`TinyModelConfig` applies to it, the vision tower's included, and its images are bounded by the config's pixels."""

from ..builtin.tiny_recipes._qwen import (
    GENERATION,
    IMAGE_TOKENS,
    MROPE_SECTION,
    QWEN2_5_VL_CHAT_TEMPLATE,
    TEXT,
    TOKENS,
)
from ..builtin.tiny_recipes.base import Derived, TinyRecipe
from .base import CLIP_MEAN, CLIP_STD, QWEN_MEDIA_TOKENS, Family, RealProcessor, patch_rows_layout


FAMILY = Family(
    "qwen2.5-vl",
    order=20,
    model_types=("qwen2_5_vl",),
    model_classes=("Qwen2_5_VLForConditionalGeneration",),
    pixel_values="patch rows `(sum t*h*w, 3*2*14*14)` + `image_grid_thw`",
    make_layout=patch_rows_layout,
    reference=("Qwen/Qwen2.5-VL-7B-Instruct", CLIP_STD),
    recipes=("Qwen2.5-VL-7B-Instruct/", "Qwen2.5-VL-3B-Instruct/"),
    media_tokens=QWEN_MEDIA_TOKENS,
)


# ---------------------------------------------------------------------------------------------------------------------
# The tiny model (`vepo_trl.builtin.tiny_models` builds it; `tiny-qwen2.5-vl`)
# ---------------------------------------------------------------------------------------------------------------------

TINY_RECIPE = TinyRecipe(
    model="Qwen2_5_VLForConditionalGeneration",
    config="Qwen2_5_VLConfig",
    processor="Qwen2_5_VLProcessor",
    **TOKENS,
    chat_template=QWEN2_5_VL_CHAT_TEMPLATE,
    image_processor=(
        "Qwen2VLImageProcessor",
        {
            "min_pixels": Derived(lambda build: build.config.min_pixels),
            "max_pixels": Derived(lambda build: build.config.max_pixels),
        },
    ),
    parts={"video_processor": ("Qwen2VLVideoProcessor", {})},
    text={
        **TEXT,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": MROPE_SECTION},
        "rms_norm_eps": 1e-6,
    },
    vision={
        "depth": Derived(lambda build: build.config.vision_depth),
        "hidden_size": Derived(lambda build: build.config.vision_hidden_size),
        "intermediate_size": Derived(lambda build: build.config.vision_hidden_size * 2),
        "num_heads": Derived(lambda build: build.config.vision_num_heads),
        "out_hidden_size": Derived(lambda build: build.config.hidden_size),
        "fullatt_block_indexes": Derived(lambda build: [build.config.vision_depth - 1]),
        "initializer_range": Derived(lambda build: build.config.initializer_range),
        "tokens_per_second": 2,
    },
    shared_vision=False,
    top=IMAGE_TOKENS,
    **GENERATION,
    generation_bos="<|endoftext|>",
    head_dim_multiple=16,  # M-RoPE
)


# ---------------------------------------------------------------------------------------------------------------------
# The reference checkpoint as its processor and config see it, each value with its source
# (tests/test_perturb_real_processors.py, tests/test_builtin_tiny_recipes.py)
# ---------------------------------------------------------------------------------------------------------------------

# Qwen/Qwen2.5-VL-7B-Instruct preprocessor_config.json (read: the copy in github
# remodlai/qwen-2.5-vl-7b-instruct-lexiq): Qwen2_5_VLImageProcessor, min_pixels 3136, max_pixels 12845056, patch
# 14, temporal 2, merge 2, CLIP mean/std. config.json vision patch_size 14
REFERENCE_PROCESSOR = RealProcessor(
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


# Qwen/Qwen2.5-VL-7B-Instruct config.json (read: QWEN2_5_VL_7B_CONFIG in github NVIDIA/TensorRT-LLM
# tests/unittest/_torch/modeling/test_modeling_qwen2_5vl.py, the file with its depths cut for the test; a public
# README quoting the file with keys of its own added agrees, with fullatt_block_indexes [7, 15, 23, 31]). Flat text fields as Qwen2-VL's
# (transformers 5: text_config, rope_parameters). Vision: silu (a SwiGLU MLP), RMSNorm, window attention
REFERENCE_CONFIG = {
    "checkpoint": "Qwen/Qwen2.5-VL-7B-Instruct",
    "source": "read: github NVIDIA/TensorRT-LLM tests/unittest/_torch/modeling/test_modeling_qwen2_5vl.py "
    "(QWEN2_5_VL_7B_CONFIG)",
    "config": {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": "qwen2_5_vl",
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "use_cache": True,
        "vision_config": {
            "hidden_act": "silu",
            "in_chans": 3,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "tokens_per_second": 2,
        },
    },
    "unsourced": [],
}
