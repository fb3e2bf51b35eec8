"""The benchmark scripts the README quotes keep running: each one's quick path, as a user starts it (a fresh
process). Figures are printed, never asserted against a time; what is asserted is that the script ran to its JSON
line and that its counts are the ones the method implies. (`bench_step.py` crashed unnoticed when `VEPOConfig`
refused the `learning_rate 0` it trains with.)"""

import json
import os
import subprocess
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]


def test_bench_step_quick_path_runs_and_reports_every_method(tmp_path):
    env = {**os.environ, "VEPO_TRL_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_step.py"), "--steps", "3", "--warmup", "1", "--rounds", "1",
         "--completion_length", "8"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(figures["round_median_step_seconds"]) == {"grpo", "entropy_top20", "vepo"}
    # The methods' forwards as their definitions say: one loss forward each, VEPO's perturbed one on top (skipped
    # for a batch whose completions all have a zero advantage)
    forwards = figures["loss_forwards_per_step"]
    assert forwards["grpo"] == forwards["entropy_top20"] == 1.0 and 1.0 <= forwards["vepo"] <= 2.0
    assert 0 <= figures["perturbed_forwards_per_completion"] <= 1


def _run(script, *argv, tmp_path, timeout=600):
    env = {**os.environ, "VEPO_TRL_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *argv], capture_output=True, text=True,
                            env=env, cwd=tmp_path, timeout=timeout)  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout


def test_bench_gpu_step_rotates_the_order_and_takes_ratios_within_rounds(tmp_path):
    out = _run("bench_gpu_step.py", "--tiny", "--steps", "1", "--warmup", "1", "--completions", "2",
               "--completion_length", "8", "16", "--image_side", "56", tmp_path=tmp_path)  # fmt: skip
    figures = json.loads(out.strip().splitlines()[-1])
    assert set(figures["by_length"]) == {"8", "16"} and figures["completion_length"] == 8
    for length in figures["by_length"].values():
        # Each method first once in three rounds; ratios per round, summarised
        assert [order[0] for order in length["orders"]] == ["grpo", "entropy_top20", "vepo"]
        for ratio in length["ratios"].values():
            assert len(ratio["rounds"]) == 3 and ratio["median"] == sorted(ratio["rounds"])[1]
        assert length["generation_seconds"] > 0 and "vepo_share_of_rl_step_over_grpo" in length
        assert length["vepo"]["perturbed_completions"] > 0 and length["grpo"]["perturbed_completions"] == 0
    assert "VEPO / top-20% entropy   median" in out


def test_bench_scoring_quick_path(tmp_path):
    out = _run("bench_scoring.py", "--sizes", "64x32", "--vocab", "2048", "--repeats", "1", "--no_gpu",
               tmp_path=tmp_path)  # fmt: skip
    figures = json.loads(out.strip().splitlines()[-1])
    assert figures["time_ratio"] > 0 and figures["peak_mem_ratio"] > 0


def test_bench_rollout_cache_quick_path(tmp_path):
    out = _run("bench_rollout_cache.py", tmp_path=tmp_path)
    assert "Qwen2.5-VL-7B" in out


def test_bad_inputs_quick_path(tmp_path):
    out = _run("bad_inputs.py", "--only", "strategies", tmp_path=tmp_path)
    assert "2 cases: 2 exit 2, 2 one stderr line, 0 tracebacks" in out


def test_readme_figures_quick_path_finds_the_readme_true(tmp_path):
    # The README's test count against `pytest --collect-only`: a test added without `readme_figures.py --write` fails
    out = _run("readme_figures.py", "--only", "tests", tmp_path=tmp_path, timeout=900)
    assert "tests" in out
