"""The tiny qwen3-vl-moe model as data (its runtime adapter is `vepo_trl.families.qwen3_vl_moe`)."""

import dataclasses

from . import _qwen, qwen3_vl
from .base import OMIT, Derived


FAMILY = "qwen3-vl-moe"
RECIPE = dataclasses.replace(
    qwen3_vl.RECIPE,
    model="Qwen3VLMoeForConditionalGeneration",
    config="Qwen3VLMoeConfig",
    text={
        **_qwen.QWEN3_TEXT,
        "moe_intermediate_size": 32,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        # vLLM reads it at its widths (real checkpoints carry it; transformers 5 declares none)
        "norm_topk_prob": Derived(lambda build: True if _qwen.wide(build) else OMIT),
    },
)
