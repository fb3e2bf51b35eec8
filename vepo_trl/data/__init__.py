"""Data: loaders for the real data sets in TRL's conversational VLM format, and synthetic visual-reasoning rows for
tests and the CPU demo."""

from datasets import Dataset

from .loaders import (
    DEFAULT_MAX_PIXELS,
    DEFAULT_MIN_PIXELS,
    HUB_DATASETS,
    SYSTEM_PROMPT,
    convert_dataset,
    load_vepo_dataset,
    prepare_image,
    to_conversational,
)
from .synthetic import SYNTHETIC_TASKS, make_synthetic_dataset, make_synthetic_row, register_task


def synthetic_training_dataset(
    num_rows: int, seed: int = 0, *, min_pixels: int = 56 * 56, max_pixels: int = 224 * 224, **kwargs
) -> Dataset:
    """Synthetic rows converted like the real data sets (system prompt, image parts, RGB, pixel bounds).

    The default pixel bounds suit the tiny test model (4 to 64 visual tokens per image); `kwargs` go to
    `make_synthetic_dataset` (kinds, image sizes and modes).
    """
    rows = make_synthetic_dataset(num_rows, seed, **kwargs)
    return convert_dataset(rows, source="synthetic", min_pixels=min_pixels, max_pixels=max_pixels, strict=True)


__all__ = [
    "DEFAULT_MAX_PIXELS",
    "DEFAULT_MIN_PIXELS",
    "HUB_DATASETS",
    "SYNTHETIC_TASKS",
    "SYSTEM_PROMPT",
    "convert_dataset",
    "load_vepo_dataset",
    "make_synthetic_dataset",
    "make_synthetic_row",
    "prepare_image",
    "register_task",
    "synthetic_training_dataset",
    "to_conversational",
]
