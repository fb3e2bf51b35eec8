"""Bad values refused from one table (`vepo_trl.validation`), through the real command line: one line naming the flag,
exit 2, no traceback, nothing loaded and nothing in the output folder changed. The three inputs a newcomer hit first
(`--max_completion_length 0`, `--per_device_train_batch_size 0`, a model family VEPO has no adapter for) ended in
tracebacks after the model loaded. Generated cases per field: `VEPO_HYPOTHESIS_EXAMPLES` (default 1; more for a
longer search)."""

import dataclasses
import importlib.util
import os
import re
from pathlib import Path

import pytest
import transformers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trl import ModelConfig

from vepo_trl.config import VEPOConfig
from vepo_trl.families import NOT_YET
from vepo_trl.train import VEPOScriptArguments
from vepo_trl.validation import COMBINATIONS, RANGES, rules_for

from ..support import REPO, TINY_RECIPE, assert_one_error_line, run_cli


pytestmark = pytest.mark.usefixtures("nothing_loads")
EXAMPLES = int(os.environ.get("VEPO_HYPOTHESIS_EXAMPLES", "1"))
CLASSES = (VEPOConfig, VEPOScriptArguments, ModelConfig)
RULES = rules_for(*CLASSES)


def train_argv(output_dir, *flags):
    """`vepo-trl train` on the tiny recipe into `output_dir`, with `flags`."""
    return ["train", "--config", TINY_RECIPE, "--output_dir", str(output_dir), *flags]


def settable_fields():
    return {f.name for cls in CLASSES for f in dataclasses.fields(cls) if f.init}


def test_the_table_names_real_fields_and_covers_most_of_them():
    fields = settable_fields()
    assert set(RANGES) <= fields, set(RANGES) - fields
    from vepo_trl.commands.eval import EvalOptions
    from vepo_trl.commands.plot import PlotOptions
    from vepo_trl.validation import FACTS

    declared = {
        name: {f.name for f in dataclasses.fields(cls)} for name, cls in (("eval", EvalOptions), ("plot", PlotOptions))
    }
    for combination in COMBINATIONS:  # a train row's fields are its settings or facts of the built run
        known = (
            set().union(*(declared[c] for c in combination.commands))
            if combination.commands != ("train",) and combination.commands
            else fields | set(FACTS)
        )
        assert set(combination.fields) <= known, combination.fields
    # Every int / float field has at least its type's rule; 183 of the 247 fields have one (the rest are free text,
    # mappings and names checked where they are used: output_dir, dataset_name, model_name_or_path, reward_funcs, ...)
    assert len(RULES) >= 180, len(RULES)
    numeric = {
        f.name
        for cls in CLASSES
        for f in dataclasses.fields(cls)
        if f.init and any(t in str(f.type) for t in ("int", "float")) and "dict" not in str(f.type)
    }
    assert numeric - {"pad_to_multiple_of"} <= set(RULES), sorted(numeric - set(RULES))


