"""Qwen3.5-MoE: Qwen3.5 with sparse experts and a shared expert in every layer (the real: 256 experts, 8 per token)."""

import dataclasses

from . import qwen3_5
from .base import HALF_STD, Family, patch_rows_layout


FAMILY = Family(
    "qwen3.5-moe",
    order=60,
    model_types=("qwen3_5_moe",),
    model_classes=("Qwen3_5MoeForConditionalGeneration",),
    pixel_values="patch rows `(sum t*h*w, 3*2*16*16)` + `image_grid_thw`",
    make_layout=patch_rows_layout,
    reference=("Qwen/Qwen3.5-35B-A3B", HALF_STD),
    tiny=dataclasses.replace(
        qwen3_5.FAMILY.tiny,
        model="Qwen3_5MoeForConditionalGeneration",
        config="Qwen3_5MoeConfig",
        text={
            **qwen3_5.TEXT,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32,
            "num_experts": 4,
            "num_experts_per_tok": 2,
        },
    ),
)


# Qwen/Qwen3.5-35B-A3B: as qwen3.5, its preprocessor_config.json and vision tower (card)
REAL_PROCESSOR = dataclasses.replace(
    qwen3_5.REAL_PROCESSOR, checkpoint="Qwen/Qwen3.5-35B-A3B", config="Qwen3_5MoeConfig"
)
