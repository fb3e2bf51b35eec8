"""Sharded weights on a gloo group (two CPU processes).

- torch's own FSDP on the tiny model: the LM head read outside a forward, and processes that disagree about images
  (`sharded_ranks.py`).
- `VEPOTrainer` itself under DDP, FSDP1, FSDP2, DeepSpeed ZeRO-2 and ZeRO-3, through accelerate's and TRL's own
  sharding code (`trainer_ranks.py`: accelerate never gives FSDP or DeepSpeed to a CPU run; a few test-only lines
  make it): a text-only process beside one with images, gradient accumulation 2, rollout-time scoring, fixed
  completions and SGD, against one process.
- A sharded run saved at step 2 and resumed on a fresh launch against the uninterrupted run (`resume_ranks.py`)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vepo_trl.builtin.tiny_models import DEFAULT_FAMILY, layout_signature, one_per_layout

from .support import free_port


REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "distributed" / "sharded_ranks.py"
TRAINER_SCRIPT = REPO / "tests" / "distributed" / "trainer_ranks.py"
RESUME_SCRIPT = REPO / "tests" / "distributed" / "resume_ranks.py"


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
    # ZeRO-2 does not shard weights but reduces a trainable tower's gradients by bucket: aligned too; a frozen one not
    from transformers import AutoModelForImageTextToText

    from vepo_trl.sharding import gradients_reduce_by_bucket

    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    assert gradients_reduce_by_bucket(trainer(deepspeed_stage=2), model)
    assert not gradients_reduce_by_bucket(trainer(deepspeed_stage=3), model)
    model.model.visual.requires_grad_(False)
    assert not gradients_reduce_by_bucket(trainer(deepspeed_stage=2), model)
    # DDP on the CPU: no hook, no all-reduce per forward
    from .support import make_trainer

    vepo = make_trainer(tiny_model_dir, visual_dataset, tmp_path)
    assert vepo.vision_alignment == [None]


def run_trainer(output, model_dir, mode, trainer="vepo"):
    """`trainer_ranks.py` on two processes (one for `single`); its report and final weights."""
    import torch

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    processes = "1" if mode == "single" else "2"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", processes, "--master_port", str(free_port()),
        str(TRAINER_SCRIPT), str(output), model_dir, mode, trainer,
    ]  # fmt: skip
    try:
        result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=output.parent, timeout=400)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"{mode} run hung:\n{(error.stderr or b'')[-3000:]}")
    assert result.returncode == 0, result.stderr[-5000:]
    return json.loads((output / "report.json").read_text()), torch.load(output / "weights.pt")


def largest_difference(weights, reference):
    assert weights.keys() == reference.keys()
    return max(((weights[name] - reference[name]).abs().max().item(), name) for name in weights)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, tiny_model_dir):
    """The same training on one process (gradient accumulation 4 for the two processes' 2 x 2)."""
    return run_trainer(tmp_path_factory.mktemp("one") / "single", tiny_model_dir, "single")


SHARDING = {  # mode: (accelerate's distributed type, FSDP version, ZeRO stage, whether processes align the tower)
    "ddp": ("MULTI_CPU", None, None, False),
    "fsdp1": ("FSDP", 1, None, True),
    "fsdp2": ("FSDP", 2, None, True),
    "zero2": ("DEEPSPEED", None, 2, True),
    "zero3": ("DEEPSPEED", None, 3, True),
}


def assert_passes_in_step(text_rank, image_rank):
    """The image process read each prompt once (a prefill and its continuations per chunk) with the whole pass's
    signals and masks; the text-only process ran the same number of forwards in every chunk, as dummies."""
    assert text_rank["chunk_forwards"] == image_rank["chunk_forwards"]
    assert max(image_rank["chunk_forwards"]) >= 2
    for rank in (text_rank, image_rank):
        assert rank["max_signal_diff"] <= 1e-5 and rank["masks_equal"], rank


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(SHARDING))
def test_sharded_vepo_trainer_ends_on_the_one_process_weights(tmp_path, tiny_model_dir, one_process, mode):
    if mode.startswith("zero"):
        pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install -e '.[deepspeed]')")
    report, weights = run_trainer(tmp_path / mode, tiny_model_dir, mode)
    distributed_type, fsdp_version, zero_stage, aligned = SHARDING[mode]
    # accelerate really ran the mode (the test-only set-up did not fall back to a plain run)
    assert report["distributed_type"] == f"DistributedType.{distributed_type}"
    assert (report["fsdp_version"], report["zero_stage"]) == (fsdp_version, zero_stage)
    assert report["global_step"] == 4
    text_rank, image_rank = report["ranks"]
    assert text_rank["digest"] == image_rank["digest"]  # the same weights on both processes
    # Process 0 only had text-only prompts (nothing perturbed), process 1 images; under sharding (and ZeRO-2's bucketed
    # reductions of the trainable tower) process 0 ran the tower on the dummy image wherever process 1 ran it
    assert text_rank["perturbed"] == 0 and image_rank["perturbed"] == 8
    assert (text_rank["dummy_forwards"] or 0) > 0 if aligned else text_rank["dummy_forwards"] is None
    assert image_rank["dummy_forwards"] in (0, None)
    if mode == "fsdp2":  # the LM head was unsharded for TRL's fused head (see sharding.FusedHeadUnshard)
        assert text_rank["head_unshards"] > 0
    assert_passes_in_step(text_rank, image_rank)
    reference_report, reference = one_process
    assert text_rank["changed"] > 0.1
    # The one-process run's weights, to float32 rounding of other micro-batch compositions (lr 0.5, 4 SGD steps);
    # FSDP2 was 0.34 off in lm_head.weight before VEPO unsharded the head for TRL's fused head
    difference, name = largest_difference(weights, reference)
    assert difference < 1e-4, (name, difference)
    assert report["losses"] == pytest.approx(reference_report["losses"], abs=1e-5)