@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [
        ("--max_completion_length", "0", "whole number >= 1"),
        ("--per_device_train_batch_size", "0", "whole number >= 1"),
        ("--num_generations", "0", ">= 2"),
        ("--logging_steps", "-1", ">= 0"),
        ("--max_steps", "-2", "-1"),
        ("--top_p", "1.5", "(0, 1]"),
        ("--beta", "nan", ">= 0"),
        # From the newest newcomer findings: each ran into a traceback or ran silently
        ("--seed", "-1", "0..2**32-1"),
        ("--learning_rate", "inf", ">= 0"),
        ("--temperature", "inf", "above 0"),
        ("--max_grad_norm", "nan", ">= 0"),
        ("--selection_ratio", "2", "(0, 1]"),
        ("--vllm_gpu_memory_utilization", "1.5", "(0, 1]"),
        ("--lora_r", "0", "whole number >= 1"),
        ("--deepspeed", "nowhere.json", "does not exist"),
        # transformers' dict fields: text that is neither a file nor JSON of a mapping ran into FileNotFoundError,
        # deepspeed's PackageNotFoundError, or was kept as text to fail where the run first read it
        ("--accelerator_config", "x", "does not exist"),
        ("--deepspeed", "x", "does not exist"),
        ("--fsdp_config", "x", "does not exist"),
        ("--generation_kwargs", "x", "must be a mapping"),
        ("--model_init_kwargs", "{bad", "not JSON"),
        ("--chat_template_kwargs", "[1]", "must be a mapping"),
    ],
)
def test_named_bad_values_end_in_one_line_before_anything_loads(tmp_path, capsys, flag, value, needle):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    for command in ("train", "demo"):
        argv = [command, "--output_dir", str(folder), flag, value]
        if command == "train":
            argv += ["--config", TINY_RECIPE]
        code, out, err = run_cli(argv, capsys)
        assert_one_error_line(code, err, None, flag, needle)
    assert sorted(p.name for p in folder.iterdir()) == ["keep.txt"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--reward_weights", "nan", "nan", "nan"], "finite numbers"),
        (["--reward_weights", "0.5", "0.5"], "one weight per reward function"),
        (["--generation_batch_size", "7", "--steps_per_generation", "None"], "multiple of --num_generations"),
        (["--min_pixels", "60000", "--max_pixels", "50000"], "min_pixels <= max_pixels"),
        (["--entropy_coef_min", "0.5", "--entropy_coef_max", "0.1"], "entropy_coef_min <= max"),
    ],
)
def test_combinations_are_refused_in_one_line(tmp_path, capsys, argv, needle):
    code, out, err = run_cli(train_argv(tmp_path / "out", *argv), capsys)
    assert_one_error_line(code, err, None, needle)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("model_type", sorted(NOT_YET))
def test_a_model_family_without_an_adapter_is_refused_before_its_weights_load(tmp_path, capsys, model_type):
    """Each model type TRL trains whose images VEPO cannot perturb yet (`families.NOT_YET`), from its real config."""
    refused = NOT_YET[model_type]
    config_class = getattr(transformers, refused.model_class.replace("ForConditionalGeneration", "Config"))
    model = tmp_path / model_type
    config_class().save_pretrained(model)
    (model / "model.safetensors").write_bytes(b"")  # an empty weight file: any weight load would fail loudly
    (model / "processor_config.json").write_text("{}")
    argv = train_argv(tmp_path / "out", "--model_name_or_path", str(model))
    code, out, err = run_cli(argv, capsys)
    # The refusal names what blocks the family
    assert_one_error_line(code, err, None, f"'{model_type}' model", "no perturbation adapter", refused.blocker[:40], "qwen2.5-vl",
                   "--selection_strategy entropy")  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_wandb_without_a_key_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    """`--report_to wandb` on a machine not logged in (no key, no terminal to ask): wandb's callback raised its
    UsageError at the first step, a traceback after the model had loaded; wandb's own login runs before that now."""
    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no wandb settings of this machine's user
    monkeypatch.setenv("NETRC", str(tmp_path / ".netrc"))
    code, out, err = run_cli(train_argv(tmp_path / "out", "--report_to", "wandb"), capsys)
    assert_one_error_line(code, err, None, "--report_to wandb", "wandb login", "WANDB_MODE=offline")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["model", "adapter"])
def test_a_folder_without_its_processor_is_refused_before_its_weights_load(tmp_path, capsys, kind):
    folder = tmp_path / kind
    folder.mkdir()
    (folder / ("config.json" if kind == "model" else "adapter_config.json")).write_text('{"model_type": "qwen2_5_vl"}')
    (folder / ("model.safetensors" if kind == "model" else "adapter_model.safetensors")).write_bytes(b"")
    argv = train_argv(tmp_path / "out", "--model_name_or_path", str(folder))
    code, out, err = run_cli(argv, capsys)
    assert_one_error_line(code, err, None, f"the {kind} folder has no processor files")


