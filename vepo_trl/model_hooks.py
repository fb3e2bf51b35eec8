"""Hooks on the model a scoring forward runs with: its last hidden states captured from the very forward the loss
uses (`capture_final_hidden`, `completion_hidden`), inference mode for a no-grad scoring pass (`scoring_mode`), and
whether a training-mode forward is random (`has_active_dropout`). The batch dicts themselves are `batch.py`'s."""

from __future__ import annotations

from contextlib import contextmanager

import torch


def completion_hidden(captured: list[torch.Tensor], length: int) -> torch.Tensor:
    """`(B, T, d)` hidden states that predict the `length` completion tokens from a forward's captured last states."""
    # The hidden state at position i predicts token i + 1, so completion token j comes from the position before it
    hidden = torch.cat(captured, dim=0)
    return hidden[:, -length - 1 : -1]


def has_active_dropout(model: torch.nn.Module) -> bool:
    """Whether a forward in training mode is random: any dropout module with p > 0 (LoRA's `lora_dropout` included) or
    an attention dropout in the config."""
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0:
            return True
    config = getattr(model, "config", None)
    text_config = config.get_text_config() if config is not None and hasattr(config, "get_text_config") else config
    return any(float(getattr(c, "attention_dropout", 0.0) or 0.0) > 0 for c in (config, text_config) if c is not None)


@contextmanager
def scoring_mode(model: torch.nn.Module):
    """A scoring forward runs as in inference: dropout off, and no activation checkpointing (its no-grad pass has no
    backward to save memory for). Every module's training flag is restored after."""
    flags = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in flags:
            module.training = training


@contextmanager
def capture_final_hidden(backbone: torch.nn.Module, enabled: bool = True):
    """Collect `backbone`'s last hidden states (after the final norm) during the forwards run in this block.

    TRL's fused LM head reads the same tensor from the same module, so the clean distribution comes from the very
    forward the loss (or TRL's rollout-time pass) uses. Detached: the loss graph is untouched."""
    captured: list[torch.Tensor] = []
    if not enabled:
        yield captured
        return

    def hook(module, args, output):
        hidden = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]
        captured.append(hidden.detach())

    handle = backbone.register_forward_hook(hook)
    try:
        yield captured
    finally:
        handle.remove()
