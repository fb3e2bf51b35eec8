"""The summary of an evaluation, laid out like the paper's Table 1, with the paper's numbers beside it.

`summarize_benchmark` turns graded records into per-benchmark accuracies under one protocol (and every protocol whose
verdicts the records hold, sub-categories, official secondary metrics); `render_markdown` writes the table a reader
compares with the paper. The paper's rows are printed only under `--protocol paper`.
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


def _verdict(record: Mapping[str, Any], protocol: str) -> Mapping[str, Any] | None:
    return (record.get("verdicts") or {}).get(protocol)


def _expected(total: Any) -> tuple[int | None, int | None]:
    """`(rows loaded, --limit)` from the manifest's totals (an int in folders written before --limit was recorded)."""
    if isinstance(total, Mapping):
        return total.get("examples"), total.get("limit")
    return total, None


def _scored_by(name: str, protocol: str, judge: str | None) -> str:
    from .grading import uses_judge

    if uses_judge(protocol, name):
        return f"judge ({judge})" if judge else "judge"
    if protocol == "paper" and name == "geometry3k":
        return "mathruler"
    if protocol == "paper" and name == "hallusionbench":
        return "exact yes/no"
    return "rule"


def sample_rows(records: Sequence[Mapping[str, Any]], protocol: str) -> dict[str, list[bool]]:
    """`{question id: its samples' verdicts under protocol}` over the graded records the accuracy counts (one verdict
    a question when greedy; under `paper`, no row that could not be evaluated, as the release skips them)."""
    rows: dict[str, list[bool]] = {}
    for index, record in enumerate(records):
        if protocol == "paper" and record.get("error"):
            continue
        verdict = _verdict(record, protocol) or {}
        if verdict.get("correct") is not None:
            rows.setdefault(record.get("id", index), []).append(bool(verdict["correct"]))
    return rows


def judges_of(records: Sequence[Mapping[str, Any]], protocol: str) -> set[str | None]:
    """The judge models that gave the records' verdicts under `protocol` (None: a rule)."""
    return {((_verdict(record, protocol) or {}).get("grader") or {}).get("judge") for record in records}


