"""The mask is made with the rollout policy (the weights that sampled the batch), by dropout-free passes; evaluation
and zero-advantage responses cost no perturbed forward where the loss cannot use it."""

import copy

import pytest
import torch
from peft import LoraConfig

from vepo_trl import VEPOConfig, VEPOTrainer
from vepo_trl.trainer import SELECTION_KEY

from .support import clone_inputs, first_batch, length_reward, make_config, make_trainer, mask_with_weights


def test_every_slice_is_scored_with_the_rollout_weights(tiny_model_dir, visual_dataset, tmp_path):
    # The paper's layout in miniature: four optimiser steps per rollout (steps_per_generation = 4 x accumulation),
    # a learning rate large enough that every step changes the tiny model's distributions
    trainer = make_trainer(
        tiny_model_dir,
        visual_dataset,
        tmp_path,
        steps_per_generation=4,
        gradient_accumulation_steps=1,
        max_steps=8,
        learning_rate=0.5,
        score_zero_advantage_rows=True,  # the first-use reference below scores every response too
    )
    rollout_weights = []
    generate = trainer._generate_and_score_completions

    def snapshot_and_generate(inputs):
        rollout_weights.append((copy.deepcopy(trainer.model.state_dict()), trainer.state.global_step))
        return generate(inputs)

    used = []  # (rollout index, slice inputs, the mask the weights of that moment would give)
    compute_loss = trainer.compute_loss

    def recording_compute_loss(model, inputs, *args, **kwargs):
        used.append((len(rollout_weights) - 1, clone_inputs(inputs), mask_with_weights(trainer, inputs)))
        return compute_loss(model, inputs, *args, **kwargs)

    trainer._generate_and_score_completions = snapshot_and_generate
    trainer.compute_loss = recording_compute_loss
    trainer.train()
    assert len(rollout_weights) == 2 and len(used) == 8
    stale = 0
    for rollout, inputs, mask_at_use in used:
        expected = mask_with_weights(trainer, inputs, *rollout_weights[rollout])
        assert torch.equal(inputs[SELECTION_KEY], expected)
        stale += not torch.equal(mask_at_use, expected)
    # The test has teeth: weights at a slice's use would have given another mask for most later slices
    assert stale >= 3


@pytest.mark.parametrize("steps_per_generation", [1, 2])  # mask at first use / on TRL's rollout-time forward
def test_scoring_passes_have_no_dropout(tiny_model_dir, visual_dataset, tmp_path, steps_per_generation):
    """A perturbation that leaves the image unchanged gives JSD = |dH| = 0, even with LoRA dropout."""
    args = make_config(
        tmp_path,
        perturbation="gaussian",
        noise_sigma=0.0,  # the identity
        steps_per_generation=steps_per_generation,
        max_steps=2,
    )
    # Random B (not PEFT's zeros), so the adapters and their dropout change the outputs from the first step
    peft_config = LoraConfig(
        target_modules=["q_proj", "v_proj"], r=8, lora_alpha=16, lora_dropout=0.5, init_lora_weights=False
    )
    trainer = VEPOTrainer(
        model=tiny_model_dir,
        reward_funcs=length_reward,
        args=args,
        train_dataset=visual_dataset,
        peft_config=peft_config,
    )
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "vepo/jsd_mean" in entry]
    assert logs and trainer.num_perturbed_completions > 0
    for entry in logs:
        assert entry["vepo/jsd_mean"] < 1e-6
        assert entry["vepo/entropy_gap_abs_mean"] < 1e-5


def test_evaluation_runs_no_perturbed_pass_unless_asked(tiny_model_dir, visual_dataset, tmp_path):
    for eval_selection in (False, True):
        args = make_config(tmp_path, per_device_eval_batch_size=4, eval_selection=eval_selection)
        trainer = VEPOTrainer(
            model=tiny_model_dir,
            reward_funcs=length_reward,
            args=args,
            train_dataset=visual_dataset,
            eval_dataset=visual_dataset.select(range(4)),
        )
        metrics = trainer.evaluate()
        assert "eval_loss" in metrics
        if eval_selection:
            assert trainer.num_perturbed_completions + trainer.num_skipped_completions == 16
            assert "eval_vepo/selected_fraction" in metrics
        else:
            assert trainer.num_perturbed_completions == 0 and "eval_vepo/selected_fraction" not in metrics


