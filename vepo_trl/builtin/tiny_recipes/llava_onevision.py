"""The tiny llava-onevision model as data (its runtime adapter is `vepo_trl.families.llava_onevision`)."""

from . import _qwen
from .base import TinyRecipe, Tok
from .llava import hub_key_names


# Its chat template (Qwen2 turns, `<image>` placeholders before the text), as its Hub processors ship it
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}<image>\n"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# Any-resolution crops of 28 px (2x2 patches of 14) on a grid of up to 2x2, plus the resized whole image
PINPOINTS = [[28, 28], [28, 56], [56, 28], [56, 56]]


FAMILY = "llava-onevision"
RECIPE = TinyRecipe(
    model="LlavaOnevisionForConditionalGeneration",
    config="LlavaOnevisionConfig",
    processor="LlavaOnevisionProcessor",
    tokens=(*_qwen.QWEN_SPECIAL_TOKENS, "<image>", "<video>"),
    eos="<|im_end|>",
    pad="<|endoftext|>",
    chat_template=CHAT_TEMPLATE,
    # SigLIP's normalisation, as llava-onevision-qwen2-7b-ov-hf's preprocessor_config.json (mean = std = 0.5)
    image_processor=(
        "LlavaOnevisionImageProcessor",
        {
            "size": {"height": 28, "width": 28},
            "image_grid_pinpoints": PINPOINTS,
            "image_mean": [0.5] * 3,
            "image_std": [0.5] * 3,
        },
    ),
    parts={"video_processor": ("LlavaOnevisionVideoProcessor", {})},
    processor_args={"num_image_tokens": 4, "vision_feature_select_strategy": "full"},
    text={
        "model_type": "qwen2",
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
        "pad_token_id": Tok("<|endoftext|>"),
        "eos_token_id": Tok("<|im_end|>"),
    },
    vision={"model_type": "siglip_vision_model", "image_size": 28, "patch_size": 14, "vision_use_head": False},
    top={
        "image_token_index": Tok("<image>"),
        "video_token_index": Tok("<video>"),
        "image_grid_pinpoints": PINPOINTS,
        "vision_feature_select_strategy": "full",
        "vision_feature_layer": -1,
    },
    stop=("<|im_end|>", "<|endoftext|>"),
    finish=hub_key_names,
)
