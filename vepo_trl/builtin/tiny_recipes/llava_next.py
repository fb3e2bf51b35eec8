"""The tiny llava-next model as data (its runtime adapter is `vepo_trl.families.llava_next`)."""

from .base import Derived, TinyRecipe, Tok
from .llava import hub_key_names


# CLIP at 28 px (2x2 patches of 14 + CLS, dropped by the "default" feature strategy), any-resolution grids of up to 2x2
# crops plus the resized whole image (the real LLaVA-NeXT: 336 px, 24x24 patches, up to 672 px grids)
PINPOINTS = [[28, 28], [28, 56], [56, 28], [56, 56]]


FAMILY = "llava-next"
RECIPE = TinyRecipe(
    model="LlavaNextForConditionalGeneration",
    config="LlavaNextConfig",
    processor="LlavaNextProcessor",
    tokens=("<unk>", "<s>", "</s>", "<image>", "<pad>"),
    bos="<s>",
    eos="</s>",
    pad="<pad>",
    chat_template="trl:llava_next_chat_template",
    image_processor=(
        "LlavaNextImageProcessor",
        {
            "size": {"shortest_edge": 28},
            "crop_size": {"height": 28, "width": 28},
            "image_grid_pinpoints": PINPOINTS,
        },
    ),
    processor_args={
        "patch_size": 14,
        "vision_feature_select_strategy": "default",
        "num_additional_image_tokens": 1,
    },
    text={
        "model_type": "mistral",
        "head_dim": Derived(lambda build: build.head_dim),
        "sliding_window": None,
        "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
        "pad_token_id": Tok("<pad>"),
        "eos_token_id": Tok("</s>"),
        "bos_token_id": Tok("<s>"),
    },
    vision={"model_type": "clip_vision_model", "image_size": 28, "patch_size": 14},
    top={
        "image_token_index": Tok("<image>"),
        "image_grid_pinpoints": PINPOINTS,
        "vision_feature_select_strategy": "default",
        "vision_feature_layer": -2,
        "image_seq_length": 4,
    },
    stop=("</s>",),
    finish=hub_key_names,
)