def one_group_constant_reward(completions, **kwargs):
    """The first prompt's four completions all 0 (zero advantage), the second's 1, 0, 1, 0: whatever is sampled."""
    return [0.0 if index < 4 else float(index % 2) for index in range(len(completions))]


def test_zero_advantage_responses_skip_the_perturbed_pass_when_safe(tiny_model_dir, visual_dataset, tmp_path):
    args = make_config(tmp_path, per_device_train_batch_size=8)
    trainer = VEPOTrainer(
        model=tiny_model_dir, reward_funcs=one_group_constant_reward, args=args, train_dataset=visual_dataset
    )
    inputs = first_batch(trainer)
    trainer.compute_loss(trainer.model, inputs)
    zero = int((inputs["advantages"] == 0).sum())
    assert zero > 0, "the batch should hold a zero-advantage response"
    assert trainer.num_skipped_completions == zero
    assert trainer.num_perturbed_completions == inputs["advantages"].numel() - zero
    # Their mask still keeps ceil(k * T) tokens, so count-normalised losses are unchanged
    lengths = inputs["completion_mask"].sum(-1).double()
    assert torch.equal(inputs[SELECTION_KEY].sum(-1), torch.ceil(lengths * 0.2 - 1e-9).clamp(min=1).long())

    # An entropy bonus over the selected tokens reads every mask: nothing is skipped then
    trainer = make_trainer(tiny_model_dir, visual_dataset, tmp_path, entropy_coef=0.01, entropy_scope="selected")
    inputs = first_batch(trainer)
    trainer.compute_loss(trainer.model, inputs)
    assert trainer.num_skipped_completions == 0
    assert trainer.num_perturbed_completions == inputs["advantages"].numel()


def test_skipping_does_not_change_the_loss(tiny_model_dir, visual_dataset, tmp_path):
    losses = []
    for score_all in (False, True):
        trainer = make_trainer(
            tiny_model_dir, visual_dataset, tmp_path, loss_type="dapo", score_zero_advantage_rows=score_all
        )
        inputs = first_batch(trainer)
        losses.append(trainer.compute_loss(trainer.model, inputs).detach())
    torch.testing.assert_close(losses[0], losses[1], rtol=0, atol=1e-7)


def test_tile_size_defaults_to_64_on_the_cpu(tiny_model_dir, visual_dataset, tmp_path):
    trainer = make_trainer(tiny_model_dir, visual_dataset, tmp_path)
    assert trainer.args.scoring_tile_size is None and trainer.perturbed_pass.tile_size(torch.device("cpu")) == 64
    trainer.args.scoring_tile_size = 8
    assert trainer.perturbed_pass.tile_size(torch.device("cpu")) == 8


def test_vepo_config_rejects_adaptive_entropy_with_selection():
    with pytest.raises(ValueError, match="use_adaptive_entropy"):
        VEPOConfig(output_dir="x", use_cpu=True, bf16=False, report_to="none", use_adaptive_entropy=True)


def test_selection_samples_are_written_and_render(tiny_model_dir, visual_dataset, tmp_path):
    from vepo_trl.insight.records import load_records

    trainer = make_trainer(
        tiny_model_dir, visual_dataset, tmp_path, selection_samples_steps=1, selection_samples_count=2, max_steps=2
    )
    trainer.train()
    records = load_records(tmp_path / "out" / "selection_samples.jsonl")
    assert len(records) == 4 and {record.step for record in records} == {0, 1}
    for record in records:
        assert record.strategy == "vepo" and len(record.tokens) == len(record.selected) > 0
        assert any(record.selected)


def test_empty_train_dataset_is_refused(tiny_model_dir, visual_dataset, tmp_path):
    with pytest.raises(ValueError, match="train_dataset is empty"):
        make_trainer(tiny_model_dir, visual_dataset.select([]), tmp_path)


def test_rollout_path_skips_zero_advantage_responses_too(tiny_model_dir, visual_dataset, tmp_path):
    """On TRL's rollout-time path the perturbed forwards run once the advantages exist, so they skip too."""

    def half_constant_reward(completions, **kwargs):
        # The first prompt's completions get varied rewards, the second prompt's all the same (advantage 0)
        half = len(completions) // 2
        return [float(len(c[0]["content"]) % 5) if i < half else 1.0 for i, c in enumerate(completions)]

    args = make_config(tmp_path, steps_per_generation=2)
    trainer = VEPOTrainer(
        model=tiny_model_dir, reward_funcs=half_constant_reward, args=args, train_dataset=visual_dataset
    )
    captured = {}
    generate = trainer._generate_and_score_completions

    def keep_output(inputs):
        captured["output"] = generate(inputs)
        return captured["output"]

    trainer._generate_and_score_completions = keep_output
    first_batch(trainer)
    output = captured["output"]
    assert SELECTION_KEY in output, "scored at rollout, before TRL's shuffle and split"
    zero = int((output["advantages"] == 0).sum())
    assert zero >= 4 and trainer.num_skipped_completions == zero
    assert trainer.num_perturbed_completions == output["advantages"].numel() - zero


