"""What VEPO relies on in TRL's private `GRPOTrainer` internals, observed on TRL itself (the parent class, spied on),
so that a TRL upgrade that changes it fails here loudly instead of silently changing which policy scores the batch or
which terms the selection weights multiply:

1. when `_generate_and_score_completions` runs the policy's no-grad `old_per_token_logps` forward: VEPO's copy of the
   condition (`SelectionPipeline.trl_scores_at_rollout`) over (num_iterations, steps_per_generation, gradient
   accumulation, vLLM importance-sampling correction);
2. that forward is the policy's first one of the rollout (a PEFT reference forward, same model object, comes after);
3. the tensor `get_high_entropy_mask` returns multiplies the policy-gradient term of `_compute_loss` only: not the KL
   term, not the logged entropy or KL.
"""

import pytest
import torch
from peft import LoraConfig
from trl import GRPOConfig, GRPOTrainer

from vepo_trl.selection_pipeline import SelectionPipeline
from vepo_trl.trl_compat.vllm_prompts import UnexpandedVLLMPrompts

from . import vllm_standin
from .support import first_batch, length_reward, make_config, make_trainer


@pytest.fixture(scope="module")
def vllm_installed():
    with vllm_standin.installed():
        yield


def _spy_forwards(trainer):
    """Record each `_get_per_token_logps_and_entropies` call of TRL's: (the policy object?, grad on?, log-probs)."""
    calls = []
    forward = trainer._get_per_token_logps_and_entropies

    def spy(model, *args, **kwargs):
        result = forward(model, *args, **kwargs)
        calls.append((model is trainer.model, torch.is_grad_enabled(), result[0].detach().clone()))
        return result

    trainer._get_per_token_logps_and_entropies = spy
    return calls


def _keep_rollout_output(trainer):
    outputs = []
    generate = trainer._generate_and_score_completions

    def keep(inputs):
        outputs.append(generate(inputs))
        return outputs[-1]

    trainer._generate_and_score_completions = keep
    return outputs


def _vepo_condition(trainer) -> bool:
    """VEPO's copy of TRL's condition, hosted by the given (parent) trainer."""
    pipeline = SelectionPipeline(trainer, None, None, None, dropout=False, noise_step_metric=False)
    return pipeline.trl_scores_at_rollout()


GRID = [
    (num_iterations, steps_per_generation, accumulation, correction)
    for num_iterations in (1, 2)
    for steps_per_generation in (1, 2, 4)
    for accumulation in (1, 2, 4)
    for correction in (False, True)
]


class GRPOWithVLLMPrompts(UnexpandedVLLMPrompts, GRPOTrainer):
    pass


@pytest.mark.parametrize(
    "num_iterations,steps_per_generation,accumulation,correction",
    GRID,
    ids=[f"it{n}-spg{s}-ga{g}-{'is' if c else 'nois'}" for n, s, g, c in GRID],
)
def test_rollout_forward_condition_matches_trl(
    vllm_installed, tiny_model_dir, visual_dataset, tmp_path, num_iterations, steps_per_generation, accumulation,
    correction,
):  # fmt: skip
    args = make_config(
        tmp_path,
        GRPOConfig,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=4,
        num_iterations=num_iterations,
        steps_per_generation=steps_per_generation,
        gradient_accumulation_steps=accumulation,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_importance_sampling_correction=correction,
    )
    # TRL's trainer with vLLM given one placeholder per image (its own colocate prompts are corrupted by vLLM's
    # expansion: tests/test_trl_compat_vllm_prompts.py); what is observed here, its forwards, is TRL's own
    trainer = GRPOWithVLLMPrompts(
        model=tiny_model_dir, reward_funcs=length_reward, args=args, train_dataset=visual_dataset
    )
    calls = _spy_forwards(trainer)
    batch = first_batch(trainer)
    trl_scores = any(policy and not grad for policy, grad, _ in calls)
    assert trl_scores == ("old_per_token_logps" in batch)  # the spy sees TRL's forward: one observation, two ways
    assert _vepo_condition(trainer) == trl_scores, (
        f"TRL {'runs' if trl_scores else 'skips'} its rollout-time policy forward here; VEPO's copy of the condition "
        "disagrees: update SelectionPipeline.trl_scores_at_rollout"
    )


