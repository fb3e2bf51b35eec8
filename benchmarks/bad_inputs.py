"""Bad inputs across the CLI and the Python API: exit code, stderr lines and seconds to fail, as a markdown table.

Each CLI case runs `python -m vepo_trl ...` in a fresh process (so the time includes Python's and torch's start), in a
scratch folder holding the bad files; each API case runs in a fresh `python -c` process. The aim for every row: exit 2
(API: one `ValueError` line), one stderr line, no traceback, under 10 s, before any model loads.

    python benchmarks/bad_inputs.py                 # about 21 minutes on 2 cores
    python benchmarks/bad_inputs.py --only lab      # the cases whose command line contains "lab"
    python benchmarks/bad_inputs.py --cases unread  # every (option, mode that does not read it): about 2 minutes
    python benchmarks/bad_inputs.py --cases audit   # the newcomer audit's cases

Offline (HF_HUB_OFFLINE=1) so that Hub names fail the way they do on a machine without network.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "recipes" / "tiny" / "config_vepo.yaml")
TRAIN = ["train", "--config", TINY, "--output_dir", "run"]
INSPECT = ["inspect", "--model", "tiny-qwen2.5-vl"]

ROW = {"problem": "<image>Find x.", "answer": "3", "images": ["ok.png"]}

CLI_CASES: list[list[str]] = [
    [*TRAIN, "--temperature", "0"],
    [*TRAIN, "--learning_rate", "-1"],
    [*TRAIN, "--synthetic_rows", "0"],
    [*TRAIN, "--max_train_samples", "0"],
    [*TRAIN, "--min_pixels", "60000", "--max_pixels", "50000"],
    ["train", "--config", TINY, "--output_dir", ""],
    ["train", "--config", TINY, "--output_dir", "afile/run"],
    [*TRAIN, "--selection_ratio", "2"],
    [*TRAIN, "--selection_strategy", "nope"],
    [*TRAIN, "--noise_step", "500.5"],
    [*TRAIN, "--reward_funcs", "accuracy", "bogus"],
    [*TRAIN, "--model_name_or_path", "/nonexistent/model"],
    [*TRAIN, "--model_name_or_path", "Qwen/Qwen2.5-VL-3B-Instruct"],
    [*TRAIN, "--dataset_name", "geometry3k"],
    [*TRAIN, "--dataset_name", "paper_mix"],
    [*TRAIN, "--dataset_name", "nowhere.jsonl"],
    [*TRAIN, "--dataset_name", "missing_img.jsonl"],
    [*TRAIN, "--dataset_name", "corrupt_img.jsonl"],
    [*TRAIN, "--dataset_name", "empty.jsonl"],
    [*TRAIN, "--dataset_name", "invalid.jsonl"],
    [*TRAIN, "--dataset_name", "not_parquet.parquet"],
    [*TRAIN, "--dataset_name", "columns.jsonl"],
    [*TRAIN, "--dataset_name", "list_answers.jsonl"],
    [*TRAIN, "--dataset_name", "two_placeholders.jsonl"],
    [*TRAIN, "--dataset_name", "mixed.jsonl", "--strict_data", "true"],
    ["train", "--config", "broken.yaml"],
    ["train", "--config", "list.yaml"],
    ["train", "--config", "nowhere.yaml"],
    ["train", "--config", TINY, "--output_dir", "other_run"],
    ["train", "--config", TINY, "--output_dir", "unrecorded_run"],
    ["demo", "--output_dir", "keep", "--dataset_name", "missing_img.jsonl"],
    ["demo", "--temperature", "0"],
    ["lab", "--seeds", ""],
    ["lab", "--seeds", "0,0"],
    ["lab", "--seeds", "a,b"],
    ["lab", "--steps", "0"],
    ["lab", "--jobs", "0"],
    ["lab", "--strategies", "nope"],
    ["lab", "--output_dir", "other_lab"],
    [*INSPECT, "--dataset", "synthetic", "--index", "100000"],
    [*INSPECT, "--dataset", "synthetic", "--k", "0"],
    ["inspect", "--model", "Qwen/Qwen2.5-VL-7B-Instruct", "--dataset", "synthetic"],
    ["inspect", "--records", "nowhere.jsonl"],
    ["analyze", "--model", "tiny-qwen2.5-vl", "--dataset", "synthetic", "--limit", "0"],
    ["plot", "no_such_run"],
    ["trian"],
    # Settings that were accepted and then ignored, and inputs that failed only after the model loaded
    [*TRAIN, "--lora_r", "8", "--lora_target_modules", "q_proj"],
    [*TRAIN, "--fp16", "true"],
    [*TRAIN, "--save_strategy", "steps", "--save_steps", "0"],
    [*TRAIN, "--eval_strategy", "steps", "--eval_steps", "1"],
    [*TRAIN, "--eval_dataset_name", "synthetic"],
    [*TRAIN, "--report_to", "clearml"],  # an integration whose package is not installed (the dev extra has wandb)
    [*TRAIN, "--use_liger_kernel", "true"],
    [*TRAIN, "--deepspeed", str(REPO / "recipes" / "accelerate_configs" / "zero2.yaml")],
    [*TRAIN, "--dataset_name", "lab", "--max_pixels", "100"],
    [*TRAIN, "--use_peft", "true", "--lora_target_modules", "lm_head"],
    [*TRAIN, "--use_peft", "true", "--lora_target_modules", "no_such_proj"],
    [*TRAIN, "--model_name_or_path", "textlm"],
    [*TRAIN, "--config", TINY],
    ["train", f"--config={TINY}", "--config", TINY],
    ["train", "--config", "unquoted_no.yaml"],
    ["train", "--config", TINY, "--output_dir", "dangling"],
    ["demo", "--warm_start", "--model_family", "qwen3-vl"],
    ["demo", "--config", TINY],
    ["demo", "--model_family=bogus"],
    ["strategies", "--bogus"],
    ["--version", "--bogus"],
    ["eval", "--model", "textlm", "--benchmarks", "synthetic"],
    ["eval", "--model", "weightless", "--benchmarks", "synthetic"],
    ["eval", "--model", "tiny-qwen2.5-vl", "--adapter", "weightless", "--benchmarks", "synthetic"],
    ["eval", "--model", "tiny-qwen2.5-vl", "--backend", "vllm", "--benchmarks", "synthetic"],
]


# One invalid value per field of the value table (`vepo_trl.validation`: every rule of VEPOConfig, the script's and
# ModelConfig's fields), then the model folders VEPO refuses before their weights load
def table_cases() -> list[list[str]]:
    from trl import ModelConfig

    from vepo_trl.config import VEPOConfig
    from vepo_trl.train import VEPOScriptArguments
    from vepo_trl.validation import rules_for

    cases = []
    for name, rule in sorted(rules_for(VEPOConfig, VEPOScriptArguments, ModelConfig).items()):
        cases.append([*TRAIN, f"--{name}", *_invalid(rule)])
        # The wrong kind of value as well as the wrong range: text for a number, a number for a yes / no
        wrong_kind = {"whole": "abc", "number": "abc", "bool": "2", "numbers": "abc"}.get(rule.kind)
        if wrong_kind is not None:
            cases.append([*TRAIN, f"--{name}", wrong_kind])
    return cases + [
        # Data files in formats the loaders read, broken
        [*TRAIN, "--dataset_name", "empty.csv"],
        [*TRAIN, "--dataset_name", "wrong_types.jsonl"],
        [*TRAIN, "--dataset_name", "empty_rows.jsonl"],
        [*TRAIN, "--dataset_name", "notes.txt"],
        [*TRAIN, "--dataset_name", "bad.jsonl.gz"],
        ["demo", "--per_device_train_batch_size", "0"],
        [*TRAIN, "--model_name_or_path", "gemma4"],
        [*TRAIN, "--model_name_or_path", "no_processor"],
        [*TRAIN, "--model_name_or_path", "adapter_only"],
        [*TRAIN, "--reward_weights", "nan", "nan", "nan"],
        [*TRAIN, "--reward_weights", "0.5", "0.5"],
        [*TRAIN, "--generation_batch_size", "7", "--steps_per_generation", "None"],
        [*TRAIN, "--dtype", "float64x"],
        [*TRAIN, "--learning_rate", "abc"],
        [*TRAIN, "--noise_step", ""],
        # The newest newcomer findings
        [*TRAIN, "--push_to_hub", "true", "--hub_model_id", "someone/x"],
        ["eval", "--model", "tiny-qwen2.5-vl", "--benchmarks", "synthetic", "--output_dir", "afile"],
        ["eval", "--model", "tiny-qwen2.5-vl", "--benchmarks", "synthetic", "--dtype", "float64x"],
        ["analyze", "--model", "tiny-qwen2.5-vl", "--dataset", "synthetic", "--output_dir", "afile"],
        ["inspect", "--model", "tiny-qwen2.5-vl", "--dataset", "synthetic", "--output", "afile/page.html"],
        ["plot", "keep", "--dpi", "100000"],
        ["evaluate", "--model", "tiny-qwen2.5-vl", "--dataset", "geometry3k"],
    ]


# Every option of every command with its own parser, each value its rule refuses (wrong kind, out of range, edges),
# read from the command's declaration (`options.option` fields); the base command line fails fast after parsing if a
# bad value were ever taken (a model folder without weights), so a run never starts. Each case carries the flag its line must name.
COMMAND_BASES = {
    "eval": ["eval", "--model", "weightless", "--benchmarks", "synthetic"],
    "inspect": ["inspect", "--model", "/nonexistent/model", "--dataset", "synthetic"],
    "analyze": ["analyze", "--model", "/nonexistent/model", "--dataset", "synthetic"],
    "plot": ["plot", "keep"],
    "lab": ["lab", "--strategies", "nope"],
}
PATH_VALUES = {
    "out_folder": ["afile", "dangling", "new/" + "n" * 300, "afile/below"],
    "out_file": ["keep", "afile/page.html", "new/" + "n" * 300 + "/p"],
    "records_out": ["keep", "ok.png"],
    "in_file": ["nowhere.png", "keep"],
    "in_folder": ["nowhere", "afile"],
    "in_path": ["nowhere"],
    "text": [""],
    "model": [""],
    "url": ["ftp://host/v1", "localhost:8000"],
}


def _bad_values(rule) -> list[str]:
    """Every value of a kind the rule refuses: text for a number, NaN and infinities, a fraction for a whole number,
    then the range's own edges (0, -1, just past a bound, huge)."""
    if rule.kind in PATH_VALUES:
        return PATH_VALUES[rule.kind]
    if rule.kind in ("choice", "choice_or_bool"):
        return ["no-such-choice", ""]
    if rule.kind == "numbers":
        return ["nan", "abc", "2"] if rule.test is not None else ["nan", "abc"]
    bad = ["abc", "nan", "inf"] + (["1.5"] if rule.kind == "whole" else [])
    for value in (0, -1, 0.5, 1.5, 21, 1001, 1201, 2**33):
        if rule.kind == "whole" and not float(value).is_integer():
            continue
        if rule.test is not None and not rule.test(value):
            bad.append(str(value))
    return bad


