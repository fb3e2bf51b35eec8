"""`vepo-trl analyze`: its options, declared once (`AnalyzeOptions`) and checked by their rules as they are
parsed (before torch or a model is
imported), then `analyze_main` below, over the `vepo_trl.insight` library."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..files import check_data_rows
from ..insight import (
    dataset_bounds,
    load_model,
    load_rows,
    pixel_bounds,
    read_recipe,
    sample_completions,
    signal_settings,
)
from ..local_models import check_model_name
from ..options import option, parser_for
from ..validation import ALWAYS, RECORDS_FILE, TEXT, Rule, at_least, path_rule, whole
from .insight_options import ModelOptions, ResponseOptions, SettingsOptions


ANALYZE_HELP = """The paper's selection analysis (section 2.2, Fig. 2, Fig. 5c) over a data set and a model.

For each prompt, sample --num_generations responses, compute H, JSD and |dH| per token with the clean and perturbed
image, and count per response: how many top-k JSD tokens (and top-k |dH| tokens) top-k entropy also keeps, and how
many top-k JSD tokens the selection (VEPO) misses, for each k. Writes analysis.json, analysis.md (the table),
recall.png and entropy_vs_jsd.png (the joint distribution, Fig. 2a) under --output_dir.

Example:
  vepo-trl analyze --model tiny-qwen2.5-vl --dataset synthetic --limit 16 --output_dir vepo-analysis
"""


@dataclass
class AnalyzeData:
    dataset: str | None = option(None, "Data set name or local file (synthetic generates rows).", reads=ALWAYS, rule=TEXT,
                                 group="data", required=True)  # fmt: skip
    split: str = option("train", "", reads=ALWAYS, rule=TEXT, group="data")
    limit: int = option(32, "Prompts to analyse (the first N rows). Default 32.", group="data",
                        reads=ALWAYS, rule=whole(at_least(1), "a whole number >= 1"))  # fmt: skip


@dataclass
class AnalyzeOptions(ResponseOptions, SettingsOptions, ModelOptions, AnalyzeData):
    ratios: list[float] = option([0.1, 0.2, 0.4, 0.8], "The k values. Default 0.1 0.2 0.4 0.8.",
                                 reads=ALWAYS, rule=Rule("numbers", "fractions in (0, 1]", lambda v: 0 < v <= 1))  # fmt: skip
    output_dir: str = option(
        "vepo-analysis", "", reads=ALWAYS, rule=path_rule("out_folder", "a folder that can be written", False)
    )
    save_records: str | None = option(None, "Also save every response's selection records (JSON Lines) here; appended to a records file that exists.",
                                      reads=ALWAYS, rule=RECORDS_FILE)  # fmt: skip


def make_parser() -> argparse.ArgumentParser:
    return parser_for(
        AnalyzeOptions,
        prog="vepo-trl analyze",
        description=ANALYZE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def main(argv: list[str]) -> None:
    args = make_parser().parse_args(argv)
    analyze_main(args)


# ---------------------------------------------------------------------------------------------------------------------
# analyze
# ---------------------------------------------------------------------------------------------------------------------


def analyze_main(args) -> None:
    """`vepo-trl analyze`'s work on its parsed options (`vepo_trl.commands.analyze`); user errors raise `UsageError`."""
    recipe = read_recipe(args.config) if args.config else {}
    model_name = check_model_name(args.model or recipe.get("model_name_or_path"), "--model", adapters=False)
    check_data_rows(args.dataset)  # its format and schema, before a model or an image loads
    settings = signal_settings(args, recipe)
    # --output_dir, --limit and --ratios went through the option table as they were parsed
    bounds = pixel_bounds(args, recipe)
    dataset = load_rows(args.dataset, args.split, args.limit, dataset_bounds(args, bounds))
    rows = [dataset[i] for i in range(min(args.limit, len(dataset)))]
    rows = [row for row in rows if row.get("images")]
    if not rows:
        raise UsageError(f"--dataset {args.dataset}: no rows with an image")
    model, processor, _ = load_model(model_name, args.device, args.dtype)

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
        from ..insight import save_records

        save_records(args.save_records, records, append=True)  # checked before the model loaded
        paths["records"] = Path(args.save_records)
    print(analysis.markdown(title=f"Selection analysis: {model_name} on {args.dataset}"))
    print("Wrote " + ", ".join(str(p) for p in paths.values()))


def run_analysis(model, processor, rows, settings, *, args):
    """Score `args.num_generations` sampled responses of each row; return the `SelectionAnalysis` and, when
    `args.save_records` is set, the records (at `settings.ratio`)."""
    import torch

    from ..insight import SelectionAnalysis, completion_signals, encode_prompt, records_from_signals
    from ..scoring import row_seeds

    analysis = SelectionAnalysis(
        ratios=args.ratios, strategy=settings.strategy, alpha=settings.alpha, strategy_params=settings.strategy_params
    )
    records = []
    start = time.perf_counter()
    for number, row in enumerate(rows):
        prompt = encode_prompt(processor, row["prompt"], row["images"], device=model.device)
        completions = sample_completions(model, processor, prompt, args, settings, seed=args.sample_seed + number)
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
