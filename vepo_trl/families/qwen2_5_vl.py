"""Qwen2.5-VL, the paper's model: patch rows `(sum t*h*w, 3*2*14*14)` + `image_grid_thw`, CLIP's normalisation.

Its tiny model is the project's default one (`vepo_trl.builtin.tiny_models.build_tiny_qwen2_5_vl`): every width of
`TinyModelConfig` applies to it, the vision tower's included, and its images are bounded by the config's pixels."""

from .base import CLIP_STD, QWEN_MEDIA_TOKENS, Family, patch_rows_layout


FAMILY = Family(
    "qwen2.5-vl",
    order=20,
    model_types=("qwen2_5_vl",),
    model_classes=("Qwen2_5_VLForConditionalGeneration",),
    pixel_values="patch rows `(sum t*h*w, 3*2*14*14)` + `image_grid_thw`",
    make_layout=patch_rows_layout,
    reference=("Qwen/Qwen2.5-VL-7B-Instruct", CLIP_STD),
    recipes=("Qwen2.5-VL-7B-Instruct/", "Qwen2.5-VL-3B-Instruct/"),
    media_tokens=QWEN_MEDIA_TOKENS,
)
