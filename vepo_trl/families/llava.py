"""LLaVA (1.5, and Pixtral-in-LLaVA checkpoints): images `(n_images, C, H, W)`. A CLIP / SigLIP LLaVA's images are all
one size; a Pixtral one (mistral-community/pixtral-12b) pads them to the batch's largest and says each one's size in
`image_sizes`."""

from .base import CLIP_STD, Family, tiles_layout


FAMILY = Family(
    "llava",
    order=110,
    model_types=("llava",),
    model_classes=("LlavaForConditionalGeneration",),
    pixel_values="images `(n_images, C, H, W)`; Pixtral-in-LLaVA checkpoints zero-padded + `image_sizes`",
    make_layout=tiles_layout(crop_to_image_sizes=True),
    reference=("llava-hf/llava-1.5-7b-hf", CLIP_STD),
    media_tokens=("<image>",),
    # CLIP at 56 px: resize the shortest edge, centre crop, 4x4 patches of 14 + CLS (dropped by the "default" feature
    # strategy): 16 tokens per image (the real LLaVA-1.5: 336 px, 24x24 patches, 576 tokens)
)