def command_cases() -> list[tuple[list[str], str]]:
    import importlib

    cases = []
    for command, base in COMMAND_BASES.items():
        parser = importlib.import_module(f"vepo_trl.commands.{command}").make_parser()
        for action in parser._actions:
            if not action.option_strings or action.nargs == 0 or action.dest == "help":
                continue
            flag = action.option_strings[-1]
            rule = parser.rules[action.dest]
            for value in _bad_values(rule):
                argv = list(base)
                if flag in argv:  # the base's own option: replaced, never repeated
                    argv[argv.index(flag) + 1] = value
                else:
                    argv += [flag, value]
                cases.append((argv, flag))
    # Every folder a command writes, in every state that cannot be written
    writers = {
        "train": [*TRAIN[:3], "--output_dir"],
        "demo": ["demo", "--max_steps", "1", "--output_dir"],
        "eval": [*COMMAND_BASES["eval"], "--output_dir"],
        "analyze": [*COMMAND_BASES["analyze"], "--output_dir"],
        "plot": [*COMMAND_BASES["plot"], "--output_dir"],
        "lab": ["lab", "--quick", "--output_dir"],
    }
    for command, argv in writers.items():
        for state in PATH_VALUES["out_folder"]:
            cases.append(([*argv, state], "--output_dir" if command not in ("train", "demo") else "output_dir"))
    # Every file a command reads, in every state: missing, empty, truncated, of another format, a folder
    for state in ("nowhere.parquet", "empty.parquet", "truncated.parquet", "notes.parquet", "keep"):
        cases.append(([*TRAIN, "--dataset_name", state], state))
        cases.append((["analyze", "--model", "weightless", "--dataset", state], state))
    for state in ("nowhere", "afile", "bench_truncated", "bench_empty", "bench_foreign"):
        # A model folder that passes eval's checks (its weights are not read before the data)
        cases.append((["eval", "--model", "unread_weights", "--benchmarks", "geometry3k", "--protocol", "rule",
                       "--data_dir", state], state))  # fmt: skip
    for state in ("nowhere.yaml", "empty_recipe.yaml", "broken.yaml", "list.yaml", "keep", "binary.yaml"):
        cases.append((["train", "--config", state], state))
        cases.append((["inspect", "--model", "weightless", "--dataset", "synthetic", "--config", state], state))
    for state in ("nowhere.jsonl", "afile", "invalid.jsonl", "keep"):
        cases.append((["inspect", "--records", state], "--records"))
    for state in ("nowhere", "afile", "empty_folder"):
        cases.append((["plot", state], state))
    # A recipe's value of every YAML type where one value of text goes
    # (null passes where the field may be unset: output_dir's is transformers' trainer_output, run_name's the folder)
    for key in ("dataset_name", "output_dir", "model_name_or_path", "selection_strategy", "perturbation", "run_name"):
        for kind in (
            ("list", "mapping", "bool") if key in ("output_dir", "run_name") else ("list", "mapping", "null", "bool")
        ):
            cases.append((["train", "--config", f"yaml_{key}_{kind}.yaml"], key))
    return cases