def summarize_benchmark(name: str, records: Sequence[Mapping[str, Any]], expected: Any, protocol: str = "rule",
                        judge: str | None = None, num_samples: int = 1, draws=None) -> dict[str, Any]:  # fmt: skip
    """Accuracies of one benchmark's records under `protocol` (percent, 2 decimals), and every protocol's accuracy
    where the records hold its verdicts. Rows without a verdict (a judge that failed) make the benchmark incomplete.

    Sampled (`num_samples` k > 1), the records hold k per question: the accuracy is avg@k (`avg_at_k`), `pass_at_k`
    the share of questions with a right sample; `ci95` is avg@k's 95% bootstrap interval (`eval.stats`; `draws`: its
    bootstrap draws, where the caller made them for an average too); the official secondary metrics read sample 0."""
    from .stats import avg_at_k, bench_seed, bootstrap_means, interval, pass_at_k

    bench = BENCHMARKS[name]
    total, limit = _expected(expected)
    counts = _sample_counts(records)
    questions = len(counts)
    if num_samples > 1:
        first = [r for r in records if r.get("sample", 0) == 0]
        short = sum(1 for count in counts.values() if count < num_samples)
    else:
        first, short = records, 0
    first_ids = {id(r) for r in first}
    # A row that could not be evaluated (an unreadable image, one the processor refuses): the release's
    # prepare_prompts skips it, so the paper protocol leaves it out of the accuracy; the others count it wrong
    left_out = [r for r in records if r.get("error")] if protocol == "paper" else []
    kept = [r for r in records if not (protocol == "paper" and r.get("error"))]
    graded = [r for r in kept if (_verdict(r, protocol) or {}).get("correct") is not None]
    correct = [bool(_verdict(r, protocol)["correct"]) for r in graded]
    unjudged = len(kept) - len(graded)
    judges = judges_of(graded, protocol) - {None}
    # A local copy with fewer rows than the split the paper evaluated is a partial result, like a --limit run
    truncated = bench.paper_rows is not None and total is not None and total < bench.paper_rows
    rows = list(sample_rows(records, protocol).values())
    if rows and draws is None:
        draws = bootstrap_means(rows, seed=bench_seed(name))
    average = _pct(avg_at_k(rows)) if rows else None
    summary: dict[str, Any] = {
        "title": bench.title,
        "examples": questions,
        "expected": total,
        "paper_rows": bench.paper_rows,
        "limit": limit,
        "partial": limit is not None or truncated,
        "truncated": truncated,
        "unjudged": unjudged,
        "unusable": sum(1 for r in records if r.get("error")),
        "unusable_left_out": len(left_out),
        "complete": limit is None
        and not truncated
        and total is not None
        and questions >= total
        and unjudged == 0
        and short == 0,
        "protocol": protocol,
        "num_samples": num_samples,
        "accuracy": average,
        "avg_at_k": average,
        "pass_at_k": _pct(pass_at_k(rows)) if rows else None,
        "ci95": [_pct(value) for value in interval(draws)] if rows else None,
        "correct": sum(correct),
        "scored_by": _scored_by(name, protocol, judge or next(iter(judges), None)),
        "rule_accuracy": _pct(_mean([bool(r["rule_correct"]) for r in records])),
    }
    by_protocol = {}
    for other in ("rule", "lenient", "paper"):
        verdicts = [_verdict(r, other) for r in records if not (other == "paper" and r.get("error"))]
        done = [v for v in verdicts if v is not None and v.get("correct") is not None]
        if done:
            by_protocol[other] = {"correct": sum(bool(v["correct"]) for v in done), "graded": len(done),
                                  "accuracy": _pct(_mean([bool(v["correct"]) for v in done]))}  # fmt: skip
    summary["by_protocol"] = by_protocol
    errors = [(_verdict(r, protocol) or {}).get("error") for r in records]
    summary["judge_errors"] = sum(1 for e in errors if e)
    categories: dict[str, dict[str, dict[str, Any]]] = {}
    for field in bench.category_fields:
        # Per question (its samples' mean when sampled), so a category's count is its questions
        groups: dict[str, dict[Any, list[bool]]] = {}
        for index, (record, value) in enumerate(zip(graded, correct)):
            questions = groups.setdefault(record["categories"].get(field, "unknown"), {})
            questions.setdefault(record.get("id", index), []).append(value)
        categories[field] = {
            value: {"examples": len(rows), "accuracy": _pct(_mean([_mean(v) for v in rows.values()]))}
            for value, rows in sorted(groups.items())
        }
    if categories:
        summary["categories"] = categories
    if short:
        summary["missing_samples"] = short
    if not unjudged:
        scored = [{**r, "correct": value} for r, value in zip(graded, correct) if id(r) in first_ids]
        summary["metrics"] = {key: _pct(value) for key, value in bench.extra_metrics(scored).items()}
        # The official secondary metric reads this protocol's verdicts and extractions
        scored = [{**r, "extracted": _verdict(r, protocol).get("extracted")} for r in scored]
        official = bench.official_metrics(scored)
        if official is not None and summary["partial"]:
            # A --limit run or a truncated copy holds a slice of the problems (We-Math scores a problem's steps
            # together): its official figure would stand for problems it did not see (100 / 100 beside a 33.33)
            summary["official"] = {"protocol": protocol, "name": official["name"], "skipped": "partial run"}
        elif official is not None:
            summary["official"] = {"protocol": protocol, **_pct_official(official)}
    return summary


