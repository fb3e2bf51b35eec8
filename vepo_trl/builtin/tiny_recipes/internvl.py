"""The tiny internvl model as data (its runtime adapter is `vepo_trl.families.internvl`)."""

from . import _qwen, llava_onevision
from .base import TinyRecipe, Tok


# Its chat template (Qwen2 turns; the processor expands each `<IMG_CONTEXT>` into the image's tiles' tokens)
CHAT_TEMPLATE = llava_onevision.CHAT_TEMPLATE.replace("<image>", "<IMG_CONTEXT>")


FAMILY = "internvl"
RECIPE = TinyRecipe(
    model="InternVLForConditionalGeneration",
    config="InternVLConfig",
    processor="InternVLProcessor",
    tokens=(*_qwen.QWEN_SPECIAL_TOKENS, "<img>", "</img>", "<IMG_CONTEXT>", "<video>"),
    eos="<|im_end|>",
    pad="<|endoftext|>",
    named_tokens={
        "start_image_token": "<img>",
        "end_image_token": "</img>",
        "context_image_token": "<IMG_CONTEXT>",
        "video_token": "<video>",
    },
    chat_template=CHAT_TEMPLATE,
    image_processor=(
        "GotOcr2ImageProcessor",
        {
            "size": {"height": 28, "width": 28},
            "crop_to_patches": True,
            "min_patches": 1,
            "max_patches": 4,
            "image_mean": [0.485, 0.456, 0.406],
            "image_std": [0.229, 0.224, 0.225],
        },
    ),
    parts={"video_processor": ("InternVLVideoProcessor", {})},
    processor_args={"image_seq_length": 1},
    text={"model_type": "qwen2", "pad_token_id": Tok("<|endoftext|>"), "eos_token_id": Tok("<|im_end|>")},
    vision={"image_size": [28, 28], "patch_size": [14, 14]},
    top={
        "image_token_id": Tok("<IMG_CONTEXT>"),
        "image_seq_length": 1,
        "downsample_ratio": 0.5,
        "tie_word_embeddings": False,
    },
    stop=("<|im_end|>", "<|endoftext|>"),
)
