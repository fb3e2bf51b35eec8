"""What a family module declares, and the generic pieces its declarations use.

A family module (one per family in this package) holds a `Family`: the model types and classes it covers, how to read
its `perturb` layout off its image processor, the inputs TRL 1.16 fails on for it (`check_inputs`), its reference
checkpoint's normalisation, and its tiny model as a `TinyRecipe`, data that `vepo_trl.testing`'s one builder reads. A
model type TRL trains whose images VEPO cannot perturb yet is a `Refused`, with what blocks it. Nothing here names a
family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..perturb import ImageLayout, PixelLayout, PositionedPatchLayout


__all__ = [
    "CLIP_MEAN",
    "CLIP_STD",
    "HALF_STD",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "Derived",
    "Family",
    "OMIT",
    "RealProcessor",
    "Refused",
    "TinyRecipe",
    "Tok",
    "image_count_row",
    "patch_rows_layout",
    "positioned_layout",
    "tiles_layout",
]

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]  # OpenAI CLIP's, transformers' OPENAI_CLIP_MEAN / _STD
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
HALF_STD = (0.5, 0.5, 0.5)  # SigLIP's and Qwen3-VL's, transformers' IMAGENET_STANDARD_MEAN / _STD
IMAGENET_MEAN = [0.485, 0.456, 0.406]  # transformers' IMAGENET_DEFAULT_MEAN / _STD
IMAGENET_STD = (0.229, 0.224, 0.225)


# ---------------------------------------------------------------------------------------------------------------------
# Layouts: how a family's `perturb` layout is read off its image processor and config
# ---------------------------------------------------------------------------------------------------------------------


def patch_rows_layout(image_processor, config) -> PixelLayout:
    """Flattened patch rows + `image_grid_thw`: patch size, temporal copies and merge size are the image processor's."""
    return PixelLayout.from_image_processor(image_processor)


def _vision_patch_size(config) -> int:
    patch = config.vision_config.patch_size
    return int(patch[0] if isinstance(patch, (list, tuple)) else patch)


def tiles_layout(**options) -> Callable:
    """Whole images or tiles `(.., C, H, W)` on the vision tower's patch grid; `options` as `ImageLayout`'s."""

    def layout(image_processor, config) -> ImageLayout:
        return ImageLayout.from_image_processor(image_processor, _vision_patch_size(config), **options)

    return layout


def positioned_layout(image_processor, config) -> PositionedPatchLayout:
    """Padded patch rows addressed by `image_position_ids`: the processor's patch size and statistics."""
    return PositionedPatchLayout.from_image_processor(image_processor)


# ---------------------------------------------------------------------------------------------------------------------
# Tiny models as data
# ---------------------------------------------------------------------------------------------------------------------


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
    suppress: tuple[str, ...] = ()  # generation: tokens a random model must not sample (image placeholders)
    generation_bos: str | None = None
    # Checks on the widths before anything is built (raise ValueError), and changes after the model is made
    check: Callable[[Any], None] | None = None
    finish: Callable[[Any, Any], None] | None = None  # (model, build)


# ---------------------------------------------------------------------------------------------------------------------
# Families
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    """One model family: its name, the `model_type`s and classes that belong to it, the layout of its `pixel_values`
    (for the README) and how to read its `perturb` layout off its image processor and config. `trl_failure` says why
    TRL's own `GRPOTrainer` cannot train the family here (its adapter is kept and tested, training is left out);
    `trl_limitation` which of TRL's settings fail on the family in `GRPOTrainer` itself. `order` places it in the
    registry (and the README's table)."""

    name: str
    order: int
    model_types: tuple[str, ...]
    model_classes: tuple[str, ...]
    pixel_values: str
    make_layout: Callable
    tiny: TinyRecipe
    trl_failure: str | None = None
    recipes: tuple[str, ...] = ()
    trl_limitation: str | None = None
    # A reference checkpoint and the per-channel std its preprocessor_config.json normalises with: how strong
    # `gaussian`'s noise (drawn on the normalised pixels, as the release does) is in [0, 1] space on this family
    reference: tuple[str, tuple[float, float, float]] | None = None
    # `pixel_values` a flat run of tiles, counted per prompt by TRL's `num_tiles`
    tiles_per_prompt: bool = False
    # A prefix LM: `token_type_ids` 0 marks the bidirectional prefix (image and prompt), 1 the causal suffix
    prefix_lm: bool = False
    # What the family's processor or data would crash on deep inside TRL 1.16 (or silently mistrain): raise
    # ValueError in one line. Called as check_inputs(processor, datasets, chat_template=..., use_vllm=...), with
    # `datasets` a list of (name, data set)
    check_inputs: Callable[..., None] | None = None
    # Why the installed vLLM cannot start an engine for a model of this config, or None: read before the model loads
    # (`vllm_prompts.vllm_blocker`), checking the engine's own failure so that it lifts once that is fixed
    vllm_blocker: Callable[[Any], str | None] | None = None

    @property
    def tiny_model(self) -> str:
        """The local model name of its tiny model (`vepo_trl.local_models`)."""
        return f"tiny-{self.name}"


