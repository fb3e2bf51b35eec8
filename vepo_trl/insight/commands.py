"""`vepo-trl inspect`, `vepo-trl analyze` and `vepo-trl plot`.

Every argument is checked before a model loads; bad input ends with one line, `vepo-trl <command>: error: ...`, on
stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from ..local_models import TINY_MODEL


# The name `vepo_trl.train` gives the synthetic data (not imported from there: that module loads TRL's trainers,
# seconds before a bad argument could be reported)
SYNTHETIC_DATASET = "synthetic"


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (no usage block), exit code 2."""

    def error(self, message: str) -> NoReturn:
        fail(self.prog, message)


class UsageError(ValueError):
    """Bad input found after parsing (a file that is not there, a value out of range)."""


def fail(prog: str, message: str) -> NoReturn:
    message = " ".join(str(message).split())
    print(f"{prog}: error: {message}", file=sys.stderr)
    sys.exit(2)


# ---------------------------------------------------------------------------------------------------------------------
# Shared arguments and checks
# ---------------------------------------------------------------------------------------------------------------------


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument("--model", help="Model folder or Hub id (a Qwen2-VL / Qwen2.5-VL), or tiny-qwen2.5-vl.")
    group.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda when available).")
    group.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])


def _add_settings_args(parser: argparse.ArgumentParser, *, with_k: bool = True) -> None:
    group = parser.add_argument_group(
        "selection settings (default: the paper's, or the training recipe given with --config)"
    )
    group.add_argument("--config", help="A training recipe (YAML): its selection and perturbation keys are used.")
    group.add_argument("--strategy", help="Selection strategy (vepo-trl strategies lists them). Default vepo.")
    if with_k:
        group.add_argument("--k", type=float, help="k: fraction of each response kept. Default 0.2.")
    group.add_argument("--alpha", type=float, help="alpha: JSD against |dH| in the joint signal. Default 0.7.")
    group.add_argument("--perturbation", help="diffusion, gaussian, mean_image, black_image, patch_blackout.")
    group.add_argument("--noise_step", type=int, help="Diffusion step tau in [0, 999]. Default 500.")
    group.add_argument("--noise_sigma", type=float, help="Std of the gaussian perturbation. Default 2.0.")
    group.add_argument("--patch_probability", type=float, help="patch_blackout's drop probability. Default 0.5.")
    group.add_argument("--perturbation_seed", type=int, help="Seed of the perturbation noise. Default 42.")
    group.add_argument("--step", type=int, default=0, help="Training step the noise seed uses. Default 0.")
    group.add_argument("--temperature", type=float, help="Sampling and scoring temperature. Default 1.0.")


def _add_generation_args(parser: argparse.ArgumentParser, num_generations: int) -> None:
    group = parser.add_argument_group("responses")
    group.add_argument("--num_generations", type=int, default=num_generations, help="Completions sampled per prompt.")
    group.add_argument("--max_new_tokens", type=int, default=256)
    group.add_argument("--greedy", action="store_true", help="Decode greedily (one completion) instead of sampling.")
    group.add_argument("--sample_seed", type=int, default=0, help="Seed of the sampling.")
    group.add_argument("--batch_size", type=int, default=8, help="Completions per forward pass.")
    group.add_argument("--min_pixels", type=int, default=None, help="Resize bound of images (default: the paper's).")
    group.add_argument("--max_pixels", type=int, default=None, help="Resize bound of images (default: the paper's).")


def _read_recipe(path: str) -> dict[str, Any]:
    import yaml

    if not os.path.isfile(path):
        raise UsageError(f"--config: no such file: {path}")
    try:
        recipe = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as error:
        raise UsageError(f"--config: {path} is not valid YAML ({str(error).splitlines()[0]})") from None
    if not isinstance(recipe, dict):
        raise UsageError(f"--config: {path} is not a mapping of recipe keys")
    return recipe


