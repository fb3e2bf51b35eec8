"""The tiny qwen3.5-moe model as data (its runtime adapter is `vepo_trl.families.qwen3_5_moe`)."""

import dataclasses

from . import qwen3_5


FAMILY = "qwen3.5-moe"
RECIPE = dataclasses.replace(
    qwen3_5.RECIPE,
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
