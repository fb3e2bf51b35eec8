"""Host memory of the rollout-time cache: the clean hidden states of every image response, kept on the CPU from TRL's
rollout-time forward until the advantages exist (`VEPOConfig.rollout_cache_gb` bounds it).

Bytes per completion = valid completion tokens x hidden size x bytes per value (bf16: 2). The script prints them at
the paper's recipe (Qwen2.5-VL-3B / 7B widths, 512 prompts x 12 rollouts over 8 processes = 768 completions per
process, responses of 600 and 2,048 tokens), per process and per 8-GPU node, against the default bound; then measures
the cache on the tiny model through `VEPOTrainer` itself and checks it against the formula.

    python benchmarks/bench_rollout_cache.py            # a few seconds
    python benchmarks/bench_rollout_cache.py --no_measure
"""

from __future__ import annotations

import argparse
import os
import tempfile
import warnings


os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

# Hidden sizes of the paper's models (their config.json: text_config.hidden_size)
WIDTHS = {"Qwen2.5-VL-3B": 2048, "Qwen2.5-VL-7B": 3584}
PROMPTS, ROLLOUTS, PROCESSES, BYTES_BF16 = 512, 12, 8, 2


def paper_table(budget_gb: float) -> None:
    per_process = PROMPTS * ROLLOUTS // PROCESSES
    print(f"Paper recipe: {PROMPTS} prompts x {ROLLOUTS} rollouts / {PROCESSES} processes = {per_process} per process")
    print(
        f"{'model':<15} {'tokens':>6} {'MB/completion':>14} {'GB/process':>11} {'GB/node':>8}  with the default bound"
    )
    for model, width in WIDTHS.items():
        for tokens in (600, 2048):
            per_completion = tokens * width * BYTES_BF16
            process = per_completion * per_process / 1e9
            mode = "kept until the advantages" if process <= budget_gb else "scored chunk by chunk (flat memory)"
            print(
                f"{model:<15} {tokens:>6} {per_completion / 1e6:>14.2f} {process:>11.2f} {process * PROCESSES:>8.1f}"
                f"  {mode}"
            )
    print(f"Default bound: rollout_cache_gb = {budget_gb:g} GB per process (tokens are valid completion tokens of")
    print("responses with an image; responses stop early at EOS, so real use is below these full-length figures).")


def measure() -> None:
    from vepo_trl import VEPOConfig, VEPOTrainer
    from vepo_trl.builtin.tiny_models import save_tiny_qwen2_5_vl
    from vepo_trl.data import synthetic_training_dataset

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(save_tiny_qwen2_5_vl(os.path.join(tmp, "tiny")))
        args = VEPOConfig(
            output_dir=os.path.join(tmp, "out"),
            per_device_train_batch_size=8,
            num_generations=4,
            max_completion_length=32,
            steps_per_generation=2,  # > accumulation: TRL runs its rollout-time forward, which VEPO scores
            max_steps=1,
            report_to="none",
            save_strategy="no",
            use_cpu=True,
            bf16=False,
            disable_tqdm=True,
        )
        trainer = VEPOTrainer(
            model=model_dir,
            reward_funcs=lambda completions, **_: [float(len(c[0]["content"]) % 5) for c in completions],
            args=args,
            train_dataset=synthetic_training_dataset(32, seed=0),
        )
        trainer.train()
        logged = trainer._metrics["train"].get("vepo/rollout_cache_gb") or [
            entry["vepo/rollout_cache_gb"] for entry in trainer.state.log_history if "vepo/rollout_cache_gb" in entry
        ]
        tokens = sum(int(chunk["completion_mask"].sum()) for chunk in trainer._buffered_inputs)
        width = trainer.model.config.get_text_config().hidden_size
        expected = tokens * width * 4 / 1e9  # fp32 on the CPU
        print(
            f"\ntiny model, one rollout of {args.generation_batch_size} completions: cache "
            f"{logged[-1] * 1e9:.0f} bytes logged, formula {expected * 1e9:.0f} ({tokens} tokens x {width} x 4 bytes)"
        )


def main() -> None:
    from vepo_trl import VEPOConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no_measure", action="store_true", help="Only the arithmetic at the paper's widths.")
    args = parser.parse_args()
    default = next(f.default for f in VEPOConfig.__dataclass_fields__.values() if f.name == "rollout_cache_gb")
    paper_table(default)
    if not args.no_measure:
        measure()


if __name__ == "__main__":
    main()
