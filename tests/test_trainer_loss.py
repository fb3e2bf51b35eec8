"""The selection restricts the policy-gradient term and nothing else, for every TRL loss type: each loss equals a
plain, hand-written L_VEPO (selected count in the denominator) plus beta * KL over ALL valid tokens; the logged
`entropy` / `kl` and the entropy bonus (by default) cover all valid tokens."""

import pytest
import torch
from trl import GRPOTrainer

from vepo_trl.trainer import SELECTION_KEY

from .support import first_batch, make_trainer


LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]


def reference_loss(trainer, inputs, logps):
    """L_VEPO for `trainer.loss_type`, written out from the paper's definition and TRL's per-token surrogates."""
    s = inputs[SELECTION_KEY].float()  # (B, T) selected
    v = inputs["completion_mask"].float()  # (B, T) valid
    A = inputs["advantages"].unsqueeze(1)  # (B, 1)
    old = inputs["old_per_token_logps"]
    ratio = torch.exp(logps - old)
    eps_low, eps_high = trainer.epsilon_low, trainer.epsilon_high
    loss_type = trainer.loss_type
    if loss_type == "cispo":
        surrogate = -torch.clamp(ratio, max=eps_high) * A * logps
    elif loss_type == "sapo":
        tau = torch.where(A > 0, trainer.args.sapo_temperature_pos, trainer.args.sapo_temperature_neg)
        surrogate = -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * A
    elif loss_type == "vespo":
        phi = GRPOTrainer.get_gamma_weights(A, logps - old, v, None)  # TRL's sequence weight, over all valid tokens
        surrogate = -phi * A * logps
    else:
        surrogate = -torch.minimum(ratio * A, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * A)
    kl = torch.zeros_like(logps)
    if trainer.beta != 0:
        ref = inputs["ref_per_token_logps"]
        kl = torch.exp(ref - logps) - (ref - logps) - 1
        if trainer.args.use_bias_correction_kl:  # TRL's default: the k3 estimate importance-weighted to the policy
            kl = kl * ratio

    batch = s.size(0)
    if loss_type in ("grpo", "sapo"):
        policy = ((surrogate * s).sum(-1) / s.sum(-1).clamp(min=1)).mean()
        kl_term = ((kl * v).sum(-1) / v.sum(-1).clamp(min=1)).mean()
    elif loss_type == "luspo":
        # Length-unbiased: a response's mean over its selected tokens, times its valid length
        policy = ((surrogate * s).sum(-1) / s.sum(-1).clamp(min=1) * v.sum(-1)).mean()
        kl_term = (kl * v).sum(-1).mean()
    elif loss_type == "bnpo":
        policy = (surrogate * s).sum() / s.sum()
        kl_term = (kl * v).sum() / v.sum()
    elif loss_type == "dr_grpo":
        t_max = trainer.max_completion_length
        selected_of_t_max = torch.ceil(torch.tensor(trainer.args.selection_ratio * t_max) - 1e-9)
        policy = (surrogate * s).sum() / (batch * selected_of_t_max)
        kl_term = (kl * v).sum() / (batch * t_max)
    else:  # dapo, cispo, vespo: counts of the whole generation batch, one slice of it per step
        slices = trainer._buffered_inputs
        selected_total = sum(float(b[SELECTION_KEY].sum()) for b in slices)
        valid_total = sum(float(b["completion_mask"].sum()) for b in slices)
        per_step = len(slices)
        policy = (surrogate * s).sum() / (selected_total / per_step)
        kl_term = (kl * v).sum() / (valid_total / per_step)
    return policy + trainer.beta * kl_term


