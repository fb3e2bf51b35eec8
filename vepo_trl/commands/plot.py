"""`vepo-trl plot`: its options, declared once (`PlotOptions`) and checked by their rules as they are
parsed (before torch or a model is
imported), then `plot_main` below, over the `vepo_trl.insight` library."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..files import check_output
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
    plot_main(args)


# ---------------------------------------------------------------------------------------------------------------------
# plot
# ---------------------------------------------------------------------------------------------------------------------


PLOTS_RECORD = "plots.json"  # the runs a folder's PNGs were drawn from


def plot_main(args) -> None:
    """`vepo-trl plot`'s work on its parsed options (`vepo_trl.commands.plot`); user errors raise `UsageError`."""
    from ..insight import FIGURES, load_run, plot_runs

    # --dpi, --output_dir, the run paths and --labels against them were checked as parsed (commands.plot.PlotOptions);
    # the default folder beside the first run is written too, so it is checked the same way
    first = Path(args.runs[0])
    output_dir = Path(args.output_dir) if args.output_dir else (first if first.is_dir() else first.parent) / "plots"
    runs = []
    for i, path in enumerate(args.runs):
        try:
            runs.append(load_run(path, args.labels[i] if args.labels else None))
        except (FileNotFoundError, ValueError) as error:
            raise UsageError(str(error)) from None
    sources = [str(Path(run.source).resolve()) for run in runs]
    pngs = [f"{stem}.png" for stem, *_ in FIGURES] + ["overview.png"]
    check_output("--output_dir", output_dir, owner=(PLOTS_RECORD, pngs, sources))  # another plot's PNGs: refused
    written = plot_runs(runs, output_dir, dpi=args.dpi)
    import json

    (output_dir / PLOTS_RECORD).write_text(json.dumps({"runs": sources}, indent=2) + "\n")
    for run in runs:
        print(f"{run.name}: {len(run.entries)} logged steps from {run.source}")
    print("Wrote " + ", ".join(str(path) for path in written.values()))
