"""A lab on a laptop: a warm-started tiny VLM, visual tasks that carry VEPO's mechanism, and `vepo-trl lab`.

    vepo-trl lab                      full, entropy, vepo, random x seeds 0 1 2 from the warm start
    vepo-trl lab --quick              two short runs, for CI (under 3 minutes on 2 cores)
    vepo-trl lab --build_warm_start   only build (or find) the cached warm start

`tasks` renders the tasks, `warm_start` builds and caches the SFT'd model, `run` trains and measures, `report`
writes the tables and the plot.
"""

from __future__ import annotations

import argparse

from ..errors import UsageError, fail


def _list(text: str) -> list[str]:
    return [part for part in text.replace(",", " ").split() if part]


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vepo-trl lab",
        description="RL from a warm-started tiny Qwen2.5-VL with several token-selection strategies over several "
        "seeds; held-out greedy accuracy before and after, reward curves and selected-token statistics in a "
        "markdown/JSON table and a PNG. The warm start is built on first use (about 1.5 minutes on 2 cores) and "
        "cached under $VEPO_TRL_CACHE.",
    )
    parser.add_argument(
        "--strategies",
        default=None,
        help="Selection strategies, comma-separated "
        "(default: full,entropy,vepo,random; any name from `vepo-trl strategies`).",
    )
    parser.add_argument("--seeds", default=None, help="Seeds, comma-separated (default: 0,1,2).")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="A CI-sized lab: a briefly trained warm start and "
        "full + vepo for a few steps, one seed (under 3 minutes).",
    )
    parser.add_argument(
        "--output_dir",
        default="vepo-lab",
        help="Where lab.md, lab.json, lab_curves.png and "
        "runs/ go (default: vepo-lab). Finished runs in it are reused.",
    )
    parser.add_argument("--steps", type=int, default=None, help="RL steps per run (default: 100).")
    parser.add_argument("--max_minutes", type=float, default=None, help="Wall-time limit per run (default: 5).")
    parser.add_argument("--learning_rate", type=float, default=None, help="RL learning rate (default: 3e-4).")
    parser.add_argument("--eval_rows", type=int, default=None, help="Held-out rows for accuracy (default: 120).")
    parser.add_argument(
        "--build_warm_start",
        action="store_true",
        help="Only build (or find) the cached warm start and print its path and held-out accuracy.",
    )
    parser.add_argument("--jobs", type=int, default=1, help="Runs in parallel, one thread each (default: 1).")
    parser.add_argument(
        "--overwrite_output_dir",
        action="store_true",
        help="Start fresh in an output_dir whose lab used other settings (steps, learning rate, ...): its runs "
        "are recomputed instead of reused. Without it such a folder is refused.",
    )
    return parser


def _seeds(text: str) -> tuple[int, ...]:
    parts = _list(text)
    if not parts:
        raise UsageError(f"--seeds {text!r}: give at least one seed, e.g. --seeds 0,1,2.")
    try:
        seeds = tuple(int(part) for part in parts)
    except ValueError:
        raise UsageError(f"--seeds {text!r}: seeds are whole numbers, e.g. --seeds 0,1,2.") from None
    repeated = sorted({seed for seed in seeds if seeds.count(seed) > 1})
    if repeated:
        raise UsageError(f"--seeds {text!r} repeats {repeated}: a repeated seed is the same run, not another sample.")
    return seeds


def check_args(args: argparse.Namespace) -> None:
    """Values argparse accepts but a lab cannot use, before anything loads. Raises `UsageError`."""
    for name in ("steps", "eval_rows", "jobs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name} must be at least 1, got {value}.")
    for name in ("max_minutes", "learning_rate"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            raise UsageError(f"--{name} must be above 0, got {value:g}.")
    if args.strategies is not None and not _list(args.strategies):
        raise UsageError(f"--strategies {args.strategies!r}: give at least one strategy, e.g. --strategies full,vepo.")
    if not str(args.output_dir).strip():
        raise UsageError("--output_dir is empty: give the folder the lab's tables and runs go to.")


def main(argv: list[str] | None = None):
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        check_args(args)
        seeds = _seeds(args.seeds) if args.seeds is not None else None
    except UsageError as error:
        fail(parser.prog, error)
    from .run import QUICK, LabSettings, run_lab  # torch and the trainer: only once the arguments are known good

    settings = LabSettings(**(QUICK if args.quick else {}))
    if args.build_warm_start:
        import json

        from .warm_start import warm_start_path, warm_start_report

        path = warm_start_path(settings.warm_start)
        report = warm_start_report(path)
        print(
            f"{path}\n{report['parameters']:,} parameters, built in {report['build_seconds']:.0f} s, held-out greedy "
            f"accuracy {report['heldout_accuracy']:.1%} on {report['heldout_rows']} rows"
        )
        return json.dumps(report)
    if args.strategies:
        from ..scoring import SELECTION_STRATEGIES

        names = _list(args.strategies)
        unknown = [n for n in names if n not in SELECTION_STRATEGIES]
        if unknown:
            fail(parser.prog, f"unknown strategies {unknown}; choose from {sorted(SELECTION_STRATEGIES)}")
        settings.strategies = tuple(dict.fromkeys(names))
    if seeds is not None:
        settings.seeds = seeds
    for name in ("steps", "max_minutes", "learning_rate", "eval_rows"):
        if getattr(args, name) is not None:
            setattr(settings, name, getattr(args, name))
    settings.jobs = args.jobs
    return run_lab(settings, args.output_dir, overwrite=args.overwrite_output_dir)