def invalid_values(name, folder: Path) -> list[str]:
    """Values outside each rule, as a user would type them. Wrong types (text, an empty string, NaN, infinities, a
    fraction for a whole number) are invalid whatever the range; zero, negatives and huge values are kept where the
    rule's own range refuses them."""
    rule = RULES[name]
    if rule.kind in ("choice", "choice_or_bool"):
        return ["no-such-choice"]
    if rule.kind == "bool":
        return ["maybe", "2"]
    if rule.kind == "mapping_file":
        return [str(folder / "nowhere.json"), str(folder), "{not json", "[1, 2]"]
    if rule.kind == "mapping":
        return ["text", "{not json", "[1, 2]", "7"]
    if rule.kind == "numbers":
        return ["nan", "inf", "abc"]
    bad = ["nan", "inf", "-inf", "abc", ""]
    if rule.kind == "whole":
        bad.append("1.5")
    for value in (0, -1, -(10**12), 0.5, 2, 10**9, 2**33):
        if rule.kind == "whole" and not float(value).is_integer():
            continue
        if rule.test is not None and not rule.test(value):
            bad.append(str(value))
    return bad


@pytest.mark.parametrize("name", sorted(RULES))
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_generated_bad_values_are_refused_in_one_line(name, data, tmp_path, capsys):
    folder = tmp_path / "run"
    folder.mkdir(exist_ok=True)
    (folder / "keep.txt").write_text("mine")
    value = data.draw(st.sampled_from(invalid_values(name, tmp_path)))
    argv = train_argv(folder, f"--{name}", value)
    code, out, err = run_cli(argv, capsys)
    assert_one_error_line(code, err, None, name)
    assert sorted(p.name for p in folder.iterdir()) == ["keep.txt"]


def test_yaml_values_meet_the_same_rules(tmp_path, capsys):
    # A recipe bypasses argparse's type conversion: its values go through the same table
    recipe = tmp_path / "recipe.yaml"
    text = re.sub(r"(?m)^noise_step: .*$", "noise_step: 500.5", Path(TINY_RECIPE).read_text())
    assert "noise_step: 500.5" in text
    recipe.write_text(text)
    code, out, err = run_cli(["train", "--config", str(recipe), "--output_dir", str(tmp_path / "out")], capsys)
    assert_one_error_line(code, err, None, "--noise_step 500.5", "whole diffusion step")


def test_type_rules_are_checked_early_once_a_parse_saved_them(tmp_path):
    """The first full parse saves the type-derived rules to the cache; a later typo is refused before torch, TRL or
    transformers is imported (a fraction of a second instead of several)."""
    import subprocess
    import sys

    env = {**os.environ, "VEPO_TRL_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    script = (
        "import sys\nfrom vepo_trl.cli import main\n"
        f"try:\n    main(['train', '--config', {TINY_RECIPE!r}, '--output_dir', 'out', '--bf16', 'maybe'])\n"
        "except SystemExit as exit:\n    print(exit.code, 'torch' in sys.modules)\n"
    )
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)]
    runs.append(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path))
    (first, _), (second, _) = [(run.stdout.split(), run.stderr) for run in runs]
    assert first == ["2", "True"] and second == ["2", "False"], [run.stdout + run.stderr for run in runs]
    assert "--bf16" in runs[1].stderr and len(runs[1].stderr.strip().splitlines()) == 1
    assert list((tmp_path / "cache").glob("field-rules-*.json"))


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["eval", "--model", "tiny-qwen2.5-vl", "--benchmarks", "synthetic", "--output_dir", "AFILE"], "a file"),
        (["eval", "--model", "tiny-qwen2.5-vl", "--benchmarks", "synthetic", "--dtype", "float64x"], "invalid choice"),
        (["analyze", "--model", "tiny-qwen2.5-vl", "--dataset", "synthetic", "--output_dir", "AFILE"], "a file"),
        (["inspect", "--model", "tiny-qwen2.5-vl", "--dataset", "synthetic", "--output", "AFILE/p.html"], "a file"),
        (["plot", "RUN", "--dpi", "100000"], "--dpi 100000: must be a whole number of dots per inch in 20..1200"),
        (["plot", "RUN", "--output_dir", "AFILE"], "a file"),
    ],
)
def test_the_other_commands_refuse_newcomer_inputs_in_one_line(tmp_path, capsys, argv, needle):
    """From the newest newcomer findings: each ended in a traceback (FileExistsError, AttributeError, MemoryError)."""
    (tmp_path / "afile.txt").write_text("")
    run = tmp_path / "run"
    run.mkdir()
    (run / "trainer_state.json").write_text('{"log_history": [{"step": 1, "loss": 0.5}]}')
    argv = [str(tmp_path / "afile.txt") if a == "AFILE" else a for a in argv]
    argv = [
        a.replace("AFILE", str(tmp_path / "afile.txt")) if "AFILE" in a else (str(run) if a == "RUN" else a)
        for a in argv
    ]
    code, out, err = run_cli(argv, capsys)
    assert_one_error_line(code, err, None, needle)


