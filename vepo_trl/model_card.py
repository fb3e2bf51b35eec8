"""The model card written at the end of a VEPO run: method, selection settings, data, `vepo/` metrics, citations."""

from __future__ import annotations

import math
import os
from importlib import resources
from importlib.metadata import version

from huggingface_hub import ModelCard, ModelCardData
from trl.trainer.utils import get_config_model_id

from .run_summary import method_name, perturbation_text, selection_text
from .scoring import get_strategy


# Settings worth reading on the card; nothing else of the config (paths, tokens) is written. Those the run's strategy
# or perturbation does not use are left out (`card_settings`)
CARD_SETTINGS = (
    "selection_strategy",
    "selection_ratio",
    "selection_alpha",
    "perturbation",
    "noise_step",
    "noise_annealing",
    "noise_sigma",
    "patch_probability",
    "loss_type",
    "num_generations",
    "learning_rate",
    "temperature",
    "beta",
    "epsilon",
    "max_completion_length",
)
# Logged metrics summarised on the card
CARD_METRIC_PREFIXES = ("vepo/", "reward", "rewards/", "entropy", "completions/mean_length")


def _format(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return str(value)


def summarize_metrics(log_history: list[dict]) -> tuple[list[tuple[str, str, str, str]], int]:
    """(name, first, last, mean) for every logged metric with a card prefix, and the number of logging steps."""
    series: dict[str, list[float]] = {}
    steps = 0
    for entry in log_history:
        if "loss" not in entry:  # the final summary entry has train_loss, not per-step metrics
            continue
        steps += 1
        for name, value in entry.items():
            if name.startswith(CARD_METRIC_PREFIXES) and isinstance(value, (int, float)):
                series.setdefault(name, []).append(float(value))
    rows = [
        (name, _format(values[0]), _format(values[-1]), _format(sum(values) / len(values)))
        for name, values in sorted(series.items())
    ]
    return rows, steps


def card_settings(args) -> list[tuple[str, str]]:
    """(key, value) of the settings that shaped this run: no noise step for an entropy run, no k for full GRPO."""
    from .config import unread_settings

    skip = set(unread_settings(args))
    return [(key, _format(getattr(args, key))) for key in CARD_SETTINGS if key not in skip]


def build_model_card(trainer, model_name: str | None = None, dataset_name: str | None = None, tags=None) -> ModelCard:
    """Render the VEPO model card for `trainer` (a `VEPOTrainer` after training)."""
    model_id = get_config_model_id(trainer.model.config)
    base_model = model_id if model_id and not os.path.isdir(model_id) else None
    tags = sorted({*(tags or []), *trainer._tag_names})
    model_name = model_name or os.path.basename(os.path.normpath(trainer.args.output_dir))
    card_data = ModelCardData(
        base_model=base_model,
        library_name="transformers",
        model_name=model_name,
        pipeline_tag="image-text-to-text",
        tags=["generated_from_trainer", *tags],
        datasets=[dataset_name] if dataset_name and "/" in dataset_name else None,
    )
    metrics, steps = summarize_metrics(trainer.state.log_history)
    settings = card_settings(trainer.args)
    strategy = get_strategy(trainer.args.selection_strategy)
    perturbation = perturbation_text(trainer.args) if strategy.needs_perturbed_pass else None
    template = resources.files("vepo_trl").joinpath("templates/model_card.md")
    with resources.as_file(template) as template_path:
        return ModelCard.from_template(
            card_data,
            template_path=str(template_path),
            model_name=model_name,
            base_model=base_model,
            hub_model_id=getattr(trainer, "hub_model_id", None) or trainer.args.hub_model_id,
            dataset_name=dataset_name,
            settings=settings,
            metrics=metrics,
            num_logged_steps=steps,
            is_vepo=strategy.name == "vepo",
            method=method_name(strategy.name),
            selection=selection_text(trainer.args),
            perturbation=perturbation,
            vepo_citation=trainer._paper["citation"],
            vepo_trl_version=version("vepo-trl"),
            trl_version=version("trl"),
            transformers_version=version("transformers"),
            pytorch_version=version("torch"),
            datasets_version=version("datasets"),
        )
