"""The documentation's code runs as written (the README, then the site's pages: `support.documentation`): its Python
example trains on a CPU offline, its claims match the code."""

import re

import pytest

from ..support import REPO, documentation


README = documentation()


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)


def test_python_example_runs_as_written_on_a_cpu(tmp_path, monkeypatch):
    # As a newcomer runs it: from a fresh folder, no GPU, no Hub. The tiny model goes to a test cache, not ~/.cache
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VEPO_TRL_CACHE", str(tmp_path / "cache"))
    blocks = python_blocks()
    assert len(blocks) >= 2
    namespace = {}
    exec(compile(blocks[0], "docs[python 1]", "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 3 and trainer.args.bf16 is False
    assert (tmp_path / "tiny-vepo").is_dir()


def test_paper_swap_block_names_real_objects(monkeypatch):
    # The second block swaps in the Hub model and data; loading Geometry3K needs the Hub, so only that call is faked
    import vepo_trl.data

    calls = []
    monkeypatch.setattr(vepo_trl.data, "load_vepo_dataset", lambda *args, **kwargs: calls.append(args))
    namespace = {}
    exec("from vepo_trl.rewards import get_reward_funcs\n", namespace)
    exec(compile(python_blocks()[1], "docs[python 2]", "exec"), namespace)
    assert calls == [("geometry3k", "train")] and len(namespace["reward_funcs"]) == 2


def test_time_claims_are_the_measured_ones():
    # "about 20 s", "about a minute" and the measured 35 s used to disagree across README, help and recipe
    import vepo_trl.cli

    for text in (README, vepo_trl.cli.__doc__, (REPO / "recipes" / "tiny" / "config_vepo.yaml").read_text()):
        assert "about a minute" not in text and "about 20 s" not in text
    assert "35 s" in README and "35 s" in vepo_trl.cli.__doc__
    assert "VEPO_TRL_CACHE" in README and "~/.cache/vepo_trl" in README


@pytest.mark.parametrize("name", ["gaussian_release", "vllm_importance_sampling_correction", "4247308"])
def test_paper_vs_release_table_covers_the_measured_differences(name):
    table = README[README.index("## Where the paper and the authors' code differ") :]
    assert name in table


def test_release_metadata_is_single_sourced():
    import configparser

    import vepo_trl

    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    assert setup["metadata"]["version"] == "attr: vepo_trl.__version__"
    assert f"## [{vepo_trl.__version__}]" in (REPO / "CHANGELOG.md").read_text()


def test_ci_runs_the_readme_test_command_and_the_wheel_demo():
    ci = (REPO / ".ci" / "run").read_text()
    assert 'python3 -m pip install -e ".[dev]" && python3 -m pytest -n 2' in ci
    assert "python3 -m build" in ci and "dist/vepo_trl-*.whl" in ci and 'vepo-trl" demo' in ci


def test_readme_figures_script_finds_every_figure_it_checks():
    # benchmarks/readme_figures.py reruns these figures; a README edit that moves one must move its pattern too
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_figures", REPO / "benchmarks" / "readme_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, (pattern, _, _) in module.FIGURES.items():
        assert module.locate(pattern, README), name


def test_the_readme_is_a_front_page_whose_links_lead_somewhere():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert len(links) >= 10
    for link in links:
        assert (REPO / link).is_file(), link
