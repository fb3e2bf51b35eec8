"""The experiment trackers users run, for real: a two-step tiny run through `vepo-trl train --report_to <tracker>`,
then VEPO's own metrics (`vepo/selected_fraction`, `vepo/jsd_mean`, `vepo/entropy_selected_mean`,
`vepo/top_jsd_missed_by_entropy`, ...) read back from the tracker's local store, under the names docs/trackers.md
gives. Each tracker writes locally (TensorBoard event files, MLflow's SQLite store, W&B offline, Trackio's SQLite
database); nothing leaves the machine. A tracker whose package is missing skips with the reason (`pip install
"vepo-trl[dev]"` installs all four)."""

import glob
import importlib.util
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from ..support import TINY_RECIPE


# What every tracker must show: the selection, the perturbation's signal and the recall of top-k entropy
VEPO_METRICS = (
    "vepo/selected_fraction",
    "vepo/jsd_mean",
    "vepo/entropy_selected_mean",
    "vepo/top_jsd_missed_by_entropy",
    "vepo/noise_step",
)


def tensorboard_metrics(out: Path, store: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = set()
    for events in glob.glob(str(out / "**" / "events.out.tfevents*"), recursive=True):
        accumulator = EventAccumulator(events)
        accumulator.Reload()
        tags |= set(accumulator.Tags()["scalars"])
    return tags


def mlflow_metrics(out: Path, store: Path) -> set[str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    runs = [
        run for experiment in client.search_experiments() for run in client.search_runs([experiment.experiment_id])
    ]
    return {name for run in runs for name in run.data.metrics}


def wandb_metrics(out: Path, store: Path) -> set[str]:
    # An offline run's history is the records of its run-*.wandb file (protobuf, in the log format `wandb sync`
    # reads); the metric names stand in it as text, which is all this needs
    data = b"".join(
        Path(run).read_bytes() for run in glob.glob(str(store / "wandb" / "offline-run-*" / "run-*.wandb"))
    )
    return {f"train/{name}" for name in VEPO_METRICS if f"train/{name}".encode() in data}


def trackio_metrics(out: Path, store: Path) -> set[str]:
    names = set()
    for database in store.rglob("*.db"):
        with sqlite3.connect(database) as connection:
            for (metrics,) in connection.execute("SELECT metrics FROM metrics"):
                names |= set(json.loads(metrics))
    return names


READERS = {"tensorboard": tensorboard_metrics, "mlflow": mlflow_metrics, "wandb": wandb_metrics,
           "trackio": trackio_metrics}  # fmt: skip


@pytest.mark.parametrize("tracker", sorted(READERS))
def test_vepo_metrics_reach_each_tracker(tracker, tmp_path, shared_cache):
    """As a user starts it: `vepo-trl train` in its own process, the tracker writing to a local store."""
    if importlib.util.find_spec(tracker) is None:  # each tracker's package has its name
        pytest.skip(f"{tracker} is not installed (pip install 'vepo-trl[trackers]')")
    store = tmp_path / "store"
    store.mkdir()
    env = {
        **os.environ,
        "VEPO_TRL_CACHE": str(shared_cache),
        # MLflow's default store (a SQLite database), W&B offline, Trackio's database: all in the test's folder
        "MLFLOW_TRACKING_URI": f"sqlite:///{store / 'mlflow.db'}",
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(store),
        "TRACKIO_DIR": str(store),
    }
    out = tmp_path / "run"
    # A random tiny model's first rewards are all equal: the zero-advantage responses are scored anyway, so the
    # perturbed pass's metrics exist from step 1
    result = subprocess.run(
        [sys.executable, "-m", "vepo_trl", "train", "--config", TINY_RECIPE, "--max_steps", "2", "--logging_steps", "1",
         "--selection_samples_steps", "0", "--score_zero_advantage_rows", "true", "--report_to", tracker,
         "--output_dir", str(out)],
        capture_output=True, text=True, env=env, timeout=900, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    names = READERS[tracker](out, store)
    # TensorBoard, W&B and Trackio prefix the training logs with train/ (transformers' rewrite_logs); MLflow does not
    found = {name.removeprefix("train/") for name in names}
    missing = [name for name in VEPO_METRICS if name not in found]
    assert not missing, (missing, sorted(names))


def test_the_demo_prints_no_warning_caused_by_our_defaults(tmp_path, shared_cache):
    """A normal run prints no FutureWarning or DeprecationWarning (each shown once, `-W default`): none of ours, and
    none that transformers or TRL raise about settings our defaults chose."""
    env = {**os.environ, "VEPO_TRL_CACHE": str(shared_cache), "PYTHONWARNINGS": "default"}
    result = subprocess.run(
        [sys.executable, "-m", "vepo_trl", "demo", "--max_steps", "2", "--logging_steps", "1", "--output_dir",
         str(tmp_path / "demo")],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    warned = [line for line in (result.stdout + result.stderr).splitlines() if "Warning:" in line]
    assert not [line for line in warned if "FutureWarning" in line or "DeprecationWarning" in line], warned
