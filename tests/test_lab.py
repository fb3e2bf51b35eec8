"""The laptop lab: tasks whose answers are in the pixels, the warm start's cache, and `vepo-trl lab --quick`."""

import hashlib
import json
import random
import time

import numpy as np
import pytest

from vepo_trl.builtin.lab_tasks import (
    COLOURS,
    DISTRACTOR,
    MAX_COUNT,
    answer_token_positions,
    make_lab_sample,
    make_rl_dataset,
    make_sft_dataset,
    render_response,
)
from vepo_trl.lab.experiment import decision_token_mask
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

    from vepo_trl.builtin.warm_start import WarmStartConfig, warm_start_path

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
    main(["lab", "--quick", "--output_dir", str(tmp_path / "lab")])
    # One line per run, never transformers' raw log dicts (`{'loss': ...}`)
    assert not [line for line in capsys.readouterr().out.splitlines() if line.lstrip().startswith("{'")]
    lab = json.loads((tmp_path / "lab" / "lab.json").read_text())
    assert set(lab["summary"]) == {"full", "vepo:0.2"}
    assert lab["settings"]["warm_start"]["task"] == "squares"
    runs = {run["strategy"]: run for run in lab["runs"]}
    for run in lab["runs"]:
        assert 0.0 <= run["accuracy_after"] <= 1.0 and run["steps"] >= 1
        assert run["curve"], "no reward was logged"
        assert len(run["correct_after"]) == lab["settings"]["eval_rows"]
    # full trains on every token; a top-20% rule on about a fifth, and only it runs perturbed forwards
    assert lab["summary"]["full"]["warm_start_selection"]["selected_fraction"] == 1.0
    assert 0.1 < lab["summary"]["vepo:0.2"]["warm_start_selection"]["selected_fraction"] < 0.4
    assert runs["full"]["tokens_trained"] == runs["full"]["completion_tokens"] > 0
    assert 0.1 < runs["vepo:0.2"]["tokens_trained"] / runs["vepo:0.2"]["completion_tokens"] < 0.4
    assert runs["full"]["perturbed_forwards"] == 0 < runs["vepo:0.2"]["perturbed_forwards"]
    assert [(c["a"], c["b"]) for c in lab["paired"]] == [("vepo:0.2", "full")]
    table = (tmp_path / "lab" / "lab.md").read_text()
    assert "| vepo:0.2 |" in table and "| full |" in table
    assert (tmp_path / "lab" / "lab_curves.png").stat().st_size > 1000


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


