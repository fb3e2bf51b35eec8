"""Every family's tiny model as data, keyed by the family's name: one module per family (beside the runtime adapter
in `vepo_trl.families`, of the same name) declaring `FAMILY` (the name) and `RECIPE` (a `base.TinyRecipe`), and the
Qwen families' shared parts (`_qwen`). `vepo_trl.builtin.tiny_models` is the one builder that reads them; a test keeps
every family paired with a recipe."""

from __future__ import annotations

import importlib
import pkgutil

from .base import TinyRecipe


def _discover() -> dict[str, TinyRecipe]:
    recipes = {}
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name):
        if module.name.startswith("_") or module.name == "base":
            continue
        loaded = importlib.import_module(f"{__name__}.{module.name}")
        recipes[loaded.FAMILY] = loaded.RECIPE
    return recipes


TINY_RECIPES = _discover()
