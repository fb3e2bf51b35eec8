"""Per-image seeds of the perturbations: each image (or tile) seeded from its own content, the base seed and the
training step, with exact integer checksums, so a response sees the same perturbed image whichever rows share its
batch or process, on any device."""

from __future__ import annotations

import math

import torch

from ..utils import stable_seed


def image_seeds(pixel_values: torch.Tensor, image_grid_thw: torch.Tensor, seed: int, step: int) -> list[int]:
    """One seed per image from its content (exact integer checksums, the same on any device and in any batch),
    its grid, the base seed and the step."""
    counts = image_grid_thw.prod(-1).tolist()
    quantized = torch.round(pixel_values.detach().float() * 1024).long()
    device = quantized.device
    columns = torch.arange(1, quantized.shape[1] + 1, device=device)
    # Every index tensor on the pixels' device: CUDA's index_select rejects a CPU index
    image_index = torch.repeat_interleave(
        torch.arange(len(counts), device=device), torch.tensor(counts, dtype=torch.long, device=device)
    )
    local_row = torch.cat([torch.arange(1, c + 1, device=device) for c in counts]) if counts else image_index
    row_sum = quantized.sum(-1)
    weighted = (quantized * columns).sum(-1) * local_row
    totals = torch.zeros(len(counts), 2, dtype=torch.long, device=quantized.device)
    totals.index_add_(0, image_index, torch.stack([row_sum, weighted], -1))
    grids = image_grid_thw.tolist()
    return [stable_seed(seed, step, grid, a, b) for grid, (a, b) in zip(grids, totals.tolist())]


def _tile_content(tile: torch.Tensor) -> tuple[tuple[int, ...], int, int]:
    """A tile's `(C, H, W)` shape and exact integer checksums of its pixels (as `image_seeds`)."""
    quantized = torch.round(tile.detach().float() * 1024).long().flatten()
    positions = torch.arange(1, quantized.numel() + 1, device=quantized.device)
    return tuple(tile.shape), int(quantized.sum()), int((quantized * positions).sum())


def _content_seed(seed: int, step: int, content: tuple, repeat: int = 0) -> int:
    shape, total, weighted = content
    return stable_seed(seed, step, list(shape), total, weighted, *((repeat,) if repeat else ()))


def tile_seeds(tiles: torch.Tensor, seed: int, step: int) -> list[int]:
    """One seed per tile `(N, C, H, W)` from its content (exact integer checksums, as `image_seeds`), its shape, the
    base seed and the step."""
    return [_content_seed(seed, step, _tile_content(tile)) for tile in tiles]


def _tile_groups(pixel_values: torch.Tensor, tile_groups: list[int] | None) -> list[int]:
    """How many consecutive tiles make one image (or one response's images): the leading entry of a 5-D tensor
    (tiles per sample: a response; any-res crops: an image), else `tile_groups` (a flat run of tiles counted per
    response), else one tile each (whole images: one tile per image)."""
    count = math.prod(pixel_values.shape[:-3])
    if pixel_values.ndim >= 5:
        return [math.prod(pixel_values.shape[1:-3])] * pixel_values.shape[0]
    if tile_groups is not None:
        if sum(tile_groups) != count:
            raise ValueError(f"tile groups {list(tile_groups)} do not add up to the {count} tiles in pixel_values.")
        return list(tile_groups)
    return [1] * count


def _grouped_tile_seeds(tiles, sizes, groups: list[int], seed: int, step: int) -> list[int]:
    """One seed per tile from its content (exact integer checksums of its own pixels, as `tile_seeds`) and, where
    its image (or response) holds identical tiles before it, how many: a diagram's white background tiles get their
    own noise. Seeds depend on nothing after the tile nor outside its group (another image, padding, the batch)."""
    seeds, start = [], 0
    for size in groups:
        seen: dict[tuple, int] = {}
        for index in range(start, start + size):
            h, w = sizes[index]
            content = _tile_content(tiles[index, :, :h, :w])
            repeat = seen.get(content, 0)
            seen[content] = repeat + 1
            seeds.append(_content_seed(seed, step, content, repeat))  # the first of identical tiles: `tile_seeds`'
        start += size
    return seeds
