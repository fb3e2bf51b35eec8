"""A run folder holds one run: its selection samples are this run's only (a rerun, a killed run or a resume never
mixes runs), a second run into a folder in use is refused in one line, and the model card never replaces a README.md
the library did not write."""

import json
import shutil
import subprocess
import sys
import time

import pytest
from transformers.trainer_callback import PrinterCallback

from vepo_trl import VEPOConfig, VEPOTrainer
from vepo_trl.data import synthetic_training_dataset
from vepo_trl.insight.records import load_records, save_records
from vepo_trl.run_folder import LOCK_FILE, hold_folder, is_our_card
from vepo_trl.selection_pipeline import SAMPLES_FILE, SAMPLES_IN_PROGRESS

from .support import (
    TINY_RECIPE,
    assert_one_error_line,
    length_reward,
    run_cli,
    snapshot,
    tiny_cache,  # noqa: F401  (autouse: the tests build into the session's cache)
)


def train_with_checkpoints(tiny_model_dir, output_dir, max_steps=4, resume=None):
    args = VEPOConfig(output_dir=str(output_dir), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=8, max_steps=max_steps, learning_rate=1e-2, logging_steps=1,
                      report_to="none", save_strategy="steps", save_steps=2, use_cpu=True, bf16=False, seed=0,
                      disable_tqdm=True, selection_samples_steps=2, selection_samples_count=2)  # fmt: skip
    trainer = VEPOTrainer(model=tiny_model_dir, reward_funcs=length_reward, args=args,
                          train_dataset=synthetic_training_dataset(16, seed=0))  # fmt: skip
    trainer.remove_callback(PrinterCallback)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def steps(path):
    return [record.step for record in load_records(path)]


# ---------------------------------------------------------------------------------------------------------------------
# Selection samples: one run's
# ---------------------------------------------------------------------------------------------------------------------


def test_samples_of_a_rerun_replace_the_earlier_runs(tiny_model_dir, tmp_path):
    folder = tmp_path / "run"
    train_with_checkpoints(tiny_model_dir, folder)
    first = steps(folder / SAMPLES_FILE)
    assert first == [0, 0, 2, 2] and not (folder / SAMPLES_IN_PROGRESS).exists()
    shutil.rmtree(folder / "checkpoint-2"), shutil.rmtree(folder / "checkpoint-4")
    train_with_checkpoints(
        tiny_model_dir, folder, max_steps=2
    )  # a fresh run into the same folder: not appended (was 0, 0, 2, 2, 0, 0)
    assert steps(folder / SAMPLES_FILE) == [0, 0]


def test_a_killed_run_leaves_the_finished_runs_samples_and_a_resume_continues_its_own(tiny_model_dir, tmp_path):
    straight = tmp_path / "straight"
    reference = train_with_checkpoints(tiny_model_dir, straight)
    expected = load_records(straight / SAMPLES_FILE)
    # A run killed after step 3: checkpoint-2, and samples of steps 0 and 2 in progress (plus one of a later step
    # that the resumed run makes again); the folder's finished samples are an earlier run's
    killed = tmp_path / "killed"
    killed.mkdir()
    shutil.copy(straight / "vepo_run.json", killed) if (straight / "vepo_run.json").exists() else None
    shutil.copytree(straight / "checkpoint-2", killed / "checkpoint-2")
    in_progress = [*expected, expected[-1]]
    in_progress[-1].step = 3
    save_records(killed / SAMPLES_IN_PROGRESS, in_progress)
    earlier = expected[:1]
    earlier[0].step = 99
    save_records(killed / SAMPLES_FILE, earlier)
    assert steps(killed / SAMPLES_FILE) == [99]  # until the resumed run finishes, the finished run's samples stay
    resumed = train_with_checkpoints(tiny_model_dir, killed, resume=str(killed / "checkpoint-2"))
    records = load_records(killed / SAMPLES_FILE)
    # Steps before the checkpoint kept, the step after it written anew, nothing of the earlier run
    assert [r.step for r in records] == [0, 0, 2, 2]
    assert [r.token_ids for r in records] == [r.token_ids for r in load_records(straight / SAMPLES_FILE)]
    assert resumed.state.global_step == reference.state.global_step == 4


# ---------------------------------------------------------------------------------------------------------------------
# One run at a time
# ---------------------------------------------------------------------------------------------------------------------


def test_a_second_run_into_a_folder_in_use_is_refused_in_one_line(tmp_path, capsys):
    folder = tmp_path / "busy"
    argv = ["train", "--config", TINY_RECIPE, "--output_dir", str(folder), "--max_steps", "1", "--synthetic_rows", "8"]
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom vepo_trl.run_folder import hold_folder\n"
         f"with hold_folder({str(folder)!r}):\n    print('held', flush=True)\n    time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        before = sorted(p.name for p in folder.iterdir())
        code, out, err = run_cli(argv, capsys)
        assert code == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "is in use by another run" in lines[0] and f"pid {holder.pid}" in lines[0]
        assert "Traceback" not in err and sorted(p.name for p in folder.iterdir()) == before  # nothing written
    finally:
        holder.kill()
        holder.wait()
    # The lock went with the killed process: the folder is free again
    start = time.monotonic()
    with hold_folder(folder):
        assert (folder / LOCK_FILE).read_text().startswith("pid ")
    assert time.monotonic() - start < 5


