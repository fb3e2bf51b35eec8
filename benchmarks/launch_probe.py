"""The training script under `accelerate launch`, reporting what really ran (for `gpu_acceptance.py`).

Runs `vepo_trl/train.py`'s `main` with the command line it is given, then writes one JSON file (the path in
`VEPO_LAUNCH_REPORT`) from the main process: accelerate's distributed type and DeepSpeed stage, the mixed precision,
the attention implementation, the device of the weights, the steps done and their losses, VEPO's selected fraction,
and the files of the saved model. A config that accelerate quietly ignored (FSDP or DeepSpeed falling back to a plain
run) shows here as another distributed type.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vepo_trl.train import main, make_parser  # noqa: E402


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
        "losses": [entry["loss"] for entry in logs],
        "losses_finite": bool(logs) and all(math.isfinite(entry["loss"]) for entry in logs),
        "selected_fraction": [entry.get("vepo/selected_fraction") for entry in logs],
        "perturbed_completions": trainer.num_perturbed_completions,
        "saved": sorted(p.name for p in output_dir.glob("*.safetensors")),
    }


if __name__ == "__main__":
    trainer = main(*make_parser().parse_args_and_config())
    if trainer.accelerator.is_main_process and os.environ.get("VEPO_LAUNCH_REPORT"):
        Path(os.environ["VEPO_LAUNCH_REPORT"]).write_text(json.dumps(report(trainer)))
