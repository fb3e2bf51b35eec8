"""LLaVA-OneVision: any-resolution crops `(n_images, n_crops, C, H, W)` + `image_sizes`; zero crops and each crop's
letterbox are padding."""

from . import _qwen
from .base import HALF_STD, Family, RealProcessor, TinyRecipe, Tok, image_count_row, tiles_layout


# Its chat template (Qwen2 turns, `<image>` placeholders before the text), as its Hub processors ship it
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}<image>\n"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Any-resolution crops of 28 px (2x2 patches of 14) on a grid of up to 2x2, plus the resized whole image
PINPOINTS = [[28, 28], [28, 56], [56, 28], [56, 56]]


def check_inputs(processor, datasets, *, chat_template=None, use_vllm=False) -> None:
    for name, dataset in datasets:
        most = image_count_row(dataset, max)
        if most is not None and most[1] >= 2:
            raise ValueError(
                f"LLaVA-OneVision with {most[1]} images in one prompt ({name} row {most[0]}): TRL 1.16 cannot "
                "split its crops per prompt. Keep one image per prompt for this family."
            )


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
    check_inputs=check_inputs,
    tiny=TinyRecipe(
        model="LlavaOnevisionForConditionalGeneration",
        config="LlavaOnevisionConfig",
        processor="LlavaOnevisionProcessor",
        tokens=(*_qwen.QWEN_SPECIAL_TOKENS, "<image>", "<video>"),
        eos="<|im_end|>",
        pad="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        # SigLIP's normalisation, as llava-onevision-qwen2-7b-ov-hf's preprocessor_config.json (mean = std = 0.5)
        image_processor=(
            "LlavaOnevisionImageProcessor",
            {
                "size": {"height": 28, "width": 28},
                "image_grid_pinpoints": PINPOINTS,
                "image_mean": [0.5] * 3,
                "image_std": [0.5] * 3,
            },
        ),
        parts={"video_processor": ("LlavaOnevisionVideoProcessor", {})},
        processor_args={"num_image_tokens": 4, "vision_feature_select_strategy": "full"},
        text={"model_type": "qwen2", "pad_token_id": Tok("<|endoftext|>"), "eos_token_id": Tok("<|im_end|>")},
        vision={"model_type": "siglip_vision_model", "image_size": 28, "patch_size": 14},
        top={
            "image_token_index": Tok("<image>"),
            "video_token_index": Tok("<video>"),
            "image_grid_pinpoints": PINPOINTS,
            "vision_feature_select_strategy": "full",
            "vision_feature_layer": -1,
        },
        stop=("<|im_end|>", "<|endoftext|>"),
        suppress=("<image>", "<video>"),
    ),
)


REAL_PINPOINTS = [[384 * i, 384 * j] for i in range(1, 7) for j in range(1, 7)]  # "anyres_max_9"

# llava-hf/llava-onevision-qwen2-7b-ov-hf preprocessor_config.json (as tests/test_anyres_letterbox.py):
# LlavaOnevisionImageProcessor, size 384x384, mean/std 0.5, image_grid_pinpoints (384 i, 384 j) for i, j in 1..6.
# config.json vision (SigLIP so400m) image_size 384, patch_size 14
REAL_PROCESSOR = RealProcessor(
    "llava-hf/llava-onevision-qwen2-7b-ov-hf",
    "LlavaOnevisionImageProcessor",
    dict(
        size={"height": 384, "width": 384},
        image_grid_pinpoints=REAL_PINPOINTS,
        image_mean=list(HALF_STD),
        image_std=list(HALF_STD),
    ),
    "LlavaOnevisionConfig",
    {
        "vision_config": {"model_type": "siglip_vision_model", "image_size": 384, "patch_size": 14},
        "image_grid_pinpoints": REAL_PINPOINTS,
    },
    real="anyres",
    tiles=True,
)
