"""Step time of VEPO against full GRPO (TRL's own `GRPOTrainer`) and top-20% entropy, on the tiny Qwen2.5-VL.

All three train the same tiny model on the same synthetic rows with the same seed. The learning rate is 0 so every
run samples exactly the same completions: the step times then differ only by what each method computes (the optimiser
still runs). The runs alternate in rounds, and every ratio is taken WITHIN a round (method A's median step time over
method B's in the same round); the figure quoted is the median of the per-round ratios, with their min and max. Load
that hits one round (another job on the machine) then shows as a wide spread, never as one method's cost: a pooled
median across rounds would read a loaded VEPO round against an unloaded GRPO round. The order of the methods rotates
from round to round (each first once in three). For each method the script also prints the median step time
(generation, rewards, forward, backward, optimiser), the model's loss forwards per step (outside generation and the
perturbed pass), and the perturbed forwards per sampled completion.

    python benchmarks/bench_step.py                   # about one minute on 2 CPU cores
    python benchmarks/bench_step.py --steps 30 --rounds 5

The last line is one JSON object with `vepo_over_grpo` (median of per-round step-time ratios), its per-round values
and `perturbed_forwards_per_completion`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import warnings

import torch
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
warnings.filterwarnings("ignore")

from vepo_trl import VEPOConfig, VEPOTrainer  # noqa: E402
from vepo_trl.builtin.tiny_models import save_tiny_qwen2_5_vl  # noqa: E402
from vepo_trl.data import synthetic_training_dataset  # noqa: E402


METHODS = {
    "grpo": (GRPOTrainer, GRPOConfig, {}),
    "entropy_top20": (VEPOTrainer, VEPOConfig, {"selection_strategy": "entropy", "selection_ratio": 0.2}),
    "vepo": (VEPOTrainer, VEPOConfig, {"selection_strategy": "vepo", "selection_ratio": 0.2}),
}


def length_reward(completions, **kwargs):
    return [float(len(completion[0]["content"]) % 5) for completion in completions]


class StepTimer(TrainerCallback):
    def __init__(self):
        self.times, self._start = [], None

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self._start)


def run_method(name, model_dir, dataset, output_dir, args):
    trainer_cls, config_cls, extra = METHODS[name]
    config = config_cls(
        output_dir=output_dir,
        per_device_train_batch_size=args.batch_size,
        num_generations=4,
        max_completion_length=args.completion_length,
        max_steps=args.steps,
        learning_rate=0.0,  # identical completions in every run: the difference is the method's own cost
        logging_steps=10_000,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        seed=0,
        disable_tqdm=True,
        **extra,
    )
    trainer = trainer_cls(model=model_dir, reward_funcs=length_reward, args=config, train_dataset=dataset)
    timer = StepTimer()
    trainer.add_callback(timer)

    # Count forwards of the language backbone inside the loss (generation's decode steps are not counted)
    in_loss = {"flag": False}
    forwards = {"count": 0}
    backbone = trainer.model.model.language_model
    backbone.register_forward_hook(lambda *_: forwards.__setitem__("count", forwards["count"] + in_loss["flag"]))
    compute_loss = trainer.compute_loss

    def counting_compute_loss(*a, **k):
        in_loss["flag"] = True
        try:
            return compute_loss(*a, **k)
        finally:
            in_loss["flag"] = False

    trainer.compute_loss = counting_compute_loss
    perturbed_pass = getattr(trainer, "perturbed_pass", None)
    if perturbed_pass is not None:
        # The perturbed pass is counted per completion (`num_perturbed_completions`), not as loss forwards: it runs one
        # forward per chunk, or a chunk's prompts then its completions from their caches (and so are the dummies a
        # micro-batch with nothing to score runs)
        def uncounted(method):
            def run(*a, **k):
                flag, in_loss["flag"] = in_loss["flag"], False
                try:
                    return method(*a, **k)
                finally:
                    in_loss["flag"] = flag

            return run

        perturbed_pass.perturbed_hidden = uncounted(perturbed_pass.perturbed_hidden)
        perturbed_pass.dummy_forward = uncounted(perturbed_pass.dummy_forward)
        perturbed_pass.dummy_text_forward = uncounted(perturbed_pass.dummy_text_forward)
    trainer.train()
    completions = args.steps * args.batch_size
    return {
        "times": timer.times[args.warmup :],
        "loss_forwards_per_step": forwards["count"] / args.steps,
        "perturbed_forwards_per_completion": getattr(trainer, "num_perturbed_completions", 0) / completions,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="Optimiser steps per run.")
    parser.add_argument("--warmup", type=int, default=3, help="Leading steps of each run left out of the median.")
    parser.add_argument(
        "--rounds", type=int, default=5, help="Runs per method, alternating; ratios are taken within each round."
    )
    parser.add_argument("--batch_size", type=int, default=8, help="Completions per step (2 prompts x 4).")
    parser.add_argument("--completion_length", type=int, default=32)
    args = parser.parse_args()

    if args.rounds < 1 or args.steps <= args.warmup:
        parser.error("need --rounds >= 1 and --steps > --warmup")
    results = {name: {"round_medians": [], "loss_forwards_per_step": [], "perturbed": []} for name in METHODS}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(save_tiny_qwen2_5_vl(os.path.join(tmp, "tiny")))
        dataset = synthetic_training_dataset(64, seed=0)
        for round_index in range(args.rounds):
            # The order rotates over the rounds (each method first once in three), so whatever warms up within a
            # round does not land on one method
            names = list(METHODS)
            for name in names[round_index % len(names) :] + names[: round_index % len(names)]:
                run = run_method(name, model_dir, dataset, os.path.join(tmp, f"{name}-{round_index}"), args)
                results[name]["round_medians"].append(statistics.median(run["times"]))
                results[name]["loss_forwards_per_step"].append(run["loss_forwards_per_step"])
                results[name]["perturbed"].append(run["perturbed_forwards_per_completion"])
                print(
                    f"round {round_index + 1}: {name:<14} median {results[name]['round_medians'][-1]:.4f} s",
                    flush=True,
                )

    def ratios(a: str, b: str) -> list[float]:
        # Paired within each round: load that hits one round moves both sides of its ratio
        return [x / y for x, y in zip(results[a]["round_medians"], results[b]["round_medians"])]

    def spread(values: list[float]) -> dict[str, float]:
        return {
            "median": round(statistics.median(values), 4),
            "min": round(min(values), 4),
            "max": round(max(values), 4),
        }

    over_grpo = {name: spread(ratios(name, "grpo")) for name in METHODS}
    print(
        f"\ntiny Qwen2.5-VL, {args.batch_size} completions x {args.completion_length} tokens per step, "
        f"{args.rounds} rounds x {args.steps - args.warmup} timed steps per method, "
        f"torch threads {torch.get_num_threads()}"
    )
    print(
        f"{'method':<14} {'median s':>9} {'x GRPO (median of rounds)':>26} {'[min, max]':>16} "
        f"{'loss fwd/step':>14} {'perturbed fwd/completion':>25}"
    )
    for name, r in results.items():
        ratio = over_grpo[name]
        bounds = "[{min:.3f}, {max:.3f}]".format(**ratio)
        print(
            f"{name:<14} {statistics.median(r['round_medians']):>9.4f} {ratio['median']:>26.3f} {bounds:>16} "
            f"{statistics.mean(r['loss_forwards_per_step']):>14.2f} {statistics.mean(r['perturbed']):>25.2f}"
        )
    vepo_over_entropy = spread(ratios("vepo", "entropy_top20"))
    print(
        json.dumps(
            {
                "vepo_over_grpo": over_grpo["vepo"]["median"],
                "entropy_over_grpo": over_grpo["entropy_top20"]["median"],
                "vepo_over_entropy": vepo_over_entropy["median"],
                "ratio_spread": {
                    "vepo_over_grpo": over_grpo["vepo"],
                    "entropy_over_grpo": over_grpo["entropy_top20"],
                    "vepo_over_entropy": vepo_over_entropy,
                },
                "per_round_vepo_over_grpo": [round(x, 4) for x in ratios("vepo", "grpo")],
                "perturbed_forwards_per_completion": statistics.mean(results["vepo"]["perturbed"]),
                "loss_forwards_per_step": {
                    n: statistics.mean(r["loss_forwards_per_step"]) for n, r in results.items()
                },
                "round_median_step_seconds": {
                    n: [round(t, 4) for t in r["round_medians"]] for n, r in results.items()
                },
                "timed_steps_per_round": args.steps - args.warmup,
            }
        )
    )


if __name__ == "__main__":
    main()
