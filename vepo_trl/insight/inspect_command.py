"""`vepo-trl inspect`: one HTML page of the tokens VEPO selects in a model's responses."""

from __future__ import annotations

import os
from pathlib import Path

from ..files import check_data_rows, check_output
from ..local_models import check_model_name
from .commands import (
    SYNTHETIC_DATASET,
    SYNTHETIC_ROWS,
    UsageError,
    _dataset_bounds,
    _load_model,
    _load_rows,
    _pixel_bounds,
    _read_recipe,
    _rewards,
    _sample,
    _settings,
)


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


DEFAULT_PAGE = "vepo-inspect.html"


def _unused_page_name() -> Path:
    """The default page's name, numbered past the pages earlier runs left (never replaced unless named)."""
    path, number = Path(DEFAULT_PAGE), 2
    while path.exists():
        path, number = Path(DEFAULT_PAGE.replace(".html", f"-{number}.html")), number + 1
    return path


def _write_outputs(args, records, settings_rows) -> None:
    from .page import write_page
    from .records import save_records

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
        from .records import load_records

        try:
            records = load_records(args.records)
        except ValueError as error:
            raise UsageError(f"--records: {error}") from None
        _write_outputs(args, records, {"source": args.records})
        return
    recipe = _read_recipe(args.config) if args.config else {}
    model_name = check_model_name(args.model or recipe.get("model_name_or_path"), "--model", adapters=False)
    settings = _settings(args, recipe)
    check_output("--output", Path(args.output or DEFAULT_PAGE), "file")
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
        if args.dataset == SYNTHETIC_DATASET:
            # Synthetic rows are generated in order: checking first keeps --index 100000 from generating 100,001
            rows = recipe.get("synthetic_rows", SYNTHETIC_ROWS)
            if index >= rows:
                raise UsageError(
                    f"--index {index} is out of range: synthetic has {rows} rows (a run's synthetic_rows"
                    f"{', from --config' if 'synthetic_rows' in recipe else ''}), so --index goes up to {rows - 1}"
                )
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

    records = run_inspect(
        model, processor, messages, images, settings, args=args, answer=answer, model_name=model_name, source=label
    )
    _write_outputs(args, records, {"model": model_name, "source": label, **settings.describe()})
    line = _summary_line(records)
    if line:
        print(line)


def run_inspect(model, processor, messages, images, settings, *, args, answer, model_name, source):
    """Sample (or take) responses of one prompt, score them, and return their `SelectionRecord`s."""
    from ..rewards import completion_to_text
    from .records import records_from_signals
    from .signals import completion_signals, encode_prompt, encode_responses

    device = model.device
    prompt = encode_prompt(processor, messages, images, device=device)
    if args.response:
        completions = encode_responses(processor, args.response)
    else:
        completions = _sample(model, processor, prompt, args, settings, seed=args.sample_seed)
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
