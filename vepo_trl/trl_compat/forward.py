"""GRPO's log-prob forward where TRL 1.16 gets a batch's inputs wrong: a chunk of text-only rows in a mixed batch
(`image_safe_forward`), a prefix LM's completion put in the bidirectional prefix (`causal_completion`). Each goes
through TRL's own call unchanged where TRL already does it right."""

from __future__ import annotations

import torch

from ..batch import mark_per_row_pixels, take_rows


def image_safe_forward(forward):
    """GRPO's log-prob forward (`forward`, bound), safe for chunks without an image.

    TRL 1.16 cuts a batch into chunks of `batch_size` rows and slices the image tensors per chunk; a chunk of
    text-only rows gets an empty `pixel_values` and the model fails (`torch.cat(): expected a non-empty list of
    Tensors`). With mixed data that comes at once under gradient accumulation or `steps_per_generation` > 1. Where a
    chunk would hold no image, the chunks are cut here (`take_rows`: a text-only chunk takes no pixel inputs, as a
    text-only batch) and each goes through TRL's forward whole; otherwise TRL's own call runs unchanged."""

    def run(model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
            compute_aux_loss=False, **multimodal):  # fmt: skip
        flags = {"compute_entropy": compute_entropy, "compute_aux_loss": compute_aux_loss}
        num_images = multimodal.get("num_images")
        rows = input_ids.size(0)
        multimodal = mark_per_row_pixels(multimodal, rows)
        size = batch_size or rows
        starts = range(0, rows, size)
        if (
            multimodal.get("pixel_values") is None
            or num_images is None
            or all(sum(num_images[start : start + size]) > 0 for start in starts)
        ):
            return forward(model, input_ids, attention_mask, logits_to_keep, batch_size, **flags, **multimodal)
        logps, entropies, aux = [], [], []
        for start in starts:
            chunk = torch.arange(start, min(start + size, rows), device=input_ids.device)
            chunk_inputs = {**dict.fromkeys(multimodal), **take_rows(multimodal, chunk)}
            out = forward(
                model, input_ids[chunk], attention_mask[chunk], logits_to_keep, None, **flags, **chunk_inputs
            )
            logps.append(out[0])
            entropies.append(out[1])
            aux.append(out[2])
        return (
            torch.cat(logps),
            torch.cat(entropies) if compute_entropy else None,
            torch.stack(aux).mean() if compute_aux_loss else None,
        )

    return run


def causal_completion(token_type_ids: torch.Tensor | None, completion_length: int) -> torch.Tensor | None:
    """A prefix-LM's `token_type_ids` `(B, P + T)` (0 = prefix, attended bidirectionally; 1 = suffix,
    causal) with the completion as suffix. TRL 1.16 extends the prompt's token types with zeros, which puts the
    completion in the bidirectional prefix: each completion token's log-prob then sees the tokens after it, while
    `generate` sampled it causally (transformers extends with ones there)."""
    if token_type_ids is None or completion_length == 0:
        return token_type_ids
    if bool((token_type_ids[:, -completion_length:] == 1).all()):
        return token_type_ids  # already causal (a TRL that extends with ones)
    fixed = token_type_ids.clone()
    fixed[:, -completion_length:] = 1
    return fixed
