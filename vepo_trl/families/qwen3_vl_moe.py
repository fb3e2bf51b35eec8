"""Qwen3-VL-MoE: Qwen3-VL's images and vision tower, sparse experts in the language model."""

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
