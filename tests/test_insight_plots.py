"""Training plots from a run's trainer_state.json or metrics.jsonl, one run or several overlaid."""

import json

import pytest

from vepo_trl.insight.plots import load_run, plot_runs


def log_entries(steps, vepo=True):
    entries = []
    for step in steps:
        entry = {"step": step, "loss": 0.1, "reward": step / 100, "rewards/accuracy_reward/mean": step / 200}
        if vepo:
            entry.update(
                {
                    "vepo/selected_fraction": 0.2,
                    "vepo/entropy_all_mean": 1.0,
                    "vepo/entropy_selected_mean": 1.5,
                    "vepo/jsd_mean": 0.05,
                    "vepo/entropy_gap_abs_mean": 0.1,
                    "vepo/top_jsd_missed_by_entropy": 0.4,
                    "vepo/top_jsd_missed_by_selection": 0.2,
                    "vepo/noise_step": 500 - step,
                }
            )
        entries.append(entry)
    # What Trainer appends at the end of a run, and an evaluation entry: neither is a training point
    entries.append({"step": steps[-1], "train_runtime": 12.0, "train_loss": 0.1})
    entries.append({"step": steps[-1], "eval_loss": 0.3})
    return entries


@pytest.fixture
def runs(tmp_path):
    vepo = tmp_path / "vepo-run"
    vepo.mkdir()
    (vepo / "trainer_state.json").write_text(json.dumps({"log_history": log_entries([5, 10, 15])}))
    grpo = tmp_path / "grpo-run"
    grpo.mkdir()
    (grpo / "metrics.jsonl").write_text("\n".join(json.dumps(e) for e in log_entries([5, 10, 15], vepo=False)))
    return vepo, grpo


def test_load_run_keeps_training_entries(runs):
    vepo, grpo = runs
    run = load_run(vepo)
    assert run.name == "vepo-run" and run.source.name == "trainer_state.json"
    assert [e["step"] for e in run.entries] == [5, 10, 15]
    assert run.series("vepo/noise_step") == ([5, 10, 15], [495.0, 490.0, 485.0])
    assert load_run(grpo / "metrics.jsonl", name="GRPO").name == "GRPO"


def test_load_run_reads_the_latest_checkpoint(tmp_path):
    for step in (2, 10):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "trainer_state.json").write_text(json.dumps({"log_history": log_entries(list(range(1, step + 1)))}))
    run = load_run(tmp_path)
    assert run.source.parent.name == "checkpoint-10" and len(run.entries) == 10


@pytest.mark.parametrize(
    "content, message",
    [(None, "has no trainer_state.json"), ("{", "not valid JSON"), ('{"log_history": []}', "no training log entries")],
)
def test_load_run_errors(tmp_path, content, message):
    if content is not None:
        (tmp_path / "trainer_state.json").write_text(content)
    with pytest.raises((FileNotFoundError, ValueError), match=message):
        load_run(tmp_path)


def test_plots_are_written_and_not_empty(runs, tmp_path):
    written = plot_runs(
        [load_run(path) for path in runs], tmp_path / "plots", dpi=60
    )  # small: the test is for content
    assert set(written) == {"rewards", "selection", "signals", "miss_rates", "noise_step", "overview"}
    for path in written.values():
        data = path.read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 1500, path


def test_figures_nobody_logged_are_skipped(runs, tmp_path):
    _, grpo = runs
    written = plot_runs([load_run(grpo)], tmp_path / "plots", dpi=60)
    # A GRPO run logs rewards only: no VEPO figure
    assert set(written) == {"rewards", "overview"}
