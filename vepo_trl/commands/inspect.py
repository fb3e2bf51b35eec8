"""`vepo-trl inspect`: its options, declared once (`InspectOptions`) and checked by their rules as they are
parsed (before torch or a model is
imported), then `inspect_main` below, over the `vepo_trl.insight` library."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..files import check_data_rows, check_output
from ..insight import (
    SYNTHETIC_DATASET,
    SYNTHETIC_ROWS,
    dataset_bounds,
    load_model,
    load_rows,
    pixel_bounds,
    read_recipe,
    sample_completions,
    score_rewards,
    signal_settings,
)
from ..local_models import check_model_name
from ..options import option, parser_for
from ..validation import (
    ALWAYS,
    DATA_ROW,
    OUT_FILE,
    OWN_PROMPT,
    RANGES,
    RECORDS_FILE,
    REWARD_NAME,
    RUNS_MODEL,
    TEXT,
    at_least,
    optional,
    path_rule,
    whole,
)
from .insight_options import SETTINGS, ModelOptions, ResponseOptions, SettingsOptions


INSPECT_HELP = """Write one self-contained HTML page showing which tokens of a model's responses VEPO trains on.

Sources (one of):
  --image PATH --question TEXT      a question about an image
  --dataset NAME --index I          a row of a data set (synthetic, geometry3k, a local file, ...)
  --records FILE                    selection records saved by a run or by --save_records (no model needed)

Examples:
  vepo-trl inspect --model tiny-qwen2.5-vl --dataset synthetic --index 3 --output page.html
  vepo-trl inspect --model Qwen/Qwen2.5-VL-7B-Instruct --image fig.png --question "Find x." --num_generations 8
  vepo-trl demo --selection_samples_steps 5 && vepo-trl inspect --records vepo-demo/selection_samples.jsonl
"""


DEFAULT_PAGE = "vepo-inspect.html"


@dataclass
class InspectSource:
    image: str | None = option(None, "Image file of the prompt.", reads=ALWAYS, rule=path_rule("in_file", "an image file that exists"),
                               group="source")  # fmt: skip
    question: str | None = option(None, "The question (an <image> placeholder marks where the image goes).",
                                  reads=OWN_PROMPT, rule=TEXT, group="source")  # fmt: skip
    answer: str | None = option(None, "Reference answer: the page then shows each completion's reward.", reads=ALWAYS, rule=TEXT,
                                group="source")  # fmt: skip
    dataset: str | None = option(None, "Data set name or local file; the row's answer gives the rewards.", reads=ALWAYS, rule=TEXT,
                                 group="source")  # fmt: skip
    split: str = option("train", "", reads=DATA_ROW, rule=TEXT, group="source")
    index: int | None = option(None, "Row of --dataset. Default 0.", group="source",
                               reads=DATA_ROW, rule=whole(at_least(0), "a whole row number >= 0", True))  # fmt: skip
    records: str | None = option(None, "Render saved selection records (JSON Lines) instead of running a model.",
                                 reads=ALWAYS, rule=path_rule("in_file", "a selection-records file (JSON Lines) that exists"),
                                 group="source")  # fmt: skip
    response: list[str] | None = option(None, "Score this response instead of sampling (repeatable).", reads=ALWAYS, rule=TEXT,
                                        group="source", repeatable=True)  # fmt: skip


@dataclass
class InspectOptions(ResponseOptions, SettingsOptions, ModelOptions, InspectSource):
    k: float | None = option(None, "k: fraction of each response kept. Default 0.2.",
                             reads=RUNS_MODEL, rule=optional(RANGES["selection_ratio"]), group=SETTINGS)  # fmt: skip
    reward_funcs: list[str] = option(["accuracy", "format"], "", reads=RUNS_MODEL, rule=REWARD_NAME,
                                     group="rewards")  # fmt: skip
    reward_weights: list[float] = option(
        [0.9, 0.1], "", reads=RUNS_MODEL, rule=RANGES["reward_weights"], group="rewards"
    )
    output: str | None = option(
        None, f"The HTML page to write (default: {DEFAULT_PAGE}, or {DEFAULT_PAGE.replace('.html', '-2.html')}, ... "
        "when an earlier page has that name: a page is replaced only when named).", reads=ALWAYS, rule=OUT_FILE, group="output")  # fmt: skip
    save_records: str | None = option(None, "Also save the selection records (JSON Lines) here; appended to a records file that exists.", reads=ALWAYS, rule=RECORDS_FILE,
                                      group="output")  # fmt: skip
    title: str | None = option(None, "", reads=ALWAYS, rule=TEXT, group="output")


def make_parser() -> argparse.ArgumentParser:
    return parser_for(
        InspectOptions,
        prog="vepo-trl inspect",
        description=INSPECT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def main(argv: list[str]) -> None:
    args = make_parser().parse_args(argv)
    inspect_main(args)


# ---------------------------------------------------------------------------------------------------------------------
# inspect
# ---------------------------------------------------------------------------------------------------------------------


def _inspect_source(args) -> str:
    chosen = [name for name in ("image", "dataset", "records") if getattr(args, name)]
    if len(chosen) != 1:
        raise UsageError(
            "give exactly one source: --image PATH --question TEXT, --dataset NAME --index I, or --records FILE"
            + (f" (got --{' and --'.join(chosen)})" if chosen else "")
        )
    source = chosen[0]
    if args.output is not None and Path(args.output).suffix.lower() not in (".html", ".htm"):
        raise UsageError(
            f"--output {args.output}: the page is HTML; name it .html (e.g. {Path(args.output).stem}.html)"
        )
    if args.save_records and args.records and Path(args.save_records).resolve() == Path(args.records).resolve():
        raise UsageError("--save_records is the --records file: the page renders it as it is; drop --save_records")
    if source == "dataset":
        check_data_rows(args.dataset)  # its format and schema, before a model or an image loads
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


def _unused_page_name() -> Path:
    """The default page's name, numbered past the pages earlier runs left (never replaced unless named)."""
    path, number = Path(DEFAULT_PAGE), 2
    while path.exists():
        path, number = Path(DEFAULT_PAGE.replace(".html", f"-{number}.html")), number + 1
    return path


