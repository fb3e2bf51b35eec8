"""Runs you can trust: a run folder knows its run, a failed run keeps the previous report, bad data and bad values
end in one line (exit 2) before anything loads, Ctrl-C ends in one line, offline Hub names fail fast."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

import vepo_trl.train as train_module

from ..support import (
    REPO,
    TINY_RECIPE,
    assert_one_error_line,
    run_cli,
    tiny_cache,  # noqa: F401  (autouse: the tests build into the session's cache)
)


RUN_FILE = "vepo_run.json"
SHORT = ["--synthetic_rows", "16", "--logging_steps", "1"]


# ---------------------------------------------------------------------------------------------------------------------
# 1. A run folder knows its run
# ---------------------------------------------------------------------------------------------------------------------


def test_other_settings_are_refused_same_settings_resume_announced(tmp_path, capsys):
    output = tmp_path / "sig2"
    base = ["train", "--config", str(TINY_RECIPE), "--output_dir", str(output), "--save_strategy", "steps",
            "--save_steps", "2", *SHORT]  # fmt: skip
    code, out, err = run_cli([*base, "--max_steps", "2"], capsys)
    assert code == 0, err
    record = json.loads((output / RUN_FILE).read_text())["settings"]
    assert record["selection_strategy"] == "vepo" and record["learning_rate"] == 2e-4
    # Another strategy into the same folder: refused in one line naming the setting and both values
    code, out, err = run_cli([*base, "--max_steps", "3", "--selection_strategy", "full"], capsys)
    assert_one_error_line(code, err, "train", "selection_strategy 'vepo' there, 'full' here", "--overwrite_output_dir")
    # The same settings with more steps: resumed, and said so
    code, out, err = run_cli([*base, "--max_steps", "3"], capsys)
    assert code == 0, err
    assert f"Resuming from {output / 'checkpoint-2'} (step 2)" in out
    assert "for 3 steps" in (output / "summary.md").read_text()
    # An explicit fresh start: the earlier checkpoints are set aside during the run, gone once it has finished
    code, out, err = run_cli([*base, "--max_steps", "2", "--selection_strategy", "full", "--overwrite_output_dir",
                              "true"], capsys)  # fmt: skip
    assert code == 0, err
    assert "starts fresh" in out and "Resuming" not in out
    assert "plain GRPO" in (output / "summary.md").read_text() and "for 2 steps" in (output / "summary.md").read_text()
    assert sorted(p.name for p in output.glob("checkpoint-*")) == ["checkpoint-2"]
    assert not (output / "previous_run").exists()
    assert json.loads((output / RUN_FILE).read_text())["settings"]["selection_strategy"] == "full"


def write_record(folder: Path, **settings):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RUN_FILE).write_text(json.dumps({"settings": settings}))


def test_plan_run_decisions(tmp_path):
    from vepo_trl.errors import UsageError
    from vepo_trl.run_folder import check_train_folder, plan_run

    folder = tmp_path / "run"
    assert plan_run(str(folder), {"a": 1}, resume=None, overwrite=False).checkpoint is None  # nothing there
    (folder / "checkpoint-5").mkdir(parents=True)
    for name in ("trainer_state.json", "model.safetensors"):  # what a saved checkpoint holds
        (folder / "checkpoint-5" / name).write_text("{}")
    # Checkpoints without a record: resumed only when asked
    with pytest.raises(UsageError, match="without a record of its settings"):
        plan_run(str(folder), {"a": 1}, resume=None, overwrite=False)
    assert plan_run(str(folder), {"a": 1}, resume="true", overwrite=False).checkpoint == str(folder / "checkpoint-5")
    write_record(folder, a=1, b="x")
    plan = plan_run(str(folder), {"a": 1, "b": "x"}, resume=None, overwrite=False)
    assert plan.checkpoint == str(folder / "checkpoint-5") and plan.message.startswith("Resuming")
    with pytest.raises(UsageError, match=r"a 1 there, 2 here; b 'x' there, unset here"):
        plan_run(str(folder), {"a": 2}, resume=None, overwrite=False)
    with pytest.raises(UsageError, match="give one of them"):
        plan_run(str(folder), {"a": 2}, resume="true", overwrite=True)
    with pytest.raises(UsageError, match="no such checkpoint folder"):  # checked with the folder, before plan_run
        check_train_folder(str(folder), resume=str(tmp_path / "nope"))
    assert plan_run(str(folder), {"a": 2}, resume=None, overwrite=True).set_aside == [str(folder / "checkpoint-5")]


def test_lab_refuses_a_folder_of_other_settings_before_loading(tmp_path, monkeypatch, capsys):
    import vepo_trl.lab.experiment as lab_run

    monkeypatch.setattr(lab_run, "warm_start_path", lambda *a, **k: pytest.fail("warm start loaded"))
    folder = tmp_path / "lab"
    (folder / "runs" / "full-seed0").mkdir(parents=True)
    (folder / "warm_start.json").write_text("{}")
    settings = lab_run._lab_record_settings(lab_run.lab_settings())
    (folder / lab_run.LAB_RECORD).write_text(json.dumps({"settings": {**settings, "steps": 50}}))
    code, out, err = run_cli(["lab", "--output_dir", str(folder)], capsys)
    assert_one_error_line(code, err, "lab", "steps 50 there, 40 here", "--overwrite_output_dir")


# ---------------------------------------------------------------------------------------------------------------------
# 2. A failed run keeps the previous run's report
# ---------------------------------------------------------------------------------------------------------------------


def test_a_failed_run_keeps_the_previous_report(tmp_path, capsys):
    output = tmp_path / "keep"
    output.mkdir()
    (output / "summary.md").write_text("the good run\n")
    (output / "metrics.jsonl").write_text('{"loss": 0.1, "step": 60}\n')
    (tmp_path / "missing_img.jsonl").write_text('{"problem": "<image>Find x.", "answer": "3", "images": ["no.png"]}\n')
    code, out, err = run_cli(
        ["demo", "--output_dir", str(output), "--dataset_name", str(tmp_path / "missing_img.jsonl")], capsys
    )
    assert_one_error_line(code, err, "demo", "missing_img.jsonl row 0", "no such file")
    assert (output / "summary.md").read_text() == "the good run\n"
    assert (output / "metrics.jsonl").read_text() == '{"loss": 0.1, "step": 60}\n'


# ---------------------------------------------------------------------------------------------------------------------
# 3. Bad training data: one line naming file, row and problem, before the model loads
# ---------------------------------------------------------------------------------------------------------------------


def row(**fields):
    return json.dumps({"problem": "<image>Find x.", "answer": "3", "images": ["ok.png"], **fields})


BAD_DATA = [
    ("missing.jsonl", row(images=["gone.png"]), ["missing.jsonl row 0", "unreadable image", "no such file"]),
    ("corrupt.jsonl", row(images=["corrupt.png"]), ["corrupt.jsonl row 0", "unreadable image: corrupt.png"]),
    ("empty.jsonl", "", ["empty.jsonl", "the file is empty"]),
    ("invalid.jsonl", '{"problem": "x"\n', ["invalid.jsonl", "line 1 is not valid JSON"]),
    ("table.parquet", "not parquet", ["table.parquet", "not a readable parquet file"]),
    ("columns.jsonl", json.dumps({"q": "x", "a": "3", "images": ["ok.png"]}), ["no problem column", "['q', 'a'"]),
    ("lists.jsonl", row(answer=["3", "three"]), ["lists.jsonl row 0", "answer is a list of several answers"]),
    ("two.jsonl", row(problem="<image>a <image>b"), ["two.jsonl row 0", "2 placeholders, 1 images"]),
]


@pytest.mark.parametrize(("name", "content", "needles"), BAD_DATA, ids=[case[0] for case in BAD_DATA])
def test_bad_training_data_is_one_line_before_the_model_loads(name, content, needles, tmp_path, monkeypatch, capsys,
                                                              no_model_loads):  # fmt: skip
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    Image.new("RGB", (64, 64), "red").save(tmp_path / "ok.png")
    (tmp_path / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"x" * 20)
    (tmp_path / name).write_text(content + ("\n" if content else ""))
    code, out, err = run_cli(["train", "--config", str(TINY_RECIPE), "--output_dir", "run", "--dataset_name", name],
                             capsys)  # fmt: skip
    assert_one_error_line(code, err, "train", *needles)


def test_strict_data_error_names_the_flag(tmp_path, monkeypatch, capsys, no_model_loads):
    monkeypatch.chdir(tmp_path)
    Image.new("RGB", (64, 64), "red").save(tmp_path / "ok.png")
    (tmp_path / "mixed.jsonl").write_text(row() + "\n" + row(answer=["3", "three"]) + "\n")
    code, out, err = run_cli(["train", "--config", str(TINY_RECIPE), "--dataset_name", "mixed.jsonl",
                              "--strict_data", "true"], capsys)  # fmt: skip
    assert_one_error_line(code, err, "train", "mixed.jsonl row 1", "--strict_data false")
    assert "strict=False" not in err


# ---------------------------------------------------------------------------------------------------------------------
# 4 and 6. Values that used to fail deep inside, and the environment: one line, exit 2, before loading
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--temperature", "0"], "--temperature 0: must be above 0"),
        (["--synthetic_rows", "0"], "--synthetic_rows 0: must be a whole number >= 1"),
        (["--max_train_samples", "0"], "--max_train_samples 0: must be a whole number >= 1"),
        (["--min_pixels", "60000", "--max_pixels", "50000"], "need min_pixels <= max_pixels"),
        (["--learning_rate", "-1"], "--learning_rate -1: must be >= 0"),
        (["--output_dir", ""], "output_dir is empty"),
        (["--output_dir", "FILE/run"], "is a file"),
        (["--noise_step", "500.5"], "--noise_step 500.5: must be a whole diffusion step"),
        (["--config", "BROKEN"], "is not valid YAML at line 2"),
        (["--model_name_or_path", "Qwen/Qwen2.5-VL-3B-Instruct"], "not in the local Hugging Face cache"),
        (["--dataset_name", "geometry3k"], "hiyouga/geometry3k from the Hub, which is not in the local cache"),
    ],
)
def test_values_that_failed_deep_inside_are_one_line(argv, message, tmp_path, monkeypatch, capsys, no_model_loads):
    from huggingface_hub import constants

    from vepo_trl.local_models import hub_unreachable

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))  # nothing cached
    monkeypatch.setattr("datasets.config.HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    hub_unreachable.cache_clear()
    (tmp_path / "FILE").write_text("")
    (tmp_path / "BROKEN").write_text("model_name_or_path: tiny-qwen2.5-vl\n  dataset_name: [x\n")
    base = [] if argv[0] == "--config" else ["--config", str(TINY_RECIPE)]
    start = time.perf_counter()
    code, out, err = run_cli(["train", *base, *argv], capsys)
    assert_one_error_line(code, err, "train", message)
    assert time.perf_counter() - start < 5  # offline: no minute of retries


def test_read_only_output_folder_is_one_line(tmp_path, monkeypatch, capsys, no_model_loads):
    # Root may write anywhere, so the read-only folder is what os.access reports for it
    real_access = os.access
    locked = tmp_path / "locked"
    locked.mkdir()
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != locked and real_access(path, mode))
    code, out, err = run_cli(["train", "--config", str(TINY_RECIPE), "--output_dir", str(locked / "run")], capsys)
    assert_one_error_line(code, err, "train", f"{locked} is not writable")


def test_trainer_with_a_missing_model_folder_says_so_in_one_line(tmp_path):
    from vepo_trl import VEPOConfig, VEPOTrainer
    from vepo_trl.rewards import get_reward_funcs

    args = VEPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none")
    with pytest.raises(ValueError) as error:
        VEPOTrainer(model="/nonexistent/model", reward_funcs=get_reward_funcs(["accuracy"]), args=args)
    message = str(error.value)
    assert "'/nonexistent/model': no such model folder" in message and "\n" not in message


def test_trainer_with_an_uncached_hub_id_offline_fails_fast(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from vepo_trl.errors import UsageError
    from vepo_trl.local_models import hub_unreachable, resolve_model_name

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    hub_unreachable.cache_clear()
    start = time.perf_counter()
    with pytest.raises(UsageError, match=r"'Qwen/Qwen2.5-VL-3B-Instruct' is not in the local Hugging Face cache and "
                                         r"HF_HUB_OFFLINE is set"):  # fmt: skip
        resolve_model_name("Qwen/Qwen2.5-VL-3B-Instruct")
    assert time.perf_counter() - start < 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--seeds", ""], "--seeds is empty"),
        (["--seeds", "0,0"], "repeats [0]"),
        (["--seeds", "a,b"], "seeds are whole numbers"),
        (["--steps", "0"], "--steps 0: must be a whole number of steps >= 1"),
        (["--jobs", "0"], "--jobs 0: must be a whole number >= 1"),
        (["--eval_rows", "-3"], "--eval_rows -3: must be a whole number >= 1"),
        (["--max_minutes", "0"], "--max_minutes 0.0: must be above 0 minutes"),
        (["--learning_rate", "-1"], "--learning_rate -1.0: must be above 0"),
        (["--strategies", "nope"], "unknown strategy 'nope'"),
        (["--strategies", "vepo:1.5"], "k must be in (0, 1]"),
        (["--strategies", "vepo:x"], "k after the colon is a fraction"),
        (["--task", "shapes"], "--task 'shapes': must be one of colour, squares"),
        (["--sweep", "1e-4,fast"], "learning rates are numbers"),
        (["--sweep", "0"], "give learning rates above 0"),
        (["--learning_rates", "vepo"], "write rule=lr pairs"),
        (["--seeds", "0,9000"], "seeds are 0 to 8999, got [9000]"),
        (["--seeds", "-1"], "seeds are 0 to 8999, got [-1]"),
        (["--sweep", "1e-4,0.0001"], "repeats 0.0001"),
        (
            ["--sweep", "1e-4", "--learning_rate", "1e-3"],
            "read only with no --sweep (which sets the learning rates itself)",
        ),
        (["--learning_rates", "vepo:0.3=1e-3"], "names ['vepo:0.3'], which this lab does not run"),
    ],
)
def test_lab_values_are_one_line(argv, message, monkeypatch, capsys):
    import vepo_trl.lab.experiment as lab_run

    monkeypatch.setattr(lab_run, "run_lab", lambda *a, **k: pytest.fail("the lab ran"))
    monkeypatch.setattr(lab_run, "run_sweep", lambda *a, **k: pytest.fail("the sweep ran"))
    code, out, err = run_cli(["lab", *argv], capsys)
    assert_one_error_line(code, err, "lab", message)


@pytest.mark.parametrize(
    ("stop", "status", "word"), [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated (SIGTERM)")]
)
def test_ctrl_c_is_one_line_saying_what_was_saved(tmp_path, stop, status, word):
    """Ctrl-C, and SIGTERM as a scheduler's preemption sends it (it ended at once, no line, the lock left behind)."""
    output = tmp_path / "run"
    command = [sys.executable, "-m", "vepo_trl", "train", "--config", str(TINY_RECIPE), "--output_dir", str(output),
               "--max_steps", "500", "--save_strategy", "steps", "--save_steps", "1", "--disable_tqdm", "true",
               *SHORT]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 240
    while not list(output.glob("checkpoint-*")) and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.5)
    process.send_signal(stop)
    out, err = process.communicate(timeout=120)
    assert process.returncode == status, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    [line] = [line for line in err.splitlines() if word in line]
    assert line.startswith(f"vepo-trl train: {word}: ") and "/checkpoint-" in line and "resume" in line
    # The folder is not held: its lock is gone (selection_samples.jsonl.partial stays, whole lines, for the resume)
    assert not list(output.glob("*.lock"))


