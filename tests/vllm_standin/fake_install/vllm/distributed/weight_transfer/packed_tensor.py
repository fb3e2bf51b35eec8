"""`packed_nccl_broadcast_producer`: the trainer streams each tensor's bytes, in the order the metadata announced."""

from __future__ import annotations

import torch


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def packed_nccl_broadcast_producer(iterator, group, src: int = 0, post_iter_func=None, **kwargs) -> None:
    if src != 0:
        raise ValueError("the trainer is rank 0 of the weight-transfer group")
    connection = group.group.socket
    for item in iterator:
        tensor = post_iter_func(item) if post_iter_func is not None else item
        connection.sendall(tensor_bytes(tensor))
