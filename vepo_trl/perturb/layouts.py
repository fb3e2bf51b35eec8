"""How a processor laid images out in `pixel_values`, and each layout's way of running a perturbation over them.

- `PixelLayout`: flattened patch rows + `image_grid_thw`, each row one patch laid out as `(channel, temporal copy, P,
  P)`. For a still image the processor stores the frame twice (the two temporal copies), so pixel-space noise is
  drawn once per pixel and shared by both copies;
- `ImageLayout`: whole normalised images or tiles `(..., C, H, W)`;
- `PositionedPatchLayout`: padded patch rows addressed by `image_position_ids`.

Every layout follows one protocol (`PerturbationLayout`): `perturb` runs a perturbation function image by image,
seeded per image (`seeds`). Which family uses which layout, with which options, is its module's
(`vepo_trl/families/`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from transformers.utils.constants import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

from .seeds import _content_seed, _grouped_tile_seeds, _tile_content, _tile_groups, image_seeds


# OpenAI CLIP statistics (transformers' own constants), the defaults of `Qwen2VLImageProcessor`
CLIP_MEAN, CLIP_STD = tuple(OPENAI_CLIP_MEAN), tuple(OPENAI_CLIP_STD)


class PerturbationLayout(Protocol):
    """What every layout gives the perturbations (`registry`): `perturb` runs a perturbation function over a batch's
    `pixel_values` image by image (seeded per image), and the function reads one image's unit through the rest:
    `to_unit` / `from_unit` ([0, 1] pixel space and back), `black`, `pixel_noise` (one draw per pixel of the image
    the vision tower sees) and `patch_drop` (the model's own patches)."""

    @property
    def channels(self) -> int: ...

    def perturb(self, fn, pixel_values: torch.Tensor, *, seed: int, step: int, params, **inputs) -> torch.Tensor: ...

    def to_unit(self, unit: torch.Tensor) -> torch.Tensor: ...

    def from_unit(self, unit: torch.Tensor, dtype: torch.dtype) -> torch.Tensor: ...

    def black(self, unit: torch.Tensor) -> torch.Tensor: ...

    def pixel_noise(self, unit: torch.Tensor, grid, generator: torch.Generator) -> torch.Tensor: ...

    def patch_drop(self, unit: torch.Tensor, generator: torch.Generator, probability: float) -> torch.Tensor: ...


@dataclass(frozen=True)
class PixelLayout:
    """How a processor turned images into `pixel_values` rows: normalisation and patch geometry."""

    image_mean: tuple[float, ...] = CLIP_MEAN
    image_std: tuple[float, ...] = CLIP_STD
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2

    @classmethod
    def from_image_processor(cls, image_processor) -> PixelLayout:
        """Read the layout off a `Qwen2VLImageProcessor` (or anything with the same attributes)."""
        mean, std = _stats_of(image_processor)
        return cls(
            image_mean=mean,
            image_std=std,
            patch_size=int(getattr(image_processor, "patch_size", 14)),
            temporal_patch_size=int(getattr(image_processor, "temporal_patch_size", 2)),
            merge_size=int(getattr(image_processor, "merge_size", 2)),
        )

    @property
    def channels(self) -> int:
        return len(self.image_mean)

    @property
    def row_size(self) -> int:
        return self.channels * self.temporal_patch_size * self.patch_size**2

    def _stats(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = torch.tensor(self.image_mean, dtype=torch.float32, device=rows.device).view(1, -1, 1)
        std = torch.tensor(self.image_std, dtype=torch.float32, device=rows.device).view(1, -1, 1)
        return mean, std

    def to_unit(self, rows: torch.Tensor) -> torch.Tensor:
        """Normalised rows `(R, row_size)` -> pixel values in [0, 1] space, fp32, shaped `(R, C, Tp * P * P)`."""
        mean, std = self._stats(rows)
        return rows.float().view(rows.shape[0], self.channels, -1) * std + mean

    def from_unit(self, unit: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Inverse of `to_unit`, back to `(R, row_size)` in `dtype`."""
        mean, std = self._stats(unit)
        return ((unit - mean) / std).reshape(unit.shape[0], -1).to(dtype)

    def black_row(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """One normalised row of black pixels (value 0 in [0, 1] space). `(row_size,)`"""
        unit = torch.zeros(1, self.channels, self.row_size // self.channels, device=device)
        return self.from_unit(unit, dtype)[0]

    # -- what a perturbation needs, shaped like one image's rows ----------------------------------------------------

    def black(self, rows: torch.Tensor) -> torch.Tensor:
        """Black pixels shaped like `rows`, normalised."""
        return self.black_row(rows.device, rows.dtype).expand_as(rows)

    def pixel_noise(self, rows: torch.Tensor, grid, generator: torch.Generator) -> torch.Tensor:
        """Standard normal noise, one draw per pixel of the resized frame, shaped like `to_unit(rows)`."""
        return _pixel_noise(grid, self, generator, rows.device)

    def patch_drop(self, rows: torch.Tensor, generator: torch.Generator, probability: float) -> torch.Tensor:
        """`(R, 1)` bool: each of the model's patches (one row) dropped with `probability`."""
        return (torch.rand(rows.shape[0], generator=generator, device=rows.device) < probability).unsqueeze(-1)

    # -- the layout protocol's `perturb` ---------------------------------------------------------------------------

    def perturb(self, fn, pixel_values: torch.Tensor, *, seed: int, step: int, params, image_grid_thw=None, **_):
        """Patch rows `(sum_i t*h*w, row_size)`, `image_grid_thw` saying which rows are which image: each image's
        rows perturbed by `fn` at once, seeded from its content (`seeds.image_seeds`)."""
        if image_grid_thw is None:
            raise ValueError("Patch-row pixel_values need their image_grid_thw.")
        if pixel_values.ndim != 2 or pixel_values.shape[1] != self.row_size:
            raise ValueError(
                f"Expected patch-row pixel_values of shape (rows, {self.row_size}), got {tuple(pixel_values.shape)}."
            )
        counts = self.row_counts(image_grid_thw)
        if sum(counts) != pixel_values.shape[0]:
            raise ValueError(
                f"image_grid_thw accounts for {sum(counts)} rows but pixel_values has {pixel_values.shape[0]}."
            )
        seeds = image_seeds(pixel_values, image_grid_thw, seed, step)
        perturbed = []
        for rows, grid, image_seed in zip(pixel_values.split(counts), image_grid_thw.tolist(), seeds):
            generator = torch.Generator(device=pixel_values.device).manual_seed(image_seed)
            perturbed.append(fn(rows, grid, self, generator, **params))
        return torch.cat(perturbed) if perturbed else pixel_values.clone()

    def row_counts(self, image_grid_thw: torch.Tensor) -> list[int]:
        """Rows per image of a still-image batch (`t = 1`, grids a multiple of `merge_size`)."""
        if image_grid_thw.ndim != 2 or image_grid_thw.shape[-1] != 3:
            raise ValueError(f"image_grid_thw must be (num_images, 3), got {tuple(image_grid_thw.shape)}.")
        grids = image_grid_thw.tolist()
        for t, h, w in grids:
            if t != 1:
                raise ValueError(f"Perturbations apply to still images (grid t = 1), got a grid with t = {t}.")
            if h % self.merge_size or w % self.merge_size:
                raise ValueError(f"Image grid ({h}, {w}) is not a multiple of merge_size {self.merge_size}.")
        return [t * h * w for t, h, w in grids]


@dataclass(frozen=True)
class ImageLayout:
    """`pixel_values` holding whole normalised images or tiles, channels before height and width (`(..., C, H, W)`):
    whole images `(n_images, C, H, W)`, tiles per sample `(B, n_tiles, C, H, W)`, any-res crops
    `(n_images, n_crops, C, H, W)`. The unit a perturbation sees is one tile `(C, H, W)`; the vision tower cuts it into
    `patch_size` squares from the top-left corner (a remainder the patch convolution never reads stays as it is).

    A tile whose values are all exactly 0 is padding (a processor that pads a sample's tiles with zeros and a model
    that drops them by that test; any-res crops that `image_sizes` then skips): perturbations leave it as it is. With
    `zero_tile_is_padding` the model itself drops all-zero tiles, so a perturbed tile that comes out all 0 (the mean
    image) gets its first value set to the dtype's smallest normal number (1e-38 in fp32) to stay an image. With
    `crop_to_image_sizes` (images of one batch padded with zeros to the largest, `image_sizes` the real height and
    width; or `crop_to_pixel_mask`, where `pixel_attention_mask` tells them), only each
    image's own top-left `(h, w)` pixels are perturbed, seeded and noised, so a prompt's perturbed image does not
    depend on what else is in its batch."""

    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)
    patch_size: int = 14
    zero_tile_is_padding: bool = False
    crop_to_image_sizes: bool = False
    # Images of one batch padded (bottom, right) with zeros to the largest, `pixel_attention_mask` marking
    # each tile's real pixels: only those are perturbed, seeded and noised
    crop_to_pixel_mask: bool = False
    # Any-res crops: the processor's resolutions and crop size, to tell each crop's letterbox
    # padding from the image (`anyres_boxes`); empty for every other layout
    grid_pinpoints: tuple[tuple[int, int], ...] = ()
    crop_size: tuple[int, int] | None = None

    @classmethod
    def from_image_processor(cls, image_processor, patch_size: int, **options) -> ImageLayout:
        mean, std = _stats_of(image_processor)
        pinpoints = getattr(image_processor, "image_grid_pinpoints", None)
        if pinpoints and "grid_pinpoints" not in options:
            options["grid_pinpoints"] = tuple(tuple(int(v) for v in point) for point in pinpoints)
            options["crop_size"] = _crop_size(image_processor)
        return cls(image_mean=mean, image_std=std, patch_size=int(patch_size), **options)

    @property
    def channels(self) -> int:
        return len(self.image_mean)

    def _stats(self, tile: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = torch.tensor(self.image_mean, dtype=torch.float32, device=tile.device).view(-1, 1, 1)
        std = torch.tensor(self.image_std, dtype=torch.float32, device=tile.device).view(-1, 1, 1)
        return mean, std

    def to_unit(self, tile: torch.Tensor) -> torch.Tensor:
        """A normalised tile `(C, H, W)` -> pixel values in [0, 1] space, fp32."""
        mean, std = self._stats(tile)
        return tile.float() * std + mean

    def from_unit(self, unit: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        mean, std = self._stats(unit)
        return ((unit - mean) / std).to(dtype)

    def black(self, tile: torch.Tensor) -> torch.Tensor:
        return self.from_unit(torch.zeros(self.channels, 1, 1, device=tile.device), tile.dtype).expand_as(tile)

    def pixel_noise(self, tile: torch.Tensor, grid, generator: torch.Generator) -> torch.Tensor:
        return torch.randn(tile.shape, generator=generator, device=tile.device)

    def patch_drop(self, tile: torch.Tensor, generator: torch.Generator, probability: float) -> torch.Tensor:
        """`(1, H, W)` bool: each `patch_size` square the vision tower reads dropped with `probability`."""
        height, width = tile.shape[-2:]
        p = self.patch_size
        drop = torch.rand((height // p, width // p), generator=generator, device=tile.device) < probability
        mask = torch.zeros((height, width), dtype=torch.bool, device=tile.device)
        mask[: height // p * p, : width // p * p] = drop.repeat_interleave(p, 0).repeat_interleave(p, 1)
        return mask.unsqueeze(0)

    def perturb(self, fn, pixel_values, *, seed: int, step: int, params, image_sizes=None, tile_groups=None,
                pixel_attention_mask=None, **_):  # fmt: skip
        """Tiles `(..., C, H, W)`, each perturbed on its own: `image_sizes` `(n, 2)` crops each image's padding off
        when the layout says so; `tile_groups` counts the tiles of each response in a flat tile tensor (TRL's
        `num_tiles`), so each tile is seeded from its image and its position there; `pixel_attention_mask` marks each
        tile's real pixels where the layout crops by it."""
        return _perturb_tiles(
            fn, pixel_values, self, image_sizes, seed, step, params, tile_groups, pixel_attention_mask
        )


@dataclass(frozen=True)
class PositionedPatchLayout:
    """`pixel_values` `(n_images, max_patches, P * P * C)`: each image's `P x P` patches as rows (channels last within a
    row), zero-padded to one count for every image, with `image_position_ids` `(n_images, max_patches, 2)` the only
    record of where each row lies: its (column, row) on the image's patch grid, -1 for a padding row.

    The unit a perturbation sees is the image put back together from its real rows, `(C, rows * P, cols * P)`, so noise
    and dropped patches land on the model's own patch grid; padding rows stay as they are. The padded length is the
    processor's (`max_soft_tokens` x pooling^2), the same for every image, so an image is perturbed alike alone and in
    any batch."""

    image_mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    image_std: tuple[float, ...] = (1.0, 1.0, 1.0)
    patch_size: int = 16

    @classmethod
    def from_image_processor(cls, image_processor) -> PositionedPatchLayout:
        mean, std = _stats_of(image_processor)
        return cls(image_mean=mean, image_std=std, patch_size=int(image_processor.patch_size))

    @property
    def channels(self) -> int:
        return len(self.image_mean)

    @property
    def row_size(self) -> int:
        return self.channels * self.patch_size**2

    @property
    def image_layout(self) -> ImageLayout:
        """What the perturbations read for one reassembled image: its statistics and patch size."""
        return ImageLayout(image_mean=self.image_mean, image_std=self.image_std, patch_size=self.patch_size)

    def real_rows(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For one image's `(max_patches, 2)` positions: the mask of its real rows and their columns and rows."""
        real = (positions >= 0).all(-1)
        return real, positions[real, 0].long(), positions[real, 1].long()

    def to_image(self, rows: torch.Tensor, columns: torch.Tensor, grid_rows: torch.Tensor) -> torch.Tensor:
        """One image's real rows `(n, P * P * C)` -> the image `(C, H, W)` they were cut from."""
        p, c = self.patch_size, self.channels
        height, width = int(grid_rows.max()) + 1, int(columns.max()) + 1
        if rows.shape[0] != height * width or len(set(zip(grid_rows.tolist(), columns.tolist()))) != rows.shape[0]:
            raise ValueError(
                f"image_position_ids place {rows.shape[0]} patches on a {height} x {width} grid: each cell once expected."
            )
        image = rows.new_zeros(c, height, p, width, p)
        # The two index tensors around a slice put the patch dimension first: (n, C, P, P)
        image[:, grid_rows, :, columns, :] = rows.view(-1, p, p, c).permute(0, 3, 1, 2)
        return image.view(c, height * p, width * p)

    def to_rows(self, image: torch.Tensor, columns: torch.Tensor, grid_rows: torch.Tensor) -> torch.Tensor:
        """Inverse of `to_image`: the image's patches as rows in the order `columns` / `grid_rows` give."""
        p, c = self.patch_size, self.channels
        cells = image.reshape(c, image.shape[-2] // p, p, image.shape[-1] // p, p)[:, grid_rows, :, columns, :]
        return cells.permute(0, 2, 3, 1).reshape(-1, p * p * c)

    def perturb(self, fn, pixel_values, *, seed: int, step: int, params, image_position_ids=None, **_):
        """Padded patch rows `(n_images, max_patches, row_size)`, `image_position_ids` saying where each lies (-1:
        padding): each image put back together, perturbed as one tile and cut into the same rows again."""
        return _perturb_positioned(fn, pixel_values, self, image_position_ids, seed, step, params)


def _crop_size(image_processor) -> tuple[int, int]:
    """The side of an any-res processor's crops: `crop_size`, else `size` (as the processor itself picks it)."""
    for name in ("crop_size", "size"):
        size = getattr(image_processor, name, None)
        if size is None:
            continue
        size = dict(size) if not isinstance(size, dict) else size
        if size.get("height"):
            return int(size["height"]), int(size.get("width") or size["height"])
        if size.get("shortest_edge"):
            return int(size["shortest_edge"]), int(size["shortest_edge"])
    raise ValueError(f"{type(image_processor).__name__} has no crop size to cut its any-res canvas with.")


def anyres_boxes(
    image_size: tuple[int, int], grid_pinpoints, crop_size: tuple[int, int]
) -> list[tuple[int, int, int, int] | None]:
    """An any-res image's tiles as its processor makes them, each with the box `(top, bottom, left, right)` of its
    real pixels (None: letterbox padding only): first the whole image resized to one crop (all real), then the crops
    of the canvas (the image resized into the best resolution keeping its aspect ratio, centred, padded with black),
    row by row. The geometry is transformers' own (`select_best_resolution`, `get_patch_output_size`, the centred
    paste of `_get_padding_size`)."""
    from transformers.image_processing_utils import get_patch_output_size, select_best_resolution
    from transformers.image_utils import ChannelDimension

    height, width = (int(v) for v in image_size)
    best = select_best_resolution((height, width), [list(point) for point in grid_pinpoints])
    shape_only = torch.empty(1, height, width, device="meta")
    new_height, new_width = get_patch_output_size(shape_only, best, ChannelDimension.FIRST)
    top, left = (best[0] - new_height) // 2, (best[1] - new_width) // 2
    crop_height, crop_width = crop_size
    boxes: list[tuple[int, int, int, int] | None] = [(0, crop_height, 0, crop_width)]
    for y in range(0, best[0], crop_height):
        for x in range(0, best[1], crop_width):
            box = (
                max(top - y, 0),
                min(top + new_height - y, crop_height),
                max(left - x, 0),
                min(left + new_width - x, crop_width),
            )
            boxes.append(box if box[0] < box[1] and box[2] < box[3] else None)
    return boxes


def _stats_of(image_processor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std a processor normalises with (scalars repeated over 3 channels; mean 0, std 1 when
    it does not normalise)."""
    if getattr(image_processor, "do_normalize", True) is False:
        return (0.0,) * 3, (1.0,) * 3
    mean, std = image_processor.image_mean, image_processor.image_std
    channels = len(mean) if isinstance(mean, (list, tuple)) else 3
    mean = tuple(float(m) for m in mean) if isinstance(mean, (list, tuple)) else (float(mean),) * channels
    std = tuple(float(v) for v in std) if isinstance(std, (list, tuple)) else (float(std),) * channels
    return mean, std


def patchify(frame: torch.Tensor, layout: PixelLayout) -> torch.Tensor:
    """A `(C, H, W)` frame -> `(H/P * W/P, row_size)` rows in the processor's order, the frame repeated over the
    temporal copies. Same reshape as `Qwen2VLImageProcessor.patchify`, so tests can compare the two."""
    channels, height, width = frame.shape
    p, m = layout.patch_size, layout.merge_size
    grid_h, grid_w = height // p, width // p
    patches = frame.reshape(channels, grid_h // m, m, p, grid_w // m, m, p)
    patches = patches.permute(1, 4, 2, 5, 0, 3, 6)  # (gh/m, gw/m, m, m, C, P, P)
    patches = patches.unsqueeze(5).expand(-1, -1, -1, -1, -1, layout.temporal_patch_size, -1, -1)
    return patches.reshape(grid_h * grid_w, layout.row_size)


def _pixel_noise(grid: list[int], layout: PixelLayout, generator: torch.Generator, device) -> torch.Tensor:
    # Standard normal noise per pixel of the resized frame, patchified like the processor (shared by temporal copies)
    _, grid_h, grid_w = grid
    frame = torch.randn(
        (layout.channels, grid_h * layout.patch_size, grid_w * layout.patch_size), generator=generator, device=device
    )
    return patchify(frame, layout).view(-1, layout.channels, layout.row_size // layout.channels)


def _real_sizes(tiles: torch.Tensor, layout: ImageLayout, image_sizes, pixel_mask) -> list[tuple[int, int]]:
    """Each tile's own top-left `(h, w)`: the whole tile, or its image's size where a batch pads images to its
    largest (`image_sizes`, or `pixel_attention_mask`)."""
    if layout.crop_to_image_sizes and image_sizes is not None:
        if len(image_sizes) != tiles.shape[0]:
            raise ValueError(f"{len(image_sizes)} image_sizes for {tiles.shape[0]} images in pixel_values.")
        return [tuple(int(v) for v in size) for size in image_sizes]
    if layout.crop_to_pixel_mask and pixel_mask is not None:
        masks = pixel_mask.reshape(-1, *pixel_mask.shape[-2:]).bool()
        if masks.shape[0] != tiles.shape[0]:
            raise ValueError(f"pixel_attention_mask has {masks.shape[0]} tiles, pixel_values {tiles.shape[0]}.")
        return [(int(m.any(1).sum()), int(m.any(0).sum())) for m in masks]
    return [tuple(tiles.shape[-2:])] * tiles.shape[0]


def _perturb_tiles(
    fn, pixel_values: torch.Tensor, layout: ImageLayout, image_sizes, seed: int, step: int, params, tile_groups=None,
    pixel_mask=None,
) -> torch.Tensor:  # fmt: skip
    if pixel_values.ndim < 3 or pixel_values.shape[-3] != layout.channels:
        raise ValueError(
            f"Expected pixel_values shaped (..., {layout.channels}, H, W), got {tuple(pixel_values.shape)}."
        )
    tiles = pixel_values.reshape(-1, *pixel_values.shape[-3:])
    out = tiles.clone()
    # The image's own pixels: the whole tile, or its top-left (h, w) when images are padded to the batch's largest
    sizes = _real_sizes(tiles, layout, image_sizes, pixel_mask)
    seeds = _grouped_tile_seeds(tiles, sizes, _tile_groups(pixel_values, tile_groups), seed, step)
    boxes = letterbox_boxes(pixel_values, layout, image_sizes)
    for index in range(tiles.shape[0]):
        h, w = sizes[index]
        tile = tiles[index, :, :h, :w]
        if not bool((tile != 0).any()) or (boxes is not None and boxes[index] is None):
            continue  # padding: a zero tile, or an any-res crop of letterbox only
        generator = torch.Generator(device=pixel_values.device).manual_seed(seeds[index])
        if layout.crop_to_pixel_mask:
            perturbed = _perturb_on_patch_grid(fn, tile, layout, generator, params)
        else:
            perturbed = fn(tile, None, layout, generator, **params)
        if boxes is not None:
            # The whole crop is perturbed (patches stay on the crop's own grid), then its letterbox is put back
            top, bottom, left, right = boxes[index]
            kept = perturbed
            perturbed = tile.clone()
            perturbed[:, top:bottom, left:right] = kept[:, top:bottom, left:right]
        if layout.zero_tile_is_padding and not bool((perturbed != 0).any()):
            perturbed = perturbed.clone()
            perturbed.view(-1)[0] = torch.finfo(perturbed.dtype).tiny  # still an image to a model that drops zeros
        out[index, :, :h, :w] = perturbed
    return out.view_as(pixel_values)


def _perturb_on_patch_grid(fn, tile: torch.Tensor, layout: ImageLayout, generator, params) -> torch.Tensor:
    """An image `(C, h, w)` perturbed on the whole patches that cover it (a model may count a patch with any real pixel
    as real, so the last row and column of patches may be part padding), the padding then cut off again: the noise
    and the patches dropped depend on the image alone, not on the batch's padding."""
    p = layout.patch_size
    h, w = tile.shape[-2:]
    grid = tile.new_zeros(tile.shape[0], -(-h // p) * p, -(-w // p) * p)
    grid[:, :h, :w] = tile
    return fn(grid, None, layout, generator, **params)[:, :h, :w]


def letterbox_boxes(pixel_values, layout: ImageLayout, image_sizes) -> list | None:
    """Per tile of an any-res batch `(n_images, n_crops, C, H, W)`, the box of its real pixels (`anyres_boxes`; the
    batch's padding crops after an image's own: None); None when the layout is not any-res."""
    if not layout.grid_pinpoints or image_sizes is None or pixel_values.ndim != 5:
        return None
    if len(image_sizes) != pixel_values.shape[0]:
        raise ValueError(f"{len(image_sizes)} image_sizes for {pixel_values.shape[0]} images in pixel_values.")
    per_image = pixel_values.shape[1]
    boxes = []
    for size in image_sizes:
        own = anyres_boxes(tuple(int(v) for v in size), layout.grid_pinpoints, layout.crop_size)[:per_image]
        boxes += own + [None] * (per_image - len(own))
    return boxes


def _perturb_positioned(fn, pixel_values, layout: PositionedPatchLayout, positions, seed, step, params):
    """Each image of a `PositionedPatchLayout` batch put back together from its real rows, perturbed as one tile
    (seeded from its content, as `tile_seeds`), and cut into the same rows again; padding rows untouched."""
    if positions is None:
        raise ValueError("pixel_values of padded patch rows need their image_position_ids.")
    expected = (pixel_values.shape[0], pixel_values.shape[1], 2) if pixel_values.ndim == 3 else None
    if pixel_values.ndim != 3 or pixel_values.shape[-1] != layout.row_size or tuple(positions.shape) != expected:
        raise ValueError(
            f"Expected pixel_values (n_images, max_patches, {layout.row_size}) and image_position_ids "
            f"(n_images, max_patches, 2), got {tuple(pixel_values.shape)} and {tuple(positions.shape)}."
        )
    tile_layout = layout.image_layout
    out = pixel_values.clone()
    for index in range(pixel_values.shape[0]):
        real, columns, grid_rows = layout.real_rows(positions[index].to(pixel_values.device))
        if not bool(real.any()):
            continue  # an image slot with no patch
        image = layout.to_image(pixel_values[index][real], columns, grid_rows)
        generator = torch.Generator(device=pixel_values.device).manual_seed(
            _content_seed(seed, step, _tile_content(image))
        )
        perturbed = fn(image, None, tile_layout, generator, **params)
        out[index, real] = layout.to_rows(perturbed, columns, grid_rows).to(out.dtype)
    return out
