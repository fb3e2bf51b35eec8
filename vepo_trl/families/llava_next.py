"""LLaVA-NeXT: any-resolution crops `(n_images, n_crops, C, H, W)` + `image_sizes`; zero crops and each crop's
letterbox are padding."""

from ..builtin.tiny_recipes.base import Derived, TinyRecipe, Tok
from .base import CLIP_MEAN, CLIP_STD, Family, RealProcessor, tiles_layout
from .llava import hub_key_names


FAMILY = Family(
    "llava-next",
    order=100,
    model_types=("llava_next",),
    model_classes=("LlavaNextForConditionalGeneration",),
    pixel_values="crops `(n_images, n_crops, C, H, W)` + `image_sizes`, zero crops and each crop's letterbox are padding",
    make_layout=tiles_layout(),
    reference=("llava-hf/llava-v1.6-mistral-7b-hf", CLIP_STD),
    media_tokens=("<image>",),
)


# ---------------------------------------------------------------------------------------------------------------------
# The tiny model (`vepo_trl.builtin.tiny_models` builds it; `tiny-llava-next`)
# ---------------------------------------------------------------------------------------------------------------------

# CLIP at 28 px (2x2 patches of 14 + CLS, dropped by the "default" feature strategy), any-resolution grids of up to 2x2
# crops plus the resized whole image (the real LLaVA-NeXT: 336 px, 24x24 patches, up to 672 px grids)
PINPOINTS = [[28, 28], [28, 56], [56, 28], [56, 56]]


TINY_RECIPE = TinyRecipe(
    model="LlavaNextForConditionalGeneration",
    config="LlavaNextConfig",
    processor="LlavaNextProcessor",
    tokens=("<unk>", "<s>", "</s>", "<image>", "<pad>"),
    bos="<s>",
    eos="</s>",
    pad="<pad>",
    chat_template="trl:llava_next_chat_template",
    image_processor=(
        "LlavaNextImageProcessor",
        {
            "size": {"shortest_edge": 28},
            "crop_size": {"height": 28, "width": 28},
            "image_grid_pinpoints": PINPOINTS,
        },
    ),
    processor_args={
        "patch_size": 14,
        "vision_feature_select_strategy": "default",
        "num_additional_image_tokens": 1,
    },
    text={
        "model_type": "mistral",
        "head_dim": Derived(lambda build: build.head_dim),
        "sliding_window": None,
        "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
        "pad_token_id": Tok("<pad>"),
        "eos_token_id": Tok("</s>"),
        "bos_token_id": Tok("<s>"),
    },
    vision={"model_type": "clip_vision_model", "image_size": 28, "patch_size": 14},
    top={
        "image_token_index": Tok("<image>"),
        "image_grid_pinpoints": PINPOINTS,
        "vision_feature_select_strategy": "default",
        "vision_feature_layer": -2,
        "image_seq_length": 4,
    },
    stop=("</s>",),
    finish=hub_key_names,
)


# ---------------------------------------------------------------------------------------------------------------------
# The reference checkpoint as its processor and config see it, each value with its source
# (tests/test_perturb_real_processors.py, tests/test_builtin_tiny_recipes.py)
# ---------------------------------------------------------------------------------------------------------------------

LLAVA_NEXT_PINPOINTS = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]

# llava-hf/llava-v1.6-mistral-7b-hf preprocessor_config.json (as tests/test_perturb_layouts.py):
# LlavaNextImageProcessor, shortest_edge 336, crop 336x336, CLIP mean/std, the 5 LLAVA_NEXT_PINPOINTS. config.json
# vision (CLIP ViT-L/14-336) image_size 336, patch_size 14
REFERENCE_PROCESSOR = RealProcessor(
    "llava-hf/llava-v1.6-mistral-7b-hf",
    "LlavaNextImageProcessor",
    dict(
        size={"shortest_edge": 336},
        crop_size={"height": 336, "width": 336},
        image_grid_pinpoints=LLAVA_NEXT_PINPOINTS,
        image_mean=CLIP_MEAN,
        image_std=list(CLIP_STD),
    ),
    "LlavaNextConfig",
    {
        "vision_config": {"model_type": "clip_vision_model", "image_size": 336, "patch_size": 14},
        "image_grid_pinpoints": LLAVA_NEXT_PINPOINTS,
    },
    real="anyres",
    tiles=True,
)


# llava-hf/llava-v1.6-mistral-7b-hf config.json (read: LLAVA_NEXT_7B_CONFIG in github NVIDIA/TensorRT-LLM
# tests/unittest/_torch/modeling/test_modeling_llava_next.py, the file with its vision depth cut for the test).
# vision_feature_layer -2, "default" (checked); Mistral-7B-Instruct-v0.2 text: rope_theta 1e6, no sliding window
REFERENCE_CONFIG = {
    "checkpoint": "llava-hf/llava-v1.6-mistral-7b-hf",
    "source": "read: github NVIDIA/TensorRT-LLM tests/unittest/_torch/modeling/test_modeling_llava_next.py "
    "(LLAVA_NEXT_7B_CONFIG)",
    "config": {
        "architectures": ["LlavaNextForConditionalGeneration"],
        "model_type": "llava_next",
        "projector_hidden_act": "gelu",
        "use_image_newline_parameter": True,
        "vision_feature_layer": -2,
        "vision_feature_select_strategy": "default",
        "text_config": {
            "architectures": ["MistralForCausalLM"],
            "model_type": "mistral",
            "rms_norm_eps": 1e-05,
            "rope_theta": 1000000.0,
        },
        "vision_config": {"model_type": "clip_vision_model"},
    },
    "implied": {
        "tie_word_embeddings": False,
        "multimodal_projector_bias": True,
        "text_config": {"hidden_act": "silu"},
        "vision_config": {"hidden_act": "quick_gelu", "layer_norm_eps": 1e-05},
    },
    "unsourced": [],
}
