"""Bad values refused from one table (`vepo_trl.config.TRAINING_VALUE_RULES`), through the real command line: one line
naming the flag, exit 2, no traceback, nothing loaded and nothing written. The three inputs a newcomer hit first
(`--max_completion_length 0`, `--per_device_train_batch_size 0`, a model family VEPO has no adapter for) ended in
tracebacks after the model loaded. Generated cases per field: `VEPO_HYPOTHESIS_EXAMPLES` (default 2)."""

import math
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vepo_trl.train as train_module
from vepo_trl.config import TRAINING_VALUE_RULES, VEPOConfig

from .test_trust import run_cli


REPO = Path(__file__).resolve().parents[1]
TINY_RECIPE = str(REPO / "recipes" / "tiny" / "config_vepo.yaml")
EXAMPLES = int(os.environ.get("VEPO_HYPOTHESIS_EXAMPLES", "2"))


@pytest.fixture(autouse=True)
def nothing_loads(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("VEPO_TRL_CACHE", str(tmp_path_factory.getbasetemp() / "vepo-cache"))

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(train_module, "load_model", refuse)
    monkeypatch.setattr(train_module, "load_dataset_split", refuse)


def assert_refused(code, err, *needles):
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("vepo-trl ") and ": error: " in lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_the_table_names_real_fields_only():
    fields = VEPOConfig.__dataclass_fields__
    assert set(TRAINING_VALUE_RULES) <= set(fields), set(TRAINING_VALUE_RULES) - set(fields)


@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [
        ("--max_completion_length", "0", "whole number >= 1"),
        ("--per_device_train_batch_size", "0", "whole number >= 1"),
        ("--num_generations", "0", ">= 2"),
        ("--logging_steps", "-1", "above 0"),
        ("--max_steps", "0", "-1"),
        ("--top_p", "1.5", "(0, 1]"),
        ("--beta", "nan", ">= 0"),
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
        assert_refused(code, err, flag, needle)
    assert sorted(p.name for p in folder.iterdir()) == ["keep.txt"]


def test_a_model_family_without_an_adapter_is_refused_before_its_weights_load(tmp_path, capsys):
    from transformers import LlavaConfig

    model = tmp_path / "llava-1.5"
    LlavaConfig().save_pretrained(model)  # config.json only: any weight load would fail loudly
    argv = [
        "train",
        "--config",
        TINY_RECIPE,
        "--output_dir",
        str(tmp_path / "out"),
        "--model_name_or_path",
        str(model),
    ]
    code, out, err = run_cli(argv, capsys)
    assert_refused(code, err, "'llava' model", "no perturbation adapter", "qwen2.5-vl", "--selection_strategy entropy")
    assert not (tmp_path / "out").exists()


def _invalid_values(name):
    """Values outside each rule: zero and negatives, NaN and infinities, huge negatives, fractions for whole numbers."""
    test, _, whole = TRAINING_VALUE_RULES[name]
    candidates = [0, -1, -(10**12), math.nan, math.inf, -math.inf, 1.5, 0.5, 2.0, 10**9]
    bad = []
    for value in candidates:
        if isinstance(value, float) and not math.isfinite(value):
            bad.append(value)
        elif whole and not float(value).is_integer():
            bad.append(value)
        elif not test(value):
            bad.append(value)
    return bad


@pytest.mark.parametrize("name", sorted(TRAINING_VALUE_RULES))
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_generated_bad_values_are_refused_in_one_line(name, data, tmp_path, capsys):
    bad = _invalid_values(name)
    assert bad, name
    value = data.draw(st.sampled_from(bad))
    text = "nan" if isinstance(value, float) and math.isnan(value) else str(value)
    argv = ["train", "--config", TINY_RECIPE, "--output_dir", str(tmp_path / "out"), f"--{name}", text]
    code, out, err = run_cli(argv, capsys)
    assert_refused(code, err, f"--{name}")
    assert not (tmp_path / "out").exists()
