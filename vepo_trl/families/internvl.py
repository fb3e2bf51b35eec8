"""InternVL (the -hf checkpoints): tiles `(n_tiles, C, H, W)`, split per prompt by TRL's `num_tiles`."""

from ..builtin.tiny_recipes._qwen import QWEN_SPECIAL_TOKENS
from ..builtin.tiny_recipes.base import TinyRecipe, Tok
from . import llava_onevision
from .base import IMAGENET_MEAN, IMAGENET_STD, QWEN_MEDIA_TOKENS, Family, RealProcessor, tiles_layout


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


# ---------------------------------------------------------------------------------------------------------------------
# The tiny model (`vepo_trl.builtin.tiny_models` builds it; `tiny-internvl`)
# ---------------------------------------------------------------------------------------------------------------------

# Its chat template (Qwen2 turns; the processor expands each `<IMG_CONTEXT>` into the image's tiles' tokens)
CHAT_TEMPLATE = llava_onevision.CHAT_TEMPLATE.replace("<image>", "<IMG_CONTEXT>")


TINY_RECIPE = TinyRecipe(
    model="InternVLForConditionalGeneration",
    config="InternVLConfig",
    processor="InternVLProcessor",
    tokens=(*QWEN_SPECIAL_TOKENS, "<img>", "</img>", "<IMG_CONTEXT>", "<video>"),
    eos="<|im_end|>",
    pad="<|endoftext|>",
    named_tokens={
        "start_image_token": "<img>",
        "end_image_token": "</img>",
        "context_image_token": "<IMG_CONTEXT>",
        "video_token": "<video>",
    },
    chat_template=CHAT_TEMPLATE,
    image_processor=(
        "GotOcr2ImageProcessor",
        {
            "size": {"height": 28, "width": 28},
            "crop_to_patches": True,
            "min_patches": 1,
            "max_patches": 4,
            "image_mean": [0.485, 0.456, 0.406],
            "image_std": [0.229, 0.224, 0.225],
        },
    ),
    parts={"video_processor": ("InternVLVideoProcessor", {})},
    processor_args={"image_seq_length": 1},
    text={"model_type": "qwen2", "pad_token_id": Tok("<|endoftext|>"), "eos_token_id": Tok("<|im_end|>")},
    vision={"image_size": [28, 28], "patch_size": [14, 14]},
    top={
        "image_token_id": Tok("<IMG_CONTEXT>"),
        "image_seq_length": 1,
        "downsample_ratio": 0.5,
        "tie_word_embeddings": False,
    },
    stop=("<|im_end|>", "<|endoftext|>"),
)


# ---------------------------------------------------------------------------------------------------------------------
# The reference checkpoint as its processor and config see it, each value with its source
# (tests/test_perturb_real_processors.py, tests/test_builtin_tiny_recipes.py)
# ---------------------------------------------------------------------------------------------------------------------

# OpenGVLab/InternVL3-8B-hf preprocessor_config.json: GotOcr2ImageProcessorFast, size 448x448, min_patches 1,
# max_patches 12, ImageNet mean/std (card; a public spec of InternVL3.5-8B-HF's processor reads 448 px tiles, 1 to
# 12 of them; vepo_trl/builtin/tiny_models.py's tiny InternVL cites the stats). crop_to_patches is InternVLProcessor's
# images_kwargs default (True), passed on each call as the processor does. config.json vision image_size
# [448, 448], patch_size [14, 14]
REFERENCE_PROCESSOR = RealProcessor(
    "OpenGVLab/InternVL3-8B-hf",
    "GotOcr2ImageProcessor",
    dict(
        size={"height": 448, "width": 448},
        min_patches=1,
        max_patches=12,
        image_mean=IMAGENET_MEAN,
        image_std=list(IMAGENET_STD),
    ),
    "InternVLConfig",
    {"vision_config": {"image_size": [448, 448], "patch_size": [14, 14]}},
    call={"crop_to_patches": True},
    tiles=True,
)


# OpenGVLab/InternVL3-8B-hf config.json (as its siblings: huggingface.co/OpenGVLab/InternVL3-38B-hf config.json
# (refs/pr/2) and InternVL3-1B-hf's (huggingface.co/hf-internal-testing/tiny-processor-internvl) read, same
# converter; github/gitcode Ascend MindSpeed-MM examples/internvl3/model_8B.json gives the 8B's own Qwen2.5 text
# recipe, which agrees: rope_theta 1e6, dynamic rope scaling factor 2, eps 1e-6, select_layer -1, downsample 0.5).
# Not read for the 8B: its vision tower's fields (InternViT-300M; the 38B's is InternViT-6B)
REFERENCE_CONFIG = {
    "checkpoint": "OpenGVLab/InternVL3-8B-hf",
    "source": "as huggingface.co/OpenGVLab/InternVL3-38B-hf/blob/refs%2Fpr%2F2/config.json and "
    "hf-internal-testing/tiny-processor-internvl; gitcode Ascend/MindSpeed-MM examples/internvl3/model_8B.json",
    "config": {
        "architectures": ["InternVLForConditionalGeneration"],
        "model_type": "internvl",
        "downsample_ratio": 0.5,
        "projector_hidden_act": "gelu",
        "text_config": {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "attention_dropout": 0.0,
            "hidden_act": "silu",
            "initializer_range": 0.02,
            "rms_norm_eps": 1e-06,
            "rope_scaling": {"factor": 2.0, "rope_type": "dynamic", "type": "dynamic"},
            "rope_theta": 1000000.0,
            "use_sliding_window": False,
            "use_cache": True,
        },
        "vision_config": {"architectures": ["InternVisionModel"], "hidden_act": "gelu"},
    },
    "implied": {"vision_feature_layer": -1, "vision_feature_select_strategy": "default"},
    "unsourced": ["tie_word_embeddings", "vision_config (InternViT-300M: attention_bias, norm_type, eps)"],
}
