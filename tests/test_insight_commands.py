"""`inspect`, `analyze` and `plot` on the tiny model: the signals equal a full-logits reference, the commands write
their files, and bad input stops with one line and exit code 2 before any model loads."""

import json

import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

from vepo_trl.builtin.tiny_models import build_tiny
from vepo_trl.cli import main
from vepo_trl.families import get_family, pixel_layout, supported_families
from vepo_trl.insight import load_records
from vepo_trl.insight import runs as commands
from vepo_trl.insight.signals import (
    SignalSettings,
    completion_signals,
    encode_prompt,
    perturb_prompt_pixels,
    sample_completions,
)
from vepo_trl.perturb import PixelLayout, perturb_pixel_values
from vepo_trl.scoring import reference_token_signals, select_tokens


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir).eval()
    return model, AutoProcessor.from_pretrained(tiny_model_dir)


def assert_signals_are_the_reference(example, row_index, clean, noisy, completion):
    """Row `row_index`'s signals equal `reference_token_signals` of its clean and perturbed full logits."""
    reference = reference_token_signals(clean, noisy, completion, temperature=0.8)
    n = len(completion)
    assert example.mask[row_index].sum() == n
    for name in ("entropy", "perturbed_entropy", "jsd", "logp", "perturbed_logp"):
        got = getattr(example.signals, name)[row_index, :n]
        torch.testing.assert_close(got, getattr(reference, name), atol=2e-4, rtol=1e-4, msg=name)


def test_signals_equal_a_full_logits_reference(tiny, visual_dataset):
    model, processor = tiny
    row = visual_dataset[0]
    prompt = encode_prompt(processor, row["prompt"], row["images"])
    completions = sample_completions(model, processor, prompt, 3, max_new_tokens=10, seed=1)
    completions[1] = completions[1][:4]  # a shorter one: right padding must not leak into the signals
    settings = SignalSettings(ratio=0.3, temperature=0.8, seed=5, step=2)
    example = completion_signals(model, processor, prompt, completions, settings, batch_size=2)

    # Reference: the model's own full logits on the clean and the perturbed image, one completion at a time
    perturbed_pixels = perturb_pixel_values(
        "diffusion", prompt["pixel_values"], prompt["image_grid_thw"],
        PixelLayout.from_image_processor(processor.image_processor), seed=5, step=2, noise_step=500,
    )  # fmt: skip
    for row_index, completion in enumerate(completions):
        ids = torch.tensor([completion])
        inputs = {
            "input_ids": torch.cat([prompt["input_ids"], ids], 1),
            "attention_mask": torch.ones(1, prompt["input_ids"].shape[1] + len(completion), dtype=torch.long),
            "image_grid_thw": prompt["image_grid_thw"],
            # Which tokens are image tokens: without it transformers 5.24 gives the image no M-RoPE positions
            "mm_token_type_ids": torch.cat([prompt["mm_token_type_ids"], torch.zeros_like(ids)], 1),
        }
        with torch.no_grad():
            clean = model(**inputs, pixel_values=prompt["pixel_values"]).logits[0, -len(completion) - 1 : -1]
            noisy = model(**inputs, pixel_values=perturbed_pixels).logits[0, -len(completion) - 1 : -1]
        assert_signals_are_the_reference(example, row_index, clean, noisy, ids[0])
    # The selection is scoring.select_tokens on those signals
    expected = select_tokens("vepo", example.signals, example.mask, ratio=0.3, alpha=0.7)
    assert torch.equal(example.selected, expected)


