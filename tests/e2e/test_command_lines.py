"""Property tests over whole command lines: hypothesis draws two or three settings at a time (from the recipes' own
values and each field's edges, valid and not), a data file in one of the formats the loaders take (or a broken one)
and a state of the environment and the output folder, and runs them through the real `vepo-trl train` up to the
point the model would load. Every draw must end in exit 0 (it would train) or exit 2 with one line and no traceback,
and nothing may be written where it should not be: a refused run leaves the output folder and the working folder as
they were. `VEPO_HYPOTHESIS_EXAMPLES` sets the number of draws (default 12, a few seconds)."""

import csv
import gzip
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vepo_trl.train as train_module
from vepo_trl.cli import main as cli_main

from ..support import TINY_RECIPE


EXAMPLES = int(os.environ.get("VEPO_HYPOTHESIS_EXAMPLES", "12"))


class ReachedTheModel(Exception):
    """Raised where the model would load: the command line got through every check."""


# Settings, each with the recipes' own values and its edges (valid and not)
SETTINGS = {
    "selection_strategy": ["vepo", "entropy", "full", "random", "nope"],
    "selection_ratio": ["0.2", "0.4", "1", "0", "1.5", "nan"],
    "selection_alpha": ["0.7", "0", "1", "-0.1"],
    "perturbation": ["diffusion", "gaussian", "black_image", "patch_blackout", "nope"],
    "noise_step": ["500", "0", "999", "1000", "500.5"],
    "learning_rate": ["1e-6", "0", "-1", "inf"],
    "max_steps": ["1", "0", "-1", "-2"],
    "num_generations": ["4", "2", "1", "3"],
    "per_device_train_batch_size": ["8", "4", "0", "3"],
    "max_completion_length": ["48", "1", "0"],
    "temperature": ["1.0", "0", "0.7"],
    "save_strategy": ["no", "steps", "epoch", "never"],
    "save_steps": ["1", "0", "0.5", "-1"],
    "logging_steps": ["1", "0", "5"],
    "eval_strategy": ["no", "steps"],
    "eval_dataset_name": ["synthetic", "nowhere.jsonl"],
    "use_peft": ["true", "false", "maybe"],
    "lora_r": ["8", "0", "16"],
    "lora_target_modules": ["q_proj", "lm_head", "no_such_proj", "all-linear"],
    "fp16": ["true", "false"],
    "bf16": ["false", "true"],
    "report_to": ["none", "wandb", "bogus"],
    "min_pixels": ["3136", "1", "0", "200000"],
    "max_pixels": ["50176", "100", "1000000"],
    "reward_funcs": ["accuracy", "accuracy format", "bogus"],
    "reward_weights": ["1", "0.9 0.1", "nan"],
    "loss_type": ["bnpo", "grpo", "dr_grpo", "nope"],
    "torch_compile": ["false", "true"],
    "overwrite_output_dir": ["true", "false"],
    "resume_from_checkpoint": ["true", "nowhere"],
}

DATA = ["synthetic", "lab", "ok.csv", "ok.tsv", "ok.jsonl.gz", "ok.parquet", "saved", "imagefolder", "trl.jsonl",
        "no_answer.jsonl", "wrong_types.jsonl", "empty_rows.jsonl", "empty.csv", "notes.txt"]  # fmt: skip
FOLDERS = ["fresh", "other_run", "eval_results", "dangling", "a_file"]
CACHES = ["set", "tilde", "a_file"]


def make_data(folder: Path) -> None:
    import datasets
    from PIL import Image

    Image.new("RGB", (56, 56), (200, 30, 30)).save(folder / "a.png")
    row = {"problem": "<image>What colour is the square?", "images": ["a.png"], "answer": "red"}
    rows = [row] * 8
    with open(folder / "ok.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["question", "image", "answer"])
        writer.writerows([["What colour?", "a.png", "red"]] * 8)
    with open(folder / "ok.tsv", "w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t")
        writer.writerow(["question", "image", "answer"])
        writer.writerows([["What colour?", "a.png", "red"]] * 8)
    with gzip.open(folder / "ok.jsonl.gz", "wt") as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in rows))
    image_bytes = (folder / "a.png").read_bytes()
    table = datasets.Dataset.from_list([{**row, "images": [{"bytes": image_bytes, "path": None}]}] * 8)
    table.to_parquet(str(folder / "ok.parquet"))
    table.save_to_disk(str(folder / "saved"))
    (folder / "imagefolder").mkdir()
    (folder / "imagefolder" / "a.png").write_bytes(image_bytes)
    (folder / "imagefolder" / "metadata.csv").write_text("file_name,problem,answer\na.png,What colour?,red\n" * 1)
    trl_row = {"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]}],
               "images": ["a.png"], "answer": "red"}  # fmt: skip
    (folder / "trl.jsonl").write_text("".join(json.dumps(trl_row) + "\n" for _ in range(8)))
    (folder / "no_answer.jsonl").write_text(json.dumps({"problem": "x", "images": ["a.png"]}) + "\n")
    (folder / "wrong_types.jsonl").write_text(json.dumps({"problem": 3, "images": "a.png", "answer": {"a": 1}}) + "\n")
    (folder / "empty_rows.jsonl").write_text("{}\n{}\n")
    (folder / "empty.csv").write_text("")
    (folder / "notes.txt").write_text("not data")


