"""Qwen3-VL: patch rows `(sum t*h*w, 3*2*16*16)` + `image_grid_thw`, mean = std = 0.5."""

from . import _qwen
from .base import HALF_STD, Family, RealProcessor, TinyRecipe, patch_rows_layout


FAMILY = Family(
    "qwen3-vl",
    order=30,
    model_types=("qwen3_vl",),
    model_classes=("Qwen3VLForConditionalGeneration",),
    pixel_values="patch rows `(sum t*h*w, 3*2*16*16)` + `image_grid_thw`",
    make_layout=patch_rows_layout,
    reference=("Qwen/Qwen3-VL-8B-Instruct", HALF_STD),
    recipes=("Qwen3-VL-4B-Instruct/", "Qwen3-VL-8B-Instruct/"),
    tiny=TinyRecipe(
        model="Qwen3VLForConditionalGeneration",
        config="Qwen3VLConfig",
        processor="Qwen3VLProcessor",
        **_qwen.TOKENS,
        chat_template="trl:qwen3_vl_chat_template",
        image_processor=_qwen.image_processor(16, half_stats=True),
        parts=_qwen.QWEN3_PARTS,
        text=_qwen.QWEN3_TEXT,
        vision=_qwen.QWEN3_VISION,
        shared_vision=False,
        top=_qwen.IMAGE_TOKENS,
        **_qwen.GENERATION,
    ),
)


# Qwen/Qwen3-VL-8B-Instruct preprocessor_config.json: Qwen2VLImageProcessorFast, size shortest_edge 65536,
# longest_edge 16777216, patch 16, temporal 2, merge 2, mean/std 0.5 (read: copies of the Qwen3-VL-family file in
# several public test fixtures agree; card for this checkpoint). config.json vision patch_size 16
REAL_PROCESSOR = RealProcessor(
    "Qwen/Qwen3-VL-8B-Instruct",
    "Qwen2VLImageProcessor",
    dict(
        size={"shortest_edge": 65536, "longest_edge": 16777216},
        patch_size=16,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=list(HALF_STD),
        image_std=list(HALF_STD),
    ),
    "Qwen3VLConfig",
    {"vision_config": {"patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2}},
)
