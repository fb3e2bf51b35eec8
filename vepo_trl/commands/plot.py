"""`vepo-trl plot`: its options, declared once (`PlotOptions`) and checked by their rules as they are
parsed (before torch or a model is
imported), then `vepo_trl.insight.plot_command.plot_main`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..options import option, parser_for
from ..validation import ALWAYS, OUT_FOLDER, TEXT, between, path_rule, whole


PLOT_HELP = """PNG plots of one or several training runs, overlaid: reward and accuracy, selected-token statistics, JSD
and |dH|, the top-k JSD miss rates and the noise step, over steps.

A run is a folder with trainer_state.json or metrics.jsonl (the demo's vepo-demo/, an output_dir, a checkpoint), or
one of those files.

Examples:
  vepo-trl plot vepo-demo
  vepo-trl plot runs/vepo runs/grpo --labels VEPO GRPO --output_dir plots
"""


@dataclass
class PlotOptions:
    runs: list[str] = option([], "Run folders or log files.", positional=True, metavar="RUN_DIR",
                             reads=ALWAYS, rule=path_rule("in_path", "run folders or log files that exist", False))  # fmt: skip
    labels: list[str] | None = option(None, "One name per run (default: the folder names).", reads=ALWAYS, rule=TEXT)
    output_dir: str | None = option(None, "Where the PNGs go (default: RUN_DIR/plots of the first run).",
                                    reads=ALWAYS, rule=OUT_FOLDER)  # fmt: skip
    # 100,000 dpi asks matplotlib for a canvas of terabytes
    dpi: int = option(
        100, "", reads=ALWAYS, rule=whole(between(20, 1200), "a whole number of dots per inch in 20..1200")
    )


def make_parser() -> argparse.ArgumentParser:
    return parser_for(
        PlotOptions, prog="vepo-trl plot", description=PLOT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def main(argv: list[str]) -> None:
    args = make_parser().parse_args(argv)
    from ..insight.plot_command import plot_main

    plot_main(args)
