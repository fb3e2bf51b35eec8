"""The training script, the CLI and the model card, on the tiny model: what a recipe user and a newcomer run."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from tests.support import overridden
from vepo_trl import VEPOTrainer
from vepo_trl.cli import main as cli_main
from vepo_trl.train import main, make_parser

from .support import (
    REPO,
    TINY_RECIPE,
    free_port,
    tiny_cache,  # noqa: F401  (autouse: the tests build into the session's cache)
)


# A short run of the tiny recipe: a few steps, few rows
SHORT = ["--max_steps", "2", "--synthetic_rows", "16", "--logging_steps", "1"]


def parse_tiny(*args):
    return make_parser().parse_args_and_config(["--config", str(TINY_RECIPE), *args])


def test_a_python_callers_evaluation_schedule_is_not_refused(tmp_path):
    """TrainingArguments sets do_eval itself for an evaluation schedule: a Python caller's run (train.main checks
    the settings the caller gave, read off VEPOConfig before its __post_init__) is not refused for it."""
    from vepo_trl.preflight import check_arguments

    script_args, training_args, model_args = parse_tiny(
        "--output_dir", str(tmp_path / "run"), "--eval_strategy", "steps", "--eval_steps", "1",
        "--eval_dataset_name", "synthetic", *SHORT,
    )  # fmt: skip
    assert training_args.do_eval and "do_eval" not in training_args._given
    check_arguments(script_args, training_args, model_args)  # what train.main runs for a Python caller


def test_packaged_demo_recipe_is_the_repo_recipe():
    packaged = REPO / "vepo_trl" / "recipes" / "tiny.yaml"
    assert packaged.read_text() == Path(TINY_RECIPE).read_text()


def test_script_trains_two_steps_from_the_recipe(tmp_path):
    # Every response scored, zero advantage or not, so the JSD figures are logged whatever the random model samples
    script_args, training_args, model_args = parse_tiny(
        "--output_dir", str(tmp_path / "run"), "--score_zero_advantage_rows", "true", *SHORT
    )
    assert (script_args.dataset_name, model_args.model_name_or_path) == ("synthetic", "tiny-qwen2.5-vl")
    assert training_args.selection_strategy == "vepo" and training_args.reward_weights == [0.9, 0.1, 0.5]
    trainer = main(script_args, training_args, model_args)
    assert isinstance(trainer, VEPOTrainer) and trainer.state.global_step == 2
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2 and "vepo/selected_fraction" in logs[0] and "vepo/jsd_mean" in logs[0]
    # The vision tower was frozen (the paper's setting) and the language model was not
    assert all(not p.requires_grad for p in trainer.model.model.visual.parameters())
    assert all(p.requires_grad for p in trainer.model.model.language_model.parameters())
    # Saved model, processor, model card and metrics
    output = tmp_path / "run"
    reloaded = AutoModelForImageTextToText.from_pretrained(output)
    torch.testing.assert_close(reloaded.lm_head.weight, trainer.model.lm_head.weight)
    assert AutoProcessor.from_pretrained(output).chat_template == trainer.processing_class.chat_template
    assert json.loads((output / "train_results.json").read_text())["epoch"] > 0
    card = (output / "README.md").read_text()
    assert "VEPO" in card and "@misc{jin2026vepo" in card and "vepo/selected_fraction" in card


def test_model_card_has_citation_settings_and_no_token(tmp_path):
    # The push itself goes to a stand-in of the Hub's HTTP API in tests/e2e/test_hub_push.py; here, the card alone
    secret = "hf_" + "x" * 34
    args = parse_tiny(
        "--output_dir", str(tmp_path / "run"), "--hub_model_id", "me/tiny-vepo", "--hub_token", secret, *SHORT,
    )  # fmt: skip
    main(*args)
    card = (tmp_path / "run" / "README.md").read_text()
    assert secret not in card and "hf_" not in card
    assert "Entropy Is Not Enough" in card and "@software{vonwerra2020trl" in card
    assert "| `selection_strategy` | vepo |" in card and "| `selection_ratio` | 0.2 |" in card
    assert 'model="me/tiny-vepo"' in card
    assert "pipeline_tag: image-text-to-text" in card and "- vepo" in card


def test_demo_leaves_model_metrics_and_summary(tmp_path, capsys):
    output = tmp_path / "demo"
    cli_main(["demo", "--output_dir", str(output), *SHORT])
    for name in ("config.json", "model.safetensors", "tokenizer.json", "processor_config.json", "README.md"):
        assert (output / name).exists(), name
    metrics = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert sum("loss" in entry for entry in metrics) == 2
    summary = (output / "summary.md").read_text()
    # 2 steps of 8 completions (2 prompts x 4), each through exactly one perturbed forward unless its advantage is 0
    assert "with VEPO for 2 steps" in summary
    counts = re.search(
        r"(\d+) sampled completions each went through one perturbed-image forward(?: \((\d+) more)?", summary
    )
    assert counts and int(counts[1]) + int(counts[2] or 0) == 16
    assert "`diffusion` at noise step 500" in summary and "nan" not in summary
    out = capsys.readouterr().out
    assert summary in out
    # A progress bar and the summary, not every step's metric dict (those are in metrics.jsonl)
    assert "'loss'" not in out and "{'" not in out
    assert f"Saved to `{output}`" in summary


def test_cli_lists_strategies_and_rejects_unknown_commands(capsys):
    cli_main(["strategies"])
    out = capsys.readouterr().out
    assert "vepo_no_jsd" in out and "patch_blackout" in out and "[perturbed pass]" in out
    with pytest.raises(SystemExit) as error:
        cli_main(["trian"])
    assert error.value.code == 2 and "Unknown command 'trian'" in capsys.readouterr().err


def test_evaluate_alias_runs_the_eval_command(tiny_model_dir, tmp_path, capsys):
    output = tmp_path / "eval"
    cli_main(
        ["evaluate", "--model", tiny_model_dir, "--benchmarks", "synthetic", "--limit", "2", "--max_new_tokens", "8",
         "--min_pixels", "3136", "--max_pixels", "50176", "--output_dir", str(output)]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert "| Synthetic | 2 / 2 | 0.00 | rule |" in out  # a random model neither boxes nor answers
    rows = [json.loads(line) for line in (output / "synthetic.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and {"gold", "completion", "rule_correct"} <= set(rows[0])


def test_console_script_is_installed():
    result = subprocess.run(["vepo-trl", "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "vepo-trl demo" in result.stdout
    assert "vepo-trl <command> --help" in result.stdout and "--version" in result.stdout


def test_version(capsys):
    from vepo_trl import __version__

    cli_main(["--version"])
    assert capsys.readouterr().out == f"vepo-trl {__version__}\n"


def test_train_help_lists_config_and_vepo_options_first(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["train", "--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0
    # Short (TRL's full list is over 1,400 lines, behind --help-all), --config first, then VEPO's own options
    assert len(out.splitlines()) < 150
    assert out.index("--config") < out.index("--selection_strategy") < out.index("--help-all")
    for flag in ("--dataset_name", "--reward_funcs", "--selection_ratio", "--perturbation", "--noise_sigma"):
        assert flag in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--selection_ratio", "2"], "k, the fraction of tokens kept per response"),
        (["--model_name_or_path", "/missing"], "model_name_or_path '/missing': no such model folder"),
        (["--reward_funcs", "accuracy", "bogus"], "Unknown reward function(s) ['bogus']"),
        (
            ["--reward_funcs", "accuracy", "--reward_weights", "0.9", "0.1"],
            "one weight per reward function, and --reward_funcs has 1",
        ),
        (["--dataset_name", "/nowhere/data.jsonl"], "dataset_name '/nowhere/data.jsonl': no such data set or file"),
        (["--noise_step", "500.5"], "--noise_step 500.5: must be a whole diffusion step"),
        (["--config", "/nowhere.yaml"], "--config /nowhere.yaml: no such file"),
    ],
)
def test_user_errors_are_one_line_and_exit_2_before_loading(argv, message, capsys, monkeypatch):
    import vepo_trl.train as train_module

    # Nothing may load: the run would stop here if it got past the checks
    monkeypatch.setattr(train_module, "load_dataset_split", lambda *a, **k: pytest.fail("data loaded"))
    monkeypatch.setattr(train_module, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    base = [] if argv[0] == "--config" else ["--config", str(TINY_RECIPE)]
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["train", *base, *argv])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert message in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.startswith("vepo-trl train: error:")]) == 1


def test_train_reports_like_the_demo_and_replaces_an_earlier_report(tmp_path, capsys):
    output = tmp_path / "run"
    output.mkdir()
    (output / "summary.md").write_text("an earlier run\n")
    (output / "metrics.jsonl").write_text('{"loss": 9.9, "step": 99}\n')
    cli_main(["train", "--config", str(TINY_RECIPE), "--output_dir", str(output), *SHORT])
    out = capsys.readouterr().out
    summary = (output / "summary.md").read_text()
    assert summary.startswith("# vepo-trl train") and summary in out and f"Saved to `{output}`" in out
    assert "holds an earlier run" in out
    assert '"step": 99' not in (output / "metrics.jsonl").read_text()


@pytest.mark.parametrize(
    ("argv", "present", "absent"),
    [
        (
            ["--selection_strategy", "entropy"],
            ["with GRPO on each response's top-k entropy tokens", "No perturbed pass: strategy `entropy` needs none"],
            ["with VEPO", "perturbed-image forward", "JSD", "noise step"],
        ),
        (
            ["--selection_strategy", "full"],
            ["with plain GRPO", "No perturbed pass", "Tokens trained on:"],
            ["with VEPO", "k = ", "noise step"],
        ),
        (
            ["--perturbation", "gaussian", "--noise_sigma", "1.5"],
            ["`gaussian`, sigma 1.5 on normalised pixel values"],
            ["noise step"],
        ),
        (
            ["--noise_annealing", "true"],
            ["noise step annealed from"],
            [],
        ),
        (
            # Fewer steps than logging_steps: nothing logged, and the summary says so instead of printing nan
            ["--max_steps", "2", "--logging_steps", "5"],
            ["No training step was logged"],
            ["Reward (mean"],
        ),
    ],
)
def test_demo_summary_states_exactly_what_ran(tmp_path, argv, present, absent):
    cli_main(overridden(["demo", "--output_dir", str(tmp_path / "demo"), *SHORT], *argv))
    summary = (tmp_path / "demo" / "summary.md").read_text()
    assert "nan" not in summary.replace("annealed", "")
    for text in present:
        assert text in summary, (text, summary)
    for text in absent:
        assert text not in summary, (text, summary)


@pytest.mark.slow
def test_accelerate_launch_two_cpu_processes(tmp_path):
    """The ddp recipe config with 2 CPU processes (gloo) trains a few VEPO steps to the end."""
    output = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(REPO / "recipes" / "accelerate_configs" / "ddp.yaml"),
        # The config's multi-process launcher (torchrun); the recipe's use_cpu puts both ranks on gloo
        "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", str(free_port()),
        str(REPO / "vepo_trl" / "train.py"),
        "--config", str(TINY_RECIPE), "--output_dir", str(output),
        "--max_steps", "3", "--synthetic_rows", "16", "--logging_steps", "1",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    training_args = torch.load(output / "training_args.bin", weights_only=False)
    assert training_args.world_size == 2 and training_args.parallel_mode.value == "distributed"
    state = json.loads((output / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    logs = [entry for entry in state["log_history"] if "loss" in entry]
    assert len(logs) == 3 and all(0.2 <= entry["vepo/selected_fraction"] < 0.3 for entry in logs)
    # Two ranks of 2 prompts each: 4 of the 16 prompts per step
    assert [entry["epoch"] for entry in logs] == [0.25, 0.5, 0.75]
    assert (output / "model.safetensors").exists() and (output / "README.md").exists()
    # One run, one set of outputs: the launched script writes what `vepo-trl train` writes
    assert (output / "summary.md").is_file() and (output / "metrics.jsonl").is_file()
    assert "Traceback" not in result.stderr


def test_model_card_states_the_method_that_ran(tmp_path):
    # An entropy run used to be described as "trained with VEPO", with VEPO's noise settings on the card
    trainer = main(*parse_tiny("--output_dir", str(tmp_path / "run"), "--selection_strategy", "entropy", *SHORT))
    card = (tmp_path / "run" / "README.md").read_text()
    assert "trained with **VEPO**" not in card
    assert "GRPO on each response's top-k entropy tokens" in card and "No perturbed-image pass" in card
    assert "| `selection_strategy` | entropy |" in card
    assert "`noise_step`" not in card and "`perturbation`" not in card and "`selection_alpha`" not in card
    assert trainer.args.selection_strategy == "entropy"


@pytest.mark.parametrize(("family", "factor"), [("qwen2.5-vl", 28), ("qwen3-vl", 32), ("gemma3", 1)])
def test_training_images_are_resized_once_at_the_models_own_multiple(tmp_path, family, factor):
    """The loaders pre-resize images within min/max pixels at the model's own multiple (read off its processor
    config before it loads), so its processor never resamples them again; at Qwen2.5's 28 a Qwen3-VL image (32) was
    resampled twice."""
    import json

    from PIL import Image
    from transformers import AutoProcessor

    from vepo_trl.builtin.tiny_models import tiny_model_path
    from vepo_trl.local_models import image_factor_of
    from vepo_trl.train import VEPOScriptArguments, load_dataset_split

    model = str(tiny_model_path(family=family))
    assert image_factor_of(model) == factor
    Image.new("RGB", (500, 300), (120, 30, 200)).save(tmp_path / "a.png")
    (tmp_path / "rows.jsonl").write_text(json.dumps({"problem": "<image>Find x.", "answer": "3", "images": ["a.png"]}))
    script_args = VEPOScriptArguments(dataset_name=str(tmp_path / "rows.jsonl"), min_pixels=3136, max_pixels=200_000)
    rows = load_dataset_split(str(tmp_path / "rows.jsonl"), "train", script_args, 0, None, image_factor_of(model))
    image = rows[0]["images"][0]
    if factor == 1:
        assert image.size == (500, 300)  # within the bounds: not resampled at all
        return
    assert image.size[0] % factor == 0 and image.size[1] % factor == 0
    processor = AutoProcessor.from_pretrained(model)
    # The real checkpoints' pixel bounds (preprocessor_config.json of Qwen/Qwen2.5-VL-7B-Instruct: min_pixels 3136,
    # max_pixels 12845056; of Qwen/Qwen3-VL-8B-Instruct: size shortest_edge 65536, longest_edge 16777216), not the
    # tiny model's small ones
    bounds = {"qwen2.5-vl": (3136, 12845056), "qwen3-vl": (65536, 16777216)}[family]
    size = {"shortest_edge": bounds[0], "longest_edge": bounds[1]}
    grid = processor.image_processor(images=[image], size=size, return_tensors="pt")["image_grid_thw"][0]
    patch = factor // 2
    assert (int(grid[1]) * patch, int(grid[2]) * patch) == (image.size[1], image.size[0])  # the processor kept it
