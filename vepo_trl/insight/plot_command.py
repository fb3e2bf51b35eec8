"""`vepo-trl plot`: PNG training curves of one or several runs."""

from __future__ import annotations

from pathlib import Path

from ..errors import check_output_folder
from .commands import (
    UsageError,
)


# ---------------------------------------------------------------------------------------------------------------------
# plot
# ---------------------------------------------------------------------------------------------------------------------


PLOTS_RECORD = "plots.json"  # the runs a folder's PNGs were drawn from


def _check_not_another_plot(output_dir: Path, runs) -> None:
    """A folder holding the PNGs of other runs' plot is refused, never written over (the same runs drawn again
    replace their own)."""
    import json

    from .plots import FIGURES

    names = [f"{stem}.png" for stem, *_ in FIGURES] + ["overview.png"]
    if not any((output_dir / name).is_file() for name in names):
        return
    if not (output_dir / PLOTS_RECORD).is_file():
        return  # drawn before plot kept a record of its runs: nothing says whose they are
    try:
        drawn = json.loads((output_dir / PLOTS_RECORD).read_text()).get("runs")
    except (OSError, ValueError, AttributeError):
        drawn = None
    if drawn == [str(Path(run.source).resolve()) for run in runs]:
        return
    of = f"of {', '.join(drawn)}" if drawn else "of another plot"
    raise UsageError(f"--output_dir {output_dir} holds the plots {of}; plot never replaces another plot's files: "
                     "give another --output_dir.")  # fmt: skip


def plot_main(args) -> None:
    """`vepo-trl plot`'s work on its parsed options (`vepo_trl.commands.plot`); user errors raise `UsageError`."""
    from .plots import load_run, plot_runs

    if args.labels and len(args.labels) != len(args.runs):
        raise UsageError(f"--labels has {len(args.labels)} names for {len(args.runs)} runs")
    # --dpi, --output_dir and the run paths were checked as parsed (commands.plot.PlotOptions); the default folder
    # beside the first run is written too, so it is checked the same way
    first = Path(args.runs[0])
    output_dir = Path(args.output_dir) if args.output_dir else (first if first.is_dir() else first.parent) / "plots"
    check_output_folder("--output_dir", output_dir)
    runs = []
    for i, path in enumerate(args.runs):
        try:
            runs.append(load_run(path, args.labels[i] if args.labels else None))
        except (FileNotFoundError, ValueError) as error:
            raise UsageError(str(error)) from None
    _check_not_another_plot(output_dir, runs)
    written = plot_runs(runs, output_dir, dpi=args.dpi)
    import json

    sources = [str(Path(run.source).resolve()) for run in runs]
    (output_dir / PLOTS_RECORD).write_text(json.dumps({"runs": sources}, indent=2) + "\n")
    for run in runs:
        print(f"{run.name}: {len(run.entries)} logged steps from {run.source}")
    print("Wrote " + ", ".join(str(path) for path in written.values()))
