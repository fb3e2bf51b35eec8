"""The tiny glm4v model as data (its runtime adapter is `vepo_trl.families.glm4v`)."""

from .base import Derived, TinyRecipe, Tok


SPECIAL_TOKENS = (
    "<|endoftext|>",
    "[gMASK]",
    "<sop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|video|>",
)


# GLM-4.1V's chat template, its user / assistant turns with image parts (the Hub template also renders tools, video)
CHAT_TEMPLATE = (
    "[gMASK]<sop>{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<|begin_of_image|><|image|><|end_of_image|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _mrope_section(build) -> list[int]:
    quarter = build.head_dim // 4
    return [quarter - 2 * (quarter * 3 // 8), quarter * 3 // 8, quarter * 3 // 8]


FAMILY = "glm4v"
RECIPE = TinyRecipe(
    model="Glm4vForConditionalGeneration",
    config="Glm4vConfig",
    processor="Glm4vProcessor",
    tokens=SPECIAL_TOKENS,
    eos="<|user|>",  # GLM ends an assistant turn by starting the next user turn
    pad="<|endoftext|>",
    chat_template=CHAT_TEMPLATE,
    image_processor=("Glm4vImageProcessor", {"size": {"shortest_edge": 56 * 56, "longest_edge": 224 * 224}}),
    parts={"video_processor": ("Glm4vVideoProcessor", {})},
    text={
        "max_position_embeddings": 4096,
        "pad_token_id": Tok("<|endoftext|>"),
        # GLM rotates half of each head (partial_rotary_factor 0.5), its M-RoPE sections splitting those
        # head_dim / 4 frequencies 2:3:3, as zai-org/GLM-4.1V-9B-Thinking's [8, 12, 12] of 128 (vLLM asserts the sum)
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "mrope_section": Derived(_mrope_section),
        },
    },
    vision={
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": Derived(lambda build: build.config.hidden_size),
        "image_size": 56,
        "patch_size": 14,
    },
    shared_vision=False,
    top={
        "image_token_id": Tok("<|image|>"),
        "video_token_id": Tok("<|video|>"),
        "image_start_token_id": Tok("<|begin_of_image|>"),
        "image_end_token_id": Tok("<|end_of_image|>"),
        "video_start_token_id": Tok("<|begin_of_video|>"),
        "video_end_token_id": Tok("<|end_of_video|>"),
    },
    stop=("<|user|>", "<|endoftext|>"),
)
