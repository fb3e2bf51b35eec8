"""The tiny mistral3 model as data (its runtime adapter is `vepo_trl.families.mistral3`)."""

from .base import Derived, TinyRecipe, Tok


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


FAMILY = "mistral3"
RECIPE = TinyRecipe(
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
