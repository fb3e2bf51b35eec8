"""InternVL (the -hf checkpoints): tiles `(n_tiles, C, H, W)`, split per prompt by TRL's `num_tiles`."""

from .base import IMAGENET_STD, QWEN_MEDIA_TOKENS, Family, tiles_layout


FAMILY = Family(
    "internvl",
    order=140,
    model_types=("internvl",),
    model_classes=("InternVLForConditionalGeneration",),
    pixel_values="tiles `(n_tiles, C, H, W)`, split per prompt by TRL's `num_tiles`",
    make_layout=tiles_layout(),
    tiles_per_prompt=True,
    reference=("OpenGVLab/InternVL3-8B-hf", IMAGENET_STD),
    media_tokens=("<IMG_CONTEXT>", "<img>", "</img>", "<video>", *QWEN_MEDIA_TOKENS),
    # 28 px tiles (2x2 patches of 14, pixel-shuffled to 1 token), 1 to 4 tiles plus a thumbnail per image (the real
    # InternVL3: 448 px tiles, 256 tokens, up to 12 tiles); ImageNet's normalisation, as InternVL3-8B-hf's
    # preprocessor_config.json
)
