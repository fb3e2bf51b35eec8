"""`vepo-trl plot`: PNG training curves of one or several runs."""

from __future__ import annotations

from pathlib import Path

from ..files import check_output
from .commands import (
    UsageError,
)


# ---------------------------------------------------------------------------------------------------------------------
# plot
# ---------------------------------------------------------------------------------------------------------------------


PLOTS_RECORD = "plots.json"  # the runs a folder's PNGs were drawn from


def plot_main(args) -> None:
    """`vepo-trl plot`'s work on its parsed options (`vepo_trl.commands.plot`); user errors raise `UsageError`."""
    from .plots import FIGURES, load_run, plot_runs

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
