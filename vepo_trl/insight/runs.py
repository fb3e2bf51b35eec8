"""Running a model outside training, as `vepo-trl inspect` and `analyze` do (and any script can): a recipe's selection
settings, image bounds, data rows, the model and its processor, sampled responses and their rewards. The commands
themselves are in `vepo_trl.commands` and use these through the package's exports (`vepo_trl.insight`).

Every argument is checked before a model loads; bad input ends with one line, `vepo-trl <command>: error: ...`, on
stderr and exit code 2.
"""

from __future__ import annotations

from typing import Any

from ..errors import UsageError
from ..local_models import is_builtin_model


# The name `vepo_trl.train` gives the synthetic data (not imported from there: that module loads TRL's trainers,
# seconds before a bad argument could be reported)
SYNTHETIC_DATASET = "synthetic"
# Rows of `synthetic` a training run generates unless its recipe says otherwise (`synthetic_rows`'s default)
SYNTHETIC_ROWS = 256


# ---------------------------------------------------------------------------------------------------------------------
# Shared arguments and checks
# ---------------------------------------------------------------------------------------------------------------------


def read_recipe(path: str) -> dict[str, Any]:
    from ..files import read_recipe

    return read_recipe(path)


def signal_settings(args, recipe: dict[str, Any]):
    from .signals import SignalSettings

    try:
        return SignalSettings.from_recipe(
            recipe,
            strategy=args.strategy,
            ratio=getattr(args, "k", None),
            alpha=args.alpha,
            perturbation=args.perturbation,
            noise_step=args.noise_step,
            noise_sigma=args.noise_sigma,
            patch_probability=args.patch_probability,
            seed=args.perturbation_seed,
            step=args.step,
            temperature=args.temperature,
            strategy_params=getattr(args, "strategy_params", None),
            perturbation_params=getattr(args, "perturbation_params", None),
        )
    except (TypeError, ValueError) as error:
        raise UsageError(str(error)) from None


def pixel_bounds(args, recipe: dict[str, Any]) -> dict[str, int]:
    """Image resize bounds: the flags, else the recipe's (as the run resized its data), else the paper's."""
    from ..data.loaders import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS

    for name in ("min_pixels", "max_pixels"):
        if getattr(args, name) is None and isinstance(recipe.get(name), int):
            setattr(args, name, recipe[name])

    bounds = {
        "min_pixels": args.min_pixels or DEFAULT_MIN_PIXELS,
        "max_pixels": args.max_pixels or DEFAULT_MAX_PIXELS,
    }
    if bounds["min_pixels"] > bounds["max_pixels"]:
        raise UsageError(f"--min_pixels {bounds['min_pixels']} exceeds --max_pixels {bounds['max_pixels']}")
    return bounds


def load_rows(name: str, split: str, needed: int, bounds: dict[str, int], seed: int = 0):
    """The first `needed` rows of a data set (`synthetic` generates them), before any model loads."""
    from ..data import load_vepo_dataset, synthetic_training_dataset

    try:
        if name == SYNTHETIC_DATASET:
            # The tiny model's pixel bounds unless asked otherwise, as the demo trains on
            extra = {k: v for k, v in bounds.items() if v is not None}
            return synthetic_training_dataset(needed, seed=seed, **extra)
        dataset = load_vepo_dataset(name, split, **bounds)
    except Exception as error:  # a missing file, an unknown name, the Hub unreachable: one line says which
        raise UsageError(f"--dataset {name}: {error}") from None
    return dataset


def load_model(name: str, device: str | None, dtype: str):
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from ..local_models import resolve_model_name

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    # The tiny model's name builds it once, unless a folder of that name exists
    path = resolve_model_name(name) if is_builtin_model(name) else name
    try:
        model = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype).to(device).eval()
        processor = AutoProcessor.from_pretrained(path)
    except (OSError, ValueError) as error:
        raise UsageError(f"--model {name}: {str(error).splitlines()[0]}") from None
    return model, processor, path


def score_rewards(completion_texts: list[str], answer: str | None, names: list[str], weights: list[float]):
    """Weighted reward per completion and each function's value, or `(None, None)` without a reference answer."""
    from ..rewards import get_reward_funcs

    if answer is None:
        return [None] * len(completion_texts), [{} for _ in completion_texts]
    conversational = [[{"role": "assistant", "content": text}] for text in completion_texts]
    per_func = {}
    for name, func in zip(names, get_reward_funcs(names)):
        per_func[name] = func(completions=conversational, answer=[answer] * len(completion_texts))
    totals, details = [], []
    for i in range(len(completion_texts)):
        values = {name: per_func[name][i] for name in names}
        valid = [(v, w) for v, w in zip(values.values(), weights) if v is not None]
        totals.append(sum(v * w for v, w in valid) if valid else None)
        details.append({name: (round(v, 4) if v is not None else None) for name, v in values.items()})
    return totals, details


def dataset_bounds(args, bounds: dict[str, int]) -> dict[str, int]:
    if args.dataset == SYNTHETIC_DATASET:
        # Synthetic rows default to the tiny model's bounds, as the demo trains on them
        return {k: v for k, v in (("min_pixels", args.min_pixels), ("max_pixels", args.max_pixels)) if v}
    return bounds


def sample_completions(model, processor, prompt, args, settings, seed: int) -> list:
    """The responses a command scores for one prompt: `--num_generations` samples at the recipe's temperature, or one
    greedy answer with `--greedy`."""
    from .signals import sample_completions

    return sample_completions(
        model,
        processor,
        prompt,
        1 if args.greedy else args.num_generations,
        max_new_tokens=args.max_new_tokens,
        temperature=settings.temperature,
        greedy=args.greedy,
        seed=seed,
    )
