"""torch's FSDP2 optimizer load from a full state dict, on two CPU processes (gloo), for one optimizer:

    torchrun --nproc_per_node 2 fsdp2_stateless_optimizer.py {sgd,sgd_momentum,adamw} {full,sharded}

A two-layer model, each layer and the root `fully_shard`ed, one step, the optimizer state taken with
`get_optimizer_state_dict` and loaded into a fresh model and optimizer with `set_optimizer_state_dict`: the path
accelerate takes when it resumes an FSDP2 checkpoint. Prints "loaded" or "failed: <error>" on rank 0; exits 0.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import fully_shard


OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1),
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "adamw": lambda params: torch.optim.AdamW(params, lr=0.1),
}


def sharded_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    for layer in model:
        fully_shard(layer)
    return fully_shard(model)


def main():
    name, kind = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    options = StateDictOptions(full_state_dict=kind == "full")
    model = sharded_model()
    optimizer = OPTIMIZERS[name](model.parameters())
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    saved = get_optimizer_state_dict(model, optimizer, options=options)
    fresh = sharded_model()
    try:
        set_optimizer_state_dict(fresh, OPTIMIZERS[name](fresh.parameters()), saved, options=options)
        outcome = "loaded"
    except Exception as error:  # noqa: BLE001 - the outcome is the report
        outcome = f"failed: {type(error).__name__}: {error}"
    sys.stdout.write(f"rank {dist.get_rank()} {outcome}\n")  # one write: the two ranks' lines never interleave
    sys.stdout.flush()
    if "failed" in outcome:  # the other rank failed too (the error is raised before any collective)
        os._exit(0)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
