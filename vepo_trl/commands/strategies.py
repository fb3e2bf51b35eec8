"""`vepo-trl strategies`: the registered selection strategies, perturbations, benchmarks and reward functions, each
with the package it came from (`vepo_trl`, or an installed plug-in's), its own settings, and the plug-ins that failed
to load (one line each, listed, never raised: only a run that names one is refused)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from ..options import parser_for
from ..registry import doc_summary


@dataclass
class StrategiesOptions:
    """No options: the command lists the registries."""


def _settings(settings: dict) -> str:
    shown = [
        name if default is inspect.Parameter.empty else f"{name}={default!r}" for name, default in settings.items()
    ]
    return f" settings: {', '.join(shown)}" if shown else ""


def _from(registry, name: str) -> str:
    source = registry.source(name)
    return "" if source == "vepo_trl" else f" (from {source})"


def _section(title: str, registry, lines) -> None:
    print(title)
    for line in lines:
        print(f"  {line}")
    for line in registry.broken().values():
        print(f"  broken: {line}")


def main(argv: list[str]) -> None:
    parser_for(
        StrategiesOptions,
        prog="vepo-trl strategies",
        description="List the selection strategies, perturbations, benchmarks and reward functions, with the package "
        "each comes from (plug-ins: docs/plugins.md).",
    ).parse_args(argv)
    from ..eval.benchmarks import BENCHMARKS
    from ..perturb import PERTURBATIONS, perturbation_settings
    from ..rewards import REWARD_FUNCS
    from ..scoring import SELECTION_STRATEGIES

    strategies = [
        f"{name:<22}{s.description}{' [perturbed pass]' if s.needs_perturbed_pass else ''}{_settings(s.settings)}"
        f"{_from(SELECTION_STRATEGIES, name)}"
        for name, s in sorted(SELECTION_STRATEGIES.items())
    ]
    _section("Selection strategies (--selection_strategy; own settings: --strategy_params):", SELECTION_STRATEGIES,
             strategies)  # fmt: skip
    perturbations = [
        f"{name:<22}{doc_summary(fn)}{_settings(perturbation_settings(name))}{_from(PERTURBATIONS, name)}"
        for name, fn in sorted(PERTURBATIONS.items())
    ]
    _section("Perturbations (--perturbation; own settings: --perturbation_params):", PERTURBATIONS, perturbations)
    benchmarks = [
        f"{name:<22}{bench.title}{_from(BENCHMARKS, name)}" for name, bench in BENCHMARKS.items()
    ]  # fmt: skip
    _section("Benchmarks (vepo-trl eval --benchmarks):", BENCHMARKS, benchmarks)
    rewards = [f"{name:<22}{doc_summary(fn)}{_from(REWARD_FUNCS, name)}" for name, fn in sorted(REWARD_FUNCS.items())]
    _section("Reward functions (--reward_funcs):", REWARD_FUNCS, rewards)
