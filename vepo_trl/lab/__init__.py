"""A lab on a laptop: a warm-started tiny VLM, visual tasks that carry VEPO's mechanism, and `vepo-trl lab`.

    vepo-trl lab                      full, entropy, vepo, random x seeds 0 1 2 from the warm start
    vepo-trl lab --quick              two short runs, for CI (under 3 minutes on 2 cores)
    vepo-trl lab --build_warm_start   only build (or find) the cached warm start

`tasks` renders the tasks, `warm_start` builds and caches the SFT'd model, `run` trains and measures, `report`
writes the tables and the plot.
"""

from __future__ import annotations

import argparse
import sys


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
    return parser


def main(argv: list[str] | None = None):
    from .run import QUICK, LabSettings, run_lab

    args = make_parser().parse_args(argv)
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
            print(
                f"vepo-trl lab: error: unknown strategies {unknown}; choose from {sorted(SELECTION_STRATEGIES)}",
                file=sys.stderr,
            )
            sys.exit(2)
        settings.strategies = tuple(names)
    if args.seeds:
        settings.seeds = tuple(int(s) for s in _list(args.seeds))
    for name in ("steps", "max_minutes", "learning_rate", "eval_rows"):
        if getattr(args, name) is not None:
            setattr(settings, name, getattr(args, name))
    settings.jobs = max(1, args.jobs)
    return run_lab(settings, args.output_dir)
