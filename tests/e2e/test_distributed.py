"""Two processes whose batches disagree (one only text-only prompts, one only prompts with an image; one with every
completion masked) finish their training steps: every process enters every collective."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import free_port


REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "distributed" / "mixed_ranks.py"


def launch_two_processes(tmp_path, model_dir, scenario):
    output = tmp_path / scenario
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(REPO / "recipes" / "accelerate_configs" / "ddp.yaml"),
        "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", str(free_port()),
        str(SCRIPT), str(output), model_dir, scenario,
    ]  # fmt: skip
    try:
        result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=400)
    except subprocess.TimeoutExpired as error:  # a hang: show where the ranks were
        pytest.fail(f"two-process run hung:\n{(error.stdout or b'')[-3000:]}\n{(error.stderr or b'')[-3000:]}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return json.loads((output / "report.json").read_text())


@pytest.mark.slow
def test_ranks_with_and_without_images_finish(tiny_model_dir, tmp_path):
    """The selection is made on each slice's first use; TRL's default `log_multimodal` stays on."""
    report = launch_two_processes(tmp_path, tiny_model_dir, "first_use")
    assert report["world_size"] == 2 and report["global_step"] == 2
    (text_perturbed, text_has_image), (image_perturbed, image_has_image) = report["perturbed_and_has_image_per_rank"]
    # Rank 0 never saw an image and scored nothing (it ran dummy passes); rank 1 scored its image prompts
    assert (text_has_image, image_has_image) == (0, 1)
    assert text_perturbed == 0 and image_perturbed > 0
    logs = report["logs"]
    assert len(logs) == 2 and all(entry["vepo/image_rows_fraction"] == 0.5 for entry in logs)
    assert all(entry["vepo/jsd_mean"] > 0 for entry in logs if "vepo/jsd_mean" in entry)
    # The completions table keeps one image entry per logged prompt, from both processes
    assert report["logged_images"] == report["logged_prompts"] > 0


@pytest.mark.slow
def test_ranks_disagree_with_rollout_scoring_and_masked_completions(tiny_model_dir, tmp_path):
    """TRL's rollout-time forward carries the scoring (steps_per_generation 2) and every completion is truncated and
    masked (`mask_truncated_completions`): nothing to score anywhere, every process still takes part."""
    report = launch_two_processes(tmp_path, tiny_model_dir, "rollout_truncated")
    assert report["global_step"] == 2
    # Process 0 only had text-only prompts, process 1 prompts with an image; no completion had a valid token
    assert report["perturbed_and_has_image_per_rank"] == [[0, 0], [0, 1]]
    rollout_log = report["logs"][0]
    assert rollout_log["completions/clipped_ratio"] == 1.0
    # Nothing was trained on, so no selection figure; yet half the prompts had an image
    assert "vepo/selected_fraction" not in rollout_log and rollout_log["vepo/image_rows_fraction"] == 0.5
