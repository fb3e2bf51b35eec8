"""What the Qwen families share: Qwen2.5-VL's special tokens and chat template, the patch-row image processor, the
language model's token ids and M-RoPE, and Qwen3-VL's vision tower (the Qwen2-VL .. Qwen3.5 modules build on these)."""

from __future__ import annotations

from .base import Derived, Tok


# Qwen2.5-VL's special tokens, in the order of the real tokenizer (ids 151643.. there, right after the BPE vocab here)
QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)

# The chat template shipped with Qwen2.5-VL-*-Instruct (system / user with image parts / assistant)
QWEN2_5_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# The tokenizer's named tokens and what a completion stops at
TOKENS = {"tokens": QWEN_SPECIAL_TOKENS, "eos": "<|im_end|>", "pad": "<|endoftext|>"}
GENERATION = {"stop": ("<|im_end|>", "<|endoftext|>")}
IMAGE_TOKENS = {
    "image_token_id": Tok("<|image_pad|>"),
    "video_token_id": Tok("<|video_pad|>"),
    "vision_start_token_id": Tok("<|vision_start|>"),
    "vision_end_token_id": Tok("<|vision_end|>"),
    "tie_word_embeddings": False,
}
TEXT = {
    "max_position_embeddings": 4096,
    "bos_token_id": Tok("<|endoftext|>"),
    "eos_token_id": Tok("<|im_end|>"),
    "pad_token_id": Tok("<|endoftext|>"),
    "tie_word_embeddings": False,
}
# M-RoPE splits the head_dim / 2 frequencies over (temporal, height, width) 2:3:3, like the real [16, 24, 24]
MROPE_SECTION = Derived(
    lambda build: [2 * (build.head_dim // 16), 3 * (build.head_dim // 16), 3 * (build.head_dim // 16)]
)


def image_processor(patch: int, half_stats: bool = False) -> tuple[str, dict]:
    """Qwen2-VL's image processor with images of 2x2 to 16x16 patches (2 to 8 merged tokens a side); Qwen3-VL's stats
    (mean = std = 0.5) with `half_stats`."""
    stats = {"image_mean": [0.5] * 3, "image_std": [0.5] * 3} if half_stats else {}
    return "Qwen2VLImageProcessor", {
        "min_pixels": (2 * patch) ** 2,
        "max_pixels": (8 * 2 * patch) ** 2,
        "patch_size": patch,
        **stats,
    }


# Qwen3-VL's language model (explicit head_dim, interleaved M-RoPE) and vision tower (16-px patches, learned positions)
QWEN3_TEXT = {
    **TEXT,
    "head_dim": Derived(lambda build: build.head_dim),
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 5e6,
        "mrope_section": MROPE_SECTION,
        "mrope_interleaved": True,
    },
}
QWEN3_VISION = {
    "depth": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "out_hidden_size": Derived(lambda build: build.config.hidden_size),
    "patch_size": 16,
    "num_position_embeddings": 64,
    "deepstack_visual_indexes": [0],
}
QWEN3_PARTS = {"video_processor": ("Qwen3VLVideoProcessor", {})}


def wide(build) -> bool:
    """A head of 32 or more: the widths vLLM-CPU's attention takes (the tests' real-engine runs)."""
    return build.head_dim >= 32