def _invalid(rule) -> list[str]:
    """One value the rule refuses: out of its range where it has one, else of the wrong kind."""
    if rule.kind in ("choice", "choice_or_bool"):
        return ["no-such-choice"]
    if rule.kind == "bool":
        return ["maybe"]
    if rule.kind == "mapping_file":
        return ["nowhere.json"]
    if rule.kind == "mapping":
        return ["text"]
    if rule.kind == "numbers":
        return ["nan"]
    for value in (0, -1, 2**33, 0.5):
        if rule.test is not None and not rule.test(value) and not (rule.kind == "whole" and value == 0.5):
            return [str(value)]
    return ["1.5" if rule.kind == "whole" else "nan"]


# Every (command, option, mode that does not read it) from the declarations (`validation.Reads`: each declared
# option's, and train's table `config.settings_reads`): the option given in that mode must be refused naming it
UNREAD_BASES = {
    "train": [*TRAIN[:3], "--output_dir", "unread-run"],
    "eval": ["eval", "--benchmarks", "synthetic", "--output_dir", "unread-eval"],
    "inspect": ["inspect", "--dataset", "synthetic"],
    "analyze": ["analyze", "--dataset", "synthetic", "--model", "weightless", "--output_dir", "unread-analysis"],
    "plot": ["plot", "keep"],
    "lab": ["lab", "--quick", "--output_dir", "unread-lab"],
}
TRAIN_VALUES = {"vllm_mode": "server", "vllm_structured_outputs_regex": "[0-9]+", "vllm_server_host": "10.0.0.2",
                "vllm_server_base_url": "http://10.0.0.2:8000", "vllm_model_impl": "transformers",
                "vllm_importance_sampling_mode": "token_mask", "hub_strategy": "end", "hub_revision": "main",
                "lora_target_modules": "q_proj", "lora_target_parameters": "q_proj.weight",
                "lora_modules_to_save": "lm_head", "lora_task_type": "CAUSAL_LM", "perturbation": "gaussian",
                "min_pixels": "3136", "max_pixels": "1000000"}  # fmt: skip
