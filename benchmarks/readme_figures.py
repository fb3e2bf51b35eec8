"""Rerun the figures the README quotes and check them against it (or rewrite them), so they cannot drift.

Figures covered (each found in the README by a pattern, see `FIGURES`):

- the number of tests (`pytest --collect-only`, the suite the README's test command runs);
- the warm-start demo (`vepo-trl demo --warm_start`): reward first -> last quarter, seconds, and the Fig. 5c miss
  rates of top-k entropy and of VEPO's selection.

    python benchmarks/readme_figures.py            # measure, print README vs measured, exit 1 on a difference
    python benchmarks/readme_figures.py --write    # measure and rewrite the README's figures
    python benchmarks/readme_figures.py --only tests

Seconds are timings: `--check` accepts them within 50% (a shared machine), every other figure must match exactly.
The warm-start demo builds the warm start on first use (about 1.5 minutes), then runs about a minute.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"

# name -> (README pattern with one group per figure, which measurement fills it, is it a timing)
FIGURES = {
    "tests": (r"the tests \(([\d,]+) of them[;)]", "tests", False),
    "warm_seconds": (r"then 60 steps in (\d+) s,", "warm", True),
    "warm_reward": (r"(\d\.\d{3} -> \d\.\d{3}) mean reward, measured", "warm", False),
    "warm_miss": (
        r"top-k entropy would miss ([\d.]+%) of each\s+response's top-k JSD tokens and VEPO's selection "
        r"misses ([\d.]+%)",
        "warm",
        False,
    ),  # fmt: skip
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="Rewrite the README's figures with the measured ones.")
    parser.add_argument("--only", choices=["tests", "warm"], help="Measure one group of figures only.")
    args = parser.parse_args()
    text = README.read_text()
    measured: dict = {}
    if args.only in (None, "tests"):
        measured.update(count_tests())
    if args.only in (None, "warm"):
        measured.update(warm_demo())
    differ = False
    for name, value in measured.items():
        pattern, _, timing = FIGURES[name]
        match = re.search(pattern, text)
        if not match:
            raise SystemExit(f"README: the {name} figure is no longer where {pattern!r} finds it")
        values = value if isinstance(value, tuple) else (value,)
        stated = match.groups()
        same = (
            all(abs(int(m) - int(s)) <= 0.5 * int(s) for m, s in zip(values, stated))
            if timing
            else tuple(values) == stated
        )
        print(f"{name:<14} README {' / '.join(stated):<20} measured {' / '.join(values)}{'' if same else '  DIFFERS'}")
        differ |= not same
        if args.write and not same:
            start, end = match.span()
            piece = match.group(0)
            for old, new in zip(stated, values):
                piece = piece.replace(old, new, 1)
            text = text[:start] + piece + text[end:]
    if args.write:
        README.write_text(text)
        print("README rewritten" if differ else "README already matches")
    elif differ:
        sys.exit(1)


if __name__ == "__main__":
    main()
