"""Rerun the figures the README quotes and check them against it (or rewrite them), so they cannot drift.

Figures covered (each found in the README or a page under docs/ by a pattern, see `FIGURES`):

- `tests`: the number of tests (`pytest --collect-only`, the suite the README's test command runs);
- `warm`: the warm-start demo (`vepo-trl demo --warm_start`): reward first -> last quarter, seconds, and the Fig. 5c
  miss rates of top-k entropy and of VEPO's selection;
- `bench_step`: `bench_step.py`'s ratios (VEPO / GRPO and VEPO / top-20% entropy, medians of the per-round ratios and
  their range), VEPO's median step and its perturbed forwards per completion;
- `bench_scoring`: `bench_scoring.py`'s tiled signals against full logits at N = 1024, d = 256 (memory, time) and the
  tile's memory at N = 256;
- the GPU table: the acceptance command's JSON (`gpu_acceptance.py --out DIR` writes DIR/acceptance.json).
  `--acceptance FILE --write` keeps a copy as benchmarks/results/acceptance.json and renders the README's table and
  the machine's line from it; a later check renders that copy again and compares.

    python benchmarks/readme_figures.py            # measure, print README vs measured, exit 1 on a difference
    python benchmarks/readme_figures.py --write    # measure and rewrite the README's figures
    python benchmarks/readme_figures.py --only tests
    python benchmarks/readme_figures.py --acceptance gpu-acceptance/acceptance.json --write

Timings (seconds, time ratios) are checked within 50% (a shared machine), memory within 10%; every other figure must
match exactly. The warm-start demo builds the warm start on first use (about 1.5 minutes), then runs about a minute;
bench_step about two minutes on two cores, bench_scoring about one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
ACCEPTANCE = REPO / "benchmarks" / "results" / "acceptance.json"
TABLE_START, TABLE_END = "<!-- gpu-acceptance:start -->", "<!-- gpu-acceptance:end -->"

# How a measured figure may differ from the README's: exactly, or within a fraction of it
EXACT, TIMING, MEMORY = 0.0, 0.5, 0.1
# name -> (README pattern with one group per figure, which measurement fills it, tolerance of each group)
FIGURES = {
    "tests": (r"the tests \(([\d,]+) of them[;)]", "tests", EXACT),
    "warm_seconds": (r"then 60 steps in (\d+) s,", "warm", TIMING),
    "warm_reward": (r"(\d\.\d{3} -> \d\.\d{3}) mean reward, measured", "warm", EXACT),
    "warm_miss": (
        r"top-k entropy would miss ([\d.]+%) of each\s+response's top-k JSD tokens and VEPO's selection "
        r"misses ([\d.]+%)",
        "warm",
        EXACT,
    ),  # fmt: skip
    "step_over_grpo": (
        r"VEPO (\d\.\d\d)x full GRPO \(`GRPOTrainer`; per-round range (\d\.\d\d)-(\d\.\d\d)\)",
        "bench_step",
        TIMING,
    ),  # fmt: skip
    "step_over_entropy": (r"(\d\.\d\d)x top-20% entropy \(range (\d\.\d\d)-(\d\.\d\d);", "bench_step", TIMING),
    "step_seconds": (r"VEPO's median step (\d\.\d\d) s", "bench_step", TIMING),
    "step_perturbed": (r"with (\d\.\d\d) perturbed forwards per completion", "bench_step", EXACT),
    "scoring_memory": (r"peak extra memory ([\d,]+) MB against ([\d,]+) MB \(([\d.]+)%\)", "bench_scoring", MEMORY),
    "scoring_time": (r"time ([\d.]+) s against ([\d.]+) s \(([\d.]+)x\)", "bench_scoring", TIMING),
    "scoring_small": (r"The tile's memory does not grow with N: ([\d,]+) MB at N = 256", "bench_scoring", MEMORY),
}


def count_tests() -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=REPO, capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    match = re.search(r"(\d+)(?:/\d+)? tests? collected", out) or re.search(r"^(\d+) tests? collected", out, re.M)
    if not match:
        raise SystemExit(f"could not count the tests:\n{out[-2000:]}")
    return {"tests": f"{int(match[1]):,}"}


def warm_demo() -> dict[str, str | tuple[str, str]]:
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        summary = subprocess.run(
            [sys.executable, "-m", "vepo_trl", "demo", "--warm_start", "--output_dir", str(Path(folder) / "warm")],
            capture_output=True, text=True, env=env, check=True,
        ).stdout  # fmt: skip
    seconds = re.search(r"for 60 steps in (\d+) s", summary)
    reward = re.search(r"Reward \(mean of the first / last quarter of \d+ logged steps\): (\S+ -> \S+)\.", summary)
    miss = re.search(r"top-k entropy would miss ([\d.]+%); this run's selection misses ([\d.]+%)", summary)
    if not (seconds and reward and miss):
        raise SystemExit(f"the warm-start demo's summary lacks a figure:\n{summary}")
    return {"warm_seconds": seconds[1], "warm_reward": reward[1], "warm_miss": (miss[1], miss[2])}


def last_json_line(command: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def bench_step() -> dict[str, str | tuple[str, ...]]:
    data = last_json_line([sys.executable, str(REPO / "benchmarks" / "bench_step.py")])
    spread = data["ratio_spread"]

    def ratio(name):
        return tuple(f"{spread[name][key]:.2f}" for key in ("median", "min", "max"))

    seconds = sorted(data["round_median_step_seconds"]["vepo"])
    return {
        "step_over_grpo": ratio("vepo_over_grpo"),
        "step_over_entropy": ratio("vepo_over_entropy"),
        "step_seconds": f"{seconds[len(seconds) // 2]:.2f}",
        "step_perturbed": f"{data['perturbed_forwards_per_completion']:.2f}",
    }


def bench_scoring() -> dict[str, str | tuple[str, ...]]:
    script = str(REPO / "benchmarks" / "bench_scoring.py")
    big = last_json_line([sys.executable, script, "--sizes", "256x256", "1024x256", "--no_gpu"])
    small = last_json_line([sys.executable, script, "--sizes", "256x256", "--no_gpu", "--repeats", "1"])
    return {
        "scoring_memory": (
            f"{big['tiled_peak_mb']:,.0f}",
            f"{big['full_peak_mb']:,.0f}",
            f"{100 * big['peak_mem_ratio']:.1f}",
        ),
        "scoring_time": (f"{big['tiled_seconds']:.1f}", f"{big['full_seconds']:.1f}", f"{big['time_ratio']:.2f}"),
        "scoring_small": f"{small['tiled_peak_mb']:,.0f}",
    }


def render_acceptance(summary: dict, source: str) -> str:
    """The README's GPU block from the acceptance command's JSON: the machine and versions, then one row per section
    with the section's own summary line."""
    labels = {"torch": "torch", "transformers": "transformers", "trl": "TRL", "accelerate": "accelerate",
              "peft": "peft", "deepspeed": "DeepSpeed"}  # fmt: skip
    versions = ", ".join(f"{label} {summary['versions'][name]}" for name, label in labels.items()
                         if summary["versions"].get(name))  # fmt: skip
    memory = f" {summary['gpu_memory_gb']} GiB" if summary.get("gpu_memory_gb") else ""
    cuda = f"CUDA {summary['cuda']}, " if summary.get("cuda") else ""
    verdict = "every section passed" if summary["passed"] else "NOT every section passed"
    lines = [
        f"Last measured on one {summary['device']}{memory} ({cuda}{versions}; {summary['attention']}), "
        f"{summary['seconds']:.0f} s in all, {verdict} (`{source}`):",
        "",
        "| section | s | result |",
        "|---|---:|---|",
    ]
    for name, section in summary["sections"].items():
        result = section["summary"].replace("|", "\\|")
        if section["status"] != "ok":
            result = f"**{section['status']}**: {result}"
        lines.append(f"| {name} | {section['seconds']:.0f} | {result} |")
    return "\n".join(lines)


