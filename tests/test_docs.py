"""The documentation site (mkdocs.yml, docs/): it builds with `--strict` (no broken link, no missing page, the API
reference collected from the docstrings), every page is in its navigation, and every public name it documents has a
docstring."""

import importlib
import importlib.util
import inspect
import subprocess
import sys

import pytest

from .support import REPO, documentation_pages


# The modules the API reference renders (docs/reference/*.md), and the package's own public names
REFERENCE_MODULES = ["vepo_trl", "vepo_trl.config", "vepo_trl.trainer", "vepo_trl.scoring", "vepo_trl.perturb",
                     "vepo_trl.data", "vepo_trl.rewards"]  # fmt: skip


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="mkdocs is not installed (the docs extra)")
def test_the_site_builds_strict(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO, capture_output=True, text=True, timeout=300, env={"NO_MKDOCS_2_WARNING": "1", "PATH": ""},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    page = (tmp_path / "site" / "reference" / "scoring" / "index.html").read_text()
    assert "token_signals" in page and "register_strategy" in page  # the reference is collected, not empty


def test_every_documentation_page_is_in_the_navigation():
    in_nav = {path.resolve() for path in documentation_pages()}
    pages = {path.resolve() for path in (REPO / "docs").rglob("*.md")}
    assert pages - in_nav == set()
    assert all(path.is_file() for path in in_nav)


def public_names():
    for module_name in REFERENCE_MODULES:
        module = importlib.import_module(module_name)
        names = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
        for name in names:
            obj = getattr(module, name)
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and obj.__module__.startswith("vepo_trl"):
                yield f"{module_name}.{name}", obj


def test_every_public_name_has_a_docstring():
    missing = [name for name, obj in public_names() if not (obj.__doc__ or "").strip()]
    assert len(list(public_names())) > 30
    assert missing == []


def test_the_data_page_lists_the_loaders_columns():
    from vepo_trl.data import loaders

    page = (REPO / "docs" / "python.md").read_text()
    for what, columns in (("the problem", loaders.PROBLEM_COLUMNS), ("the answer", loaders.ANSWER_COLUMNS),
                          ("the images", loaders.IMAGE_COLUMNS), ("an id (optional)", loaders.ID_COLUMNS)):  # fmt: skip
        assert f"- {what}: " + ", ".join(f"`{c}`" for c in columns) + "\n" in page, what
    assert f"{loaders.DEFAULT_MIN_PIXELS:,} and {loaders.DEFAULT_MAX_PIXELS:,}" in page
