"""docs/ARCHITECTURE.md's layer table against the package's real import graph (imports inside functions included):
every module listed once, no import of a higher layer, no cycle; and the size limits of the trainer and its classes."""

import ast
import re
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vepo_trl"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_script_entry(node: ast.stmt) -> bool:
    """`if __name__ == "__main__":`, a module's entry when run as a script (checked on its own below)."""
    return (
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id == "__name__"
    )


def import_graph(*, script_entries: bool = False) -> dict[str, set[str]]:
    """module -> the package's modules it imports (relative or absolute, at any depth of the file). A module's
    script entry (`if __name__ == "__main__":`) is the command line's, on top of every layer: it is left out, or
    (`script_entries`) it is all that is read."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        edges = set()
        tree = ast.parse(path.read_text())
        tree.body = [node for node in tree.body if _is_script_entry(node) == script_entries]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                candidates = [target] + [f"{target}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            else:
                continue
            edges |= {c for c in candidates if c in modules and c != name}
        graph[name] = edges
    return graph


def documented_layers() -> dict[str, int]:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    block = re.search(r"```layers\n(.*?)```", text, re.S)
    assert block, "docs/ARCHITECTURE.md has no ```layers block"
    layers: dict[str, int] = {}
    every: dict[str, int] = {}  # `package.*`: each of its modules listed nowhere else (a family is one new module)
    for line in block.group(1).splitlines():
        match = re.match(r"layer (\d+)\s+(.*)", line.strip())
        assert match, f"unreadable line in the layers block: {line!r}"
        for module in match.group(2).split():
            assert module not in layers and module not in every, f"{module} is listed twice in docs/ARCHITECTURE.md"
            if module.endswith(".*"):
                every[module[:-2]] = int(match.group(1))
            else:
                layers[module] = int(match.group(1))
    for package, layer in every.items():
        modules = [module_name(path) for path in (PACKAGE.parent / package.replace(".", "/")).glob("*.py")]
        assert modules, f"docs/ARCHITECTURE.md: {package}.* matches no module"
        layers.update({module: layer for module in modules if module not in layers and module != package})
    return layers


def test_a_module_run_as_a_script_goes_through_the_command_line():
    """`accelerate launch vepo_trl/train.py` or `python -m vepo_trl.eval.run` is the same command as `vepo-trl train` /
    `vepo-trl eval`: its script entry calls the CLI's one door (its checks, outputs, error lines), nothing else."""
    entries = {name: edges for name, edges in import_graph(script_entries=True).items() if edges}
    assert set(entries) >= {"vepo_trl.train", "vepo_trl.eval.run"}
    assert all(edges == {"vepo_trl.cli"} for name, edges in entries.items() if name != "vepo_trl.cli"), entries


def test_every_module_is_in_the_documented_layers():
    graph, layers = import_graph(), documented_layers()
    assert set(graph) - set(layers) == set(), "modules missing from docs/ARCHITECTURE.md's layers"
    assert set(layers) - set(graph) == set(), "docs/ARCHITECTURE.md lists modules that do not exist"


def test_no_module_imports_a_higher_layer():
    graph, layers = import_graph(), documented_layers()
    upward = [
        f"{module} (layer {layers[module]}) imports {target} (layer {layers[target]})"
        for module, targets in graph.items()
        for target in targets
        if layers[target] > layers[module]
    ]
    assert upward == []


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_import_graph_has_no_cycle():
    assert find_cycle(import_graph()) is None


def test_the_cycle_finder_finds_one():
    # The check above can fail: a two-module loop and a three-module loop are found
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


def test_no_circular_import_between_train_and_trainer():
    graph = import_graph()
    assert "vepo_trl.train" not in graph["vepo_trl.trainer"]


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_class_is_over_300_lines(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            assert node.end_lineno - node.lineno + 1 <= 300, f"{node.name} in {path.name} is over 300 lines"


def test_the_trainer_is_wiring():
    assert len((PACKAGE / "trainer.py").read_text().splitlines()) < 300


# Test modules about the repository rather than one module of the package
REPOSITORY_TESTS = {"architecture", "docs", "benchmarks", "recipes"}


def module_under_test(test_file: Path) -> str | None:
    """The package module (or repository part) a unit-test file is named after: `test_<module path>[_<aspect>].py`,
    the longest module path that prefixes the name; None when no module does."""
    name = test_file.stem.removeprefix("test_")
    modules = {module_name(path).removeprefix("vepo_trl.").replace(".", "_") for path in PACKAGE.rglob("*.py")}
    candidates = [m for m in modules | REPOSITORY_TESTS if name == m or name.startswith(m + "_")]
    return max(candidates, key=len, default=None)


def test_every_unit_test_file_is_named_after_what_it_tests():
    """A reader finds a module's tests by its name (end-to-end suites, which cross modules, live in tests/e2e/)."""
    unnamed = [path.name for path in sorted((ROOT / "tests").glob("test_*.py")) if module_under_test(path) is None]
    assert unnamed == []


def test_the_test_name_rule_finds_the_module():
    assert module_under_test(Path("test_trl_compat_checkpoint.py")) == "trl_compat_checkpoint"
    assert module_under_test(Path("test_trainer_loss.py")) == "trainer"
    assert module_under_test(Path("test_loss_semantics.py")) is None


def test_no_private_name_is_imported_from_another_folder():
    # A folder's private names are its own: a command reads the insight library, the eval code the data loaders,
    # through what they export (`vepo-trl inspect` once imported 18 private helpers of insight/)
    crossings = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level):
                continue
            base = path.parent
            for _ in range(node.level - 1):
                base = base.parent
            target = base.joinpath(*node.module.split(".")) if node.module else base
            folder = target if target.is_dir() else target.parent
            crossings += [
                f"{path.relative_to(ROOT)}: {node.module}.{alias.name}"
                for alias in node.names
                if folder != path.parent and alias.name.startswith("_") and not alias.name.startswith("__")
            ]
    assert crossings == []
