"""The tiny qwen3-vl model as data (its runtime adapter is `vepo_trl.families.qwen3_vl`)."""

from . import _qwen
from .base import TinyRecipe


FAMILY = "qwen3-vl"
RECIPE = TinyRecipe(
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
)