PATH_GOOD = {"out_folder": "new-out", "out_file": "new-out.html", "records_out": "new-records.jsonl", "in_file": "ok.png", "in_folder": "keep",
             "in_path": "keep", "text": "x", "model": "weightless", "url": "http://127.0.0.1:9/v1"}  # fmt: skip


def _good(rule) -> str | None:
    """A value `rule` takes (None for a flag)."""
    if rule.kind == "bool":
        return None
    if rule.kind in PATH_GOOD:
        return PATH_GOOD[rule.kind]
    if rule.kind in ("choice", "choice_or_bool"):
        return str(next(iter(rule.choices())))
    if rule.kind == "numbers":
        return "0.5"
    for value in (1, 2, 500, 0.5):
        if (rule.kind != "whole" or float(value).is_integer()) and (rule.test is None or rule.test(value)):
            return str(value)
    return "1"


def _mode_words(deciders, values, rules, train: bool) -> list[str]:
    words = []
    for name, value in zip(deciders, values):
        if value is None or (value is False and not train):
            continue
        if value is True and not train:
            words.append(f"--{name}")
        elif not train and rules[name].kind in PATH_GOOD:
            words += [f"--{name}", PATH_GOOD[rules[name].kind]]
        else:
            words += [f"--{name}", str(value).lower() if isinstance(value, bool) else str(value)]
    return words


def unread_cases() -> list[tuple[list[str], str]]:
    import dataclasses
    import importlib

    from trl import ModelConfig

    from vepo_trl.config import VEPOConfig, settings_reads
    from vepo_trl.train import VEPOScriptArguments
    from vepo_trl.validation import rules_for

    cases = []
    for command in ("eval", "inspect", "analyze", "plot", "lab"):
        parser = importlib.import_module(f"vepo_trl.commands.{command}").make_parser()
        for field in dataclasses.fields(parser.declaration):
            reads = field.metadata["reads"]
            if not reads.deciders or not set(reads.deciders) <= set(parser.rules) or field.name in reads.deciders:
                continue
            value = _good(parser.rules[field.name])
            mode = _mode_words(reads.deciders, reads.unread, parser.rules, train=False)
            base = list(UNREAD_BASES[command])
            if command == "eval" and "rescore" not in reads.deciders:
                base += ["--model", "weightless"]
            if command == "inspect":
                base = (["inspect"] if {"records", "image", "dataset"} & set(reads.deciders) else base) + (
                    [] if "records" in reads.deciders else ["--model", "weightless"]
                )
            cases.append(([*base, *mode, f"--{field.name}", *([] if value is None else [value])], f"--{field.name}"))
    rules = rules_for(VEPOConfig, VEPOScriptArguments, ModelConfig)
    for name, reads in settings_reads().items():
        if name in reads.deciders:
            continue
        value = TRAIN_VALUES.get(name) or (_good(rules[name]) if name in rules else "true") or "true"
        mode = _mode_words(reads.deciders, reads.unread, rules, train=True)
        cases.append(([*UNREAD_BASES["train"], *mode, f"--{name}", value], f"--{name}"))
    return cases