def _sample_counts(records: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for index, record in enumerate(records):
        counts[record.get("id", index)] = counts.get(record.get("id", index), 0) + 1
    return counts


def versions_text(versions: Mapping[str, str | None] | None) -> str:
    """`name version, ...` of the packages installed (`run.package_versions`)."""
    return ", ".join(f"{name} {version}" for name, version in (versions or {}).items() if version)


def interval_lines(summary: Mapping[str, Any]) -> list[str]:
    """Each benchmark's accuracy with its 95% interval (avg@k and pass@k when sampled), and what made it."""
    benches = summary["benchmarks"]
    if not benches:
        return []
    lines = ["Intervals (95%, bootstrap over questions and, when sampled, over each question's samples) and "
             "provenance:", ""]  # fmt: skip
    for bench in benches.values():
        if bench.get("ci95") is None:
            continue
        low, high = bench["ci95"]
        k = bench.get("num_samples", 1)
        head = f"avg@{k} {_cell(bench['avg_at_k'])}, pass@{k} {_cell(bench['pass_at_k'])}" if k > 1 else (
            f"accuracy {_cell(bench['accuracy'])}")  # fmt: skip
        origin = bench.get("provenance") or {}
        judge = origin.get("judge")
        graded = (
            f"judge {judge['model']} at {judge['endpoint_host']} (temperature {judge['temperature']})"
            if judge
            else "no judge"
        )
        data = (origin.get("data_sha256") or "?")[:12]
        lines.append(f"- {bench['title']}: {head} [{_cell(low)}, {_cell(high)}]; {graded}; rows sha256 {data}")
    average = summary["table"].get("average_ci95")
    if average:
        lines.append(f"- Avg.: {_cell(summary['table']['this_run'][-1])} [{_cell(average[0])}, {_cell(average[1])}]")
    origin = next((b["provenance"] for b in benches.values() if b.get("provenance")), None)
    if origin:
        versions = origin.get("generation_versions") or {}
        graded = origin["grading"]["versions"]
        lines += ["", f"Made with {versions_text(versions)}; graded with {versions_text(graded)}. Prompt template "
                  f"sha256 {origin['prompt_template_sha256'][:12]}."]  # fmt: skip
    return lines


def _pct_official(official: Mapping[str, Any]) -> dict[str, Any]:
    """Fractions to percent (2 decimals); counts stay counts."""
    converted = dict(official)
    for key in ("accuracy",):
        if key in converted:
            converted[key] = _pct(converted[key])
    for key in ("rates", "scores"):
        if key in converted:
            converted[key] = {name: _pct(value) for name, value in converted[key].items()}
    return converted


def official_lines(bench: Mapping[str, Any]) -> list[str]:
    """The markdown line of a benchmark's official secondary metric (empty when it has none)."""
    official = bench.get("official")
    if not official:
        return []
    if official.get("skipped"):
        return [f"- {bench['title']}: **{official['name']}** not computed: {official['skipped']} (it scores the whole "
                "split)."]  # fmt: skip
    head = (
        f"- {bench['title']}: **{official['name']}** ({official['source']}; on the `{official['protocol']}` verdicts"
    )
    if "scores" in official:  # We-Math
        rates, counts = official["rates"], official["counts"]
        count_of = {"IK": "IK", "IG": "IG", "CM (strict)": "CM_strict", "CM (loose)": "CM_loose",
                    "RM (strict)": "RM_strict", "RM (loose)": "RM_loose"}  # fmt: skip
        cells = [f"{name} {_cell(value)} ({counts[count_of[name]]})" for name, value in rates.items()]
        scores = ", ".join(f"{name} {_cell(value)}" for name, value in official["scores"].items())
        return [f"{head}, {official['problems']} problems): {scores}; {', '.join(cells)}. IK, IG, CM over the "
                "problems, RM over CM + RM (counts in brackets); IK and IG have no strict/loose variants."]  # fmt: skip
    return [f"{head}): {_cell(official['accuracy'])} ({official['correct']} / {official['examples']}), beside the "
            f"headline's {_cell(bench['accuracy'])}."]  # fmt: skip


def table_row(summaries: Mapping[str, Mapping[str, Any]]) -> list[float | None]:
    """This run's Table 1 row: the seven headline accuracies in the paper's order (none for a benchmark with rows
    still to grade) and their average (only when all seven are complete, never for a --limit run)."""
    values = [
        summaries[name]["accuracy"] if name in summaries and not summaries[name]["unjudged"] else None
        for name in PAPER_BENCHMARKS
    ]
    complete = all(name in summaries and summaries[name]["complete"] for name in PAPER_BENCHMARKS)
    average = round(_mean(values), 2) if complete and None not in values else None
    return [*values, average]


def _cell(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def render_markdown(summary: Mapping[str, Any]) -> str:
    """The summary as markdown: Table 1 (with the paper's rows under the paper protocol), notes, sub-categories."""
    from .grading import PROTOCOL_HELP
    from .paper import MMK12_NOTE, MMK12_UNKNOWN

    benches = summary["benchmarks"]
    protocol = summary["grading"]["protocol"]
    titles = [BENCHMARKS[name].title for name in PAPER_BENCHMARKS]
    label = summary["model"] + (f" + {summary['adapter']}" if summary.get("adapter") else "")
    lines = [f"# vepo-trl eval: {label}", "", f"Graded under `--protocol {protocol}`: {PROTOCOL_HELP[protocol]}.", ""]
    partial = sorted({b["limit"] for b in benches.values() if b.get("partial") and b.get("limit") is not None})
    truncated = [b["title"] for name, b in benches.items() if b.get("truncated") and name in PAPER_BENCHMARKS]
    in_table = [name for name in PAPER_BENCHMARKS if name in benches]
    if in_table:
        label = f"--limit {partial[0]}" if partial else f"{', '.join(truncated)} truncated" if truncated else ""
        this_run = "**this run**" + (f" (partial: {label})" if label else "")
        lines += [
            "| Model / Dataset | " + " | ".join(titles) + " | Avg. |",
            "|---|" + "---:|" * (len(titles) + 1),
            f"| {this_run} | " + " | ".join(_cell(v) for v in summary["table"]["this_run"]) + " |",
        ]
        paper_model = summary["table"].get("paper_model")
        for method, values in summary["table"].get("paper", {}).items():
            name = paper_model if method == "base" else f"+ {method}"
            lines.append(f"| paper: {name} | " + " | ".join(_cell(v) for v in values) + " |")
        lines.append("")
        if partial:
            lines.append(f"PARTIAL: a --limit {partial[0]} run grades the first rows only; no average, and no cell "
                         "is comparable with the paper's. ")  # fmt: skip
        elif truncated:
            lines.append(f"PARTIAL: {', '.join(truncated)} had fewer rows than the split the paper evaluated (a "
                         "truncated local copy); no average, and those cells are not comparable with the paper's. ")  # fmt: skip
        elif summary["table"]["this_run"][-1] is None:
            lines.append("Avg. is shown once all seven benchmarks are complete and fully graded. ")
        if protocol != "paper":
            lines.append(f"No paper rows: `--protocol {protocol}` does not grade as the paper did; run or --rescore "
                         "with `--protocol paper` to compare with Table 1.")  # fmt: skip
        elif not paper_model:
            lines.append("No paper rows: the model name shows no 3B/7B size (pass --paper_model).")
        lines.append("")
    if "mmk12" in benches:
        lines += [f"MMK12: {MMK12_NOTE if protocol == 'paper' else MMK12_UNKNOWN}", ""]
    lines += [
        "| Benchmark | Examples | Accuracy | Scored by | Rule | Lenient | Paper | Other |",
        "|---|---:|---:|---|---:|---:|---:|---|",
    ]
    for bench in benches.values():
        notes = [f"{key} {value:.2f}" for key, value in bench.get("metrics", {}).items() if value is not None]
        if bench.get("unjudged"):
            notes.append(f"INCOMPLETE: {bench['unjudged']} rows not graded ({bench['judge_errors']} judge errors; "
                         "a rerun or --rescore retries them)")  # fmt: skip
        if bench.get("unusable"):
            how = "left out, as the release skips them" if bench.get("unusable_left_out") else "counted wrong"
            notes.append(f"{bench['unusable']} rows that could not be evaluated (image or processor), {how}")
        if bench.get("missing_samples"):
            notes.append(f"INCOMPLETE: {bench['missing_samples']} questions hold fewer than {bench['num_samples']} "
                         "samples (a rerun draws the rest)")  # fmt: skip
        if bench.get("num_samples", 1) > 1 and bench.get("official"):
            notes.append("official metric from sample 0")
        if bench.get("partial") and bench.get("limit") is not None:
            notes.append(f"partial (--limit {bench['limit']})")
        elif bench.get("truncated"):
            notes.append(f"partial: {bench['expected']} of the paper's {bench['paper_rows']:,} rows")
        count = f"{bench['examples']}" + (f" / {bench['expected']}" if bench.get("expected") else "")
        others = [_cell(bench["by_protocol"].get(p, {}).get("accuracy")) for p in ("rule", "lenient", "paper")]
        lines.append(
            f"| {bench['title']} | {count} | {_cell(bench['accuracy'])} | {bench['scored_by']} | "
            + " | ".join(others)
            + f" | {', '.join(notes)} |"
        )
    lines.append("")
    official = [line for bench in benches.values() for line in official_lines(bench)]
    if official:
        lines += ["Official secondary metrics (beside the headline, not in Table 1):", "", *official, ""]
    for bench in benches.values():
        for field, groups in bench.get("categories", {}).items():
            cells = ", ".join(f"{value} {_cell(g['accuracy'])} ({g['examples']})" for value, g in groups.items())
            lines.append(f"- {bench['title']} by `{field}`: {cells}")
    lines += ["", *interval_lines(summary)]
    generation, grading = summary["generation"], summary["grading"]
    decoding = "greedy"
    if generation.get("decoding") == "sampled":
        decoding = (f"{generation['num_samples']} samples per question at temperature {generation['temperature']}, "
                    f"top_p {generation['top_p']}, each sample's seed drawn from --seed {generation['seed']} and the question")  # fmt: skip
    lines += [
        "",
        f"Generation: {decoding}, up to {generation['max_new_tokens']} new tokens, the release's evaluation system prompt, "
        f"images resized to [{generation['min_pixels']:,}, {generation['max_pixels']:,}] pixels; backend "
        f"{generation.get('backend', '?')}, dtype {generation.get('dtype', '?')}. Grading: {protocol} "
        f"(grader version {grading['grader_version']}), judge {grading.get('judge_model') or 'none'}. The Rule / "
        "Lenient / Paper columns are each protocol's accuracy where the records hold its verdicts "
        "(`--rescore DIR --protocol NAME` adds one).",
        "",
    ]
    return "\n".join(lines)
