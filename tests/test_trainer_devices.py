"""Tensors vepo_trl creates live on the device of the tensors they meet. The CPU suite cannot see a CUDA mismatch
(an index built on the CPU and used on a CUDA tensor crashed the first GPU step), so this audits the source: every
torch factory call names its `device=`, or carries a `# cpu:` comment saying why the CPU is right there (a value that
is read back with `.tolist()` / `int()`, a generator whose draws must not depend on the device)."""

import ast
from pathlib import Path

import pytest


PACKAGE = Path(__file__).resolve().parents[1] / "vepo_trl"
FACTORIES = {
    "tensor", "as_tensor", "arange", "zeros", "ones", "full", "empty", "rand", "randn", "randint", "randperm",
    "linspace", "eye", "Generator",
}  # fmt: skip


def factory_calls_without_device(source: str):
    tree = ast.parse(source)
    lines = source.splitlines()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        if node.func.attr not in FACTORIES or not isinstance(node.func.value, ast.Name):
            continue
        if node.func.value.id != "torch":
            continue
        if any(keyword.arg == "device" for keyword in node.keywords):
            continue
        # The reason may sit on the call's lines or on the line just above it
        span = lines[max(node.lineno - 2, 0) : (node.end_lineno or node.lineno) + 1]
        if any("# cpu:" in line for line in span):
            continue
        yield node.lineno, lines[node.lineno - 1].strip()


def test_audit_catches_a_cpu_index():
    bad = "import torch\nindex = torch.tensor(counts, dtype=torch.long)\n"
    good = "import torch\nindex = torch.tensor(counts, dtype=torch.long, device=x.device)\n"
    allowed = "import torch\nseeds = torch.tensor(seeds)  # cpu: read back with tolist()\n"
    assert list(factory_calls_without_device(bad)) == [(2, "index = torch.tensor(counts, dtype=torch.long)")]
    assert not list(factory_calls_without_device(good)) and not list(factory_calls_without_device(allowed))


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_factory_call_names_its_device(path):
    offenders = list(factory_calls_without_device(path.read_text()))
    assert not offenders, f"{path.name}: torch factory calls without device= (or a '# cpu:' reason): {offenders}"
