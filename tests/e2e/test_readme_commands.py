"""The documentation's shell commands (the README, then the site's pages in their navigation's order), run in the order
a newcomer meets them, from one fresh folder, offline on the CPU.

Every command of every ```bash block runs, except those this machine cannot run, each skipped by a rule below with
its reason (a GPU launch, a Hub download, a folder the reader brings, or a run of many minutes that a shorter command
of the same block covers). A command that fails here fails for a newcomer too.
"""

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..support import documentation


README = documentation()

# (pattern, reason): a command matching the pattern is not run here
NOT_HERE = [
    (r"pip install|pytest", "installs the package or runs this suite: the suite is already running"),
    (r"accelerate launch", "a multi-GPU launch"),
    (
        r"confident_visual|colour_cards|my-rule",
        "a plug-in's command (docs/plugins.md): tests/e2e/test_plugin_tutorial.py runs it with the package installed",
    ),
    (r"\b(Qwen|OpenGVLab|google|HuggingFaceTB)/", "downloads a model from the Hub"),
    (
        r"\bruns/|eval_data|eval-vepo-7b|figure\.png|my_rows\.jsonl",
        "a folder or file the reader brings (a trained run, data)",
    ),
    (r"--push_to_hub true", "pushes to the Hub (tests/e2e/test_hub_push.py pushes to a stand-in of its HTTP API)"),
    (r"--output_dir docs/lab|--seeds 0,1,2,3,4", "a full lab or sweep: 10+ minutes; `lab --quick` runs instead"),
    (r"lab --build_warm_start", "builds the lab's warm start (2 minutes); `lab --quick` builds a small one"),
    (
        r"benchmarks/gpu_",
        "a GPU check, or wheels downloaded for one; tests/test_benchmarks_gpu_acceptance.py runs its CPU path",
    ),
]


def bash_commands() -> list[str]:
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README, flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()  # the README's aligned trailing comments
            # `a && b` runs as two steps, so that an install before a demo skips the install only
            commands.extend(part.strip() for part in line.split("&&") if part.strip())
    return commands


def reason_to_skip(command: str) -> str | None:
    return next((reason for pattern, reason in NOT_HERE if re.search(pattern, command)), None)


def test_the_skip_rules_leave_the_newcomer_path():
    commands = bash_commands()
    run = [c for c in commands if reason_to_skip(c) is None]
    # The demo, the lab's quick run, the stand-in evaluation and rescore, inspect, analyze and plot all run
    for expected in ("vepo-trl demo", "vepo-trl lab --quick", "write_standins", "--rescore", "vepo-trl inspect",
                     "vepo-trl analyze", "vepo-trl plot"):  # fmt: skip
        assert any(expected in command for command in run), expected
    assert len(run) >= 10


@pytest.mark.slow(minutes=4)
def test_readme_commands_run_in_order(tmp_path, shared_cache):
    # A fresh folder with the repository's recipes beside it, as in a clone; the tiny model and the warm start are
    # built once per test session (shared_cache)
    work = tmp_path / "newcomer"
    work.mkdir()
    env = {
        **os.environ,
        "VEPO_TRL_CACHE": str(shared_cache),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "OMP_NUM_THREADS": "1",
    }
    timings = []
    for command in bash_commands():
        if reason_to_skip(command):
            continue
        # Exactly as written, through bash, with this environment's Python for `python` / `python3`
        python = shlex.quote(sys.executable)
        argv = ["bash", "-c", re.sub(r"^python3? ", f"{python} ", command)]
        start = time.perf_counter()
        result = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=900)
        timings.append((command, time.perf_counter() - start))
        assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    assert (work / "vepo-demo" / "summary.md").is_file() and (work / "plots").is_dir()
