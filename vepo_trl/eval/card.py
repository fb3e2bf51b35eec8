"""A run's Table-1 scores where Hub users look for them: `model-index` metadata in the model's card (the Hub's
evaluation-results format, parsed by `huggingface_hub.ModelCard` / `EvalResult`), and the card pushed with
`--push_to_hub`.

Only complete results go in: a benchmark run with `--limit`, on a truncated copy or with rows a judge never graded
is left out (and said so), never reported as the benchmark's score. Each result names the protocol and the judge, so a
`paper`-protocol score is not mistaken for a rule-graded one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .benchmarks import BENCHMARKS
from .table import versions_text


SOURCE_NAME = "vepo-trl eval"


def eval_results(summary: dict[str, Any]) -> tuple[list, list[str]]:
    """`EvalResult`s of the summary's complete benchmarks (those with a Hub data set), and the names left out."""
    from huggingface_hub import EvalResult

    grading = summary["grading"]
    judge = grading.get("judge_model")
    generation = summary.get("generation") or {}
    samples = generation.get("num_samples", 1) if generation.get("decoding") == "sampled" else 1
    kind = f"avg@{samples} accuracy" if samples > 1 else "accuracy"
    metric_name = f"{kind} ({grading['protocol']} protocol" + (f", judge {judge})" if judge else ")")
    results, left_out = [], []
    for name, bench in summary["benchmarks"].items():
        spec = BENCHMARKS[name]
        if not getattr(spec, "hub_id", None):
            continue
        if not bench.get("complete") or bench.get("accuracy") is None:
            left_out.append(name)
            continue
        results.append(
            EvalResult(
                task_type="visual-question-answering",
                task_name="Visual mathematical reasoning",
                dataset_type=spec.hub_id,
                dataset_name=spec.title,
                dataset_split=spec.split,
                metric_type="accuracy",
                metric_name=metric_name,
                metric_value=bench["accuracy"],
                metric_config=grading["protocol"],
                # `source_name` would need a public URL of the run; the grader and judge go in the metric's args
                metric_args={"evaluated_with": SOURCE_NAME, "protocol": grading["protocol"]}
                | ({"judge": judge} if judge else {})
                | _provenance_args(bench),
            )
        )
    return results, left_out


def _provenance_args(bench: dict[str, Any]) -> dict[str, Any]:
    """The number's interval and provenance, as model-index metric args (plain values)."""
    origin = bench.get("provenance") or {}
    judge = origin.get("judge") or {}
    versions = origin.get("generation_versions")
    args = {
        "ci95": bench.get("ci95"),
        "pass_at_k": bench.get("pass_at_k") if bench.get("num_samples", 1) > 1 else None,
        "judge_endpoint_host": judge.get("endpoint_host"),
        "judge_temperature": judge.get("temperature"),
        "prompt_template_sha256": origin.get("prompt_template_sha256"),
        "decoding": ", ".join(f"{k}={v}" for k, v in (origin.get("decoding") or {}).items()) or None,
        "seed": (origin.get("seeds") or {}).get("seed"),
        "data_sha256": origin.get("data_sha256"),
        "versions": versions_text(versions) or None,
    }
    return {key: value for key, value in args.items() if value is not None}


def write_model_index(folder: Path, summary: dict[str, Any], model_name: str) -> tuple[Path, list[str]] | None:
    """Put the summary's complete results into `folder`'s README.md as `model-index` metadata (results of other data
    sets or other metrics already there are kept; one of the same data set and metric is replaced). Returns the card
    path and the benchmarks left out, or None when there is nothing complete to write."""
    from huggingface_hub import ModelCard, ModelCardData
    from huggingface_hub.repocard import metadata_load

    results, left_out = eval_results(summary)
    if not results:
        return None
    path = folder / "README.md"
    before = (metadata_load(path) or {}) if path.is_file() else {}
    card = ModelCard(path.read_text()) if path.is_file() else ModelCard(f"---\n---\n\n# {model_name}\n")
    data = card.data if card.data is not None else ModelCardData()
    new = {(r.dataset_type, r.dataset_split, r.metric_type, r.metric_name) for r in results}
    kept = [
        r
        for r in (data.eval_results or [])
        if (r.dataset_type, r.dataset_split, r.metric_type, r.metric_name) not in new
    ]
    data.eval_results = kept + results
    data.model_name = data.model_name or model_name
    card.data = data
    card.save(path)
    if "model_name" in before:
        _restore_model_name(path, before)
    return path, left_out


def _restore_model_name(path: Path, before: dict) -> None:
    """huggingface_hub folds a card's `model_name:` metadata into `model-index` (as its `name`) when it writes
    results, so the line TRL's cards carry would be gone: put it back where it stood, with its own value."""
    from huggingface_hub.repocard import metadata_load, metadata_save

    metadata = {**(metadata_load(path) or {}), "model_name": before["model_name"]}
    order = dict.fromkeys([*before, *metadata])  # the card's own order, then what was added (model-index)
    metadata_save(path, {key: metadata[key] for key in order if key in metadata})


def push_card(path: Path, repo_id: str, token: str | None) -> str:
    """Upload the card to `repo_id` (README.md), through the real client; `HF_ENDPOINT` is read now, not at import."""
    from huggingface_hub import HfApi

    from ..local_models import check_hub_push

    check_hub_push(token, repo_id)
    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None, token=token)
    info = api.upload_file(
        path_or_fileobj=str(path),
        path_in_repo="README.md",
        repo_id=repo_id,
        commit_message="Evaluation results (vepo-trl eval)",
    )
    return str(info)
