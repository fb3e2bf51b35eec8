"""A vLLM stand-in for tests: TRL's `use_vllm=True` paths (colocate and server) on the CPU.

`fake_install/` is laid out like an installed vLLM (the `vllm` package and its dist-info): `installed()` puts it on
`sys.path` and re-runs the imports TRL makes only when vLLM is installed, as a process with vLLM would have made them.
It generates with the tiny checkpoint through transformers (real sampling, per-token processed log-probs), takes weight
syncs (colocate: `load_weights`; server: the transfer group) and sleep / wake-up calls.

Stood in beyond the package itself: TRL's `VLLMClient.init_communicator` refuses a non-CUDA device before it opens the
(NCCL) weight-transfer group. `installed()` hands it the unindexed device "cuda" (TRL then places nothing on it), and
the stand-in's group is a loopback TCP connection; everything else TRL runs as it would against vLLM.
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
from contextlib import contextmanager
from pathlib import Path


FAKE_INSTALL = str(Path(__file__).parent / "fake_install")
# TRL modules that import from vllm at import time, when it is installed (client before generation, which imports it)
TRL_MODULES = ("trl.generation.vllm_client", "trl.generation.vllm_generation")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def installed():
    """The stand-in as the installed vLLM while the block runs; TRL's modules and the environment restored after."""
    modules = [importlib.import_module(name) for name in TRL_MODULES]
    saved = [dict(module.__dict__) for module in modules]
    environ = dict(os.environ)  # colocate mode sets RANK / WORLD_SIZE / MASTER_PORT for vLLM
    # A port of this process's own: with RANK and WORLD_SIZE set, every later config in the block starts a process
    # group, and two pytest-xdist workers on one default port fail with EADDRINUSE
    os.environ["MASTER_PORT"] = str(free_port())
    sys.path.insert(0, FAKE_INSTALL)
    importlib.invalidate_caches()
    try:
        for module in modules:
            importlib.reload(module)
        client = sys.modules["trl.generation.vllm_client"]
        assert client._HAS_STATEFUL_TRAINER_ENGINE, "the stand-in should be seen as vLLM 0.30"
        init_communicator = client.VLLMClient.init_communicator

        def init_communicator_on_cpu(self, device=0):
            return init_communicator(self, device="cuda")

        client.VLLMClient.init_communicator = init_communicator_on_cpu
        yield
    finally:
        sys.path.remove(FAKE_INSTALL)
        for name in [name for name in sys.modules if name == "vllm" or name.startswith("vllm.")]:
            del sys.modules[name]
        importlib.invalidate_caches()
        for module, namespace in zip(modules, saved):
            module.__dict__.clear()
            module.__dict__.update(namespace)
        os.environ.clear()
        os.environ.update(environ)


@contextmanager
def server(model: str):
    """The stand-in's HTTP server on 127.0.0.1 (a free port), serving `model`; needs `installed()`."""
    from vllm._standin_server import StandinServer

    with StandinServer(model) as running:
        yield running