# ---------------------------------------------------------------------------------------------------------------------
# The squares task, the compared rules, the paired statistics
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(12))
def test_squares_answer_is_the_three_colours_left_to_right_in_the_pixels(seed):
    from vepo_trl.builtin.lab_tasks import SHADE_JITTER

    sample = make_lab_sample("squares", seed)
    pixels = np.asarray(sample.image).astype(int)
    names = sample.answer.split(", ")
    assert len(names) == len(sample.boxes) == 3
    for i, ((x0, y0, x1, y1), name) in enumerate(zip(sample.boxes, names)):
        assert i * 28 <= x0 and x1 < (i + 1) * 28  # each square in its own third (one column of merged tokens)
        fill = pixels[(y0 + y1) // 2, (x0 + x1) // 2]
        assert (abs(fill - np.array(COLOURS[name])) <= SHADE_JITTER).all()
        # the shade is still nearest to its own colour: the answer is readable from the pixels
        nearest = min(COLOURS, key=lambda c: ((fill - np.array(COLOURS[c])) ** 2).sum())
        assert nearest == name
        assert (pixels[y0 : y1 + 1, x0 : x1 + 1] == fill).all()  # one flat fill
    assert [b[0] for b in sample.boxes] == sorted(b[0] for b in sample.boxes)


def test_squares_responses_name_the_colours_in_order_and_are_graded_in_order():
    from vepo_trl.rewards import exact_match_reward

    rng = random.Random(0)
    texts = [render_response("squares", "purple, red, purple", rng) for _ in range(40)]
    assert len(set(texts)) > 20  # many interchangeable wordings around the same three decisions
    for text in texts:
        thought = text.split("</think>")[0]
        first, second, third = thought.index("first square"), thought.index("second"), thought.index("third")
        assert thought.index("purple", first) < second < thought.index("red", second) < third
        assert thought[third:].split()[2] == "purple" or thought[third:].split()[-1] == "purple."
        assert text.endswith(r"\boxed{purple, red, purple}")
    assert format_reward(texts) == [1.0] * len(texts)
    assert exact_match_reward(texts, answer=["purple, red, purple"] * len(texts)) == [1.0] * len(texts)
    # The order is the answer: math-verify (the accuracy reward) reads a comma list as a set, exact_match does not
    swapped = [r"<think>x</think> \boxed{red, purple, purple}"]
    assert accuracy_reward(swapped, answer=["purple, red, purple"]) == [1.0]
    assert exact_match_reward(swapped, answer=["purple, red, purple"]) == [0.0]
    assert exact_match_reward([r"\boxed{Purple,red , purple.}"], answer=["purple, red, purple"]) == [1.0]
    assert exact_match_reward([r"\boxed{purple, red}", "no box"], answer=["purple, red, purple"] * 2) == [0.0, 0.0]


def test_sft_label_noise_relabels_each_square():
    rows = make_sft_dataset(300, kinds=("squares",), confusions={"purple": ("blue", 1.0)})
    relabelled = 0
    for row in rows:
        truth = row["answer"].split(", ")
        label = row["completion"][0]["content"][0]["text"].split(r"\boxed{")[1].rstrip("}").split(", ")
        assert label == ["blue" if c == "purple" else c for c in truth]
        relabelled += truth.count("purple")
    assert relabelled > 50
    clean = make_sft_dataset(20, kinds=("squares",), confusions={})
    assert all(r["answer"] in r["completion"][0]["content"][0]["text"] for r in clean)


def test_the_first_lab_task_is_kept_as_it_was():
    """`--task colour` rebuilds the first lab: same warm-start recipe, tokenizer corpus and SFT rows."""
    from vepo_trl.builtin.lab_tasks import lab_corpus
    from vepo_trl.builtin.warm_start import WarmStartConfig
    from vepo_trl.lab.experiment import lab_settings

    config = WarmStartConfig.for_task("colour")
    assert (config.vocab_size, config.sft_rows, config.sft_steps, config.sft_learning_rate) == (400, 2048, 300, 2e-3)
    corpus = lab_corpus()
    assert len(corpus) == 4 + 40 * 9 and corpus[4].endswith(r"\boxed{1}") and corpus[8].endswith(r"\boxed{red}")
    # md5 of the corpus as the first lab built it (before tasks had names)
    assert hashlib.md5(repr(corpus).encode()).hexdigest() == "90a7124d9253b5f2e2adb480282da010"
    settings = lab_settings("colour")
    assert settings.strategies == ("full", "entropy", "vepo", "random") and settings.steps == 100
    assert [a.label for a in settings.arms()] == ["full", "entropy:0.2", "vepo:0.2", "random:0.2"]
    assert settings.learning_rate_of(settings.arms()[2]) == 3e-4 and settings.eval_tokens == 32
    sft = make_sft_dataset(8, kinds=("colour",))
    assert {r["kind"] for r in sft} == {"colour"}


def test_rules_parse_with_their_k():
    from vepo_trl.lab.experiment import Arm, parse_arm

    assert parse_arm("vepo", 0.2) == Arm("vepo", 0.2) and parse_arm("vepo:0.4", 0.2) == Arm("vepo", 0.4)
    assert parse_arm("full:0.4", 0.2).label == "full"
    assert Arm("entropy", 0.4).label == "entropy:0.4" and Arm("entropy", 0.4).slug == "entropy-k0.4"
    for bad in ("vepo:0", "vepo:1.2", "vepo:a"):
        with pytest.raises(ValueError, match="vepo:"):
            parse_arm(bad, 0.2)


def test_tokens_trained_are_summed_from_the_per_step_log():
    from vepo_trl.lab.experiment import training_compute

    curve = [
        {"step": 1, "completions/mean_length": 40.0, "vepo/selected_fraction": 0.25},
        {"step": 2, "completions/mean_length": 30.0, "vepo/selected_fraction": 0.5},
    ]
    assert training_compute(curve, completions_per_step=4) == {"completion_tokens": 280, "tokens_trained": 100}
    # An average over logging steps cannot be summed: no number rather than a wrong one
    assert training_compute([{**curve[0], "step": 5}, {**curve[1], "step": 10}], 4)["tokens_trained"] is None
    assert training_compute(curve[:1], 4) == {"completion_tokens": 160, "tokens_trained": 40}  # a one-step run


def test_paired_comparison_matches_hand_computed_values():
    from vepo_trl.lab.results import paired_comparison

    # differences 0.1, 0.0, 0.2: mean 0.1, sd 0.1, se 0.1/sqrt(3); t = sqrt(3) on 2 degrees of freedom, whose
    # two-sided p is 1 - t / sqrt(t^2 + 2) = 1 - sqrt(3/5); t_0.975(2) = 4.302653, t_0.8(2) = 1.060660
    c = paired_comparison({0: 0.5, 1: 0.6, 2: 0.7}, {0: 0.4, 1: 0.6, 2: 0.5, 3: 0.9})
    se = 0.1 / 3**0.5
    assert c["seeds"] == [0, 1, 2] and c["n"] == 3
    assert c["mean_difference"] == pytest.approx(0.1) and c["sd_difference"] == pytest.approx(0.1)
    assert c["t_test_p"] == pytest.approx(1 - (3 / 5) ** 0.5, rel=1e-6)
    assert c["ci95"] == pytest.approx((0.1 - 4.302653 * se, 0.1 + 4.302653 * se), rel=1e-6)
    assert c["detectable_at_80_power"] == pytest.approx((4.302653 + 1.060660) * se, rel=1e-5)
    assert (c["wins"], c["losses"]) == (2, 0)
    assert 0.0 < c["power_at_effect"] < 0.2  # 3 points against an se of 5.8: barely visible
    # Wilcoxon drops the zero difference: two positive ranks, P(W- = 0) = 1/4 each side, exact two-sided p = 0.5
    assert c["wilcoxon_p"] == pytest.approx(0.5)
    more = paired_comparison({s: 0.5 + 0.1 * (s % 3 == 1) for s in range(30)}, {s: 0.5 for s in range(30)})
    assert more["power_at_effect"] > c["power_at_effect"]


def test_power_is_the_two_sided_t_tests_against_a_simulated_reference():
    from vepo_trl.lab.results import mean_ci, paired_comparison

    # Differences with sd 0.04 over 8 seeds; the power against a true 3 points, by simulation of the paired t-test:
    # draw 8 differences ~ N(0.03, sd), reject when |mean / (s / sqrt 8)| > t_0.975(7) = 2.364624
    diffs = [0.03, -0.02, 0.05, 0.01, 0.07, -0.04, 0.02, 0.04]
    c = paired_comparison({i: 0.5 + d for i, d in enumerate(diffs)}, {i: 0.5 for i in range(8)})
    sd = float(np.std(diffs, ddof=1))
    rng = np.random.default_rng(0)
    draws = rng.normal(0.03, sd, size=(200_000, 8))
    t = draws.mean(1) / (draws.std(1, ddof=1) / np.sqrt(8))
    simulated = float((np.abs(t) > 2.364624).mean())
    assert c["power_at_effect"] == pytest.approx(simulated, abs=0.005)
    # the 95% interval of a mean over seeds, by hand: 0.6 +- t_0.975(2) * 0.1 / sqrt(3)
    assert mean_ci([0.5, 0.6, 0.7]) == pytest.approx((0.6 - 4.302653 * 0.1 / 3**0.5, 0.6 + 4.302653 * 0.1 / 3**0.5))
    # equal differences count as ties (accuracies over the same rows), whatever the float rounding
    ties = paired_comparison({0: 0.3, 1: 0.5, 2: 0.6}, {0: 0.2875, 1: 0.4875, 2: 0.5})
    assert ties["differences"][0] == ties["differences"][1]


def test_rules_are_compared_with_full_grpo_and_vepo_with_its_rivals_at_the_same_k():
    from vepo_trl.lab.results import comparison_pairs

    labels = ["full", "entropy:0.2", "vepo:0.2", "random:0.2", "entropy:0.4", "vepo:0.4"]
    pairs = comparison_pairs(labels)
    assert ("vepo:0.2", "entropy:0.2") in pairs and ("vepo:0.2", "random:0.2") in pairs
    assert ("vepo:0.4", "entropy:0.4") in pairs and ("vepo:0.4", "random:0.4") not in pairs
    assert ("vepo:0.2", "entropy:0.4") not in pairs
    assert {b for a, b in pairs if a != "vepo:0.2" and a != "vepo:0.4"} == {"full"}


def test_sweep_picks_each_rules_best_learning_rate():
    from vepo_trl.lab.results import sweep_table

    runs = [
        {"strategy": "full", "learning_rate": 1e-4, "accuracy_after": 0.5},
        {"strategy": "full", "learning_rate": 1e-4, "accuracy_after": 0.7},
        {"strategy": "full", "learning_rate": 3e-4, "accuracy_after": 0.65},
        {"strategy": "full", "learning_rate": 3e-4, "accuracy_after": 0.65},
        {"strategy": "vepo:0.2", "learning_rate": 1e-4, "accuracy_after": 0.2},
        {"strategy": "vepo:0.2", "learning_rate": 3e-4, "accuracy_after": 0.8},
    ]
    best, grid, table = sweep_table(runs)
    assert best == {"full": 3e-4, "vepo:0.2": 3e-4}
    assert grid["full"][1e-4] == [0.5, 0.7]
    assert "**65.0 ± 0.0 (65, 65)**" in table and "| vepo:0.2 |" in table
    # a tie goes to the lower learning rate
    tie = sweep_table([{**r, "accuracy_after": 0.5} for r in runs[:4]])[0]
    assert tie == {"full": 1e-4}


def test_cli_learning_rates_go_on_top_of_the_tasks(monkeypatch):
    import vepo_trl.lab.experiment as lab_run
    from vepo_trl.commands.lab import main

    seen = {}
    monkeypatch.setattr(lab_run, "run_lab", lambda settings, *a, **k: seen.setdefault("settings", settings))
    main(["--strategies", "full,vepo:0.4", "--learning_rates", "full=1e-3", "--seeds", "3,4"])
    settings = seen["settings"]
    # full as given, vepo:0.4 keeps the task's own (from its sweep), rules not run are left out of the record
    assert settings.learning_rates == {
        "full": 1e-3,
        "vepo:0.4": lab_run.TASK_SETTINGS["squares"]["learning_rates"]["vepo:0.4"],
    }
    assert settings.seeds == (3, 4) and [a.label for a in settings.arms()] == ["full", "vepo:0.4"]
    assert settings.learning_rate_of(settings.arms()[1]) == 7.5e-5

    seen.clear()
    main(["--strategies", "vepo", "--learning_rates", "vepo:0.20=2e-4"])  # one rule, however it is written
    assert seen["settings"].learning_rates == {"vepo:0.2": 2e-4}


def test_a_folder_keeps_its_runs_when_rules_change_and_refuses_a_run_at_another_learning_rate(tmp_path):
    from vepo_trl.errors import UsageError
    from vepo_trl.lab.experiment import LAB_RECORD, _lab_record_settings, lab_settings, plan_lab_folder
    from vepo_trl.run_folder import write_record

    first = lab_settings(strategies=("full", "vepo:0.2"), learning_rates={"full": 7.5e-5, "vepo:0.2": 7.5e-5})
    write_record(tmp_path, _lab_record_settings(first), LAB_RECORD)
    run = tmp_path / "runs" / "full-seed0"
    run.mkdir(parents=True)
    (run / "result.json").write_text(json.dumps({"learning_rate": 7.5e-5}))
    assert plan_lab_folder(lab_settings(), tmp_path, overwrite=False) == []  # all six rules: full's run is reused
    other = lab_settings(learning_rates={**lab_settings().learning_rates, "full": 1e-3})
    with pytest.raises(UsageError, match="full seed 0 trained at learning rate 7.5e-05 there, 0.001 here"):
        plan_lab_folder(other, tmp_path, overwrite=False)
    assert plan_lab_folder(other, tmp_path, overwrite=True) == [tmp_path / "runs"]


def test_runs_cut_by_the_time_cap_are_named_and_never_paired_with_longer_ones(tmp_path, monkeypatch):
    """On a busy machine the per-run cap stopped one run at 5 of 8 steps: the report said "8 steps each" and paired it
    with its rival's 8-step run. Now the pairs use equal-length runs and the report names the cut run."""
    from vepo_trl.lab import results as lab_results

    def run(rule, seed, accuracy, steps=8):
        return {"strategy": rule, "seed": seed, "accuracy_after": accuracy, "steps": steps}

    results = [run("vepo:0.2", 0, 0.6), run("vepo:0.2", 1, 0.7, steps=5), run("vepo:0.2", 2, 0.8),
               run("entropy:0.2", 0, 0.5), run("entropy:0.2", 1, 0.4), run("entropy:0.2", 2, 0.6)]  # fmt: skip
    rows, table = lab_results.paired_table(results)
    (row,) = rows
    assert row["seeds"] == [0, 2] and row["left_out_unequal_steps"] == [1]
    assert row["mean_difference"] == pytest.approx(0.15)  # (0.1 + 0.2) / 2: seed 1's 5-step run left out
    assert "Left out of the pairs, runs of unequal length: vepo:0.2 vs entropy:0.2 seed 1 (5 vs 8 steps)." in table
    note = lab_results._cut_note(results, {"steps": 8, "max_minutes": 5})
    assert "1 of 6 runs were stopped early by the 5-minute cap" in note and "vepo:0.2 seed 1 (5)" in note
    assert lab_results._cut_note([r for r in results if r["steps"] == 8], {"steps": 8, "max_minutes": 5}) == ""