def test_a_cache_that_is_a_file_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "afile.txt").write_text("")
    monkeypatch.setenv("VEPO_TRL_CACHE", str(tmp_path / "afile.txt"))
    code, out, err = run_cli(["demo", "--output_dir", str(tmp_path / "out")], capsys)
    assert_one_error_line(code, err, None, "VEPO_TRL_CACHE", "a file of that name exists")


def test_push_to_hub_without_the_hub_or_a_token_is_refused_before_training(tmp_path, capsys, monkeypatch):
    # Offline, it used to train and then die in a connection traceback (newcomer finding x01)
    from vepo_trl.local_models import hub_unreachable

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub_unreachable.cache_clear()
    argv = train_argv(tmp_path / "out", "--push_to_hub", "true")
    code, out, err = run_cli([*argv, "--hub_model_id", "someone/x"], capsys)
    assert_one_error_line(code, err, None, "push_to_hub is on, and HF_HUB_OFFLINE is set: run without it")
    # Reachable (a listening port on 127.0.0.1 as the endpoint) but no token anywhere
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
            monkeypatch.delenv(variable, raising=False)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.setattr("huggingface_hub.get_token", lambda: None)
        hub_unreachable.cache_clear()
        code, out, err = run_cli([*argv, "--hub_model_id", "someone/x"], capsys)
        hub_unreachable.cache_clear()
    assert_one_error_line(code, err, None, "no Hugging Face token is set")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["--use_peft", "--lora_r", "8"],  # a bare bool flag is true, as transformers' parser reads it
        ["--bf16=false"],
        ["--generation_kwargs", '{"top_k": 5}'],  # inline JSON, which transformers parses
        ["--accelerator_config", '{"split_batches": false}'],
        ["--top_entropy_quantile", "0", "--selection_strategy", "full"],
        ["--save_total_limit", "0"],
    ],
)
def test_valid_values_are_not_refused_early(tmp_path, capsys, argv, monkeypatch):
    """The early check must never refuse what the parsers take (with its type-rules cache present)."""
    from vepo_trl.validation import early_rules, precheck

    monkeypatch.setenv("VEPO_TRL_CACHE", str(tmp_path / "cache"))
    from vepo_trl.validation import save_type_rules

    save_type_rules(RULES)
    precheck(argv, None, early_rules())  # no ValueError


def test_yaml_scalars_for_list_fields_count_as_one_item():
    from vepo_trl.validation import check_combinations

    check_combinations({"reward_funcs": "accuracy", "reward_weights": 1.0})  # no TypeError, no refusal
    with pytest.raises(ValueError, match="one weight per reward function"):
        check_combinations({"reward_funcs": "accuracy", "reward_weights": [0.5, 0.5]})


@pytest.mark.parametrize("form", ["inline", "base64"])
def test_a_deepspeed_config_without_the_package_is_refused_naming_the_install(form, tmp_path, capsys, monkeypatch):
    """Every form transformers reads (a file, inline JSON, accelerate's base64) needs the package: without it the run
    ended in `PackageNotFoundError` raised from transformers' version check. (The suite installs DeepSpeed for its
    ZeRO runs: here it is hidden.)"""
    import base64

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else find_spec(name, *a)
    )

    config = '{"zero_optimization": {"stage": 2}}'
    value = config if form == "inline" else base64.urlsafe_b64encode(config.encode()).decode()
    code, out, err = run_cli(train_argv(tmp_path / "out", "--deepspeed", value), capsys)
    assert_one_error_line(code, err, None, "--deepspeed", "the deepspeed package is not installed")
