"""Prompt tokenisation for processors whose text defaults pad or return tensors.

TRL 1.16 tokenises a batch's prompts in one unpadded `apply_chat_template` call and expects one list of ids per
prompt. A processor whose text defaults set `return_tensors="pt"` cannot stack prompts of different lengths, so
`GRPOTrainer` fails on any batch whose prompts differ in length ("Unable to create tensor, you should probably activate
truncation and/or padding"). One whose text defaults set `padding=True` pads them silently: TRL takes each shorter
prompt's padding for prompt tokens, generates after it and trains on it, attended to (a batch's prompts then
train differently with the batch around them). TRL itself works around the first failure for transformers 5.3 by
padding, then dropping the padding by the attention mask; `VEPOTrainer` does that for such processors, without
patching TRL. A TRL that pads itself (passes `padding`) goes through unchanged. Which families' processors do is read
off the processors (`text_pads`, `text_returns_tensors`; tests/test_families.py).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator

from ..utils import instance_override


# Per-token outputs of a processor, unpadded with the ids
_PER_TOKEN_KEYS = ("token_type_ids", "mm_token_type_ids")

__all__ = ["UnpaddedPromptIds", "needs_padding", "padded_then_unpadded", "text_pads", "text_returns_tensors"]


def needs_padding(processing_class) -> bool:
    """Whether TRL 1.16's unpadded tokenisation of unequal prompts fails (or pads) with this processor: its text
    defaults return tensors or pad, or it builds prefix-LM `labels` with `np.array` over the ragged ids."""
    return (
        text_returns_tensors(processing_class)
        or text_pads(processing_class)
        or "labels" in getattr(processing_class, "model_input_names", ())
    )


def _text_defaults(processing_class) -> dict:
    """The processor's text defaults: its `text_kwargs` over the older `_defaults` of its kwargs class."""
    defaults = dict(getattr(getattr(processing_class, "valid_processor_kwargs", None), "_defaults", None) or {})
    text = {**defaults.get("common_kwargs", {}), **defaults.get("text_kwargs", {})}
    text.update(getattr(processing_class, "text_kwargs", None) or {})
    return text if getattr(processing_class, "tokenizer", None) is not None else {}


def text_returns_tensors(processing_class) -> bool:
    """Whether the processor's text defaults return tensors (its `text_kwargs`, or the older
    `_defaults` of its kwargs class), so that an unpadded batch of unequal prompts cannot be tokenised."""
    return _text_defaults(processing_class).get("return_tensors") is not None


def text_pads(processing_class) -> bool:
    """Whether the processor's text defaults pad (its `text_kwargs`): an "unpadded" batch comes back
    padded, its padding in each shorter prompt's ids."""
    return _text_defaults(processing_class).get("padding") not in (None, False, "do_not_pad")


@contextlib.contextmanager
def padded_then_unpadded(processing_class) -> Iterator[None]:
    """While the block runs, a tokenising `apply_chat_template` call without `padding` pads, then returns each
    prompt's ids without the padding (lists, as an unpadded call does); every other call is unchanged."""
    original = processing_class.apply_chat_template
    # transformers 5 takes the processor's arguments in `processor_kwargs` (and warns about them among the others)
    takes_processor_kwargs = "processor_kwargs" in inspect.signature(original).parameters

    def apply_chat_template(*args, **kwargs):
        if (
            not (kwargs.get("tokenize") and kwargs.get("return_dict"))
            or "padding" in kwargs
            or "padding" in (kwargs.get("processor_kwargs") or {})
        ):
            return original(*args, **kwargs)
        if takes_processor_kwargs:
            out = original(
                *args, **{**kwargs, "processor_kwargs": {**(kwargs.get("processor_kwargs") or {}), "padding": True}}
            )
        else:
            out = original(*args, padding=True, **kwargs)
        mask = out["attention_mask"]
        mask = mask.tolist() if hasattr(mask, "tolist") else mask
        # Per-token fields go back to one list per prompt too (TRL pads them itself); `labels` are the processor's own
        # training targets, which TRL builds itself
        out.pop("labels", None)
        for key in ("input_ids", *_PER_TOKEN_KEYS):
            if key in out:
                value = out[key].tolist() if hasattr(out[key], "tolist") else out[key]
                out[key] = [[v for v, m in zip(row, keep, strict=True) if m] for row, keep in zip(value, mask)]
        out["attention_mask"] = [[1] * len(row) for row in out["input_ids"]]
        return out

    with instance_override(processing_class, "apply_chat_template", apply_chat_template):
        yield


class UnpaddedPromptIds:
    """`GRPOTrainer` mixin (ahead of it in the bases): prompts of different lengths are tokenised padded and unpadded
    where the processor returns tensors or pads by default; any other processor goes through TRL's call unchanged."""

    def _tokenize_prompts(self, prompts):
        if not needs_padding(self.processing_class):
            return super()._tokenize_prompts(prompts)
        with padded_then_unpadded(self.processing_class):
            return super()._tokenize_prompts(prompts)
