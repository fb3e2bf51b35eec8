"""Two processes on a gloo group with the tiny Qwen2.5-VL sharded by torch's own FSDP (FSDP1 or FSDP2): rank 0 trains
on text-only prompts, rank 1 on prompts with an image, three forward + backward + SGD steps, with or without VEPO's
`VisionTowerAlignment`. Then the LM head's signals are computed from the sharded head (`sharding.full_lm_head`) and
compared with the unsharded model's. Writes `report.json` into OUTPUT (rank 0).

    torchrun --nproc_per_node 2 sharded_ranks.py OUTPUT MODEL_DIR {fsdp1,fsdp2} {align,no_align}
"""

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor


def batch(processor, with_image: bool, answer: bool = True):
    if with_image:
        content = [{"type": "image"}, {"type": "text", "text": "How many circles?"}]
        images = [Image.new("RGB", (56, 84), (200, 30, 30))]
    else:
        content = [{"type": "text", "text": "What is two plus two?"}]
        images = None
    messages = [{"role": "user", "content": content}]
    if answer:
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "four"}]})
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=not answer)
    return dict(processor(images=images, text=[text], return_tensors="pt"))


def shard(model, mode):
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLDecoderLayer, Qwen2_5_VLVisionBlock

    layers = (Qwen2_5_VLDecoderLayer, Qwen2_5_VLVisionBlock)
    if mode == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        return FullyShardedDataParallel(
            model, auto_wrap_policy=ModuleWrapPolicy(set(layers)), use_orig_params=True, device_id=torch.device("cpu")
        )
    from torch.distributed.fsdp import fully_shard

    for module in model.modules():
        if isinstance(module, layers):
            fully_shard(module)
    fully_shard(model)
    return model


def base_model(sharded, mode):
    return sharded.module if mode == "fsdp1" else sharded


def generation_context(sharded, mode):
    from contextlib import nullcontext

    if mode != "fsdp1":
        return nullcontext()
    from torch.distributed.fsdp import FullyShardedDataParallel

    return FullyShardedDataParallel.summon_full_params(sharded, recurse=False, writeback=False)


def full_state(model, mode):
    """Every parameter in full, as one flat float64 vector (a collective)."""
    if mode == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel

        with FullyShardedDataParallel.summon_full_params(model, writeback=False):
            return torch.cat([p.detach().double().flatten() for p in model.parameters()])
    return torch.cat(
        [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().double().flatten() for p in model.parameters()]
    )


def main(output, model_dir, mode, align):
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(0)
    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    reference_head = model.lm_head.weight.detach().clone()
    alignment = None
    if align == "align":
        from vepo_trl.sharding import VisionTowerAlignment

        alignment = VisionTowerAlignment.for_model(model, processor)
    sharded = shard(model, mode)
    # The LM head read outside a forward, as the signal pass reads it, against the unsharded model's head
    from vepo_trl.scoring import token_signals
    from vepo_trl.sharding import full_lm_head

    base = sharded.module if mode == "fsdp1" else sharded
    head = base.get_output_embeddings()
    hidden = torch.randn(5, reference_head.shape[1], generator=torch.Generator().manual_seed(1))
    reference = token_signals(hidden, hidden + 0.1, reference_head, None, signals={"entropy", "jsd"})
    outside_shape = list(head.weight.shape)  # FSDP1: a flat 1-D slice of the local shard
    try:  # what the signal pass met before `full_lm_head`
        token_signals(hidden, hidden + 0.1, head.weight, head.bias, signals={"entropy", "jsd"})
        outside_error = None
    except RuntimeError as error:
        outside_error = str(error).splitlines()[0]
    with full_lm_head(sharded, head):
        signals = token_signals(hidden, hidden + 0.1, head.weight, head.bias, signals={"entropy", "jsd"})
    head_errors = [
        float((signals.entropy - reference.entropy).abs().max()),
        float((signals.jsd - reference.jsd).abs().max()),
    ]

    initial = full_state(sharded, mode)
    optimizer = torch.optim.SGD(sharded.parameters(), lr=0.1)
    inputs = batch(processor, with_image=rank == 1)
    for _ in range(3):
        optimizer.zero_grad()
        logits = sharded(**inputs, use_cache=False).logits
        logits.float().logsumexp(-1).mean().backward()
        optimizer.step()
    # A forward where no process has an image (a decode step, a text-only batch everywhere): no dummy is needed
    with torch.no_grad():
        sharded(**batch(processor, with_image=False), use_cache=False)
    trained_dummies = alignment.dummy_forwards if alignment is not None else None
    # A rollout by transformers generation, as TRL runs it (FSDP1: the root unit gathered, the units inside gather as
    # they run): transformers encodes the image before the prefill, outside the forward
    prompt = batch(processor, with_image=rank == 1, answer=False)
    with torch.no_grad(), generation_context(sharded, mode):
        base_model(sharded, mode).generate(**prompt, max_new_tokens=3, do_sample=False, synced_gpus=True)
    state = full_state(sharded, mode)
    states = [torch.zeros_like(state) for _ in range(2)]
    dist.all_gather(states, state)

    report = {
        "same_weights": bool(torch.equal(states[0], states[1])),
        "head_shape_outside_forward": outside_shape,
        "error_without_gather": outside_error,
        "entropy_error": head_errors[0],
        "jsd_error": head_errors[1],
        "trained": bool(not torch.equal(state, initial)),
        "dummy_forwards": trained_dummies,
        "dummy_forwards_with_generation": alignment.dummy_forwards if alignment is not None else None,
    }
    reports = [None, None]
    dist.all_gather_object(reports, report)
    if rank == 0:
        Path(output).mkdir(parents=True, exist_ok=True)
        (Path(output) / "report.json").write_text(json.dumps(reports))
    dist.barrier()
    # Every collective of the run is done and the report written. torch's FSDP2 on gloo sometimes aborts while tearing
    # the process group down ("terminate called without an active exception", 1 run in 8 here, after the report):
    # leave without that teardown, so the exit status is the run's
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(*sys.argv[1:])