def _settings(args: argparse.Namespace, recipe: dict[str, Any]):
    from .signals import SignalSettings

    try:
        return SignalSettings.from_recipe(
            recipe,
            strategy=args.strategy,
            ratio=getattr(args, "k", None),
            alpha=args.alpha,
            perturbation=args.perturbation,
            noise_step=args.noise_step,
            noise_sigma=args.noise_sigma,
            patch_probability=args.patch_probability,
            seed=args.perturbation_seed,
            step=args.step,
            temperature=args.temperature,
        )
    except (TypeError, ValueError) as error:
        raise UsageError(str(error)) from None


def _check_model(name: str | None) -> str:
    if not name:
        raise UsageError("--model is required (a model folder, a Hub id, or tiny-qwen2.5-vl)")
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UsageError(f"--model: {name} is a folder without config.json, not a saved model")
        return str(path)
    if name == TINY_MODEL:
        return name
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise UsageError(f"--model: no such model folder: {name} (nor is it a Hub id of the form org/name)")
    return name


def _check_generation(args: argparse.Namespace) -> None:
    if args.num_generations < 1:
        raise UsageError(f"--num_generations must be at least 1, got {args.num_generations}")
    if args.max_new_tokens < 1:
        raise UsageError(f"--max_new_tokens must be at least 1, got {args.max_new_tokens}")
    if args.batch_size < 1:
        raise UsageError(f"--batch_size must be at least 1, got {args.batch_size}")
    for name in ("min_pixels", "max_pixels"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name} must be positive, got {value}")


def _pixel_bounds(args: argparse.Namespace, recipe: dict[str, Any]) -> dict[str, int]:
    """Image resize bounds: the flags, else the recipe's (as the run resized its data), else the paper's."""
    from ..data.loaders import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS

    for name in ("min_pixels", "max_pixels"):
        if getattr(args, name) is None and isinstance(recipe.get(name), int):
            setattr(args, name, recipe[name])

    bounds = {
        "min_pixels": args.min_pixels or DEFAULT_MIN_PIXELS,
        "max_pixels": args.max_pixels or DEFAULT_MAX_PIXELS,
    }
    if bounds["min_pixels"] > bounds["max_pixels"]:
        raise UsageError(f"--min_pixels {bounds['min_pixels']} exceeds --max_pixels {bounds['max_pixels']}")
    return bounds


def _load_rows(name: str, split: str, needed: int, bounds: dict[str, int], seed: int = 0):
    """The first `needed` rows of a data set (`synthetic` generates them), before any model loads."""
    from ..data import load_vepo_dataset, synthetic_training_dataset

    try:
        if name == SYNTHETIC_DATASET:
            # The tiny model's pixel bounds unless asked otherwise, as the demo trains on
            extra = {k: v for k, v in bounds.items() if v is not None}
            return synthetic_training_dataset(needed, seed=seed, **extra)
        dataset = load_vepo_dataset(name, split, **bounds)
    except Exception as error:  # a missing file, an unknown name, the Hub unreachable: one line says which
        raise UsageError(f"--dataset {name}: {error}") from None
    return dataset


def _load_model(name: str, device: str | None, dtype: str):
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from ..local_models import resolve_model_name

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    # The tiny model's name builds it once, unless a folder of that name exists
    path = resolve_model_name(name) if name == TINY_MODEL else name
    try:
        model = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype).to(device).eval()
        processor = AutoProcessor.from_pretrained(path)
    except (OSError, ValueError) as error:
        raise UsageError(f"--model {name}: {str(error).splitlines()[0]}") from None
    return model, processor, path


def _rewards(completion_texts: list[str], answer: str | None, names: list[str], weights: list[float]):
    """Weighted reward per completion and each function's value, or `(None, None)` without a reference answer."""
    from ..rewards import get_reward_funcs

    if answer is None:
        return [None] * len(completion_texts), [{} for _ in completion_texts]
    conversational = [[{"role": "assistant", "content": text}] for text in completion_texts]
    per_func = {}
    for name, func in zip(names, get_reward_funcs(names)):
        per_func[name] = func(completions=conversational, answer=[answer] * len(completion_texts))
    totals, details = [], []
    for i in range(len(completion_texts)):
        values = {name: per_func[name][i] for name in names}
        valid = [(v, w) for v, w in zip(values.values(), weights) if v is not None]
        totals.append(sum(v * w for v, w in valid) if valid else None)
        details.append({name: (round(v, 4) if v is not None else None) for name, v in values.items()})
    return totals, details


