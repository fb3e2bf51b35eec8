"""Shared fixtures: tiny models built once per test run, synthetic visual rows in TRL's format, offline mode."""

import os
import shutil
from pathlib import Path


# No test may touch the network: the hub stays unreachable even where it is not
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
# The tiny model's matrices are far too small to gain from intra-op threads; on shared cores threads only contend.
# Subprocesses (accelerate launch, the notebook kernel) inherit the variable.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from vepo_trl.builtin.tiny_models import DEFAULT_FAMILY, TINY_MARKER, tiny_model_path  # noqa: E402


torch.set_num_threads(1)


@pytest.fixture
def nothing_loads(monkeypatch, tmp_path_factory):
    """`vepo-trl train` fails the test if it gets as far as loading a model or a data set (its input checks come
    first); the run's cache folder."""
    import vepo_trl.train as train_module
    from tests.support import run_cache

    monkeypatch.setenv("VEPO_TRL_CACHE", str(run_cache(tmp_path_factory)))

    def refuse(*args, **kwargs):
        raise AssertionError("a model or data set was loaded before the input was checked")

    monkeypatch.setattr(train_module, "load_model", refuse)
    monkeypatch.setattr(train_module, "load_dataset_split", refuse)


@pytest.fixture
def no_model_loads(monkeypatch):
    """`vepo-trl train` fails the test if it gets as far as loading a model (the data set may load: its rows are
    checked there)."""
    import vepo_trl.train as train_module

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(train_module, "load_model", refuse)


@pytest.fixture
def model_card_left_as_it_was(tiny_model_dir):
    """`vepo-trl eval` writes complete results into the model folder's card: the session's shared tiny model keeps
    none between tests (tests/e2e/test_hub_push.py checks the card itself)."""
    from pathlib import Path

    card = Path(tiny_model_dir) / "README.md"
    before = card.read_bytes() if card.exists() else None
    yield
    if before is None:
        card.unlink(missing_ok=True)
    else:
        card.write_bytes(before)


@pytest.fixture
def openai_server():
    """An OpenAI-compatible judge on 127.0.0.1 (`support.FakeOpenAI`), closed after the test."""
    from tests.support import FakeOpenAI

    fake = FakeOpenAI()
    yield fake
    fake.close()


def _tiny_folder(tmp_path_factory, family: str, where: Path) -> str:
    """`family`'s tiny model (model + processor) built once per test run (the run's folder, shared by the xdist
    workers) and copied into `where`, this worker's own: a test may write into it (an evaluation's model card)."""
    from tests.support import run_cache

    # The folder `--model_name_or_path tiny-<family>` resolves to in the run's VEPO_TRL_CACHE: one build serves both
    built = tiny_model_path(run_cache(tmp_path_factory), family=family)
    shutil.copytree(built, where, ignore=shutil.ignore_patterns(TINY_MARKER))
    return str(where)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A saved tiny Qwen2.5-VL (model + processor), loadable with `from_pretrained` like a Hub id."""
    return _tiny_folder(tmp_path_factory, DEFAULT_FAMILY, tmp_path_factory.mktemp("tiny") / "tiny-qwen2.5-vl")


class _TinyFolders(dict):
    """family -> its tiny model's folder, made on first use and kept for the session."""

    def __init__(self, tmp_path_factory):
        super().__init__()
        self.factory = tmp_path_factory
        self.root = tmp_path_factory.mktemp("tiny-families")

    def __missing__(self, family):
        self[family] = _tiny_folder(self.factory, family, self.root / family)
        return self[family]


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory, tiny_model_dir):
    """Every family's tiny model (model + processor), on first use: `tiny_dirs[family]`."""
    folders = _TinyFolders(tmp_path_factory)
    folders[DEFAULT_FAMILY] = tiny_model_dir
    return folders


@pytest.fixture(scope="session")
def visual_dataset():
    """Sixteen synthetic visual-reasoning rows in TRL's conversational VLM format."""
    from vepo_trl.data import synthetic_training_dataset

    return synthetic_training_dataset(16, seed=0)


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory):
    """One `VEPO_TRL_CACHE` for the tests that build the tiny model or the lab's warm start through the CLI: each is
    built once per test run (all workers share it), as a user's cache would hold it."""
    from tests.support import run_cache

    return run_cache(tmp_path_factory)


@pytest.fixture
def standins_as_full_splits(monkeypatch):
    """Count the few stand-in rows as the whole split the paper evaluated, so a test can reach the complete-result
    paths (averages); without it a run on stand-ins is partial, as any truncated copy is."""
    from vepo_trl.eval.benchmarks import BENCHMARKS

    for bench in BENCHMARKS.values():
        monkeypatch.setattr(bench, "paper_rows", None)


def pytest_collection_modifyitems(config, items):
    """The longest end-to-end runs first (`@pytest.mark.slow(minutes=N)`: about N minutes on one core), longest
    first. pytest-xdist's load scheduling hands the first tests out to each worker in turn, so they start at once on
    different workers instead of one worker ending the suite minutes after the other. The rest keep their order."""

    def minutes(item):
        marker = item.get_closest_marker("slow")
        return 0 if marker is None else marker.kwargs.get("minutes", 0)

    items.sort(key=minutes, reverse=True)  # stable
