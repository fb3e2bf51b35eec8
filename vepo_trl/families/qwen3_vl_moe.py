"""Qwen3-VL-MoE: Qwen3-VL's images and vision tower, sparse experts in the language model."""

from . import _qwen
from .base import HALF_STD, OMIT, Derived, Family, RealProcessor, TinyRecipe, patch_rows_layout


FAMILY = Family(
    "qwen3-vl-moe",
    order=40,
    model_types=("qwen3_vl_moe",),
    model_classes=("Qwen3VLMoeForConditionalGeneration",),
    pixel_values="patch rows `(sum t*h*w, 3*2*16*16)` + `image_grid_thw`",
    make_layout=patch_rows_layout,
    reference=("Qwen/Qwen3-VL-30B-A3B-Instruct", HALF_STD),
    tiny=TinyRecipe(
        model="Qwen3VLMoeForConditionalGeneration",
        config="Qwen3VLMoeConfig",
        processor="Qwen3VLProcessor",
        **_qwen.TOKENS,
        chat_template="trl:qwen3_vl_chat_template",
        image_processor=_qwen.image_processor(16, half_stats=True),
        parts=_qwen.QWEN3_PARTS,
        text={
            **_qwen.QWEN3_TEXT,
            "moe_intermediate_size": 32,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "decoder_sparse_step": 1,
            # vLLM reads it at its widths (real checkpoints carry it; transformers 5 declares none)
            "norm_topk_prob": Derived(lambda build: True if _qwen.wide(build) else OMIT),
        },
        vision=_qwen.QWEN3_VISION,
        shared_vision=False,
        top=_qwen.IMAGE_TOKENS,
        **_qwen.GENERATION,
    ),
)


# Qwen/Qwen3-VL-30B-A3B-Instruct: as qwen3-vl, the same preprocessor_config.json and vision tower (card)
REAL_PROCESSOR = RealProcessor(
    "Qwen/Qwen3-VL-30B-A3B-Instruct",
    "Qwen2VLImageProcessor",
    dict(
        size={"shortest_edge": 65536, "longest_edge": 16777216},
        patch_size=16,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=list(HALF_STD),
        image_std=list(HALF_STD),
    ),
    "Qwen3VLMoeConfig",
    {"vision_config": {"patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2}},
)
