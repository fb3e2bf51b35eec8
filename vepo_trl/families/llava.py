"""LLaVA (1.5, and Pixtral-in-LLaVA checkpoints): images `(n_images, C, H, W)`. A CLIP / SigLIP LLaVA's images are all
one size; a Pixtral one (mistral-community/pixtral-12b) pads them to the batch's largest and says each one's size in
`image_sizes`."""

from ..builtin.tiny_recipes.base import TinyRecipe, Tok
from .base import CLIP_MEAN, CLIP_STD, Family, RealProcessor, tiles_layout


FAMILY = Family(
    "llava",
    order=110,
    model_types=("llava",),
    model_classes=("LlavaForConditionalGeneration",),
    pixel_values="images `(n_images, C, H, W)`; Pixtral-in-LLaVA checkpoints zero-padded + `image_sizes`",
    make_layout=tiles_layout(crop_to_image_sizes=True),
    reference=("llava-hf/llava-1.5-7b-hf", CLIP_STD),
    media_tokens=("<image>",),
    # CLIP at 56 px: resize the shortest edge, centre crop, 4x4 patches of 14 + CLS (dropped by the "default" feature
    # strategy): 16 tokens per image (the real LLaVA-1.5: 336 px, 24x24 patches, 576 tokens)
)


# ---------------------------------------------------------------------------------------------------------------------
# The tiny model (`vepo_trl.builtin.tiny_models` builds it; `tiny-llava`)
# ---------------------------------------------------------------------------------------------------------------------

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


TINY_RECIPE = TinyRecipe(
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


# ---------------------------------------------------------------------------------------------------------------------
# The reference checkpoint as its processor and config see it, each value with its source
# (tests/test_perturb_real_processors.py, tests/test_builtin_tiny_recipes.py)
# ---------------------------------------------------------------------------------------------------------------------

# llava-hf/llava-1.5-7b-hf preprocessor_config.json: CLIPImageProcessor, shortest_edge 336, center crop 336x336,
# CLIP mean/std, resample 3 (card, not read here; the class defaults are 224). config.json vision (CLIP
# ViT-L/14-336) image_size 336, patch_size 14
REFERENCE_PROCESSOR = RealProcessor(
    "llava-hf/llava-1.5-7b-hf",
    "CLIPImageProcessor",
    dict(
        size={"shortest_edge": 336},
        crop_size={"height": 336, "width": 336},
        image_mean=CLIP_MEAN,
        image_std=list(CLIP_STD),
        resample=3,
    ),
    "LlavaConfig",
    {"vision_config": {"model_type": "clip_vision_model", "image_size": 336, "patch_size": 14}},
)


# llava-hf/llava-1.5-7b-hf config.json (read: a public training log printing it as loaded from the Hub cache,
# models--llava-hf--llava-1.5-7b-hf; public test fixtures quoting it agree). Sparse text and vision configs: the
# rest are LlamaConfig's and CLIPVisionConfig's defaults ("implied": quick_gelu, layer_norm_eps 1e-5).
# vision_feature_layer -2, vision_feature_select_strategy "default" (checked)
REFERENCE_CONFIG = {
    "checkpoint": "llava-hf/llava-1.5-7b-hf",
    "source": "read: a public log printing the file loaded from the Hub cache (models--llava-hf--llava-1.5-7b-hf); "
    "public fixtures quoting it agree",
    "config": {
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "projector_hidden_act": "gelu",
        "tie_word_embeddings": False,
        "vision_feature_layer": -2,
        "vision_feature_select_strategy": "default",
        "text_config": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "rms_norm_eps": 1e-05},
        "vision_config": {"model_type": "clip_vision_model"},
    },
    "implied": {
        "multimodal_projector_bias": True,
        "text_config": {"hidden_act": "silu", "rope_theta": 10000.0, "attention_bias": False},
        "vision_config": {"hidden_act": "quick_gelu", "layer_norm_eps": 1e-05},
    },
    "unsourced": [],
}
