"""`vepo-trl plot`: its options, checked by the option table as they are parsed (before torch or a model is
imported), then `vepo_trl.insight.plot_command.plot_main`."""

from __future__ import annotations

import argparse

from ..options import OneLineParser


PLOT_HELP = """PNG plots of one or several training runs, overlaid: reward and accuracy, selected-token statistics, JSD
and |dH|, the top-k JSD miss rates and the noise step, over steps.

A run is a folder with trainer_state.json or metrics.jsonl (the demo's vepo-demo/, an output_dir, a checkpoint), or
one of those files.

Examples:
  vepo-trl plot vepo-demo
  vepo-trl plot runs/vepo runs/grpo --labels VEPO GRPO --output_dir plots
"""


def make_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="vepo-trl plot", description=PLOT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="Run folders or log files.")
    parser.add_argument("--labels", nargs="+", help="One name per run (default: the folder names).")
    parser.add_argument("--output_dir", help="Where the PNGs go (default: RUN_DIR/plots of the first run).")
    parser.add_argument("--dpi", type=int, default=100)
    return parser


def main(argv: list[str]) -> None:
    args = make_parser().parse_args(argv)
    from ..insight.plot_command import plot_main

    plot_main(args)