def test_peft_reference_forward_is_not_taken_for_the_policy(tiny_model_dir, visual_dataset, tmp_path):
    """With LoRA and beta > 0, TRL's reference forward is the policy model with its adapters off. When TRL runs no
    rollout-time policy forward (aligned steps), that reference forward must not be scored as the policy's."""
    args = make_config(tmp_path, beta=0.1)
    trainer = VEPOTrainer(
        model=tiny_model_dir,
        reward_funcs=length_reward,
        args=args,
        train_dataset=visual_dataset,
        peft_config=LoraConfig(target_modules=["q_proj", "v_proj"], r=8, lora_alpha=16, init_lora_weights=False),
    )
    inputs = first_batch(trainer)
    assert "ref_per_token_logps" in inputs and SELECTION_KEY not in inputs  # made at first use, with the adapters on
    trainer.compute_loss(trainer.model, inputs)
    assert SELECTION_KEY in inputs and trainer.num_perturbed_completions > 0


def test_selection_metrics_of_the_release(tiny_model_dir, visual_dataset, tmp_path):
    trainer = make_trainer(tiny_model_dir, visual_dataset, tmp_path, score_zero_advantage_rows=True)
    inputs = first_batch(trainer)
    trainer.compute_loss(trainer.model, inputs)
    metrics = {name: values[-1] for name, values in trainer._metrics["train"].items() if values}
    assert 0.0 < metrics["vepo/score_mean"] < 1.0 and metrics["vepo/score_std"] > 0.0
    # VEPO keeps the tokens the image moves: their JSD and |dH| exceed the response average
    assert metrics["vepo/jsd_selected_mean"] > metrics["vepo/jsd_mean"]
    assert metrics["vepo/entropy_gap_abs_selected_mean"] > metrics["vepo/entropy_gap_abs_mean"]
    assert 0.0 <= metrics["vepo/entropy_gap_positive_fraction"] <= 1.0
    assert metrics["vepo/selected_fraction_std"] >= 0.0


def test_over_the_cache_budget_each_chunk_is_scored_at_once_with_the_same_masks(
    tiny_model_dir, visual_dataset, tmp_path
):
    # TRL scores at rollout (steps_per_generation 2 > accumulation 1); every response scored, so both ways compare
    # mask for mask. Budget 8 GB: the clean states wait on the CPU for the advantages; budget 0: scored per chunk.
    runs = {}
    for budget in (8.0, 0.0):
        trainer = make_trainer(
            tiny_model_dir,
            visual_dataset,
            tmp_path,
            steps_per_generation=2,
            gradient_accumulation_steps=1,
            score_zero_advantage_rows=True,
            rollout_cache_gb=budget,
        )
        inputs = first_batch(trainer)
        runs[budget] = (trainer, inputs, dict(trainer._metrics["train"]))
    (kept, kept_inputs, kept_metrics), (streamed, streamed_inputs, streamed_metrics) = runs[8.0], runs[0.0]
    assert torch.equal(kept_inputs["completion_ids"], streamed_inputs["completion_ids"])  # the same rollout
    assert torch.equal(kept_inputs[SELECTION_KEY], streamed_inputs[SELECTION_KEY])
    assert kept_metrics["vepo/rollout_scored_per_chunk"] == [0.0]
    assert streamed_metrics["vepo/rollout_scored_per_chunk"] == [1.0]
    assert kept.num_perturbed_completions == streamed.num_perturbed_completions > 0
    # The cache's size: valid completion tokens of image responses x width 64 x 4 bytes (fp32 on the CPU), over the
    # whole generation batch (steps_per_generation x per-device batch)
    generation = trainer._buffered_inputs
    tokens = sum(int(chunk["completion_mask"].sum()) for chunk in generation)
    assert kept_metrics["vepo/rollout_cache_gb"] == [pytest.approx(tokens * 64 * 4 / 1e9)]
