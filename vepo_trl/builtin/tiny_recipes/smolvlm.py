"""The tiny smolvlm model as data (its runtime adapter is `vepo_trl.families.smolvlm`)."""

from .base import TinyRecipe, Tok


SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<end_of_utterance>",
    "<fake_token_around_image>",
    "<image>",
    "<global-img>",
    *(f"<row_{row}_col_{col}>" for row in range(1, 7) for col in range(1, 7)),
)


FAMILY = "smolvlm"
RECIPE = TinyRecipe(
    model="SmolVLMForConditionalGeneration",
    config="SmolVLMConfig",
    processor="SmolVLMProcessor",
    tokens=SPECIAL_TOKENS,
    bos="<|im_start|>",
    eos="<end_of_utterance>",
    pad="<|endoftext|>",
    chat_template="trl:smolvlm_chat_template",
    image_processor=(
        "SmolVLMImageProcessor",
        {"size": {"longest_edge": 64}, "max_image_size": {"longest_edge": 32}, "do_image_splitting": True},
    ),
    parts={"video_processor": ("SmolVLMVideoProcessor", {})},
    processor_args={"image_seq_len": 4},
    text={
        "model_type": "llama",
        "pad_token_id": Tok("<|endoftext|>"),
        "eos_token_id": Tok("<end_of_utterance>"),
        "bos_token_id": Tok("<|im_start|>"),
    },
    vision={"image_size": 32, "patch_size": 8},
    top={"scale_factor": 2, "image_token_id": Tok("<image>"), "pad_token_id": Tok("<|endoftext|>")},
    stop=("<end_of_utterance>",),
)
