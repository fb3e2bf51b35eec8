"""The training script under `accelerate launch`, reporting what really ran (for `gpu_acceptance.py`).

Runs `vepo_trl/train.py`'s `main` with the command line it is given, then writes one JSON file (the path in
`VEPO_LAUNCH_REPORT`) from the main process: accelerate's distributed type and DeepSpeed stage, the mixed precision,
the attention implementation, the device of the weights, the steps done and their losses, VEPO's selected fraction,
and the files of the saved model. A config that accelerate quietly ignored (FSDP or DeepSpeed falling back to a plain
run) shows here as another distributed type.

It also registers the reward `launch_probe_length` (the completion's length modulo 5): the tiny recipe's own rewards
are all zero on a random model, so no step would move a weight and a resumed run would equal an uninterrupted one
whatever the checkpoint restored.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from transformers import TrainerCallback  # noqa: E402

from vepo_trl import train  # noqa: E402
from vepo_trl.rewards import completion_to_text, register_reward  # noqa: E402


@register_reward("launch_probe_length")
def length_reward(completions, **kwargs) -> list[float]:
    return [float(len(completion_to_text(completion)) % 5) for completion in completions]


class StepsRun(TrainerCallback):
    """The optimiser steps this process ran: a resumed run that trained from step 0 again ends on the same weights as
    an uninterrupted one, so the weights alone cannot tell that it resumed."""

    def __init__(self):
        self.steps = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)


class ProbedTrainer(train.VEPOTrainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.steps_run = StepsRun()
        self.add_callback(self.steps_run)


train.VEPOTrainer = ProbedTrainer  # train.main builds its trainer from this name


def report(trainer) -> dict:
    accelerator = trainer.accelerator
    state = accelerator.state
    plugin = getattr(state, "deepspeed_plugin", None)
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    output_dir = Path(trainer.args.output_dir)
    fsdp = getattr(state, "fsdp_plugin", None)
    return {
        "distributed_type": str(accelerator.distributed_type).split(".")[-1],
        "num_processes": accelerator.num_processes,
        "zero_stage": plugin.zero_stage if plugin is not None else None,
        "fsdp_version": getattr(fsdp, "fsdp_version", None) if fsdp is not None else None,
        "mixed_precision": str(accelerator.mixed_precision),
        "attention": getattr(trainer.model.config, "_attn_implementation", None),
        "device": str(next(trainer.model.parameters()).device),
        "global_step": trainer.state.global_step,
        "steps_this_process": trainer.steps_run.steps,
        "losses": [entry["loss"] for entry in logs],
        "losses_finite": bool(logs) and all(math.isfinite(entry["loss"]) for entry in logs),
        "grad_norms": [entry.get("grad_norm") for entry in logs],
        "selected_fraction": [entry.get("vepo/selected_fraction") for entry in logs],
        "perturbed_completions": trainer.num_perturbed_completions,
        "saved": sorted(p.name for p in output_dir.glob("*.safetensors")),
    }


if __name__ == "__main__":
    trainer = train.main(*train.make_parser().parse_args_and_config())
    if trainer is not None and trainer.accelerator.is_main_process and os.environ.get("VEPO_LAUNCH_REPORT"):
        Path(os.environ["VEPO_LAUNCH_REPORT"]).write_text(json.dumps(report(trainer)))