def test_inspect_records_and_rerender(tiny_model_dir, tmp_path, capsys):
    page, records_file = tmp_path / "page.html", tmp_path / "records.jsonl"
    main([
        "inspect", "--model", tiny_model_dir, "--dataset", "synthetic", "--index", "1", "--num_generations", "3",
        "--max_new_tokens", "12", "--k", "0.25", "--output", str(page), "--save_records", str(records_file),
    ])  # fmt: skip
    out = capsys.readouterr().out
    assert "Wrote" in out and "top-k JSD tokens" in out
    records = load_records(records_file)
    assert len(records) == 3 and {r.group for r in records} == {0}
    assert all(r.k == 0.25 and r.strategy == "vepo" and r.jsd is not None for r in records)
    # The synthetic row brings its answer: every completion has a reward and the paper's two reward values
    assert all(r.reward is not None and set(r.meta["rewards"]) == {"accuracy", "format"} for r in records)
    text = page.read_text()
    assert text.count('class="completion"') == 3 and "data:image/png;base64," in text
    assert sum(text.count(f'class="tok sel-{c}') for c in ("both", "run", "entropy", "none")) == sum(
        r.num_tokens for r in records
    )
    # The saved records render again without a model
    again = tmp_path / "again.html"
    main(["inspect", "--records", str(records_file), "--output", str(again)])
    assert again.read_text().count('class="completion"') == 3
    # I20: a second run's records are appended, as documented (they replaced the file)
    main([
        "inspect", "--model", tiny_model_dir, "--dataset", "synthetic", "--index", "2", "--num_generations", "2",
        "--max_new_tokens", "8", "--output", str(tmp_path / "page2.html"), "--save_records", str(records_file),
    ])  # fmt: skip
    assert "Appended 2 records" in capsys.readouterr().out
    assert [len(load_records(records_file))] == [5]


def test_inspect_given_responses_on_an_image_file(tiny_model_dir, visual_dataset, tmp_path):
    image = tmp_path / "figure.png"
    visual_dataset[2]["images"][0].save(image)
    page = tmp_path / "page.html"
    main([
        "inspect", "--model", tiny_model_dir, "--image", str(image), "--question", "How many circles?",
        "--response", "<think> 3 circles </think> \\boxed{3}", "--response", "\\boxed{3}", "--answer", "3",
        "--strategy", "entropy", "--output", str(page), "--max_pixels", "50176", "--min_pixels", "3136",
    ])  # fmt: skip
    text = page.read_text()
    assert text.count('class="completion"') == 2 and "How many circles?" in text
    assert "selection (entropy) only" in text
    # The first response is right and well formatted (0.9 + 0.1), the second right only (0.9)
    assert "reward <b>1.000</b>" in text and "reward <b>0.900</b>" in text


def test_analyze_writes_table_and_plots(tiny_model_dir, tmp_path, capsys):
    out_dir = tmp_path / "analysis"
    main([
        "analyze", "--model", tiny_model_dir, "--dataset", "synthetic", "--limit", "2", "--num_generations", "2",
        "--max_new_tokens", "12", "--output_dir", str(out_dir),
    ])  # fmt: skip
    summary = json.loads((out_dir / "analysis.json").read_text())
    assert summary["prompts"] == 2 and summary["responses"] == 4
    assert [row["ratio"] for row in summary["by_k"]] == [0.1, 0.2, 0.4, 0.8]
    for row in summary["by_k"]:
        assert 0.0 <= row["entropy_recall_of_jsd"] <= 1.0 and 0.0 <= row["selection_miss_rate"] <= 1.0
    assert "| 0.2 |" in capsys.readouterr().out
    for name in ("recall.png", "entropy_vs_jsd.png"):
        assert (out_dir / name).stat().st_size > 2000


def test_plot_command(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    entries = [{"step": s, "reward": s / 10, "vepo/top_jsd_missed_by_selection": 0.2} for s in (1, 2, 3)]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(e) for e in entries))
    main(["plot", str(run), "--dpi", "50"])
    assert (run / "plots" / "rewards.png").stat().st_size > 1000
    assert (run / "plots" / "miss_rates.png").exists() and not (run / "plots" / "signals.png").exists()
    assert "3 logged steps" in capsys.readouterr().out