@pytest.mark.parametrize("beta", [0.0, 0.1])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_loss_is_l_vepo_plus_kl_over_valid_tokens(tiny_model_dir, visual_dataset, tmp_path, loss_type, beta):
    # Two slices per rollout: TRL computes old log-probs at rollout, so the ratio is a real one once weights move
    trainer = make_trainer(
        tiny_model_dir, visual_dataset, tmp_path, loss_type=loss_type, beta=beta, steps_per_generation=2
    )
    inputs = first_batch(trainer)
    selected, valid = inputs[SELECTION_KEY], inputs["completion_mask"].bool()
    assert selected.any() and (selected.sum() < valid.sum())
    torch.manual_seed(0)
    with torch.no_grad():  # an optimiser step's worth of change: ratios away from 1, some clipped
        for p in trainer.model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    loss = trainer.compute_loss(trainer.model, inputs)
    with torch.no_grad():
        logps, entropies, _ = trainer._forward(trainer.model, inputs)
        expected = reference_loss(trainer, inputs, logps)
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-5, atol=1e-6)

    # Logged figures cover every valid token, whatever the selection
    metrics = trainer._metrics["train"]
    torch.testing.assert_close(metrics["entropy"][-1], float(entropies[valid].mean()), rtol=1e-5, atol=1e-6)
    if beta:
        ref = inputs["ref_per_token_logps"]
        kl = (torch.exp(ref - logps) - (ref - logps) - 1) * torch.exp(logps - inputs["old_per_token_logps"])
        torch.testing.assert_close(metrics["kl"][-1], float(kl[valid].mean()), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scope", ["all", "selected"])
def test_entropy_bonus_scope(tiny_model_dir, visual_dataset, tmp_path, scope):
    trainer = make_trainer(tiny_model_dir, visual_dataset, tmp_path, loss_type="bnpo", entropy_scope=scope)
    inputs = first_batch(trainer)
    plain = trainer.compute_loss(trainer.model, inputs).detach()
    trainer.entropy_coef, trainer._entropy_bonus_enabled = 0.5, True
    with_bonus = trainer.compute_loss(trainer.model, inputs).detach()
    with torch.no_grad():
        entropies = trainer._forward(trainer.model, inputs)[1]
    tokens = inputs["completion_mask"].bool()
    if scope == "selected":
        tokens = tokens & inputs[SELECTION_KEY]
    # L = L_policy - coef * mean entropy over the scope's tokens
    torch.testing.assert_close(with_bonus, plain - 0.5 * entropies[tokens].mean(), rtol=1e-5, atol=1e-6)
    # TRL's `policy_loss` metric: the loss before the bonus
    torch.testing.assert_close(trainer._metrics["train"]["policy_loss"][-1], float(plain), rtol=1e-5, atol=1e-6)


def test_weight_mode_trains_every_token_with_selected_ones_weighted(tiny_model_dir, visual_dataset, tmp_path):
    """The release's option: all valid tokens train, selected ones with weight 1 + lambda (bnpo: / valid count)."""
    trainer = make_trainer(
        tiny_model_dir, visual_dataset, tmp_path, loss_type="bnpo", selection_mode="weight", selection_weight=2.0
    )
    inputs = first_batch(trainer)
    logps = trainer._forward(trainer.model, inputs)[0]
    logps.retain_grad()
    trainer._pending_forward = None
    captured = {}
    forward = trainer._forward

    def spy(model, batch):
        result = forward(model, batch)
        result[0].retain_grad()
        captured["logps"] = result[0]
        return result

    trainer._forward = spy
    trainer.compute_loss(trainer.model, inputs).backward()
    grad = captured["logps"].grad
    valid, selected = inputs["completion_mask"].bool(), inputs[SELECTION_KEY]
    A = inputs["advantages"].unsqueeze(1).expand_as(grad)
    # First use, ratio 1: d loss / d logp_t = -A * w_t / (valid count), w = 1 + 2 on selected tokens, 1 elsewhere
    weight = 1.0 + 2.0 * selected.float()
    expected = -A * weight / valid.sum()
    torch.testing.assert_close(grad[valid], expected[valid], rtol=1e-5, atol=1e-7)


def test_unsupported_loss_type_is_refused_up_front():
    from vepo_trl import VEPOConfig

    with pytest.raises(ValueError, match="use_adaptive_entropy"):
        VEPOConfig(output_dir="x", use_cpu=True, bf16=False, use_adaptive_entropy=True, report_to="none")
