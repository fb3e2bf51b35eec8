"""Tiny, randomly initialised models of every supported family, built locally, for tests, benchmarks and the CPU demo.

Everything here is the real thing at a small size: the family's own model, config and processor classes, a byte-level
BPE tokenizer carrying the family's special tokens, and its chat template. What each family's tiny model is lives in
its family module (`TINY_RECIPE`, a `vepo_trl.builtin.tiny_recipes.base.TinyRecipe`, beside its runtime adapter in
`vepo_trl.families`); this module is the one builder that reads them. Nothing is
downloaded: the tokenizer is trained on a small built-in corpus and the weights come from a seed, so two builds with
the same seed are identical. Saved with `save_pretrained`, the folder loads with `from_pretrained(path)` exactly like
a Hub id. The default family is the paper's, Qwen2.5-VL (`build_tiny_qwen2_5_vl`).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast

from ..families import FAMILIES, banned_token_ids, get_family
from ..utils import cache_root
from .tiny_recipes import TINY_RECIPES
from .tiny_recipes._qwen import QWEN2_5_VL_CHAT_TEMPLATE, QWEN_SPECIAL_TOKENS
from .tiny_recipes.base import OMIT, Derived, TinyRecipe, Tok


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


DEFAULT_FAMILY = "qwen2.5-vl"  # the paper's model
# Every family with a tiny model (all of them), in the registry's order
TINY_FAMILIES = tuple(family.name for family in FAMILIES)


@dataclass(frozen=True)
class _Build:
    """What a recipe's `Derived` values read: the widths, the tokenizer's ids and size."""

    config: TinyModelConfig
    tokenizer: PreTrainedTokenizerFast
    tokens: tuple[str, ...]

    @property
    def head_dim(self) -> int:
        return self.config.hidden_size // self.config.num_attention_heads

    @property
    def vocab(self) -> int:
        return len(self.tokenizer)

    @cached_property
    def ids(self) -> dict[str, int]:
        return {token: self.tokenizer.convert_tokens_to_ids(token) for token in self.tokens}


def _resolve(value, build: _Build):
    """A recipe value with its `Tok`s and `Derived`s filled in (an `OMIT` leaves its key out)."""
    if isinstance(value, Tok):
        return build.ids[value.token]
    if isinstance(value, Derived):
        return value.fn(build)
    if isinstance(value, dict):
        resolved = {key: _resolve(item, build) for key, item in value.items()}
        return {key: item for key, item in resolved.items() if item is not OMIT}
    if isinstance(value, list):
        return [_resolve(item, build) for item in value]
    return value


def tiny_recipe(family: str) -> TinyRecipe:
    """The tiny model of `family` (a name or alias the registry knows) as data."""
    return TINY_RECIPES[get_family(family).name]


def _config(config: TinyModelConfig | None, overrides: dict) -> TinyModelConfig:
    config = config or TinyModelConfig()
    return TinyModelConfig(**{**config.__dict__, **overrides}) if overrides else config


def _chat_template(recipe: TinyRecipe) -> str:
    if recipe.chat_template.startswith("trl:"):  # one TRL ships
        from trl import chat_template_utils

        return getattr(chat_template_utils, recipe.chat_template.removeprefix("trl:"))
    return recipe.chat_template


def _made(part: tuple[str, dict], build: _Build):
    name, arguments = part
    return getattr(transformers, name)(**_resolve(arguments, build))


def build_tiny_processor(family: str = DEFAULT_FAMILY, config: TinyModelConfig | None = None, **overrides):
    """The real processor of `family` around a locally trained tokenizer with its special tokens, at the tiny sizes."""
    recipe, config = tiny_recipe(family), _config(config, overrides)
    template = _chat_template(recipe)
    tokenizer = build_tokenizer(
        config.vocab_size,
        special_tokens=recipe.tokens,
        bos_token=recipe.bos,
        eos_token=recipe.eos,
        pad_token=recipe.pad,
        chat_template=template,
        extra_special_tokens=recipe.named_tokens or None,
    )
    build = _Build(config, tokenizer, recipe.tokens)
    image_processor = _made(recipe.image_processor, build)
    for name, value in recipe.image_processor_attrs.items():
        setattr(image_processor, name, value)
    parts = {name: _made(part, build) for name, part in recipe.parts.items()}
    return getattr(transformers, recipe.processor)(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=template,
        **parts,
        **_resolve(recipe.processor_args, build),
    )


def build_tiny_config(family: str, processor, config: TinyModelConfig | None = None, **overrides):
    """The model config of `family`'s tiny model, matching `processor`'s vocabulary."""
    recipe, config = tiny_recipe(family), _config(config, overrides)
    build = _Build(config, processor.tokenizer, recipe.tokens)
    if build.head_dim % recipe.head_dim_multiple:
        raise ValueError(
            f"hidden_size / num_attention_heads must be a multiple of {recipe.head_dim_multiple} for "
            f"{recipe.model}, got {build.head_dim}"
        )
    # The shared dimensions, which a recipe adds to or replaces
    text = {
        "vocab_size": build.vocab,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "initializer_range": config.initializer_range,
        **recipe.text,
    }
    vision = recipe.vision
    if recipe.shared_vision:
        vision = {
            "hidden_size": config.vision_hidden_size,
            "intermediate_size": config.vision_hidden_size * 2,
            "num_hidden_layers": config.vision_depth,
            "num_attention_heads": config.vision_num_heads,
            **vision,
        }
    # `architectures` as the saved config.json has it (what vLLM and the Auto classes read)
    return getattr(transformers, recipe.config)(
        architectures=[recipe.model],
        text_config=_resolve(text, build),
        vision_config=_resolve(vision, build),
        **_resolve(recipe.top, build),
    )


def build_tiny_model(family: str, processor, config: TinyModelConfig | None = None, **overrides):
    """A randomly initialised model of `family` matching `processor`'s vocabulary, from a seed."""
    recipe, config = tiny_recipe(family), _config(config, overrides)
    build = _Build(config, processor.tokenizer, recipe.tokens)
    model_config = build_tiny_config(family, processor, config)
    # Initialise on a private generator state so the build neither depends on nor disturbs the caller's RNG
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = getattr(transformers, recipe.model)(model_config)
    if recipe.finish is not None:
        recipe.finish(model, build)
    ids = processor.tokenizer.convert_tokens_to_ids
    model.generation_config = GenerationConfig(
        **({"bos_token_id": ids(recipe.generation_bos)} if recipe.generation_bos else {}),
        eos_token_id=[ids(token) for token in recipe.stop],
        pad_token_id=ids(recipe.pad),
        do_sample=True,
        temperature=1.0,
        # A random model samples any token: never its family's media tokens (a sampled image placeholder would not
        # match the image features)
        suppress_tokens=banned_token_ids(model_config, processor),
    )
    return model