def _check_rewards(args: argparse.Namespace) -> None:
    from ..rewards import get_reward_funcs

    try:
        get_reward_funcs(args.reward_funcs)
    except (KeyError, ValueError) as error:
        raise UsageError(f"--reward_funcs: {error}") from None
    if len(args.reward_weights) != len(args.reward_funcs):
        raise UsageError(
            f"--reward_weights has {len(args.reward_weights)} values for {len(args.reward_funcs)} reward functions"
        )


# ---------------------------------------------------------------------------------------------------------------------
# inspect
# ---------------------------------------------------------------------------------------------------------------------

INSPECT_HELP = """Write one self-contained HTML page showing which tokens of a model's responses VEPO trains on.

Sources (one of):
  --image PATH --question TEXT      a question about an image
  --dataset NAME --index I          a row of a data set (synthetic, geometry3k, a local file, ...)
  --records FILE                    selection records saved by a run or by --save_records (no model needed)

Examples:
  vepo-trl inspect --model tiny-qwen2.5-vl --dataset synthetic --index 3 --output page.html
  vepo-trl inspect --model Qwen/Qwen2.5-VL-7B-Instruct --image fig.png --question "Find x." --num_generations 8
  vepo-trl inspect --records vepo-demo/selection_records.jsonl --output run.html
"""


def inspect_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="vepo-trl inspect", description=INSPECT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_argument_group("source")
    source.add_argument("--image", help="Image file of the prompt.")
    source.add_argument("--question", help="The question (an <image> placeholder marks where the image goes).")
    source.add_argument("--answer", help="Reference answer: the page then shows each completion's reward.")
    source.add_argument("--dataset", help="Data set name or local file; the row's answer gives the rewards.")
    source.add_argument("--split", default="train")
    source.add_argument("--index", type=int, default=None, help="Row of --dataset. Default 0.")
    source.add_argument("--records", help="Render saved selection records (JSON Lines) instead of running a model.")
    source.add_argument("--response", action="append", help="Score this response instead of sampling (repeatable).")
    _add_model_args(parser)
    _add_settings_args(parser)
    _add_generation_args(parser, num_generations=4)
    rewards = parser.add_argument_group("rewards")
    rewards.add_argument("--reward_funcs", nargs="+", default=["accuracy", "format"])
    rewards.add_argument("--reward_weights", nargs="+", type=float, default=[0.9, 0.1])
    output = parser.add_argument_group("output")
    output.add_argument("--output", default="vepo-inspect.html", help="The HTML page to write.")
    output.add_argument("--save_records", help="Also save the selection records (JSON Lines) here.")
    output.add_argument("--title", default=None)
    return parser


def _inspect_source(args: argparse.Namespace) -> str:
    chosen = [name for name in ("image", "dataset", "records") if getattr(args, name)]
    if len(chosen) != 1:
        raise UsageError(
            "give exactly one source: --image PATH --question TEXT, --dataset NAME --index I, or --records FILE"
            + (f" (got --{' and --'.join(chosen)})" if chosen else "")
        )
    source = chosen[0]
    if source == "image":
        if not args.question:
            raise UsageError("--image needs --question")
        if not os.path.isfile(args.image):
            raise UsageError(f"--image: no such file: {args.image}")
        from PIL import Image

        try:
            with Image.open(args.image) as image:
                image.verify()
        except Exception as error:
            raise UsageError(f"--image: {args.image} is not a readable image ({type(error).__name__})") from None
    elif args.question:
        raise UsageError("--question goes with --image; a data set row brings its own question")
    if source != "dataset" and args.index is not None:
        raise UsageError("--index goes with --dataset")
    if args.index is not None and args.index < 0:
        raise UsageError(f"--index must be non-negative, got {args.index}")
    if source == "records":
        if not os.path.isfile(args.records):
            raise UsageError(f"--records: no such file: {args.records}")
        if args.model or args.response:
            raise UsageError("--records renders saved records as they are; drop --model / --response")
    return source


