"""LLaVA-OneVision: any-resolution crops `(n_images, n_crops, C, H, W)` + `image_sizes`; zero crops and each crop's
letterbox are padding."""

from ..builtin.tiny_recipes._qwen import QWEN_SPECIAL_TOKENS
from ..builtin.tiny_recipes.base import TinyRecipe, Tok
from .base import HALF_STD, QWEN_MEDIA_TOKENS, Family, InputLimits, RealProcessor, tiles_layout
from .llava import hub_key_names


FAMILY = Family(
    "llava-onevision",
    order=90,
    model_types=("llava_onevision",),
    model_classes=("LlavaOnevisionForConditionalGeneration",),
    pixel_values="crops `(n_images, n_crops, C, H, W)` + `image_sizes`, zero crops and each crop's letterbox are padding",
    make_layout=tiles_layout(),
    reference=("llava-hf/llava-onevision-qwen2-7b-ov-hf", HALF_STD),
    trl_limitation=(
        "TRL 1.16's GRPOTrainer fails whenever it runs a forward at rollout time (old log-probs when "
        "steps_per_generation x num_iterations does not divide gradient_accumulation_steps, vLLM importance "
        "sampling, a reference model with beta > 0): the processor's `batch_num_images` reaches "
        "`_get_per_token_logps_and_entropies` as an unknown keyword. VEPOTrainer drops that keyword and trains "
        "(rollout-time scoring and beta > 0 tested). Prompts with two or more images fail in TRL and are refused "
        "at start-up"
    ),
    limits=InputLimits(
        "LLaVA-OneVision",
        most_images=(1, "TRL 1.16 cannot split its crops per prompt. Keep one image per prompt for this family."),
    ),
    media_tokens=("<image>", "<video>", *QWEN_MEDIA_TOKENS),
)


# ---------------------------------------------------------------------------------------------------------------------
# The tiny model (`vepo_trl.builtin.tiny_models` builds it; `tiny-llava-onevision`)
# ---------------------------------------------------------------------------------------------------------------------

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


TINY_RECIPE = TinyRecipe(
    model="LlavaOnevisionForConditionalGeneration",
    config="LlavaOnevisionConfig",
    processor="LlavaOnevisionProcessor",
    tokens=(*QWEN_SPECIAL_TOKENS, "<image>", "<video>"),
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


# ---------------------------------------------------------------------------------------------------------------------
# The reference checkpoint as its processor and config see it, each value with its source
# (tests/test_perturb_real_processors.py, tests/test_builtin_tiny_recipes.py)
# ---------------------------------------------------------------------------------------------------------------------

LLAVA_ONEVISION_PINPOINTS = [[384 * i, 384 * j] for i in range(1, 7) for j in range(1, 7)]  # "anyres_max_9"

# llava-hf/llava-onevision-qwen2-7b-ov-hf preprocessor_config.json (as tests/test_perturb_layouts.py):
# LlavaOnevisionImageProcessor, size 384x384, mean/std 0.5, image_grid_pinpoints (384 i, 384 j) for i, j in 1..6.
# config.json vision (SigLIP so400m) image_size 384, patch_size 14
REFERENCE_PROCESSOR = RealProcessor(
    "llava-hf/llava-onevision-qwen2-7b-ov-hf",
    "LlavaOnevisionImageProcessor",
    dict(
        size={"height": 384, "width": 384},
        image_grid_pinpoints=LLAVA_ONEVISION_PINPOINTS,
        image_mean=list(HALF_STD),
        image_std=list(HALF_STD),
    ),
    "LlavaOnevisionConfig",
    {
        "vision_config": {"model_type": "siglip_vision_model", "image_size": 384, "patch_size": 14},
        "image_grid_pinpoints": LLAVA_ONEVISION_PINPOINTS,
    },
    real="anyres",
    tiles=True,
)


# llava-hf/llava-onevision-qwen2-7b-ov-hf config.json (read: the file's diff in its Hub commit bd59bb6 "Upload
# LlavaOnevisionForConditionalGeneration" (projector, text, tie, newline, aspect ratio; hidden_act
# gelu_pytorch_tanh and layer_norm_eps dropped from vision_config as SigLIP's defaults) and
# huggingface.co/mgoin/llava-onevision-qwen2-7b-ov-hf-bnb-full-4bit; github huggingface/transformers
# src/transformers/models/llava_onevision/convert_llava_onevision_weights_to_hf.py: SigLIP vision_use_head False,
# Qwen/Qwen2-7B-Instruct's text config, LlavaOnevisionConfig's vision_feature_layer -1 / "full" (class defaults;
# the sibling llava-hf/llava-interleave-qwen-7b-hf's file has -1 / "full"). Qwen2-7B-Instruct's rms_norm_eps 1e-6,
# tie false (read: its config.json as copied on the Hub, unsloth/Qwen2-7B-Instruct)
REFERENCE_CONFIG = {
    "checkpoint": "llava-hf/llava-onevision-qwen2-7b-ov-hf",
    "source": "read: huggingface.co/llava-hf/llava-onevision-qwen2-7b-ov-hf/commit/bd59bb6 (config.json diff); "
    "github huggingface/transformers .../llava_onevision/convert_llava_onevision_weights_to_hf.py; class defaults",
    "config": {
        "architectures": ["LlavaOnevisionForConditionalGeneration"],
        "model_type": "llava_onevision",
        "projector_hidden_act": "gelu",
        "tie_word_embeddings": False,
        "use_image_newline_parameter": True,
        "vision_aspect_ratio": "anyres_max_9",
        "text_config": {"model_type": "qwen2", "rope_theta": 1000000.0},
        "vision_config": {"model_type": "siglip_vision_model", "vision_use_head": False},
    },
    "implied": {
        "vision_feature_layer": -1,
        "vision_feature_select_strategy": "full",
        "multimodal_projector_bias": True,
        "text_config": {"hidden_act": "silu", "rms_norm_eps": 1e-06, "use_sliding_window": False},
        "vision_config": {"hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-06},
    },
    "unsourced": [],
}
