"""Peak GPU memory of the Colab notebook's real configuration, so the notebook can name the smallest GPU it fits.

The settings are the notebook's own: its configuration cell (`notebooks/vepo_qwen2_5_vl_3b_lora.ipynb`, the real-run
branch) is executed as written, so a change to the notebook is measured, not a copy of it. The model is a randomly
initialised Qwen2.5-VL with the 3B checkpoint's dimensions (`bench_gpu_step.build_model`: vocabulary 151,936, 36
layers, the 32-block vision tower) in bf16 with the notebook's LoRA (r 64 on the language model's projections) and
activation checkpointing; the images are 1000x1000 (the notebook's `max_pixels`, the most visual tokens a row can
have) and a random model writes every completion to the notebook's `max_completion_length`, so the two steps are the
configuration's worst case. Generation uses transformers, as in the notebook. It prints the peak against 24 GB (L4)
and 40 GB (A100 40GB).

    python benchmarks/notebook_memory.py            # CUDA; two optimiser steps of the notebook's configuration
    python benchmarks/notebook_memory.py --tiny     # the same code path on a CPU: tiny widths, short completions

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from unittest import mock

import torch


os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")
REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "vepo_qwen2_5_vl_3b_lora.ipynb"
GPUS_GB = {"L4 / A10G (24 GB)": 24, "A100 40GB": 40}

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gpu_step import QWEN_3B, TINY, build_model  # noqa: E402


def notebook_settings(output_dir: str):
    """`(model_args, script_args, VEPOConfig keyword arguments)` of the notebook's real run, from its configuration
    cell as written (the `VEPOConfig` call is recorded, so that the caller can run the same settings small on a CPU)."""
    import types

    cells = json.loads(NOTEBOOK.read_text())["cells"]
    source = next("".join(c["source"]) for c in cells if "training_args = VEPOConfig(" in "".join(c["source"]))
    namespace = {"USE_TINY_MODEL": False, "PUSH_TO_HUB": False, "HUB_MODEL_ID": None, "OUTPUT_DIR": output_dir}
    recorded = {}

    def record(**kwargs):
        recorded.update(kwargs)
        return types.SimpleNamespace(**kwargs)

    # The cell refuses a machine without a bf16 GPU; here it only has to say what it would run
    with (
        mock.patch("torch.cuda.is_available", return_value=True),
        mock.patch("torch.cuda.is_bf16_supported", return_value=True),
        mock.patch("vepo_trl.config.VEPOConfig", record),
    ):
        exec(compile(source, str(NOTEBOOK.name) + " (configuration cell)", "exec"), namespace)
    return namespace["model_args"], namespace["script_args"], recorded


def large_image_rows(count: int, side: int):
    """Rows in TRL's conversational format with one `side` x `side` image each (random pixels)."""
    import numpy as np
    from datasets import Dataset
    from PIL import Image

    rng = np.random.default_rng(0)
    rows = [
        {
            "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"Find x ({k})."}]}],
            "images": [Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8))],
            "solution": "3",
        }
        for k in range(count)
    ]
    return Dataset.from_list(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--tiny", action="store_true", help="tiny widths and short completions (a CPU code-path check)"
    )
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    from peft import get_peft_model
    from trl import get_peft_config

    from vepo_trl import VEPOConfig, VEPOTrainer
    from vepo_trl.builtin.tiny_models import build_processor

    cuda = torch.cuda.is_available() and not args.tiny
    device = torch.device("cuda" if cuda else "cpu")
    with tempfile.TemporaryDirectory() as output_dir:
        model_args, script_args, training_args = notebook_settings(output_dir)
        side = int(script_args.max_pixels**0.5)
        overrides = dict(reward_weights=None, max_steps=args.steps, save_strategy="no", logging_steps=1, push_to_hub=False,
                         disable_tqdm=True)  # fmt: skip
        if not cuda:  # the code path on a CPU: tiny widths, fp32, a few tokens, small images
            overrides.update(use_cpu=True, bf16=False, max_completion_length=16, activation_checkpointing=False,
                             gradient_accumulation_steps=1)  # fmt: skip
            side = 112
        for unread in ("save_steps", "save_total_limit"):  # save_strategy "no" here: settings it would never read
            training_args.pop(unread, None)
        training_args = VEPOConfig(**{**training_args, **overrides})
        processor = build_processor()
        processor.image_processor.min_pixels = min(script_args.min_pixels, side * side)
        processor.image_processor.max_pixels = script_args.max_pixels
        dims = QWEN_3B if cuda else TINY
        torch.manual_seed(0)
        model = build_model(processor, dims, device, torch.bfloat16 if cuda else torch.float32)
        model.config.use_cache = True  # generation with transformers, as in the notebook
        model = get_peft_model(model, get_peft_config(model_args))
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        prompts = training_args.per_device_train_batch_size // training_args.num_generations
        rows = prompts * training_args.gradient_accumulation_steps * args.steps
        trainer = VEPOTrainer(
            model=model,
            # A random model earns no reward, and zero advantages would skip the perturbed forward: random rewards
            # give every completion an advantage, so the steps measured are the ones a learning run takes
            reward_funcs=lambda completions, **_: torch.rand(len(completions)).tolist(),
            args=training_args,
            train_dataset=large_image_rows(rows, side),
            processing_class=processor,
        )
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else float("nan")
        reserved = torch.cuda.max_memory_reserved(device) / 2**30 if cuda else float("nan")
    skipped = [log["vepo/perturbed_rows_skipped_fraction"] for log in trainer.state.log_history
               if "vepo/perturbed_rows_skipped_fraction" in log]  # fmt: skip
    lengths = [log["completions/mean_length"] for log in trainer.state.log_history if "completions/mean_length" in log]
    print(
        f"notebook configuration, {'Qwen2.5-VL-3B-shaped' if cuda else 'tiny'} model ({trainable / 1e6:.1f}M LoRA "
        f"parameters), LoRA r {model_args.lora_r}, {training_args.per_device_train_batch_size} completions per "
        f"micro-batch x {training_args.gradient_accumulation_steps} accumulation steps, up to "
        f"{training_args.max_completion_length} tokens (mean written {', '.join(f'{v:.0f}' for v in lengths)}), "
        f"{side}x{side} images, activation checkpointing {training_args.activation_checkpointing}; {args.steps} steps "
        f"in {seconds:.0f} s"
    )
    fits = {}
    if cuda:
        print(f"peak GPU memory allocated {peak:.1f} GiB, reserved {reserved:.1f} GiB")
        for name, capacity in GPUS_GB.items():
            # Reserved is what the allocator holds; leave ~1.5 GB for the CUDA context and fragmentation
            fits[name] = reserved + 1.5 <= capacity * 1e9 / 2**30
            print(f"  {name}: {'fits' if fits[name] else 'does NOT fit'}")
    print(
        json.dumps(
            {
                "device": torch.cuda.get_device_name(device) if cuda else "cpu",
                "model": "qwen2.5-vl-3b-shaped" if cuda else "tiny",
                "steps": args.steps,
                "seconds": seconds,
                "mean_completion_lengths": lengths,
                "perturbed_rows_skipped_fraction": skipped,
                "peak_allocated_gib": peak,
                "peak_reserved_gib": reserved,
                "fits": fits,
            }
        )
    )


if __name__ == "__main__":
    main()