@pytest.mark.parametrize("reference", ["peft", "ref_model"])
def test_first_policy_forward_of_a_rollout_is_old_logps(tiny_model_dir, visual_dataset, tmp_path, reference):
    """VEPO takes the first no-grad forward of the policy object in a rollout as `old_per_token_logps`. With LoRA the
    reference forward runs on the same object (adapters off): it must come after."""
    args = make_config(tmp_path, GRPOConfig, beta=0.1, steps_per_generation=2)
    peft_config = None
    if reference == "peft":  # random B: the adapters change the outputs, so the two forwards differ
        peft_config = LoraConfig(target_modules=["q_proj", "v_proj"], r=8, lora_alpha=16, init_lora_weights=False)
    trainer = GRPOTrainer(
        model=tiny_model_dir,
        reward_funcs=length_reward,
        args=args,
        train_dataset=visual_dataset,
        peft_config=peft_config,
    )
    assert _vepo_condition(trainer)
    calls = _spy_forwards(trainer)
    outputs = _keep_rollout_output(trainer)
    first_batch(trainer)
    (output,) = outputs
    assert all(not grad for _, grad, _ in calls)  # the rollout runs no forward with grad
    policy_calls = [logps for policy, _, logps in calls if policy]
    assert torch.equal(policy_calls[0], output["old_per_token_logps"])
    if reference == "peft":
        assert len(policy_calls) == 2 and torch.equal(policy_calls[1], output["ref_per_token_logps"])
        assert not torch.equal(policy_calls[0], policy_calls[1])
    else:
        assert len(policy_calls) == 1 and len(calls) == 2
        assert torch.equal(calls[1][2], output["ref_per_token_logps"])


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_selection_weights_multiply_only_the_policy_gradient_term(
    vllm_installed, tiny_model_dir, visual_dataset, tmp_path, loss_type
):
    """GRPO's `_compute_loss` with a recorded float weight tensor through `get_high_entropy_mask` (VEPO's hook), a KL
    term and vLLM's importance-sampling ratio, against a hand-written loss: weights x ratio x clipped surrogate
    + beta x KL, the logged entropy and KL unweighted."""
    trainer = make_trainer(
        tiny_model_dir,
        visual_dataset,
        tmp_path,
        loss_type=loss_type,
        beta=0.1,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode="token_truncate",
    )
    inputs = first_batch(trainer)
    mask = inputs["completion_mask"].float()
    generator = torch.Generator().manual_seed(0)

    def uniform(low, high, like):
        return low + (high - low) * torch.rand(like.shape, generator=generator)

    with torch.no_grad():
        logps, entropies, _ = trainer._forward(trainer.model, inputs)
    # Ratios on both sides of the clip range, a reference away from the policy, an IS ratio away from 1
    inputs["old_per_token_logps"] = logps + uniform(-0.4, 0.4, logps)
    inputs["ref_per_token_logps"] = logps + uniform(-0.5, 0.5, logps)
    inputs["importance_sampling_ratio"] = uniform(0.5, 1.5, logps)
    weights = uniform(0.0, 2.0, logps) * (uniform(0, 1, logps) > 0.3)
    hooks = []
    hook = trainer.get_high_entropy_mask

    def recording_hook(entropies, mask, threshold):
        hooks.append(entropies)
        return hook(entropies, mask, threshold)

    trainer.get_high_entropy_mask = recording_hook
    trainer._token_weights = weights  # what VEPOTrainer.compute_loss sets around GRPO's loss
    try:
        loss = GRPOTrainer._compute_loss(trainer, trainer.model, inputs)
    finally:
        trainer._token_weights = None
    assert len(hooks) == 1, "TRL no longer asks get_high_entropy_mask for the token mask"

    advantages = inputs["advantages"].unsqueeze(1)
    ratio = torch.exp(logps - inputs["old_per_token_logps"])
    clipped = ratio.clamp(1 - trainer.epsilon_low, 1 + trainer.epsilon_high)
    assert ((ratio - clipped).abs() > 1e-3).any(), "the test should cover clipped tokens"
    surrogate = -torch.min(ratio * advantages, clipped * advantages)
    policy_term = weights * inputs["importance_sampling_ratio"] * surrogate
    delta = inputs["ref_per_token_logps"] - logps
    kl = torch.exp(delta) - delta - 1
    assert trainer.args.use_bias_correction_kl  # (TRL's default) the KL estimate is importance-weighted by the ratio
    kl = kl * ratio
    per_token = policy_term + trainer.beta * kl
    accumulation = trainer.current_gradient_accumulation_steps
    if loss_type == "grpo":
        expected = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / accumulation
    else:  # dapo: the generation batch's token count, rescaled to one accumulation window
        normaliser = inputs["num_items_in_batch"] * accumulation / trainer.args.steps_per_generation
        expected = (per_token * mask).sum() / normaliser
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-5, atol=1e-7)
    metrics = trainer._metrics["train"]
    assert metrics["entropy"][-1] == pytest.approx(float((entropies * mask).sum() / mask.sum()), rel=1e-5)
    assert metrics["kl"][-1] == pytest.approx(float((kl * mask).sum() / mask.sum()), rel=1e-5)


@pytest.mark.parametrize("threshold", [0.8, 0.5, 1.0, 0.0])
def test_get_high_entropy_mask_is_callable_as_trls_tests_call_it(threshold):
    """TRL's `TestGetHighEntropyMask` calls the method on a `Mock(spec=Trainer)` that never ran `__init__`; with no
    VEPO weights in place VEPOTrainer's answer is GRPOTrainer's, on the same inputs."""
    from unittest.mock import Mock

    from vepo_trl import VEPOTrainer

    def mock_of(cls):
        trainer = Mock(spec=cls)
        trainer.accelerator = Mock(num_processes=1)
        trainer.accelerator.gather = lambda x: x
        trainer.accelerator.pad_across_processes = lambda x, dim, pad_index: x
        return trainer

    entropies = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.7, 0.8, 0.9, 1.0, 1.1, 1.2]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    expected = GRPOTrainer.get_high_entropy_mask(mock_of(GRPOTrainer), entropies, mask, threshold)
    got = VEPOTrainer.get_high_entropy_mask(mock_of(VEPOTrainer), entropies, mask, threshold)
    torch.testing.assert_close(got, expected)
