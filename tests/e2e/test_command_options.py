"""Every option of every command is declared once (a dataclass of `options.option` fields with their rules), every folder a
command writes through one check, every recipe value of any YAML type through one rule: drawn over all commands.

Each case runs the real CLI in this process up to the point a model or data would load (those are replaced by a
sentinel), and asserts exit 0, or exit 2 with one line and no traceback, and nothing written where the run was
refused.
"""

import argparse
import dataclasses
import datetime
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vepo_trl.train as train_module
from vepo_trl.cli import main as cli_main
from vepo_trl.options import option, parser_for
from vepo_trl.validation import ALWAYS, TEXT, Reads

from ..support import REPO, TINY_RECIPE, assert_one_error_line, run_cache, snapshot


EXAMPLES = int(os.environ.get("VEPO_HYPOTHESIS_EXAMPLES", "25"))
LONG_NAME = "n" * 300
REAL_LOAD_SPLIT = train_module.load_dataset_split


class Reached(BaseException):
    """A command got past its checks to where a model or data loads: the sentinel, not an error of the command."""


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command with its own parser, as the CLI builds it."""
    import importlib

    return {
        name: importlib.import_module(f"vepo_trl.commands.{name}").make_parser()
        for name in ("eval", "inspect", "analyze", "plot", "lab")
    }


def option_rule(command: str, name: str):
    """The rule `vepo-trl command` declares for its option `name`."""
    return parsers()[command].rules[name]


def options(command: str) -> dict[str, argparse.Action]:
    return {
        action.dest: action for action in parsers()[command]._actions if not isinstance(action, argparse._HelpAction)
    }


@pytest.fixture(autouse=True)
def every_command_stops_at_loading(monkeypatch, tmp_path_factory):
    """Every place a command loads a model, data or starts its work raises `Reached`."""
    from vepo_trl.builtin import warm_start
    from vepo_trl.commands import analyze as analyze_command
    from vepo_trl.commands import inspect as inspect_command
    from vepo_trl.commands import plot as plot_command
    from vepo_trl.eval import run as eval_run
    from vepo_trl.insight import runs as commands
    from vepo_trl.lab import experiment as lab_run

    monkeypatch.setenv("VEPO_TRL_CACHE", str(run_cache(tmp_path_factory)))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def reached(*args, **kwargs):
        raise Reached()

    for module, name in [
        (train_module, "load_model"),
        (train_module, "load_dataset_split"),
        (eval_run, "_make_generator"),
        (commands, "load_model"),
        (inspect_command, "load_rows"),
        (analyze_command, "load_rows"),
        (inspect_command, "load_model"),
        (analyze_command, "load_model"),
        (plot_command, "plot_runs"),
        (lab_run, "run_lab"),
        (lab_run, "run_sweep"),
        (warm_start, "warm_start_path"),
    ]:
        if hasattr(module, name):
            monkeypatch.setattr(module, name, reached)


def run(argv: list[str], capsys) -> tuple[int | str, str]:
    """(exit status, or "reached" where the command got to loading; stderr) of one in-process `vepo-trl` call."""
    try:
        cli_main(argv)
        code = 0
    except SystemExit as exit_info:
        code = exit_info.code
    except Reached:
        code = "reached"
    return code, capsys.readouterr().err


class Place:
    """Files and folders a drawn value can point at, made fresh in a test's folder."""

    def __init__(self, root: Path):
        self.root = root
        (root / "afile.txt").write_text("plain text")
        (root / "folder").mkdir()
        (root / "model").mkdir()
        (root / "model" / "config.json").write_text("{}")
        (root / "model" / "model.safetensors").write_bytes(b"")  # a stand-in, never loaded
        (root / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n")
        (root / "run").mkdir()
        (root / "run" / "trainer_state.json").write_text('{"log_history": [{"step": 1, "loss": 0.5}]}')
        os.symlink(root / "gone", root / "dangling")

    def bad(self, kind: str) -> list[str]:
        """Values of a path kind that must be refused."""
        r = self.root
        return {
            "out_folder": [str(r / "afile.txt"), str(r / "dangling"), str(r / "new" / LONG_NAME),
                           str(r / "afile.txt" / "below")],
            "out_file": [str(r / "folder"), str(r / "afile.txt" / "below.html"), str(r / "new" / LONG_NAME / "p")],
            "records_out": [str(r / "folder"), str(r / "afile.txt")],  # a file that holds no records
            "in_file": [str(r / "nowhere.png"), str(r / "folder")],
            "in_folder": [str(r / "nowhere"), str(r / "afile.txt")],
            "in_path": [str(r / "nowhere")],
            "text": [""],
            "model": [""],
            "url": ["ftp://host/v1", "localhost:8000"],
        }[kind]  # fmt: skip

    def good(self, kind: str) -> str:
        r = self.root
        return {
            "out_folder": str(r / "out"),
            "out_file": str(r / "out.html"),
            "records_out": str(r / "records.jsonl"),
            "in_file": str(r / "image.png"),
            "in_folder": str(r / "folder"),
            "in_path": str(r / "run"),
            "text": "synthetic",
            "model": str(r / "model"),
            "url": "http://127.0.0.1:9/v1",
        }[kind]


def bad_numbers(rule) -> list[str]:
    """Values outside a number rule, as typed: wrong kinds whatever the range, then the range's own edges."""
    if rule.kind == "choice" or rule.kind == "choice_or_bool":
        return ["no-such-choice"]
    bad = ["nan", "inf", "abc"]
    if rule.kind == "whole":
        bad.append("1.5")
    for value in (0, -1, 0.5, 2, 10**9, 2**33, 1001):
        if rule.kind == "whole" and not float(value).is_integer():
            continue
        if rule.test is not None and not rule.test(value):
            bad.append(str(value))
    return bad


def good_number(rule) -> str | None:
    if rule.kind in ("choice", "choice_or_bool"):
        return str(next(iter(rule.choices())))
    for value in (1, 2, 0, 500, 0.5):
        if rule.kind == "whole" and not float(value).is_integer():
            continue
        if rule.test is None or rule.test(value):
            return str(value)
    return None


PATH_KINDS = ("out_folder", "out_file", "records_out", "in_file", "in_folder", "in_path", "text", "model", "url")
# What a command needs to parse at all (its positional or required options)
REQUIRED = {"plot": ["RUN"], "analyze": ["--dataset", "synthetic"]}


def test_every_option_of_every_command_is_declared_once_with_a_rule():
    """Each command's parser is read from its declaration: every option is a declared field with a rule and help
    text in --help, and every declared field is an option (nothing declared and not parsed, nor the reverse)."""
    import dataclasses

    for command, parser in parsers().items():
        fields = {field.name: field for field in dataclasses.fields(parser.declaration)}
        assert set(options(command)) == set(fields), command
        assert all(parser.rules[name] is fields[name].metadata["rule"] for name in fields), command
        text = parser.format_help()
        for name, field in fields.items():
            assert (f"--{name}" if not field.metadata["positional"] else field.metadata["metavar"]) in text
        parsed = parser.parse_args(REQUIRED_ARGS.get(command, []))
        assert isinstance(parsed, parser.declaration)


# What a command needs to parse at all, as typed
REQUIRED_ARGS = {"plot": [str(REPO)], "analyze": ["--dataset", "synthetic"], "eval": ["--model", "tiny-qwen2.5-vl"]}


def test_an_option_declared_without_a_rule_cannot_make_a_parser():
    @dataclasses.dataclass
    class Options:
        name: str | None = option(None, "A name.", reads=ALWAYS, rule=TEXT)
        other: str | None = None

    with pytest.raises(TypeError, match="Options.other: an option declared without a rule"):
        parser_for(Options, prog="vepo-trl x")
    with pytest.raises(TypeError, match="reads"):  # when a run reads it is part of every declaration
        option(None, "A name.", rule=TEXT)


def option_values(place: Place, command: str, name: str, action: argparse.Action, bad: bool) -> list[str] | None:
    """The values to type after `--name` (None: a flag without a value)."""
    rule = option_rule(command, name)
    if action.nargs == 0:
        return None
    if rule.kind in PATH_KINDS:
        return place.bad(rule.kind) if bad else [place.good(rule.kind)]
    if rule.kind == "bool":
        return None
    if rule.kind == "numbers":
        return ["nan", "abc", "2"] if bad else ["0.5"]
    if rule.kind == "device":
        return ["1", "warp:0"] if bad else ["cpu"]
    if rule.kind == "mapping":  # JSON of a mapping (a strategy's own settings: none for vepo)
        return ["[1]", "{bad"] if bad else ["{}"]
    values = bad_numbers(rule) if bad else [good_number(rule)]
    return [value for value in values if value is not None]


@pytest.mark.parametrize("command", ["eval", "inspect", "analyze", "plot", "lab"])
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_drawn_options_of_every_command_end_cleanly(command, data, tmp_path_factory, capsys):
    """Two or three options at a time, each with a value of its rule's kind that is valid or not: one bad value is
    refused in one line naming a bad option, before anything loads, and nothing is written; good values run to
    the point a model would load, or are refused in one line by a rule that joins them (never a traceback)."""
    root = tmp_path_factory.mktemp(command)
    place = Place(root)
    actions = options(command)
    names = data.draw(st.lists(st.sampled_from(sorted(actions)), min_size=2, max_size=3, unique=True))
    argv, bad_flags = [command], []
    for name in names:
        is_bad = data.draw(st.booleans())
        values = option_values(place, command, name, actions[name], is_bad)
        if actions[name].option_strings == []:  # plot's RUN_DIR: a positional, given below
            continue
        # Either spelling: `--max_new_tokens` or `--max-new-tokens`; errors name the first
        flag = actions[name].option_strings[0]
        flag = data.draw(st.sampled_from([flag, "--" + flag[2:].replace("_", "-")]))
        if values is None:
            argv.append(flag)
            continue
        if not values:
            continue
        argv += [flag, data.draw(st.sampled_from(values))]
        if is_bad:
            bad_flags.append(actions[name].option_strings[0])
    required = REQUIRED.get(command, [])
    if not (required and required[0] in argv):
        argv += [str(root / "run") if arg == "RUN" else arg for arg in required]
    before = snapshot(root)
    code, err = run(argv, capsys)
    assert "Traceback" not in err, err
    if bad_flags:
        assert_one_error_line(code, err, command)
        line = err.strip().splitlines()[-1]
        assert any(flag in line or "RUN_DIR" in line for flag in bad_flags), (argv, line)
        assert snapshot(root) == before
    else:
        assert code in (0, 2, "reached"), (argv, err)
        if code == 2:
            assert_one_error_line(code, err, command)


# -- One rule per kind of input, through every command it applies to --------------------------------------------------

WRITERS = {
    "train": ["train", "--config", TINY_RECIPE, "--max_steps", "1", "--output_dir", "OUT"],
    "demo": ["demo", "--max_steps", "1", "--output_dir", "OUT"],
    "eval": ["eval", "--model", "MODEL", "--benchmarks", "synthetic", "--output_dir", "OUT"],
    "analyze": ["analyze", "--model", "MODEL", "--dataset", "synthetic", "--output_dir", "OUT"],
    "inspect": ["inspect", "--model", "MODEL", "--dataset", "synthetic", "--output", "OUT/page.html"],
    "plot": ["plot", "RUN", "--output_dir", "OUT"],
    "lab": ["lab", "--quick", "--output_dir", "OUT"],
}
FOLDER_STATES = {
    "a file": ("afile.txt", "a file"),
    "a dangling link": ("dangling", "does not exist"),
    "too long a name under a folder still to be made": (f"new/{LONG_NAME}", "not a usable folder name"),
    "under a file": ("afile.txt/below", "is a file"),
}


@pytest.mark.parametrize("state", sorted(FOLDER_STATES))
@pytest.mark.parametrize("command", sorted(WRITERS))
def test_every_writing_command_refuses_an_unusable_output_folder(command, state, tmp_path, capsys):
    """n01: `demo --output_dir o/<300 characters>` ended in `OSError: File name too long` while `train` refused it:
    every command that writes a folder goes through the same check, for every state of the folder."""
    place = Place(tmp_path)
    name, needle = FOLDER_STATES[state]
    out = str(tmp_path / name)
    if command == "inspect" and state == "a file":
        out = str(tmp_path / "afile.txt" / "x")  # the page's folder is a file
    argv = [
        arg.replace("OUT", out).replace("MODEL", str(place.root / "model")).replace("RUN", str(place.root / "run"))
        for arg in WRITERS[command]
    ]
    before = snapshot(tmp_path)
    code, err = run(argv, capsys)
    assert_one_error_line(code, err, command)
    assert any(word in err for word in (needle, "is a file", "not a usable", "does not exist")), err
    assert snapshot(tmp_path) == before


YAML_VALUES = {
    "list": ["synthetic", "synthetic"],
    "mapping": {"a": 1},
    "null": None,
    "date": datetime.date(2024, 1, 5),
    "bool": True,
    "number": 7,
    "text": "x",
}


def recipe_keys() -> list[str]:
    import dataclasses

    from trl import ModelConfig

    from vepo_trl.config import VEPOConfig
    from vepo_trl.train import VEPOScriptArguments

    return sorted({f.name for cls in (VEPOScriptArguments, VEPOConfig, ModelConfig) for f in dataclasses.fields(cls)
                   if f.init} - {"output_dir", "config"})  # fmt: skip


@pytest.mark.parametrize("kind", sorted(YAML_VALUES))
def test_recipe_values_of_any_yaml_type_for_any_key(kind, tmp_path, capsys):
    """n03: `dataset_name: [a, b]` ended in `AttributeError: 'list' object has no attribute 'strip'`; CI drew
    `parallelism_config: true` (`'bool' object has no attribute 'cp_enabled'`), a sweep found `accelerator_config: 7`
    (file descriptor 7). Every key, every YAML type (about 250 keys, a second each): refused in one line, or taken and
    run up to loading."""
    wrong = []
    for key in recipe_keys():
        recipe = yaml.safe_load(Path(TINY_RECIPE).read_text())
        recipe[key] = YAML_VALUES[kind]
        path = tmp_path / "recipe.yaml"
        path.write_text(yaml.safe_dump(recipe))
        try:
            code, err = run(
                ["train", "--config", str(path), "--output_dir", str(tmp_path / "out"), "--max_steps", "1"], capsys
            )
        except Exception as error:  # noqa: BLE001 - the finding is the key and the error, listed with the others
            wrong.append(f"{key}: {type(error).__name__}: {error}")
            continue
        lines = [line for line in err.splitlines() if line.strip()]
        if code not in (2, "reached") or "Traceback" in err or (code == 2 and len(lines) != 1):
            wrong.append(f"{key}: exit {code}: {err[-300:]}")
    assert not wrong, "\n".join(wrong)


def object_typed_recipe_keys() -> list[str]:
    from trl import ModelConfig

    from vepo_trl.config import VEPOConfig
    from vepo_trl.train import VEPOScriptArguments
    from vepo_trl.validation import _yaml_forms, field_annotations

    return sorted(key for cls in (VEPOScriptArguments, VEPOConfig, ModelConfig)
                  for key, annotation in field_annotations(cls).items() if "object" in (_yaml_forms(annotation) or ()))  # fmt: skip


@pytest.mark.parametrize("kind", ["bool", "number", "text", "mapping"])
def test_a_recipe_value_for_a_field_that_takes_an_object_is_refused(kind, tmp_path, capsys):
    """CI's n-th example: `parallelism_config: true` went past the recipe check into TrainingArguments and ended in
    `AttributeError: 'bool' object has no attribute 'cp_enabled'`. Every field whose type has no YAML form."""
    keys = object_typed_recipe_keys()
    assert "parallelism_config" in keys
    for key in keys:
        recipe = yaml.safe_load(Path(TINY_RECIPE).read_text())
        recipe[key] = YAML_VALUES[kind]
        path = tmp_path / "recipe.yaml"
        path.write_text(yaml.safe_dump(recipe))
        code, err = run(["train", "--config", str(path), "--output_dir", str(tmp_path / "out")], capsys)
        assert_one_error_line(code, err, "train", f"--config: {key}: ")
        assert "which a recipe cannot give" in err


@pytest.mark.parametrize(("kind", "needle"), [
    ("list", "dataset_name: a list ([synthetic, synthetic]), and dataset_name takes one value"),
    ("mapping", "dataset_name: a mapping"),
    ("null", "dataset_name: null (unset), and dataset_name must have a value"),
])  # fmt: skip
def test_a_recipe_list_where_one_value_goes_is_refused_naming_it(kind, needle, tmp_path, capsys):
    recipe = yaml.safe_load(Path(TINY_RECIPE).read_text())
    recipe["dataset_name"] = YAML_VALUES[kind]
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    code, err = run(["train", "--config", str(path), "--output_dir", str(tmp_path / "out")], capsys)
    assert_one_error_line(code, err, "train", needle)


def test_text_fields_take_a_yaml_number_or_date_as_text(tmp_path, capsys, monkeypatch):
    recipe = yaml.safe_load(Path(TINY_RECIPE).read_text())
    recipe.update(run_name=datetime.date(2024, 1, 5), hub_model_id=12, report_to="mlflow")  # mlflow names the run
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    seen = {}
    import vepo_trl.preflight as preflight

    original = preflight.check_arguments

    def keep(script_args, training_args, model_args, **kwargs):
        seen.update(run_name=training_args.run_name, hub_model_id=training_args.hub_model_id)
        return original(script_args, training_args, model_args, **kwargs)

    monkeypatch.setattr(preflight, "check_arguments", keep)
    code, err = run(["train", "--config", str(path), "--output_dir", str(tmp_path / "out")], capsys)
    assert code == "reached", err
    assert seen == {"run_name": "2024-01-05", "hub_model_id": "12"}


def test_repeated_flags_are_refused_in_every_command(tmp_path, capsys):
    """A flag given twice took the last value without a word."""
    place = Place(tmp_path)
    for argv, flag in [
        (["train", "--config", TINY_RECIPE, "--max_steps", "40", "--max_steps", "6"], "--max_steps"),
        (["demo", "--max_steps=4", "--max_steps", "6"], "--max_steps"),
        (["eval", "--model", "m", "--limit", "3", "--limit", "4"], "--limit"),
        (["inspect", "--model", "m", "--dataset", "synthetic", "--index", "1", "--index", "2"], "--index"),
        (["analyze", "--model", "m", "--dataset", "synthetic", "--limit", "2", "--limit", "3"], "--limit"),
        (["plot", str(place.root / "run"), "--dpi", "50", "--dpi", "60"], "--dpi"),
        (["lab", "--steps", "2", "--steps", "3"], "--steps"),
    ]:
        code, err = run(argv, capsys)
        assert_one_error_line(code, err, argv[0], f"{flag} is given twice")


@pytest.mark.parametrize("command", ["train", "eval", "inspect", "analyze", "plot", "lab"])
def test_a_flag_given_twice_in_another_spelling_is_refused(command, tmp_path, capsys):
    """T51 / T52: an abbreviation (`--max_step 40 --max_steps 1`) or the dash spelling (`--max-steps 40`) escaped the
    repeat rule and one value was dropped without a word. No command takes abbreviations; both spellings are one
    option."""
    place = Place(tmp_path)
    base, flag, values = {
        "train": (["--config", TINY_RECIPE], "max_steps", ("40", "1")),
        "eval": (["--model", "m"], "max_new_tokens", ("9", "5")),
        "inspect": (["--model", "m", "--dataset", "synthetic"], "max_new_tokens", ("9", "5")),
        "analyze": (["--model", "m", "--dataset", "synthetic"], "batch_size", ("3", "2")),
        "plot": ([str(place.root / "run")], "output_dir", (str(tmp_path / "a"), str(tmp_path / "b"))),
        "lab": ([], "max_minutes", ("9", "5")),
    }[command]
    dashed = "--" + flag.replace("_", "-")
    code, err = run([command, *base, dashed, values[0], f"--{flag}", values[1]], capsys)
    assert_one_error_line(code, err, command, f"--{flag} is given twice")
    code, err = run([command, *base, f"--{flag[:-1]}", values[0], f"--{flag}", values[1]], capsys)
    assert_one_error_line(code, err, command, f"--{flag[:-1]}")


# -- Every given setting is read: each (command, option) in each mode its declaration names ---------------------------


def declared_reads() -> list[tuple[str, str, Reads]]:
    """(command, option, when it is read) for every option of every command: the declarations' own, `train`'s
    table (`config.settings_reads`: TRL's, transformers' and the script's settings, and the registries')."""
    from vepo_trl.config import settings_reads

    rows = []
    for command, parser in parsers().items():
        for field in dataclasses.fields(parser.declaration):
            rows.append((command, field.name, field.metadata["reads"]))
    rows += [("train", name, reads) for name, reads in settings_reads().items()]
    return rows


def test_every_declared_option_states_when_it_is_read():
    rows = declared_reads()
    assert all(isinstance(reads, Reads) for _, _, reads in rows), [
        row for row in rows if not isinstance(row[2], Reads)
    ]
    conditional = [row for row in rows if row[2].deciders]
    assert all(reads.unread and reads.read for _, _, reads in conditional), "a condition without its two modes"
    assert len(conditional) >= 60, len(conditional)


TRAIN_VALUES = {  # a value each train setting takes (the type rules give the rest)
    "vllm_mode": "server", "vllm_structured_outputs_regex": "[0-9]+", "vllm_server_base_url": "http://10.0.0.2:8000",
    "vllm_server_host": "10.0.0.2", "vllm_model_impl": "transformers", "vllm_importance_sampling_mode": "token_mask",
    "hub_strategy": "end", "hub_revision": "main", "torch_compile_backend": "inductor", "torch_compile_mode": "default",
    "lora_target_modules": "q_proj", "lora_target_parameters": "q_proj.weight", "lora_modules_to_save": "lm_head",
    "lora_task_type": "CAUSAL_LM", "perturbation": "gaussian", "selection_strategy": "vepo",
}  # fmt: skip
SIZES = {"min_pixels": "3136", "max_pixels": "1000000"}  # a valid value together with the other's default


def typed_value(command: str, name: str, place: Place) -> list[str]:
    """The words after `--name` that give it a valid value (none for a flag)."""
    if command == "train":
        from trl import ModelConfig

        from vepo_trl.config import VEPOConfig
        from vepo_trl.train import VEPOScriptArguments
        from vepo_trl.validation import rules_for

        if name in {**TRAIN_VALUES, **SIZES}:
            return [{**TRAIN_VALUES, **SIZES}[name]]
        rule = rules_for(VEPOConfig, VEPOScriptArguments, ModelConfig).get(name)
        if rule is None or rule.kind == "bool":
            return ["true"]
        return [str(good_number(rule))]
    if name in SIZES:
        return [SIZES[name]]
    action = options(command)[name]
    values = option_values(place, command, name, action, bad=False)
    return [] if values is None else values[:1]


def mode_words(command: str, deciders: tuple[str, ...], values: tuple, place: Place) -> list[str]:
    """The command-line words that put a run in the mode where the deciders have `values`."""
    words = []
    for name, value in zip(deciders, values):
        if value is None or (value is False and command != "train"):
            continue
        if value is True and command != "train":
            words.append(f"--{name}")
            continue
        if command != "train" and option_rule(command, name).kind in PATH_KINDS:
            if isinstance(value, list):  # several paths (--compare A B)
                words += [f"--{name}", *(place.good(option_rule(command, name).kind) for _ in value)]
                continue
            value = place.good(option_rule(command, name).kind)
        words += [f"--{name}", str(value).lower() if isinstance(value, bool) else str(value)]
    return words


def base_words(command: str, deciders: tuple[str, ...], place: Place, out: Path, words=()) -> list[str]:
    model = ["--model", str(place.root / "model")]
    if command == "train":  # one step, unless the mode sets the step count
        steps = [] if "max_steps" in deciders else ["--max_steps", "1"]
        return ["--config", TINY_RECIPE, *steps, "--output_dir", str(out)]
    if command == "eval":  # a model, unless the mode grades stored completions; --compare reads two folders only
        if "--compare" in words:
            return ["--benchmarks", "synthetic"]
        return ["--benchmarks", "synthetic", "--output_dir", str(out)] + ([] if "--rescore" in words else model)
    if command == "inspect":
        own_source = {"records", "image", "dataset"} & set(deciders)
        return ([] if own_source else ["--dataset", "synthetic"]) + ([] if "records" in deciders else model)
    if command == "analyze":
        return ["--dataset", "synthetic", *model, "--output_dir", str(out)]
    return {"plot": [str(place.root / "run")], "lab": ["--quick", "--output_dir", str(out)]}[command]


@pytest.mark.parametrize(("command", "name", "reads"), [row for row in declared_reads() if row[2].deciders],
                         ids=lambda value: value if isinstance(value, str) else "")  # fmt: skip
def test_a_given_option_is_refused_exactly_in_the_modes_that_do_not_read_it(command, name, reads, tmp_path, capsys):
    """T25, T27, T30-T32, E09, E10, E21, I12, I22, ...: a given setting the run never read was taken without a word.
    For each option and the condition its declaration states, the real CLI, up to loading: given in a mode that does
    not read it, one line naming it; in a mode that reads it, never that refusal."""
    if command != "train" and not set(reads.deciders) <= set(options(command)):
        return  # a shared declaration's condition over another command's option: always read here
    place = Place(tmp_path)
    value = typed_value(command, name, place)
    for mode, refused in ((reads.unread, True), (reads.read, False)):
        words = mode_words(command, reads.deciders, mode, place)
        if name in reads.deciders:  # the option is one of its own deciders (vllm_server_base_url)
            continue
        base = base_words(command, reads.deciders, place, tmp_path / "out", words)
        argv = [command, *base, *words, f"--{name}", *value]
        code, err = run(argv, capsys)
        assert "Traceback" not in err, (argv, err)
        if refused:
            assert_one_error_line(code, err, command, f"--{name} ")
            assert "never reads it" in err, (argv, err)
        else:
            assert "never reads it" not in err, (argv, err)


# -- Files a command reads ---------------------------------------------------------------------------------------------


def damaged_parquet(path: Path) -> None:
    import datasets

    full = path.with_suffix(".full.parquet")
    datasets.Dataset.from_dict({"problem": ["<image>What?"] * 4, "answer": ["1"] * 4}).to_parquet(str(full))
    data = full.read_bytes()
    full.unlink()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("state", ["truncated", "empty", "another format"])
def test_a_damaged_benchmark_file_is_named_in_one_line(state, tmp_path, capsys, monkeypatch):
    """n04: a truncated parquet under `eval --data_dir` ended in `pyarrow.lib.ArrowInvalid` with a traceback; the
    training loader named the same file in one line. Both go through files.read_data_files."""
    from vepo_trl.eval import run as eval_run

    monkeypatch.setattr(eval_run, "check_model_name", lambda *a, **k: None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data = tmp_path / "data" / "geometry3k" / "data"
    data.mkdir(parents=True)
    file = data / "test-00000-of-00001.parquet"
    if state == "truncated":
        damaged_parquet(file)
    else:
        file.write_bytes(b"" if state == "empty" else b"id,problem\n1,what\n")
    capsys.readouterr()  # the writer's progress bar
    code, err = run(["eval", "--model", "m/m", "--benchmarks", "geometry3k", "--data_dir", str(tmp_path / "data"),
                     "--output_dir", str(tmp_path / "out"), "--protocol", "rule"], capsys)  # fmt: skip
    assert_one_error_line(code, err, "eval", f"geometry3k: cannot read {file}: not a readable parquet file")


@pytest.mark.parametrize("state", ["truncated", "empty"])
def test_a_damaged_training_file_is_named_in_one_line(state, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(train_module, "load_dataset_split", REAL_LOAD_SPLIT)
    file = tmp_path / "rows.parquet"
    if state == "truncated":
        damaged_parquet(file)
    else:
        file.write_bytes(b"")
    capsys.readouterr()  # the writer's progress bar
    code, err = run(["train", "--config", TINY_RECIPE, "--dataset_name", str(file), "--output_dir",
                     str(tmp_path / "out")], capsys)  # fmt: skip
    assert_one_error_line(code, err, "train", f"cannot read {file}: not a readable parquet file")


# -- The console -------------------------------------------------------------------------------------------------------


def test_a_console_that_cannot_print_a_character_does_not_fail_a_finished_command(tmp_path):
    """n05: with `PYTHONIOENCODING=ascii`, a command whose output names a non-ASCII folder finished its work and
    then died printing it (`UnicodeEncodeError`, exit 1). Whatever a command prints, the console takes it."""
    run_dir = tmp_path / "läuft"
    run_dir.mkdir()
    (run_dir / "trainer_state.json").write_text('{"log_history": [{"step": 1, "loss": 0.5, "reward": 0.1}]}')
    env = {**os.environ, "PYTHONIOENCODING": "ascii", "LC_ALL": "C", "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-m", "vepo_trl", "plot", str(run_dir), "--output_dir",
                             str(tmp_path / "übung")], capture_output=True, text=True, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "\\xfc" in result.stdout and (tmp_path / "übung").is_dir()
    # An error line naming the folder is printed too, not a traceback
    result = subprocess.run([sys.executable, "-m", "vepo_trl", "plot", str(tmp_path / "nörgends")],
                            capture_output=True, text=True, env=env)  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr and "\\xf6" in result.stderr


@pytest.mark.slow
def test_demo_into_a_non_ascii_folder_on_an_ascii_console(tmp_path):
    """The newcomer's case as run: the demo trains, saves and prints its summary, exit 0."""
    env = {**os.environ, "PYTHONIOENCODING": "ascii", "LC_ALL": "C", "PYTHONPATH": str(REPO),
           "VEPO_TRL_CACHE": os.environ.get("VEPO_TRL_CACHE", str(tmp_path / "cache"))}  # fmt: skip
    result = subprocess.run([sys.executable, "-m", "vepo_trl", "demo", "--max_steps", "1", "--output_dir", "o5_übung"],
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "o5_übung" / "summary.md").is_file()


@pytest.mark.parametrize("command", ["train", "eval", "inspect", "analyze"])
def test_a_model_folder_without_weights_is_refused_by_every_command_before_loading(command, tmp_path, capsys):
    """`train` loaded the data and then failed in transformers (an OSError, 39 lines) on a folder `eval` refused."""
    model = tmp_path / "weightless"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"]}')
    (model / "processor_config.json").write_text("{}")
    argv = {
        "train": ["train", "--config", TINY_RECIPE, "--model_name_or_path", str(model)],
        "eval": ["eval", "--model", str(model), "--benchmarks", "synthetic"],
        "inspect": ["inspect", "--model", str(model), "--dataset", "synthetic"],
        "analyze": ["analyze", "--model", str(model), "--dataset", "synthetic"],
    }[command]
    code, err = run(
        [*argv, "--output_dir" if command != "inspect" else "--output", str(tmp_path / "out.html")], capsys
    )
    assert_one_error_line(code, err, command, "holds no weights")


@pytest.mark.parametrize("command", ["train", "inspect"])
def test_an_empty_recipe_is_said(command, tmp_path, capsys):
    (tmp_path / "empty.yaml").write_text("")
    argv = ["train", "--config", str(tmp_path / "empty.yaml")]
    if command == "inspect":
        argv = ["inspect", "--model", "m/m", "--dataset", "synthetic", "--config", str(tmp_path / "empty.yaml")]
    code, err = run(argv, capsys)
    assert_one_error_line(code, err, command, "empty.yaml is empty")


# -- The newcomer audit's kinds, each through every command it applies to ---------------------------------------------


def data_file(folder: Path, name: str, lines: list[str], *, raw: bytes | None = None) -> str:
    """A training-data file in `folder`, its images beside it; `lines` are its rows as written."""
    from PIL import Image

    Image.new("RGB", (96, 96), (200, 30, 30)).save(folder / "sq.png")
    path = folder / name
    path.write_bytes(raw if raw is not None else ("\n".join(lines) + "\n").encode())
    return str(path)


ROW = '{"problem": "<image>What colour?", "answer": "red", "images": ["sq.png"]}'
BAD_FILES = {  # name -> (rows as written, what the refusal says)
    "F_dupkey.jsonl": ([ROW, '{"problem": "<image>x", "answer": "1", "answer": "2", "images": ["sq.png"]}'],
                       "the key 'answer' is given twice"),
    "F_notgz.jsonl.gz": ([ROW], "not gz-compressed"),
    "F_mixed_schema.jsonl": ([ROW, ROW, '{"question": "<image>q", "gt_answer": "red", "image": "sq.png"}'],
                             "mixes two schemas"),
    "F_num_problem.jsonl": (['{"problem": 42, "answer": "1", "images": ["sq.png"]}'], "is a number (42)"),
    "F_base64.jsonl": (['{"problem": "<image>x", "answer": "1", "images": ["iVBORw0KGgo' + "A" * 80 + '"]}'],
                       "base64 text without its prefix"),
}  # fmt: skip


def data_argv(command: str, path: str, place: Place, out: Path) -> list[str]:
    model = str(place.root / "model")
    return {
        "train": ["train", "--config", TINY_RECIPE, "--dataset_name", path, "--output_dir", str(out)],
        "inspect": ["inspect", "--model", model, "--dataset", path, "--output", str(out / "p.html")],
        "analyze": ["analyze", "--model", model, "--dataset", path, "--output_dir", str(out)],
    }[command]


@pytest.mark.parametrize("name", sorted(BAD_FILES))
@pytest.mark.parametrize("command", ["train", "inspect", "analyze"])
def test_a_data_file_is_checked_from_its_first_rows_before_anything_loads(command, name, tmp_path, capsys):
    """F_dupkey, F_notgz (84- and 64-line tracebacks after a minute), F_mixed_schema, F_num_problem, F_base64 (a
    message naming another problem): said in one line, before a model or an image loads."""
    place = Place(tmp_path)
    lines, needle = BAD_FILES[name]
    path = data_file(tmp_path, name, lines)
    code, err = run(data_argv(command, path, place, tmp_path / "out"), capsys)
    assert_one_error_line(code, err, command, needle)


@pytest.mark.parametrize(("command", "argv", "needle"), [
    ("train", ["--beta", "0", "--sync_ref_model", "true", "--ref_model_sync_steps", "10"], "--sync_ref_model true"),
    ("train", ["--use_peft", "true", "--sync_ref_model", "true", "--beta", "0.04"], "PEFT"),
    ("train", ["--optim", "adamw_bnb_8bit"], "bitsandbytes"),
    ("inspect", ["--device", "cuda"], "--device cuda"),
    ("analyze", ["--device", "cuda"], "--device cuda"),
])  # fmt: skip
def test_upstream_refusals_come_before_loading(command, argv, needle, tmp_path, capsys):
    """T28, T35, I15, A11: TRL's GRPOTrainer checks, an optimizer's package and a device the machine lacks failed in
    24-39-line tracebacks after the model loaded. Upstream's own test (or its rule, where it needs the trainer)."""
    import importlib.util

    import torch

    if "bitsandbytes" in needle and importlib.util.find_spec("bitsandbytes") is not None:
        pytest.skip("bitsandbytes is installed here")
    if "--device" in needle and torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    place = Place(tmp_path)
    base = {"train": ["--config", TINY_RECIPE, "--output_dir", str(tmp_path / "out")],
            "inspect": ["--model", str(place.root / "model"), "--dataset", "synthetic"],
            "analyze": ["--model", str(place.root / "model"), "--dataset", "synthetic"]}[command]  # fmt: skip
    code, err = run([command, *base, *argv], capsys)
    assert_one_error_line(code, err, command, needle)


def finished_run(folder: Path, steps: int) -> Path:
    """A run's folder as `train` leaves it finished: its record, its model, its trainer state at `steps`."""
    folder.mkdir(parents=True)
    (folder / "vepo_run.json").write_text('{"settings": {}}')
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "trainer_state.json").write_text(f'{{"global_step": {steps}, "log_history": []}}')
    return folder


@pytest.mark.parametrize(("case", "argv", "needle"), [
    ("T24", ["--selection_strategy", "full", "--selection_mode", "weight"], "full is GRPO exactly"),
    ("T48", ["--reward_weights", "0", "0", "0"], "cannot learn"),
    ("R02", ["--resume_from_checkpoint", ""], "resume_from_checkpoint is empty"),
    ("T40", ["--resume_from_checkpoint", "FINISHED"], "a run's folder"),
    ("T40b", ["--resume_from_checkpoint", "FINISHED/checkpoint-60"], "is at step 60"),
])  # fmt: skip
def test_settings_that_train_a_wrong_result_are_refused(case, argv, needle, tmp_path, capsys):
    """T24 doubled GRPO's policy-gradient term; T48 trained a run that could not learn; R02 trained from scratch;
    T40 "resumed" another run's finished folder into a new one, trained 0 steps and reported its 60."""
    finished = finished_run(tmp_path / "finished", 60)
    checkpoint = finished_run(finished / "checkpoint-60", 60)
    (checkpoint / "vepo_run.json").unlink()
    argv = [arg.replace("FINISHED", str(finished)) for arg in argv]
    code, err = run(["train", "--config", TINY_RECIPE, "--output_dir", str(tmp_path / "new"), *argv], capsys)
    assert_one_error_line(code, err, "train", needle)
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("command", ["train", "inspect"])
def test_a_recipe_with_a_key_twice_or_a_null_output_dir_is_refused(command, tmp_path, capsys):
    """Y13: `output_dir: null` trained into TRL's trainer_output/; a key written twice kept the last silently."""
    text = Path(TINY_RECIPE).read_text()
    twice = tmp_path / "twice.yaml"
    twice.write_text(text + "selection_ratio: 0.5\n")
    base = {"train": [], "inspect": ["--model", str(Place(tmp_path).root / "model"), "--dataset", "synthetic"]}
    code, err = run([command, *base[command], "--config", str(twice)], capsys)
    assert_one_error_line(code, err, command, "'selection_ratio' is written twice")
    if command == "train":
        null = tmp_path / "null.yaml"
        null.write_text(re.sub(r"(?m)^output_dir: .*$", "output_dir: null", text))
        code, err = run(["train", "--config", str(null)], capsys)
        assert_one_error_line(code, err, "train", "output_dir is null")
        assert not Path("trainer_output").exists()


@pytest.mark.parametrize("command", ["inspect", "analyze"])
def test_records_never_replace_a_file_the_command_did_not_write(command, tmp_path, capsys):
    """I20, A07: `--save_records` onto the user's 16-row data file replaced it with records."""
    place = Place(tmp_path)
    data = data_file(tmp_path, "keep.jsonl", [ROW] * 16)
    before = Path(data).read_bytes()
    argv = [command, "--model", str(place.root / "model"), "--dataset", "synthetic", "--save_records", data]
    code, err = run(argv + (["--output_dir", str(tmp_path / "out")] if command == "analyze" else []), capsys)
    assert_one_error_line(code, err, command, "--save_records", "never replace another file")
    assert Path(data).read_bytes() == before


def test_a_second_plot_never_replaces_another_plots_files(tmp_path, capsys):
    """P14: `plot A --output_dir o && plot B --output_dir o` replaced A's PNGs without a word."""
    runs = []
    for name in ("a", "b"):
        run_dir = tmp_path / name
        run_dir.mkdir()
        entries = [{"step": s, "loss": 0.5 / s, "reward": 0.1 * s} for s in (1, 2, 3)]
        (run_dir / "trainer_state.json").write_text(json.dumps({"log_history": entries}))
        runs.append(str(run_dir))
    out = tmp_path / "plots"
    assert cli_main(["plot", runs[0], "--output_dir", str(out)]) is None
    first = snapshot(out)
    code, err = run(["plot", runs[1], "--output_dir", str(out)], capsys)
    assert_one_error_line(code, err, "plot", "never replaced by another run's")
    assert snapshot(out) == first
    assert cli_main(["plot", runs[0], "--output_dir", str(out)]) is None  # the same run drawn again: its own


def test_a_processor_of_another_model_is_refused(tmp_path):
    """API_a12: a Qwen2.5-VL model trained with a Qwen3-VL processor (another patch size) without a word."""
    from transformers import AutoProcessor

    from vepo_trl.families import check_processor_of
    from vepo_trl.local_models import resolve_model_name

    qwen25, qwen3 = (resolve_model_name(name) for name in ("tiny-qwen2.5-vl", "tiny-qwen3-vl"))
    config = json.loads((Path(qwen25) / "config.json").read_text())
    other = AutoProcessor.from_pretrained(qwen3)
    with pytest.raises(ValueError, match="processing_class is a Qwen3VLProcessor, and the model is a qwen2_5_vl"):
        check_processor_of(argparse.Namespace(model_type=config["model_type"]), other)
    check_processor_of(argparse.Namespace(model_type=config["model_type"]), AutoProcessor.from_pretrained(qwen25))


UNREAD_CASES = [  # the audit's accepted-and-ignored cases, by command, each refused naming its setting
    ("T25", ["train", "--selection_samples_steps", "0", "--selection_samples_count", "5"], "--selection_samples_count"),
    ("T27", ["train", "--vllm_gpu_memory_utilization", "0.5"], "--vllm_gpu_memory_utilization"),
    ("T30", ["train", "--save_steps", "5", "--save_strategy", "no"], "--save_steps"),
    ("T31b", ["train", "--logging_strategy", "no", "--logging_steps", "3"], "--logging_steps"),
    ("T32", ["train", "--max_eval_samples", "5"], "--max_eval_samples"),
    ("T38", ["train", "--hub_strategy", "end"], "--hub_strategy"),
    ("E09", ["eval", "--backend", "transformers", "--tensor_parallel_size", "2"], "--tensor_parallel_size"),
    ("E10", ["eval", "--backend", "transformers", "--gpu_memory_utilization", "0.5"], "--gpu_memory_utilization"),
    ("E21", ["eval", "--protocol", "rule", "--judge_api_key_env", "NOPE"], "--judge_api_key_env NOPE"),
    ("E25", ["eval", "--hub_model_id", "me/x"], "--hub_model_id"),
    ("I12", ["inspect", "--greedy", "--sample_seed", "3"], "--sample_seed"),
    ("I22", ["inspect", "--perturbation", "diffusion", "--noise_sigma", "3"], "--noise_sigma"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "argv", "needle"), UNREAD_CASES, ids=[case for case, *_ in UNREAD_CASES])
def test_the_audits_unread_settings_are_refused(case, argv, needle, tmp_path, capsys):
    place = Place(tmp_path)
    base = {"train": ["--config", TINY_RECIPE, "--output_dir", str(tmp_path / "out")],
            "eval": ["--model", str(place.root / "model"), "--benchmarks", "synthetic"],
            "inspect": ["--model", str(place.root / "model"), "--dataset", "synthetic"]}[argv[0]]  # fmt: skip
    code, err = run([argv[0], *base, *argv[1:]], capsys)
    assert_one_error_line(code, err, argv[0], needle, "never reads it")


@pytest.mark.parametrize("extra", [
    ["--nope", "1"], ["--max_steps", "1e3"], ["--reward_funcs", "nope"], ["--vllm_server_port", "9001"],
    ["--selection_strategy", "full", "--noise_sigma", "3"], ["--dataset_name", "DUPKEY"], ["--max_step", "4"],
])  # fmt: skip
def test_refusals_that_need_no_model_come_before_torch_is_imported(extra, tmp_path):
    """69 one-line refusals took 2-61 s waiting for torch, transformers and TRL (or for every image to decode). Once
    a full parse has saved the declarations, each is said without importing torch."""
    env = {**os.environ, "VEPO_TRL_CACHE": str(run_cache_path(tmp_path)), "PYTHONPATH": str(REPO)}
    dupkey = data_file(tmp_path, "dup.jsonl", [BAD_FILES["F_dupkey.jsonl"][0][1]])
    script = (
        "import sys\nfrom vepo_trl.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit as exit:\n    print(exit.code, 'torch' in sys.modules)\n"
    )
    warm = ["train", "--config", TINY_RECIPE, "--help-all"]
    subprocess.run([sys.executable, "-c", script, *warm], capture_output=True, env=env, cwd=tmp_path, check=True)
    argv = ["train", "--config", TINY_RECIPE, "--output_dir", "out", *(dupkey if a == "DUPKEY" else a for a in extra)]
    result = subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert result.stdout.split() == ["2", "False"], result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def run_cache_path(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def test_trl_negated_flags_and_recipe_nulls_pass_the_early_check(tmp_path, capsys):
    """TRL's `--no_X` for a flag that defaults to true, and a recipe's `key: null`, are not settings given and unread;
    `--dataset_name paper_mix --eval_dataset_name lab` reads the bounds through its training data."""
    place = Place(tmp_path)
    assert run(["train", "--config", TINY_RECIPE, "--help-all"], capsys)[0] == 0  # saves the declarations
    recipe = tmp_path / "nulls.yaml"
    recipe.write_text(Path(TINY_RECIPE).read_text() + "hub_revision: null\nlora_target_modules: null\n")
    for argv in (
        ["--config", TINY_RECIPE, "--no_freeze_vision_tower"],
        ["--config", str(recipe)],
        ["--config", TINY_RECIPE, "--dataset_name", "synthetic", "--eval_dataset_name", "lab",
         "--eval_strategy", "steps", "--eval_steps", "1", "--min_pixels", "3136"],
    ):  # fmt: skip
        code, err = run(["train", *argv, "--output_dir", str(place.root / "out")], capsys)
        assert code == "reached", (argv, err)
