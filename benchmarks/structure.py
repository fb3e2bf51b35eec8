"""Figures of the package's structure, read from the source (nothing is imported or run):

- imports between folders: `from`/`import` statements in a module of one folder naming a module of another
  (`vepo_trl/` itself counts as a folder), and how many of them go to each folder;
- lines of the model-family modules (`vepo_trl/families/`);
- TRL's contract: the `GRPOTrainer` methods VEPOTrainer's bases replace, in `vepo_trl/trl_compat/` and outside it
  (VEPO's own hooks in `trainer.py` aside);
- test helpers defined twice: module-level functions and fixtures of the same name in more than one test file;
- test modules importing another test module.

    python benchmarks/structure.py
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "vepo_trl"


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> list[str]:
    """The vepo_trl modules a file imports (relative imports resolved)."""
    tree = ast.parse(path.read_text())
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(max(node.level - 1, 0)):
                base = base.rpartition(".")[0]
            target = (f"{base}.{node.module}" if node.module else base) if node.level else node.module or ""
            found.append(target)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return [name for name in found if name == "vepo_trl" or name.startswith("vepo_trl.")]


def folder_of(module: str) -> str:
    """The folder a module lives in: `vepo_trl.eval.run` -> vepo_trl/eval; a package's own `__init__` counts in it."""
    path = REPO.joinpath(*module.split("."))
    return str((path if path.is_dir() else path.parent).relative_to(REPO))


def main() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    crossing = collections.Counter()
    for path in files:
        here = folder_of(module_name(path))
        for target in imports_of(path):
            there = folder_of(target)
            if there != here:
                crossing[(here, there)] += 1
    print(f"imports between folders: {sum(crossing.values())}")
    for (here, there), n in sorted(crossing.items()):
        print(f"  {here:<24} -> {there:<24} {n}")

    family_lines = sum(len(p.read_text().splitlines()) for p in (PACKAGE / "families").glob("*.py"))
    print(f"lines of the family modules: {family_lines}")

    # TRL's contract: the GRPOTrainer methods VEPOTrainer's bases replace, outside trl_compat/ and VEPO's own hooks
    from vepo_trl import VEPOTrainer
    from vepo_trl.trl_compat import VEPO_HOOKS, replaced_trl_methods

    outside, inside = [], []
    for where, methods in replaced_trl_methods(VEPOTrainer).items():
        for name in methods:
            if where.startswith("vepo_trl.trl_compat"):
                inside.append(f"{where}.{name}")
            elif not (where == "vepo_trl.trainer:VEPOTrainer" and name in VEPO_HOOKS):
                outside.append(f"{where}.{name}")
    print(
        f"TRL methods replaced in vepo_trl/trl_compat/: {len(inside)}; outside it (VEPO's own hooks aside): "
        f"{len(outside)}"
    )
    for name in outside:
        print(f"  {name}")

    defined = collections.defaultdict(set)
    test_imports = []
    # The test modules (the unit tests, and the end-to-end suites under tests/e2e/) and their support (the rank
    # scripts under tests/distributed/ and the stand-in servers are programs of their own, run as processes)
    for path in sorted([*(REPO / "tests").glob("*.py"), *(REPO / "tests" / "e2e").glob("*.py")]):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("test_"):
                defined[node.name].add(path.name)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (
                (node.level and (node.module or "").startswith("test_"))
                or (node.level and any(a.name.startswith("test_") for a in node.names))
                or (node.module or "").startswith(("tests.test_", "tests.e2e.test_"))
                or (node.level and (node.module or "").startswith("e2e"))
            ):
                test_imports.append(f"{path.name} <- {node.module or [a.name for a in node.names]}")
    twice = {name: sorted(where) for name, where in defined.items() if len(where) > 1}
    print(f"test helpers defined in more than one test file: {len(twice)}")
    for name, where in sorted(twice.items()):
        print(f"  {name}: {', '.join(where)}")
    print(f"test modules importing another test module: {len(test_imports)}")
    for line in test_imports:
        print(f"  {line}")


if __name__ == "__main__":
    main()
