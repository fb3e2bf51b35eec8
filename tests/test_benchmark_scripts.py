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
