"""Qwen2-VL: patch rows `(sum t*h*w, 3*2*14*14)` + `image_grid_thw`, CLIP's normalisation."""

from .base import CLIP_STD, QWEN_MEDIA_TOKENS, Family, patch_rows_layout


FAMILY = Family(
    "qwen2-vl",
    order=10,
    model_types=("qwen2_vl",),
    model_classes=("Qwen2VLForConditionalGeneration",),
    pixel_values="patch rows `(sum t*h*w, 3*2*14*14)` + `image_grid_thw`",
    make_layout=patch_rows_layout,
    reference=("Qwen/Qwen2-VL-7B-Instruct", CLIP_STD),
    media_tokens=QWEN_MEDIA_TOKENS,
)