def _write_outputs(args, records, settings_rows) -> None:
    from .page import write_page
    from .records import save_records

    output = Path(args.output)
    if output.suffix.lower() not in (".html", ".htm"):
        output = output.with_suffix(".html")
    write_page(output, records, title=args.title or "VEPO token selection", settings=settings_rows)
    print(f"Wrote {output} ({len(records)} completions).")
    if args.save_records:
        save_records(args.save_records, records)
        print(f"Saved the records to {args.save_records}.")


def _summary_line(records) -> str:
    jsd = sum(sum(r.jsd_top_k) for r in records if r.jsd_top_k is not None)
    missed_h = sum(sum(j and not e for j, e in zip(r.jsd_top_k, r.entropy_top_k)) for r in records if r.jsd_top_k)
    missed_s = sum(sum(j and not s for j, s in zip(r.jsd_top_k, r.selected)) for r in records if r.jsd_top_k)
    if not jsd:
        return ""
    return (
        f"Of {jsd} top-k JSD tokens, top-k entropy misses {missed_h / jsd:.1%} and the selection "
        f"({records[0].strategy}) misses {missed_s / jsd:.1%}."
    )


def inspect_main(argv: list[str]) -> None:
    parser = inspect_parser()
    args = parser.parse_args(argv)
    try:
        source = _inspect_source(args)
        if source == "records":
            from .records import load_records

            try:
                records = load_records(args.records)
            except ValueError as error:
                raise UsageError(f"--records: {error}") from None
            _write_outputs(args, records, {"source": args.records})
            return
        recipe = _read_recipe(args.config) if args.config else {}
        model_name = _check_model(args.model or recipe.get("model_name_or_path"))
        settings = _settings(args, recipe)
        _check_generation(args)
        _check_rewards(args)
        if args.greedy and args.response:
            raise UsageError("--greedy samples a response; --response gives them: choose one")
        bounds = _pixel_bounds(args, recipe)
        if source == "image":
            from ..data.loaders import UnusableRowError, prepare_image

            try:
                images = [prepare_image(args.image, **bounds)]
            except UnusableRowError as error:
                raise UsageError(f"--image: {error}") from None
            from .signals import build_messages

            messages, answer, label = build_messages(args.question, 1), args.answer, args.image
        else:
            index = args.index or 0
            dataset = _load_rows(args.dataset, args.split, index + 1, _dataset_bounds(args, bounds))
            if index >= len(dataset):
                raise UsageError(f"--index {index} is out of range: {args.dataset} has {len(dataset)} rows")
            row = dataset[index]
            messages, images = row["prompt"], row.get("images") or []
            answer = args.answer if args.answer is not None else row.get("answer")
            label = f"{args.dataset}[{index}]"
            if not images:
                raise UsageError(f"{label} has no image; VEPO's signals need one")
        model, processor, _ = _load_model(model_name, args.device, args.dtype)
    except UsageError as error:
        fail(parser.prog, error)

    records = run_inspect(
        model, processor, messages, images, settings, args=args, answer=answer, model_name=model_name, source=label
    )
    _write_outputs(args, records, {"model": model_name, "source": label, **settings.describe()})
    line = _summary_line(records)
    if line:
        print(line)


def _dataset_bounds(args: argparse.Namespace, bounds: dict[str, int]) -> dict[str, int]:
    if args.dataset == SYNTHETIC_DATASET:
        # Synthetic rows default to the tiny model's bounds, as the demo trains on them
        return {k: v for k, v in (("min_pixels", args.min_pixels), ("max_pixels", args.max_pixels)) if v}
    return bounds


