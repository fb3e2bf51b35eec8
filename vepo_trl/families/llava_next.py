"""LLaVA-NeXT: any-resolution crops `(n_images, n_crops, C, H, W)` + `image_sizes`; zero crops and each crop's
letterbox are padding."""

from .base import CLIP_STD, Family, tiles_layout


FAMILY = Family(
    "llava-next",
    order=100,
    model_types=("llava_next",),
    model_classes=("LlavaNextForConditionalGeneration",),
    pixel_values="crops `(n_images, n_crops, C, H, W)` + `image_sizes`, zero crops and each crop's letterbox are padding",
    make_layout=tiles_layout(),
    reference=("llava-hf/llava-v1.6-mistral-7b-hf", CLIP_STD),
    media_tokens=("<image>",),
)
