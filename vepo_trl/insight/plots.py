"""Training curves of one or several runs from their logs: `trainer_state.json` (or `metrics.jsonl`, as the demo
writes), overlaid for comparison (e.g. a VEPO and a GRPO run)."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


__all__ = ["FIGURES", "RunLog", "load_run", "plot_runs", "save_figure"]


@dataclass
class RunLog:
    """A run's training log entries (one dict per logging step, each with a `step`), in step order."""

    name: str
    source: Path
    entries: list[dict]

    def series(self, key: str) -> tuple[list[int], list[float]]:
        steps, values = [], []
        for entry in self.entries:
            value = entry.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                steps.append(int(entry["step"]))
                values.append(float(value))
        return steps, values

    def keys(self) -> set[str]:
        return {key for entry in self.entries for key in entry}


def _checkpoint_number(path: Path) -> int:
    match = re.search(r"checkpoint-(\d+)$", path.parent.name)
    return int(match.group(1)) if match else -1


def _find_log(path: Path) -> Path:
    if path.is_file():
        return path
    if not path.is_dir():
        raise FileNotFoundError(f"no such run directory or log file: {path}")
    for name in ("trainer_state.json", "metrics.jsonl"):
        if (path / name).is_file():
            return path / name
    checkpoints = sorted(path.glob("checkpoint-*/trainer_state.json"), key=_checkpoint_number)
    if checkpoints:
        return checkpoints[-1]
    raise FileNotFoundError(f"{path} has no trainer_state.json, metrics.jsonl or checkpoint-*/trainer_state.json")


def load_run(path: str | os.PathLike, name: str | None = None) -> RunLog:
    """Read a run's log: a directory holding `trainer_state.json` or `metrics.jsonl` (or checkpoints with a
    `trainer_state.json`; the latest is read), or one of those files. Keeps the training entries (those with `step`
    and at least one metric besides the run totals); raises `ValueError` when there are none."""
    path = Path(path)
    log = _find_log(path)
    try:
        if log.suffix == ".jsonl":
            entries = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        else:
            state = json.loads(log.read_text())
            if not isinstance(state, dict) or "log_history" not in state:
                raise ValueError(f"{log} is not a trainer_state.json (no log_history)")
            entries = state["log_history"]
    except json.JSONDecodeError as error:
        raise ValueError(f"{log} is not valid JSON ({error.msg}, line {error.lineno})") from None
    training = [
        entry
        for entry in entries
        if isinstance(entry, dict)
        and "step" in entry
        and "train_runtime" not in entry
        and not any(key.startswith("eval_") for key in entry)
    ]
    if not training:
        raise ValueError(f"{log} holds no training log entries (was logging_steps larger than the run?)")
    training.sort(key=lambda entry: entry["step"])
    if name is None:
        run_dir = (
            log.parent if log.parent.name and not log.parent.name.startswith("checkpoint-") else log.parent.parent
        )
        name = run_dir.resolve().name
    return RunLog(name=name, source=log, entries=training)