@pytest.mark.slow
def test_sharded_upstream_fsdp2_trains_a_vlm_head_on_each_process_own_data(tmp_path, tiny_model_dir):
    """Upstream failure VEPO guards: accelerate (1.15) shards a VLM's LM head as a group alone (its final norm is no
    direct child of the base model), and TRL's fused head reads the weight without running the head's forward, so
    under gradient accumulation its gradient skips FSDP's reduce-scatter. The parent trainer, all-image data (it
    refuses text-only rows beside images). When this fails, upstream is fixed: `FusedHeadUnshard` switches itself
    off where accelerate groups the head with a module the backbone runs."""
    _, reference = run_trainer(tmp_path / "single", tiny_model_dir, "single", "grpo")
    _, weights = run_trainer(tmp_path / "fsdp2", tiny_model_dir, "fsdp2", "grpo")
    difference, name = largest_difference(weights, reference)
    assert name == "lm_head.weight" and difference > 1e-2


# One family per arrangement of `pixel_values` beside the patch rows tested above (`tiny_models.one_per_layout` by the
# layout class, pixel_values' rank, `image_sizes` and tiles counted per prompt: whole images, images padded with
# their sizes, per-row tiles, any-res crops, per-prompt tiles, padded patch rows), among the families that take
# text-only rows. Alike in these, families take the same sharded paths; Gemma 3 and LLaVA-NeXT ran too when picked
def _arrangement(signature):
    return (signature.layout, signature.pixel_rank, "image_sizes" in signature.inputs, signature.tiles_per_prompt)


def _takes_the_ranks_data(name):
    """The family trains on the processes' data (text-only rows, prompts of one and two images) at all."""
    from vepo_trl.builtin.tiny_models import takes

    from .distributed.trainer_ranks import dataset

    return takes(name, dataset())


