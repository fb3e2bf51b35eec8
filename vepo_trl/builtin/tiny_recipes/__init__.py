"""Every family's tiny model as data, keyed by the family's name: each family module in `vepo_trl.families` declares
its `TINY_RECIPE` (a `base.TinyRecipe`) beside its runtime adapter; this package holds the recipe's types (`base`) and
the Qwen families' shared parts (`_qwen`). `vepo_trl.builtin.tiny_models` is the one builder that reads them; a test
keeps every family paired with a recipe."""

from __future__ import annotations

import functools

from .base import TinyRecipe


@functools.cache
def tiny_recipes() -> dict[str, TinyRecipe]:
    """Each family's `TINY_RECIPE`, by family name (read on first use: the family modules import this package's
    `base`, so this package cannot import them while it loads)."""
    from ...families import FAMILY_MODULES

    return {name: module.TINY_RECIPE for name, module in FAMILY_MODULES.items() if hasattr(module, "TINY_RECIPE")}


def __getattr__(name: str):
    if name == "TINY_RECIPES":  # the mapping, as `from .tiny_recipes import TINY_RECIPES` reads it
        return tiny_recipes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
