"""Reading a prompt once for all of its completions: the perturbed pass's prefix sharing.

All `num_generations` completions of a prompt see the same perturbed image (its noise is seeded by the image's
content), so their perturbed forwards differ only in the completion tokens. `shared_prompt_hidden` runs, per group of
rows with one prompt and the same image inputs, one forward over the prompt (vision tower included) that keeps the
model's cache, then one over the group's completions from that cache, as `generate` continues a prompt: the model's own
cache and position handling (M-RoPE deltas, sliding windows, prefix-LM token types). Plain functions of a model and a
batch's tensors; `perturbed_pass` decides when they run.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch

from .batch import MODEL_INPUT_KEYS, ROW_KEYS, Batch, take_rows


def prompt_groups(input_ids, attention_mask, length: int, inputs: dict[str, Any]) -> list[list[int]]:
    """Rows `(n, P + T)` (`length` = T completion tokens) grouped by prompt, in row order: equal prompt tokens and
    prompt mask, equal per-token inputs over the prompt, equal image inputs (each row's `batch.row_pieces`). Every row
    is its own group unless every prompt mask is left padding (one unbroken run of tokens)."""
    prompt_length = input_ids.size(1) - length
    mask = attention_mask[:, :prompt_length].bool()
    if not bool((mask.flip(1).cumprod(1).sum(1) == mask.sum(1)).all()):
        return [[row] for row in range(input_ids.size(0))]
    prompts = [input_ids[:, :prompt_length], mask.to(input_ids.dtype)]
    prompts += [inputs[key][:, :prompt_length].to(input_ids) for key in ROW_KEYS if inputs.get(key) is not None]
    prompts = torch.cat(prompts, dim=1)
    # Each row's own image inputs, views of the batch's tensors
    pieces = Batch.of(inputs).row_pieces or [{} for _ in range(input_ids.size(0))]

    groups: list[list[int]] = []
    for row in range(input_ids.size(0)):
        for group in groups:
            lead = group[0]
            if torch.equal(prompts[row], prompts[lead]) and _same_inputs(pieces[row], pieces[lead]):
                group.append(row)
                break
        else:
            groups.append([row])
    return groups


def _same_inputs(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    for key, value in a.items():
        other = b[key]
        if isinstance(value, torch.Tensor) or isinstance(other, torch.Tensor):
            if not (
                isinstance(value, torch.Tensor)
                and isinstance(other, torch.Tensor)
                and value.shape == other.shape
                and torch.equal(value, other)
            ):
                return False
        elif value != other:
            return False
    return True


def completions_hold_images(input_ids, length: int, inputs: dict[str, Any], image_token_ids: list[int]) -> bool:
    """Whether any completion of rows `(n, P + T)` holds image or video tokens (a tool's image, which TRL 1.16 puts in
    the completion with its pixels): the prompt forward would then see pixels for placeholders it does not hold."""
    completions = input_ids[:, input_ids.size(1) - length :]
    if image_token_ids and bool(
        torch.isin(completions, torch.tensor(image_token_ids, device=completions.device)).any()
    ):
        return True
    # `mm_token_type_ids` marks images and videos non-zero (`token_type_ids` is also a prefix LM's suffix marker)
    types = inputs.get("mm_token_type_ids")
    return types is not None and bool((types[:, -length:] != 0).any())


def cache_argument(model: torch.nn.Module) -> str:
    """The forward's keyword for a cache to continue from: `cache` where transformers deprecates `past_key_values`
    (5.x), else `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def positions_from_mask(model: torch.nn.Module) -> bool:
    """Whether the model derives its positions from the attention mask (M-RoPE's `get_rope_index`: a left-padded row
    has its unpadded positions), rather than counting every column (`arange`, padding included)."""
    return any(hasattr(part, "get_rope_index") for part in (model, getattr(model, "model", None)))


def cache_blocker(config) -> str | None:
    """Why a model of `config` does not continue from a cache as its whole forward computes, within the perturbed
    pass's 1e-5 (its rows then keep one forward each), or None."""
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    if "linear_attention" in (getattr(text_config, "layer_types", None) or ()):
        # Measured on the tiny Qwen3.5: 1.3e-5 nats of perturbed entropy apart in float32 (the whole forward itself
        # moves 2.6e-5 when a prompt's left padding changes)
        return (
            "linear-attention layers (Gated DeltaNet) run their chunked recurrence over other chunk boundaries when "
            "continued from a cache"
        )
    return None


@torch.no_grad()
def shared_prompt_hidden(
    model: torch.nn.Module,
    base_model: torch.nn.Module,
    capture: Callable[[], AbstractContextManager[list[torch.Tensor]]],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    length: int,
    inputs: dict[str, Any],
    groups: list[list[int]],
    leaders: dict[str, Any],
    max_rows: int,
) -> tuple[torch.Tensor | None, int]:
    """Completion hidden states `(n, T, d)` of `model` on rows `(n, P + T)`, reading each group's prompt once, and the
    number of token positions the forwards ran; `None` for the states when the model returns no cache.

    `capture()` collects the backbone's last hidden states of the forwards in its block; `base_model` is the
    transformers model under any wrapper; `inputs` the rows' inputs (`take_rows` layout: their per-token inputs are
    read); `leaders` each group's first row's image inputs in group order (`take_rows` layout), as the forward
    should see them (perturbed). Per group: a forward over the prompt that keeps the cache (its last position predicts
    completion token 0), then, `max_rows` rows at a time, the cache repeated for those rows and a forward over their
    completions but the last token (each position predicts the next). A model with positions from the mask gets the
    prompt without its padding and no mask (the same positions); any other gets the padded prompt and the full mask
    (the same `arange` positions as the whole forward). One group's cache, and one slice's copy, are held at a time."""
    prompt_length = input_ids.size(1) - length
    strip = positions_from_mask(base_model)
    cache_key = cache_argument(base_model)
    out, positions = None, 0
    for number, group in enumerate(groups):
        first = group[0]
        leader = take_rows(leaders, torch.tensor([number], device=input_ids.device))
        start = int(attention_mask[first, :prompt_length].argmax()) if strip else 0
        prompt_inputs = {key: leader[key] for key in MODEL_INPUT_KEYS if leader.get(key) is not None}
        for key in ROW_KEYS:
            if inputs.get(key) is not None:
                prompt_inputs[key] = inputs[key][first : first + 1, start:prompt_length]
        if not strip:
            prompt_inputs["attention_mask"] = attention_mask[first : first + 1, :prompt_length]
        with capture() as captured:
            prompt_out = model(
                input_ids=input_ids[first : first + 1, start:prompt_length],
                **prompt_inputs,
                logits_to_keep=1,
                use_cache=length > 1,
            )
        positions += prompt_length - start + len(group) * (length - 1)
        last = captured[-1][:, -1:]
        cache = getattr(prompt_out, "cache", None) or getattr(prompt_out, "past_key_values", None)
        del prompt_out, captured
        if length > 1 and cache is None:
            return None, positions  # the model kept no cache: the caller runs the whole sequences
        # The group's completions from the prompt's cache, at most `max_rows` at a time: each slice holds its own copy
        # of the cache (`rows x (P + T)` keys and values), as many rows as a whole-sequence chunk holds
        slices = [group[i : i + max_rows] for i in range(0, len(group), max_rows)]
        for index, rows_list in enumerate(slices):
            hidden = last.expand(len(rows_list), 1, last.size(-1))
            if length > 1:
                rows = torch.tensor(rows_list, device=input_ids.device)
                own = cache if index == len(slices) - 1 else copy.deepcopy(cache)
                if len(rows_list) > 1:
                    own.batch_repeat_interleave(len(rows_list))
                continuation = {
                    key: inputs[key][rows.to(inputs[key].device), prompt_length:-1]
                    for key in ROW_KEYS
                    if inputs.get(key) is not None
                }
                if not strip:
                    continuation["attention_mask"] = attention_mask[rows, :-1]
                with capture() as captured:
                    model(
                        input_ids=input_ids[rows, prompt_length:-1],
                        **continuation,
                        **{cache_key: own},
                        logits_to_keep=1,
                        use_cache=True,
                    )
                hidden = torch.cat([hidden, captured[-1]], dim=1)
                del own, captured
            if out is None:
                out = hidden.new_empty(input_ids.size(0), length, hidden.size(-1))
            out[torch.tensor(rows_list, device=out.device)] = hidden
        del cache
    return out, positions
