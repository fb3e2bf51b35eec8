"""A tiny model as data: the real transformers classes by name and their arguments (`TinyRecipe`), with a special
token's id (`Tok`) and values computed from the build (`Derived`, `OMIT`) inside them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Tok:
    """A special token of the recipe, replaced by its id in the built tokenizer."""

    token: str


class _Omit:
    def __repr__(self):
        return "OMIT"


OMIT = _Omit()  # a `Derived` value that leaves its argument out


@dataclass(frozen=True)
class Derived:
    """A value computed from the build: `fn(build)`, where `build` has `config` (the `TinyModelConfig`: widths, seed,
    image bounds), `head_dim` (the language model's) and `vocab` (the tokenizer's size)."""

    fn: Callable[[Any], Any]


@dataclass(frozen=True)
class TinyRecipe:
    """A tiny model of a family: the real transformers classes (named, imported at build time) and their arguments.

    The language model's arguments start from the shared dimensions (`TinyModelConfig`'s hidden size, layers, heads,
    initializer range and the tokenizer's vocabulary) and `text` adds to or replaces them; `vision` likewise from the
    shared vision tower (`shared_vision=False`: `vision` alone). Anywhere in the arguments, `Tok` is a token's id and
    `Derived` a value computed from the build. The tokenizer is a byte-level BPE trained on a built-in corpus with
    `tokens` appended."""

    model: str  # the model class, e.g. "Gemma3ForConditionalGeneration"
    config: str  # its config class
    processor: str  # its processor class
    tokens: tuple[str, ...]  # the special tokens, in the real tokenizer's order
    eos: str
    pad: str
    chat_template: str  # the template itself, or "trl:<name>" for one of trl.chat_template_utils
    image_processor: tuple[str, dict]  # class name and arguments
    bos: str | None = None
    named_tokens: dict[str, str] = field(default_factory=dict)  # the tokenizer's extra_special_tokens
    parts: dict[str, tuple[str, dict]] = field(default_factory=dict)  # other processor parts (video_processor, ...)
    processor_args: dict = field(default_factory=dict)
    image_processor_attrs: dict = field(default_factory=dict)  # set on the image processor after it is made
    text: dict = field(default_factory=dict)
    vision: dict = field(default_factory=dict)
    shared_vision: bool = True
    top: dict = field(default_factory=dict)  # the model config's other arguments
    stop: tuple[str, ...] = ()  # generation: the tokens that end a completion (eos first)
    generation_bos: str | None = None
    # The multiple the language model's head width must be (M-RoPE splits it in sections), checked before anything is
    # built; and changes after the model is made
    head_dim_multiple: int = 1
    finish: Callable[[Any, Any], None] | None = None  # (model, build)
