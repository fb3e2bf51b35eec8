"""Qwen2-VL: patch rows `(sum t*h*w, 3*2*14*14)` + `image_grid_thw`, CLIP's normalisation."""

from . import _qwen
from .base import CLIP_STD, Derived, Family, TinyRecipe, patch_rows_layout


FAMILY = Family(
    "qwen2-vl",
    order=10,
    model_types=("qwen2_vl",),
    model_classes=("Qwen2VLForConditionalGeneration",),
    pixel_values="patch rows `(sum t*h*w, 3*2*14*14)` + `image_grid_thw`",
    make_layout=patch_rows_layout,
    reference=("Qwen/Qwen2-VL-7B-Instruct", CLIP_STD),
    tiny=TinyRecipe(
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
    ),
)