def test_the_lock_is_released_when_a_run_ends(tmp_path, capsys):
    folder = tmp_path / "run"
    argv = ["train", "--config", TINY_RECIPE, "--output_dir", str(folder), "--max_steps", "1", "--synthetic_rows", "8"]
    assert run_cli(argv, capsys)[0] == 0
    assert not (folder / LOCK_FILE).exists()  # a finished run leaves no lock file behind
    with hold_folder(folder):  # would raise if the finished run still held it
        pass
    assert not (folder / LOCK_FILE).exists()


# ---------------------------------------------------------------------------------------------------------------------
# The model card and the user's README.md
# ---------------------------------------------------------------------------------------------------------------------


def test_a_readme_the_library_did_not_write_is_never_replaced(tiny_model_dir, tmp_path, capsys, monkeypatch):
    folder = tmp_path / "project"
    folder.mkdir()
    own = "# My project\n\nNotes I keep here.\n"
    (folder / "README.md").write_text(own)
    argv = ["train", "--config", TINY_RECIPE, "--output_dir", str(folder), "--max_steps", "1", "--synthetic_rows", "8"]
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "holds a README.md that vepo-trl did not write" in err and "--output_dir" in err
    assert (folder / "README.md").read_text() == own and sorted(p.name for p in folder.iterdir()) == ["README.md"]
    # From Python, where nothing refused the folder first: the card goes beside the README, not over it
    trainer = train_with_checkpoints(tiny_model_dir, folder, max_steps=1)
    trainer.create_model_card()
    assert (folder / "README.md").read_text() == own
    assert is_our_card(folder / "MODEL_CARD.md")


def test_the_libraries_own_card_is_replaced_by_a_rerun(tmp_path, capsys):
    folder = tmp_path / "run"
    argv = ["train", "--config", TINY_RECIPE, "--output_dir", str(folder), "--max_steps", "1", "--synthetic_rows", "8"]
    assert run_cli(argv, capsys)[0] == 0
    assert is_our_card(folder / "README.md")
    argv_fresh = [*argv, "--overwrite_output_dir", "true"]
    assert run_cli(argv_fresh, capsys)[0] == 0  # its own card from the earlier run is no obstacle
    assert is_our_card(folder / "README.md") and not (folder / "MODEL_CARD.md").exists()
    assert json.loads((folder / "vepo_run.json").read_text())["settings"]


# ---------------------------------------------------------------------------------------------------------------------
# The data a run was trained on
# ---------------------------------------------------------------------------------------------------------------------


def _local_data(folder, answers):
    from PIL import Image

    folder.mkdir(exist_ok=True)
    Image.new("RGB", (56, 56), (200, 30, 30)).save(folder / "ok.png")
    rows = [{"problem": f"<image>How many squares? ({i})", "answer": a, "images": ["ok.png"]} for i, a in
            enumerate(answers)]  # fmt: skip
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder / "train.jsonl"


