"""The tiny qwen2.5-vl model as data (its runtime adapter is `vepo_trl.families.qwen2_5_vl`)."""

from . import _qwen
from .base import Derived, TinyRecipe


FAMILY = "qwen2.5-vl"
RECIPE = TinyRecipe(
    model="Qwen2_5_VLForConditionalGeneration",
    config="Qwen2_5_VLConfig",
    processor="Qwen2_5_VLProcessor",
    **_qwen.TOKENS,
    chat_template=_qwen.QWEN2_5_VL_CHAT_TEMPLATE,
    image_processor=(
        "Qwen2VLImageProcessor",
        {
            "min_pixels": Derived(lambda build: build.config.min_pixels),
            "max_pixels": Derived(lambda build: build.config.max_pixels),
        },
    ),
    parts={"video_processor": ("Qwen2VLVideoProcessor", {})},
    text={
        **_qwen.TEXT,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": _qwen.MROPE_SECTION},
        "rms_norm_eps": 1e-6,
    },
    vision={
        "depth": Derived(lambda build: build.config.vision_depth),
        "hidden_size": Derived(lambda build: build.config.vision_hidden_size),
        "intermediate_size": Derived(lambda build: build.config.vision_hidden_size * 2),
        "num_heads": Derived(lambda build: build.config.vision_num_heads),
        "out_hidden_size": Derived(lambda build: build.config.hidden_size),
        "fullatt_block_indexes": Derived(lambda build: [build.config.vision_depth - 1]),
        "initializer_range": Derived(lambda build: build.config.initializer_range),
        "tokens_per_second": 2,
    },
    shared_vision=False,
    top=_qwen.IMAGE_TOKENS,
    **_qwen.GENERATION,
    generation_bos="<|endoftext|>",
    head_dim_multiple=16,  # M-RoPE
)
