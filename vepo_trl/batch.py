"""Reading TRL's generation batches: which keys are multimodal, rows of a batch, which rows have an image, the loss mask.

A batch here is the dict `GRPOTrainer._generate_and_score_completions` returns (`prompt_ids`, `completion_ids`, the
masks, `advantages`, and the processor's multimodal outputs). Plain functions of that dict and its tensors, and `Batch`,
the typed view the selection reads them through (each derived value computed once per rollout or slice); nothing here
runs a model.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from functools import cached_property
from typing import Any

import torch
from trl import GRPOTrainer
from trl.trainer.utils import split_pixel_values_by_grid, unsplit_pixel_values_by_grid


# The multimodal inputs GRPO forwards to the model: the keyword arguments of its log-prob forward after the fixed ones,
# read from TRL itself so that a key TRL adds reaches VEPO's forwards too
_FIXED_FORWARD_ARGS = {
    "self",
    "model",
    "input_ids",
    "attention_mask",
    "logits_to_keep",
    "batch_size",
    "compute_entropy",
    "compute_aux_loss",
}
MULTIMODAL_KEYS: tuple[str, ...] = tuple(
    name
    for name in inspect.signature(GRPOTrainer._get_per_token_logps_and_entropies).parameters
    if name not in _FIXED_FORWARD_ARGS
)
# Of those, the ones that tell GRPO how to split a batch rather than being model inputs
_SPLIT_KEYS = ("num_images", "num_tiles")
MODEL_INPUT_KEYS: tuple[str, ...] = tuple(key for key in MULTIMODAL_KEYS if key not in _SPLIT_KEYS)
# Per-row token-type inputs, sliced with the rows
ROW_KEYS = ("token_type_ids", "mm_token_type_ids")


# Keys that tell TRL which rows of `pixel_values` belong to which image or response
_LAYOUT_KEYS = ("image_grid_thw", "image_position_ids", "spatial_shapes", "num_tiles", "image_sizes")


def per_row_pixels(inputs: dict[str, Any], rows: int) -> bool:
    """Tiles per sample: `pixel_values` `(rows, n_tiles, C, H, W)`, one padded entry per response, and no key that
    says so. TRL tells that layout from one entry per image by `pixel_values.size(0) == sum(num_images)`, which also
    holds for it whenever a batch has as many images as responses (two images and a text-only prompt, 1/0/2/1)."""
    pixel_values = inputs.get("pixel_values")
    return (
        isinstance(pixel_values, torch.Tensor)
        and pixel_values.dim() == 5
        and pixel_values.size(0) == rows
        and all(inputs.get(key) is None for key in _LAYOUT_KEYS)
    )


def mark_per_row_pixels(inputs: dict[str, Any], rows: int) -> dict[str, Any]:
    """Per-response pixels get `num_tiles` of 1 per response: TRL's split, shuffle and forward then cut them by
    response (`num_tiles` is TRL's own per-response tile count) instead of guessing per image."""
    return {**inputs, "num_tiles": [1] * rows} if per_row_pixels(inputs, rows) else inputs


def multimodal_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    """Every multimodal keyword of GRPO's log-prob forward, `None` where the batch has none."""
    return {key: inputs.get(key) for key in MULTIMODAL_KEYS}


def row_pieces(inputs: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Each response's own image inputs `{key: piece}` (its `num_images`, `num_tiles` and its pieces of every per-image
    tensor), cut with TRL's `split_pixel_values_by_grid` (the layout rules of every family TRL knows): views, no copy.
    `None` for a batch without `num_images`."""
    if inputs.get("num_images") is not None:
        inputs = mark_per_row_pixels(inputs, len(inputs["num_images"]))
    num_images = inputs.get("num_images")
    if num_images is None:
        return None
    rows = [{"num_images": n} for n in num_images]
    if inputs.get("num_tiles") is not None:  # tiles per response (a flat run of tiles): TRL's forward slices by them
        for row, tiles in zip(rows, inputs["num_tiles"]):
            row["num_tiles"] = tiles
    if inputs.get("pixel_values") is None:
        return rows
    present = {key: inputs[key] for key in MULTIMODAL_KEYS if inputs.get(key) is not None}
    split = split_pixel_values_by_grid(present)
    per_row = [key for key, value in split.items() if isinstance(value, list) and key not in _SPLIT_KEYS]
    for key in ("pixel_values", "pixel_attention_mask"):
        # One padded entry per response (tiles per sample and their mask): TRL's split leaves them as they are (or
        # splits only `pixel_values`), and its forward slices them by row, as here
        if key not in per_row and isinstance(split.get(key), torch.Tensor) and split[key].size(0) == len(rows):
            split = {**split, key: list(split[key].split(1))}
            per_row.append(key)
    for index, row in enumerate(rows):
        row.update({key: split[key][index] for key in per_row})
    return rows


_NOT_GIVEN = object()


def take_rows(inputs: Mapping[str, Any], rows: torch.Tensor, pieces=_NOT_GIVEN) -> dict[str, Any]:
    """The multimodal inputs of the responses `rows` `(n,)` (indices into the batch), in that order.

    Each response's pieces (`row_pieces`, or `pieces` already cut) are taken and merged back with TRL's
    `unsplit_pixel_values_by_grid`. Rows without any image take no pixel inputs at all, as in a text-only batch."""
    out: dict[str, Any] = {}
    rows_list = rows.tolist()
    if pieces is _NOT_GIVEN:
        pieces = row_pieces(inputs)
    if pieces is not None:
        chosen = [pieces[r] for r in rows_list]
        out["num_images"] = [row["num_images"] for row in chosen]
        if pieces and "num_tiles" in pieces[0]:  # TRL's, or 1 per response for per-response pixels
            out["num_tiles"] = [row["num_tiles"] for row in chosen]
        per_row = [key for key in pieces[0] if key not in ("num_images", "num_tiles")] if pieces else []
        if per_row:
            if sum(out["num_images"]) == 0:
                out.update(dict.fromkeys(per_row))
            elif rows_list == list(range(len(pieces))) and all(
                isinstance(inputs.get(k), torch.Tensor) for k in per_row
            ):
                # Every response in order: the pieces put back together are the tensors themselves (no copy)
                out.update({key: inputs[key] for key in per_row})
            else:
                out.update(unsplit_pixel_values_by_grid({key: [row[key] for row in chosen] for key in per_row}))
    for key in ROW_KEYS:
        if inputs.get(key) is not None:
            out[key] = inputs[key][rows.to(inputs[key].device)]
    return out


def sequence(inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt and completion as one sequence: `input_ids` and `attention_mask`, `(B, P + T)` each."""
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    return input_ids, torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)


