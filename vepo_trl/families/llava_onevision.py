"""LLaVA-OneVision: any-resolution crops `(n_images, n_crops, C, H, W)` + `image_sizes`; zero crops and each crop's
letterbox are padding."""

from .base import HALF_STD, QWEN_MEDIA_TOKENS, Family, InputLimits, tiles_layout


FAMILY = Family(
    "llava-onevision",
    order=90,
    model_types=("llava_onevision",),
    model_classes=("LlavaOnevisionForConditionalGeneration",),
    pixel_values="crops `(n_images, n_crops, C, H, W)` + `image_sizes`, zero crops and each crop's letterbox are padding",
    make_layout=tiles_layout(),
    reference=("llava-hf/llava-onevision-qwen2-7b-ov-hf", HALF_STD),
    trl_limitation=(
        "TRL 1.16's GRPOTrainer fails whenever it runs a forward at rollout time (old log-probs when "
        "steps_per_generation x num_iterations does not divide gradient_accumulation_steps, vLLM importance "
        "sampling, a reference model with beta > 0): the processor's `batch_num_images` reaches "
        "`_get_per_token_logps_and_entropies` as an unknown keyword. VEPOTrainer drops that keyword and trains "
        "(rollout-time scoring and beta > 0 tested). Prompts with two or more images fail in TRL and are refused "
        "at start-up"
    ),
    limits=InputLimits(
        "LLaVA-OneVision",
        most_images=(1, "TRL 1.16 cannot split its crops per prompt. Keep one image per prompt for this family."),
    ),
    media_tokens=("<image>", "<video>", *QWEN_MEDIA_TOKENS),
)
