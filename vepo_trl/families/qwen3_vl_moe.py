"""Qwen3-VL-MoE: Qwen3-VL's images and vision tower, sparse experts in the language model."""

import dataclasses

from . import _qwen, qwen3_vl
from .base import HALF_STD, OMIT, Derived, Family, patch_rows_layout


FAMILY = Family(
    "qwen3-vl-moe",
    order=40,
    model_types=("qwen3_vl_moe",),
    model_classes=("Qwen3VLMoeForConditionalGeneration",),
    pixel_values="patch rows `(sum t*h*w, 3*2*16*16)` + `image_grid_thw`",
    make_layout=patch_rows_layout,
    reference=("Qwen/Qwen3-VL-30B-A3B-Instruct", HALF_STD),
    tiny=dataclasses.replace(
        qwen3_vl.FAMILY.tiny,
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
    ),
)


# Qwen/Qwen3-VL-30B-A3B-Instruct: as qwen3-vl, the same preprocessor_config.json and vision tower (card)
REAL_PROCESSOR = dataclasses.replace(
    qwen3_vl.REAL_PROCESSOR, checkpoint="Qwen/Qwen3-VL-30B-A3B-Instruct", config="Qwen3VLMoeConfig"
)
