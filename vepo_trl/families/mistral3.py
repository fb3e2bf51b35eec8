"""Mistral 3 (Mistral-Small-3.1, Pixtral's vision tower): images `(n_images, C, H_max, W_max)` zero-padded +
`image_sizes`."""

from .base import CLIP_MEAN, CLIP_STD, Derived, Family, RealProcessor, TinyRecipe, Tok, tiles_layout


SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]", "<pad>")
# Mistral's instruct format with image parts, as Mistral-Small-3.1's template renders a user turn with images
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}[INST]"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}[IMG]{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}[/INST]"
    "{% elif message['role'] == 'assistant' %}{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}{{ content['text'] }}{% endfor %}{% endif %}{{ eos_token }}"
    "{% endif %}{% endfor %}"
)

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
    # Images at their own aspect ratio up to 64 px, 8x8 patches merged 2x2 (the real: 1540 px, 14 px patches)
    tiny=TinyRecipe(
        model="Mistral3ForConditionalGeneration",
        config="Mistral3Config",
        processor="PixtralProcessor",
        tokens=SPECIAL_TOKENS,
        bos="<s>",
        eos="</s>",
        pad="<pad>",
        chat_template=CHAT_TEMPLATE,
        image_processor=("PixtralImageProcessor", {"size": {"longest_edge": 64}, "patch_size": 8}),
        processor_args={"patch_size": 8, "spatial_merge_size": 2},
        text={
            "model_type": "mistral",
            "head_dim": Derived(lambda build: build.head_dim),
            "sliding_window": None,
            "pad_token_id": Tok("<pad>"),
            "eos_token_id": Tok("</s>"),
            "bos_token_id": Tok("<s>"),
        },
        vision={"model_type": "pixtral", "head_dim": 16, "image_size": 64, "patch_size": 8},
        top={"image_token_index": Tok("[IMG]"), "spatial_merge_size": 2, "tie_word_embeddings": False},
        stop=("</s>",),
        suppress=("[IMG]", "[IMG_BREAK]", "[IMG_END]"),
    ),
)


# mistralai/Mistral-Small-3.1-24B-Instruct-2503 preprocessor_config.json (read: Mistral 3 / Pixtral bundles' files
# in public fixtures): PixtralImageProcessor, size longest_edge 1540, patch_size 14, CLIP mean/std, resample 3.
# processor_config.json: patch_size 14, spatial_merge_size 2, so PixtralProcessor hands the image processor
# patch_size 14 x 2 = 28 on each call. config.json vision (Pixtral) image_size 1540, patch_size 14
REAL_PROCESSOR = RealProcessor(
    "mistralai/Mistral-Small-3.1-24B-Instruct-2503",
    "PixtralImageProcessor",
    dict(
        size={"longest_edge": 1540},
        patch_size={"height": 14, "width": 14},
        image_mean=CLIP_MEAN,
        image_std=list(CLIP_STD),
        resample=3,
    ),
    "Mistral3Config",
    {"vision_config": {"model_type": "pixtral", "image_size": 1540, "patch_size": 14}, "spatial_merge_size": 2},
    call={"patch_size": {"height": 28, "width": 28}},
    real="image_sizes",
)
