"""A tiny, randomly initialised Qwen2.5-VL built locally, for tests, benchmarks and the CPU demo.

Everything here is the real thing at a small size: `Qwen2_5_VLForConditionalGeneration`, `Qwen2_5_VLProcessor` with
Qwen's image processor, a byte-level BPE tokenizer carrying Qwen2.5-VL's special tokens, and Qwen2.5-VL's chat
template. Nothing is downloaded: the tokenizer is trained on a small built-in corpus and the weights come from a seed,
so two builds with the same seed are identical. Saved with `save_pretrained`, the folder loads with
`from_pretrained(path)` exactly like a Hub id.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
    Qwen2VLImageProcessor,
    Qwen2VLVideoProcessor,
)


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

# Text the tokenizer's merges are learned from: the prompts, answers and reasoning format the demo and tests use
_CORPUS = [
    "You FIRST think about the reasoning process as an internal monologue and then provide the final answer. "
    "The reasoning process MUST BE enclosed within <think> </think> tags. The final answer MUST BE put in \\boxed{}.",
    "You are a helpful assistant.",
    "<think> Count the shapes in the image. There are 3 red circles. </think> The answer is \\boxed{3}.",
    "How many red circles are in the picture? How many blue squares are there? What number is shown?",
    "Which bar is the tallest? What is the height of bar B? What does the program in the image print?",
    "a = 3\nb = a + 4\nprint(b * 2)\nx = 7\ny = x - 2\nprint(x * y)",
    "Find x. Find the area of the triangle. Round to the nearest tenth. In the figure, angle ABC is 45 degrees.",
    "\\frac{1}{2} \\sqrt{3} 2\\sqrt{221} 46.1 45^\\circ \\angle \\triangle \\pi \\cdot \\times",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 25 30 40 50 60 70 80 90 100",
    "A B C D E yes no Yes No red green blue yellow purple orange black white circle square triangle",
]


@dataclass(frozen=True)
class TinyModelConfig:
    """Dimensions of the tiny model. The defaults give about 200K parameters and a GRPO step well under a second."""

    vocab_size: int = 600  # BPE vocabulary learned locally; the special tokens come on top
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vision_hidden_size: int = 32
    vision_depth: int = 2
    vision_num_heads: int = 2
    # Images are resized to 4..64 merged visual tokens, so a 112x112 image costs 16 tokens
    # Wider than real checkpoints' 0.02 so the random model's next-token distributions are peaked (entropy ~4.5-5.4
    # nats rather than ~ln V) and the image visibly moves them: the selection signals then carry structure
    initializer_range: float = 0.2
    min_pixels: int = 56 * 56
    max_pixels: int = 224 * 224
    seed: int = 0


def build_tokenizer(vocab_size: int = 600, corpus: Iterable[str] | None = None) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer (Qwen's pre-tokenizer family) on `corpus` (default: the tiny model's) with
    Qwen2.5-VL's special tokens appended."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS if corpus is None else corpus, trainer=trainer)
    tokenizer.add_special_tokens(list(QWEN_SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=list(QWEN_SPECIAL_TOKENS[1:]),
        model_max_length=32768,
        padding_side="left",
        chat_template=QWEN2_5_VL_CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def build_processor(config: TinyModelConfig | None = None) -> Qwen2_5_VLProcessor:
    """The real `Qwen2_5_VLProcessor` around the locally trained tokenizer, with small image-size bounds."""
    config = config or TinyModelConfig()
    tokenizer = build_tokenizer(config.vocab_size)
    image_processor = Qwen2VLImageProcessor(min_pixels=config.min_pixels, max_pixels=config.max_pixels)
    return Qwen2_5_VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(),
        chat_template=QWEN2_5_VL_CHAT_TEMPLATE,
    )


def build_model(
    processor: Qwen2_5_VLProcessor, config: TinyModelConfig | None = None
) -> Qwen2_5_VLForConditionalGeneration:
    """A randomly initialised `Qwen2_5_VLForConditionalGeneration` matching `processor`'s vocabulary, from a seed."""
    config = config or TinyModelConfig()
    tokenizer = processor.tokenizer
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in QWEN_SPECIAL_TOKENS}
    head_dim = config.hidden_size // config.num_attention_heads
    # M-RoPE splits the head_dim / 2 frequencies over (temporal, height, width) 2:3:3, like the real [16, 24, 24]
    if head_dim % 16:
        raise ValueError(f"hidden_size / num_attention_heads must be a multiple of 16 for M-RoPE, got {head_dim}")
    unit = head_dim // 16
    mrope_section = [2 * unit, 3 * unit, 3 * unit]
    model_config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": config.hidden_size,
            "intermediate_size": config.intermediate_size,
            "num_hidden_layers": config.num_hidden_layers,
            "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.num_key_value_heads,
            "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": mrope_section},
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
            "tie_word_embeddings": False,
            "initializer_range": config.initializer_range,
        },
        vision_config={
            "depth": config.vision_depth,
            "hidden_size": config.vision_hidden_size,
            "intermediate_size": config.vision_hidden_size * 2,
            "num_heads": config.vision_num_heads,
            "out_hidden_size": config.hidden_size,
            "fullatt_block_indexes": [config.vision_depth - 1],
            "initializer_range": config.initializer_range,
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    # Initialise on a private generator state so the build neither depends on nor disturbs the caller's RNG
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = Qwen2_5_VLForConditionalGeneration(model_config)
    model.generation_config = GenerationConfig(
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"],
        do_sample=True,
        temperature=1.0,
        # A random model samples any token; a sampled image token would not match the image features
        suppress_tokens=[ids["<|image_pad|>"], ids["<|video_pad|>"]],
    )
    return model


def build_tiny_qwen2_5_vl(
    config: TinyModelConfig | None = None, **overrides
) -> tuple[Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor]:
    """Build the tiny model and its processor. Keyword overrides replace fields of `TinyModelConfig` (e.g. seed=1)."""
    config = config or TinyModelConfig()
    if overrides:
        config = TinyModelConfig(**{**config.__dict__, **overrides})
    processor = build_processor(config)
    return build_model(processor, config), processor


def save_tiny_qwen2_5_vl(path: str | os.PathLike, config: TinyModelConfig | None = None, **overrides) -> Path:
    """Build the tiny model and save it with its processor to `path`, loadable with `from_pretrained(path)`."""
    model, processor = build_tiny_qwen2_5_vl(config, **overrides)
    path = Path(path)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


def tiny_model_path(cache_dir: str | os.PathLike | None = None, seed: int = 0) -> Path:
    """A saved tiny model, built once per seed under `cache_dir` (default: `$VEPO_TRL_CACHE` or the user cache)."""
    root = Path(cache_dir or os.environ.get("VEPO_TRL_CACHE") or Path.home() / ".cache" / "vepo_trl")
    path = root / f"tiny-qwen2.5-vl-seed{seed}"
    if (path / "vepo_tiny.json").exists():
        return path
    # Several processes (accelerate launch) may build at once: each writes its own folder, the first rename wins
    staging = root / f".{path.name}.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    save_tiny_qwen2_5_vl(staging, seed=seed)
    (staging / "vepo_tiny.json").write_text(json.dumps({"seed": seed}))
    try:
        os.rename(staging, path)
    except OSError:
        if not (path / "vepo_tiny.json").exists():
            raise
        shutil.rmtree(staging, ignore_errors=True)
    return path