def acceptance_block(text: str) -> tuple[int, int]:
    start, end = text.find(TABLE_START), text.find(TABLE_END)
    if start < 0 or end < start:
        raise SystemExit(f"README: the GPU acceptance block ({TABLE_START} ... {TABLE_END}) is missing")
    return start + len(TABLE_START), end


def check_acceptance(text: str, path: Path | None, write: bool, results: Path, root: Path) -> tuple[str, bool]:
    """The README's GPU block against the acceptance JSON (`path`, else the kept copy); returns the text (rewritten
    with `write`) and whether it differed."""
    source = path if path is not None else results
    if not source.is_file():
        print(f"gpu table     no acceptance JSON at {source}: the README's GPU block is not checked")
        return text, False
    rendered = render_acceptance(json.loads(source.read_text()), results.relative_to(root).as_posix())
    start, end = acceptance_block(text)
    same = text[start:end].strip() == rendered
    print(f"gpu table     README {'matches' if same else 'DIFFERS from'} {source}")
    if write and not same:
        text = text[:start] + "\n" + rendered + "\n" + text[end:]
        if path is not None and path.resolve() != results.resolve():
            results.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, results)
    return text, not same


def locate(pattern: str, text: str) -> re.Match | None:
    """A figure's pattern in the README, a space in it matching any run of whitespace (a line break too)."""
    return re.search(pattern.replace(" ", r"\s+"), text)


