"""The tiny llava model as data (its runtime adapter is `vepo_trl.families.llava`)."""

from .base import TinyRecipe, Tok


# LLaVA-1.5's chat template (Vicuna turns, `<image>` before the text), as llava-hf/llava-1.5-7b-hf's processor ships it
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}{% endif %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}"
    "{% endfor %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)


def hub_key_names(model, build):
    """Save with the Hub checkpoints' key names (`vision_tower.vision_model.*`, as vLLM loads them): transformers 5
    reverses its load-time renames on save only for a model it loaded, so the built model gets the ones it would have
    loaded with. `from_pretrained` reads the folder unchanged."""
    from transformers.conversion_mapping import get_model_conversion_mapping

    model._weight_conversions = get_model_conversion_mapping(model, add_legacy=False)


FAMILY = "llava"
RECIPE = TinyRecipe(
    model="LlavaForConditionalGeneration",
    config="LlavaConfig",
    processor="LlavaProcessor",
    tokens=("<unk>", "<s>", "</s>", "<image>", "<pad>"),
    bos="<s>",
    eos="</s>",
    pad="<pad>",
    chat_template=CHAT_TEMPLATE,
    image_processor=(
        "CLIPImageProcessor",
        {"size": {"shortest_edge": 56}, "crop_size": {"height": 56, "width": 56}},
    ),
    processor_args={
        "patch_size": 14,
        "vision_feature_select_strategy": "default",
        "num_additional_image_tokens": 1,
    },
    text={
        "model_type": "llama",
        "rms_norm_eps": 1e-5,
        "pad_token_id": Tok("<pad>"),
        "eos_token_id": Tok("</s>"),
        "bos_token_id": Tok("<s>"),
    },
    vision={"model_type": "clip_vision_model", "image_size": 56, "patch_size": 14},
    top={
        "image_token_index": Tok("<image>"),
        "vision_feature_select_strategy": "default",
        "vision_feature_layer": -2,
        "image_seq_length": 16,
    },
    stop=("</s>",),
    finish=hub_key_names,
)
