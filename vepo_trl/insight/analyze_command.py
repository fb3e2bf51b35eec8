"""`vepo-trl analyze`: the paper's selection analysis (top-k entropy against top-k JSD) over a data set."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..options import OneLineParser
from .commands import (
    UsageError,
    _add_generation_args,
    _add_model_args,
    _add_settings_args,
    _check_model,
    _dataset_bounds,
    _load_model,
    _load_rows,
    _pixel_bounds,
    _read_recipe,
    _settings,
    fail,
)


# ---------------------------------------------------------------------------------------------------------------------
# analyze
# ---------------------------------------------------------------------------------------------------------------------

ANALYZE_HELP = """The paper's selection analysis (section 2.2, Fig. 2, Fig. 5c) over a data set and a model.

For each prompt, sample --num_generations responses, compute H, JSD and |dH| per token with the clean and perturbed
image, and count per response: how many top-k JSD tokens (and top-k |dH| tokens) top-k entropy also keeps, and how
many top-k JSD tokens the selection (VEPO) misses, for each k. Writes analysis.json, analysis.md (the table),
recall.png and entropy_vs_jsd.png (the joint distribution, Fig. 2a) under --output_dir.

Example:
  vepo-trl analyze --model tiny-qwen2.5-vl --dataset synthetic --limit 16 --output_dir vepo-analysis
"""


def analyze_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="vepo-trl analyze", description=ANALYZE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    data = parser.add_argument_group("data")
    data.add_argument("--dataset", required=True, help="Data set name or local file (synthetic generates rows).")
    data.add_argument("--split", default="train")
    data.add_argument("--limit", type=int, default=32, help="Prompts to analyse (the first N rows). Default 32.")
    _add_model_args(parser)
    _add_settings_args(parser, with_k=False)
    parser.add_argument(
        "--ratios", nargs="+", type=float, default=[0.1, 0.2, 0.4, 0.8], help="The k values. Default 0.1 0.2 0.4 0.8."
    )
    _add_generation_args(parser, num_generations=4)
    parser.add_argument("--output_dir", default="vepo-analysis")
    parser.add_argument("--save_records", help="Also save every response's selection records (JSON Lines) here.")
    return parser


def analyze_main(argv: list[str]) -> None:
    parser = analyze_parser()
    args = parser.parse_args(argv)
    try:
        recipe = _read_recipe(args.config) if args.config else {}
        model_name = _check_model(args.model or recipe.get("model_name_or_path"))
        settings = _settings(args, recipe)
        # --output_dir, --limit and --ratios went through the option table as they were parsed
        bounds = _pixel_bounds(args, recipe)
        dataset = _load_rows(args.dataset, args.split, args.limit, _dataset_bounds(args, bounds))
        rows = [dataset[i] for i in range(min(args.limit, len(dataset)))]
        rows = [row for row in rows if row.get("images")]
        if not rows:
            raise UsageError(f"--dataset {args.dataset}: no rows with an image")
        model, processor, _ = _load_model(model_name, args.device, args.dtype)
    except UsageError as error:
        fail(parser.prog, error)

    analysis, records = run_analysis(model, processor, rows, settings, args=args)
    meta = {
        "model": model_name,
        "dataset": args.dataset,
        "split": args.split,
        "num_generations": 1 if args.greedy else args.num_generations,
        "max_new_tokens": args.max_new_tokens,
        **{f"setting_{k}": v for k, v in settings.describe().items() if k not in ("strategy", "alpha")},
    }
    paths = analysis.write(args.output_dir, meta=meta)
    if args.save_records:
        from .records import save_records

        save_records(args.save_records, records)
        paths["records"] = Path(args.save_records)
    print(analysis.markdown(title=f"Selection analysis: {model_name} on {args.dataset}"))
    print("Wrote " + ", ".join(str(p) for p in paths.values()))


def run_analysis(model, processor, rows, settings, *, args):
    """Score `args.num_generations` sampled responses of each row; return the `SelectionAnalysis` and, when
    `args.save_records` is set, the records (at `settings.ratio`)."""
    import torch

    from ..scoring import row_seeds
    from .analysis import SelectionAnalysis
    from .records import records_from_signals
    from .signals import completion_signals, encode_prompt, sample_completions

    analysis = SelectionAnalysis(ratios=args.ratios, strategy=settings.strategy, alpha=settings.alpha)
    records = []
    start = time.perf_counter()
    for number, row in enumerate(rows):
        prompt = encode_prompt(processor, row["prompt"], row["images"], device=model.device)
        completions = sample_completions(
            model,
            processor,
            prompt,
            1 if args.greedy else args.num_generations,
            max_new_tokens=args.max_new_tokens,
            temperature=settings.temperature,
            greedy=args.greedy,
            seed=args.sample_seed + number,
        )
        completions = [c for c in completions if c]
        if not completions:
            continue
        example = completion_signals(model, processor, prompt, completions, settings, batch_size=args.batch_size)
        seeds = None
        if settings.strategy == "random":
            n = len(completions)
            sequence = prompt["input_ids"].expand(n, -1)
            seeds = row_seeds(
                torch.cat([sequence, example.completion_ids], 1),
                torch.cat([prompt["attention_mask"].bool().expand(n, -1), example.mask], 1),
                settings.seed,
                settings.step,
            )
        analysis.add(example.signals, example.mask, seeds=seeds)
        if args.save_records:
            records += records_from_signals(
                example.completion_ids,
                processor,
                example.signals,
                example.mask,
                example.selected,
                ratio=settings.ratio,
                alpha=settings.alpha,
                strategy=settings.strategy,
                prompts=[row["prompt"]] * len(completions),
                images=[row["images"]] * len(completions),
                groups=[number] * len(completions),
            )
        if (number + 1) % 8 == 0 or number + 1 == len(rows):
            print(f"  {number + 1}/{len(rows)} prompts ({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    if not analysis.prompts:
        raise SystemExit("vepo-trl analyze: error: every sampled response was empty; nothing to analyse")
    return analysis, records
