"""Qwen3.5-MoE: Qwen3.5 with sparse experts and a shared expert in every layer (the real: 256 experts, 8 per token)."""

from .base import HALF_STD, QWEN_MEDIA_TOKENS, Family, patch_rows_layout


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
