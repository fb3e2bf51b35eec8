"""Qwen3-VL: patch rows `(sum t*h*w, 3*2*16*16)` + `image_grid_thw`, mean = std = 0.5."""

from .base import HALF_STD, QWEN_MEDIA_TOKENS, Family, patch_rows_layout


FAMILY = Family(
    "qwen3-vl",
    order=30,
    model_types=("qwen3_vl",),
    model_classes=("Qwen3VLForConditionalGeneration",),
    pixel_values="patch rows `(sum t*h*w, 3*2*16*16)` + `image_grid_thw`",
    make_layout=patch_rows_layout,
    reference=("Qwen/Qwen3-VL-8B-Instruct", HALF_STD),
    recipes=("Qwen3-VL-4B-Instruct/", "Qwen3-VL-8B-Instruct/"),
    media_tokens=QWEN_MEDIA_TOKENS,
)