def differs(measured: str, stated: str, tolerance: float) -> bool:
    if tolerance == EXACT:
        return measured != stated
    value, claim = float(measured.replace(",", "")), float(stated.replace(",", ""))
    return abs(value - claim) > tolerance * abs(claim)


MEASURE = {"tests": count_tests, "warm": warm_demo, "bench_step": bench_step, "bench_scoring": bench_scoring}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="Rewrite the README's figures with the measured ones.")
    parser.add_argument("--only", choices=[*MEASURE, "gpu"], help="Measure one group of figures only.")
    parser.add_argument("--acceptance", type=Path, help="The GPU acceptance JSON to render the README's table from.")
    parser.add_argument("--readme", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--results", type=Path, default=ACCEPTANCE, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # The figures live in the README or a documentation page (docs/*.md); `--readme` names one file instead
    pages = [args.readme] if args.readme else [README, *sorted((REPO / "docs").rglob("*.md"))]
    root = args.readme.parent if args.readme else REPO
    texts = {page: page.read_text() for page in pages}
    measured: dict = {}
    for group, measure in MEASURE.items():
        if args.only in (None, group) and not (args.acceptance and args.only is None):
            measured.update(measure())
    differ = False
    for name, value in measured.items():
        pattern, _, tolerance = FIGURES[name]
        page = next((page for page in pages if locate(pattern, texts[page])), None)
        if page is None:
            raise SystemExit(f"README and docs/: the {name} figure is no longer where {pattern!r} finds it")
        text = texts[page]
        match = locate(pattern, text)
        values = value if isinstance(value, tuple) else (value,)
        stated = match.groups()
        same = not any(differs(m, s, tolerance) for m, s in zip(values, stated))
        print(f"{name:<17} README {' / '.join(stated):<24} measured {' / '.join(values)}{'' if same else '  DIFFERS'}")
        differ |= not same
        if args.write:  # every measured figure, timings within the tolerance too
            start, end = match.span()
            piece = match.group(0)
            for (old_start, old_end), new in sorted(
                ((match.span(i + 1), v) for i, v in enumerate(values)), reverse=True
            ):
                piece = piece[: old_start - start] + new + piece[old_end - start :]
            texts[page] = text[:start] + piece + text[end:]
    if args.only in (None, "gpu") or args.acceptance:
        page = next((page for page in pages if TABLE_START in texts[page]), pages[0])
        texts[page], gpu_differs = check_acceptance(texts[page], args.acceptance, args.write, args.results, root)
        differ |= gpu_differs
    if args.write:
        changed = [page for page in pages if texts[page] != page.read_text()]
        for page in changed:
            page.write_text(texts[page])
        print(
            f"rewritten: {', '.join(p.relative_to(root).as_posix() for p in changed)}"
            if changed
            else "README already matches"
        )
    elif differ:
        sys.exit(1)


if __name__ == "__main__":
    main()
