"""Qwen3-VL: patch rows `(sum t*h*w, 3*2*16*16)` + `image_grid_thw`, mean = std = 0.5."""

from ..builtin.tiny_recipes._qwen import (
    GENERATION,
    IMAGE_TOKENS,
    QWEN3_PARTS,
    QWEN3_TEXT,
    QWEN3_VISION,
    TOKENS,
    image_processor,
)
from ..builtin.tiny_recipes.base import TinyRecipe
from .base import HALF_STD, QWEN_MEDIA_TOKENS, Family, RealProcessor, patch_rows_layout


FAMILY = Family(
    "qwen3-vl",
    order=30,
    model_types=("qwen3_vl",),
    model_classes=("Qwen3VLForConditionalGeneration",),
    pixel_values="patch rows `(sum t*h*w, 3*2*16*16)` + `image_grid_thw`",
    make_layout=patch_rows_layout,
    reference=("Qwen/Qwen3-VL-8B-Instruct", HALF_STD),
    recipes=("Qwen3-VL-4B-Instruct/", "Qwen3-VL-8B-Instruct/"),
    media_tokens=QWEN_MEDIA_TOKENS,
)


# ---------------------------------------------------------------------------------------------------------------------
# The tiny model (`vepo_trl.builtin.tiny_models` builds it; `tiny-qwen3-vl`)
# ---------------------------------------------------------------------------------------------------------------------

TINY_RECIPE = TinyRecipe(
    model="Qwen3VLForConditionalGeneration",
    config="Qwen3VLConfig",
    processor="Qwen3VLProcessor",
    **TOKENS,
    chat_template="trl:qwen3_vl_chat_template",
    image_processor=image_processor(16, half_stats=True),
    parts=QWEN3_PARTS,
    text=QWEN3_TEXT,
    vision=QWEN3_VISION,
    shared_vision=False,
    top=IMAGE_TOKENS,
    **GENERATION,
)


# ---------------------------------------------------------------------------------------------------------------------
# The reference checkpoint as its processor and config see it, each value with its source
# (tests/test_perturb_real_processors.py, tests/test_builtin_tiny_recipes.py)
# ---------------------------------------------------------------------------------------------------------------------

# What the Qwen3-VL and Qwen3.5 files below both say (each cites its own source): Qwen2VLImageProcessorFast at 16-px
# patches, size 65536 / 16777216, temporal 2, merge 2, mean/std 0.5; config.json vision patch_size 16
QWEN3_PREPROCESSOR = dict(
    size={"shortest_edge": 65536, "longest_edge": 16777216},
    patch_size=16,
    temporal_patch_size=2,
    merge_size=2,
    image_mean=list(HALF_STD),
    image_std=list(HALF_STD),
)

QWEN3_VISION = {"vision_config": {"patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2}}

# Qwen/Qwen3-VL-8B-Instruct preprocessor_config.json: Qwen2VLImageProcessorFast, size shortest_edge 65536,
# longest_edge 16777216, patch 16, temporal 2, merge 2, mean/std 0.5 (read: copies of the Qwen3-VL-family file in
# several public test fixtures agree; card for this checkpoint). config.json vision patch_size 16
REFERENCE_PROCESSOR = RealProcessor(
    "Qwen/Qwen3-VL-8B-Instruct",
    "Qwen2VLImageProcessor",
    QWEN3_PREPROCESSOR,
    "Qwen3VLConfig",
    QWEN3_VISION,
)


# Qwen/Qwen3-VL-8B-Instruct config.json (read: QWEN3_VL_8B_CONFIG in github NVIDIA/TensorRT-LLM
# tests/unittest/_torch/modeling/test_modeling_qwen3vl.py, the file with its depth cut for the test). Interleaved
# M-RoPE [24, 20, 20] of head_dim 128; transformers 5 folds rope_theta into text_config.rope_parameters
REFERENCE_CONFIG = {
    "checkpoint": "Qwen/Qwen3-VL-8B-Instruct",
    "source": "read: github NVIDIA/TensorRT-LLM tests/unittest/_torch/modeling/test_modeling_qwen3vl.py "
    "(QWEN3_VL_8B_CONFIG)",
    "config": {
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "tie_word_embeddings": False,
        "text_config": {
            "model_type": "qwen3_vl_text",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "hidden_act": "silu",
            "initializer_range": 0.02,
            "rms_norm_eps": 1e-06,
            "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
            "rope_theta": 5000000,
            "tie_word_embeddings": False,
            "use_cache": True,
        },
        "vision_config": {
            "model_type": "qwen3_vl",
            "hidden_act": "gelu_pytorch_tanh",
            "in_channels": 3,
            "initializer_range": 0.02,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
    },
    "unsourced": [],
}
