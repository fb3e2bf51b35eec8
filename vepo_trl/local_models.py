"""Model names that stand for models built on this machine instead of downloaded: one place for every command.

- `tiny-qwen2.5-vl`: the tiny random Qwen2.5-VL of `vepo_trl.testing` (the CPU demo and tests), built once and cached.
- `lab-warm-start`: the lab's SFT'd small Qwen2.5-VL (`vepo_trl.lab.warm_start`), built on first use and cached.

A folder of the same name in the working directory wins: the name then means that folder, as for any local path.
"""

from __future__ import annotations

import os


# `model_name_or_path` that builds the tiny random Qwen2.5-VL locally (the CPU demo and tests)
TINY_MODEL = "tiny-qwen2.5-vl"
# `model_name_or_path` of the lab's warm start: a small Qwen2.5-VL SFT'd on the lab tasks, built once and cached
LAB_MODEL = "lab-warm-start"


def resolve_model_name(name: str) -> str:
    """The local path a built-in name stands for (building the model on first use); any other name passes as is."""
    if name == TINY_MODEL and not os.path.isdir(name):
        from accelerate import PartialState

        from .testing import tiny_model_path

        # Under torch.distributed only rank 0 writes weights: it builds, the other ranks then find the folder
        with PartialState().main_process_first():
            return str(tiny_model_path())
    if name == LAB_MODEL and not os.path.isdir(name):
        from .lab.warm_start import warm_start_path

        return str(warm_start_path())  # built on first use (minutes), then cached; rank 0 builds
    return name
