"""`vepo-trl plot`: PNG training curves of one or several runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import check_output_folder
from ..options import OneLineParser
from .commands import (
    UsageError,
    fail,
)


# ---------------------------------------------------------------------------------------------------------------------
# plot
# ---------------------------------------------------------------------------------------------------------------------

PLOT_HELP = """PNG plots of one or several training runs, overlaid: reward and accuracy, selected-token statistics, JSD
and |dH|, the top-k JSD miss rates and the noise step, over steps.

A run is a folder with trainer_state.json or metrics.jsonl (the demo's vepo-demo/, an output_dir, a checkpoint), or
one of those files.

Examples:
  vepo-trl plot vepo-demo
  vepo-trl plot runs/vepo runs/grpo --labels VEPO GRPO --output_dir plots
"""


def plot_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="vepo-trl plot", description=PLOT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="Run folders or log files.")
    parser.add_argument("--labels", nargs="+", help="One name per run (default: the folder names).")
    parser.add_argument("--output_dir", help="Where the PNGs go (default: RUN_DIR/plots of the first run).")
    parser.add_argument("--dpi", type=int, default=100)
    return parser


def plot_main(argv: list[str]) -> None:
    parser = plot_parser()
    args = parser.parse_args(argv)
    from .plots import load_run, plot_runs

    try:
        if args.labels and len(args.labels) != len(args.runs):
            raise UsageError(f"--labels has {len(args.labels)} names for {len(args.runs)} runs")
        # --dpi, --output_dir and the run paths were checked as parsed (validation.OPTION_RULES); the default folder
        # beside the first run is written too, so it is checked the same way
        first = Path(args.runs[0])
        output_dir = (
            Path(args.output_dir) if args.output_dir else (first if first.is_dir() else first.parent) / "plots"
        )
        check_output_folder("--output_dir", output_dir)
        runs = []
        for i, path in enumerate(args.runs):
            try:
                runs.append(load_run(path, args.labels[i] if args.labels else None))
            except (FileNotFoundError, ValueError) as error:
                raise UsageError(str(error)) from None
    except UsageError as error:
        fail(parser.prog, error)
    written = plot_runs(runs, output_dir, dpi=args.dpi)
    for run in runs:
        print(f"{run.name}: {len(run.entries)} logged steps from {run.source}")
    print("Wrote " + ", ".join(str(path) for path in written.values()))
