"""Mistral 3 (Mistral-Small-3.1, Pixtral's vision tower): images `(n_images, C, H_max, W_max)` zero-padded +
`image_sizes`."""

from ..builtin.tiny_recipes.base import Derived, TinyRecipe, Tok
from .base import CLIP_MEAN, CLIP_STD, Family, RealProcessor, tiles_layout


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


# ---------------------------------------------------------------------------------------------------------------------
# The tiny model (`vepo_trl.builtin.tiny_models` builds it; `tiny-mistral3`)
# ---------------------------------------------------------------------------------------------------------------------

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


TINY_RECIPE = TinyRecipe(
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
        "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e9},
        "pad_token_id": Tok("<pad>"),
        "eos_token_id": Tok("</s>"),
        "bos_token_id": Tok("<s>"),
    },
    vision={"model_type": "pixtral", "hidden_act": "silu", "head_dim": 16, "image_size": 64, "patch_size": 8},
    top={"image_token_index": Tok("[IMG]"), "spatial_merge_size": 2, "tie_word_embeddings": False},
    stop=("</s>",),
)


# ---------------------------------------------------------------------------------------------------------------------
# The reference checkpoint as its processor and config see it, each value with its source
# (tests/test_perturb_real_processors.py, tests/test_builtin_tiny_recipes.py)
# ---------------------------------------------------------------------------------------------------------------------

# mistralai/Mistral-Small-3.1-24B-Instruct-2503 preprocessor_config.json (read: Mistral 3 / Pixtral bundles' files
# in public fixtures): PixtralImageProcessor, size longest_edge 1540, patch_size 14, CLIP mean/std, resample 3.
# processor_config.json: patch_size 14, spatial_merge_size 2, so PixtralProcessor hands the image processor
# patch_size 14 x 2 = 28 on each call. config.json vision (Pixtral) image_size 1540, patch_size 14
REFERENCE_PROCESSOR = RealProcessor(
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


# mistralai/Mistral-Small-3.1-24B-Instruct-2503 config.json (read: the mistral_small_3_1_24b_config fixture in
# github NVIDIA/TensorRT-LLM tests/unittest/_torch/modeling/test_modeling_mistral.py, the file with its text depth
# cut for the test). Pixtral vision: silu (gated MLP), rope_theta 1e4; text rope_theta 1e9, no sliding window;
# projector without bias, 2x2 patch merge, last vision layer
REFERENCE_CONFIG = {
    "checkpoint": "mistralai/Mistral-Small-3.1-24B-Instruct-2503",
    "source": "read: github NVIDIA/TensorRT-LLM tests/unittest/_torch/modeling/test_modeling_mistral.py "
    "(mistral_small_3_1_24b_config)",
    "config": {
        "architectures": ["Mistral3ForConditionalGeneration"],
        "model_type": "mistral3",
        "multimodal_projector_bias": False,
        "projector_hidden_act": "gelu",
        "spatial_merge_size": 2,
        "vision_feature_layer": -1,
        "text_config": {
            "model_type": "mistral",
            "attention_dropout": 0.0,
            "hidden_act": "silu",
            "initializer_range": 0.02,
            "rms_norm_eps": 1e-05,
            "rope_theta": 1000000000.0,
            "use_cache": True,
        },
        "vision_config": {
            "model_type": "pixtral",
            "attention_dropout": 0.0,
            "hidden_act": "silu",
            "initializer_range": 0.02,
            "num_channels": 3,
            "rope_theta": 10000.0,
        },
    },
    "unsourced": ["tie_word_embeddings"],
}