def make_folder(kind: str, base: Path) -> Path:
    target = base / f"out-{kind}"
    if kind == "other_run":
        (target / "checkpoint-2").mkdir(parents=True)
        (target / "config.json").write_text("{}")
        (target / "vepo_run.json").write_text(json.dumps({"settings": {"selection_strategy": "entropy"}}))
    elif kind == "eval_results":
        target.mkdir()
        (target / "manifest.json").write_text(json.dumps({"generation": {}, "sources": {}}))
        (target / "summary.md").write_text("eval results\n")
    elif kind == "dangling":
        target.symlink_to(base / "nowhere")
    elif kind == "a_file":
        target.write_text("a file")
    return target


def tree(folder: Path) -> dict:
    if folder.is_symlink() or not folder.exists():
        return {"<link>" if folder.is_symlink() else "<absent>": ""}
    if folder.is_file():
        return {"<file>": folder.read_bytes()}
    return {p.relative_to(folder).as_posix(): (p.read_bytes() if p.is_file() else b"") for p in sorted(folder.rglob("*"))
            if p.name != "_vepo_run.lock"}  # fmt: skip


@pytest.fixture(scope="module")
def data_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    make_data(folder)
    return folder


@pytest.fixture(autouse=True)
def stop_at_the_model(monkeypatch):
    def reached(*args, **kwargs):
        raise ReachedTheModel

    monkeypatch.setattr(train_module, "load_model", reached)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    chosen=st.lists(st.sampled_from(sorted(SETTINGS)), min_size=2, max_size=3, unique=True).flatmap(
        lambda names: st.tuples(*[st.tuples(st.just(n), st.sampled_from(SETTINGS[n])) for n in names])
    ),
    data=st.sampled_from(DATA),
    folder_kind=st.sampled_from(FOLDERS),
    cache=st.sampled_from(CACHES),
)
def test_whole_command_lines_end_in_exit_0_or_one_line(
    chosen, data, folder_kind, cache, data_folder, tmp_path_factory, capsys, monkeypatch
):
    base = tmp_path_factory.mktemp("line")
    output = make_folder(folder_kind, base)
    cache_value = {"set": str(base / "cache"), "tilde": "~/.cache/vepo_trl_test", "a_file": str(data_folder / "a.png")}
    monkeypatch.setenv("VEPO_TRL_CACHE", cache_value[cache])
    monkeypatch.chdir(base)
    argv = ["train", "--config", TINY_RECIPE, "--output_dir", str(output), "--dataset_name",
            data if data in ("synthetic", "lab") else str(data_folder / data)]  # fmt: skip
    for name, value in chosen:
        argv += [f"--{name}", *value.split()]
    before_output, before_cwd = tree(output), sorted(p.name for p in base.iterdir())
    capsys.readouterr()
    try:
        cli_main(argv)
        code = 0
    except ReachedTheModel:
        code = "model"
    except SystemExit as exit_info:
        code = exit_info.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Traceback" not in out, (argv, err[-2000:])
    assert code in (0, 2, "model"), (argv, code, err[-2000:])
    if code == 2:
        errors = [line for line in err.strip().splitlines() if ": error: " in line]
        assert len(errors) == 1 and err.strip().splitlines()[-1] == errors[0], (argv, err)
        assert tree(output) == before_output, argv  # a refused run changes nothing in the folder
    # Nothing else in the working folder: the cache is where VEPO_TRL_CACHE says, a run writes only its output folder
    allowed = {"cache"} | ({output.name} if code in (0, "model") else set())
    assert {p.name for p in base.iterdir()} - allowed == {n for n in before_cwd} - allowed, (argv, code, err)