def _write_outputs(args, records, settings_rows) -> None:
    from ..insight import save_records, write_page

    output = Path(args.output) if args.output is not None else _unused_page_name()  # .html (`_inspect_source`)
    write_page(output, records, title=args.title or "VEPO token selection", settings=settings_rows)
    print(f"Wrote {output} ({len(records)} completions).")
    if args.save_records:
        existed = Path(args.save_records).is_file() and Path(args.save_records).stat().st_size > 0
        save_records(args.save_records, records, append=True)
        print(f"{'Appended' if existed else 'Saved'} {len(records)} records to {args.save_records}.")


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


def inspect_main(args) -> None:
    """`vepo-trl inspect`'s work on its parsed options (`vepo_trl.commands.inspect`); user errors raise `UsageError`."""
    source = _inspect_source(args)
    if source == "records":
        from ..insight import load_records

        try:
            records = load_records(args.records)
        except ValueError as error:
            raise UsageError(f"--records: {error}") from None
        _write_outputs(args, records, {"source": args.records})
        return
    recipe = read_recipe(args.config) if args.config else {}
    model_name = check_model_name(args.model or recipe.get("model_name_or_path"), "--model", adapters=False)
    settings = signal_settings(args, recipe)
    check_output("--output", Path(args.output or DEFAULT_PAGE), "file")
    bounds = pixel_bounds(args, recipe)
    if source == "image":
        from ..data.loaders import UnusableRowError, prepare_image

        try:
            images = [prepare_image(args.image, **bounds)]
        except UnusableRowError as error:
            raise UsageError(f"--image: {error}") from None
        from ..insight import build_messages

        messages, answer, label = build_messages(args.question, 1), args.answer, args.image
    else:
        index = args.index or 0
        if args.dataset == SYNTHETIC_DATASET:
            # Synthetic rows are generated in order: checking first keeps --index 100000 from generating 100,001
            rows = recipe.get("synthetic_rows", SYNTHETIC_ROWS)
            if index >= rows:
                raise UsageError(
                    f"--index {index} is out of range: synthetic has {rows} rows (a run's synthetic_rows"
                    f"{', from --config' if 'synthetic_rows' in recipe else ''}), so --index goes up to {rows - 1}"
                )
        dataset = load_rows(args.dataset, args.split, index + 1, dataset_bounds(args, bounds))
        if index >= len(dataset):
            raise UsageError(f"--index {index} is out of range: {args.dataset} has {len(dataset)} rows")
        row = dataset[index]
        messages, images = row["prompt"], row.get("images") or []
        answer = args.answer if args.answer is not None else row.get("answer")
        label = f"{args.dataset}[{index}]"
        if not images:
            raise UsageError(f"{label} has no image; VEPO's signals need one")
    model, processor, _ = load_model(model_name, args.device, args.dtype)

    records = run_inspect(
        model, processor, messages, images, settings, args=args, answer=answer, model_name=model_name, source=label
    )
    _write_outputs(args, records, {"model": model_name, "source": label, **settings.describe()})
    line = _summary_line(records)
    if line:
        print(line)


def run_inspect(model, processor, messages, images, settings, *, args, answer, model_name, source):
    """Sample (or take) responses of one prompt, score them, and return their `SelectionRecord`s."""
    from ..insight import completion_signals, encode_prompt, encode_responses, records_from_signals
    from ..rewards import completion_to_text

    device = model.device
    prompt = encode_prompt(processor, messages, images, device=device)
    if args.response:
        completions = encode_responses(processor, args.response)
    else:
        completions = sample_completions(model, processor, prompt, args, settings, seed=args.sample_seed)
    if not any(completions):
        raise SystemExit("vepo-trl inspect: error: every response is empty; nothing to show")
    example = completion_signals(model, processor, prompt, completions, settings, batch_size=args.batch_size)
    tokenizer = getattr(processor, "tokenizer", processor)
    texts = [tokenizer.decode(c, skip_special_tokens=True) for c in completions]
    rewards, details = score_rewards(
        [completion_to_text(t) for t in texts], answer, args.reward_funcs, args.reward_weights
    )
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
