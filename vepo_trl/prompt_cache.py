"""Reading a prompt once for all of its completions: the perturbed pass's prefix sharing.

All `num_generations` completions of a prompt see the same perturbed image (its noise is seeded by the image's
content), so their perturbed forwards differ only in the completion tokens. `shared_prompt_hidden` runs one batched forward
over a chunk's distinct prompts (rows with one prompt and the same image inputs; vision tower included) that keeps the
model's cache, then the chunk's completions from their prompts' caches, as `generate` continues a prompt: the model's own
cache and position handling (sliding windows, prefix-LM token types; M-RoPE positions given per row). The number of
forwards depends on the chunk's size only, never on its prompts, so processes whose weights are sharded (ZeRO-3, FSDP)
gather parameters in step. Plain functions of a model and a batch's tensors; `perturbed_pass` decides when they run.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch

from .batch import MODEL_INPUT_KEYS, ROW_KEYS, Batch


def prompt_groups(input_ids, attention_mask, length: int, inputs: dict[str, Any]) -> list[list[int]]:
    """Rows `(n, P + T)` (`length` = T completion tokens) grouped by prompt, in row order: equal prompt tokens and
    prompt mask, equal per-token inputs over the prompt, equal image inputs (each row's `batch.row_pieces`). Every row
    is its own group unless every prompt mask is left padding (one unbroken run of tokens)."""
    prompt_length = input_ids.size(1) - length
    mask = attention_mask[:, :prompt_length].bool()
    if not left_padded(mask):
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


def left_padded(mask: torch.Tensor) -> bool:
    """Whether every row of a `(n, P)` boolean mask is one unbroken run of tokens at its end (left padding)."""
    return bool((mask.flip(1).cumprod(1).sum(1) == mask.sum(1)).all())


def returned_cache(output):
    """The cache a forward returned (`cache` in transformers 5.x, `past_key_values` before), or None."""
    return getattr(output, "cache", None) or getattr(output, "past_key_values", None)


def row_groups(batch) -> dict[int, int]:
    """Each row's prompt group number (`prompt_groups`) over a `batch.Batch`."""
    input_ids, attention_mask = batch.sequence
    groups = prompt_groups(input_ids, attention_mask, batch.completion_length, batch)
    return {row: number for number, group in enumerate(groups) for row in group}


def chunk_rows(rows: list[int], batch_size: int, group_of: dict[int, int] | None = None) -> list[list[int]]:
    """`rows` in consecutive chunks of `batch_size`; with `group_of` (prompts shared), a chunk takes the rest of a
    prompt's consecutive rows beyond `batch_size`, so that prompt is read once (its continuation forwards still fit
    the memory of `batch_size` whole rows: `continuation_forwards`)."""
    if group_of is None:
        return [rows[start : start + batch_size] for start in range(0, len(rows), batch_size)]
    chunks: list[list[int]] = []
    for row in rows:
        if not chunks or (len(chunks[-1]) >= batch_size and group_of[row] != group_of[chunks[-1][-1]]):
            chunks.append([row])
        else:
            chunks[-1].append(row)
    return chunks


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


def positions_from_mask(model: torch.nn.Module) -> torch.nn.Module | None:
    """The part of `model` that derives positions from the attention mask and keeps the prompt's offsets as
    `rope_deltas` (M-RoPE's `get_rope_index`: a left-padded row has its unpadded positions), or None where positions
    count every column (`arange`, padding included)."""
    for part in (model, getattr(model, "model", None)):
        if part is not None and hasattr(part, "get_rope_index"):
            return part
    return None


def shareable(input_ids, attention_mask, length: int, inputs: dict[str, Any], image_token_ids: list[int]) -> bool:
    """Whether rows `(n, P + T)` can continue from their prompts' caches: every prompt mask is left padding (its last
    column a token, whose state predicts completion token 0) and no completion holds an image."""
    prompt_length = input_ids.size(1) - length
    mask = attention_mask[:, :prompt_length].bool()
    return (
        left_padded(mask)
        and bool(mask[:, -1].all())
        and not completions_hold_images(input_ids, length, inputs, image_token_ids)
    )


def memory_widths(decoder: torch.nn.Module, hidden_size: int) -> tuple[int, int]:
    """Elements per token of a language model `decoder`: its cache (keys and values of every layer, from the
    projections' widths, so per-layer head sizes count as built) and a lower bound of what its whole forward holds at
    one layer (the residual stream, its normed input and the MLP's two input projections: `2 hidden + 2
    intermediate`; an MoE's expert width where the experts are no linear layers)."""
    cache, widths = 0, []
    for name, module in decoder.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        width = getattr(getattr(module, "base_layer", module), "out_features", None)  # a LoRA layer wraps its Linear
        if width is None:
            continue
        if leaf in ("k_proj", "v_proj"):
            cache += width
        elif leaf in ("up_proj", "gate_up_proj"):
            widths.append(width * (1 if leaf == "gate_up_proj" else 2))
    if not widths:
        config = decoder.config
        widths = [2 * (getattr(config, "moe_intermediate_size", None) or getattr(config, "intermediate_size", 0))]
    return cache, 2 * hidden_size + min(widths)


def continuation_rows(
    widths: tuple[int, int], *, budget_rows: int, rows: int, prompts: int, prompt_length: int, length: int
) -> int:
    """Rows per continuation forward for `rows` completions of `length` tokens after `prompts` prompts of
    `prompt_length` (padded) tokens, such that the shared pass never holds more than a whole-sequence forward of
    `budget_rows` rows: 0 where even one row does not fit (the chunk then runs whole sequences).

    `widths`: `memory_widths`, elements of the model's dtype per token of the cache and of the whole forward. The
    shared pass holds every prompt's cache and, per continuation forward, its rows' gathered copy grown by their
    completions plus that forward's activations. At a multi-head-attention 7B's shape (LLaVA-1.5: 32 layers x 4,096
    keys and values, 512 KB a token in bf16) the cache outweighs the whole forward's bound nine times and a chunk
    keeps whole sequences; at Qwen2.5-VL-7B's (4 key-value heads) it is 0.6 of it."""
    cache, activations = widths
    total = prompt_length + length
    whole = budget_rows * total * activations
    held = prompts * prompt_length * cache
    if held + prompts * prompt_length * activations > whole:
        return 0
    return min(rows, (whole - held) // (total * cache + length * activations))


def continuation_forwards(widths: tuple[int, int], *, rows: int, prompts: int, prompt_length: int, length: int,
                          budget_rows: int) -> int | None:  # fmt: skip
    """Continuation forwards for `rows` completions after `prompts` distinct prompts read once
    (`continuation_rows` each), or None where one row does not fit the memory of `budget_rows` whole rows."""
    fit = continuation_rows(widths, budget_rows=budget_rows, rows=rows, prompts=prompts,
                            prompt_length=prompt_length, length=length)  # fmt: skip
    return -(-rows // fit) if fit else None


def _gathered(cache, indices: torch.Tensor, last: bool):
    """`cache` with its batch rows `indices` (repeats allowed), the cache's own `batch_select_indices`: in place on the
    last use, else on a copy whose layers share the prompt's tensors until the selection replaces them."""
    if not last:
        if hasattr(cache, "layers"):
            layers = []
            for layer in cache.layers:
                layer = copy.copy(layer)
                # A linear-attention layer's per-state dicts and its token count are updated in place
                for name, value in vars(layer).items():
                    if isinstance(value, dict):
                        setattr(layer, name, dict(value))
                    elif isinstance(value, torch.Tensor) and value.dim() == 0:
                        setattr(layer, name, value.clone())
                layers.append(layer)
            cache = copy.copy(cache)
            cache.layers = layers
        else:
            cache = copy.deepcopy(cache)
    if not hasattr(cache, "layers"):
        cache.batch_select_indices(indices)
        return cache
    for layer in cache.layers:
        if hasattr(layer, "batch_select_indices"):
            layer.batch_select_indices(indices)
        if _selects_no_linear_states(layer):
            for name in ("conv_states", "recurrent_states"):
                states = getattr(layer, name)
                setattr(layer, name, {key: None if value is None else value[indices] for key, value in states.items()})
    return cache


def _selects_no_linear_states(layer) -> bool:
    """Whether `layer` holds linear-attention states (conv and recurrent, by row) that its `batch_select_indices`
    leaves as they are: transformers 5.25 defines the method on attention layers only (a hybrid layer inherits the
    attention one). False once a linear-attention class defines its own."""
    try:
        from transformers.cache_utils import LinearAttentionCacheLayerMixin as Linear
    except ImportError:
        return False
    owner = next((cls for cls in type(layer).__mro__ if "batch_select_indices" in vars(cls)), None)
    return isinstance(layer, Linear) and (owner is None or not issubclass(owner, Linear))


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
    slices: int,
    dummy: Callable[[], None],
) -> torch.Tensor | None:
    """Completion hidden states `(n, T, d)` of `model` on rows `(n, P + T)`, reading each group's prompt once in
    exactly `1 + slices` forwards, whatever the prompts (under sharded weights every forward gathers parameters with
    the other processes); `None` when the model returns no cache.

    `capture()` collects the backbone's last hidden states of the forwards in its block; `base_model` is the
    transformers model under any wrapper; `inputs` the rows' inputs (`take_rows` layout: their per-token inputs are
    read); `leaders` each group's first row's image inputs in group order (`take_rows` layout), as the forward should
    see them (perturbed); `dummy()` runs a text-only forward for the continuation slices a chunk has no rows for.

    One batched forward over the groups' prompts (left-padded, with their mask: the whole forward's positions) keeps
    the cache; its last position predicts completion token 0. Then `slices` forwards over the completions, each row's
    cache gathered from its prompt's: all T tokens (the last one's state unused), so every forward has a token. A
    model with positions from the mask (M-RoPE) gets them explicitly, from its prompt offsets (`rope_deltas`) per row:
    transformers would repeat them evenly over the batch."""
    prompt_length = input_ids.size(1) - length
    device = input_ids.device
    first = torch.tensor([group[0] for group in groups], device=device)
    group_of = torch.empty(input_ids.size(0), dtype=torch.long, device=device)
    for number, group in enumerate(groups):
        group_of[torch.tensor(group, device=device)] = number
    prompt_inputs = {key: leaders[key] for key in MODEL_INPUT_KEYS if leaders.get(key) is not None}
    for key in ROW_KEYS:
        if inputs.get(key) is not None:
            prompt_inputs[key] = inputs[key][first.to(inputs[key].device), :prompt_length]
    rope = positions_from_mask(base_model)
    if rope is not None:
        rope.rope_deltas = None  # set by this prefill, not left from another forward
    with capture() as captured:
        prompt_out = model(
            input_ids=input_ids[first, :prompt_length],
            attention_mask=attention_mask[first, :prompt_length],
            **prompt_inputs,
            logits_to_keep=1,
            use_cache=True,
        )
    last = captured[-1][:, -1]
    cache = returned_cache(prompt_out)
    del prompt_out, captured
    if cache is None:
        return None
    deltas = getattr(rope, "rope_deltas", None) if rope is not None else None
    cache_key = cache_argument(base_model)
    rows = input_ids.size(0)
    size = -(-rows // slices) if slices else rows
    out = last.new_empty(rows, length, last.size(-1))
    out[:, 0] = last[group_of]
    for index in range(slices):
        part = torch.arange(index * size, min((index + 1) * size, rows), device=device)
        if part.numel() == 0:
            dummy()
            continue
        mask = attention_mask[part]
        continuation = {key: inputs[key][part.to(inputs[key].device), prompt_length:]
                        for key in ROW_KEYS if inputs.get(key) is not None}  # fmt: skip
        if deltas is not None:
            # The whole forward's positions of the completion tokens: count of attended tokens before, plus the
            # prompt's offset (M-RoPE's text positions are equal on its three axes)
            positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)[:, prompt_length:]
            positions = positions + deltas.to(device)[group_of[part]].view(-1, 1)
            continuation["position_ids"] = positions.unsqueeze(0).expand(3, -1, -1)
        own = _gathered(cache, group_of[part], last=index == slices - 1 or int(part[-1]) == rows - 1)
        with capture() as captured:
            model(
                input_ids=input_ids[part, prompt_length:],
                attention_mask=mask,
                **continuation,
                **{cache_key: own},
                logits_to_keep=1,
                use_cache=True,
            )
        out[part, 1:] = captured[-1][:, :-1]
        del own, captured
    return out
