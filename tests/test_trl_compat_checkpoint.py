"""Resume restores what was trained: N steps without a stop equal k steps, a checkpoint and a resumed run to N, bit for
bit on the CPU (weights, optimiser moments, learning rate, every logged loss), on each pixel layout and with LoRA.

transformers 5's Trainer reads a checkpoint back without the key conversion `save_pretrained` reverted, so on most
families it restores almost nothing (shown below with TRL's own GRPOTrainer); `vepo_trl.trl_compat.checkpoint` restores the rest
and switches itself off where the Trainer's load finds every key."""

from pathlib import Path

import pytest
import torch
from peft import LoraConfig
from safetensors import safe_open
from safetensors.torch import save_file
from transformers.trainer_callback import PrinterCallback
from trl import GRPOConfig, GRPOTrainer

from vepo_trl import VEPOConfig, VEPOTrainer
from vepo_trl.builtin.tiny_models import TINY_FAMILIES
from vepo_trl.data import synthetic_training_dataset
from vepo_trl.trl_compat.checkpoint import CheckpointRestoreError

from .support import length_reward


SAFE = "model.safetensors"
# Every family: what transformers 5 saves differs from the model's own names on some (renamed keys, an MoE's fused
# experts saved one expert at a time, a tied head left out), and the restore has to find each tensor
FAMILIES = list(TINY_FAMILIES)


@pytest.fixture(scope="module")
def training_rows():
    return synthetic_training_dataset(16, seed=0)


def settings(output_dir, config_cls=VEPOConfig, **overrides):
    values = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=4,
        learning_rate=1e-2,
        lr_scheduler_type="linear",  # a learning rate that moves: the scheduler's state matters
        logging_steps=1,
        report_to="none",
        save_strategy="steps",
        save_steps=2,
        use_cpu=True,
        bf16=False,
        seed=0,
        disable_tqdm=True,
    )
    values.update(overrides)
    return config_cls(**values)


def train_run(model_dir, training_rows, output_dir, resume=None, peft_config=None):
    trainer = VEPOTrainer(model=model_dir, reward_funcs=length_reward, args=settings(output_dir), train_dataset=training_rows,
                          peft_config=peft_config)  # fmt: skip
    trainer.remove_callback(PrinterCallback)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def losses(trainer):
    return [(entry["step"], entry["loss"]) for entry in trainer.state.log_history if "loss" in entry]