def test_resume_with_edited_data_is_refused_in_one_line(tmp_path, capsys):
    data = _local_data(tmp_path / "data", ["3", "4", "5", "6"])
    folder = tmp_path / "run"
    argv = ["train", "--config", TINY_RECIPE, "--output_dir", str(folder), "--dataset_name", str(data),
            "--save_strategy", "steps", "--save_steps", "1", "--per_device_train_batch_size", "4"]  # fmt: skip
    code, out, err = run_cli([*argv, "--max_steps", "1"], capsys)
    assert code == 0, err
    recorded = json.loads((folder / "vepo_run.json").read_text())["data_fingerprint"]
    assert len(recorded) == 16
    # The same file: resumed
    code, out, err = run_cli([*argv, "--max_steps", "2"], capsys)
    assert code == 0 and "Resuming from" in out, err
    # One answer edited: refused before the model loads, the folder as it was
    _local_data(tmp_path / "data", ["3", "4", "5", "7"])
    before = (folder / "vepo_run.json").read_text()
    code, out, err = run_cli([*argv, "--max_steps", "3"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "trained on other data" in err and recorded in err and "Traceback" not in err
    assert (folder / "vepo_run.json").read_text() == before and not (folder / "checkpoint-3").exists()


def test_data_fingerprint_follows_the_rows_not_the_object():
    from vepo_trl.run_folder import data_fingerprint

    data = synthetic_training_dataset(8, seed=0)
    assert data_fingerprint(data) == data_fingerprint(synthetic_training_dataset(8, seed=0))
    assert data_fingerprint(data) != data_fingerprint(synthetic_training_dataset(8, seed=1))
    # A selection stands for its rows: the same rows picked through an index mapping hash alike
    assert data_fingerprint(data.select([2, 3])) == data_fingerprint(data.select([2, 3]).flatten_indices())
    assert data_fingerprint(data.select([2, 3])) != data_fingerprint(data.select([3, 2]))


# ---------------------------------------------------------------------------------------------------------------------
# A finished run is not trained again; a folder belongs to one command
# ---------------------------------------------------------------------------------------------------------------------


def test_a_finished_run_rerun_trains_nothing_and_a_longer_one_resumes(tmp_path, capsys):
    folder = tmp_path / "run"
    argv = ["demo", "--output_dir", str(folder), "--max_steps", "2", "--save_strategy", "steps", "--save_steps", "1",
            "--synthetic_rows", "8", "--logging_steps", "1"]  # fmt: skip
    assert run_cli(argv, capsys)[0] == 0
    before = snapshot(folder)
    # The same command again: one line, exit 0, nothing trained or written (it trained a 3rd step past max_steps 2,
    # saved checkpoint-3 and replaced the model)
    code, out, err = run_cli(argv, capsys)
    assert code == 0 and err == "", err
    assert out.strip().count("\n") == 0 and "finished" in out and "step 2" in out and "max_steps 2" in out, out
    assert snapshot(folder) == before
    # The last checkpoint alone at max_steps (the run stopped while saving its model): finished too
    for name in ("model.safetensors", "trainer_state.json"):
        (folder / name).unlink()
    code, out, err = run_cli(argv, capsys)
    assert code == 0 and "checkpoint-2 is at step 2" in out and not (folder / "checkpoint-3").exists(), out + err
    # A larger max_steps trains it further, from its last checkpoint
    code, out, err = run_cli([*argv[:4], "3", *argv[5:]], capsys)
    assert code == 0 and "Resuming from" in out and "checkpoint-2" in out, err
    state = json.loads((folder / "trainer_state.json").read_text())
    assert state["global_step"] == 3 and (folder / "checkpoint-3").is_dir()


def test_a_finished_run_without_checkpoints_is_not_restarted_by_a_longer_one(tmp_path, capsys):
    folder = tmp_path / "run"
    argv = ["demo", "--output_dir", str(folder), "--max_steps", "1", "--synthetic_rows", "8"]
    assert run_cli(argv, capsys)[0] == 0
    before = snapshot(folder)
    code, out, err = run_cli(argv, capsys)
    assert code == 0 and "finished" in out and snapshot(folder) == before, out + err
    # Nothing to continue from: a longer run would start over and replace the model, so it must be asked for
    code, out, err = run_cli([*argv[:4], "2", *argv[5:]], capsys)
    assert_one_error_line(code, err, "demo", "finished run of 1 step ", "--overwrite_output_dir true")
    assert snapshot(folder) == before
    code, out, err = run_cli([*argv[:4], "2", *argv[5:], "--overwrite_output_dir", "true"], capsys)
    assert code == 0 and json.loads((folder / "trainer_state.json").read_text())["global_step"] == 2, err


def test_eval_into_a_training_runs_folder_is_refused_and_its_report_kept(tmp_path, capsys):
    folder = tmp_path / "run"
    assert run_cli(["demo", "--output_dir", str(folder), "--max_steps", "1", "--synthetic_rows", "8"], capsys)[0] == 0
    before = snapshot(folder)
    code, out, err = run_cli(["eval", "--model", str(folder), "--benchmarks", "synthetic", "--limit", "2",
                              "--output_dir", str(folder)], capsys)  # fmt: skip
    assert_one_error_line(code, err, "eval", "holds a training run", "choose another --output_dir")
    assert snapshot(folder) == before
    # The other way round: a training run into an evaluation's folder
    results = tmp_path / "eval"
    assert run_cli(["eval", "--model", str(folder), "--benchmarks", "synthetic", "--limit", "2",
                    "--output_dir", str(results)], capsys)[0] == 0  # fmt: skip
    evaluated = snapshot(results)
    code, out, err = run_cli(
        ["train", "--config", TINY_RECIPE, "--output_dir", str(results), "--max_steps", "1"], capsys
    )
    assert_one_error_line(code, err, "train", "holds evaluation results", "choose another --output_dir")
    assert snapshot(results) == evaluated


def test_a_lab_into_a_training_runs_folder_is_refused(tmp_path):
    from vepo_trl.errors import UsageError
    from vepo_trl.lab.experiment import lab_settings, plan_lab_folder
    from vepo_trl.run_folder import write_record

    write_record(tmp_path, {"selection_strategy": "vepo"})
    with pytest.raises(UsageError, match="holds a training run"):
        plan_lab_folder(lab_settings(), tmp_path, overwrite=True)