# The newcomer audit's cases (by its labels), each refused in one line now: (argv, what the line names)
AUDIT_CASES: list[tuple[list[str], str]] = [
    ([*TRAIN, "--beta", "0", "--sync_ref_model", "true", "--ref_model_sync_steps", "10"], "--sync_ref_model"),  # T28
    ([*TRAIN, "--optim", "adamw_bnb_8bit"], "--optim"),  # T35 (where bitsandbytes is not installed)
    ([*INSPECT, "--dataset", "synthetic", "--device", "cuda"], "--device"),  # I15 (no GPU)
    (["analyze", "--model", "tiny-qwen2.5-vl", "--dataset", "synthetic", "--device", "cuda"], "--device"),  # A11
    ([*TRAIN, "--dataset_name", "dupkey.jsonl"], "twice"),  # F_dupkey
    ([*TRAIN, "--dataset_name", "plain.jsonl.gz"], "gz-compressed"),  # F_notgz
    ([*TRAIN, "--max_step", "40", "--max_steps", "1"], "--max_step"),  # T51
    ([*TRAIN, "--max-steps", "40", "--max_steps", "1"], "--max_steps is given twice"),  # T52
    ([*TRAIN, "--selection_strategy", "full", "--selection_mode", "weight"], "selection_mode weight"),  # T24
    ([*TRAIN, "--resume_from_checkpoint", "finished_run"], "a run's folder"),  # T40
    ([*TRAIN, "--resume_from_checkpoint", ""], "empty"),  # R02
    ([*TRAIN, "--reward_weights", "0", "0", "0"], "cannot learn"),  # T48
    (["train", "--config", "null_output_dir.yaml"], "output_dir is null"),  # Y13
    (["train", "--config", "key_twice.yaml"], "written twice"),
    ([*INSPECT, "--dataset", "synthetic", "--save_records", "keep_data.jsonl"], "--save_records"),  # I20
    (["analyze", "--model", "tiny-qwen2.5-vl", "--dataset", "synthetic", "--save_records", "keep_data.jsonl"],
     "--save_records"),  # A07
    (["plot", "keep", "--output_dir", "other_plots"], "never replaced by another run"),  # P14
    ([*INSPECT, "--dataset", "synthetic", "--output", "page.txt"], "--output"),  # I13
    ([*TRAIN, "--dataset_name", "schemas.jsonl"], "mixes two schemas"),  # F_mixed_schema
    ([*TRAIN, "--dataset_name", "number.jsonl"], "is a number"),  # F_num_problem
    ([*TRAIN, "--dataset_name", "bare_base64.jsonl"], "base64"),  # F_base64
]  # fmt: skip


API_CASES: list[tuple[str, str]] = [
    (
        'VEPOTrainer(model="/nonexistent/model")',
        "from vepo_trl import VEPOTrainer, VEPOConfig; from vepo_trl.rewards import get_reward_funcs; "
        "VEPOTrainer(model='/nonexistent/model', reward_funcs=get_reward_funcs(['accuracy']), "
        "args=VEPOConfig(output_dir='api-out', use_cpu=True, bf16=False, report_to='none'))",
    ),
    (
        'VEPOTrainer(model="Qwen/Qwen2.5-VL-3B-Instruct") offline',
        "from vepo_trl import VEPOTrainer, VEPOConfig; from vepo_trl.rewards import get_reward_funcs; "
        "VEPOTrainer(model='Qwen/Qwen2.5-VL-3B-Instruct', reward_funcs=get_reward_funcs(['accuracy']), "
        "args=VEPOConfig(output_dir='api-out', use_cpu=True, bf16=False, report_to='none'))",
    ),
    (
        'load_vepo_dataset("missing_img.jsonl")',
        "from vepo_trl.data import load_vepo_dataset; load_vepo_dataset('missing_img.jsonl')",
    ),
    (
        'load_vepo_dataset("invalid.jsonl")',
        "from vepo_trl.data import load_vepo_dataset; load_vepo_dataset('invalid.jsonl')",
    ),
    (
        "train.main(... temperature=0)",
        "from vepo_trl.train import make_parser, main; "
        f"main(*make_parser().parse_args_and_config(['--config', {TINY!r}, '--temperature', '0']))",
    ),
    (
        'VEPOConfig(selection_ratio="0.2")',
        "from vepo_trl import VEPOConfig; VEPOConfig(output_dir='api-out', use_cpu=True, bf16=False, "
        "report_to='none', selection_ratio='0.2')",
    ),
    (
        "VEPOTrainer(model=42)",
        "from vepo_trl import VEPOTrainer, VEPOConfig; VEPOTrainer(model=42, reward_funcs='accuracy', "
        "args=VEPOConfig(output_dir='api-out', use_cpu=True, bf16=False, report_to='none'))",
    ),
    (
        "VEPOTrainer(text-only model, vepo)",
        "from vepo_trl import VEPOTrainer, VEPOConfig; VEPOTrainer(model='textlm', reward_funcs='accuracy', "
        "args=VEPOConfig(output_dir='api-out', use_cpu=True, bf16=False, report_to='none'))",
    ),
]


