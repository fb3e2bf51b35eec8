"""The Colab notebook runs end to end in its tiny mode: a tiny random Qwen2.5-VL and synthetic data on the CPU."""

import os
import re
import sys
from pathlib import Path

import nbclient
import nbformat
import pytest
from ipykernel import kernelspec


NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "vepo_qwen2_5_vl_3b_lora.ipynb"
TINY_SWITCH = "USE_TINY_MODEL = False"
OUTPUT_DIR_LINE = re.compile(r"^OUTPUT_DIR = .*$", re.MULTILINE)
# The kernel must be this interpreter, the one that has vepo_trl installed
KERNEL_CHECK = "import sys\n\nimport vepo_trl\n\n\nprint('kernel python:', sys.executable, vepo_trl.__version__)"


def cell_output(cell) -> str:
    """The text a code cell printed (streams and plain-text results), and its error if it raised."""
    parts = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type in ("execute_result", "display_data"):
            parts.append(output.get("data", {}).get("text/plain", ""))
        elif output.output_type == "error":
            parts.append(f"{output.ename}: {output.evalue}")
    return "".join(parts)


def code_cell(nb, marker: str):
    cells = [cell for cell in nb.cells if cell.cell_type == "code" and marker in cell.source]
    assert len(cells) == 1, f"expected one code cell containing {marker!r}, found {len(cells)}"
    return cells[0]


@pytest.mark.slow
def test_notebook_runs_in_tiny_mode(tmp_path, monkeypatch):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert all(
        not cell.get("outputs") and cell.get("execution_count") is None
        for cell in nb.cells
        if cell.cell_type == "code"
    ), "the saved notebook must have no outputs"

    switches = next(cell for cell in nb.cells if cell.cell_type == "code")
    assert re.search(rf"^{TINY_SWITCH}", switches.source, re.MULTILINE), "the first code cell must hold the switches"
    output_dir = tmp_path / "run"
    switches.source = re.sub(rf"^{TINY_SWITCH}", "USE_TINY_MODEL = True", switches.source, flags=re.MULTILINE)
    assert OUTPUT_DIR_LINE.search(switches.source), "the first code cell must set OUTPUT_DIR"
    switches.source = OUTPUT_DIR_LINE.sub(f"OUTPUT_DIR = {str(output_dir)!r}", switches.source)
    nb.cells.insert(0, nbformat.v4.new_code_cell(KERNEL_CHECK))

    # A python3 kernelspec of our own, first on the search path: jupyter_client runs "python" as sys.executable
    kernelspec.install(prefix=str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter" / "share" / "jupyter"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("VEPO_TRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    # One intra-op thread: on shared, busy cores two spinning OpenMP threads slow the tiny run down many times over
    monkeypatch.setenv("OMP_NUM_THREADS", "1")

    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as error:
        pytest.fail(f"a notebook cell raised:\n{error}")

    kernel_python = cell_output(nb.cells[0])
    assert "kernel python:" in kernel_python
    assert os.path.realpath(kernel_python.split()[2]) == os.path.realpath(sys.executable)
    for cell in nb.cells:
        assert not any(output.output_type == "error" for output in cell.get("outputs", [])), cell.source

    assert "vepo/selected_fraction" in cell_output(code_cell(nb, "main(script_args, training_args, model_args)"))
    evaluation = cell_output(code_cell(nb, "evaluate("))
    assert re.search(r"\d+ rows: accuracy \d\.\d{3}, format \d\.\d{3}", evaluation), evaluation
    assert "Pushing skipped" in cell_output(code_cell(nb, "push_to_hub("))

    assert (output_dir / "config.json").is_file()
    for name in ("processor_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (output_dir / name).is_file(), f"{name} missing from the output directory"
    card = (output_dir / "README.md").read_text()
    assert "@misc{jin2026vepo" in card and "Entropy Is Not Enough" in card
    assert "hf_" not in card, "the model card must not contain anything token-like"


def install_cell_namespace(monkeypatch, importable: bool):
    """Run the install cell's definitions (not its pip call) with vepo_trl importable or not."""
    import importlib.util

    nb = nbformat.read(NOTEBOOK, as_version=4)
    source = code_cell(nb, "VEPO_TRL_SOURCE =").source
    definitions = source[: source.index("command = install_command(")]
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: (
            (real_find_spec(name, *a) if importable else None) if name == "vepo_trl" else real_find_spec(name, *a)
        ),
    )
    namespace = {}
    exec(definitions, namespace)
    return namespace


def test_install_cell_installs_from_the_clone_or_a_given_source(monkeypatch):
    # It used to run `%pip install vepo-trl`, which is not on PyPI
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert "%pip install -q vepo-trl" not in code_cell(nb, "VEPO_TRL_SOURCE =").source
    repo = NOTEBOOK.parent.parent
    installed = install_cell_namespace(monkeypatch, importable=True)
    assert installed["install_command"](None, here=NOTEBOOK.parent) is None
    fresh = install_cell_namespace(monkeypatch, importable=False)
    assert fresh["install_command"](None, here=NOTEBOOK.parent)[-1] == str(repo)
    wheel = "/content/vepo_trl-0.1.0-py3-none-any.whl"
    assert fresh["install_command"](wheel, here=Path("/"))[-4:] == ["pip", "install", "-q", wheel]
    with pytest.raises(RuntimeError, match="set VEPO_TRL_SOURCE"):
        fresh["install_command"](None, here=Path("/"))
