"""GLM-4.1V: Qwen2-VL-style patch rows `(sum t*h*w, 3*2*14*14)` + `image_grid_thw`, CLIP's normalisation."""

from .base import CLIP_STD, Family, patch_rows_layout


FAMILY = Family(
    "glm4v",
    order=150,
    model_types=("glm4v",),
    model_classes=("Glm4vForConditionalGeneration",),
    pixel_values="patch rows `(sum t*h*w, 3*2*14*14)` + `image_grid_thw`",
    make_layout=patch_rows_layout,
    reference=("zai-org/GLM-4.1V-9B-Thinking", CLIP_STD),
    media_tokens=(
        "<|image|>",
        "<|video|>",
        "<|begin_of_image|>",
        "<|end_of_image|>",
        "<|begin_of_video|>",
        "<|end_of_video|>",
    ),
    # 14 px patches, 2 temporal copies, merged 2x2 (as the real GLM-4.1V)
)
