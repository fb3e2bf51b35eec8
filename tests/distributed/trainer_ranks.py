"""`VEPOTrainer` end to end under DDP, FSDP1, FSDP2, DeepSpeed ZeRO-2 or ZeRO-3 on two CPU processes (gloo), or on
one process for the reference. Run by tests/test_sharding.py with `torch.distributed.run`.

accelerate never gives FSDP or DeepSpeed to a CPU run; the few lines of `force_sharding` make it take the same code
paths a GPU run takes (the accelerator's FSDP / DeepSpeed `prepare`, TRL's gathers around generation and the
reference model, VEPO's sharded LM-head read and vision-tower alignment):

- FSDP: accelerate builds its state as MULTI_CPU and drops the plugin; the state is set to FSDP right after it is
  built. FSDP1's `sync_module_states` broadcasts from a CUDA device, so it is off (every process loads the same
  checkpoint anyway).
- DeepSpeed: accelerate hands DeepSpeed to an accelerator run only (not `use_cpu`); DeepSpeed's own CPU accelerator
  then runs it on gloo.

The data put text-only prompts on process 0 and prompts with one or two images of different sizes on process 1
(`shuffle_dataset=False`, one generation per two optimiser steps with `num_iterations=2`, so TRL's rollout-time
forward carries the scoring), gradient accumulation 2. Completions are fixed from the prompt (after the real
generation ran, so its gathers happen), and the optimiser is SGD: the two-process run must end on the one-process
run's weights. Each VEPO scoring call runs whole sequences beside the shared pass (`compare_passes`); the report
holds the largest difference and each process's forwards per scoring chunk. Writes `report.json` (rank 0) and, on
one process, `weights.pt`.

    torchrun --nproc_per_node {1,2} trainer_ranks.py OUTPUT MODEL_DIR {single,ddp,fsdp1,fsdp2,zero2,zero3} [vepo|grpo]
"""

import hashlib
import json
import os
import sys
from pathlib import Path

import torch


LAYERS = "Qwen2_5_VLDecoderLayer,Qwen2_5_VLVisionBlock"


def wrapped_layers(model_dir: str | None) -> list[str]:
    """The blocks FSDP wraps: the tiny Qwen2.5-VL's decoder and vision blocks; another family's model its own
    `_no_split_modules` that it holds (some name classes the model never builds), read off a meta-device copy."""
    if model_dir is None:
        return LAYERS.split(",")
    from transformers import AutoConfig, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(model_dir)
    if config.model_type == "qwen2_5_vl":
        return LAYERS.split(",")
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    present = {type(module).__name__ for module in model.modules()}
    return [name for name in model._no_split_modules if name in present]


def force_sharding(mode: str, model_dir: str | None = None) -> dict:
    """Test-only set-up for a CPU run of `mode`; returns the `VEPOConfig` settings that select it."""
    if mode in ("fsdp1", "fsdp2"):
        from accelerate.state import AcceleratorState, PartialState
        from accelerate.utils import DistributedType

        original = AcceleratorState.__init__

        def init(self, *args, fsdp_plugin=None, **kwargs):
            original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
            if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
                # Also in PartialState's shared state, which every later AcceleratorState() copies over its own
                PartialState._shared_state["distributed_type"] = self.distributed_type = DistributedType.FSDP
                self.fsdp_plugin = fsdp_plugin
                # FSDP1 compares its compute device ("cpu") with this one (MULTI_CPU's "cpu:<rank>")
                PartialState._shared_state["device"] = self.device = torch.device("cpu")

        AcceleratorState.__init__ = init
        fsdp_config = {"version": int(mode[-1]), "transformer_layer_cls_to_wrap": wrapped_layers(model_dir)}
        if mode == "fsdp1":
            fsdp_config.update(sync_module_states=False, use_orig_params=True)
        return {"fsdp": "full_shard auto_wrap", "fsdp_config": fsdp_config, "use_cpu": True}
    if mode in ("zero2", "zero3"):
        from accelerate.state import PartialState
        from accelerate.utils import DistributedType

        original_backend = PartialState._prepare_backend

        def prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):
            # No accelerator: accelerate finds no backend (one process); DeepSpeed's CPU accelerator runs on gloo
            found, distributed_type = original_backend(self, cpu, sagemaker_dp, backend)
            if found is None and os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true":
                return "gloo", DistributedType.MULTI_CPU
            return found, distributed_type

        PartialState._prepare_backend = prepare_backend
        stage = int(mode[-1])
        config = {
            "zero_optimization": {"stage": stage},
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
            "gradient_clipping": "auto",
            "bf16": {"enabled": False},
            "zero_allow_untested_optimizer": True,
        }
        if stage == 3:
            config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
        return {"deepspeed": config, "use_cpu": False}
    return {"use_cpu": True}


