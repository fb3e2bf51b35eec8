"""A sharded `VEPOTrainer` run saved at step 2 and resumed from that checkpoint on a fresh launch, on two CPU processes
(gloo) under `trainer_ranks.force_sharding`'s set-up. Run by tests/test_sharding.py with `torch.distributed.run`:

    torchrun --nproc_per_node 2 resume_ranks.py OUTPUT MODEL_DIR {ddp,fsdp1,fsdp2,zero2,zero3} [CHECKPOINT]

Without CHECKPOINT: three steps, checkpoint-2 saved. With it: the same run resumed from CHECKPOINT to step 3. AdamW,
whose moments the checkpoint must carry, a linear schedule whose position it must carry, one generation per step;
eight prompts, four per step, so step 3 opens the second epoch (whose order the sampler must carry).
`FSDP_STATE_DICT_TYPE` picks the FSDP checkpoints' state dict (FULL_STATE_DICT by default).
Writes `report.json` on rank 0: the digest of the full weights at the end, the steps this launch ran, the losses.
"""

import hashlib
import json
import os
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))

from trainer_ranks import dataset, fix_completions, force_sharding, full_weights, length_reward  # noqa: E402


def main(output: str, model_dir: str, mode: str, checkpoint: str | None = None) -> None:
    import torch
    from accelerate import PartialState
    from transformers import TrainerCallback

    from vepo_trl import VEPOConfig, VEPOTrainer

    class StepsRun(TrainerCallback):
        def __init__(self):
            self.steps = []

        def on_step_end(self, args, state, control, **kwargs):
            self.steps.append(state.global_step)

    sharding = force_sharding(mode, model_dir)
    if "fsdp_config" in sharding and os.environ.get("FSDP_STATE_DICT_TYPE"):
        # What an accelerate config's fsdp_state_dict_type sets, through the Trainer's own key
        sharding["fsdp_config"]["state_dict_type"] = os.environ["FSDP_STATE_DICT_TYPE"]
    settings = dict(
        output_dir=output,
        per_device_train_batch_size=2,
        num_generations=2,
        gradient_accumulation_steps=2,
        max_completion_length=8,
        max_steps=3,
        learning_rate=1e-2,
        lr_scheduler_type="linear",
        optim="adamw_torch",
        logging_steps=1,
        report_to="none",
        save_strategy="steps",
        save_steps=2,
        seed=0,
        ddp_timeout=120,
        selection_ratio=0.5,
        **sharding,
    )
    trainer = VEPOTrainer(
        model=model_dir, reward_funcs=length_reward, args=VEPOConfig(**settings), train_dataset=dataset()
    )
    fix_completions(trainer)
    steps = StepsRun()
    trainer.add_callback(steps)
    trainer.train(resume_from_checkpoint=checkpoint)
    weights = full_weights(trainer, mode)
    state = PartialState()
    if state.is_main_process:
        digest = hashlib.sha256(b"".join(weights[k].double().numpy().tobytes() for k in sorted(weights))).hexdigest()
        plugin = trainer.accelerator.state.fsdp_plugin if trainer.is_fsdp_enabled else None
        report = {
            "distributed_type": str(trainer.accelerator.distributed_type),
            "fsdp_version": getattr(plugin, "fsdp_version", None),
            "state_dict_type": str(getattr(plugin, "state_dict_type", None)),
            "digest": digest,
            "steps_run": steps.steps,
            "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
            "checkpoints": sorted(path.name for path in Path(output).glob("checkpoint-*")),
        }
        Path(output).mkdir(parents=True, exist_ok=True)
        (Path(output) / "report.json").write_text(json.dumps(report))
        torch.save({name: t.double() for name, t in weights.items()}, Path(output) / "weights.pt")
    state.wait_for_everyone()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # torch's gloo group sometimes aborts while torn down at exit: the exit status is the run's


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(*sys.argv[1:])