# A figure: (file stem, title, panels); a panel: (title, y label, [(metric key or key pattern, line label)])
FIGURES: list[tuple[str, str, list[tuple[str, str, list[tuple[str, str]]]]]] = [
    (
        "rewards",
        "Reward and accuracy",
        [
            ("reward", "weighted reward", [("reward", "reward")]),
            ("accuracy", "accuracy reward", [("rewards/accuracy_reward/mean", "accuracy")]),
            ("format", "format reward", [("rewards/format_reward/mean", "format")]),
        ],
    ),
    (
        "selection",
        "Selected tokens",
        [
            ("selected fraction", "fraction of valid tokens", [("vepo/selected_fraction", "selected")]),
            (
                "entropy of the tokens",
                "nats",
                [("vepo/entropy_selected_mean", "selected"), ("vepo/entropy_all_mean", "all")],
            ),
            ("completion length", "tokens", [("completions/mean_length", "mean length")]),
        ],
    ),
    (
        "signals",
        "Visual signals",
        [
            ("JSD(clean, perturbed)", "nats", [("vepo/jsd_mean", "mean JSD")]),
            ("|entropy gap|", "nats", [("vepo/entropy_gap_abs_mean", "mean |dH|")]),
        ],
    ),
    (
        "miss_rates",
        "Top-k JSD tokens missed (paper Fig. 5c)",
        [
            (
                "share of top-k JSD missed",
                "fraction",
                [
                    ("vepo/top_jsd_missed_by_entropy", "by top-k entropy"),
                    ("vepo/top_jsd_missed_by_selection", "by the selection"),
                ],
            ),
        ],
    ),
    ("noise_step", "Perturbation noise step", [("noise step", "tau", [("vepo/noise_step", "noise step")])]),
]
_LINE_STYLES = ("-", "--", ":", "-.")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | os.PathLike) -> Path:
    """Save a matplotlib figure as a palette PNG (line plots need few colours: about a third of the bytes), close it."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    _pyplot().close(fig)
    buffer.seek(0)
    with Image.open(buffer) as image:
        image.convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    return Path(path)


def _draw_panel(
    ax, runs: Sequence[RunLog], title: str, ylabel: str, lines: Sequence[tuple[str, str]], colours
) -> bool:
    drawn = False
    for r, run in enumerate(runs):
        for line, (key, label) in enumerate(lines):
            steps, values = run.series(key)
            if not steps:
                continue
            name = run.name if len(lines) == 1 else f"{run.name}: {label}"
            ax.plot(steps, values, _LINE_STYLES[line % len(_LINE_STYLES)], color=colours[r % len(colours)], label=name,
                    marker="o" if len(steps) < 30 else None, markersize=3)  # fmt: skip
            drawn = True
    ax.set_title(title, fontsize=9.5)
    ax.set_xlabel("step", fontsize=8.5)
    ax.set_ylabel(ylabel, fontsize=8.5)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=7, loc="best")
    else:
        ax.text(0.5, 0.5, "not logged", transform=ax.transAxes, ha="center", va="center", color="#999")
    return drawn


def plot_runs(
    runs: Sequence[RunLog], output_dir: str | os.PathLike, *, overview: bool = True, dpi: int = 100
) -> dict[str, Path]:
    """One PNG per figure in `FIGURES` that any run logged (`rewards.png`, `selection.png`, `signals.png`,
    `miss_rates.png`, `noise_step.png`), each run a colour, and `overview.png` with every drawn panel in a grid.

    Returns {figure name: path}; figures no run logged are skipped.
    """
    if not runs:
        raise ValueError("No runs to plot.")
    plt = _pyplot()
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    logged = set().union(*(run.keys() for run in runs))
    written: dict[str, Path] = {}
    drawn_panels = []
    for stem, title, panels in FIGURES:
        panels = [panel for panel in panels if any(key in logged for key, _ in panel[2])]
        if not panels:
            continue
        fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.2), dpi=dpi, squeeze=False)
        for ax, (panel_title, ylabel, lines) in zip(axes[0], panels):
            _draw_panel(ax, runs, panel_title, ylabel, lines, colours)
            drawn_panels.append((panel_title, ylabel, lines))
        fig.suptitle(title, fontsize=11)
        fig.tight_layout()
        written[stem] = save_figure(fig, output_dir / f"{stem}.png")
    if overview and drawn_panels:
        columns = min(3, len(drawn_panels))
        rows = math.ceil(len(drawn_panels) / columns)
        fig, axes = plt.subplots(rows, columns, figsize=(4.0 * columns, 2.9 * rows), dpi=dpi, squeeze=False)
        for ax, (panel_title, ylabel, lines) in zip(axes.flat, drawn_panels):
            _draw_panel(ax, runs, panel_title, ylabel, lines, colours)
        for ax in list(axes.flat)[len(drawn_panels) :]:
            ax.axis("off")
        fig.suptitle(" vs ".join(run.name for run in runs), fontsize=11)
        fig.tight_layout()
        written["overview"] = save_figure(fig, output_dir / "overview.png")
    return written
