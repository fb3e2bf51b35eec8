"""Plug-ins, the way a researcher adds a rule: docs/plugins.md's package, written from the page into a fresh folder and
really installed (`pip install --target`, so its `.dist-info` and `entry_points.txt` are pip's own), then every
command of the page run as written through the real `vepo-trl` console script: `strategies` lists the rule with its
package, `demo` trains with it and its settings, `lab --quick` compares it with `vepo`, `inspect` draws its token page
and `eval` grades the plug-in benchmark. A second, broken package sits on the same path the whole time (written as a
bare `.dist-info`, the other form an install takes): it is named in one line where a run asks for it, and no other
command notices it."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ..support import REPO


PAGE = REPO / "docs" / "plugins.md"
CLI = Path(sys.executable).parent / "vepo-trl"


def page_files(text: str) -> dict[str, str]:
    """The page's files: a bold `path` line, then its fenced block."""
    return dict(re.findall(r"\*\*`([^`]+)`\*\*\n\n```[a-z]*\n(.*?)```", text, flags=re.DOTALL))


def page_commands(text: str) -> list[str]:
    return [line.strip() for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL) for line in
            block.splitlines() if line.strip()]  # fmt: skip


def broken_package(site: Path) -> None:
    """Two plug-ins of one package, `bad-rule`: one whose module fails to import, one that registers `vepo` again."""
    (site / "bad_rule.py").write_text("import a_module_nobody_has  # noqa: F401\n")
    (site / "taken_rule.py").write_text(
        "from vepo_trl import register_strategy\n\n\n@register_strategy('vepo')\ndef again(signals, mask, *, ratio):\n"
        "    return mask\n"
    )
    info = site / "bad_rule-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: bad-rule\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text(
        "[vepo_trl.strategies]\nbad_rule = bad_rule:rule\nvepo = taken_rule:again\n\n"
        "[vepo_trl.benchmarks]\nbad_bench = bad_rule:Bench\n"
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory, shared_cache):
    work = tmp_path_factory.mktemp("researcher")
    text = PAGE.read_text()
    for path, content in page_files(text).items():
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).write_text(content)
    site = work / "site"
    # The page's `pip install ./my-rule`, into a folder of its own so that the suite's environment stays as it was
    install = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
               "--target", str(site), "./my-rule"]  # fmt: skip
    result = subprocess.run(install, cwd=work, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (
        "confident_visual = my_rule:confident_visual"
        in next(site.glob("my_rule-*.dist-info/entry_points.txt")).read_text()
    )
    broken_package(site)
    env = {**os.environ, "PYTHONPATH": str(site), "VEPO_TRL_CACHE": str(shared_cache), "OMP_NUM_THREADS": "1"}
    return work, env


def run(command: str, work: Path, env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    argv = shlex.split(command)
    assert argv[0] == "vepo-trl", command
    return subprocess.run([str(CLI), *argv[1:]], cwd=work, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_page_holds_the_package_and_the_commands():
    text = PAGE.read_text()
    assert set(page_files(text)) == {"my-rule/pyproject.toml", "my-rule/my_rule/__init__.py"}
    assert len(page_files(text)["my-rule/my_rule/__init__.py"].splitlines()) <= 40  # "about 40 lines"
    commands = page_commands(text)
    assert commands[0] == "pip install ./my-rule"
    for expected in ("vepo-trl strategies", "vepo-trl demo", "vepo-trl lab --quick", "vepo-trl inspect",
                     "vepo-trl eval"):  # fmt: skip
        assert any(c.startswith(expected) for c in commands), expected


@pytest.mark.slow(minutes=3)
def test_the_tutorial_runs_as_written(installed):
    work, env = installed
    commands = [c for c in page_commands(PAGE.read_text()) if not c.startswith("pip install")]
    outputs = {}
    for command in commands:
        result = run(command, work, env)
        assert result.returncode == 0, f"{command}\n{result.stderr[-3000:]}"
        outputs[command.split()[1]] = result.stdout

    listing = outputs["strategies"]
    rule = next(line for line in listing.splitlines() if line.strip().startswith("confident_visual"))
    assert "[perturbed pass]" in rule and "sharpness=2.0" in rule and rule.endswith("(from my-rule)")
    assert re.search(r"^\s+fade\s.*strength=0\.5 \(from my-rule\)$", listing, flags=re.MULTILINE)
    assert re.search(r"^\s+colour_cards\s+Cards \(from my-rule\)$", listing, flags=re.MULTILINE)
    # The broken package: listed, one line per entry point, and the command still exits 0
    broken = [line.strip() for line in listing.splitlines() if line.strip().startswith("broken:")]
    assert len(broken) == 3, broken
    assert any(
        "'bad_rule' (bad-rule: bad_rule = bad_rule:rule) failed to load: ModuleNotFoundError" in b for b in broken
    )
    assert any("'vepo' (bad-rule: vepo = taken_rule:again)" in b and "already registered (by vepo_trl)" in b
               for b in broken)  # fmt: skip
    assert re.search(r"^\s+vepo\s+VEPO:", listing, flags=re.MULTILINE)  # the built-in one stays

    # Trained with the rule and both settings: the run's config and summary say so
    demo = work / "my-rule-demo"
    settings = json.loads((demo / "vepo_run.json").read_text())["settings"]
    assert (settings["strategy_params"], settings["perturbation_params"]) == ({"sharpness": 1.0}, {"strength": 0.8})
    summary = (demo / "summary.md").read_text()
    assert "`confident_visual` (Top-k of JSD times entropy raised to `sharpness`), k = 0.2, sharpness = 1.0" in summary
    assert "`fade`, strength = 0.8" in summary
    assert "(from my-rule)" in summary
    metrics = [json.loads(line) for line in (demo / "metrics.jsonl").read_text().splitlines()]
    assert any("vepo/selected_fraction" in m for m in metrics)

    # The lab compared it with vepo, one run each
    results = {json.loads(p.read_text())["strategy"] for p in (work / "my-rule-lab" / "runs").glob("*/result.json")}
    assert results == {"vepo:0.2", "confident_visual:0.2"}
    assert "confident_visual" in (work / "my-rule-lab" / "lab.md").read_text()
    lab_record = json.loads((work / "my-rule-lab" / "lab.json").read_text())
    assert lab_record["settings"]["strategy_params"] == {"confident_visual": {"sharpness": 1.0}}

    page = (work / "my-rule-page.html").read_text()
    assert "confident_visual" in page and "sharpness" in page

    # The plug-in benchmark was generated and graded: 8 rows, each with a rule verdict
    records = [json.loads(line) for line in (work / "my-rule-eval" / "colour_cards.jsonl").read_text().splitlines()]
    assert len(records) == 8 and {r["gold"] for r in records} == {"red", "green", "blue", "yellow"}
    summary = json.loads((work / "my-rule-eval" / "summary.json").read_text())
    cards = summary["benchmarks"]["colour_cards"]
    assert (cards["examples"], cards["complete"], cards["scored_by"]) == (8, True, "rule")
    assert cards["provenance"]["source"] == "my_rule.ColourCards" and cards["provenance"]["data_sha256"]
    assert all(r["verdicts"]["rule"]["correct"] is False for r in records)  # a random tiny model names no colour


@pytest.mark.parametrize(
    "command, expected",
    [
        (
            "vepo-trl demo --selection_strategy bad_rule --max_steps 1",
            "vepo-trl demo: error: --selection_strategy 'bad_rule': the selection strategy plug-in 'bad_rule' (bad-rule: "
            "bad_rule = bad_rule:rule) failed to load: ModuleNotFoundError: No module named 'a_module_nobody_has'.",
        ),
        (
            "vepo-trl eval --model tiny-qwen2.5-vl --benchmarks bad_bench --protocol rule",
            "vepo-trl eval: error: the benchmark plug-in 'bad_bench' (bad-rule: bad_bench = bad_rule:Bench) failed to "
            "load: ModuleNotFoundError: No module named 'a_module_nobody_has'",
        ),
        (
            "vepo-trl demo --selection_strategy confident_visual --strategy_params '{\"sharp\": 1}'",
            "vepo-trl demo: error: --strategy_params: selection_strategy confident_visual takes no setting 'sharp' (its "
            "settings: sharpness).",
        ),
        (
            "vepo-trl demo --selection_strategy entropy --perturbation_params '{\"strength\": 1}'",
            "vepo-trl demo: error: --perturbation_params is never read: selection_strategy entropy runs no perturbed "
            "pass; remove it.",
        ),
        (
            'vepo-trl lab --quick --strategies vepo,confident_visual --strategy_params \'{"vepo": {"sharp": 1}}\'',
            "vepo-trl lab: error: --strategy_params: selection_strategy vepo takes no setting 'sharp' (its settings: "
            "none).",
        ),
        (
            "vepo-trl demo --perturbation fade --perturbation_params '{\"strenght\": 1}'",
            "vepo-trl demo: error: --perturbation_params: perturbation fade takes no setting 'strenght' (its settings: "
            "strength).",
        ),
    ],
    ids=[
        "broken-strategy",
        "broken-benchmark",
        "unknown-setting",
        "unread-setting",
        "lab-setting",
        "perturbation-setting",
    ],
)
def test_a_bad_plugin_or_setting_is_one_line_where_it_is_used(installed, command, expected):
    work, env = installed
    result = run(command, work, env, timeout=120)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.strip().startswith(expected), result.stderr
    assert not (work / "vepo-demo").exists()  # refused before anything ran
