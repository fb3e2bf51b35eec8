"""The tiny gemma3 model as data (its runtime adapter is `vepo_trl.families.gemma3`)."""

import torch

from .base import Derived, TinyRecipe, Tok


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


FAMILY = "gemma3"
RECIPE = TinyRecipe(
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
