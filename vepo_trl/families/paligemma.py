"""PaliGemma: images `(n_images, C, H, W)` + `token_type_ids`, a prefix LM (image and prompt bidirectional)."""

from .base import HALF_STD, Family, InputLimits, tiles_layout


FAMILY = Family(
    "paligemma",
    order=120,
    model_types=("paligemma",),
    model_classes=("PaliGemmaForConditionalGeneration",),
    pixel_values="images `(n_images, C, H, W)` + `token_type_ids`",
    make_layout=tiles_layout(),
    reference=("google/paligemma2-3b-pt-224", HALF_STD),
    prefix_lm=True,
    trl_limitation=(
        "TRL 1.16's GRPOTrainer fails on prompts of different lengths (the processor builds `labels` with "
        "np.array over unpadded ids) and scores completions as part of the bidirectional prefix (it extends "
        "`token_type_ids` with zeros): VEPOTrainer tokenises padded then unpadded and marks the completion "
        "causal, as `generate` samples it. Refused at start-up: a text-only prompt (the processor refuses it), no chat "
        "template (its checkpoints ship none: set one), vLLM (its prompt and prefix there are unverified)"
    ),
    limits=InputLimits(
        "PaliGemma",
        fewest_images=(1, "its processor refuses text-only prompts. Drop text-only rows for this family."),
        chat_template=(
            "its checkpoints ship no chat template and TRL renders conversational prompts with one: set "
            "processor.chat_template to one that writes each image as <image>, then the text, and pass "
            "processing_class=processor."
        ),
        vllm=(
            "vLLM's prompt for it (bos and newline added around the images) and its bidirectional prefix are not "
            "verified against the trainer's; generate with transformers."
        ),
    ),
    media_tokens=("<image>",),
    # SigLIP at 56 px, 4x4 patches of 14 = 16 image tokens (the real PaliGemma: 224 px, 256 tokens), mean = std = 0.5
)
