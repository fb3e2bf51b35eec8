"""The tiny paligemma model as data (its runtime adapter is `vepo_trl.families.paligemma`)."""

from .base import Derived, TinyRecipe, Tok


# PaliGemma has no chat turns: its image tokens, then the prompt (the processor adds `<bos>` after the images and the
# closing newline), as its processor expects; the template renders a conversation's images and text in that form
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['content'] is not string %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<image>{% endif %}{% endfor %}{% endif %}{% endfor %}"
    "{% for message in messages %}{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{% endfor %}"
)


_HIDDEN = Derived(lambda build: build.config.hidden_size)


FAMILY = "paligemma"
RECIPE = TinyRecipe(
    model="PaliGemmaForConditionalGeneration",
    config="PaliGemmaConfig",
    processor="PaliGemmaProcessor",
    tokens=("<pad>", "<eos>", "<bos>", "<unk>", "<image>"),
    bos="<bos>",
    eos="<eos>",
    pad="<pad>",
    named_tokens={"image_token": "<image>"},
    chat_template=CHAT_TEMPLATE,
    image_processor=("SiglipImageProcessor", {"size": {"height": 56, "width": 56}}),
    image_processor_attrs={"image_seq_length": 16},
    text={
        "model_type": "gemma",
        "head_dim": Derived(lambda build: build.head_dim),
        "pad_token_id": Tok("<pad>"),
        "eos_token_id": Tok("<eos>"),
        "bos_token_id": Tok("<bos>"),
    },
    vision={
        "model_type": "siglip_vision_model",
        "vision_use_head": False,
        "image_size": 56,
        "patch_size": 14,
        "projection_dim": _HIDDEN,
    },
    top={
        "image_token_index": Tok("<image>"),
        "projection_dim": _HIDDEN,
        "hidden_size": _HIDDEN,
        "vocab_size": Derived(lambda build: build.vocab),
        "tie_word_embeddings": False,
    },
    stop=("<eos>",),
)
