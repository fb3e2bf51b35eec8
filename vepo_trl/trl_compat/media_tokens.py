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
    completion_ids: list[list[int]], ids: Iterable[int], pad: int, sampled: list[list[int]] | None = None
) -> tuple[list[list[int]], list[bool]]:
    """Each completion with the media ids the model sampled replaced by `pad`, and whether it held one. `sampled`:
    TRL's `tool_mask` (1 where the model sampled the token, 0 on a tool's response, whose image placeholders are the
    tool images' own and stay), or None (every token sampled)."""
    banned = set(ids)
    scrubbed, held = [], []
    for i, row in enumerate(completion_ids):
        mask = sampled[i] if sampled is not None else [1] * len(row)
        hits = [bool(own) and token in banned for token, own in zip(row, mask, strict=True)]
        held.append(any(hits))
        scrubbed.append([pad if hit else token for token, hit in zip(row, hits)] if any(hits) else row)
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


def _media_mass(head, hidden, labels, mask, log_probs, index, scale, softcap, temperature, fp32, chunk: int = 4096):
    """Per scored position: log(1 - P) and sum_m p_m log p_m, with p_m the media tokens' probabilities, from their
    logits and the label's (the fused head's log p(label) gives the normaliser), in chunks of `chunk` positions. The
    logits in the fused head's precision (the autocast dtype, or fp32 with `cast_lm_head_to_fp32`), so that their
    difference to the label's carries no rounding the kernel's does not."""
    from trl.trainer.utils import maybe_gather_lm_head_ctx

    weight, bias = _full(head.weight), None if head.bias is None else _full(head.bias)
    rows, chosen = hidden.to(weight.device)[mask], labels.to(weight.device)[mask]
    log_p = log_probs[mask].float()
    if fp32:
        rows = rows.float()
    rests, entropies = [], []
    with maybe_gather_lm_head_ctx(weight, *([bias] if bias is not None else [])):
        media = index.to(weight.device)
        for start in range(0, rows.size(0), chunk):
            part, label = rows[start : start + chunk], chosen[start : start + chunk]
            w = weight.float() if fp32 else weight
            logits = (part @ w[media].to(part.dtype).T).float()  # (tokens, media)
            label_logit = (part.unsqueeze(1) @ w[label].to(part.dtype).unsqueeze(-1)).reshape(-1, 1).float()
            if bias is not None:
                logits, label_logit = logits + bias[media].float(), label_logit + bias[label].float().unsqueeze(-1)
            logits, label_logit = logits * scale, label_logit * scale
            if softcap is not None:
                logits = softcap * torch.tanh(logits / softcap)
                label_logit = softcap * torch.tanh(label_logit / softcap)
            media_log_p = log_p[start : start + chunk].unsqueeze(-1) + (logits - label_logit) / temperature
            media_p = media_log_p.exp()
            rests.append(torch.log1p(-media_p.sum(-1).clamp(max=1.0 - 1e-6)))
            entropies.append((media_p * media_log_p).sum(-1))
    if not rests:
        empty = log_p.new_zeros(0)
        return empty, empty
    return torch.cat(rests), torch.cat(entropies)


def renormalised_without_media(model, ids: list[int], temperature: float, fp32: bool = False) -> bool:
    """Make `model`'s fused-head forward (TRL's `add_fused_lm_head`, `fused_lm_head=True`) return the log-probs and
    entropies of its distribution with `ids` removed and the rest renormalised: what vLLM samples and reports under
    `logit_bias` (processed log-probs). From the media tokens' own logits only (a `(tokens, len(ids))` product), so
    the `(tokens, vocab)` logits are never materialised: with p_m the media probabilities and P their sum,
    log p'(a) = log p(a) - log(1 - P) and H' = (H + sum_m p_m log p_m) / (1 - P) + log(1 - P). The normaliser is taken
    without its gradient: the log-probs' gradient is TRL's own (the normaliser's, O(P), is left out: nothing then
    trains through the media rows, no dense LM-head gradient or sharded weight is touched by autograd here). `fp32`:
    the trainer's `cast_lm_head_to_fp32`. Returns whether it was installed (a model without TRL's fused head is left as
    it is)."""
    fused = model.__dict__.get("forward")
    if not ids or fused is None or getattr(fused, "_renormalised_without_media", False):
        return False
    text_config = model.config.get_text_config()
    scale, softcap = _logit_transform(text_config)
    backbone = model.base_model
    index = torch.tensor(ids)  # cpu: moved to the LM head's device in each forward

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
        with torch.no_grad():  # the normaliser: its value, not its gradient (see the docstring)
            log_rest, media_entropy = _media_mass(
                self.get_output_embeddings(), hidden, labels, mask, output.log_probs, index, scale, softcap,
                temperature, fp32,
            )  # fmt: skip
        if output.entropy is not None:
            total = -torch.expm1(log_rest)
            entropy = output.entropy[mask].float()
            rest = (entropy + media_entropy) / (1.0 - total) + log_rest
            output.entropy = output.entropy.masked_scatter(mask, rest.to(output.entropy.dtype))
        log_p = output.log_probs[mask]
        output.log_probs = output.log_probs.masked_scatter(mask, (log_p.float() - log_rest).to(log_p.dtype))
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
        if self._tokenizer.pad_token_id in self._media_ids:  # the scrub's replacement must be no media token itself
            raise ValueError(
                f"the tokenizer's pad token (id {self._tokenizer.pad_token_id}) is one of the model's media tokens: "
                "give the tokenizer a text pad token"
            )
        if self.use_vllm:
            generation = self.vllm_generation
            generation.generation_kwargs = merge_generation_kwargs(
                generation.generation_kwargs, self._media_ids, "vllm"
            )
            for model in (self.model, getattr(self, "ref_model", None)):
                if model is not None:
                    renormalised_without_media(
                        unwrap(model), list(self._media_ids), self.temperature, self.args.cast_lm_head_to_fp32
                    )
        else:
            self.generation_kwargs = merge_generation_kwargs(self.generation_kwargs, self._media_ids, "transformers")
            self.generation_config = GenerationConfig(**self.generation_kwargs, disable_compile=True)

    def _generate(self, prompts):
        output = list(super()._generate(prompts))
        if not self._media_ids:
            return tuple(output)
        # (prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, images, tool_images): TRL 1.16
        if len(output) != 8:
            raise RuntimeError(
                f"TRL's _generate returned {len(output)} values where TRL 1.16 returns 8: update {__name__}"
            )
        completion_ids, tool_mask = output[1], output[2]
        scrubbed, held = scrub_media_rows(completion_ids, self._media_ids, self._tokenizer.pad_token_id, tool_mask)
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
