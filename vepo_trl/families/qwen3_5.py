"""Qwen3.5: Qwen3-VL's images, a language model alternating Gated DeltaNet (linear attention) and full attention."""

from .base import HALF_STD, QWEN_MEDIA_TOKENS, Family, patch_rows_layout


FAMILY = Family(
    "qwen3.5",
    order=50,
    model_types=("qwen3_5",),
    model_classes=("Qwen3_5ForConditionalGeneration",),
    pixel_values="patch rows `(sum t*h*w, 3*2*16*16)` + `image_grid_thw`",
    make_layout=patch_rows_layout,
    reference=("Qwen/Qwen3.5-9B", HALF_STD),
    media_tokens=QWEN_MEDIA_TOKENS,
)
