"""GLM-4.1V: Qwen2-VL-style patch rows `(sum t*h*w, 3*2*14*14)` + `image_grid_thw`, CLIP's normalisation."""

from ..builtin.tiny_recipes.base import Derived, TinyRecipe, Tok
from .base import CLIP_MEAN, CLIP_STD, Family, RealProcessor, patch_rows_layout


FAMILY = Family(
    "glm4v",
    order=150,
    model_types=("glm4v",),
    model_classes=("Glm4vForConditionalGeneration",),
    pixel_values="patch rows `(sum t*h*w, 3*2*14*14)` + `image_grid_thw`",
    make_layout=patch_rows_layout,
    reference=("zai-org/GLM-4.1V-9B-Thinking", CLIP_STD),
    media_tokens=(
        "<|image|>",
        "<|video|>",
        "<|begin_of_image|>",
        "<|end_of_image|>",
        "<|begin_of_video|>",
        "<|end_of_video|>",
    ),
    # 14 px patches, 2 temporal copies, merged 2x2 (as the real GLM-4.1V)
)


# ---------------------------------------------------------------------------------------------------------------------
# The tiny model (`vepo_trl.builtin.tiny_models` builds it; `tiny-glm4v`)
# ---------------------------------------------------------------------------------------------------------------------

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "[gMASK]",
    "<sop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|video|>",
)


# GLM-4.1V's chat template, its user / assistant turns with image parts (the Hub template also renders tools, video)
CHAT_TEMPLATE = (
    "[gMASK]<sop>{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<|begin_of_image|><|image|><|end_of_image|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _mrope_section(build) -> list[int]:
    quarter = build.head_dim // 4
    return [quarter - 2 * (quarter * 3 // 8), quarter * 3 // 8, quarter * 3 // 8]


TINY_RECIPE = TinyRecipe(
    model="Glm4vForConditionalGeneration",
    config="Glm4vConfig",
    processor="Glm4vProcessor",
    tokens=SPECIAL_TOKENS,
    eos="<|user|>",  # GLM ends an assistant turn by starting the next user turn
    pad="<|endoftext|>",
    chat_template=CHAT_TEMPLATE,
    image_processor=("Glm4vImageProcessor", {"size": {"shortest_edge": 56 * 56, "longest_edge": 224 * 224}}),
    parts={"video_processor": ("Glm4vVideoProcessor", {})},
    text={
        "max_position_embeddings": 4096,
        "pad_token_id": Tok("<|endoftext|>"),
        # GLM rotates half of each head (partial_rotary_factor 0.5), its M-RoPE sections splitting those
        # head_dim / 4 frequencies 2:3:3, as zai-org/GLM-4.1V-9B-Thinking's [8, 12, 12] of 128 (vLLM asserts the sum)
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "mrope_section": Derived(_mrope_section),
        },
    },
    vision={
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": Derived(lambda build: build.config.hidden_size),
        "image_size": 56,
        "patch_size": 14,
    },
    shared_vision=False,
    top={
        "image_token_id": Tok("<|image|>"),
        "video_token_id": Tok("<|video|>"),
        "image_start_token_id": Tok("<|begin_of_image|>"),
        "image_end_token_id": Tok("<|end_of_image|>"),
        "video_start_token_id": Tok("<|begin_of_video|>"),
        "video_end_token_id": Tok("<|end_of_video|>"),
    },
    stop=("<|user|>", "<|endoftext|>"),
)


# ---------------------------------------------------------------------------------------------------------------------
# The reference checkpoint as its processor and config see it, each value with its source
# (tests/test_perturb_real_processors.py, tests/test_builtin_tiny_recipes.py)
# ---------------------------------------------------------------------------------------------------------------------

# zai-org/GLM-4.1V-9B-Thinking preprocessor_config.json: Glm4vImageProcessor, size shortest_edge 12544,
# longest_edge 9633792, patch 14, temporal 2, merge 2, CLIP mean/std (read: zai-org/GLM-OCR's file, quoted
# verbatim in a public fixture, which public converters give glm4v models too; GLM-4.1V's own not read; the class
# default longest_edge is 11760000). config.json vision patch_size 14
REFERENCE_PROCESSOR = RealProcessor(
    "zai-org/GLM-4.1V-9B-Thinking",
    "Glm4vImageProcessor",
    dict(
        size={"shortest_edge": 12544, "longest_edge": 9633792},
        patch_size=14,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=CLIP_MEAN,
        image_std=list(CLIP_STD),
    ),
    "Glm4vConfig",
    {"vision_config": {"patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}},
)


# zai-org/GLM-4.1V-9B-Thinking config.json (read: GLM-4.1V fine-tunes' config.json keeping its fields,
# huggingface.co/minglanga/GeoSolver (text) and huggingface.co/luli2949/glyph_dim4 (vision; its text rope_theta
# 500000 is Glyph's own and not taken); the official file not read). Half of each head rotates
# (partial_rotary_factor 0.5), M-RoPE [8, 12, 12] of head_dim 128. attention_bias true (the text q/k/v biases):
# transformers 5.24's Glm4vTextConfig has no such field (its attention always has them)
REFERENCE_CONFIG = {
    "checkpoint": "zai-org/GLM-4.1V-9B-Thinking",
    "source": "read: huggingface.co/minglanga/GeoSolver/blob/main/config.json (text), "
    "huggingface.co/luli2949/glyph_dim4/blob/main/config.json (vision)",
    "config": {
        "architectures": ["Glm4vForConditionalGeneration"],
        "model_type": "glm4v",
        "tie_word_embeddings": False,
        "text_config": {
            "model_type": "glm4v_text",
            "attention_bias": True,
            "attention_dropout": 0.0,
            "hidden_act": "silu",
            "initializer_range": 0.02,
            "partial_rotary_factor": 0.5,
            "rms_norm_eps": 1e-05,
            "rope_scaling": {"mrope_section": [8, 12, 12], "rope_type": "default"},
            "rope_theta": 10000.0,
        },
        "vision_config": {"attention_bias": False, "attention_dropout": 0.0, "hidden_act": "silu"},
    },
    "implied": {"vision_config": {"rms_norm_eps": 1e-05, "spatial_merge_size": 2, "temporal_patch_size": 2}},
    "unsourced": ["vision_config.rms_norm_eps, spatial_merge_size, temporal_patch_size (class defaults only)"],
}
