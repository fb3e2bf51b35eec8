"""The `vepo-trl` command line.

vepo-trl demo                      train VEPO on a tiny model and synthetic data on the CPU (about a minute)
vepo-trl train --config R.yaml     train from a recipe (any key can be overridden: --selection_ratio 0.3)
vepo-trl evaluate --model M        greedy accuracy/format on a data set
vepo-trl strategies                list the selection strategies and perturbations
vepo-trl inspect --model M ...     an HTML page of the tokens VEPO selects in a model's responses
vepo-trl analyze --model M ...     the paper's selection analysis (top-k entropy vs top-k JSD) over a data set
vepo-trl plot RUN_DIR [RUN_DIR]    PNG training curves of one or several runs
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from importlib import resources
from pathlib import Path


DEMO_RECIPE = "recipes/tiny.yaml"


def _train(argv: list[str]):
    from .train import main, make_parser

    return main(*make_parser().parse_args_and_config(argv))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def write_demo_report(trainer, seconds: float) -> str:
    """Write `metrics.jsonl` and `summary.md` next to the saved model; return the summary."""
    output_dir = Path(trainer.args.output_dir)
    steps = [entry for entry in trainer.state.log_history if "loss" in entry]
    with open(output_dir / "metrics.jsonl", "w") as f:
        for entry in trainer.state.log_history:
            f.write(json.dumps(entry) + "\n")

    def series(name):
        return [entry[name] for entry in steps if name in entry]

    def first_last(name):
        values = series(name)
        quarter = max(1, len(values) // 4)
        return _mean(values[:quarter]), _mean(values[-quarter:])

    reward_start, reward_end = first_last("reward")
    args = trainer.args
    model_name = trainer.model.config._name_or_path
    if "tiny-qwen2.5-vl" in model_name:
        model_name = "the tiny random Qwen2.5-VL"
    lines = [
        "# vepo-trl demo",
        "",
        f"Trained {model_name} ({sum(p.numel() for p in trainer.model.parameters()):,} parameters) with VEPO for "
        f"{trainer.state.global_step} steps in {seconds:.0f} s on the CPU.",
        "",
        f"- Selection: `{args.selection_strategy}`, k = {args.selection_ratio}, alpha = {args.selection_alpha}; "
        f"perturbation `{args.perturbation}` at noise step {args.noise_step}.",
        f"- {trainer.num_perturbed_completions} sampled completions each went through one perturbed-image forward.",
        f"- Reward (mean of the first / last quarter of logged steps): {reward_start:.3f} -> {reward_end:.3f}.",
        f"- Tokens trained on: {_mean(series('vepo/selected_fraction')):.1%} of valid completion tokens.",
        f"- Mean JSD between clean and perturbed next-token distributions: {_mean(series('vepo/jsd_mean')):.4f} nats; "
        f"mean |entropy gap| {_mean(series('vepo/entropy_gap_abs_mean')):.4f} nats.",
        f"- Of each response's top-k JSD tokens, top-k entropy would miss "
        f"{_mean(series('vepo/top_jsd_missed_by_entropy')):.1%}; VEPO's selection misses "
        f"{_mean(series('vepo/top_jsd_missed_by_selection')):.1%} (the paper's Fig. 5c diagnostic).",
        "",
        f"Model and processor: `{output_dir}` (load with `AutoModelForImageTextToText.from_pretrained`).",
        "Per-step metrics: `metrics.jsonl`; model card: `README.md`.",
        "",
        "A random tiny model learns nothing useful; the demo shows the pipeline a GPU run uses. For the paper's run see",
        "`recipes/README.md`.",
    ]
    summary = "\n".join(lines) + "\n"
    (output_dir / "summary.md").write_text(summary)
    return summary


def _demo(argv: list[str]) -> None:
    import torch

    # The tiny model's matrices gain nothing from intra-op threads, and threads contend badly on a busy machine
    torch.set_num_threads(1)
    recipe = resources.files("vepo_trl").joinpath(DEMO_RECIPE)
    with resources.as_file(recipe) as path:
        start = time.perf_counter()
        trainer = _train(["--config", str(path), *argv])
    if trainer.accelerator.is_main_process:
        print(write_demo_report(trainer, time.perf_counter() - start))


def _evaluate(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="vepo-trl evaluate", description="Greedy evaluation on a data set.")
    parser.add_argument("--model", required=True, help="Model path or Hub id.")
    parser.add_argument("--dataset", default="geometry3k", help="geometry3k, k12, mmk12, a local file, ...")
    parser.add_argument("--split", default="test")
    parser.add_argument("--limit", type=int, default=None, help="Evaluate only the first N rows.")
    parser.add_argument("--max_new_tokens", type=int, default=2048)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--min_pixels", type=int, default=262_144)
    parser.add_argument("--max_pixels", type=int, default=1_000_000)
    parser.add_argument("--output", default=None, help="Write per-row records as JSONL here.")
    args = parser.parse_args(argv)

    from .data import load_vepo_dataset
    from .evaluation import evaluate, load_for_evaluation
    from .train import resolve_model_name

    dataset = load_vepo_dataset(args.dataset, args.split, min_pixels=args.min_pixels, max_pixels=args.max_pixels)
    model, processor = load_for_evaluation(resolve_model_name(args.model))
    result = evaluate(
        model, processor, dataset, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, limit=args.limit
    )
    print(result)
    if args.output:
        with open(args.output, "w") as f:
            for record in result.records:
                f.write(json.dumps(record) + "\n")


def _strategies(argv: list[str]) -> None:
    from .perturb import PERTURBATIONS
    from .scoring import SELECTION_STRATEGIES

    print("Selection strategies (--selection_strategy):")
    for name, strategy in sorted(SELECTION_STRATEGIES.items()):
        extra = " [perturbed pass]" if strategy.needs_perturbed_pass else ""
        print(f"  {name:<22}{strategy.description}{extra}")
    print("Perturbations (--perturbation):")
    for name, fn in sorted(PERTURBATIONS.items()):
        print(f"  {name:<22}{(fn.__doc__ or '').strip().splitlines()[0]}")


def _inspect(argv: list[str]) -> None:
    from .insight.commands import inspect_main

    inspect_main(argv)


def _analyze(argv: list[str]) -> None:
    from .insight.commands import analyze_main

    analyze_main(argv)


def _plot(argv: list[str]) -> None:
    from .insight.commands import plot_main

    plot_main(argv)


COMMANDS = {
    "train": _train,
    "demo": _demo,
    "evaluate": _evaluate,
    "strategies": _strategies,
    "inspect": _inspect,
    "analyze": _analyze,
    "plot": _plot,
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(__doc__.strip())
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nUnknown command {argv[0]!r}. Commands: {', '.join(COMMANDS)}.", file=sys.stderr)
            sys.exit(2)
        return
    COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    main()
