"""The summary of an evaluation, laid out like the paper's Table 1, with the paper's numbers beside it.

`summarize` turns graded records into per-benchmark accuracies (headline, by rule, by judge, their agreement, and
sub-categories); `render_markdown` writes the table a reader compares with the paper.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .benchmarks import BENCHMARKS, PAPER_BENCHMARKS


__all__ = ["PAPER_TABLE1", "paper_rows_for", "render_markdown", "summarize_benchmark", "table_row"]

# Table 1 of the paper (7B: main text; 3B: appendix), in PAPER_BENCHMARKS order, then the average. Percent.
PAPER_TABLE1: dict[str, dict[str, tuple[float, ...]]] = {
    "Qwen2.5-VL-7B-Instruct": {
        "base": (35.94, 53.66, 63.51, 66.87, 62.13, 43.27, 25.10, 50.07),
        "GRPO": (49.42, 65.18, 70.45, 71.60, 67.18, 48.53, 27.40, 57.11),
        "GRPO (top 20% entropy)": (47.59, 64.93, 68.56, 70.40, 67.13, 48.25, 28.95, 56.54),
        "GRPO (top 40% entropy)": (46.76, 63.44, 69.09, 71.40, 68.45, 48.86, 27.53, 56.50),
        "VEPO": (51.58, 69.64, 71.71, 72.00, 69.54, 48.93, 28.31, 58.82),
    },
    "Qwen2.5-VL-3B-Instruct": {
        "base": (26.96, 45.35, 60.88, 56.50, 53.97, 32.90, 21.78, 42.63),
        "GRPO": (43.43, 57.37, 59.52, 62.16, 61.15, 40.95, 25.57, 50.02),
        "GRPO (top 20% entropy)": (38.28, 56.81, 59.20, 61.40, 59.66, 37.74, 24.18, 48.18),
        "GRPO (top 40% entropy)": (40.77, 54.52, 59.73, 62.60, 59.77, 38.78, 24.05, 48.60),
        "VEPO": (44.93, 58.86, 60.46, 62.80, 62.70, 43.32, 26.25, 51.33),
    },
}


def paper_rows_for(*names: str | None) -> tuple[str | None, dict[str, tuple[float, ...]]]:
    """The paper's rows for the model size named in any of `names` (a Hub id, a path, `--paper_model`)."""
    for name in names:
        if not name:
            continue
        if name in PAPER_TABLE1:
            return name, PAPER_TABLE1[name]
        match = re.search(r"(?<![0-9])([37])b(?![a-z0-9])", name.lower())
        if match:
            key = f"Qwen2.5-VL-{match.group(1)}B-Instruct"
            return key, PAPER_TABLE1[key]
    return None, {}


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _pct(value: float | None) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else round(100 * value, 2)


def summarize_benchmark(name: str, records: Sequence[Mapping[str, Any]], expected: int | None) -> dict[str, Any]:
    """Accuracies of one benchmark's graded records (percent, 2 decimals)."""
    bench = BENCHMARKS[name]
    rule = [bool(r["rule_correct"]) for r in records]
    judged = [r for r in records if r.get("judge_correct") is not None]
    summary: dict[str, Any] = {
        "title": bench.title,
        "examples": len(records),
        "expected": expected,
        "complete": expected is not None and len(records) >= expected,
        "accuracy": _pct(_mean([bool(r["correct"]) for r in records])),
        "scored_by": "judge" if any(r.get("scored_by") == "judge" for r in records) else "rule",
        "rule_accuracy": _pct(_mean(rule)),
    }
    if any("judge_correct" in r for r in records):
        summary["judge_accuracy"] = _pct(_mean([bool(r["judge_correct"]) for r in judged])) if judged else None
        summary["judge_agreement"] = (
            _pct(_mean([bool(r["judge_correct"]) == bool(r["rule_correct"]) for r in judged])) if judged else None
        )
        summary["judge_errors"] = sum(1 for r in records if r.get("judge_error"))
    categories: dict[str, dict[str, dict[str, Any]]] = {}
    for field in bench.category_fields:
        groups: dict[str, list[bool]] = {}
        for record in records:
            groups.setdefault(record["categories"].get(field, "unknown"), []).append(bool(record["correct"]))
        categories[field] = {
            value: {"examples": len(v), "accuracy": _pct(_mean(v))} for value, v in sorted(groups.items())
        }
    if categories:
        summary["categories"] = categories
    summary.update({key: _pct(value) for key, value in bench.extra_metrics(records).items()})
    return summary


