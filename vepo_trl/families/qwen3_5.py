"""Qwen3.5: Qwen3-VL's images, a language model alternating Gated DeltaNet (linear attention) and full attention."""

from . import _qwen
from .base import HALF_STD, Derived, Family, RealProcessor, TinyRecipe, patch_rows_layout


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
    "rope_parameters": {**_qwen.QWEN3_TEXT["rope_parameters"], "mrope_section": Derived(_mrope_section)},
    "layer_types": ["linear_attention", "full_attention"],
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": Derived(lambda build: 128 if _qwen.wide(build) else 16),
    "linear_value_head_dim": Derived(lambda build: 128 if _qwen.wide(build) else 16),
}
VISION = {key: value for key, value in _qwen.QWEN3_VISION.items() if key != "deepstack_visual_indexes"}

FAMILY = Family(
    "qwen3.5",
    order=50,
    model_types=("qwen3_5",),
    model_classes=("Qwen3_5ForConditionalGeneration",),
    pixel_values="patch rows `(sum t*h*w, 3*2*16*16)` + `image_grid_thw`",
    make_layout=patch_rows_layout,
    reference=("Qwen/Qwen3.5-9B", HALF_STD),
    tiny=TinyRecipe(
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
    ),
)


# Qwen/Qwen3.5-9B preprocessor_config.json (read: Qwen/Qwen3.5-2B-Base's, as a public log prints it from the Hub;
# the same file across Qwen3.5):
# Qwen2VLImageProcessorFast, size 65536 / 16777216, patch 16, temporal 2, merge 2, mean/std 0.5. config.json
# vision patch_size 16
REAL_PROCESSOR = RealProcessor(
    "Qwen/Qwen3.5-9B",
    "Qwen2VLImageProcessor",
    dict(
        size={"shortest_edge": 65536, "longest_edge": 16777216},
        patch_size=16,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=list(HALF_STD),
        image_std=list(HALF_STD),
    ),
    "Qwen3_5Config",
    {"vision_config": {"patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2}},
)
