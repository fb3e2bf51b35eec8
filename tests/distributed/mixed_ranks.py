"""Run under `accelerate launch --num_processes 2` (CPU, gloo) by tests/e2e/test_distributed.py.

Two processes whose batches disagree: with `shuffle_dataset=False`, one prompt per process per step and prompts
alternating text-only / with an image, process 0 only ever sees text-only prompts and process 1 only prompts with an
image. Every process must still enter the same collectives (TRL's multimodal logging, VEPO's perturbed forward and
signal pass, the metric reductions), or the run hangs. Writes a JSON report on the main process.

usage: mixed_ranks.py OUTPUT_DIR MODEL_DIR SCENARIO   (SCENARIO: first_use | rollout_truncated)
"""

import json
import os
import sys
from pathlib import Path

import torch
from accelerate import PartialState
from datasets import Dataset

from vepo_trl import VEPOConfig, VEPOTrainer
from vepo_trl.data import synthetic_training_dataset


def length_reward(completions, **kwargs):
    return [float(len(completion[0]["content"]) % 5) for completion in completions]


def mixed_dataset(block: int):
    """Blocks of `block` text-only prompts alternating with blocks of `block` prompts with an image."""
    visual = synthetic_training_dataset(8, seed=0)
    rows = [visual[i] for i in range(8)]
    for index, row in enumerate(rows):
        if (index // block) % 2:
            continue
        row["images"] = []
        row["prompt"] = [row["prompt"][0], {"role": "user", "content": [{"type": "text", "text": "What is 2 + 3?"}]}]
        row["answer"] = "5"
    return Dataset.from_list(rows, features=visual.features)


def main(output_dir: str, model_dir: str, scenario: str) -> None:
    settings = dict(
        output_dir=output_dir,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=16,
        max_steps=2,
        learning_rate=1e-2,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        seed=0,
        shuffle_dataset=False,
        ddp_timeout=120,  # a rank left waiting fails the run within two minutes instead of hanging it
    )
    block = 1
    if scenario == "rollout_truncated":
        # TRL's rollout-time forward carries the scoring (a generation batch holds two prompts per process, so the
        # prompts alternate in pairs), and every completion is cut at one token and masked out
        settings.update(steps_per_generation=2, max_completion_length=1, mask_truncated_completions=True)
        block = 2
    trainer = VEPOTrainer(
        model=model_dir, reward_funcs=length_reward, args=VEPOConfig(**settings), train_dataset=mixed_dataset(block)
    )
    trainer.train()
    state = PartialState()
    has_image = bool(trainer._buffered_inputs[0].get("pixel_values") is not None)
    per_rank = trainer.accelerator.gather_for_metrics(
        torch.tensor([[trainer.num_perturbed_completions, int(has_image)]])
    ).tolist()
    if state.is_main_process:
        logs = [entry for entry in trainer.state.log_history if "loss" in entry]
        report = {
            "global_step": trainer.state.global_step,
            "world_size": state.num_processes,
            "perturbed_and_has_image_per_rank": per_rank,
            "logs": logs,
            "logged_images": len(trainer._logs["images"]),
            "logged_prompts": len(trainer._logs["prompt"]),
        }
        Path(output_dir, "report.json").write_text(json.dumps(report))
    state.wait_for_everyone()
    # Every collective of the run is done and the report written. torch's gloo group sometimes aborts while being torn
    # down at exit ("terminate called without an active exception", seen once in a full-suite run, after training):
    # leave without that teardown, so the exit status is the run's
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(*sys.argv[1:4])
