"""Gemma 3: whole images `(n_images, C, H, W)` on SigLIP's grid, average-pooled to soft tokens."""

import torch

from ..builtin.tiny_recipes.base import Derived, TinyRecipe, Tok
from .base import HALF_STD, Family, InputLimits, Pattern, RealProcessor, tiles_layout


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
    limits=InputLimits(
        "Gemma 3",
        # Gemma3Processor's own image defaults (`images_kwargs`) decide, over the image processor's attribute
        processor_off=(
            (
                "do_pan_and_scan",
                "its extra crops per image break TRL 1.16's split of pixel_values by image count. Keep the "
                "processor's images_kwargs do_pan_and_scan=False (its default).",
            ),
        ),
    ),
    media_tokens=("<image_soft_token>", "<start_of_image>", "<end_of_image>"),
    # A 56x56 image, 14x14 patches (4x4), average-pooled to 2x2 = 4 soft tokens per image (the real: 896, 64x64, 256)
)


# ---------------------------------------------------------------------------------------------------------------------
# The tiny model (`vepo_trl.builtin.tiny_models` builds it; `tiny-gemma3`)
# ---------------------------------------------------------------------------------------------------------------------

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


def _random_projection(model, build) -> None:
    # Gemma 3 initialises its image projection at zero (images change nothing until trained): a random one here, from
    # the same seed, so that the tiny model sees its images as a trained one does
    projection = model.model.multi_modal_projector.mm_input_projection_weight
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(build.config.seed + 1)
        projection.normal_(0.0, projection.shape[0] ** -0.5)


TINY_RECIPE = TinyRecipe(
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
        # gemma-3-4b-it's two RoPE tables: linear scaling (factor 8) on the global layers, none on the local ones
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
        "pad_token_id": Tok("<pad>"),
        "eos_token_id": Tok("<end_of_turn>"),
        "bos_token_id": Tok("<bos>"),
    },
    vision={"image_size": 56, "patch_size": 14, "vision_use_head": False},
    top={
        "mm_tokens_per_image": 4,
        "boi_token_index": Tok("<start_of_image>"),
        "eoi_token_index": Tok("<end_of_image>"),
        "image_token_index": Tok("<image_soft_token>"),
    },
    stop=("<end_of_turn>", "<eos>"),
    finish=_random_projection,
)


# ---------------------------------------------------------------------------------------------------------------------
# The reference checkpoint as its processor and config see it, each value with its source
# (tests/test_perturb_real_processors.py, tests/test_builtin_tiny_recipes.py)
# ---------------------------------------------------------------------------------------------------------------------

# google/gemma-3-4b-it preprocessor_config.json (read: as public eval scripts write it out): Gemma3ImageProcessor,
# size 896x896, mean/std 0.5, resample 2 (bilinear), do_pan_and_scan null. config.json vision (SigLIP) image_size
# 896, patch_size 14
REFERENCE_PROCESSOR = RealProcessor(
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


# google/gemma-3-4b-it config.json (read: two public fixtures quoting the file agree, one "The shape of
# google/gemma-3-4b-it's config.json" (vision omitted), one with its vision_config; a third adds
# text_config.final_logit_softcapping 30.0, which the others and transformers' conversion script (variant
# gemma3_4b) lack: left out). The file names few keys; transformers' Gemma3TextConfig defaults (docstring:
# gemma-3-4b-it) and the conversion script's gemma3_4b variant give the rest ("implied"). Transformers 5 folds
# rope_theta 1e6 with rope_scaling (linear, factor 8) into rope_parameters["full_attention"] and
# rope_local_base_freq 1e4 into rope_parameters["sliding_attention"]; sliding_window_pattern 6 becomes layer_types
# (5 sliding, 1 full). vision_use_head false (checked: also the conversion script's _VISION_CONFIG)
REFERENCE_CONFIG = {
    "checkpoint": "google/gemma-3-4b-it",
    "source": "read: public fixtures quoting the file; github huggingface/transformers "
    "src/transformers/models/gemma3/convert_gemma3_weights.py (variant gemma3_4b, _VISION_CONFIG); class defaults",
    "config": {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "initializer_range": 0.02,
        "text_config": {
            "model_type": "gemma3_text",
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        },
        "vision_config": {"model_type": "siglip_vision_model", "vision_use_head": False},
    },
    "implied": {
        "tie_word_embeddings": True,
        "text_config": {
            "hidden_activation": "gelu_pytorch_tanh",
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0,
            "attn_logit_softcapping": None,
            "attention_bias": False,
            "layer_types": Pattern(("sliding_attention",) * 5 + ("full_attention",)),
        },
        "vision_config": {"hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-06},
    },
    "unsourced": ["text_config.final_logit_softcapping (copies disagree: absent / 30.0)"],
}