def build_tiny(family: str, config: TinyModelConfig | None = None, **overrides):
    """The tiny model and processor of `family` (a name of the registry, `vepo_trl.families`); keyword overrides
    replace fields of `TinyModelConfig` (e.g. seed=1, or hidden_size=128 for a head_dim of 32)."""
    config = _config(config, overrides)
    processor = build_tiny_processor(family, config)
    return build_tiny_model(family, processor, config), processor


def save_tiny(family: str, path: str | os.PathLike, config: TinyModelConfig | None = None, **overrides) -> Path:
    """Build `family`'s tiny model and save it with its processor to `path`, loadable with `from_pretrained(path)`."""
    model, processor = build_tiny(family, config, **overrides)
    path = Path(path)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


# The default family's (the demo's, most tests' and the benchmarks')


@dataclass(frozen=True)
class LayoutSignature:
    """What a family's batches look like to the generic machinery (batch splitting, prompt padding, the perturbed
    pass, sharding's dummy image): families alike in it take the same paths there. Read off the tiny processor's
    output for a one-image prompt and the family's perturbation layout."""

    layout: str  # the perturbation layout's class
    options: tuple[str, ...]  # its switches that are on
    inputs: tuple[str, ...]  # the processor's outputs beside input_ids and attention_mask
    pixel_rank: int  # pixel_values' number of dimensions
    tiles_per_prompt: bool
    prefix_lm: bool


