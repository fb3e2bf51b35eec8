"""Qwen3-VL-MoE: Qwen3-VL's images and vision tower, sparse experts in the language model."""

import dataclasses

from ..builtin.tiny_recipes._qwen import QWEN3_TEXT, wide
from ..builtin.tiny_recipes.base import OMIT, Derived
from . import qwen3_vl
from .base import HALF_STD, QWEN_MEDIA_TOKENS, Family, patch_rows_layout


FAMILY = Family(
    "qwen3-vl-moe",
    order=40,
    model_types=("qwen3_vl_moe",),
    model_classes=("Qwen3VLMoeForConditionalGeneration",),
    pixel_values="patch rows `(sum t*h*w, 3*2*16*16)` + `image_grid_thw`",
    make_layout=patch_rows_layout,
    reference=("Qwen/Qwen3-VL-30B-A3B-Instruct", HALF_STD),
    media_tokens=QWEN_MEDIA_TOKENS,
)


# ---------------------------------------------------------------------------------------------------------------------
# The tiny model (`vepo_trl.builtin.tiny_models` builds it; `tiny-qwen3-vl-moe`)
# ---------------------------------------------------------------------------------------------------------------------

TINY_RECIPE = dataclasses.replace(
    qwen3_vl.TINY_RECIPE,
    model="Qwen3VLMoeForConditionalGeneration",
    config="Qwen3VLMoeConfig",
    text={
        **QWEN3_TEXT,
        "moe_intermediate_size": 32,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        # vLLM reads it at its widths (real checkpoints carry it; transformers 5 declares none)
        "norm_topk_prob": Derived(lambda build: True if wide(build) else OMIT),
    },
)


# ---------------------------------------------------------------------------------------------------------------------
# The reference checkpoint as its processor and config see it, each value with its source
# (tests/test_perturb_real_processors.py, tests/test_builtin_tiny_recipes.py)
# ---------------------------------------------------------------------------------------------------------------------

# Qwen/Qwen3-VL-30B-A3B-Instruct: as qwen3-vl, the same preprocessor_config.json and vision tower (card)
REFERENCE_PROCESSOR = dataclasses.replace(
    qwen3_vl.REFERENCE_PROCESSOR, checkpoint="Qwen/Qwen3-VL-30B-A3B-Instruct", config="Qwen3VLMoeConfig"
)


# Qwen/Qwen3-VL-30B-A3B-Instruct config.json (read: QWEN3_VL_30B_A3B_CONFIG in github NVIDIA/TensorRT-LLM
# tests/unittest/_torch/modeling/test_modeling_qwen3vl_moe.py, the file with its depth cut for the test): as
# qwen3_vl, plus the MoE text fields (norm_topk_prob true: transformers 5.24's Qwen3VLMoeTextConfig declares none)
REFERENCE_CONFIG = {
    "checkpoint": "Qwen/Qwen3-VL-30B-A3B-Instruct",
    "source": "read: github NVIDIA/TensorRT-LLM tests/unittest/_torch/modeling/test_modeling_qwen3vl_moe.py "
    "(QWEN3_VL_30B_A3B_CONFIG)",
    "config": {
        "architectures": ["Qwen3VLMoeForConditionalGeneration"],
        "model_type": "qwen3_vl_moe",
        "tie_word_embeddings": False,
        "text_config": {
            "model_type": "qwen3_vl_moe_text",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "decoder_sparse_step": 1,
            "hidden_act": "silu",
            "initializer_range": 0.02,
            "norm_topk_prob": True,
            "rms_norm_eps": 1e-06,
            "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
            "rope_theta": 5000000,
            "use_cache": True,
        },
        "vision_config": {
            "model_type": "qwen3_vl_moe",
            "hidden_act": "gelu_pytorch_tanh",
            "in_channels": 3,
            "initializer_range": 0.02,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
    },
    "unsourced": [],
}