LAYOUT_FAMILIES = [
    name
    for name in one_per_layout(key=_arrangement, accepts=_takes_the_ranks_data)
    if layout_signature(name).layout != layout_signature(DEFAULT_FAMILY).layout
]
# Gemma 4 on two processes ends 8e-3 from one process under plain DDP as well (steps 1-3's losses equal to 1e-6, step
# 4's 7e-4 apart), so not through sharding; its prompts' padding, which TRL 1.16 took for prompt tokens (0.81 apart),
# is dropped now (`prompt_padding`). What is left is not found yet
_NOT_ONE_PROCESS_YET = {"gemma4"}
# A family whose positions count every column (its prompts' padding included, unlike M-RoPE's) under the other two
# sharded modes. (The tiny LLaVA ends 6.3e-3 from one process under plain DDP too, before and after the shared
# perturbed pass: its positions move with each process's own prompt padding)
PADDED_PROMPTS = [("llava-next", "zero3"), ("llava-next", "fsdp1")]
SHARDED_FAMILIES = [
    pytest.param(name, "fsdp2", marks=pytest.mark.xfail(strict=True, reason="two processes differ from one (DDP too)"))
    if name in _NOT_ONE_PROCESS_YET
    else (name, "fsdp2")
    for name in LAYOUT_FAMILIES
] + PADDED_PROMPTS


@pytest.mark.slow
@pytest.mark.parametrize(("family", "mode"), SHARDED_FAMILIES)
def test_sharded_fsdp2_on_every_pixel_layout_ends_on_the_one_process_weights(tmp_path, family, mode):
    """FSDP2 through accelerate (the family's own blocks wrapped), and LLaVA-NeXT under ZeRO-3 and FSDP1: the text-only
    process runs the family's vision tower on the dummy image wherever the image process runs it, and both end on the
    one-process run's weights."""
    if mode.startswith("zero"):
        pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install -e '.[deepspeed]')")
    from vepo_trl.builtin.tiny_models import save_tiny

    model_dir = str(save_tiny(family, tmp_path / family))
    reference_report, reference = run_trainer(tmp_path / "single", model_dir, "single")
    report, weights = run_trainer(tmp_path / mode, model_dir, mode)
    assert (report["distributed_type"], report["fsdp_version"], report["zero_stage"]) == {
        "fsdp2": ("DistributedType.FSDP", 2, None),
        "fsdp1": ("DistributedType.FSDP", 1, None),
        "zero3": ("DistributedType.DEEPSPEED", None, 3),
    }[mode]
    text_rank, image_rank = report["ranks"]
    assert text_rank["digest"] == image_rank["digest"]
    # Every image completion perturbed or skipped (a zero advantage: a completion cut at an end-of-turn token)
    assert text_rank["perturbed"] == text_rank["skipped"] == 0 and image_rank["perturbed"] > 0
    assert image_rank["perturbed"] + image_rank["skipped"] == 8
    assert text_rank["dummy_forwards"] > 0 and image_rank["dummy_forwards"] == 0
    assert_passes_in_step(text_rank, image_rank)
    assert text_rank["changed"] > 0.1
    difference, name = largest_difference(weights, reference)
    assert difference < 1e-4, (name, difference)
    assert report["losses"] == pytest.approx(reference_report["losses"], abs=1e-5)


def _fsdp2_optimizer_load(tmp_path, optimizer, kind):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
               str(free_port()), str(REPO / "tests" / "distributed" / "fsdp2_stateless_optimizer.py"), optimizer, kind]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    outcomes = sorted(line for line in result.stdout.splitlines() if line.startswith("rank "))
    assert len(outcomes) == 2, result.stdout[-2000:] + result.stderr[-2000:]
    return outcomes


def test_upstream_fsdp2_cannot_load_a_full_state_dict_of_an_optimizer_without_state(tmp_path):
    """torch (2.14) raises "Expected device to be set" loading plain SGD's full-state optimizer dict under FSDP2:
    what resuming an FSDP2 run with FULL_STATE_DICT checkpoints does, so VEPOConfig refuses that combination
    (its row in validation.COMBINATIONS). When this test fails, torch loads it: lift the refusal."""
    assert _fsdp2_optimizer_load(tmp_path, "sgd", "full") == [
        "rank 0 failed: AssertionError: Expected device to be set",
        "rank 1 failed: AssertionError: Expected device to be set",
    ]
    # What the refusal points to works: an optimizer with state, or sharded checkpoints
    assert _fsdp2_optimizer_load(tmp_path, "sgd_momentum", "full") == ["rank 0 loaded", "rank 1 loaded"]
    assert _fsdp2_optimizer_load(tmp_path, "sgd", "sharded") == ["rank 0 loaded", "rank 1 loaded"]


