"""Two processes on a gloo group with the tiny Qwen2.5-VL sharded by torch's own FSDP (FSDP1 or FSDP2) and TRL's fused
LM head renormalised without the media tokens (`trl_compat.media_tokens.renormalised_without_media`), as VEPOTrainer
installs it under vLLM: each rank scores its own image prompt with the sharded model, forward and backward. Writes
`report.json` into OUTPUT (rank 0): each rank's log-probs and entropies, to compare with the unsharded model's.

    torchrun --nproc_per_node 2 media_ranks.py OUTPUT MODEL_DIR {fsdp1,fsdp2,none}
"""

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForImageTextToText, AutoProcessor
from trl.trainer.utils import add_fused_lm_head


sys.path.insert(0, str(Path(__file__).resolve().parent))
from sharded_ranks import batch, shard  # noqa: E402


TEMPERATURE = 0.9


def score(model, inputs):
    labels = inputs["input_ids"].clone()
    labels[:, :-6] = -100
    out = model(**inputs, labels=labels, fused_lm_head=True)
    (out.log_probs.sum() + out.entropy.sum()).backward()
    mask = out.label_mask
    return out.log_probs[mask].tolist(), out.entropy[mask].tolist()


def main(output: str, model_dir: str, mode: str) -> None:
    from vepo_trl.families import banned_token_ids
    from vepo_trl.trl_compat.media_tokens import renormalised_without_media

    if mode != "none":
        dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank = dist.get_rank() if mode != "none" else int(os.environ.get("VEPO_RANK", "0"))
    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    ids = banned_token_ids(model.config, processor)
    with torch.no_grad():  # a policy drifted toward its media tokens: their mass is much of the distribution
        model.get_output_embeddings().weight[ids] *= 6.0
    add_fused_lm_head(model, temperature=TEMPERATURE, outputs=("log_probs", "entropy"))
    assert renormalised_without_media(model, ids, TEMPERATURE)
    if mode != "none":
        model = shard(model, mode)
    # Both ranks run the vision tower (FSDP1 gathers its blocks in every forward): rank 0 a prompt with its answer,
    # rank 1 the prompt alone
    inputs = batch(processor, with_image=True, answer=rank == 0)
    log_probs, entropies = score(model, inputs)
    report = {"rank": rank, "log_probs": log_probs, "entropies": entropies}
    if mode == "none":
        Path(output, f"report-{rank}.json").write_text(json.dumps(report))
        return
    gathered = [None, None]
    dist.all_gather_object(gathered, report)
    if rank == 0:
        Path(output, "report.json").write_text(json.dumps(gathered))
    # Every rank leaves together: one that ends its process group while the other still runs gloo's threads aborts
    # ("terminate called without an active exception", SIGABRT)
    dist.barrier()
    dist.destroy_process_group()
    # FSDP2's gloo work threads can still be torn down at interpreter exit and abort the process (SIGABRT) after the
    # report is written: leave without that teardown
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(*sys.argv[1:4])