def make_scratch(folder: Path) -> None:
    """The bad files and folders the cases point at."""
    from PIL import Image

    Image.new("RGB", (64, 64), "red").save(folder / "ok.png")
    (folder / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"x" * 20)

    def jsonl(name: str, *rows: dict) -> None:
        (folder / name).write_text("".join(json.dumps(row) + "\n" for row in rows))

    jsonl("missing_img.jsonl", {**ROW, "images": ["gone.png"]})
    jsonl("corrupt_img.jsonl", {**ROW, "images": ["corrupt.png"]})
    jsonl("columns.jsonl", {"q": "x", "a": "3", "images": ["ok.png"]})
    jsonl("list_answers.jsonl", {**ROW, "answer": ["3", "three"]})
    jsonl("two_placeholders.jsonl", {**ROW, "problem": "<image>a <image>b"})
    jsonl("mixed.jsonl", ROW, {**ROW, "answer": ["3", "three"]})
    (folder / "empty.jsonl").write_text("")
    (folder / "invalid.jsonl").write_text('{"problem": "x"\n')
    (folder / "not_parquet.parquet").write_text("hello")
    (folder / "afile").write_text("")
    (folder / "broken.yaml").write_text("model_name_or_path: tiny-qwen2.5-vl\n  dataset_name: [x\n")
    (folder / "list.yaml").write_text("- a\n- b\n")
    # A folder holding a run of another strategy, and one holding checkpoints without a record of their settings
    for name, record in (("other_run", {"selection_strategy": "entropy"}), ("unrecorded_run", None)):
        (folder / name / "checkpoint-5").mkdir(parents=True)
        (folder / name / "config.json").write_text("{}")
        if record:
            (folder / name / "vepo_run.json").write_text(json.dumps({"settings": record}))
    (folder / "keep").mkdir()
    (folder / "keep" / "summary.md").write_text("a good run\n")
    # A Gemma 4 folder (config.json and a processor config): VEPO has no adapter for its family yet
    (folder / "gemma4").mkdir()
    (folder / "gemma4" / "config.json").write_text(
        json.dumps({"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"]})
    )
    (folder / "gemma4" / "processor_config.json").write_text("{}")
    # A model folder saved without its processor, and an adapter folder without one
    (folder / "no_processor").mkdir()
    (folder / "no_processor" / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    (folder / "adapter_only").mkdir()
    (folder / "adapter_only" / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "x"}))
    (folder / "other_lab" / "runs").mkdir(parents=True)
    (folder / "other_lab" / "warm_start.json").write_text("{}")
    (folder / "other_lab" / "vepo_lab.json").write_text(json.dumps({"settings": {"steps": 50}}))
    # A text-only model with a processor config beside it, a model folder without weights, a dangling link, and a
    # recipe whose unquoted `no` YAML reads as false
    (folder / "textlm").mkdir()
    (folder / "textlm" / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (folder / "textlm" / "processor_config.json").write_text("{}")
    (folder / "weightless").mkdir()
    (folder / "weightless" / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    (folder / "dangling").symlink_to(folder / "nowhere")
    lines = [line for line in Path(TINY).read_text().splitlines() if not line.startswith("save_strategy")]
    (folder / "empty.csv").write_text("")
    jsonl("wrong_types.jsonl", {"problem": 3, "images": "ok.png", "answer": {"a": 1}})
    (folder / "empty_rows.jsonl").write_text("{}\n{}\n")
    (folder / "notes.txt").write_text("not data\n")
    (folder / "bad.jsonl.gz").write_bytes(b"not gzip at all")
    (folder / "unquoted_no.yaml").write_text("\n".join([*lines, "save_strategy: no"]) + "\n")
    # Data and benchmark files in every state, recipes of every YAML type
    import datasets
    import yaml

    datasets.Dataset.from_dict({"problem": ["<image>x"] * 2, "answer": ["1"] * 2}).to_parquet(
        str(folder / "f.parquet")
    )
    whole = (folder / "f.parquet").read_bytes()
    (folder / "truncated.parquet").write_bytes(whole[: len(whole) // 2])
    (folder / "empty.parquet").write_bytes(b"")
    (folder / "notes.parquet").write_text("id,problem\n1,what\n")
    for name, data in (
        ("bench_truncated", whole[: len(whole) // 2]),
        ("bench_empty", b""),
        ("bench_foreign", b"a,b\n"),
    ):
        (folder / name / "geometry3k" / "data").mkdir(parents=True)
        (folder / name / "geometry3k" / "data" / "test-00000-of-00001.parquet").write_bytes(data)
    (folder / "empty_recipe.yaml").write_text("")
    (folder / "empty_folder").mkdir()
    (folder / "unread_weights").mkdir()
    (folder / "unread_weights" / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    (folder / "unread_weights" / "model.safetensors").write_bytes(b"")
    (folder / "unread_weights" / "preprocessor_config.json").write_text("{}")
    (folder / "binary.yaml").write_bytes(b"\xff\xfe\x00garbage")
    (folder / "keep" / "trainer_state.json").write_text('{"log_history": [{"step": 1, "loss": 0.5}]}')
    # The newcomer audit's files: a row with a key twice, plain JSONL named .gz, two schemas, a number as the
    # problem, base64 without its prefix, a finished run, the user's data file, another plot's folder, recipes
    (folder / "dupkey.jsonl").write_text(
        '{"problem": "<image>x", "answer": "1", "answer": "2", "images": ["ok.png"]}\n'
    )
    jsonl("plain.jsonl.gz", ROW)
    jsonl("schemas.jsonl", ROW, ROW, {"question": "<image>q", "gt_answer": "3", "image": "ok.png"})
    jsonl("number.jsonl", {**ROW, "problem": 42})
    jsonl("bare_base64.jsonl", {**ROW, "images": ["iVBORw0KGgo" + "A" * 80]})
    jsonl("keep_data.jsonl", *[ROW] * 16)
    (folder / "finished_run").mkdir()
    (folder / "finished_run" / "vepo_run.json").write_text(json.dumps({"settings": {}}))
    (folder / "finished_run" / "model.safetensors").write_bytes(b"")
    (folder / "finished_run" / "trainer_state.json").write_text('{"global_step": 60, "log_history": []}')
    (folder / "other_plots").mkdir()
    (folder / "other_plots" / "rewards.png").write_bytes(b"\x89PNG")
    (folder / "other_plots" / "plots.json").write_text(json.dumps({"runs": ["/elsewhere/run"]}))
    text = Path(TINY).read_text()
    (folder / "key_twice.yaml").write_text(text + "selection_ratio: 0.5\n")
    (folder / "null_output_dir.yaml").write_text(
        "\n".join("output_dir: null" if line.startswith("output_dir:") else line for line in text.splitlines()) + "\n"
    )
    recipe = yaml.safe_load(Path(TINY).read_text())
    for key in ("dataset_name", "output_dir", "model_name_or_path", "selection_strategy", "perturbation", "run_name"):
        for kind, value in (("list", ["a", "b"]), ("mapping", {"a": 1}), ("null", None), ("bool", True)):
            (folder / f"yaml_{key}_{kind}.yaml").write_text(yaml.safe_dump({**recipe, key: value}))


def _kind(label: str) -> str:
    """The kind of a case, for the per-kind counts: the command, and for `train` what its bad input is."""
    if label.startswith("API: "):
        return "Python API"
    words = label.split()
    command = words[1] if len(words) > 1 else "?"
    if command != "train":
        return f"{command} command" if not command.startswith("-") else "top-level options"
    flags = [word for word in words[2:] if word.startswith("--") and word not in ("--config", "--output_dir")]
    if not flags:
        return "train: recipe or folder"
    if flags[0] == "--dataset_name":
        return "train: data file or name"
    if flags[0] == "--model_name_or_path":
        return "train: model"
    return "train: one setting" if len(flags) == 1 else "train: settings combined"


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every file the scratch folder held (the user's files a refused command must not touch)."""
    stamps = {}
    for path in folder.rglob("*"):
        if path.is_file() and "cache" not in path.parts:
            stat = path.stat()
            stamps[str(path.relative_to(folder))] = (stat.st_size, stat.st_mtime_ns)
    return stamps


def run(command: list[str], folder: Path, env: dict) -> tuple[int, list[str], float]:
    start = time.perf_counter()
    result = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    return result.returncode, result.stderr.strip().splitlines(), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="Run only the cases whose text contains this.")
    parser.add_argument("--cases", default="all", choices=("all", "unread", "audit"),
                        help="unread: every (command, option, mode that does not read it); audit: the newcomer "
                        "audit's cases; all: those and every other case.")  # fmt: skip
    args = parser.parse_args()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    rows, refused_otherwise = [], []
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        make_scratch(folder)
        env["VEPO_TRL_CACHE"] = env.get("VEPO_TRL_CACHE") or str(folder / "cache")
        env["HF_DATASETS_CACHE"] = str(folder / "datasets-cache")

        def label(argv):
            return f"vepo-trl {' '.join(repr(a) if not a or ' ' in a else a for a in argv)}"

        needles = {}
        generated = {"unread": unread_cases(), "audit": AUDIT_CASES}
        generated["all"] = [*command_cases(), *generated["unread"], *generated["audit"]]
        for argv, needle in generated[args.cases]:
            needles[label(argv)] = needle
        cases = (
            []
            if args.cases != "all"
            else [(label(c), [sys.executable, "-m", "vepo_trl", *c]) for c in CLI_CASES + table_cases()]
        )
        cases += [(label(argv), [sys.executable, "-m", "vepo_trl", *argv]) for argv, _ in generated[args.cases]]
        # Warm the cache of TRL's declarations as a user's first run does (the early checks read it)
        subprocess.run([sys.executable, "-m", "vepo_trl", "train", "--config", TINY, "--help-all"], cwd=folder,
                       env=env, capture_output=True)  # fmt: skip
        # The API raises: the row shows the exception's own message (its lines), printed by a wrapper exiting 2
        wrap = "import sys\ntry:\n    {}\nexcept (ValueError, TypeError) as e:\n    print(f'{{type(e).__name__}}: {{e}}', file=sys.stderr)\n    sys.exit(2)"
        if args.cases == "all":
            cases += [(f"API: {label}", [sys.executable, "-c", wrap.format(code)]) for label, code in API_CASES]
        replaced = []
        for label, command in cases:
            if args.only not in label:
                continue
            before = _files(folder)
            code, lines, seconds = run(command, folder, env)
            after = _files(folder)
            changed = [name for name, stamp in before.items() if name in after and after[name] != stamp]
            if changed and code != 0:  # a refused run that still wrote over a file (a run that trains may)
                replaced.append((label, changed))
            traceback = any(line.startswith("Traceback") for line in lines)
            shown = label.replace(str(REPO) + os.sep, "")
            last = lines[-1] if lines else ""
            if label in needles and code == 2 and needles[label] not in last:
                refused_otherwise.append((shown, last))
            rows.append((shown, code, len(lines), seconds, traceback, last))
            print(f"{code:>3} {len(lines):>3} {seconds:5.1f}s {'TB ' if traceback else ''}{shown}", flush=True)
    print("\n| kind | cases | exit 2 | one stderr line | tracebacks | accepted (exit 0) |\n|---|---|---|---|---|---|")
    for kind in sorted({_kind(row[0]) for row in rows}):
        mine = [row for row in rows if _kind(row[0]) == kind]
        print(f"| {kind} | {len(mine)} | {sum(r[1] == 2 for r in mine)} | {sum(r[1] == 2 and r[2] == 1 for r in mine)} "
              f"| {sum(r[4] for r in mine)} | {sum(r[1] == 0 for r in mine)} |")  # fmt: skip
    print("\n| command | refusals | median s | max s |\n|---|---|---|---|")
    for command in sorted({row[0].split()[1] for row in rows if not row[0].startswith("API")}):
        times = sorted(row[3] for row in rows if row[1] == 2 and row[0].split()[1] == command)
        if times:
            print(f"| {command} | {len(times)} | {times[len(times) // 2]:.2f} | {times[-1]:.2f} |")
    accepted = [row[0] for row in rows if row[0] in needles and row[1] == 0]
    print(f"\n{len(accepted)} expected refusals accepted (exit 0); {len(replaced)} runs replaced a file:")
    for label in accepted:
        print(f"  accepted: {label}")
    for label, changed in replaced:
        print(f"  replaced: {label}: {changed}")
    seconds = sorted(row[3] for row in rows)
    one_line = sum(1 for row in rows if row[1] == 2 and row[2] == 1)
    print(
        f"\n{len(rows)} cases: {sum(row[1] == 2 for row in rows)} exit 2, {one_line} one stderr line, "
        f"{sum(row[4] for row in rows)} tracebacks, median {seconds[len(seconds) // 2] if seconds else 0:.1f} s to "
        f"fail, max {seconds[-1] if seconds else 0:.1f} s"
    )
    # A bad value refused for another reason than its own was taken by its rule: accepted, and said by chance later
    print(f"{len(refused_otherwise)} of the generated cases refused for another reason than the bad value (taken):")
    for shown, last in refused_otherwise:
        print(f"  {shown}: {last[:160]}")
    print("\n| input | exit | stderr lines | seconds | last stderr line |\n|---|---|---|---|---|")
    for label, code, count, seconds, traceback, last in rows:
        last = last.replace("|", "\\|")[:140]
        print(f"| `{label}` | {code} | {count}{' (traceback)' if traceback else ''} | {seconds:.1f} | {last} |")


if __name__ == "__main__":
    main()