def length_reward(completions, **kwargs):
    return [float(len(completion[0]["content"]) % 7) for completion in completions]


def dataset(text_only_rows: bool = True):
    """Eight prompts: in each block of four, two text-only (process 0's) then two with images (process 1's): one
    448x224 image, then two images of 112x168 and 224x224. Without `text_only_rows` process 0's keep their image
    (the parent trainer refuses text-only rows beside image rows)."""
    from datasets import Dataset
    from PIL import Image

    from vepo_trl.data import synthetic_training_dataset

    visual = synthetic_training_dataset(8, seed=0)
    rows = []
    for index in range(8):
        row = dict(visual[index])
        if index % 4 < 2 and not text_only_rows:
            pass
        elif index % 4 < 2:
            row["images"] = []
            row["prompt"] = [row["prompt"][0], {"role": "user", "content": [{"type": "text", "text": f"{index}+3?"}]}]
            row["answer"] = str(index + 3)
        elif index % 2:
            row["images"] = [Image.new("RGB", (112, 168), (20, 200, 40)), Image.new("RGB", (224, 224), (9, 9, 200))]
            question = [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Which is larger?"}]
            row["prompt"] = [row["prompt"][0], {"role": "user", "content": question}]
        else:
            row["images"] = [row["images"][0].resize((448, 224))]
        rows.append(row)
    return Dataset.from_list(rows, features=visual.features)


def fix_completions(trainer) -> None:
    """After the real generation (its collectives run), replace each completion by one made from its prompt: the same
    tokens whatever the process count; a prompt's k-th completion differs from its others (rewards differ)."""
    original = trainer._generate_single_turn
    vocabulary = trainer.processing_class.tokenizer.vocab_size

    def generate(prompt_ids, *args, **kwargs):
        original(prompt_ids, *args, **kwargs)
        seen, completions = {}, []
        for ids in prompt_ids:
            key = tuple(ids)
            seen[key] = seen.get(key, -1) + 1
            digest = int(hashlib.sha256(repr(key).encode()).hexdigest(), 16)
            length = 3 + (digest + seen[key]) % 6
            completions.append(
                [100 + (digest // (index + 1) + 7 * seen[key]) % (vocabulary - 200) for index in range(length)]
            )
        return completions, None  # no sampler log-probs for these tokens

    trainer._generate_single_turn = generate


def compare_passes(trainer) -> dict:
    """Every scoring call also runs whole sequences first (every process, in the same order, so the collectives stay
    in step): the largest difference of the signals (JSD, entropies) over the scored tokens and whether the masks
    agree. `chunk_forwards` keeps the shared calls' forwards per chunk only."""
    import copy

    from vepo_trl.batch import Batch

    passes, pipeline = trainer.perturbed_pass, trainer.selection_pipeline
    record = {"max_signal_diff": 0.0, "masks_equal": True}
    original = passes.signals_for_rows

    def both(inputs, signals, rows, clean_of_row, batch_size, wanted):
        share = passes.share_prompts
        passes.share_prompts = False
        start, counts = len(passes.chunk_forwards), (passes.num_completions, passes.num_positions)
        whole = original(inputs, copy.copy(signals), rows, clean_of_row, batch_size, wanted)
        while len(passes.chunk_forwards) > start:
            passes.chunk_forwards.pop()
        passes.num_completions, passes.num_positions = counts
        passes.share_prompts = share
        shared = original(inputs, signals, rows, clean_of_row, batch_size, wanted)
        scored = Batch.of(inputs).valid & rows[:, None]
        for name in ("jsd", "entropy", "perturbed_entropy"):
            if getattr(shared, name) is not None and bool(scored.any()):
                difference = float((getattr(shared, name) - getattr(whole, name))[scored].abs().max())
                record["max_signal_diff"] = max(record["max_signal_diff"], difference)
        same = torch.equal(pipeline.select(inputs, shared, rows), pipeline.select(inputs, whole, rows))
        record["masks_equal"] = record["masks_equal"] and same
        return shared

    passes.signals_for_rows = both
    return record


def full_weights(trainer, mode: str) -> dict[str, torch.Tensor]:
    """Every parameter in full on this process (a collective under sharding), named as in the unwrapped model."""
    wrapped = trainer.model_wrapped
    if mode == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel

        with FullyShardedDataParallel.summon_full_params(wrapped, writeback=False):
            return {clean(name): p.detach().clone() for name, p in wrapped.named_parameters()}
    if mode == "zero3":
        import deepspeed

        params = dict(trainer.model.named_parameters())
        with deepspeed.zero.GatheredParameters(list(params.values())):
            return {name: p.detach().clone() for name, p in params.items()}
    return {
        clean(name): (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
        for name, p in trainer.accelerator.unwrap_model(wrapped).named_parameters()
    }


def clean(name: str) -> str:
    for wrapper in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "module."):
        name = name.replace(wrapper, "")
    return name


def main(output: str, model_dir: str, mode: str, trainer_name: str = "vepo") -> None:
    from accelerate import PartialState
    from trl import GRPOTrainer

    from vepo_trl import VEPOConfig, VEPOTrainer

    world = int(os.environ.get("WORLD_SIZE", "1"))
    settings = dict(
        output_dir=output,
        per_device_train_batch_size=2,
        num_generations=2,
        gradient_accumulation_steps=4 // world,
        steps_per_generation=4 // world,
        num_iterations=2,
        max_completion_length=8,
        max_steps=4,
        learning_rate=0.5,
        lr_scheduler_type="constant",
        optim="sgd",
        max_grad_norm=0.0,  # gradient clipping would couple the steps to the global norm's rounding
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
        shuffle_dataset=False,
        ddp_timeout=120,
        selection_ratio=0.5,
        **force_sharding(mode, model_dir),
    )
    # The parent trainer (`grpo`) with the same settings: VEPOConfig's own fields are VEPO's only, GRPO ignores them
    trainer_class = {"vepo": VEPOTrainer, "grpo": GRPOTrainer}[trainer_name]
    trainer = trainer_class(
        model=model_dir,
        reward_funcs=length_reward,
        args=VEPOConfig(**settings),
        train_dataset=dataset(trainer_name == "vepo"),
    )
    fix_completions(trainer)
    comparison = compare_passes(trainer) if trainer_name == "vepo" else {}
    before = full_weights(trainer, mode)
    trainer.train()
    state = PartialState()
    weights = full_weights(trainer, mode)
    changed = max(float((weights[name] - before[name]).abs().max()) for name in weights)
    digest = hashlib.sha256(b"".join(weights[name].double().numpy().tobytes() for name in sorted(weights))).hexdigest()
    alignment = getattr(trainer, "vision_alignment", [None])[0]
    head_unshard = getattr(trainer, "head_unshard", None)
    mine = {
        "digest": digest,
        "changed": changed,
        "dummy_forwards": None if alignment is None else alignment.dummy_forwards,
        "head_unshards": None if head_unshard is None else head_unshard.unshards,
        "perturbed": getattr(trainer, "num_perturbed_completions", None),
        "skipped": getattr(trainer, "num_skipped_completions", None),
        "chunk_forwards": list(trainer.perturbed_pass.chunk_forwards) if trainer_name == "vepo" else None,
        **comparison,
    }
    ranks = [None] * state.num_processes
    if state.num_processes > 1:
        torch.distributed.all_gather_object(ranks, mine)
    else:
        ranks = [mine]
    if state.is_main_process:
        report = {
            "mode": mode,
            "distributed_type": str(trainer.accelerator.distributed_type),
            "fsdp_version": getattr(trainer.accelerator.state.fsdp_plugin, "fsdp_version", None)
            if trainer.is_fsdp_enabled
            else None,
            "zero_stage": getattr(trainer.accelerator.state.deepspeed_plugin, "zero_stage", None),
            "global_step": trainer.state.global_step,
            "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
            "ranks": ranks,
        }
        Path(output).mkdir(parents=True, exist_ok=True)
        torch.save({name: t.double() for name, t in weights.items()}, Path(output) / "weights.pt")
        (Path(output) / "report.json").write_text(json.dumps(report))
    state.wait_for_everyone()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # torch's gloo group sometimes aborts while torn down at exit: the exit status is the run's


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(*sys.argv[1:])
