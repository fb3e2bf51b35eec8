"""SmolVLM (and Idefics3, its architecture): tiles `(B, n_tiles, C, H, W)` + `pixel_attention_mask`, zero tiles are
padding."""

from .base import HALF_STD, Family, tiles_layout


FAMILY = Family(
    "smolvlm",
    order=80,
    model_types=("smolvlm", "idefics3"),
    model_classes=("SmolVLMForConditionalGeneration", "Idefics3ForConditionalGeneration"),
    pixel_values="tiles `(B, n_tiles, C, H, W)` + `pixel_attention_mask`, zero tiles are padding",
    make_layout=tiles_layout(zero_tile_is_padding=True),
    reference=("HuggingFaceTB/SmolVLM2-2.2B-Instruct", HALF_STD),
    media_tokens=(
        "<image>",
        "<fake_token_around_image>",
        "<global-img>",
        *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)),
    ),
    # Images resized to at most 64 px and split into 32x32 tiles plus the downscaled whole image, 8x8 patches, pixel
    # shuffle 2: 4 tokens per tile (the real SmolVLM2: 512 px tiles, patch 16, 64 tokens). Its processor spells
    # numbers with `num2words` (a dependency of the processor, not of VEPO)
)
