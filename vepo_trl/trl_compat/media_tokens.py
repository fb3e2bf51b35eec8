"""No media token is ever sampled: the image / video placeholders and vision special tokens of a model, banned on every
generation path, and a completion that holds one anyway kept out of the loss.

A sampled `<|image_pad|>` gives the prompt+completion more image tokens than image features, and the first log-prob
forward fails ("Image features and image tokens do not match"); a sampled `<|vision_start|>` or `[IMG_BREAK]` is trained
on as text. TRL 1.16 suppresses `config.image_token_id` alone, on its transformers path only; its vLLM `SamplingParams`
carry nothing against them and vLLM ignores a checkpoint's `suppress_tokens` (huggingface/trl#3847, hiyouga/EasyR1#110,
StarsfieldAI/R1-V#91, modelscope/ms-swift#9287). Here:

- transformers generation: every media id in `suppress_tokens` (merged with the user's own);
- vLLM (colocate and server): `logit_bias` of `MEDIA_BIAS` on each (merged with the user's own), the largest the
  engine takes (vLLM clamps biases to [-100, 100]). vLLM's processed log-probs, which TRL's importance-sampling
  correction compares with the trainer's, are then of the distribution without the media tokens:
  `renormalised_without_media` makes the trainer's log-probs and entropies that same distribution;
- a completion that still holds one (a user's `rollout_func`, a policy drifted past the bias): the token is replaced
  by the pad token, so the forwards run, and the whole row is masked out of the loss through TRL's own per-token
  mask (`tool_mask`, as `rollout_func`'s `env_mask`); counted in `completions/media_token_rows`.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Iterable

import torch

from ..families import banned_token_ids


__all__ = [
    "MEDIA_BIAS",
    "MEDIA_ROWS_METRIC",
    "NoMediaTokensSampled",
    "merge_generation_kwargs",
    "renormalised_without_media",
    "scrub_media_rows",
]

# The largest ban vLLM's SamplingParams takes (it clamps logit_bias to [-100, 100]): exp(-100) of the mass is left
MEDIA_BIAS = -100.0
MEDIA_ROWS_METRIC = "completions/media_token_rows"


def merge_generation_kwargs(kwargs: dict | None, ids: Iterable[int], backend: str) -> dict:
    """`kwargs` (a user's own generation kwargs, left unchanged) with `ids` banned: `suppress_tokens` for transformers'
    `generate`, `logit_bias` for vLLM's `SamplingParams` (a user's own bias on another id kept)."""
    merged = dict(kwargs or {})
    ids = [int(i) for i in ids]
    if not ids:
        return merged
    if backend == "transformers":
        own = list(merged.get("suppress_tokens") or [])
        merged["suppress_tokens"] = own + [i for i in ids if i not in own]
    elif backend == "vllm":
        bias = {int(token): value for token, value in (merged.get("logit_bias") or {}).items()}
        merged["logit_bias"] = {**bias, **dict.fromkeys(ids, MEDIA_BIAS)}
    else:
        raise ValueError(f"unknown generation backend {backend!r}")
    return merged


def scrub_media_rows(
    completion_ids: list[list[int]], ids: Iterable[int], pad: int
) -> tuple[list[list[int]], list[bool]]:
    """Each completion with its media ids replaced by `pad`, and whether it held one."""
    banned = set(ids)
    scrubbed, held = [], []
    for row in completion_ids:
        hit = any(token in banned for token in row)
        held.append(hit)
        scrubbed.append([pad if token in banned else token for token in row] if hit else row)
    return scrubbed, held


# ---------------------------------------------------------------------------------------------------------------------
# The trainer's log-probs of the distribution vLLM samples from
# ---------------------------------------------------------------------------------------------------------------------


def _logit_transform(text_config):
    """TRL's fused head's (`add_fused_lm_head`) scale and softcap of the logits, read the same way."""
    scale = getattr(text_config, "logit_scale", None)
    if scale is None:
        scale = getattr(text_config, "output_multiplier", None)
    if scale is None:
        scale = getattr(text_config, "lm_head_multiplier", None)
    if scale is None and getattr(text_config, "logits_scaling", None) is not None:
        scaling = text_config.logits_scaling
        scale = scaling if text_config.model_type == "hyperclovax" else 1 / scaling
    return (1.0 if scale is None else scale), getattr(text_config, "final_logit_softcapping", None)


def _full(param):
    from torch.distributed.tensor import DTensor

    return param.full_tensor() if isinstance(param, DTensor) else param


def renormalised_without_media(model, ids: list[int], temperature: float) -> bool:
    """Make `model`'s fused-head forward (TRL's `add_fused_lm_head`, `fused_lm_head=True`) return the log-probs and
    entropies of its distribution with `ids` removed and the rest renormalised: what vLLM samples and reports under
    `logit_bias` (processed log-probs). From the media tokens' own logits only (a `(tokens, len(ids))` product), so
    the `(tokens, vocab)` logits are never materialised: with p_m the media probabilities and P their sum,
    log p'(a) = log p(a) - log(1 - P) and H' = (H + sum_m p_m log p_m) / (1 - P) + log(1 - P). Returns whether it was
    installed (a model without TRL's fused head is left as it is)."""
    fused = model.__dict__.get("forward")
    if not ids or fused is None or getattr(fused, "_renormalised_without_media", False):
        return False
    from trl.trainer.utils import maybe_gather_lm_head_ctx

    text_config = model.config.get_text_config()
    scale, softcap = _logit_transform(text_config)
    backbone = model.base_model
    index = torch.tensor(ids)

    @functools.wraps(fused)
    def forward(self, *args, fused_lm_head=False, **kwargs):
        if not fused_lm_head:
            return fused(*args, **kwargs)
        captured = []
        handle = backbone.register_forward_hook(
            lambda module, inputs, output: captured.append(
                output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]
            )
        )
        try:
            output = fused(*args, fused_lm_head=True, **kwargs)
        finally:
            handle.remove()
        if not captured or output.log_probs is None:
            return output
        hidden = captured[-1]
        if kwargs.get("shift_labels") is None:
            hidden, labels = hidden[:, :-1], kwargs["labels"][:, 1:]
        else:
            labels = kwargs["shift_labels"]
        mask = output.label_mask if output.label_mask is not None else labels != -100
        head = self.get_output_embeddings()
        weight, bias = _full(head.weight), None if head.bias is None else _full(head.bias)
        rows = hidden.to(weight.device)[mask].float()
        chosen = labels.to(weight.device)[mask]
        with maybe_gather_lm_head_ctx(weight, *([bias] if bias is not None else [])):
            media = index.to(weight.device)
            logits = rows @ weight[media].float().T  # (tokens, media)
            label_logit = (rows * weight[chosen].float()).sum(-1, keepdim=True)
            if bias is not None:
                logits, label_logit = logits + bias[media].float(), label_logit + bias[chosen].float().unsqueeze(-1)
        logits, label_logit = logits * scale, label_logit * scale
        if softcap is not None:
            logits, label_logit = softcap * torch.tanh(logits / softcap), softcap * torch.tanh(label_logit / softcap)
        log_p = output.log_probs[mask].float()
        media_log_p = log_p.unsqueeze(-1) + (logits - label_logit) / temperature  # (tokens, media)
        media_p = media_log_p.exp()
        total = media_p.sum(-1).clamp(max=1.0 - 1e-6)
        log_rest = torch.log1p(-total)
        dtype = output.log_probs.dtype
        output.log_probs = output.log_probs.masked_scatter(mask, (log_p - log_rest).to(dtype))
        if output.entropy is not None:
            entropy = output.entropy[mask].float()
            rest = (entropy + (media_p * media_log_p).sum(-1)) / (1.0 - total) + log_rest
            output.entropy = output.entropy.masked_scatter(mask, rest.to(output.entropy.dtype))
        return output

    forward._renormalised_without_media = True
    model.forward = types.MethodType(forward, model)
    return True