def _quiet_config(family: str, processor):
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # a recipe's notes on its config (layer types) say nothing here
    try:
        return build_tiny_config(family, processor)
    finally:
        transformers.logging.set_verbosity(verbosity)


@functools.cache
def layout_signature(family: str) -> LayoutSignature:
    """`family`'s `LayoutSignature`, from its tiny processor and config (no weights)."""
    import dataclasses

    from PIL import Image

    from ..families import pixel_layout

    processor = build_tiny_processor(family)
    layout = pixel_layout(_quiet_config(family, processor), processor.image_processor)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    outputs = processor(text=[text], images=[[Image.new("RGB", (56, 40), (90, 140, 200))]], return_tensors="pt")
    switches = [field.name for field in dataclasses.fields(layout) if getattr(layout, field.name) is True]
    spec = get_family(family)
    return LayoutSignature(
        type(layout).__name__,
        tuple(switches),
        tuple(sorted(set(outputs) - {"input_ids", "attention_mask"})),
        outputs["pixel_values"].dim(),
        spec.tiles_per_prompt,
        spec.prefix_lm,
    )


def takes(family: str, dataset, use_vllm: bool = False) -> bool:
    """Whether `family` trains on `dataset` at all: its start-up checks (`Family.limits`) let it through."""
    from ..families import check_family_inputs

    processor = build_tiny_processor(family)
    try:
        check_family_inputs(_quiet_config(family, processor), processor, {"train": dataset}, use_vllm=use_vllm)
    except ValueError:
        return False
    return True


def one_per_layout(key=None, accepts=None, prefer: str = DEFAULT_FAMILY) -> list[str]:
    """One family per group of equal `key(LayoutSignature)` (the whole signature by default), in registry order: the
    group's first family that `accepts(name)`, `prefer` where it is in the group. How the layout-parametrised tests
    pick their families, so a family with a new layout is tested without naming it."""
    key = key or (lambda signature: signature)
    groups: dict = {}
    for family in FAMILIES:
        if accepts is None or accepts(family.name):
            groups.setdefault(key(layout_signature(family.name)), []).append(family.name)
    return [prefer if prefer in names else names[0] for names in groups.values()]


def build_processor(config: TinyModelConfig | None = None):
    """The tiny Qwen2.5-VL's processor (`build_tiny_processor` of the default family)."""
    return build_tiny_processor(DEFAULT_FAMILY, config)


def build_model(processor, config: TinyModelConfig | None = None):
    """The tiny Qwen2.5-VL matching `processor`'s vocabulary (`build_tiny_model` of the default family)."""
    return build_tiny_model(DEFAULT_FAMILY, processor, config)


def build_tiny_qwen2_5_vl(config: TinyModelConfig | None = None, **overrides):
    """Build the tiny model and its processor. Keyword overrides replace fields of `TinyModelConfig` (e.g. seed=1)."""
    return build_tiny(DEFAULT_FAMILY, config, **overrides)


def save_tiny_qwen2_5_vl(path: str | os.PathLike, config: TinyModelConfig | None = None, **overrides) -> Path:
    """Build the tiny model and save it with its processor to `path`, loadable with `from_pretrained(path)`."""
    return save_tiny(DEFAULT_FAMILY, path, config, **overrides)


# Written last into a cached tiny model's folder: the build finished
TINY_MARKER = "vepo_tiny.json"


def tiny_model_path(cache_dir: str | os.PathLike | None = None, seed: int = 0, family: str = DEFAULT_FAMILY) -> Path:
    """A saved tiny model of `family`, built once per seed under `cache_dir` (default: `$VEPO_TRL_CACHE` or the user
    cache)."""
    get_family(family)  # one line naming the families for an unknown one
    root = Path(cache_dir) if cache_dir else cache_root()
    path = root / f"tiny-{family}-seed{seed}"
    if (path / TINY_MARKER).exists():
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
    (staging / TINY_MARKER).write_text(json.dumps({"seed": seed}))
    try:
        os.rename(staging, path)
    except OSError:
        if not (path / TINY_MARKER).exists():
            raise
        shutil.rmtree(staging, ignore_errors=True)
    return path