def loss_mask(inputs: dict[str, Any]) -> torch.Tensor:
    """`(B, T)` bool: the completion tokens the loss reads (tool-written tokens excluded)."""
    mask = inputs["completion_mask"]
    if "tool_mask" in inputs:
        mask = mask * inputs["tool_mask"]
    return mask.bool()


def rows_with_image(num_images, pixel_values, like: torch.Tensor) -> torch.Tensor:
    """`(B,)` bool: responses whose prompt has an image, on `like`'s device."""
    if pixel_values is None or num_images is None:
        return torch.zeros(like.size(0), dtype=torch.bool, device=like.device)
    return torch.tensor([n > 0 for n in num_images], dtype=torch.bool, device=like.device)


def has_image(inputs: dict[str, Any]) -> torch.Tensor:
    return rows_with_image(inputs.get("num_images"), inputs.get("pixel_values"), inputs["completion_ids"])


class Batch(Mapping):
    """TRL's batch dict (one generation batch, or one slice of it), read through one object: the dict's keys as they
    are (writes go to the dict, which TRL keeps shuffling and splitting), and what VEPO derives from them (the loss
    mask, the whole sequence, the rows with an image, each row's image pieces) computed once, however many steps of
    the selection read them. `Batch.of` wraps a dict, and returns a view as it is."""

    def __init__(self, inputs: Mapping[str, Any]):
        self.inputs = inputs.inputs if isinstance(inputs, Batch) else inputs

    @classmethod
    def of(cls, inputs: Mapping[str, Any]) -> Batch:
        return inputs if isinstance(inputs, Batch) else cls(inputs)

    def __getitem__(self, key: str) -> Any:
        return self.inputs[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.inputs)

    def __len__(self) -> int:
        return len(self.inputs)

    @property
    def rows(self) -> int:
        return self.inputs["completion_ids"].size(0)

    @property
    def completion_length(self) -> int:
        return self.inputs["completion_ids"].size(1)

    @cached_property
    def sequence(self) -> tuple[torch.Tensor, torch.Tensor]:
        return sequence(self.inputs)

    @cached_property
    def valid(self) -> torch.Tensor:
        """`(B, T)` bool: the completion tokens that exist (the completion mask; tool-written tokens included)."""
        return self.inputs["completion_mask"].bool()

    @cached_property
    def loss_mask(self) -> torch.Tensor:
        return loss_mask(self.inputs)

    @cached_property
    def has_image(self) -> torch.Tensor:
        return has_image(self.inputs)

    @cached_property
    def multimodal(self) -> dict[str, Any]:
        return multimodal_inputs(self.inputs)

    @cached_property
    def row_pieces(self) -> list[dict[str, Any]] | None:
        return row_pieces(self.inputs)

    def take(self, rows: torch.Tensor) -> dict[str, Any]:
        """`take_rows` of this batch, cutting its image inputs by response once."""
        return take_rows(self.inputs, rows, self.row_pieces)


def row_images(examples: list[dict]) -> list[list] | None:
    """Each data row's images as TRL reads them (`images` list or `image`), `None` when TRL sees none."""
    if "images" in examples[0]:
        images = [example.get("images") or [] for example in examples]
    elif "image" in examples[0]:
        images = [[example["image"]] if example.get("image") is not None else [] for example in examples]
    else:
        return None
    return None if all(row == [] for row in images) else images
