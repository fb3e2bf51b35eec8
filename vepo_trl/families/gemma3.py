"""Gemma 3: whole images `(n_images, C, H, W)` on SigLIP's grid, average-pooled to soft tokens."""

import torch

from .base import HALF_STD, Derived, Family, RealProcessor, TinyRecipe, Tok, tiles_layout


SPECIAL_TOKENS = (
    "<pad>",
    "<eos>",
    "<bos>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
)


def check_inputs(processor, datasets, *, chat_template=None, use_vllm=False) -> None:
    # Gemma3Processor's own image defaults (`images_kwargs`) decide, over the image processor's attribute
    image_processor = getattr(processor, "image_processor", None)
    images_kwargs = getattr(processor, "images_kwargs", None) or {}
    if images_kwargs.get("do_pan_and_scan", getattr(image_processor, "do_pan_and_scan", False)):
        raise ValueError(
            "Gemma 3's processor has do_pan_and_scan on: its extra crops per image break TRL 1.16's split of "
            "pixel_values by image count. Keep the processor's images_kwargs do_pan_and_scan=False (its default)."
        )


def _random_projection(model, build) -> None:
    # Gemma 3 initialises its image projection at zero (images change nothing until trained): a random one here, from
    # the same seed, so that the tiny model sees its images as a trained one does
    projection = model.model.multi_modal_projector.mm_input_projection_weight
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(build.config.seed + 1)
        projection.normal_(0.0, projection.shape[0] ** -0.5)


FAMILY = Family(
    "gemma3",
    order=70,
    model_types=("gemma3",),
    model_classes=("Gemma3ForConditionalGeneration",),
    pixel_values="images `(n_images, C, H, W)`",
    make_layout=tiles_layout(),
    trl_limitation=(
        "pan-and-scan (`do_pan_and_scan`) adds crops per image, which TRL 1.16 splits by image count: refused at "
        "start-up"
    ),
    reference=("google/gemma-3-4b-it", HALF_STD),
    recipes=("gemma-3-4b-it/",),
    check_inputs=check_inputs,
    # A 56x56 image, 14x14 patches (4x4), average-pooled to 2x2 = 4 soft tokens per image (the real: 896, 64x64, 256)
    tiny=TinyRecipe(
        model="Gemma3ForConditionalGeneration",
        config="Gemma3Config",
        processor="Gemma3Processor",
        tokens=SPECIAL_TOKENS,
        bos="<bos>",
        eos="<end_of_turn>",
        pad="<pad>",
        named_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
        chat_template="trl:gemma3_chat_template",
        image_processor=("Gemma3ImageProcessor", {"size": {"height": 56, "width": 56}}),
        processor_args={"image_seq_length": 4},
        text={
            "head_dim": Derived(lambda build: build.head_dim),
            "query_pre_attn_scalar": Derived(lambda build: build.head_dim),
            "sliding_window": 64,
            "pad_token_id": Tok("<pad>"),
            "eos_token_id": Tok("<end_of_turn>"),
            "bos_token_id": Tok("<bos>"),
        },
        vision={"image_size": 56, "patch_size": 14},
        top={
            "mm_tokens_per_image": 4,
            "boi_token_index": Tok("<start_of_image>"),
            "eoi_token_index": Tok("<end_of_image>"),
            "image_token_index": Tok("<image_soft_token>"),
        },
        stop=("<end_of_turn>", "<eos>"),
        suppress=("<image_soft_token>", "<start_of_image>"),
        finish=_random_projection,
    ),
)


# google/gemma-3-4b-it preprocessor_config.json (read: as public eval scripts write it out): Gemma3ImageProcessor,
# size 896x896, mean/std 0.5, resample 2 (bilinear), do_pan_and_scan null. config.json vision (SigLIP) image_size
# 896, patch_size 14
REAL_PROCESSOR = RealProcessor(
    "google/gemma-3-4b-it",
    "Gemma3ImageProcessor",
    dict(
        size={"height": 896, "width": 896},
        image_mean=list(HALF_STD),
        image_std=list(HALF_STD),
        resample=2,
        do_pan_and_scan=False,
    ),
    "Gemma3Config",
    {"vision_config": {"model_type": "siglip_vision_model", "image_size": 896, "patch_size": 14}},
)
