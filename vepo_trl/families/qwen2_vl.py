"""Qwen2-VL: patch rows `(sum t*h*w, 3*2*14*14)` + `image_grid_thw`, CLIP's normalisation."""

from ..builtin.tiny_recipes._qwen import (
    GENERATION,
    IMAGE_TOKENS,
    MROPE_SECTION,
    QWEN2_5_VL_CHAT_TEMPLATE,
    TEXT,
    TOKENS,
    image_processor,
)
from ..builtin.tiny_recipes.base import Derived, TinyRecipe
from .base import CLIP_MEAN, CLIP_STD, QWEN_MEDIA_TOKENS, Family, RealProcessor, patch_rows_layout


FAMILY = Family(
    "qwen2-vl",
    order=10,
    model_types=("qwen2_vl",),
    model_classes=("Qwen2VLForConditionalGeneration",),
    pixel_values="patch rows `(sum t*h*w, 3*2*14*14)` + `image_grid_thw`",
    make_layout=patch_rows_layout,
    reference=("Qwen/Qwen2-VL-7B-Instruct", CLIP_STD),
    media_tokens=QWEN_MEDIA_TOKENS,
)


# ---------------------------------------------------------------------------------------------------------------------
# The tiny model (`vepo_trl.builtin.tiny_models` builds it; `tiny-qwen2-vl`)
# ---------------------------------------------------------------------------------------------------------------------

TINY_RECIPE = TinyRecipe(
    model="Qwen2VLForConditionalGeneration",
    config="Qwen2VLConfig",
    processor="Qwen2VLProcessor",
    **TOKENS,
    chat_template=QWEN2_5_VL_CHAT_TEMPLATE,
    image_processor=image_processor(14),
    parts={"video_processor": ("Qwen2VLVideoProcessor", {})},
    text={
        **TEXT,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": MROPE_SECTION},
        "rms_norm_eps": 1e-6,
    },
    vision={
        "depth": 2,
        "embed_dim": 32,
        "hidden_size": Derived(lambda build: build.config.hidden_size),
        "num_heads": 2,
        "mlp_ratio": 2,
    },
    shared_vision=False,
    top=IMAGE_TOKENS,
    **GENERATION,
)


# ---------------------------------------------------------------------------------------------------------------------
# The reference checkpoint as its processor and config see it, each value with its source
# (tests/test_perturb_real_processors.py, tests/test_builtin_tiny_recipes.py)
# ---------------------------------------------------------------------------------------------------------------------

# Qwen/Qwen2-VL-7B-Instruct preprocessor_config.json: Qwen2VLImageProcessor, min_pixels 3136, max_pixels 12845056,
# patch_size 14, temporal_patch_size 2, merge_size 2, CLIP mean/std (card: Qwen2.5-VL's file below, read, has the
# same; patch, merge, temporal and stats are also the class defaults, max_pixels not: 1003520 there). config.json
# vision patch_size 14
REFERENCE_PROCESSOR = RealProcessor(
    "Qwen/Qwen2-VL-7B-Instruct",
    "Qwen2VLImageProcessor",
    dict(
        min_pixels=3136,
        max_pixels=12845056,
        patch_size=14,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=CLIP_MEAN,
        image_std=list(CLIP_STD),
    ),
    "Qwen2VLConfig",
    {"vision_config": {"patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}},
)


# Qwen/Qwen2-VL-7B-Instruct config.json (read: fine-tunes of it on the Hub whose config.json keep its non-size
# fields, OS-Copilot/OS-Atlas-Pro-7B and HongxinLi/UIPro-7B_Stage2_Web; the official file itself not read; its
# Qwen2 text fields are those of Qwen2.5-VL-7B-Instruct's file below too; both fine-tunes are of Qwen2-VL-7B). Flat text fields (transformers 4.45
# layout): transformers 5 moves them into text_config and rope_theta + rope_scaling into
# text_config.rope_parameters ({"rope_type": "default", "mrope_section": ..., "rope_theta": ...}). The vision_config
# carries only model_type "qwen2_vl" (5.x: "qwen2_vl_vision"), in_chans 3 and spatial_patch_size 14: its activation
# is Qwen2VLVisionConfig's default quick_gelu (class defaults; Qwen2-VL-7B's module print shows QuickGELUActivation)
REFERENCE_CONFIG = {
    "checkpoint": "Qwen/Qwen2-VL-7B-Instruct",
    "source": "read: huggingface.co/OS-Copilot/OS-Atlas-Pro-7B/blob/main/config.json and "
    "huggingface.co/HongxinLi/UIPro-7B_Stage2_Web/blob/main/config.json (fine-tunes keeping its non-size fields); "
    "vision activation: class defaults",
    "config": {
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "model_type": "qwen2_vl",
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "use_cache": True,
        "vision_config": {"model_type": "qwen2_vl", "in_chans": 3},
    },
    "implied": {"vision_config": {"hidden_act": "quick_gelu", "spatial_merge_size": 2, "temporal_patch_size": 2}},
    "unsourced": [],
}
