"""`vepo-trl strategies`: the registered selection strategies and perturbations."""

from __future__ import annotations

from dataclasses import dataclass

from ..options import parser_for


@dataclass
class StrategiesOptions:
    """No options: the command lists the registries."""


def main(argv: list[str]) -> None:
    parser_for(
        StrategiesOptions, prog="vepo-trl strategies", description="List the selection strategies and perturbations."
    ).parse_args(argv)
    from ..perturb import PERTURBATIONS
    from ..scoring import SELECTION_STRATEGIES

    print("Selection strategies (--selection_strategy):")
    for name, strategy in sorted(SELECTION_STRATEGIES.items()):
        extra = " [perturbed pass]" if strategy.needs_perturbed_pass else ""
        print(f"  {name:<22}{strategy.description}{extra}")
    print("Perturbations (--perturbation):")
    for name, fn in sorted(PERTURBATIONS.items()):
        print(f"  {name:<22}{(fn.__doc__ or '').strip().splitlines()[0]}")
