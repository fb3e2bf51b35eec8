"""TRL's contract in one place: every method of `GRPOTrainer` (or `transformers.Trainer`) that VEPOTrainer's bases
replace is either one of VEPO's own hooks in `trainer.py` or a named patch under `vepo_trl/trl_compat/`, listed in
`trl_compat.PATCHES` with the upstream behaviour it answers, when it goes, and the test that shows it."""

import ast
import importlib
from pathlib import Path

import pytest
from trl import GRPOTrainer

from vepo_trl import VEPOTrainer
from vepo_trl.trl_compat import PATCHES, VEPO_HOOKS, replaced_trl_methods


REPO = Path(__file__).resolve().parents[1]


def test_every_replaced_trl_method_is_a_vepo_hook_or_a_listed_patch():
    listed = {patch.where for patch in PATCHES}
    for where, methods in replaced_trl_methods(VEPOTrainer).items():
        module, _, name = where.partition(":")
        if module == "vepo_trl.trainer":
            assert set(methods) <= VEPO_HOOKS, set(methods) - VEPO_HOOKS
            continue
        assert module.startswith("vepo_trl.trl_compat."), f"{where} replaces {methods} outside trl_compat"
        assert f"{module.removeprefix('vepo_trl.')}:{name}" in listed, f"{where} is not in trl_compat.PATCHES"
        replaces = " ".join(p.replaces for p in PATCHES if p.where == f"{module.removeprefix('vepo_trl.')}:{name}")
        assert all(method in replaces for method in methods), (where, methods, replaces)


def test_no_class_outside_trl_compat_and_the_trainer_defines_a_trl_trainer_method():
    """A mixin written elsewhere (the way the contract spread over 14 modules) fails here, whether or not it is in
    VEPOTrainer's bases yet."""
    trainer_methods = {name for name in dir(GRPOTrainer) if name.startswith("_") and not name.startswith("__")}
    found = []
    for path in sorted((REPO / "vepo_trl").rglob("*.py")):
        if "trl_compat" in path.parts or path.name == "trainer.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                found += [
                    f"{path.relative_to(REPO)}:{node.name}.{item.name}"
                    for item in node.body
                    if isinstance(item, ast.FunctionDef) and item.name in trainer_methods
                ]
    assert found == []


@pytest.mark.parametrize("patch", PATCHES, ids=lambda patch: patch.name)
def test_each_patch_names_a_piece_and_a_test_that_exist(patch):
    module, _, name = patch.where.partition(":")
    assert hasattr(importlib.import_module(f"vepo_trl.{module}"), name), patch.where
    file, _, function = patch.test.partition("::")
    assert f"def {function}(" in (REPO / file).read_text(), patch.test
    assert patch.answers and patch.upstream and patch.until