class NoMediaTokensSampled:
    """`GRPOTrainer` mixin (ahead of it in the bases): every generation path bans the model's media tokens
    (`families.banned_token_ids`), vLLM's log-probs and the trainer's are of the same distribution, and a completion holding one
    anyway is kept out of the loss (scrubbed so that the forwards run). Call `ban_media_tokens()` once
    `GRPOTrainer.__init__` has built its generation."""

    _media_ids: tuple[int, ...] = ()

    def ban_media_tokens(self, unwrap) -> None:
        """`unwrap`: a model (policy or reference) -> the transformers model under its wrappers."""
        from transformers import GenerationConfig

        base_model = unwrap(self.model)
        self._media_ids = tuple(banned_token_ids(getattr(base_model, "config", None), self.processing_class))
        if not self._media_ids:
            return
        if self.use_vllm:
            generation = self.vllm_generation
            generation.generation_kwargs = merge_generation_kwargs(
                generation.generation_kwargs, self._media_ids, "vllm"
            )
            for model in (self.model, getattr(self, "ref_model", None)):
                if model is not None:
                    renormalised_without_media(unwrap(model), list(self._media_ids), self.temperature)
        else:
            self.generation_kwargs = merge_generation_kwargs(self.generation_kwargs, self._media_ids, "transformers")
            self.generation_config = GenerationConfig(**self.generation_kwargs, disable_compile=True)

    def _generate(self, prompts):
        output = list(super()._generate(prompts))
        if not self._media_ids:
            return tuple(output)
        # (prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, images, tool_images): TRL 1.16
        completion_ids, tool_mask = output[1], output[2]
        scrubbed, held = scrub_media_rows(completion_ids, self._media_ids, self._tokenizer.pad_token_id)
        count = torch.tensor(float(sum(held)), device=self.accelerator.device)
        total = self.accelerator.gather(count).sum().item()  # every process, every rollout
        mode = "train" if self.model.training else "eval"
        self._metrics[mode][MEDIA_ROWS_METRIC].append(total)
        if any(held):
            if tool_mask is None:
                tool_mask = [[1] * len(ids) for ids in scrubbed]
            output[1] = scrubbed
            output[2] = [[0] * len(mask) if hit else mask for mask, hit in zip(tool_mask, held, strict=True)]
        return tuple(output)
