"""Sharded weights with torch's own FSDP on a gloo group (two CPU processes): the LM head read outside a forward, and
processes that disagree about images. `accelerate launch` with an FSDP config on the CPU silently runs DDP, so the
model is sharded here by torch directly, with the hooks `VEPOTrainer` installs under sharding."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .test_distributed import free_port


REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "distributed" / "sharded_ranks.py"


def run_sharded(tmp_path, model_dir, mode, align):
    output = tmp_path / f"{mode}-{align}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
        str(SCRIPT), str(output), model_dir, mode, align,
    ]  # fmt: skip
    try:
        result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"sharded run hung:\n{(error.stderr or b'')[-3000:]}")
    report = json.loads((output / "report.json").read_text()) if (output / "report.json").is_file() else None
    return result, report


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fsdp1", "fsdp2"])
def test_text_only_and_image_processes_train_together_when_sharded(tmp_path, tiny_model_dir, mode):
    result, report = run_sharded(tmp_path, tiny_model_dir, mode, "align")
    assert result.returncode == 0, result.stderr[-4000:]
    text_rank, image_rank = report
    for rank in report:
        assert rank["trained"] and rank["same_weights"]
        # The head read outside a forward gives the unsharded head's signals exactly
        assert rank["entropy_error"] <= 1e-6 and rank["jsd_error"] <= 1e-6
    # The text-only process ran the vision tower on the dummy image in each of its 3 training forwards (not in the
    # last forward, where no process had an image); the image process never needed it
    assert (text_rank["dummy_forwards"], image_rank["dummy_forwards"]) == (3, 0)
    # A greedy generation of 3 tokens: once where transformers encodes the image before the prefill, then no decode
    # step needs the tower
    assert (text_rank["dummy_forwards_with_generation"], image_rank["dummy_forwards_with_generation"]) == (4, 0)
    if mode == "fsdp1":
        # Outside a forward FSDP1 holds a flat slice of the local shard: reading it directly fails
        assert all(len(rank["head_shape_outside_forward"]) == 1 for rank in report)
        assert all("size mismatch" in rank["error_without_gather"] for rank in report)


@pytest.mark.slow
def test_without_alignment_the_processes_mismatch(tmp_path, tiny_model_dir):
    # The failure the alignment prevents: the text-only process skips the vision tower's gathers
    result, report = run_sharded(tmp_path, tiny_model_dir, "fsdp1", "no_align")
    assert result.returncode != 0 and report is None
    assert "mismatch" in result.stderr or "Connection reset" in result.stderr


def test_alignment_is_installed_only_when_weights_are_sharded(tiny_model_dir, visual_dataset, tmp_path):
    from types import SimpleNamespace

    from vepo_trl.sharding import weights_are_sharded

    def trainer(fsdp=False, deepspeed_stage=None):
        plugin = SimpleNamespace(zero_stage=deepspeed_stage) if deepspeed_stage is not None else None
        return SimpleNamespace(
            is_fsdp_enabled=fsdp,
            is_deepspeed_enabled=plugin is not None,
            accelerator=SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin)),
        )

    assert weights_are_sharded(trainer(fsdp=True)) and weights_are_sharded(trainer(deepspeed_stage=3))
    assert not weights_are_sharded(trainer()) and not weights_are_sharded(trainer(deepspeed_stage=2))
    # DDP on the CPU: no hook, no all-reduce per forward
    from .test_trainer import make_trainer

    vepo = make_trainer(tiny_model_dir, visual_dataset, tmp_path)
    assert vepo.vision_alignment == [None]