def run_inspect(model, processor, messages, images, settings, *, args, answer, model_name, source):
    """Sample (or take) responses of one prompt, score them, and return their `SelectionRecord`s."""
    from ..rewards import completion_to_text
    from .records import records_from_signals
    from .signals import completion_signals, encode_prompt, encode_responses, sample_completions

    device = model.device
    prompt = encode_prompt(processor, messages, images, device=device)
    if args.response:
        completions = encode_responses(processor, args.response)
    else:
        completions = sample_completions(
            model,
            processor,
            prompt,
            1 if args.greedy else args.num_generations,
            max_new_tokens=args.max_new_tokens,
            temperature=settings.temperature,
            greedy=args.greedy,
            seed=args.sample_seed,
        )
    if not any(completions):
        raise SystemExit("vepo-trl inspect: error: every response is empty; nothing to show")
    example = completion_signals(model, processor, prompt, completions, settings, batch_size=args.batch_size)
    tokenizer = getattr(processor, "tokenizer", processor)
    texts = [tokenizer.decode(c, skip_special_tokens=True) for c in completions]
    rewards, details = _rewards([completion_to_text(t) for t in texts], answer, args.reward_funcs, args.reward_weights)
    records = records_from_signals(
        example.completion_ids,
        processor,
        example.signals,
        example.mask,
        example.selected,
        ratio=settings.ratio,
        alpha=settings.alpha,
        strategy=settings.strategy,
        rewards=rewards,
        prompts=[messages] * len(completions),
        images=[images] * len(completions),
        groups=[0] * len(completions),
        meta={
            "model": model_name,
            "source": source,
            **{k: v for k, v in settings.describe().items() if k not in ("strategy", "k", "alpha")},
        },
    )
    for record, detail in zip(records, details):
        if detail:
            record.meta["rewards"] = detail
        if answer is not None:
            record.meta["answer"] = str(answer)
    return records


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
    parser = _Parser(
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
        _check_generation(args)
        if args.limit < 1:
            raise UsageError(f"--limit must be at least 1, got {args.limit}")
        for ratio in args.ratios:
            if not 0.0 < ratio <= 1.0:
                raise UsageError(f"--ratios: every k must be in (0, 1], got {ratio}")
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


# ---------------------------------------------------------------------------------------------------------------------
# plot
# ---------------------------------------------------------------------------------------------------------------------

PLOT_HELP = """PNG plots of one or several training runs, overlaid: reward and accuracy, selected-token statistics, JSD
and |dH|, the top-k JSD miss rates and the noise step, over steps.

A run is a folder with trainer_state.json or metrics.jsonl (the demo's vepo-demo/, an output_dir, a checkpoint), or
one of those files.

Examples:
  vepo-trl plot vepo-demo
  vepo-trl plot runs/vepo runs/grpo --labels VEPO GRPO --output_dir plots
"""


def plot_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="vepo-trl plot", description=PLOT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="Run folders or log files.")
    parser.add_argument("--labels", nargs="+", help="One name per run (default: the folder names).")
    parser.add_argument("--output_dir", help="Where the PNGs go (default: RUN_DIR/plots of the first run).")
    parser.add_argument("--dpi", type=int, default=100)
    return parser


def plot_main(argv: list[str]) -> None:
    parser = plot_parser()
    args = parser.parse_args(argv)
    from .plots import load_run, plot_runs

    try:
        if args.labels and len(args.labels) != len(args.runs):
            raise UsageError(f"--labels has {len(args.labels)} names for {len(args.runs)} runs")
        if args.dpi < 20:
            raise UsageError(f"--dpi must be at least 20, got {args.dpi}")
        runs = []
        for i, path in enumerate(args.runs):
            try:
                runs.append(load_run(path, args.labels[i] if args.labels else None))
            except (FileNotFoundError, ValueError) as error:
                raise UsageError(str(error)) from None
    except UsageError as error:
        fail(parser.prog, error)
    first = Path(args.runs[0])
    output_dir = Path(args.output_dir) if args.output_dir else (first if first.is_dir() else first.parent) / "plots"
    written = plot_runs(runs, output_dir, dpi=args.dpi)
    for run in runs:
        print(f"{run.name}: {len(run.entries)} logged steps from {run.source}")
    print("Wrote " + ", ".join(str(path) for path in written.values()))
