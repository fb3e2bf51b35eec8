"""Qwen3.5-MoE: Qwen3.5 with sparse experts and a shared expert in every layer (the real: 256 experts, 8 per token)."""

import dataclasses

from . import qwen3_5
from .base import HALF_STD, QWEN_MEDIA_TOKENS, Family, Pattern, patch_rows_layout


FAMILY = Family(
    "qwen3.5-moe",
    order=60,
    model_types=("qwen3_5_moe",),
    model_classes=("Qwen3_5MoeForConditionalGeneration",),
    pixel_values="patch rows `(sum t*h*w, 3*2*16*16)` + `image_grid_thw`",
    make_layout=patch_rows_layout,
    reference=("Qwen/Qwen3.5-35B-A3B", HALF_STD),
    media_tokens=QWEN_MEDIA_TOKENS,
)


# ---------------------------------------------------------------------------------------------------------------------
# The tiny model (`vepo_trl.builtin.tiny_models` builds it; `tiny-qwen3.5-moe`)
# ---------------------------------------------------------------------------------------------------------------------

TINY_RECIPE = dataclasses.replace(
    qwen3_5.TINY_RECIPE,
    model="Qwen3_5MoeForConditionalGeneration",
    config="Qwen3_5MoeConfig",
    text={
        **qwen3_5.TEXT,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "num_experts": 4,
        "num_experts_per_tok": 2,
    },
)


# ---------------------------------------------------------------------------------------------------------------------
# The reference checkpoint as its processor and config see it, each value with its source
# (tests/test_perturb_real_processors.py, tests/test_builtin_tiny_recipes.py)
# ---------------------------------------------------------------------------------------------------------------------

# Qwen/Qwen3.5-35B-A3B: as qwen3.5, its preprocessor_config.json and vision tower (card)
REFERENCE_PROCESSOR = dataclasses.replace(
    qwen3_5.REFERENCE_PROCESSOR, checkpoint="Qwen/Qwen3.5-35B-A3B", config="Qwen3_5MoeConfig"
)


# Qwen/Qwen3.5-35B-A3B config.json (not read: a public fixture shaped as its text config, an mlx-lm
# GatedDeltaNet reference (hidden 2048, 40 layers, 256 experts, 8 active), gives the text fields below; its
# layer_types pattern and model types are also Qwen3_5MoeConfig's class defaults, whose docstring names this
# checkpoint). M-RoPE sections, tie_word_embeddings and the vision_config not read
REFERENCE_CONFIG = {
    "checkpoint": "Qwen/Qwen3.5-35B-A3B",
    "source": "a public fixture shaped as its text config (an mlx-lm GatedDeltaNet reference); class defaults",
    "config": {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": {
            "model_type": "qwen3_5_moe_text",
            "full_attention_interval": 4,
            "layer_types": Pattern(("linear_attention", "linear_attention", "linear_attention", "full_attention")),
            "linear_conv_kernel_dim": 4,
            "norm_topk_prob": True,
            "rms_norm_eps": 1e-06,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25},
        },
    },
    "unsourced": [
        "text_config.rope_parameters.mrope_section",
        "text_config.rope_parameters.mrope_interleaved",
        "tie_word_embeddings",
        "vision_config",
    ],
}
