"""What a family module declares, and the generic pieces its declarations use.

A family module (one per family in this package) holds a `Family`: the model types and classes it covers, how to read
its `perturb` layout off its image processor, the inputs TRL 1.16 fails on for it (`limits`), its reference
checkpoint's normalisation. The same module holds the family's tiny model as data (`TINY_RECIPE`, a
`vepo_trl.builtin.tiny_recipes.base.TinyRecipe`) and its reference checkpoint's values with their sources
(`REFERENCE_PROCESSOR`, a `RealProcessor`; `REFERENCE_CONFIG`): a new family is one module. A
model type TRL trains whose images VEPO cannot perturb yet is a `Refused`, with what blocks it. Nothing here names a
family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..perturb import CLIP_MEAN as _CLIP_MEAN
from ..perturb import CLIP_STD, ImageLayout, PixelLayout, PositionedPatchLayout


__all__ = [
    "CLIP_MEAN",
    "CLIP_STD",
    "HALF_STD",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "QWEN_MEDIA_TOKENS",
    "Family",
    "Refused",
    "image_count_row",
    "patch_rows_layout",
    "positioned_layout",
    "tiles_layout",
]

CLIP_MEAN = list(_CLIP_MEAN)  # OpenAI CLIP's (transformers' constants), as the processors' configs list it
HALF_STD = (0.5, 0.5, 0.5)  # SigLIP's and Qwen3-VL's, transformers' IMAGENET_STANDARD_MEAN / _STD
IMAGENET_MEAN = [0.485, 0.456, 0.406]  # transformers' IMAGENET_DEFAULT_MEAN / _STD
IMAGENET_STD = (0.229, 0.224, 0.225)
# The Qwen tokenizer's media placeholders and vision special tokens (Qwen2-VL .. Qwen3.5, and the families on it)
QWEN_MEDIA_TOKENS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>")


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
# Families
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InputLimits:
    """What a family cannot take, stated as data (`families.check_family_inputs` refuses each in one line): `title`
    names the family in the message; each limit is a bound, or a switch, with the reason and the fix."""

    title: str
    fewest_images: tuple[int, str] | None = None  # (images every prompt needs, why)
    most_images: tuple[int, str] | None = None  # (images a prompt may hold, why)
    chat_template: str | None = None  # why a chat template is needed (refused without one)
    vllm: str | None = None  # why vLLM generation is refused
    processor_off: tuple[tuple[str, str], ...] = ()  # (processor image option that must stay off, why)


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
    # What the family's processor or data would crash on deep inside TRL 1.16 (or silently mistrain), refused at
    # start-up in one line by `families.check_family_inputs`
    limits: InputLimits | None = None
    # Why the installed vLLM cannot start an engine for a model of this config, or None: read before the model loads
    # (`vllm_prompts.vllm_blocker`), checking the engine's own failure so that it lifts once that is fixed
    vllm_blocker: Callable[[Any], str | None] | None = None
    # The media placeholders and vision special tokens of its tokenizer: no generation samples one, a completion
    # holding one is kept out of the loss (`trl_compat.media_tokens`); those the tokenizer lacks are skipped
    media_tokens: tuple[str, ...] = ()

    @property
    def tiny_model(self) -> str:
        """The local model name of its tiny model (`vepo_trl.local_models`)."""
        return f"tiny-{self.name}"


@dataclass(frozen=True)
class Refused:
    """A model type TRL trains whose images VEPO cannot perturb yet: refused at start-up in one line naming `blocker`
    (the README's model table lists it)."""

    model_type: str
    model_class: str
    pixel_values: str
    blocker: str


# ---------------------------------------------------------------------------------------------------------------------
# Reading image counts off a data set (for the image-count limits)
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


# ---------------------------------------------------------------------------------------------------------------------
# A family's reference checkpoint, as its module records it (`REFERENCE_PROCESSOR`, `REFERENCE_CONFIG`)
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RealProcessor:
    """A family's reference checkpoint as its processor and config see it (no weights): the image-processor class (a
    `transformers` name) and the kwargs that rebuild its `preprocessor_config.json`; what the family's processor adds
    on every call (`call`); the config class and the kwargs that give it the checkpoint's vision geometry. A family
    module declares one as `REAL_PROCESSOR`, its source in a comment above it ("read": a public copy of the file,
    named; "as X": another entry's file; "card": the model card and the family's known geometry; "class defaults": the
    transformers class); tests/test_perturb_real_processors.py checks the perturbations on it at real image sizes, and
    tests/test_builtin_tiny_recipes.py the tiny model's config against `REFERENCE_CONFIG` (the checkpoint's
    `config.json` less its sizes, each entry with its source)."""

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
class Pattern:
    """A per-layer list whose length is a depth: `period` repeated from layer 0, cut to the depth; `last`, when set,
    replaces the last layer's entry (transformers forces full attention there for Gemma 4)."""

    period: tuple
    last: object = None

    def expand(self, depth: int) -> list:
        values = [self.period[i % len(self.period)] for i in range(depth)]
        if self.last is not None and values:
            values[-1] = self.last
        return values