@pytest.fixture
def no_model_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    # The command modules bind the name when first imported: patched there too, after importing them (a first import
    # under this patch would otherwise keep `refuse` for the rest of the session)
    from vepo_trl.commands import analyze as analyze_command
    from vepo_trl.commands import inspect as inspect_command

    for module in (commands, inspect_command, analyze_command):
        monkeypatch.setattr(module, "load_model", refuse)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["inspect", "--model", "/no/such/model", "--dataset", "synthetic"], "no such model folder"),
        (["inspect", "--model", "TINY", "--dataset", "synthetic", "--k", "0"], "must be in (0, 1]"),
        (["inspect", "--model", "TINY", "--dataset", "synthetic", "--alpha", "2"], "--alpha 2.0: must be in [0, 1]"),
        (
            ["inspect", "--model", "TINY", "--dataset", "synthetic", "--strategy", "nope"],
            "--strategy 'nope': must be a selection strategy",
        ),
        (
            ["inspect", "--model", "TINY", "--dataset", "synthetic", "--perturbation", "x"],
            "--perturbation 'x': must be a perturbation",
        ),
        (
            ["inspect", "--model", "TINY", "--dataset", "synthetic", "--noise_step", "1000"],
            "--noise_step 1000: must be a whole diffusion step",
        ),
        (["inspect", "--model", "TINY", "--dataset", "rows.jsonl", "--index", "1"], "rows.jsonl has 1 rows"),
        (["inspect", "--model", "TINY", "--dataset", "no_such_set"], "--dataset no_such_set"),
        (["inspect", "--model", "TINY"], "give exactly one source"),
        (["inspect", "--model", "TINY", "--image", "x.png"], "--image x.png: no such file"),
        (["inspect", "--model", "TINY", "--image", "figure.png"], "--image needs --question"),
        (["inspect", "--model", "TINY", "--image", "missing.png", "--question", "q"], "no such file"),
        (["inspect", "--model", "TINY", "--image", "NOTIMAGE", "--question", "q"], "not a readable image"),
        (["inspect", "--records", "missing.jsonl"], "no such file"),
        (["inspect", "--records", "NOTRECORDS"], "not valid JSON"),
        (["inspect", "--model", "TINY", "--dataset", "synthetic", "--reward_weights", "1"], "--reward_weights"),
        (["inspect", "--model", "TINY", "--dataset", "synthetic", "--num_generations", "0"], "--num_generations"),
        (["inspect", "--config", "missing.yaml", "--dataset", "synthetic"], "no such file"),
        (["inspect", "--bogus"], "unrecognized arguments"),
        (
            ["analyze", "--model", "TINY", "--dataset", "synthetic", "--ratios", "0.2", "1.5"],
            "--ratios 0.2 1.5: must be fractions in (0, 1]",
        ),
        (["analyze", "--model", "TINY", "--dataset", "synthetic", "--limit", "0"], "--limit"),
        (["analyze", "--model", "TINY"], "required: --dataset"),
        (["plot", "no_such_run"], "RUN_DIR no_such_run: no such file or folder"),
        (["plot", "RUNDIR", "RUNDIR", "--labels", "one"], "--labels has 1 names for 2 runs"),
        (["plot"], "required: RUN_DIR"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(argv, message, tmp_path, monkeypatch, capsys, no_model_loading):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "NOTIMAGE").write_text("plain text")
    Image.new("RGB", (56, 56), "white").save(tmp_path / "figure.png")
    (tmp_path / "rows.jsonl").write_text('{"problem": "<image>Find x.", "answer": "3", "images": ["figure.png"]}\n')
    (tmp_path / "NOTRECORDS").write_text("{not json")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "model" / "model.safetensors").write_bytes(b"")  # a stand-in: never loaded, its checks pass
    (tmp_path / "RUNDIR").mkdir()
    (tmp_path / "RUNDIR" / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n')
    argv = [str(tmp_path / "model") if a == "TINY" else a for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    # One error line, last (loading a data set may show its progress bars first)
    assert sum("error" in line for line in err) == 1, err
    assert err[-1].startswith(f"vepo-trl {argv[0]}: error: ") and message in err[-1], err[-1]


@pytest.mark.parametrize("command", ["inspect", "analyze", "plot"])
def test_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert f"vepo-trl {command}" in capsys.readouterr().out


def test_recipe_settings_and_names_agree_with_training():
    from vepo_trl.train import SYNTHETIC_DATASET

    assert commands.SYNTHETIC_DATASET == SYNTHETIC_DATASET
    recipe = {"selection_strategy": "vepo_kl", "selection_ratio": 0.3, "selection_alpha": 0.5, "seed": 7,
              "perturbation": "gaussian", "noise_sigma": 1.5, "temperature": 0.9}  # fmt: skip
    settings = SignalSettings.from_recipe(recipe, alpha=0.1)
    assert (settings.strategy, settings.ratio, settings.alpha, settings.seed) == ("vepo_kl", 0.3, 0.1, 7)
    assert (settings.perturbation, settings.noise_sigma, settings.temperature) == ("gaussian", 1.5, 0.9)
    # perturbation_seed wins over seed, as in VEPOConfig
    assert SignalSettings.from_recipe({"seed": 7, "perturbation_seed": 3}).seed == 3


def test_pixel_bounds_come_from_flags_then_recipe_then_paper():
    from argparse import Namespace

    recipe = {"min_pixels": 3136, "max_pixels": 50176}
    assert commands.pixel_bounds(Namespace(min_pixels=None, max_pixels=None), recipe) == recipe
    assert commands.pixel_bounds(Namespace(min_pixels=784, max_pixels=None), recipe) == {
        "min_pixels": 784,
        "max_pixels": 50176,
    }
    assert commands.pixel_bounds(Namespace(min_pixels=None, max_pixels=None), {}) == {
        "min_pixels": 262_144,
        "max_pixels": 1_000_000,
    }
    with pytest.raises(commands.UsageError, match="exceeds"):
        commands.pixel_bounds(Namespace(min_pixels=9000, max_pixels=4000), {})


# ---------------------------------------------------------------------------------------------------------------------
# Every family: the signals outside training read each family's own image inputs
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", supported_families())
def test_signals_equal_a_full_logits_reference_on_every_family(family, visual_dataset):
    """`inspect` / `analyze`'s signals on each family's tiny model equal its own full logits, one completion at a
    time, with its processor's image inputs (grids, sizes, pixel masks, token types) and the perturbation the
    trainer applies."""
    model, processor = build_tiny(family)
    model.eval()
    row = visual_dataset[0]
    prompt = encode_prompt(processor, row["prompt"], row["images"])
    completions = sample_completions(model, processor, prompt, 2, max_new_tokens=6, seed=1)
    completions[1] = completions[1][:3]
    settings = SignalSettings(ratio=0.3, temperature=0.8, seed=5, step=2)
    example = completion_signals(model, processor, prompt, completions, settings, batch_size=2)
    perturbed = perturb_prompt_pixels(prompt, pixel_layout(model.config, processor.image_processor), settings,
                                      get_family(family))  # fmt: skip
    assert not torch.equal(perturbed, prompt["pixel_values"])
    for row_index, completion in enumerate(completions):
        ids = torch.tensor([completion])
        inputs = {**prompt, "input_ids": torch.cat([prompt["input_ids"], ids], 1)}
        inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
        for key in ("token_type_ids", "mm_token_type_ids"):
            if key in prompt:  # text after the prompt; PaliGemma's completion is its causal suffix (type 1)
                suffix = int(key == "token_type_ids" and get_family(family).prefix_lm)
                inputs[key] = torch.cat([prompt[key], torch.full_like(ids, suffix)], 1)
        with torch.no_grad():
            clean = model(**inputs).logits[0, -len(completion) - 1 : -1]
            noisy = model(**{**inputs, "pixel_values": perturbed}).logits[0, -len(completion) - 1 : -1]
        assert_signals_are_the_reference(example, row_index, clean, noisy, ids[0])


def test_inspect_and_analyze_run_on_other_families(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VEPO_TRL_CACHE", str(tmp_path / "cache"))
    page = tmp_path / "page.html"
    main([
        "inspect", "--model", "tiny-gemma3", "--dataset", "synthetic", "--index", "1", "--num_generations", "2",
        "--max_new_tokens", "8", "--output", str(page),
    ])  # fmt: skip
    assert page.read_text().count('class="completion"') == 2
    out_dir = tmp_path / "analysis"
    main([
        "analyze", "--model", "tiny-idefics2", "--dataset", "synthetic", "--limit", "2", "--num_generations", "2",
        "--max_new_tokens", "8", "--output_dir", str(out_dir),
    ])  # fmt: skip
    assert json.loads((out_dir / "analysis.json").read_text())["responses"] == 4
