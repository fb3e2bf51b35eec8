"""The trainer's end of the weight-transfer group (vLLM >= 0.28 API TRL calls: `trainer_init(init_info)`).

vLLM's engine is an NCCL group between the trainer (rank 0) and the server's workers; NCCL needs CUDA. The stand-in
keeps the protocol (the trainer listens at `master_address:master_port`, the server joins while it handles
`/init_weight_transfer_engine`, tensors then stream in the announced order) over one loopback TCP connection.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass


@dataclass
class TransferGroup:
    socket: socket.socket | None
    store: object | None = None  # TRL's `close_communicator` clears `group.store` and `group.socket`


@dataclass
class TrainerEndpoint:
    group: TransferGroup


def trainer_init(init_info: dict, timeout: float = 60.0) -> TrainerEndpoint:
    if init_info.get("world_size") != 2 or init_info.get("rank_offset") != 1:
        raise ValueError(f"the stand-in serves one worker behind the trainer, got {init_info}")
    listener = socket.create_server((init_info["master_address"], init_info["master_port"]))
    listener.settimeout(timeout)
    try:
        connection, _ = listener.accept()
    finally:
        listener.close()
    connection.settimeout(timeout)
    return TrainerEndpoint(TransferGroup(connection))
