"""LLaVA-NeXT: any-resolution crops `(n_images, n_crops, C, H, W)` + `image_sizes`; zero crops and each crop's
letterbox are padding."""

from .base import CLIP_MEAN, CLIP_STD, Derived, Family, RealProcessor, TinyRecipe, Tok, tiles_layout


# CLIP at 28 px (2x2 patches of 14 + CLS, dropped by the "default" feature strategy), any-resolution grids of up to 2x2
# crops plus the resized whole image (the real LLaVA-NeXT: 336 px, 24x24 patches, up to 672 px grids)
PINPOINTS = [[28, 28], [28, 56], [56, 28], [56, 56]]

FAMILY = Family(
    "llava-next",
    order=100,
    model_types=("llava_next",),
    model_classes=("LlavaNextForConditionalGeneration",),
    pixel_values="crops `(n_images, n_crops, C, H, W)` + `image_sizes`, zero crops and each crop's letterbox are padding",
    make_layout=tiles_layout(),
    reference=("llava-hf/llava-v1.6-mistral-7b-hf", CLIP_STD),
    tiny=TinyRecipe(
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
            "pad_token_id": Tok("<pad>"),
            "eos_token_id": Tok("</s>"),
            "bos_token_id": Tok("<s>"),
        },
        vision={"model_type": "clip_vision_model", "image_size": 28, "patch_size": 14},
        top={
            "image_token_index": Tok("<image>"),
            "image_grid_pinpoints": PINPOINTS,
            "vision_feature_select_strategy": "default",
            "vision_feature_layer": -1,
            "image_seq_length": 4,
        },
        stop=("</s>",),
        suppress=("<image>",),
    ),
)


REAL_PINPOINTS = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]

# llava-hf/llava-v1.6-mistral-7b-hf preprocessor_config.json (as tests/test_anyres_letterbox.py):
# LlavaNextImageProcessor, shortest_edge 336, crop 336x336, CLIP mean/std, the 5 REAL_PINPOINTS. config.json
# vision (CLIP ViT-L/14-336) image_size 336, patch_size 14
REAL_PROCESSOR = RealProcessor(
    "llava-hf/llava-v1.6-mistral-7b-hf",
    "LlavaNextImageProcessor",
    dict(
        size={"shortest_edge": 336},
        crop_size={"height": 336, "width": 336},
        image_grid_pinpoints=REAL_PINPOINTS,
        image_mean=CLIP_MEAN,
        image_std=list(CLIP_STD),
    ),
    "LlavaNextConfig",
    {
        "vision_config": {"model_type": "clip_vision_model", "image_size": 336, "patch_size": 14},
        "image_grid_pinpoints": REAL_PINPOINTS,
    },
    real="anyres",
    tiles=True,
)