@pytest.mark.parametrize(
    "environment, settings, refused",
    [
        ({"FSDP_VERSION": "2", "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT"}, {"optim": "sgd"}, True),
        ({"FSDP_VERSION": "2", "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT"}, {"optim": "sgd", "save_strategy": "no"}, False),
        ({"FSDP_VERSION": "2", "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT"}, {"optim": "sgd", "optim_args": "momentum=0.9"}, False),
        ({"FSDP_VERSION": "2", "FSDP_STATE_DICT_TYPE": "SHARDED_STATE_DICT"}, {"optim": "sgd"}, False),
        ({"FSDP_VERSION": "1", "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT"}, {"optim": "sgd"}, False),
        ({"FSDP_VERSION": "2", "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT"}, {"optim": "adamw_torch"}, False),
    ],
)  # fmt: skip
def test_a_run_whose_fsdp2_checkpoints_could_not_resume_is_refused_in_one_line(environment, settings, refused,
                                                                              monkeypatch, tmp_path):  # fmt: skip
    from vepo_trl import VEPOConfig

    # What `accelerate launch --config_file recipes/accelerate_configs/fsdp.yaml` puts in the environment
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    if refused:
        with pytest.raises(ValueError, match=r"^FSDP2 saves FULL_STATE_DICT checkpoints here, .* momentum=0\.9"):
            VEPOConfig(output_dir=str(tmp_path), use_cpu=True, **settings)
    else:
        VEPOConfig(output_dir=str(tmp_path), use_cpu=True, **settings)


def _resume_launch(output, model_dir, mode, environment, checkpoint=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **environment}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
               str(free_port()), str(RESUME_SCRIPT), str(output), model_dir, mode, *([checkpoint] if checkpoint else [])]  # fmt: skip
    try:
        result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=output.parent, timeout=400)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"{mode} run hung:\n{(error.stderr or b'')[-3000:]}")
    assert result.returncode == 0, result.stderr[-5000:]
    return json.loads((output / "report.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("state_dict_type", ["FULL_STATE_DICT", "SHARDED_STATE_DICT"])
def test_an_fsdp2_run_resumed_at_step_2_ends_on_the_uninterrupted_weights(tmp_path, tiny_model_dir, state_dict_type):
    """What FSDP2's "Expected device to be set" is not: with an optimizer that keeps state (AdamW), a two-process
    FSDP2 run saved at step 2 (the end of its first epoch) and resumed on a new launch trains step 3 alone and ends
    bit for bit on the weights of the run that went on (the recipe's FULL_STATE_DICT and the sharded checkpoints the
    refusal above points to). Before `epoch_aware`, step 3 replayed step 1's prompts."""
    environment = {"FSDP_STATE_DICT_TYPE": state_dict_type}
    straight = _resume_launch(tmp_path / "straight", tiny_model_dir, "fsdp2", environment)
    assert (straight["distributed_type"], straight["fsdp_version"]) == ("DistributedType.FSDP", 2)
    assert straight["state_dict_type"].endswith(state_dict_type), straight["state_dict_type"]
    assert straight["steps_run"] == [1, 2, 3] and "checkpoint-2" in straight["checkpoints"]
    checkpoint = str(tmp_path / "straight" / "checkpoint-2")
    resumed = _resume_launch(tmp_path / "resumed", tiny_model_dir, "fsdp2", environment, checkpoint)
    assert resumed["steps_run"] == [3]
    assert resumed["losses"] == straight["losses"]
    assert resumed["digest"] == straight["digest"]
