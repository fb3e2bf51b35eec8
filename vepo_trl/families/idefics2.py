"""Idefics2: tiles `(B, n_tiles, C, H, W)` + `pixel_attention_mask`; zero tiles and unmasked pixels are padding."""

from .base import HALF_STD, Family, tiles_layout


FAMILY = Family(
    "idefics2",
    order=130,
    model_types=("idefics2",),
    model_classes=("Idefics2ForConditionalGeneration",),
    pixel_values="tiles `(B, n_tiles, C, H, W)` + `pixel_attention_mask`, zero tiles and unmasked pixels are padding",
    make_layout=tiles_layout(zero_tile_is_padding=True, crop_to_pixel_mask=True),
    reference=("HuggingFaceM4/idefics2-8b", HALF_STD),
    media_tokens=("<image>", "<fake_token_around_image>"),
    # Images resized between 28 and 56 px and split into 4 crops plus the whole image, 14 px patches, a perceiver
    # resampler to 4 latents per crop (the real idefics2-8b: 378..980 px, patch 14, 64 latents), mean = std = 0.5
)
