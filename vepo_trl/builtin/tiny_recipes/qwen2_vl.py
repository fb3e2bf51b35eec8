"""The tiny qwen2-vl model as data (its runtime adapter is `vepo_trl.families.qwen2_vl`)."""

from . import _qwen
from .base import Derived, TinyRecipe


FAMILY = "qwen2-vl"
RECIPE = TinyRecipe(
    model="Qwen2VLForConditionalGeneration",
    config="Qwen2VLConfig",
    processor="Qwen2VLProcessor",
    **_qwen.TOKENS,
    chat_template=_qwen.QWEN2_5_VL_CHAT_TEMPLATE,
    image_processor=_qwen.image_processor(14),
    parts={"video_processor": ("Qwen2VLVideoProcessor", {})},
    text={
        **_qwen.TEXT,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": _qwen.MROPE_SECTION},
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
    top=_qwen.IMAGE_TOKENS,
    **_qwen.GENERATION,
)
