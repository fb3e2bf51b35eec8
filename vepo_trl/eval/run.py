"""`vepo-trl eval`: a model on the paper's benchmarks, one command, a Table-1 summary beside the paper's numbers.

    vepo-trl eval --model Qwen/Qwen2.5-VL-7B-Instruct            # all seven, graded as the paper (gpt-4o-mini judge)
    vepo-trl eval --model runs/vepo-7b --benchmarks mathvista,wemath --protocol lenient
    vepo-trl eval --rescore eval-vepo-7b --protocol rule         # grade the stored completions again, no model
    accelerate launch --num_processes 8 -m vepo_trl eval --model runs/vepo-7b --backend transformers

Writes, under `--output_dir`: `<benchmark>.jsonl` (one record per example, appended as it goes, with a verdict per
grading protocol under `verdicts`), `summary.json` and `summary.md` (under the run's `--protocol`), and
`manifest.json` (the model, the generation settings, the graders used). A rerun into the same folder skips the
examples already generated and grades again only what has no verdict of its protocol (a judge that failed); a rerun
with another model or generation setting is refused, naming the settings that differ.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..local_models import check_hub_push, check_model_name, is_builtin_model, resolve_model_name
from ..run_folder import check_folder_owner
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

__all__ = ["run"]

MANIFEST = "manifest.json"


# ----------------------------------------------------------------------------------------------------------------------
# Checks before anything heavy
# ----------------------------------------------------------------------------------------------------------------------


def _offline() -> bool:
    return any(
        os.environ.get(n, "").lower() in ("1", "true", "yes") for n in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _model_identity(name: str | None) -> str | None:
    if name is None:
        return None
    path = Path(name).expanduser()
    return str(path.resolve()) if path.exists() else name


_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def _weights_fingerprint(name: str | None) -> str | None:
    """A content fingerprint of a local model's (or adapter's) weights: each weight file's size and bytes, read whole
    up to 64 MB and beyond that as 64 blocks of 64 KB spread over the file (a retrained model changes its trained
    tensors everywhere, so the samples change; reading 15 GB whole would take minutes). None for a Hub id."""
    import hashlib

    path = Path(name).expanduser() if name else None
    if path is None or not path.is_dir():
        return None
    digest = hashlib.sha256()
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in _WEIGHT_SUFFIXES)
    for file in files:
        size = file.stat().st_size
        digest.update(f"{file.name}:{size}".encode())
        with open(file, "rb") as handle:
            if size <= 64 * 2**20:
                digest.update(handle.read())
                continue
            for block in range(64):
                handle.seek(block * (size - 2**16) // 63)
                digest.update(handle.read(2**16))
    return digest.hexdigest()[:16] if files else None


def _generation_settings(args, backend: str) -> dict[str, Any]:
    """Everything that changes a completion: one results folder holds completions of one setting only."""
    from .benchmarks import EVAL_SYSTEM_PROMPT

    # Greedy keeps the keys folders have always held; a sampled protocol adds its settings
    sampled = {"decoding": "sampled", "temperature": args.temperature, "top_p": args.top_p,
               "num_samples": args.num_samples, "seed": args.seed} if args.temperature > 0 else {"decoding": "greedy"}  # fmt: skip
    return {
        "system_prompt": EVAL_SYSTEM_PROMPT,
        **sampled,
        "max_new_tokens": args.max_new_tokens,
        "min_pixels": args.min_pixels,
        "max_pixels": args.max_pixels,
        "prompt_version": PROMPT_VERSION,
        "backend": backend,
        "dtype": args.dtype,
        "max_model_len": args.max_model_len,
    }


def _grading_settings(args) -> dict[str, Any]:
    from .grading import JUDGED
    from .paper import GRADER_VERSION

    judged = bool(JUDGED[args.protocol])
    return {
        "protocol": args.protocol,
        "grader_version": GRADER_VERSION,
        "judge_model": args.judge_model if judged else None,
        "judge_base_url": args.judge_base_url if judged else None,
    }


def package_versions() -> dict[str, str | None]:
    """The versions that made a number: vepo_trl and the libraries that generate and grade."""
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {}
    for name in ("vepo_trl", "transformers", "trl", "vllm", "openai"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def rows_hash(examples: list[Example]) -> str:
    """SHA-256 of the rows as read: ids, questions, golds, options and image references (a changed question, answer or
    image name changes it; an image's pixels do not)."""
    digest = hashlib.sha256()
    for example in examples:
        row = [example.id, example.text, example.gold, example.choices, example.image_refs]
        digest.update(json.dumps(row, sort_keys=True, ensure_ascii=False, default=str).encode())
    return digest.hexdigest()


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def provenance(manifest: dict[str, Any], grading: dict[str, Any], name: str, versions: dict) -> dict[str, Any]:
    """What made a benchmark's number: the judge (model, endpoint host, temperature), the prompt template's hash, the
    decoding settings and seeds, the rows' hash and the package versions, of the generation (kept through
    `--rescore`) and of the grading (`versions`: `package_versions()` now)."""
    from urllib.parse import urlparse

    from .benchmarks import EVAL_SYSTEM_PROMPT
    from .grading import uses_judge
    from .judge import JUDGE_PROMPT
    from .paper import GRADER_VERSION

    generation = manifest["generation"]
    judged = uses_judge(grading["protocol"], name) and grading.get("judge_model")
    host = (urlparse(grading.get("judge_base_url") or "https://api.openai.com/v1").hostname) if judged else None
    sampled = generation.get("decoding") == "sampled"
    return {
        "judge": {
            "model": grading["judge_model"],
            "endpoint_host": host,
            # the paper's procedures ask at 0 (MMK12's retries at 0.5 x attempt)
            "temperature": 0.0,
        }
        if judged
        else None,  # fmt: skip
        "prompt_template_sha256": _sha256(f"{generation.get('prompt_version')}\n{EVAL_SYSTEM_PROMPT}"),
        "judge_template_sha256": _sha256(f"{GRADER_VERSION}\n{JUDGE_PROMPT}") if judged else None,
        "decoding": {
            key: generation.get(key)
            for key in ("decoding", "temperature", "top_p", "num_samples", "max_new_tokens", "backend", "dtype")
            if key in generation
        },  # fmt: skip
        # each question's sample s drawn with `sample_seed(seed, benchmark, question id, s)`
        "seeds": {"seed": generation["seed"], "per_sample": "sha256 of [seed, benchmark, question id, sample]"}
        if sampled
        else None,
        "data_sha256": manifest.get("data_sha256", {}).get(name),
        "source": manifest.get("sources", {}).get(name),
        "generation_versions": manifest.get("versions"),
        "grading": {
            "protocol": grading["protocol"],
            "grader_version": grading.get("grader_version"),
            "versions": versions,
        },  # fmt: skip
    }


def _differences(before: Any, after: Any, prefix: str = "") -> list[str]:
    """`key: old -> new` for each setting that differs (nested dicts flattened)."""
    if isinstance(before, dict) and isinstance(after, dict):
        return [d for key in dict.fromkeys([*before, *after])
                for d in _differences(before.get(key), after.get(key), f"{prefix}{key}.")]  # fmt: skip
    if before != after:
        return [f"{prefix.rstrip('.')}: {json.dumps(before)[:60]} -> {json.dumps(after)[:60]}"]
    return []


def check_manifest(output_dir: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """The folder's manifest merged with this run's; another model, generation setting or data source is refused,
    naming each setting that differs. Grading may differ: every protocol's verdicts are kept per record."""
    path = output_dir / MANIFEST
    if not path.is_file():
        return manifest
    previous = json.loads(path.read_text())
    if "generation" not in previous and "protocol" in previous:  # written before generation/grading were split
        previous["generation"] = {k: v for k, v in previous["protocol"].items() if not k.startswith("judge_")}
    weights = [(previous.get(key), manifest.get(key)) for key in ("model_weights", "adapter_weights")]
    changed_weights = [(a, b) for a, b in weights if a and b and a != b]  # unknown (older folders, Hub ids): skipped
    if changed_weights and previous.get("model") == manifest.get("model"):
        there, here = changed_weights[0]
        raise UsageError(
            f"{output_dir} holds results of {manifest.get('model_arg') or manifest['model']} as it was before its "
            f"weights changed (fingerprint {there} there, {here} now): pass a new --output_dir, or remove that folder "
            "to evaluate this model again."
        )
    before = {key: previous.get(key) for key in ("model", "adapter", "generation")}
    after = {key: manifest[key] for key in ("model", "adapter", "generation")}
    before["sources"] = {n: s for n, s in previous.get("sources", {}).items() if n in manifest["sources"]}
    after["sources"] = {n: s for n, s in manifest["sources"].items() if n in previous.get("sources", {})}
    changed = _differences(before, after)
    if changed:
        raise UsageError(
            f"{output_dir} holds results of another protocol ({'; '.join(changed)}); pass a new --output_dir, "
            "or --rescore it to grade its completions again."
        )
    merged = {**previous, **manifest}
    merged["sources"] = {**previous.get("sources", {}), **manifest["sources"]}
    merged["totals"] = {**previous.get("totals", {}), **manifest.get("totals", {})}
    return merged


def _attention_heads(model_id: str) -> list[int]:
    """Head counts tensor parallelism must divide (text attention and KV heads, vision heads)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_id)
    text = getattr(config, "text_config", None) or config
    vision = getattr(config, "vision_config", None)
    heads = [getattr(text, "num_attention_heads", None), getattr(vision, "num_heads", None)]
    return [h for h in heads if h]


def _kv_heads(model_id: str) -> int | None:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_id)
    return getattr(getattr(config, "text_config", None) or config, "num_key_value_heads", None)


def tensor_parallel_size(requested: int | None, heads: list[int], kv_heads: int | None, gpus: int) -> int:
    """`requested` when it fits, else the most GPUs (at most `gpus`) that divide every head count and that vLLM can
    shard the KV heads over (a divisor or a multiple of them). 7B (28 heads, 4 KV) on 8 GPUs: 4."""

    def fits(size: int) -> bool:
        kv_ok = kv_heads is None or kv_heads % size == 0 or size % kv_heads == 0
        return all(h % size == 0 for h in heads) and kv_ok

    if requested is not None:
        if requested < 1 or requested > max(gpus, 1):
            raise UsageError(f"--tensor_parallel_size {requested}: {gpus} GPU(s) are visible.")
        if not fits(requested):
            raise UsageError(f"--tensor_parallel_size {requested} does not divide the model's attention heads "
                                 f"{heads} (KV heads {kv_heads}).")  # fmt: skip
        return requested
    return max(size for size in range(1, max(gpus, 1) + 1) if fits(size))


# ----------------------------------------------------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------------------------------------------------


def read_records(path: Path, repair: bool = True) -> list[dict[str, Any]]:
    """Records of a JSONL file; a last line cut off by an interruption is removed from the file (`repair`; a reader
    of another run's folder, which may still be writing, only leaves it out)."""
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
    if good != len(data) and repair:
        with open(path, "r+b") as f:
            f.truncate(good)
    return records


def write_records(path: Path, records: list[dict[str, Any]]) -> None:
    """Replace the JSONL in one step: an interruption leaves the old file or the new one, never half of each."""
    tmp = path.with_suffix(".jsonl.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def build_prompt(example: Example, processor=None) -> list[dict]:
    """The release's prompt (`eval/utils/processing.py::prepare_prompts`): the system prompt, then a user turn of the
    images and the question verbatim, never split at text that looks like a placeholder."""
    from .benchmarks import EVAL_SYSTEM_PROMPT

    user = [{"type": "image"} for _ in example.images] + [{"type": "text", "text": example.text}]
    return [
        {"role": "system", "content": [{"type": "text", "text": EVAL_SYSTEM_PROMPT}]},
        {"role": "user", "content": user},
    ]


def release_image(image, min_pixels: int, max_pixels: int):
    """An image as the release's `eval/utils/processing.py::load_image` hands it to the model's processor: converted
    to RGB (alpha dropped, not composited), scaled by sqrt(max_pixels / pixels) when above `max_pixels`, then by
    sqrt(min_pixels / pixels) when below `min_pixels`, each side truncated to an int, Pillow's default filter. The
    processor then applies its own `smart_resize` (multiples of 28 on Qwen2.5-VL), as vLLM does in the release: a
    512x512 image reaches the model as 504x504 (a 28-rounding `smart_resize` at 262,144 pixels made it 532x532)."""
    import math

    from ..data.loaders import MAX_RATIO, read_image

    image = read_image(image, None).convert("RGB")
    size = image.size
    if image.width * image.height > max_pixels:
        factor = math.sqrt(max_pixels / (image.width * image.height))
        image = image.resize((int(image.width * factor), int(image.height * factor)))
    if image.width * image.height < min_pixels:
        factor = math.sqrt(min_pixels / (image.width * image.height))
        image = image.resize((int(image.width * factor), int(image.height * factor)))
    # Checked on what the processor receives: the truncating resize moves the ratio (20x4000, exactly 200, becomes
    # 36x7241, 201.1), and the processor's smart_resize raises above MAX_RATIO
    if min(image.size) < 1 or max(image.size) / min(image.size) > MAX_RATIO:
        raise ValueError(
            f"aspect ratio of {size[0]}x{size[1]} is {image.width}x{image.height} after the release's resize, over "
            f"{MAX_RATIO}"
        )
    return image


def _prepare(example: Example, processor, args) -> tuple[str, list, str | None]:
    """`(prompt text as sent, prepared images, error)`."""
    text = processor.apply_chat_template(build_prompt(example, processor), add_generation_prompt=True, tokenize=False)
    try:
        images = [release_image(i, args.min_pixels, args.max_pixels) for i in example.images]
    except Exception as err:  # the release drops such a row; here it is recorded, counted wrong
        return text, [], f"unusable image: {type(err).__name__}: {err}"
    return text, images, None


# What a processor or engine raises on one row's input (a placeholder count, an image shape, a prompt too long); a
# RuntimeError (out of memory, a device fault) is no row's fault and ends the run
ROW_ERRORS = (ValueError, TypeError, IndexError, KeyError)


def _generate_alone(generator, text: str, images: list, seeded: dict) -> tuple[str, Exception | None]:
    try:
        return generator.generate([text], [images], **seeded)[0], None
    except ROW_ERRORS as error:
        return "", error


def sample_seed(seed: int, benchmark: str, question: str, sample: int) -> int:
    """The seed of one question's sample: drawn from `--seed`, the benchmark, the question's id and the sample's
    number, so draws are independent across questions and samples and the same on a rerun."""
    from .stats import stable_seed

    return stable_seed(seed, benchmark, question, sample)


def generate_rows(generator, texts: list[str], images: list[list], seeds: list[int] | None = None):
    """`(completion, error)` per row: a batch the processor or engine refuses is run again row by row, and a row
    refused alone is recorded with the reason (counted wrong) while the run goes on; when every row of a batch is
    refused, the fault is not the rows' and the first error is raised. `seeds`: a sampled batch's, one per row."""
    if not texts:
        return []
    seeded = {} if seeds is None else {"seeds": seeds}
    try:
        return [(text, None) for text in generator.generate(texts, images, **seeded)]
    except ROW_ERRORS as error:
        rows = (
            [_generate_alone(generator, t, i, {} if seeds is None else {"seeds": [seeds[k]]})
             for k, (t, i) in enumerate(zip(texts, images))]
            if len(texts) > 1
            else [("", error)]
        )  # fmt: skip
    if len(rows) > 1 and all(error is not None for _, error in rows):
        raise rows[0][1]
    return [(text, error and f"processor error: {type(error).__name__}: {error}") for text, error in rows]


def make_records(bench: Benchmark, examples: list[Example], outputs: list[tuple[str, str, str | None]], sample=None):
    """One record per example: what was asked and answered, the gold, and the rule's verdict (always computed);
    `sample`: which of a sampled protocol's completions (`--num_samples`), recorded as `sample`."""
    from .grading import rule_grade

    records = []
    for example, (prompt, completion, error) in zip(examples, outputs):
        extracted, correct = rule_grade(completion, example.gold, example.choices)
        records.append(
            {
                "id": example.id,
                **({} if sample is None else {"sample": sample}),
                "benchmark": bench.name,
                "prompt": prompt,
                "images": example.image_refs,
                "completion": completion,
                "extracted": extracted,
                "gold": example.gold,
                "choices": example.choices,
                "judge_question": example.judge_question,
                "rule_correct": correct,
                "categories": example.categories,
                "groups": example.groups,
                **({"error": error} if error else {}),
            }
        )
    return records


# ----------------------------------------------------------------------------------------------------------------------
# Run
# ----------------------------------------------------------------------------------------------------------------------


def _resolve_backend(args, state) -> str:
    from .generate import vllm_available

    backend = args.backend
    if backend == "auto":
        backend = "vllm" if vllm_available() and state.num_processes == 1 else "transformers"
    if backend == "vllm" and state.num_processes > 1:
        raise UsageError("--backend vllm runs in one process (tensor parallel); do not use accelerate launch.")
    if backend == "vllm" and not vllm_available():
        raise UsageError(
            "--backend vllm needs vLLM, which is not installed (pip install 'vepo-trl[vllm]'), or pass --backend "
            "transformers."
        )
    return backend


def _engine_or_fallback(args, backend: str, model_id: str) -> str:
    """vLLM where the installed one can start an engine for the model (`vllm_prompts.vllm_blocker_of`, read off its
    config before anything loads); else `--backend auto` falls back to transformers and `--backend vllm` is refused
    in one line."""
    from ..trl_compat.vllm_prompts import vllm_blocker_of

    reason = vllm_blocker_of(model_id) if backend == "vllm" else None
    if reason is None:
        return backend
    if args.backend == "auto":
        logger.warning("Generating with transformers: %s.", reason)
        return "transformers"
    raise UsageError(f"--backend vllm: {reason}. Pass --backend transformers.")


def _write_records(bench, chunk, outputs, sample, state, args, judge, path: Path) -> None:
    """The main process grades a generated chunk (the rule always, the protocol where it can) and appends it."""
    if not state.is_main_process:
        return
    from .grading import grade_records

    records = make_records(bench, chunk, [o[1:] for o in outputs], sample)
    grade_records(records, "rule", None)  # cheap, and always beside the protocol's verdict
    try:
        grade_records(records, args.protocol, judge, workers=args.judge_workers)
    except Exception as error:  # noqa: BLE001 - the completions are written all the same
        logger.warning("%s: grading failed (%s: %s); the completions are kept and graded at the end",
                       bench.name, type(error).__name__, error)  # fmt: skip
    with open(path, "a", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _make_generator(args, backend: str, model_id: str, adapter: str | None, state):
    from .generate import TransformersGenerator, VLLMGenerator, load_model_and_processor

    if backend == "vllm":
        import torch

        args.batch_size = args.batch_size or 256
        tp = tensor_parallel_size(args.tensor_parallel_size, _attention_heads(model_id), _kv_heads(model_id),
                                  torch.cuda.device_count())  # fmt: skip
        return VLLMGenerator(model_id, adapter, max_new_tokens=args.max_new_tokens, dtype=args.dtype,
                             max_model_len=args.max_model_len, tensor_parallel_size=tp,
                             gpu_memory_utilization=args.gpu_memory_utilization, temperature=args.temperature,
                             top_p=args.top_p)  # fmt: skip
    args.batch_size = args.batch_size or 8
    model, processor = load_model_and_processor(model_id, adapter, dtype=args.dtype, device=state.device)
    generator = TransformersGenerator(model, processor, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                                      temperature=args.temperature, top_p=args.top_p)  # fmt: skip
    generator.processor = processor
    return generator


def make_judge(args, benches: list[Benchmark], output_dir: Path | None = None):
    """The judge the protocol needs for `benches` (None when it needs none), checked reachable: a paper run without
    its judge stops here, in one line, before any data or model loads."""
    from .grading import uses_judge

    needing = [bench.name for bench in benches if uses_judge(args.protocol, bench.name)]
    if not needing:
        return None
    from .judge import JUDGE_CACHE, JudgeCache, LLMJudge

    # Every request and reply kept in the results folder: a rerun, a resumed run or --rescore pays for new ones only
    cache = JudgeCache(output_dir / JUDGE_CACHE) if output_dir is not None else None
    try:
        judge = LLMJudge(args.judge_model, base_url=args.judge_base_url, api_key_env=args.judge_api_key_env,
                         timeout=args.judge_timeout, max_retries=args.judge_max_retries,
                         workers=args.judge_workers, cache=cache)  # fmt: skip
    except ValueError as err:  # no key in the environment, or no openai client
        raise UsageError(f"--protocol {args.protocol} judges {', '.join(needing)}: {err} Or pass --protocol rule "
                             "(no judge; not the paper's numbers).") from None  # fmt: skip
    problem = judge.unreachable()
    if problem:
        where = args.judge_base_url or "OpenAI's API"
        raise UsageError(
            f"--protocol {args.protocol} judges {', '.join(needing)} with {args.judge_model}, but {where} did not "
            f"answer ({problem}); start the endpoint or fix --judge_base_url / ${args.judge_api_key_env}, or pass "
            "--protocol rule (no judge; not the paper's numbers)."
        )
    return judge


def _benchmarks_and_push(args) -> list[Benchmark]:
    """The benchmarks a run asks for, and the Hub and repo a push needs, before data or a model loads (each option's
    own rule and the rules that join them were checked as they were parsed: `commands.eval.EvalOptions`)."""
    try:
        benches = resolve_benchmarks(args.benchmarks)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if getattr(args, "push_to_hub", False):
        check_hub_push(args.hub_token, args.hub_model_id)
    return benches


def summarize_folder(
    output_dir: Path, manifest: dict[str, Any], args, seconds: float | None, shown: list[str] | None = None
) -> dict[str, Any]:
    """The summary of everything in the folder under `args.protocol`; written to summary.json / summary.md, and
    printed for `shown` benchmarks only where given (a `--rescore --benchmarks` run prints what it graded)."""
    from .stats import bench_seed, bootstrap_means, interval
    from .table import paper_rows_for, render_markdown, sample_rows, summarize_benchmark, table_row

    summaries, draws = {}, {}
    num_samples = manifest["generation"].get("num_samples", 1)
    grading, versions = _grading_settings(args), package_versions()
    for name in [*PAPER_BENCHMARKS, *(n for n in BENCHMARKS if n not in PAPER_BENCHMARKS)]:
        records = read_records(output_dir / f"{name}.jsonl")
        if records:
            rows = list(sample_rows(records, args.protocol).values())
            if rows:  # made once: the benchmark's interval and the average's
                draws[name] = bootstrap_means(rows, seed=bench_seed(name))
            summaries[name] = summarize_benchmark(name, records, manifest.get("totals", {}).get(name), args.protocol,
                                                  num_samples=num_samples, draws=draws.get(name))  # fmt: skip
            summaries[name]["provenance"] = provenance(manifest, grading, name, versions)
    paper_model, paper = paper_rows_for(args.paper_model, manifest.get("base_model_arg"), manifest.get("model_arg"),
                                        manifest.get("model"))  # fmt: skip
    from .grading import uses_judge

    if not any(uses_judge(args.protocol, name) for name in summaries):
        # No benchmark here went to the judge (a synthetic or rule-graded run): the summary names none
        grading.update(judge_model=None, judge_base_url=None)
    summary = {
        "model": manifest.get("model_arg") or manifest.get("model"),
        "adapter": manifest.get("adapter"),
        "backend": manifest["generation"].get("backend"),
        "generation": manifest["generation"],
        "grading": grading,
        "sources": manifest["sources"],
        "seconds_this_run": None if seconds is None else round(seconds, 1),
        "benchmarks": summaries,
        "table": {
            "columns": [BENCHMARKS[name].title for name in PAPER_BENCHMARKS] + ["Avg."],
            "this_run": table_row(summaries),
            # The average's interval: each benchmark's rows drawn on their own, the seven accuracies averaged
            "average_ci95": [round(100 * v, 2) for v in interval(sum(draws[n] for n in PAPER_BENCHMARKS) / 7)]
            if table_row(summaries)[-1] is not None
            else None,
            "paper_model": paper_model,
            "paper": {method: list(values) for method, values in paper.items()} if args.protocol == "paper" else {},
        },
    }
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    markdown = render_markdown(summary)
    (output_dir / "summary.md").write_text(markdown)
    if shown is not None and set(shown) != set(summaries):
        only = {name: bench for name, bench in summaries.items() if name in shown}
        markdown = render_markdown(
            {**summary, "benchmarks": only, "table": {**summary["table"], "this_run": table_row(only)}}
        )
        markdown += f"\n(Only {', '.join(only)} shown; summary.md holds every benchmark of the folder.)\n"
    print(markdown)
    print(f"Records and summary: {output_dir}/")
    return summary


def regrade_folder(output_dir: Path, names: list[str], args, judge) -> dict[str, int]:
    """Grade every record in the folder that lacks a verdict of `args.protocol` (new, a judge error, another grader
    version or judge model); returns how many per benchmark."""
    from tqdm.auto import tqdm

    from .grading import grade_records

    graded = {}
    for name in names:
        path = output_dir / f"{name}.jsonl"
        records = read_records(path)
        if not records:
            continue
        for start in tqdm(range(0, len(records), 256), desc=f"grading {name}", disable=len(records) <= 256):
            graded[name] = graded.get(name, 0) + grade_records(records[start : start + 256], args.protocol, judge,
                                                               workers=args.judge_workers)  # fmt: skip
            write_records(path, records)  # progress survives an interruption
    return graded


def rescore(args) -> dict[str, Any]:
    """`--rescore DIR`: grade stored completions under `--protocol`, keep the other verdicts, write the summary."""
    output_dir = Path(args.rescore)
    if not (output_dir / MANIFEST).is_file():
        raise UsageError(f"--rescore {args.rescore}: no {MANIFEST} there (not a `vepo-trl eval` results folder).")
    benches = _benchmarks_and_push(args)
    present = [b for b in benches if (output_dir / f"{b.name}.jsonl").is_file()]
    if args.benchmarks == "all":  # every benchmark the folder holds, the synthetic one included
        present = [BENCHMARKS[n] for n in BENCHMARKS if (output_dir / f"{n}.jsonl").is_file()]
    if not present:
        raise UsageError(f"--rescore {args.rescore}: no records of {args.benchmarks} there.")
    from .grading import uses_judge

    for bench in present:
        if uses_judge(args.protocol, bench.name):
            first = read_records(output_dir / f"{bench.name}.jsonl")[:1]
            if first and "judge_question" not in first[0]:
                raise UsageError(f"--rescore: {bench.name}'s records predate stored judge questions; "
                                     "generate them again into a new --output_dir.")  # fmt: skip
    judge = make_judge(args, present, output_dir)
    manifest = json.loads((output_dir / MANIFEST).read_text())
    if "generation" not in manifest:
        manifest["generation"] = {k: v for k, v in manifest.get("protocol", {}).items() if not k.startswith("judge_")}
    start = time.perf_counter()
    regrade_folder(output_dir, [b.name for b in present], args, judge)
    manifest.setdefault("grading", {})[args.protocol] = _grading_settings(args)
    (output_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    shown = None if args.benchmarks == "all" else [b.name for b in present]
    return summarize_folder(output_dir, manifest, args, time.perf_counter() - start, shown)


def compare(args) -> dict[str, Any]:
    """`--compare A B`: avg@k of A minus B per benchmark on the questions both hold, under `--protocol`, with a paired
    bootstrap interval; their average over the benchmarks compared. Printed as markdown; returned as a dict."""
    from .stats import bench_seed, interval, paired_difference
    from .table import judges_of, sample_rows

    folders = [Path(folder) for folder in args.compare]
    for folder in folders:
        if not (folder / MANIFEST).is_file():
            raise UsageError(f"--compare {folder}: no {MANIFEST} there (not a `vepo-trl eval` results folder).")
    wanted = None if args.benchmarks == "all" else {bench.name for bench in _benchmarks_and_push(args)}
    names = [n for n in BENCHMARKS if (wanted is None or n in wanted)
             and all((folder / f"{n}.jsonl").is_file() for folder in folders)]  # fmt: skip
    if not names:
        raise UsageError(f"--compare: {folders[0]} and {folders[1]} hold no benchmark in common.")
    manifests = [json.loads((folder / MANIFEST).read_text()) for folder in folders]
    rows, skipped, notes = {}, [], []
    for name in names:
        hashes = [manifest.get("data_sha256", {}).get(name) for manifest in manifests]
        if None not in hashes and hashes[0] != hashes[1]:
            raise UsageError(f"--compare: {name} was read from other rows in each folder (rows sha256 "
                             f"{hashes[0][:12]} and {hashes[1][:12]}): the same ids are not the same questions.")  # fmt: skip
        records = [read_records(folder / f"{name}.jsonl", repair=False) for folder in folders]
        judges = [judges_of(found, args.protocol) for found in records]
        if judges[0] != judges[1]:
            notes.append(f"{BENCHMARKS[name].title}: graded by {sorted(map(str, judges[0]))} in A and "
                         f"{sorted(map(str, judges[1]))} in B")  # fmt: skip
        a, b = (sample_rows(found, args.protocol) for found in records)
        result = paired_difference(a, b, seed=bench_seed(name))
        if result["rows"] == 0:
            skipped.append(name)
            continue
        rows[name] = result
    if not rows:
        raise UsageError(f"--compare: no question of {', '.join(names)} is graded under --protocol {args.protocol} "
                         "in both folders (--rescore them under that protocol first).")  # fmt: skip
    out: dict[str, Any] = {"a": str(folders[0]), "b": str(folders[1]), "protocol": args.protocol, "benchmarks": {}}
    lines = [f"# vepo-trl eval --compare: {folders[0]} minus {folders[1]} (`--protocol {args.protocol}`)", "",
             "| Benchmark | Questions in both | A - B | 95% interval |", "|---|---:|---:|---|"]  # fmt: skip
    for name, result in rows.items():
        cells = {key: round(100 * result[key], 2) for key in ("difference", "low", "high")}
        out["benchmarks"][name] = {"questions": result["rows"], **cells}
        lines.append(f"| {BENCHMARKS[name].title} | {result['rows']} | {cells['difference']:+.2f} | "
                     f"[{cells['low']:+.2f}, {cells['high']:+.2f}] |")  # fmt: skip
    if len(rows) > 1:
        draws = sum(result["draws"] for result in rows.values()) / len(rows)
        low, high = interval(draws)
        average = sum(result["difference"] for result in rows.values()) / len(rows)
        out["average"] = {
            "difference": round(100 * average, 2),
            "low": round(100 * low, 2),
            "high": round(100 * high, 2),
        }
        lines.append(f"| Avg. of these | | {100 * average:+.2f} | [{100 * low:+.2f}, {100 * high:+.2f}] |")
    lines += ["", "An interval that holds 0 is no evidence of a difference on these questions. Paired: both folders' "
              "rows drawn together, each question's samples drawn within its folder."]  # fmt: skip
    if skipped:
        lines.append(f"Not compared (no graded question in both): {', '.join(skipped)}.")
    if notes:
        lines.append("Other judges, so part of a difference may be theirs: " + "; ".join(notes) + ".")
    print("\n".join(lines))
    return out


def run(args) -> dict[str, Any]:
    """Evaluate; returns the summary (also written to `summary.json` / `summary.md` on the main process)."""
    from ..trl_compat import quiet_deprecated_alias

    quiet_deprecated_alias()  # PEFT's wrapper reads transformers' deprecated alias: not the user's to act on
    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list, gather_object
    from tqdm.auto import tqdm

    from ..validation import check_combinations
    from .generate import resolve_adapter

    try:  # the rules that join eval's options, for a Python caller too (the CLI checked them as it parsed)
        check_combinations(vars(args), command="eval")
    except ValueError as error:
        raise UsageError(str(error)) from None
    if getattr(args, "compare", None):
        return compare(args)
    if args.rescore is not None:
        return rescore(args)
    # -- usage checks: all before data or model loading ------------------------------------------------------------
    benches = _benchmarks_and_push(args)
    for flag in ("model", "adapter", "base_model"):  # the one model rule (`local_models.check_model_name`)
        if getattr(args, flag):
            check_model_name(getattr(args, flag), f"--{flag}", use="evaluate the run's output_dir",
                             adapter=flag == "adapter", visual="the benchmarks are visual questions")  # fmt: skip
    output_dir = Path(args.output_dir or f"eval-{Path(args.model.rstrip('/')).name}")
    # a training run's (or a lab's) folder: its summary.md and README.md would be replaced
    check_folder_owner("--output_dir", output_dir, "eval")
    missing = [problem for bench in benches if (problem := bench.unavailable(args.data_dir))]
    if len(missing) == 1:
        raise EvalDataError(missing[0])
    if missing:  # every benchmark that cannot load, in one line, not one per rerun
        names = ", ".join(message.split(":", 1)[0] for message in missing)
        raise EvalDataError(f"{len(missing)} benchmarks cannot load ({names}): {' | '.join(missing)}")
    state = PartialState()
    backend = _resolve_backend(args, state)
    # on every process: one that stopped alone would leave the others waiting
    judge = make_judge(args, benches, output_dir)
    model_id, adapter = resolve_adapter(args.model, args.adapter, args.base_model)
    backend = _engine_or_fallback(args, backend, model_id)
    manifest = {
        "model": _model_identity(model_id),
        "adapter": _model_identity(adapter),
        "model_weights": _weights_fingerprint(model_id),
        "adapter_weights": _weights_fingerprint(adapter),
        "model_arg": args.model,
        "base_model_arg": args.base_model,
        "generation": _generation_settings(args, backend),
        "sources": {bench.name: bench.source(args.data_dir) for bench in benches},
    }
    manifest = check_manifest(output_dir, manifest)
    manifest.pop("protocol", None)  # the pre-split key, now `generation` + `grading`

    # -- data, then the model --------------------------------------------------------------------------------------
    examples: dict[str, list[Example]] = {}
    with state.main_process_first():
        for bench in benches:
            examples[bench.name] = bench.load_examples(args.data_dir, limit=args.limit)
    manifest.setdefault("versions", package_versions())  # a resumed run keeps the first generation's
    for name, loaded in examples.items():
        if args.limit is None or name not in manifest.get("data_sha256", {}):
            manifest.setdefault("data_sha256", {})[name] = rows_hash(loaded)
        previous = manifest.get("totals", {}).get(name)
        # A full run completes a folder that a --limit run started; a --limit run never shrinks a full one
        if args.limit is None or not isinstance(previous, dict) or previous.get("limit") is not None:
            manifest.setdefault("totals", {})[name] = {"examples": len(loaded), "limit": args.limit}
    if is_builtin_model(model_id):  # tiny-<family>, the lab's warm start: built on first use
        model_id = resolve_model_name(model_id)
    start = time.perf_counter()
    generator = _make_generator(args, backend, model_id, adapter, state)
    if state.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        manifest.setdefault("grading", {})[args.protocol] = _grading_settings(args)
        (output_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")

    # -- generate, append; grading follows over the whole folder ---------------------------------------------------

    chunk_size = args.batch_size * state.num_processes
    # Sampled: each question's samples 0..k-1, each drawn with its own seed (`sample_seed`); greedy: one record, no
    # sample number
    samples = list(range(args.num_samples)) if args.temperature > 0 else [None]
    for bench in benches:
        path = output_dir / f"{bench.name}.jsonl"
        done = [None]
        if state.is_main_process:
            done = [{(record["id"], record.get("sample")) for record in read_records(path)}]
        done = broadcast_object_list(done)[0]
        todo = [(example, s) for s in samples for example in examples[bench.name] if (example.id, s) not in done]
        total = len(examples[bench.name]) * len(samples)
        bar = tqdm(total=total, initial=total - len(todo), desc=bench.name, disable=not state.is_main_process)
        for begin in range(0, len(todo), chunk_size):
            chunk_samples = todo[begin : begin + chunk_size]
            for sample in dict.fromkeys(s for _, s in chunk_samples):  # one seed per generate call
                chunk = [example for example, s in chunk_samples if s == sample]
                mine = list(range(state.process_index, len(chunk), state.num_processes))
                prepared = [_prepare(chunk[i], generator.processor, args) for i in mine]
                usable = [k for k, (_, _, error) in enumerate(prepared) if error is None]
                seeds = None if sample is None else [sample_seed(args.seed, bench.name, chunk[mine[k]].id, sample)
                                                     for k in usable]  # fmt: skip
                generated = dict(zip(usable, generate_rows(generator, [prepared[k][0] for k in usable],
                                                           [prepared[k][1] for k in usable], seeds)))  # fmt: skip
                outputs = [(i, p[0], *generated.get(k, ("", p[2]))) for k, (i, p) in enumerate(zip(mine, prepared))]
                outputs = sorted(gather_object(outputs))
                _write_records(bench, chunk, outputs, sample, state, args, judge, path)
            bar.update(len(chunk_samples))
        bar.close()
    state.wait_for_everyone()

    summary: dict[str, Any] = {}
    if state.is_main_process:
        # Records of an earlier run whose judge failed (or that another protocol graded) are graded now
        try:
            regrade_folder(output_dir, [bench.name for bench in benches], args, judge)
        except Exception as error:  # noqa: BLE001 - said in one line: every completion is on disk
            raise UsageError(
                f"grading stopped ({type(error).__name__}: {error}); every completion is kept in {output_dir}/: "
                f"finish with vepo-trl eval --rescore {output_dir} --protocol {args.protocol}"
            ) from None
        summary = summarize_folder(output_dir, manifest, args, time.perf_counter() - start)
        _update_model_card(args, summary)
    return summary


def _update_model_card(args, summary: dict[str, Any]) -> None:
    """The complete results into the model folder's card (`model-index`), pushed with --push_to_hub."""
    from .card import push_card, write_model_index

    folder = Path(args.adapter or args.model or "").expanduser()
    if args.no_model_card or not folder.is_dir():
        return
    card = folder / "README.md"
    if card.is_symlink() or not os.access(folder, os.W_OK):  # a Hub cache snapshot, a read-only shared folder
        print(f"Model card: {folder} is not a folder this run may write its card into; results stay in the summary.")
        return
    try:
        written = write_model_index(folder, summary, args.hub_model_id or folder.name)
    except (OSError, ValueError) as error:  # an unwritable card, a model-index huggingface_hub cannot parse
        print(f"Model card: not updated ({type(error).__name__}: {error}).")
        return
    if written is None:
        print(f"Model card: no complete benchmark result to write into {folder / 'README.md'} (partial runs are not).")
        return
    path, left_out = written
    note = f" ({', '.join(left_out)} left out: partial)" if left_out else ""
    print(f"Model card: results written into {path} as model-index metadata{note}.")
    if args.push_to_hub:
        try:
            print(f"Model card pushed: {push_card(path, args.hub_model_id, args.hub_token)}")
        except (OSError, ValueError) as error:  # the Hub went away during the eval: the card is written locally
            raise UsageError(f"the card is written in {path}, but the push failed: {error}") from None


if __name__ == "__main__":
    from ..cli import main as cli_main

    cli_main(["eval", *sys.argv[1:]])