# ---------------------------------------------------------------------------------------------------------------------
# 7. inspect: an index out of range fails before generating rows; the page carries no raw control bytes
# ---------------------------------------------------------------------------------------------------------------------


def test_inspect_index_beyond_the_synthetic_rows_fails_before_generating(tmp_path, monkeypatch, capsys):
    from vepo_trl.commands import inspect as inspect_command
    from vepo_trl.insight import runs as commands

    monkeypatch.setattr(inspect_command, "load_rows", lambda *a, **k: pytest.fail("rows generated"))
    monkeypatch.setattr(commands, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    start = time.perf_counter()
    code, out, err = run_cli(
        ["inspect", "--model", "tiny-qwen2.5-vl", "--dataset", "synthetic", "--index", "100000"], capsys
    )
    assert_one_error_line(code, err, "inspect", "--index 100000 is out of range: synthetic has 256 rows")
    assert time.perf_counter() - start < 5


def test_synthetic_rows_default_is_the_training_default():
    from vepo_trl.insight import SYNTHETIC_ROWS

    assert SYNTHETIC_ROWS == train_module.VEPOScriptArguments().synthetic_rows


def test_token_page_escapes_control_bytes():
    from vepo_trl.insight.page import render_page

    from ..support import make_records

    records = make_records()
    records[0].tokens[0] = "a\x00b\x1b"
    page = render_page(records)
    assert "\x00" not in page and "\x1b" not in page
    assert "a\\x00b\\x1b" in page
