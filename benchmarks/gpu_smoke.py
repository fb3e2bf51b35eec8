"""GPU smoke test: two VEPO training steps on CUDA in bf16 for every selection strategy x perturbation, every
`loss_type`, and the settings that take other code paths (LoRA, beta > 0, rollout-time scoring, several iterations,
GSPO, the entropy bonus, weight mode, an fp32 LM head). One command for any contributor with a GPU:

    python benchmarks/gpu_smoke.py            # CUDA + bf16; about 2-4 minutes on one H100
    python benchmarks/gpu_smoke.py --quick    # each strategy, perturbation and loss type once
    python benchmarks/gpu_smoke.py --cpu      # the same cases on the CPU in fp32 (what CI-like machines can check)

Each case trains the tiny Qwen2.5-VL (the real model and processor classes) on synthetic visual rows, then checks
that the loss is finite, that VEPO's metrics were logged and that trained weights moved. Prints one line per case, a
summary and a JSON line; exits 1 if any case failed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import traceback
import warnings


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from transformers.trainer_callback import PrinterCallback, ProgressCallback  # noqa: E402

from vepo_trl import VEPOConfig, VEPOTrainer  # noqa: E402
from vepo_trl.builtin.tiny_models import save_tiny_qwen2_5_vl  # noqa: E402
from vepo_trl.data import synthetic_training_dataset  # noqa: E402
from vepo_trl.perturb import PERTURBATIONS  # noqa: E402
from vepo_trl.scoring import SELECTION_STRATEGIES, SUPPORTED_LOSS_TYPES  # noqa: E402


def length_reward(completions, **kwargs):
    return [float(len(completion[0]["content"]) % 5) for completion in completions]


def cases(quick: bool):
    """Every strategy, perturbation and loss type; `quick` drops only the strategy x perturbation cross product
    (each strategy with `diffusion`, each perturbation with `vepo`)."""
    pairs = set()
    for strategy, info in SELECTION_STRATEGIES.items():
        for perturbation in sorted(PERTURBATIONS) if info.needs_perturbed_pass else ["diffusion"]:
            if not quick or strategy == "vepo" or perturbation == "diffusion":
                pairs.add((strategy, perturbation))
    yield "strategy=vepo perturbation=diffusion", {}
    for strategy, perturbation in sorted(pairs - {("vepo", "diffusion")}):
        yield (
            f"strategy={strategy} perturbation={perturbation}",
            {"selection_strategy": strategy, "perturbation": perturbation},
        )
    for loss_type in SUPPORTED_LOSS_TYPES:
        yield f"loss_type={loss_type}", {"loss_type": loss_type}
    yield "beta=0.04 (reference model, KL)", {"beta": 0.04}
    yield "rollout-time scoring (steps_per_generation=2)", {"steps_per_generation": 2}
    yield "num_iterations=2", {"num_iterations": 2}
    yield (
        "GSPO, full strategy (importance_sampling_level=sequence)",
        {
            "importance_sampling_level": "sequence",
            "loss_type": "grpo",
            "selection_strategy": "full",
        },
    )
    yield "entropy_coef=1e-3 (all tokens)", {"entropy_coef": 1e-3}
    yield "entropy_coef=1e-3 (selected tokens)", {"entropy_coef": 1e-3, "entropy_scope": "selected"}
    yield "selection_mode=weight", {"selection_mode": "weight"}
    yield "cast_lm_head_to_fp32", {"cast_lm_head_to_fp32": True}
    yield "gradient_accumulation_steps=2", {"gradient_accumulation_steps": 2}
    yield "LoRA (q, v; dropout 0.05)", {"peft": True}
    yield "LoRA + rollout-time scoring", {"peft": True, "steps_per_generation": 2}


def run_case(model_dir, dataset, overrides, cpu: bool):
    from peft import LoraConfig

    overrides = dict(overrides)
    peft = overrides.pop("peft", False)
    with tempfile.TemporaryDirectory() as output_dir:
        args = VEPOConfig(
            output_dir=output_dir,
            per_device_train_batch_size=8,
            num_generations=4,
            max_completion_length=32,
            max_steps=2,
            learning_rate=1e-2,  # tiny model, two steps: large enough that trained weights visibly move
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            use_cpu=cpu,
            bf16=not cpu,
            seed=0,
            **overrides,
        )
        peft_config = LoraConfig(target_modules=["q_proj", "v_proj"], r=8, lora_alpha=16) if peft else None
        trainer = VEPOTrainer(
            model=model_dir, reward_funcs=length_reward, args=args, train_dataset=dataset, peft_config=peft_config
        )
        # One line per case: the per-step metric dicts stay in the trainer's log history
        trainer.remove_callback(ProgressCallback)
        trainer.remove_callback(PrinterCallback)
        before = {n: p.detach().float().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
        trainer.train()
        logs = [entry for entry in trainer.state.log_history if "loss" in entry]
        problems = []
        if not logs or not all(math.isfinite(entry["loss"]) for entry in logs):
            problems.append(f"loss not finite: {[entry.get('loss') for entry in logs]}")
        if not any("vepo/selected_fraction" in entry for entry in logs):
            problems.append("no vepo/selected_fraction logged")
        moved = sum(
            not torch.equal(before[n], p.detach().float()) for n, p in trainer.model.named_parameters() if n in before
        )
        if moved == 0:
            problems.append("no trained weight moved")
        device = next(trainer.model.parameters()).device
        return problems, device, trainer.num_perturbed_completions


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick", action="store_true", help="each strategy, perturbation and loss type once (no cross product)"
    )
    parser.add_argument("--cpu", action="store_true", help="run on the CPU in fp32")
    parser.add_argument("--only", default=None, help="run the cases whose name contains this text")
    args = parser.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        sys.exit("gpu_smoke.py: no CUDA device; pass --cpu to run the cases on the CPU")
    torch.set_num_threads(1) if args.cpu else None
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(save_tiny_qwen2_5_vl(os.path.join(tmp, "tiny")))
        dataset = synthetic_training_dataset(32, seed=0)
        failures, total = [], 0
        start_all = time.perf_counter()
        for name, overrides in cases(args.quick):
            if args.only and args.only not in name:
                continue
            total += 1
            start = time.perf_counter()
            try:
                problems, device, perturbed = run_case(model_dir, dataset, overrides, args.cpu)
            except Exception:  # report every case, then fail at the end
                problems, device, perturbed = [traceback.format_exc(limit=-3).strip()], "?", 0
            status = "ok  " if not problems else "FAIL"
            print(f"{status} {time.perf_counter() - start:5.1f} s  {device}  perturbed={perturbed:<3}  {name}")
            for problem in problems:
                print("       " + problem.replace("\n", "\n       "))
            if problems:
                failures.append(name)
        seconds = time.perf_counter() - start_all
        print(f"{total - len(failures)} passed, {len(failures)} failed in {seconds:.0f} s")
        print(json.dumps({"passed": total - len(failures), "failed": failures, "seconds": round(seconds, 1)}))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