def table_row(summaries: Mapping[str, Mapping[str, Any]]) -> list[float | None]:
    """This run's Table 1 row: the seven headline accuracies in the paper's order and their average (only when all
    seven are complete)."""
    values = [summaries[name]["accuracy"] if name in summaries else None for name in PAPER_BENCHMARKS]
    complete = all(name in summaries and summaries[name]["complete"] for name in PAPER_BENCHMARKS)
    average = round(_mean(values), 2) if complete and None not in values else None
    return [*values, average]


def _cell(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def render_markdown(summary: Mapping[str, Any]) -> str:
    """The summary as markdown: Table 1 with the paper's rows, scoring notes, sub-categories, the protocol."""
    benches = summary["benchmarks"]
    titles = [BENCHMARKS[name].title for name in PAPER_BENCHMARKS]
    label = summary["model"] + (f" + {summary['adapter']}" if summary.get("adapter") else "")
    lines = [f"# vepo-trl eval: {label}", ""]
    in_table = [name for name in PAPER_BENCHMARKS if name in benches]
    if in_table:
        lines += [
            "| Model / Dataset | " + " | ".join(titles) + " | Avg. |",
            "|---|" + "---:|" * (len(titles) + 1),
            "| **this run** | " + " | ".join(_cell(v) for v in summary["table"]["this_run"]) + " |",
        ]
        paper_model = summary["table"].get("paper_model")
        for method, values in summary["table"].get("paper", {}).items():
            name = paper_model if method == "base" else f"+ {method}"
            lines.append(f"| paper: {name} | " + " | ".join(_cell(v) for v in values) + " |")
        lines.append("")
        if summary["table"]["this_run"][-1] is None:
            lines.append("Avg. is shown once all seven benchmarks are complete. ")
        if not paper_model:
            lines.append("No paper rows: the model name shows no 3B/7B size (pass --paper_model).")
        lines.append("")
    lines += [
        "| Benchmark | Examples | Accuracy | Scored by | Rule | Judge | Agreement | Other |",
        "|---|---:|---:|---|---:|---:|---:|---|",
    ]
    for bench in benches.values():
        extra = ", ".join(f"{key} {bench[key]:.2f}" for key in ("aAcc", "qAcc", "fAcc") if bench.get(key) is not None)
        if bench.get("judge_errors"):
            extra = ", ".join(filter(None, [extra, f"{bench['judge_errors']} judge errors (graded by rule)"]))
        count = f"{bench['examples']}" + (f" / {bench['expected']}" if bench.get("expected") else "")
        lines.append(
            f"| {bench['title']} | {count} | {_cell(bench['accuracy'])} | {bench['scored_by']} | "
            f"{_cell(bench['rule_accuracy'])} | {_cell(bench.get('judge_accuracy'))} | "
            f"{_cell(bench.get('judge_agreement'))} | {extra} |"
        )
    lines.append("")
    for bench in benches.values():
        for field, groups in bench.get("categories", {}).items():
            cells = ", ".join(f"{value} {_cell(g['accuracy'])} ({g['examples']})" for value, g in groups.items())
            lines.append(f"- {bench['title']} by `{field}`: {cells}")
    protocol = summary["protocol"]
    lines += [
        "",
        f"Protocol: greedy decoding, up to {protocol['max_new_tokens']} new tokens, the training system prompt, "
        f"images resized to [{protocol['min_pixels']:,}, {protocol['max_pixels']:,}] pixels; "
        f"backend {summary.get('backend', '?')}; judge {protocol.get('judge_model') or 'none'}. "
        "Accuracy is the judge's verdict where a judge ran on a benchmark the paper judged, else the rule's "
        "(last \\boxed{} with math-verify, option letter or text, yes/no).",
        "",
    ]
    return "\n".join(lines)