@dataclass(frozen=True)
class RealProcessor:
    """A family's reference checkpoint as its processor and config see it (no weights): the image-processor class (a
    `transformers` name) and the kwargs that rebuild its `preprocessor_config.json`; what the family's processor adds
    on every call (`call`); the config class and the kwargs that give it the checkpoint's vision geometry. A family
    module declares one as `REAL_PROCESSOR`, its source in a comment above it ("read": a public copy of the file,
    named; "as X": another entry's file; "card": the model card and the family's known geometry; "class defaults": the
    transformers class); tests/test_real_processors.py checks the perturbations on it at real image sizes."""

    checkpoint: str
    processor: str
    kwargs: dict
    config: str
    config_kwargs: dict
    call: dict = field(default_factory=dict)
    # The processor takes images per prompt (nested lists) and lays `pixel_values` out one row per prompt
    per_prompt: bool = False
    # Which pixels are the image's own, the rest padding: "all", "pixel_mask" (`pixel_attention_mask`), "image_sizes"
    # (each image's top-left `image_sizes`), "anyres" (each crop's box inside the letterbox, zero crops after) or
    # "positions" (patch rows whose `image_position_ids` are not -1)
    real: str = "all"
    # It cuts an image into tiles: a white page has identical ones
    tiles: bool = False
    # The model reads every patch holding an image pixel, the last ones part padding (Idefics2's
    # patch_attention_mask over a batch padded past the image): its patch grid covers the image rounded up
    partial_patches: bool = False


@dataclass(frozen=True)
class Refused:
    """A model type TRL trains whose images VEPO cannot perturb yet: refused at start-up in one line naming `blocker`
    (the README's model table lists it)."""

    model_type: str
    model_class: str
    pixel_values: str
    blocker: str


# ---------------------------------------------------------------------------------------------------------------------
# Reading image counts off a data set (for check_inputs)
# ---------------------------------------------------------------------------------------------------------------------


def arrow_table(dataset):
    """The rows of a `datasets.Dataset` as an Arrow table, in the data set's own order (a `select` keeps an index
    mapping over the whole table, which `dataset.data` alone does not apply); None for other data sets."""
    if not hasattr(dataset, "with_format") or getattr(dataset, "data", None) is None:
        return None
    if getattr(dataset, "_indices", None) is None:
        return dataset.data.table if hasattr(dataset.data, "table") else dataset.data
    return dataset.with_format("arrow")[:]


def image_counts(dataset) -> list[int] | None:
    """Images per row, read off the Arrow table without decoding any: an `images` list, or one `image`."""
    import pyarrow.compute as pc

    table = arrow_table(dataset)
    columns = getattr(dataset, "column_names", None) or []
    if table is None:
        return None
    if "images" in columns:
        lengths = pc.list_value_length(table.column("images")).to_pylist()
        return [0 if n is None else n for n in lengths]
    if "image" in columns:
        return [0 if null else 1 for null in pc.is_null(table.column("image")).to_pylist()]
    return None


def image_count_row(dataset, pick=max) -> tuple[int, int] | None:
    """(row, image count) of the row with the most (`pick=max`) or fewest (`min`) images, read off the Arrow table
    without decoding any image: an `images` list, or TRL's other form, one `image` (none where it is null)."""
    lengths = image_counts(dataset)
    if not lengths:
        return None
    row = pick(range(len(lengths)), key=lengths.__getitem__)
    return row, lengths[row]
