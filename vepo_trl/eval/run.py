"""`vepo-trl eval`: a model on the paper's benchmarks, one command, a Table-1 summary beside the paper's numbers.

    vepo-trl eval --model Qwen/Qwen2.5-VL-7B-Instruct                        # all seven, from the Hub
    vepo-trl eval --model runs/vepo-7b --benchmarks mathvista,wemath --judge_model gpt-4o-mini
    accelerate launch --num_processes 8 -m vepo_trl eval --model runs/vepo-7b --backend transformers

Writes, under `--output_dir`: `<benchmark>.jsonl` (one graded record per example, appended as it goes),
`summary.json` and `summary.md`, and `manifest.json` (the model and protocol). A rerun into the same folder skips
the examples already in the JSONL; a rerun with another model or protocol is refused.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from ..local_models import TINY_MODEL, resolve_model_name
from .benchmarks import (
    BENCHMARKS,
    PAPER_BENCHMARKS,
    PROMPT_VERSION,
    Benchmark,
    EvalDataError,
    Example,
    resolve_benchmarks,
)


logger = logging.getLogger(__name__)

__all__ = ["EvalUsageError", "main", "make_parser", "run"]

MANIFEST = "manifest.json"


class EvalUsageError(ValueError):
    """A mistake on the command line, reported as one line and exit code 2 before any model loads."""


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vepo-trl eval",
        description="Greedy evaluation on the paper's seven benchmarks (or a subset), with a Table-1 summary.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    model = parser.add_argument_group("model")
    model.add_argument("--model", required=True, help="Model folder or Hub id (a PEFT adapter folder works too).")
    model.add_argument("--adapter", default=None, help="LoRA adapter folder applied on top of --model.")
    model.add_argument("--base_model", default=None, help="Base model of an adapter (default: its adapter_config).")
    model.add_argument("--dtype", default="auto", help="Weights dtype: auto, bfloat16, float16, float32.")
    data = parser.add_argument_group("data")
    data.add_argument(
        "--benchmarks",
        default="all",
        help=f"Comma-separated: {', '.join(BENCHMARKS)}; 'all' = the seven of the paper's Table 1.",
    )
    data.add_argument(
        "--data_dir",
        default=None,
        help="Folder with local copies, one sub-folder per benchmark (Hub parquet layout or NoisyRollout's eval_data).",
    )
    data.add_argument("--limit", type=int, default=None, help="Evaluate only the first N examples of each benchmark.")
    data.add_argument(
        "--min_pixels", type=int, default=262_144, help="Images are resized to at least this many pixels."
    )
    data.add_argument(
        "--max_pixels", type=int, default=1_000_000, help="Images are resized to at most this many pixels."
    )
    gen = parser.add_argument_group("generation")
    gen.add_argument("--max_new_tokens", type=int, default=2048)
    gen.add_argument("--backend", choices=("auto", "vllm", "transformers"), default="auto",
                     help="auto: vLLM when installed and running as one process, else transformers.")  # fmt: skip
    gen.add_argument("--batch_size", type=int, default=None, help="Prompts per generate call (8; vLLM: 256).")
    gen.add_argument("--max_model_len", type=int, default=None, help="vLLM context length (default: the model's).")
    judge = parser.add_argument_group("judge")
    judge.add_argument("--judge_model", default=None,
                       help="LLM judge for MathVerse, MathVision, MathVista, We-Math (the paper: gpt-4o-mini).")  # fmt: skip
    judge.add_argument("--judge_base_url", default=None, help="OpenAI-compatible endpoint (default: OpenAI's).")
    judge.add_argument("--judge_api_key_env", default="OPENAI_API_KEY", help="Environment variable holding the key.")
    judge.add_argument("--judge_timeout", type=float, default=60.0, help="Seconds per judge request.")
    judge.add_argument("--judge_max_retries", type=int, default=3, help="Retries on timeouts, 429 and 5xx.")
    judge.add_argument("--judge_workers", type=int, default=8, help="Concurrent judge requests.")
    out = parser.add_argument_group("output")
    out.add_argument("--output_dir", default=None, help="Results folder (default: eval-<model folder name>).")
    out.add_argument("--paper_model", default=None, choices=("Qwen2.5-VL-3B-Instruct", "Qwen2.5-VL-7B-Instruct"),
                     help="Paper rows to show beside the results (default: guessed from the model name).")  # fmt: skip
    return parser


# ----------------------------------------------------------------------------------------------------------------------
# Checks before anything heavy
# ----------------------------------------------------------------------------------------------------------------------


def _offline() -> bool:
    return any(
        os.environ.get(n, "").lower() in ("1", "true", "yes") for n in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def check_model(name: str, what: str = "--model") -> None:
    if name == TINY_MODEL:
        return
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
            raise EvalUsageError(f"{what} {name}: not a model folder (no config.json or adapter_config.json).")
        return
    looks_like_path = name.startswith((".", "/", "~")) or name.count("/") != 1
    if looks_like_path:
        hint = " Run `vepo-trl demo` first." if path.name == "vepo-demo" else ""
        raise EvalUsageError(f"{what} {name}: no such folder, and not a Hub id of the form owner/name.{hint}")
    if _offline():
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(name, "config.json"), str):
            raise EvalUsageError(f"{what} {name}: not in the local Hugging Face cache and the Hub is offline.")


def _model_identity(name: str | None) -> str | None:
    if name is None:
        return None
    path = Path(name).expanduser()
    return str(path.resolve()) if path.exists() else name


def _protocol(args: argparse.Namespace) -> dict[str, Any]:
    from ..data.loaders import SYSTEM_PROMPT

    return {
        "system_prompt": SYSTEM_PROMPT,
        "decoding": "greedy",
        "max_new_tokens": args.max_new_tokens,
        "min_pixels": args.min_pixels,
        "max_pixels": args.max_pixels,
        "prompt_version": PROMPT_VERSION,
        "judge_model": args.judge_model,
        "judge_base_url": args.judge_base_url,
    }


def check_manifest(output_dir: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """The folder's manifest merged with this run's; a different model or protocol is refused."""
    path = output_dir / MANIFEST
    if not path.is_file():
        return manifest
    previous = json.loads(path.read_text())
    changed = [key for key in ("model", "adapter", "protocol") if previous.get(key) != manifest[key]]
    changed += [
        f"source of {name}"
        for name, source in manifest["sources"].items()
        if name in previous.get("sources", {}) and previous["sources"][name] != source
    ]
    if changed:
        detail = "; ".join(
            f"{key}: {json.dumps(previous.get(key))[:80]} -> {json.dumps(manifest.get(key))[:80]}"
            for key in changed
            if key in manifest
        )
        raise EvalUsageError(
            f"{output_dir} holds results of another {', '.join(changed)} ({detail or 'see manifest.json'}); "
            "pass a new --output_dir."
        )
    merged = {**previous, **manifest}
    merged["sources"] = {**previous.get("sources", {}), **manifest["sources"]}
    merged["totals"] = {**previous.get("totals", {}), **manifest.get("totals", {})}
    return merged


# ----------------------------------------------------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------------------------------------------------


def read_records(path: Path) -> list[dict[str, Any]]:
    """Records of a JSONL file; a last line cut off by an interruption is removed from the file."""
    if not path.is_file():
        return []
    data = path.read_bytes()
    records, good = [], 0
    for line in data.splitlines(keepends=True):
        try:
            if not line.endswith(b"\n"):
                raise ValueError("unterminated line")
            records.append(json.loads(line))
        except ValueError:
            logger.warning("%s: dropping a partly written last record", path)
            break
        good += len(line)
    if good != len(data):
        with open(path, "r+b") as f:
            f.truncate(good)
    return records


def build_prompt(example: Example, processor) -> list[dict]:
    from ..data.loaders import SYSTEM_PROMPT, build_user_content

    return [
        {"role": "system", "content": [{"type": "text", "text": SYSTEM_PROMPT}]},
        {"role": "user", "content": build_user_content(example.text, len(example.images))},
    ]


def _prepare(example: Example, processor, args) -> tuple[str, list, str | None]:
    """`(prompt text as sent, prepared images, error)`."""
    from ..data.loaders import UnusableRowError, prepare_image

    text = processor.apply_chat_template(build_prompt(example, processor), add_generation_prompt=True, tokenize=False)
    try:
        images = [prepare_image(i, min_pixels=args.min_pixels, max_pixels=args.max_pixels) for i in example.images]
    except (UnusableRowError, OSError) as err:
        return text, [], f"unusable image: {err}"
    return text, images, None


def grade_records(bench: Benchmark, examples: list[Example], outputs: list[tuple[str, str, str | None]], judge):
    from .grading import rule_grade

    records = []
    for example, (prompt, completion, error) in zip(examples, outputs):
        extracted, correct = rule_grade(completion, example.gold, example.choices)
        records.append(
            {
                "id": example.id,
                "benchmark": bench.name,
                "prompt": prompt,
                "images": example.image_refs,
                "completion": completion,
                "extracted": extracted,
                "gold": example.gold,
                "choices": example.choices,
                "rule_correct": correct,
                "categories": example.categories,
                "groups": example.groups,
                **({"error": error} if error else {}),
            }
        )
    if judge is not None and bench.judged_in_paper:
        items = [
            {"question": ex.judge_question or ex.text, "gold": _gold_text(ex), "response": r["completion"]}
            for ex, r in zip(examples, records)
        ]
        for record, verdict in zip(records, judge.grade_many(items)):
            record.update(judge_correct=verdict.correct, judge_extracted=verdict.extracted, judge_error=verdict.error)
    for record in records:
        by_judge = record.get("judge_correct") is not None
        record["correct"] = record["judge_correct"] if by_judge else record["rule_correct"]
        record["scored_by"] = "judge" if by_judge else "rule"
    return records


def _gold_text(example: Example) -> str:
    from .benchmarks import LETTERS

    if example.choices and example.gold in LETTERS[: len(example.choices)]:
        return f"{example.gold}. {example.choices[LETTERS.index(example.gold)]}"
    return example.gold


# ----------------------------------------------------------------------------------------------------------------------
# Run
# ----------------------------------------------------------------------------------------------------------------------


def _make_generator(args, model_id: str, adapter: str | None, state):
    from .generate import TransformersGenerator, VLLMGenerator, load_model_and_processor, vllm_available

    backend = args.backend
    if backend == "auto":
        backend = "vllm" if vllm_available() and state.num_processes == 1 else "transformers"
    if backend == "vllm":
        if state.num_processes > 1:
            raise EvalUsageError("--backend vllm runs in one process (tensor parallel); do not use accelerate launch.")
        args.batch_size = args.batch_size or 256
        return VLLMGenerator(model_id, adapter, max_new_tokens=args.max_new_tokens, dtype=args.dtype,
                             max_model_len=args.max_model_len)  # fmt: skip
    args.batch_size = args.batch_size or 8
    model, processor = load_model_and_processor(model_id, adapter, dtype=args.dtype, device=state.device)
    generator = TransformersGenerator(model, processor, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)
    generator.processor = processor
    return generator


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate; returns the summary (also written to `summary.json` / `summary.md` on the main process)."""
    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list, gather_object
    from tqdm.auto import tqdm

    from .generate import resolve_adapter
    from .table import paper_rows_for, render_markdown, summarize_benchmark, table_row

    # -- usage checks: all before data or model loading ------------------------------------------------------------
    try:
        benches = resolve_benchmarks(args.benchmarks)
    except ValueError as err:
        raise EvalUsageError(str(err)) from None
    for name, value in (
        ("--limit", args.limit),
        ("--max_new_tokens", args.max_new_tokens),
        ("--batch_size", args.batch_size),
    ):
        if value is not None and value < 1:
            raise EvalUsageError(f"{name} must be at least 1, got {value}.")
    check_model(args.model)
    for flag in ("adapter", "base_model"):
        if getattr(args, flag):
            check_model(getattr(args, flag), f"--{flag}")
    if args.data_dir is not None and not Path(args.data_dir).expanduser().is_dir():
        raise EvalUsageError(f"--data_dir {args.data_dir}: no such folder.")
    for bench in benches:
        bench.check_available(args.data_dir)
    if args.judge_model:
        from .judge import LLMJudge

        try:
            judge = LLMJudge(args.judge_model, base_url=args.judge_base_url, api_key_env=args.judge_api_key_env,
                             timeout=args.judge_timeout, max_retries=args.judge_max_retries,
                             workers=args.judge_workers)  # fmt: skip
        except ValueError as err:  # no key in the environment, or no openai client
            raise EvalUsageError(str(err)) from None
    else:
        judge = None
    model_id, adapter = resolve_adapter(args.model, args.adapter, args.base_model)
    output_dir = Path(args.output_dir or f"eval-{Path(args.model.rstrip('/')).name}")
    manifest = {
        "model": _model_identity(model_id),
        "adapter": _model_identity(adapter),
        "protocol": _protocol(args),
        "sources": {bench.name: bench.source(args.data_dir) for bench in benches},
    }
    manifest = check_manifest(output_dir, manifest)

    state = PartialState()
    # -- data, then the model --------------------------------------------------------------------------------------
    examples: dict[str, list[Example]] = {}
    with state.main_process_first():
        for bench in benches:
            examples[bench.name] = bench.load_examples(args.data_dir, limit=args.limit)
    manifest["totals"] = {**manifest.get("totals", {}), **{name: len(ex) for name, ex in examples.items()}}
    if model_id == TINY_MODEL:
        model_id = resolve_model_name(model_id)
    start = time.perf_counter()
    generator = _make_generator(args, model_id, adapter, state)
    manifest["backend"] = generator.name
    if state.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")

    # -- generate, grade, append -----------------------------------------------------------------------------------
    chunk_size = args.batch_size * state.num_processes
    for bench in benches:
        path = output_dir / f"{bench.name}.jsonl"
        done = [None]
        if state.is_main_process:
            done = [{record["id"] for record in read_records(path)}]
        done = broadcast_object_list(done)[0]
        todo = [example for example in examples[bench.name] if example.id not in done]
        bar = tqdm(total=len(examples[bench.name]), initial=len(examples[bench.name]) - len(todo), desc=bench.name,
                   disable=not state.is_main_process)  # fmt: skip
        for begin in range(0, len(todo), chunk_size):
            chunk = todo[begin : begin + chunk_size]
            mine = list(range(state.process_index, len(chunk), state.num_processes))
            prepared = [_prepare(chunk[i], generator.processor, args) for i in mine]
            usable = [k for k, (_, _, error) in enumerate(prepared) if error is None]
            texts = generator.generate([prepared[k][0] for k in usable], [prepared[k][1] for k in usable])
            completions = dict(zip(usable, texts))
            outputs = [(i, p[0], completions.get(k, ""), p[2]) for k, (i, p) in enumerate(zip(mine, prepared))]
            outputs = sorted(gather_object(outputs))
            if state.is_main_process:
                records = grade_records(bench, chunk, [o[1:] for o in outputs], judge)
                with open(path, "a", encoding="utf-8") as f:
                    for record in records:
                        f.write(json.dumps(record, ensure_ascii=False) + "\n")
                    f.flush()
                    os.fsync(f.fileno())
            bar.update(len(chunk))
        bar.close()
    state.wait_for_everyone()

    # -- summary over everything in the folder ---------------------------------------------------------------------
    summary: dict[str, Any] = {}
    if state.is_main_process:
        summaries = {}
        for name in [*PAPER_BENCHMARKS, *(n for n in BENCHMARKS if n not in PAPER_BENCHMARKS)]:
            records = read_records(output_dir / f"{name}.jsonl")
            if records:
                summaries[name] = summarize_benchmark(name, records, manifest["totals"].get(name))
        paper_model, paper = paper_rows_for(args.paper_model, args.base_model, args.model, model_id)
        summary = {
            "model": args.model,
            "adapter": args.adapter,
            "backend": generator.name,
            "protocol": manifest["protocol"],
            "sources": manifest["sources"],
            "seconds_this_run": round(time.perf_counter() - start, 1),
            "benchmarks": summaries,
            "table": {
                "columns": [BENCHMARKS[name].title for name in PAPER_BENCHMARKS] + ["Avg."],
                "this_run": table_row(summaries),
                "paper_model": paper_model,
                "paper": {method: list(values) for method, values in paper.items()},
            },
        }
        (output_dir / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
        markdown = render_markdown(summary)
        (output_dir / "summary.md").write_text(markdown)
        print(markdown)
        print(f"Records and summary: {output_dir}/")
    return summary


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = make_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return run(args)
    except (EvalUsageError, EvalDataError) as err:
        print(f"vepo-trl eval: error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
