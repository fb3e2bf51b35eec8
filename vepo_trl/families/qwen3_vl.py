"""Qwen3-VL: patch rows `(sum t*h*w, 3*2*16*16)` + `image_grid_thw`, mean = std = 0.5."""

from . import _qwen
from .base import HALF_STD, Family, TinyRecipe, patch_rows_layout


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
