"""`vepo-trl lab`: its options and their texts (seeds, rules, learning rates) checked before torch loads, then the
lab's runs (`vepo_trl.lab.experiment`)."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

from ..builtin.lab_tasks import DEFAULT_TASK, TASKS
from ..errors import UsageError
from ..options import option, parser_for
from ..validation import ALWAYS, FLAG, MAPPING, TEXT, Reads, above, at_least, names, number, path_rule, whole


MAX_SEED = 9000


def _list(text: str) -> list[str]:
    return [part for part in text.replace(",", " ").split() if part]


# --sweep sets every rule's learning rate itself
_NO_SWEEP = Reads(("sweep",), lambda sweep: sweep is None, "no --sweep (which sets the learning rates itself)",
                  ("1e-4",), (None,))  # fmt: skip
_STRATEGIES = dataclasses.replace(
    TEXT, valid="at least one strategy, e.g. full,vepo", test=lambda text: bool(_list(text))
)

LAB_HELP = (
    "RL from a warm-started tiny Qwen2.5-VL with several token-selection strategies over several seeds; held-out "
    "greedy accuracy before and after, reward curves and selected-token statistics in a markdown/JSON table and a "
    "PNG. The warm start is built on first use (about 1.5 minutes on 2 cores) and cached under $VEPO_TRL_CACHE."
)


@dataclass
class LabOptions:
    task: str | None = option(None, f"Lab task (default: {DEFAULT_TASK}). "
                              + "; ".join(f"{task.name}: {task.description}" for task in TASKS.values()) + ".",
                              reads=ALWAYS, rule=names(*TASKS))  # fmt: skip
    strategies: str | None = option(
        None, "Rules to compare, comma-separated: a strategy from `vepo-trl strategies`, optionally with its k after a "
        "colon (vepo:0.4); a bare name uses k = 0.2 (default: the task's, e.g. "
        "full,entropy:0.2,vepo:0.2,random:0.2,entropy:0.4,vepo:0.4).", reads=ALWAYS, rule=_STRATEGIES)  # fmt: skip
    strategy_params: str | None = option(
        None, "The compared strategies' own settings (a plug-in's keyword parameters), by strategy, as JSON: "
        "'{\"confident_visual\": {\"sharpness\": 1.0}}'.", reads=ALWAYS, rule=MAPPING)  # fmt: skip
    seeds: str | None = option(
        None, "Seeds, comma-separated (default: the task's, 0-13 for squares).", reads=ALWAYS, rule=TEXT
    )
    learning_rates: str | None = option(
        None, "Per-rule learning rates, e.g. full=3e-4,vepo:0.2=6e-4, on top of the task's (from its sweep); a rule "
        "with neither uses --learning_rate.", reads=_NO_SWEEP, rule=TEXT)  # fmt: skip
    sweep: str | None = option(
        None, "Instead of the lab: run every rule at each of these learning rates (comma-separated) over --seeds, "
        "score them on validation rows, and write sweep.md/sweep.json with each rule's best.", reads=ALWAYS, rule=TEXT,
        metavar="LRS")  # fmt: skip
    quick: bool = option(False, "A CI-sized lab: a briefly trained warm start and full + vepo for a few steps, one "
                         "seed (under 3 minutes).", reads=ALWAYS, rule=FLAG)  # fmt: skip
    output_dir: str = option("vepo-lab", "Where lab.md, lab.json, lab_curves.png and runs/ go (default: vepo-lab). "
                             "Finished runs in it are reused.",
                             reads=ALWAYS, rule=path_rule("out_folder", "a folder that can be written", False))  # fmt: skip
    steps: int | None = option(None, "RL steps per run (default: the task's, 40 for squares).",
                               reads=ALWAYS, rule=whole(at_least(1), "a whole number of steps >= 1", True))  # fmt: skip
    max_minutes: float | None = option(None, "Wall-time limit per run (default: 5).",
                                       reads=ALWAYS, rule=number(above(0), "above 0 minutes, or unset", True))  # fmt: skip
    learning_rate: float | None = option(
        None, "RL learning rate of rules without their own (default: 3e-4).",
        reads=_NO_SWEEP, rule=number(above(0), "above 0 (a lab run that learns nothing compares nothing), or unset", True))  # fmt: skip
    eval_rows: int | None = option(None, "Held-out rows for accuracy (default: the task's, 400 for squares).",
                                   reads=ALWAYS, rule=whole(at_least(1), "a whole number >= 1, or unset", True))  # fmt: skip
    build_warm_start: bool = option(False, "Only build (or find) the cached warm start and print its path and "
                                    "held-out accuracy.", reads=ALWAYS, rule=FLAG)  # fmt: skip
    jobs: int = option(1, "Runs in parallel, one thread each (default: 1).",
                       reads=ALWAYS, rule=whole(at_least(1), "a whole number >= 1 (runs at once)"))  # fmt: skip
    overwrite_output_dir: bool = option(
        False, "Start fresh in an output_dir whose lab used other settings (steps, learning rate, ...): its runs are "
        "recomputed instead of reused. Without it such a folder is refused.", reads=ALWAYS, rule=FLAG)  # fmt: skip


def make_parser() -> argparse.ArgumentParser:
    return parser_for(LabOptions, prog="vepo-trl lab", description=LAB_HELP)


def _seeds(text: str) -> tuple[int, ...]:
    parts = _list(text)
    if not parts:
        raise UsageError(f"--seeds {text!r}: give at least one seed, e.g. --seeds 0,1,2.")
    try:
        seeds = tuple(int(part) for part in parts)
    except ValueError:
        raise UsageError(f"--seeds {text!r}: seeds are whole numbers, e.g. --seeds 0,1,2.") from None
    outside = [seed for seed in seeds if not 0 <= seed < MAX_SEED]
    if outside:
        # A run's training rows are seeded 1000 + seed; from 10,000 on they would be the held-out and validation rows
        raise UsageError(f"--seeds {text!r}: seeds are 0 to {MAX_SEED - 1}, got {outside}.")
    repeated = sorted({seed for seed in seeds if seeds.count(seed) > 1})
    if repeated:
        raise UsageError(f"--seeds {text!r} repeats {repeated}: a repeated seed is the same run, not another sample.")
    return seeds


def _rates(text: str, flag: str) -> list[float]:
    try:
        rates = [float(part) for part in _list(text)]
    except ValueError:
        raise UsageError(f"{flag} {text!r}: learning rates are numbers, e.g. {flag} 1.5e-4,3e-4,6e-4.") from None
    if not rates or any(not rate > 0 for rate in rates):
        raise UsageError(f"{flag} {text!r}: give learning rates above 0, e.g. {flag} 1.5e-4,3e-4,6e-4.")
    repeated = sorted({rate for rate in rates if rates.count(rate) > 1})
    if repeated:
        raise UsageError(f"{flag} {text!r} repeats {', '.join(f'{r:g}' for r in repeated)}.")
    return rates


def _learning_rates(text: str) -> dict[str, float]:
    from ..lab.experiment import parse_arm

    out = {}
    for part in _list(text):
        label, sep, value = part.rpartition("=")
        if not sep or not label:
            raise UsageError(f"--learning_rates {text!r}: write rule=lr pairs, e.g. full=3e-4,vepo:0.2=6e-4.")
        try:  # "vepo:0.20" and "vepo" name the rule "vepo:0.2"
            label = parse_arm(label, 0.2).label
        except ValueError as error:
            raise UsageError(f"--learning_rates: {error}") from None
        out[label] = _rates(value, "--learning_rates")[0]
    if not out:
        raise UsageError(f"--learning_rates {text!r}: write rule=lr pairs, e.g. full=3e-4,vepo:0.2=6e-4.")
    return out


def _arms(text: str) -> tuple[str, ...]:
    """`--strategies` entries, checked against the strategy registry and the `name:k` form."""
    from ..lab.experiment import parse_arm
    from ..scoring import SELECTION_STRATEGIES

    names = _list(text)
    for name in names:
        try:
            arm = parse_arm(name, 0.2)
        except ValueError as error:
            raise UsageError(f"--strategies: {error}") from None
        if line := SELECTION_STRATEGIES.broken_line(arm.strategy):
            raise UsageError(f"--strategies: {line}")
        if arm.strategy not in SELECTION_STRATEGIES:
            raise UsageError(
                f"--strategies: unknown strategy {arm.strategy!r}; choose from {sorted(SELECTION_STRATEGIES)}"
            )
    return tuple(dict.fromkeys(names))


def _strategy_params(text: str | None, settings) -> dict[str, dict] | None:
    """`--strategy_params` by strategy, each checked against its strategy's signature as `VEPOConfig` checks a run's
    (every compared strategy too: one that needs a setting is refused here, not in a run minutes later)."""
    import json
    from types import SimpleNamespace

    from ..validation import check_rule_params

    given = json.loads(text) if isinstance(text, str) else dict(text or {})
    strategies = {arm.strategy for arm in settings.arms()}
    for name, params in given.items():
        if name not in strategies:
            raise UsageError(f"--strategy_params names {name!r}, which this lab does not run (its strategies: "
                             f"{', '.join(sorted(strategies))}).")  # fmt: skip
        if not isinstance(params, dict):
            raise UsageError(f"--strategy_params: {name}'s settings must be a mapping, got {params!r}.")
    for name in sorted(strategies):
        run = SimpleNamespace(selection_strategy=name, strategy_params=given.get(name), perturbation="diffusion",
                              perturbation_params=None)  # fmt: skip
        try:
            check_rule_params(run)
        except ValueError as error:
            message = str(error)
            raise UsageError(message if message.startswith("--") else f"--strategy_params: {message}") from None
    return given or None


def main(argv: list[str] | None = None):
    parser = make_parser()
    args = parser.parse_args(argv)
    # The texts that hold lists (each option's kind, choices and when it is read went through its declaration)
    seeds = _seeds(args.seeds) if args.seeds is not None else None
    sweep = _rates(args.sweep, "--sweep") if args.sweep is not None else None
    given = _learning_rates(args.learning_rates) if args.learning_rates is not None else {}
    from ..lab.experiment import (  # torch: only once arguments are good
        QUICK,
        QUICK_WARM_START,
        lab_settings,
        run_lab,
        run_sweep,
    )

    task = args.task or DEFAULT_TASK
    settings = lab_settings(task, **(QUICK if args.quick else {}))
    if args.quick:
        full = settings.warm_start
        settings.warm_start = dataclasses.replace(settings.warm_start, **QUICK_WARM_START)
        print(
            f"lab --quick: a smoke test from a quick warm start ({settings.warm_start.sft_steps} SFT steps on "
            f"{settings.warm_start.sft_rows:,} rows, not the {full.sft_steps} on {full.sft_rows:,} of docs/lab.md), "
            f"{settings.steps} RL steps: its accuracies are not the page's."
        )
    if args.build_warm_start:
        import json

        from ..builtin.warm_start import warm_start_path, warm_start_report

        path = warm_start_path(settings.warm_start)
        report = warm_start_report(path)
        print(
            f"{path}\n{report['parameters']:,} parameters, built in {report['build_seconds']:.0f} s, held-out greedy "
            f"accuracy {report['heldout_accuracy']:.1%} on {report['heldout_rows']} rows"
        )
        return json.dumps(report)
    if args.strategies:
        settings.strategies = _arms(args.strategies)
    settings.strategy_params = _strategy_params(args.strategy_params, settings)
    labels = {arm.label for arm in settings.arms()}
    unknown = sorted(set(given) - labels)
    if unknown:
        raise UsageError(
            f"--learning_rates names {unknown}, which this lab does not run (its rules: {sorted(labels)})."
        )
    # On top of the task's, kept for the rules this lab runs: a rule not named keeps its own learning rate
    settings.learning_rates = {
        label: lr for label, lr in {**settings.learning_rates, **given}.items() if label in labels
    }
    if seeds is not None:
        settings.seeds = seeds
    for name in ("steps", "max_minutes", "learning_rate", "eval_rows"):
        if getattr(args, name) is not None:
            setattr(settings, name, getattr(args, name))
    settings.jobs = args.jobs
    if args.sweep is not None:
        # The sweep's own learning rates replace the lab's per-rule ones
        settings.learning_rates = {}
        return run_sweep(settings, sweep, args.output_dir, overwrite=args.overwrite_output_dir)
    return run_lab(settings, args.output_dir, overwrite=args.overwrite_output_dir)
