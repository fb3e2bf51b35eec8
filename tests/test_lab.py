"""The laptop lab: tasks whose answers are in the pixels, the warm start's cache, and `vepo-trl lab --quick`."""

import json
import random
import time

import numpy as np
import pytest

from vepo_trl.lab.run import decision_token_mask
from vepo_trl.lab.tasks import (
    COLOURS,
    DISTRACTOR,
    MAX_COUNT,
    answer_token_positions,
    make_lab_sample,
    make_rl_dataset,
    make_sft_dataset,
    render_response,
)
from vepo_trl.rewards import accuracy_reward, format_reward


def _components(mask: np.ndarray) -> int:
    """4-connected components of a boolean image (a plain flood fill)."""
    seen = np.zeros_like(mask)
    count = 0
    for y, x in zip(*np.nonzero(mask)):
        if seen[y, x]:
            continue
        count += 1
        stack = [(y, x)]
        seen[y, x] = True
        while stack:
            cy, cx = stack.pop()
            for ny, nx in ((cy + 1, cx), (cy - 1, cx), (cy, cx + 1), (cy, cx - 1)):
                if 0 <= ny < mask.shape[0] and 0 <= nx < mask.shape[1] and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    stack.append((ny, nx))
    return count


@pytest.mark.parametrize("seed", range(12))
def test_count_answer_is_the_number_of_circles_in_the_pixels(seed):
    sample = make_lab_sample("count", seed)
    pixels = np.asarray(sample.image)
    assert sample.image.size == (84, 84)
    drawn = (pixels != 255).any(-1)
    assert _components(drawn) == int(sample.answer)
    assert 1 <= int(sample.answer) <= MAX_COUNT


@pytest.mark.parametrize("seed", range(12))
def test_colour_answer_is_the_square_colour_in_the_pixels(seed):
    sample = make_lab_sample("colour", seed)
    pixels = np.asarray(sample.image)
    x0, y0, x1, y1 = sample.boxes[0]
    assert tuple(pixels[(y0 + y1) // 2, (x0 + x1) // 2]) == COLOURS[sample.answer]
    # The only saturated colour in the image is the square's: the distractors are grey
    others = {tuple(p) for p in pixels.reshape(-1, 3)} - {(255, 255, 255), DISTRACTOR, COLOURS[sample.answer]}
    assert not any(colour in others for colour in COLOURS.values())


def test_samples_are_a_pure_function_of_the_seed():
    a, b = make_lab_sample("count", 7), make_lab_sample("count", 7)
    assert a.answer == b.answer and a.image.tobytes() == b.image.tobytes()


def test_responses_vary_in_wording_and_earn_full_reward():
    rng = random.Random(0)
    texts = {render_response("count", "3", rng) for _ in range(60)}
    assert len(texts) > 5  # interchangeable openers and nouns: linguistic entropy
    for text in texts:
        assert "3" in text.split("</think>")[0]  # the image-decided token sits in the reasoning
    answers = ["3"] * len(texts)
    assert format_reward(list(texts)) == [1.0] * len(texts)
    assert accuracy_reward(list(texts), answer=answers) == [1.0] * len(texts)


def test_datasets_have_trl_columns():
    sft = make_sft_dataset(4)
    assert set(sft.column_names) >= {"prompt", "completion", "images"}
    rl = make_rl_dataset(4)
    assert set(rl.column_names) >= {"prompt", "images", "answer"}
    assert {row["kind"] for row in make_rl_dataset(4, kinds=("count", "colour"))} == {"count", "colour"}


def test_answer_and_decision_tokens():
    tokens = ["<think>", "I", " see", " 4", " dots", ".</think>", " The", " answer", " is", " \\boxed{", "4", "}"]
    assert answer_token_positions(tokens, "4") == [3, 10]
    assert [i for i, d in enumerate(decision_token_mask(tokens)) if d] == [3, 10]
    assert decision_token_mask([" red", " reddish", " blue."]) == [True, False, True]


def test_warm_start_builds_loads_and_is_cached(tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from vepo_trl.lab.warm_start import WarmStartConfig, warm_start_path

    config = WarmStartConfig(sft_rows=16, sft_steps=2, sft_batch_size=4, eval_rows=4)
    path = warm_start_path(config, cache_dir=tmp_path, log=lambda *a: None)
    report = json.loads((path / "lab_warm_start.json").read_text())
    assert report["key"] == config.key() and report["heldout_rows"] == 4
    model = AutoModelForImageTextToText.from_pretrained(path)
    processor = AutoProcessor.from_pretrained(path)
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert processor.tokenizer.eos_token == "<|im_end|>"
    start = time.perf_counter()
    assert warm_start_path(config, cache_dir=tmp_path) == path  # cached: no rebuild
    assert time.perf_counter() - start < 1.0


@pytest.mark.slow
def test_lab_quick_end_to_end(tmp_path, monkeypatch, capsys, shared_cache):
    from vepo_trl.cli import main

    monkeypatch.setenv("VEPO_TRL_CACHE", str(shared_cache))
    start = time.perf_counter()
    main(["lab", "--quick", "--output_dir", str(tmp_path / "lab")])
    seconds = time.perf_counter() - start
    lab = json.loads((tmp_path / "lab" / "lab.json").read_text())
    assert set(lab["summary"]) == {"full", "vepo"}
    for run in lab["runs"]:
        assert 0.0 <= run["accuracy_after"] <= 1.0 and run["steps"] >= 1
        assert run["curve"], "no reward was logged"
    # full trains on every token; a top-20% rule on about a fifth
    assert lab["summary"]["full"]["warm_start_selection"]["selected_fraction"] == 1.0
    assert 0.1 < lab["summary"]["vepo"]["warm_start_selection"]["selected_fraction"] < 0.4
    table = (tmp_path / "lab" / "lab.md").read_text()
    assert "| vepo |" in table and "| full |" in table
    assert (tmp_path / "lab" / "lab_curves.png").stat().st_size > 1000
    assert seconds < 180, f"vepo-trl lab --quick took {seconds:.0f} s"


def test_warm_start_demo_recipe_parses_to_the_lab_model_and_data():
    from pathlib import Path

    from vepo_trl.train import LAB_DATASET, LAB_MODEL, load_dataset_split, make_parser

    repo = Path(__file__).resolve().parents[1]
    recipe = repo / "recipes" / "tiny" / "config_lab_vepo.yaml"
    assert (repo / "vepo_trl" / "recipes" / "lab.yaml").read_text() == recipe.read_text()
    script_args, training_args, model_args = make_parser().parse_args_and_config(["--config", str(recipe)])
    assert model_args.model_name_or_path == LAB_MODEL and script_args.dataset_name == LAB_DATASET
    assert training_args.reward_weights == [0.9, 0.1] and training_args.selection_strategy == "vepo"
    script_args.synthetic_rows = 4
    rows = load_dataset_split(LAB_DATASET, "train", script_args, training_args.seed, None)
    assert len(rows) == 4 and set(rows.column_names) == {"prompt", "images", "answer"}
