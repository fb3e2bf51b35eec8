"""`vepo-trl analyze`: the paper's selection analysis (top-k entropy against top-k JSD) over a data set."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ..files import check_data_rows
from ..local_models import check_model_name
from .commands import (
    UsageError,
    _dataset_bounds,
    _load_model,
    _load_rows,
    _pixel_bounds,
    _read_recipe,
    _sample,
    _settings,
)


# ---------------------------------------------------------------------------------------------------------------------
# analyze
# ---------------------------------------------------------------------------------------------------------------------


def analyze_main(args) -> None:
    """`vepo-trl analyze`'s work on its parsed options (`vepo_trl.commands.analyze`); user errors raise `UsageError`."""
    recipe = _read_recipe(args.config) if args.config else {}
    model_name = check_model_name(args.model or recipe.get("model_name_or_path"), "--model", adapters=False)
    check_data_rows(args.dataset)  # its format and schema, before a model or an image loads
    settings = _settings(args, recipe)
    # --output_dir, --limit and --ratios went through the option table as they were parsed
    bounds = _pixel_bounds(args, recipe)
    dataset = _load_rows(args.dataset, args.split, args.limit, _dataset_bounds(args, bounds))
    rows = [dataset[i] for i in range(min(args.limit, len(dataset)))]
    rows = [row for row in rows if row.get("images")]
    if not rows:
        raise UsageError(f"--dataset {args.dataset}: no rows with an image")
    model, processor, _ = _load_model(model_name, args.device, args.dtype)

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

        save_records(args.save_records, records, append=True)  # checked before the model loaded
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
    from .signals import completion_signals, encode_prompt

    analysis = SelectionAnalysis(
        ratios=args.ratios, strategy=settings.strategy, alpha=settings.alpha, strategy_params=settings.strategy_params
    )
    records = []
    start = time.perf_counter()
    for number, row in enumerate(rows):
        prompt = encode_prompt(processor, row["prompt"], row["images"], device=model.device)
        completions = _sample(model, processor, prompt, args, settings, seed=args.sample_seed + number)
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
