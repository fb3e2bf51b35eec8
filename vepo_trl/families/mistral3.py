"""Mistral 3 (Mistral-Small-3.1, Pixtral's vision tower): images `(n_images, C, H_max, W_max)` zero-padded +
`image_sizes`."""

from .base import CLIP_STD, Family, tiles_layout


FAMILY = Family(
    "mistral3",
    order=160,
    model_types=("mistral3",),
    model_classes=("Mistral3ForConditionalGeneration",),
    pixel_values="images `(n_images, C, H_max, W_max)` zero-padded + `image_sizes`",
    make_layout=tiles_layout(crop_to_image_sizes=True),
    reference=("mistralai/Mistral-Small-3.1-24B-Instruct-2503", CLIP_STD),
    trl_limitation=(
        "TRL 1.16's GRPOTrainer fails on any batch whose prompts differ in length: PixtralProcessor returns "
        "tensors by default, so TRL's unpadded prompt tokenisation raises 'Unable to create tensor'. VEPOTrainer "
        "tokenises such prompts padded and drops the padding (`prompt_padding`), as TRL does for transformers 5.3"
    ),
    media_tokens=("[IMG]", "[IMG_BREAK]", "[IMG_END]"),
    # Images at their own aspect ratio up to 64 px, 8x8 patches merged 2x2 (the real: 1540 px, 14 px patches)
)
