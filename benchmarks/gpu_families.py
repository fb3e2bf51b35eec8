"""Every model family's tiny model (the real model and processor classes) on the accelerator: two VEPO steps with
`diffusion` and two with `patch_blackout`, and `full` against TRL's `GRPOTrainer` on one batch (loss and every
gradient, to the tolerance of the precision the run uses).

    python benchmarks/gpu_families.py              # CUDA, bf16
    python benchmarks/gpu_families.py --cpu        # the same on the CPU in fp32 (full must then equal GRPO exactly)
    python benchmarks/gpu_families.py --families qwen2.5-vl,gemma3

Prints one line per family and check; the last line is one JSON object. Exits 1 when a check fails. Families that
TRL's own trainer cannot train (`Family.trl_failure`) are listed as skipped with the reason.
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
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from vepo_trl import VEPOConfig, VEPOTrainer  # noqa: E402
from vepo_trl.builtin.tiny_models import save_tiny  # noqa: E402
from vepo_trl.data import synthetic_training_dataset  # noqa: E402
from vepo_trl.families import FAMILIES  # noqa: E402
from vepo_trl.trainer import SELECTION_KEY  # noqa: E402


PERTURBATIONS = ("diffusion", "patch_blackout")
# bf16 rounds at 2^-8 relative: the same code path may take other kernels (the selection mask's extra multiply), so
# the two losses and gradients agree to a few bf16 ulps, not bit for bit
BF16_RTOL = 2e-2


def length_reward(completions, **kwargs):
    return [float(len(completion[0]["content"]) % 5) for completion in completions]


def make_args(output_dir, cpu, config_cls=VEPOConfig, **overrides):
    settings = dict(
        output_dir=output_dir,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=16,
        max_steps=2,
        learning_rate=1e-2,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=cpu,
        bf16=not cpu,
        seed=0,
    )
    settings.update(overrides)
    if config_cls is GRPOConfig:
        settings = {k: v for k, v in settings.items() if k in GRPOConfig.__dataclass_fields__}
    return config_cls(**settings)


def quiet(trainer):
    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    return trainer


def two_steps(model_dir, dataset, output_dir, cpu, perturbation):
    """Two VEPO steps: problems (empty when fine) and a short summary."""
    trainer = quiet(
        VEPOTrainer(
            model=model_dir,
            reward_funcs=length_reward,
            args=make_args(output_dir, cpu, perturbation=perturbation),
            train_dataset=dataset,
        )
    )
    before = {n: p.detach().float().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    problems = []
    if len(logs) != 2 or not all(math.isfinite(entry["loss"]) for entry in logs):
        problems.append(f"losses {[entry.get('loss') for entry in logs]}")
    fractions = [entry.get("vepo/selected_fraction") for entry in logs]
    if not all(f is not None and 0 < f < 1 for f in fractions):
        problems.append(f"selected fractions {fractions}")
    if trainer.num_perturbed_completions == 0:
        problems.append("no perturbed forward ran")
    jsd = [entry.get("vepo/jsd_mean", 0.0) for entry in logs]
    if not any(value > 0 for value in jsd):
        problems.append(f"the perturbed image moved nothing (jsd_mean {jsd})")
    moved = sum(
        not torch.equal(before[n], p.detach().float()) for n, p in trainer.model.named_parameters() if n in before
    )
    if moved == 0:
        problems.append("no trained weight moved")
    device = next(trainer.model.parameters()).device
    summary = f"{device}, perturbed={trainer.num_perturbed_completions}, jsd_mean={max(jsd):.2e}, moved {moved}"
    return problems, summary


def full_equals_grpo(model_dir, dataset, output_dir, cpu):
    """`full` against GRPOTrainer on one batch: the largest loss and gradient differences, relative."""
    vepo = quiet(
        VEPOTrainer(
            model=model_dir,
            reward_funcs=length_reward,
            args=make_args(output_dir, cpu, selection_strategy="full"),
            train_dataset=dataset,
        )
    )
    grpo = quiet(
        GRPOTrainer(
            model=model_dir,
            reward_funcs=length_reward,
            args=make_args(output_dir, cpu, GRPOConfig),
            train_dataset=dataset,
        )
    )
    grpo.model.load_state_dict(vepo.model.state_dict())
    for trainer in (vepo, grpo):
        trainer.model.train()
        trainer.state.global_step = 0
        trainer.current_gradient_accumulation_steps = 1
    inputs = vepo._prepare_inputs(next(iter(vepo.get_train_dataloader())))
    grpo_inputs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items() if k != SELECTION_KEY}
    vepo_loss = vepo.compute_loss(vepo.model, inputs)
    grpo_loss = grpo.compute_loss(grpo.model, grpo_inputs)
    vepo_loss.backward()
    grpo_loss.backward()
    loss_diff = abs(float(vepo_loss) - float(grpo_loss)) / max(abs(float(grpo_loss)), 1e-3)
    grad_diff, compared, exact = 0.0, 0, True
    for p, q in zip(vepo.model.parameters(), grpo.model.parameters()):
        if p.grad is None and q.grad is None:
            continue
        if (p.grad is None) != (q.grad is None):
            return float("inf"), float("inf"), 0, False
        compared += 1
        exact &= torch.equal(p.grad, q.grad)
        scale = q.grad.float().abs().max().clamp_min(1e-8)
        grad_diff = max(grad_diff, float((p.grad.float() - q.grad.float()).abs().max() / scale))
    exact &= torch.equal(vepo_loss.detach(), grpo_loss.detach())
    return loss_diff, grad_diff, compared, exact


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="run on the CPU in fp32")
    parser.add_argument("--families", default=None, help="comma-separated family names (default: all)")
    args = parser.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        sys.exit("gpu_families.py: no CUDA device; pass --cpu to run on the CPU")
    if args.cpu:
        torch.set_num_threads(min(2, os.cpu_count() or 1))
    names = args.families.split(",") if args.families else [family.name for family in FAMILIES]
    unknown = sorted(set(names) - {family.name for family in FAMILIES})
    if unknown:
        sys.exit(f"gpu_families.py: unknown families {unknown}; known: {[family.name for family in FAMILIES]}")
    dataset = synthetic_training_dataset(8, seed=0)
    rows, failures = [], []
    start_all = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for family in FAMILIES:
            if family.name not in names:
                continue
            if family.trl_failure:
                rows.append({"family": family.name, "check": "all", "status": "skipped", "detail": family.trl_failure})
                print(f"skip        {family.name:<18} {family.trl_failure[:100]}")
                continue
            model_dir = None
            for check in [f"vepo {p}" for p in PERTURBATIONS] + ["full = GRPOTrainer"]:
                start = time.perf_counter()
                try:
                    # Built inside the try: a family whose processor cannot load here fails its own rows only
                    model_dir = model_dir or str(save_tiny(family.name, os.path.join(tmp, family.name)))
                    if check.startswith("vepo"):
                        problems, detail = two_steps(model_dir, dataset, os.path.join(tmp, "out"), args.cpu, check[5:])
                    else:
                        loss_diff, grad_diff, compared, exact = full_equals_grpo(
                            model_dir, dataset, os.path.join(tmp, "out"), args.cpu
                        )
                        # fp32 on the CPU: the same kernels, so the same bits; bf16: within a few ulps
                        ok = exact if args.cpu else (loss_diff <= BF16_RTOL and grad_diff <= BF16_RTOL)
                        problems = [] if ok and compared else [f"loss rel diff {loss_diff:.2e}, grad {grad_diff:.2e}"]
                        detail = (
                            f"loss rel diff {loss_diff:.1e}, max grad rel diff {grad_diff:.1e} over {compared} "
                            f"tensors{' (bit for bit)' if exact else ''}"
                        )
                except Exception:  # report every family, then fail at the end
                    problems, detail = [traceback.format_exc(limit=-3).strip()], "error"
                seconds = time.perf_counter() - start
                status = "ok" if not problems else "FAIL"
                rows.append({"family": family.name, "check": check, "status": status, "seconds": round(seconds, 1),
                             "detail": detail, "problems": problems})  # fmt: skip
                print(f"{status:<4} {seconds:5.1f} s {family.name:<18} {check:<22} {detail}")
                for problem in problems:
                    print("        " + problem.replace("\n", "\n        "))
                if problems:
                    failures.append(f"{family.name}: {check}")
    passed = sum(row["status"] == "ok" for row in rows)
    skipped = sum(row["status"] == "skipped" for row in rows)
    print(
        f"{passed} passed, {len(failures)} failed, {skipped} families skipped in {time.perf_counter() - start_all:.0f} s"
    )
    print(json.dumps({"passed": passed, "failed": failures, "skipped": skipped, "rows": rows}))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