def assert_same_run(straight, resumed):
    for (name, p), q in zip(straight.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(p, q), name
    # The optimiser's moments and the scheduler carried over, not restarted
    for group_a, group_b in zip(straight.optimizer.param_groups, resumed.optimizer.param_groups):
        assert group_a["lr"] == group_b["lr"]
        for p, q in zip(group_a["params"], group_b["params"]):
            state_a, state_b = straight.optimizer.state[p], resumed.optimizer.state[q]
            assert state_a.keys() == state_b.keys()
            for key in state_a:
                assert torch.equal(torch.as_tensor(state_a[key]), torch.as_tensor(state_b[key])), key
    # The resumed run logs steps 3 and 4 exactly as the uninterrupted one did
    assert losses(resumed)[-2:] == losses(straight)[-2:] and [s for s, _ in losses(resumed)][-2:] == [3, 4]


@pytest.mark.parametrize("family", FAMILIES)
def test_resume_equals_the_uninterrupted_run(tiny_dirs, training_rows, tmp_path, family):
    straight = train_run(tiny_dirs[family], training_rows, tmp_path / "straight")
    resumed = train_run(
        tiny_dirs[family], training_rows, tmp_path / "resumed", resume=str(tmp_path / "straight" / "checkpoint-2")
    )
    assert_same_run(straight, resumed)
    report = getattr(resumed, "checkpoint_restore", None)
    saved = checkpoint_names(tmp_path / "straight" / "checkpoint-2")
    own = set(resumed.model.state_dict())
    if saved - own:  # saved under other names: the Trainer's own load left keys missing, every tensor restored
        assert report.restored == report.total == len(own) - _tied(resumed.model)
        assert report.loaded_by_trainer < report.total
    elif own - saved:  # saved under its own names but a tied head: restored from its tie, the rest by the Trainer
        assert report.restored == report.total == report.loaded_by_trainer + len(own - saved)
    else:  # saved under the model's own names: the Trainer's load found them all, the restore stayed out
        assert report is None


def checkpoint_names(folder):
    with safe_open(str(folder / SAFE), framework="pt") as handle:
        return set(handle.keys())


def test_resume_after_the_first_epoch_reads_the_rows_of_the_uninterrupted_run(tiny_dirs, training_rows, tmp_path):
    """Two prompts, one per step: checkpoint-2 ends the first epoch and steps 3 and 4 are the second. TRL's sampler
    drew epoch 0's order again on resume (step 3 then trained on step 1's prompt): equal now (`epoch_aware`)."""
    two = training_rows.select(range(2))
    straight = train_run(tiny_dirs["qwen2.5-vl"], two, tmp_path / "straight")
    assert [entry["epoch"] for entry in straight.state.log_history if "loss" in entry] == [0.5, 1.0, 1.5, 2.0]
    resumed = train_run(
        tiny_dirs["qwen2.5-vl"], two, tmp_path / "resumed", resume=str(tmp_path / "straight" / "checkpoint-2")
    )
    assert_same_run(straight, resumed)


def test_upstream_repeat_sampler_restarts_its_order_on_resume():
    """TRL 1.16's RepeatSampler has no `set_epoch`: a new one (what a resumed run builds) gives epoch 0's order for
    any epoch. `epoch_aware` draws the skipped epochs' orders; when this test fails, TRL has fixed it (or renamed the
    sampler): `epoch_aware` then leaves the sampler alone and can go."""
    from trl.trainer.utils import RepeatSampler

    from vepo_trl.trl_compat.checkpoint import epoch_aware

    def sampler():
        return RepeatSampler(list(range(6)), mini_repeat_count=2, batch_size=3, repeat_count=1, seed=0)

    assert not hasattr(RepeatSampler, "set_epoch")
    straight = sampler()
    epochs = [list(straight) for _ in range(3)]
    assert epochs[0] != epochs[1] != epochs[2]
    assert list(sampler()) == epochs[0]  # a resumed run's epoch 2, unguarded
    for epoch in range(3):
        resumed = epoch_aware(sampler())
        resumed.set_epoch(epoch)
        assert list(resumed) == epochs[epoch] and len(resumed) == len(straight)
    # An uninterrupted run through the guard: set_epoch before each pass draws nothing more
    guarded = epoch_aware(sampler())
    seen = []
    for epoch in range(3):
        guarded.set_epoch(epoch)
        seen.append(list(guarded))
    assert seen == epochs


def _tied(model):
    state = model.state_dict()
    return len(state) - len({(t.data_ptr(), tuple(t.shape)) for t in state.values()})


def test_resume_with_lora_equals_the_uninterrupted_run(tiny_dirs, training_rows, tmp_path):
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    straight = train_run(tiny_dirs["qwen2.5-vl"], training_rows, tmp_path / "straight", peft_config=lora)
    resumed = train_run(tiny_dirs["qwen2.5-vl"], training_rows, tmp_path / "resumed",
                    resume=str(tmp_path / "straight" / "checkpoint-2"), peft_config=lora)  # fmt: skip
    assert_same_run(straight, resumed)


def test_transformers_trainer_resume_leaves_the_weights_behind(tiny_dirs, training_rows, tmp_path):
    """The upstream failure VEPOTrainer guards against, in TRL's own GRPOTrainer. When this fails, transformers loads
    the saved names itself: VEPOTrainer's restore then never runs (see the next test) and can be removed."""
    straight = train_run(tiny_dirs["qwen2.5-vl"], training_rows, tmp_path / "straight")
    checkpoint = tmp_path / "straight" / "checkpoint-2"
    args = settings(tmp_path / "grpo", GRPOConfig, **{"max_steps": 4})
    grpo = GRPOTrainer(
        model=tiny_dirs["qwen2.5-vl"], reward_funcs=length_reward, args=args, train_dataset=training_rows
    )
    base = {n: p.detach().clone() for n, p in grpo.model.named_parameters()}
    grpo._load_from_checkpoint(str(checkpoint))
    unchanged = [n for n, p in grpo.model.named_parameters() if torch.equal(p, base[n])]
    trained = [n for n, p in straight.model.named_parameters()]
    assert len(unchanged) >= len(trained) - 2  # all but the head (and its tie) kept the base weights


def test_restore_is_inert_when_the_trainer_finds_every_key(tiny_dirs, training_rows, tmp_path):
    trainer = VEPOTrainer(model=tiny_dirs["qwen2.5-vl"], reward_funcs=length_reward, args=settings(tmp_path / "out"),
                          train_dataset=training_rows)  # fmt: skip
    state = {n: t.clone() + 1.0 for n, t in trainer.model.state_dict().items()}
    folder = tmp_path / "model-names"
    folder.mkdir()
    save_file({n: t.contiguous() for n, t in state.items()}, str(folder / "model.safetensors"))
    trainer._load_from_checkpoint(str(folder))
    assert getattr(trainer, "checkpoint_restore", None) is None  # nothing missing: the workaround did nothing
    for name, tensor in trainer.model.state_dict().items():
        if name in state:
            assert torch.equal(tensor, state[name]), name


def test_a_checkpoint_of_another_model_is_refused_in_one_line(tiny_dirs, training_rows, tmp_path):
    train_run(tiny_dirs["gemma3"], training_rows, tmp_path / "gemma")
    trainer = VEPOTrainer(model=tiny_dirs["qwen2.5-vl"], reward_funcs=length_reward, args=settings(tmp_path / "out"),
                          train_dataset=training_rows)  # fmt: skip
    with pytest.raises(CheckpointRestoreError) as error:
        trainer._load_from_checkpoint(str(tmp_path / "gemma" / "checkpoint-2"))
    message = str(error.value)
    assert "\n" not in message and "Cannot resume from" in message and "checkpoint-2" in message
    assert isinstance(error.value, ValueError)  # a UsageError: the CLI prints it as one line, exit 2


def test_cli_resume_starts_from_the_checkpoint_weights(tmp_path, monkeypatch, capsys):
    """The reported case through `vepo-trl train`: a run stopped after checkpoint-2 and rerun continues from the
    checkpoint's weights and says how many tensors it restored. The tiny recipe's rewards are all zero on a random
    model (no gradient: checked below), so the checkpoint's weights are marked (+0.25) and must be the final ones."""
    import json
    import shutil

    from safetensors.torch import load_file

    from vepo_trl.cli import main as cli_main

    monkeypatch.setenv("VEPO_TRL_CACHE", str(tmp_path / "cache"))
    recipe = str(Path(__file__).resolve().parents[1] / "recipes" / "tiny" / "config_vepo.yaml")
    argv = ["train", "--config", recipe, "--synthetic_rows", "16", "--logging_steps", "1", "--save_strategy", "steps",
            "--save_steps", "2", "--max_steps", "3"]  # fmt: skip
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    cli_main([*argv, "--output_dir", str(straight)])
    # What a run killed after its second step leaves: its record and checkpoint-2, here with marked weights
    stopped.mkdir()
    shutil.copy(straight / "vepo_run.json", stopped)
    shutil.copytree(straight / "checkpoint-2", stopped / "checkpoint-2")
    marked = {name: tensor + 0.25 for name, tensor in load_file(str(stopped / "checkpoint-2" / SAFE)).items()}
    save_file(marked, str(stopped / "checkpoint-2" / SAFE))
    capsys.readouterr()
    cli_main([*argv, "--output_dir", str(stopped)])
    out = capsys.readouterr().out
    assert "Resuming from" in out and "Restored 57 of 57 weight tensors" in out
    steps = [json.loads(line) for line in (stopped / "metrics.jsonl").read_text().splitlines()]
    assert {entry["grad_norm"] for entry in steps if "grad_norm" in entry} == {0.0}  # no step moved a weight
    resumed = load_file(str(stopped / SAFE))
    assert resumed.keys() == marked.keys()
    for name in marked:
        assert torch.equal(resumed[name], marked[name]), name


def test_a_requeued_run_sets_an_incomplete_checkpoint_aside_and_resumes_the_last_complete_one(tmp_path):
    """An empty `checkpoint-99` (a run killed while saving: the OOM killer, a lost node) and a `checkpoint-98` with
    state but no weights: the same command rerun (or `--resume_from_checkpoint true`) resumes from the last complete
    checkpoint, setting both aside (renamed, contents kept) with one line saying so, so that a scheduler's requeue
    goes on without a person. Naming an incomplete one is still refused."""
    from vepo_trl.errors import UsageError
    from vepo_trl.run_folder import check_train_folder, plan_run, set_aside_incomplete, write_record

    folder = tmp_path / "run"
    complete = folder / "checkpoint-5"
    complete.mkdir(parents=True)
    for name in ("trainer_state.json", SAFE):
        (complete / name).write_text("{}")
    write_record(folder, {"a": 1})
    assert plan_run(str(folder), {"a": 1}, resume=None, overwrite=False).checkpoint == str(complete)
    (folder / "checkpoint-99").mkdir()
    (folder / "checkpoint-98").mkdir()
    (folder / "checkpoint-98" / "trainer_state.json").write_text("{}")  # state without weights
    for resume in (None, "true"):
        plan = plan_run(str(folder), {"a": 1}, resume=resume, overwrite=False)
        assert plan.checkpoint == str(complete)
        assert plan.incomplete == [str(folder / "checkpoint-99"), str(folder / "checkpoint-98")]
        assert "checkpoint-99, checkpoint-98 are incomplete" in plan.message and "\n" not in plan.message
    with pytest.raises(UsageError, match="no weights"):  # named: refused as the folder is checked, before plan_run
        check_train_folder(str(folder), resume=str(folder / "checkpoint-98"))
    # The complete one, named, still resumes
    assert plan_run(str(folder), {"a": 1}, resume=str(complete), overwrite=False).checkpoint == str(complete)
    moved = set_aside_incomplete(plan.incomplete)
    kept = folder / "incomplete_checkpoints"
    assert moved == [str(kept / "checkpoint-99"), str(kept / "checkpoint-98")]
    assert (kept / "checkpoint-98" / "trainer_state.json").is_file()
    assert plan_run(str(folder), {"a": 1}, resume=None, overwrite=False).incomplete == []
    # Out of sight of transformers' rotation and resume, which read every `*checkpoint-N` name of the run's folder
    from transformers.trainer_utils import get_last_checkpoint, sort_checkpoints

    assert sort_checkpoints(str(folder)) == [str(complete)] and get_last_checkpoint(str(folder)) == str(complete)
    # Killed again while saving the same step: a second copy, the first kept
    (folder / "checkpoint-99").mkdir()
    assert set_aside_incomplete([str(folder / "checkpoint-99")]) == [str(kept / "checkpoint-99.2")]
    assert plan_run(str(folder), {"a": 1}, resume=None, overwrite=False).incomplete == []
    # Only incomplete ones left: the run starts from the beginning, saying so; `true` has nothing to resume
    for path in complete.iterdir():
        path.unlink()
    plan = plan_run(str(folder), {"a": 1}, resume=None, overwrite=False)
    assert plan.checkpoint is None and "starts from the beginning" in plan.message
    with pytest.raises(UsageError, match="holds no complete checkpoint"):
        plan_run(str(folder), {"a": 1}, resume="true", overwrite=False)
