"""Image perturbations for VEPO's counterfactual pass, applied to a processor's `pixel_values`.

TRL keeps the processed `pixel_values` of a rollout, not the raw images, so the perturbations work there, on the
normalised tensor, through a layout that knows its shape (`families` picks the layout of each model family):

- `PixelLayout`: flattened patch rows + `image_grid_thw`, each row one patch laid out as `(channel, temporal copy, P,
  P)`. For a still image the processor stores the frame twice (the two temporal copies), so pixel-space noise is
  drawn once per pixel and shared by both copies;
- `ImageLayout`: whole normalised images or tiles `(..., C, H, W)`;
- `PositionedPatchLayout`: padded patch rows addressed by `image_position_ids`.

Which family uses which layout, with which options, is its module's (`vepo_trl/families/`).

Why on the normalised tensor and not on the image before the processor: the processor's resize is the only step
between the two, and it runs before normalisation, so un-normalising to [0, 1] (the rescaled image), perturbing,
clamping and re-normalising equals perturbing the resized image and running the processor again, exactly, on every
family; and the raw images are gone by the time VEPO scores a rollout. So each perturbation means the same on every
family: `diffusion` the same [0, 1]-space noise per pixel of the image the vision tower sees, `black_image` and
`mean_image` the same colours, `patch_blackout` the model's own patches (a row of `PixelLayout`, a `patch_size`
square of an `ImageLayout` tile), `gaussian` the release's noise on the normalised values. Tiled families perturb
each tile (a crop or the downscaled whole image) on its own: the noise per pixel is the same law whatever the tiling.

Every perturbation is seeded per image from the image's own content, the base seed and the training step (a tile from
its image's content and its position in it, so identical tiles get their own noise): a response sees the same
perturbed image whichever rows share its batch or process. Inputs are never modified.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch
from transformers.utils.constants import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

from .utils import stable_seed


__all__ = [
    "PixelLayout",
    "ImageLayout",
    "PositionedPatchLayout",
    "tile_seeds",
    "PERTURBATIONS",
    "register_perturbation",
    "get_perturbation",
    "perturb_pixel_values",
    "diffusion_alpha_bar",
    "annealed_noise_step",
    "image_seeds",
    "patchify",
    "RELEASE_NUM_GENERATIONS",
]

# OpenAI CLIP statistics (transformers' own constants), the defaults of `Qwen2VLImageProcessor`
CLIP_MEAN, CLIP_STD = tuple(OPENAI_CLIP_MEAN), tuple(OPENAI_CLIP_STD)


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


# ---------------------------------------------------------------------------------------------------------------------
# Noise schedule
# ---------------------------------------------------------------------------------------------------------------------


@lru_cache(maxsize=4)
def _alpha_bars(num_steps: int) -> tuple[float, ...]:
    # NoisyRollout's schedule: sigmoid-spaced betas from 1e-5 to 5e-3 over `num_steps`, abar = cumprod(1 - beta)
    # cpu: a 1000-entry schedule read back as Python floats
    betas = torch.sigmoid(torch.linspace(-6.0, 6.0, num_steps, dtype=torch.float64)) * (5e-3 - 1e-5) + 1e-5
    return tuple(torch.cumprod(1.0 - betas, dim=0).tolist())


def diffusion_alpha_bar(noise_step: int, num_steps: int = 1000) -> float:
    """`abar_tau` of the paper's diffusion noise at 0-based step `tau` (tau=500: 0.7448)."""
    if not 0 <= noise_step < num_steps:
        raise ValueError(f"noise_step must be in [0, {num_steps - 1}], got {noise_step}.")
    return _alpha_bars(num_steps)[noise_step]


def annealed_noise_step(
    training_step: int, total_steps: int, noise_step: int = 500, coefficient: float = 30.0, midpoint: int = 40
) -> int:
    """Sigmoid decay of the noise step over training (NoisyRollout): `int(tau0 * (1 - sigmoid(c (s - mid) / S)))`.

    With tau0=500, c=30, mid=40 and 160 total steps: 499 at step 0, 250 at 40, 0 from 80 on.
    """
    if total_steps <= 0:
        raise ValueError(f"total_steps must be positive to anneal the noise step, got {total_steps}.")
    x = coefficient * (training_step - midpoint) / total_steps
    # 1 - sigmoid(x) = sigmoid(-x), written so that neither branch overflows for large |x|
    keep = 1.0 / (1.0 + math.exp(x)) if x <= 0 else math.exp(-x) / (1.0 + math.exp(-x))
    return int(noise_step * keep)


# ---------------------------------------------------------------------------------------------------------------------
# Per-image seeds
# ---------------------------------------------------------------------------------------------------------------------


def _image_row_counts(image_grid_thw: torch.Tensor, layout: PixelLayout) -> list[int]:
    if image_grid_thw.ndim != 2 or image_grid_thw.shape[-1] != 3:
        raise ValueError(f"image_grid_thw must be (num_images, 3), got {tuple(image_grid_thw.shape)}.")
    grids = image_grid_thw.tolist()
    for t, h, w in grids:
        if t != 1:
            raise ValueError(f"Perturbations apply to still images (grid t = 1), got a grid with t = {t}.")
        if h % layout.merge_size or w % layout.merge_size:
            raise ValueError(f"Image grid ({h}, {w}) is not a multiple of merge_size {layout.merge_size}.")
    return [t * h * w for t, h, w in grids]


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


# ---------------------------------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------------------------------

# fn(rows (R_i, row_size), grid (t, h, w), layout, generator, **params) -> perturbed rows, one image at a time
PerturbationFn = Callable[..., torch.Tensor]
PERTURBATIONS: dict[str, PerturbationFn] = {}


def register_perturbation(name: str):
    """Register a perturbation under `name` (decorator). Registering a name twice is an error."""

    def decorator(fn: PerturbationFn) -> PerturbationFn:
        if name in PERTURBATIONS:
            raise ValueError(f"A perturbation named {name!r} is already registered.")
        PERTURBATIONS[name] = fn
        return fn

    return decorator


def perturbation_reads(name: str) -> frozenset[str]:
    """The settings a perturbation takes (`noise_step`, `sigma`, `patch_probability`, ...): its keyword-only
    parameters, as its function declares them."""
    import inspect

    parameters = inspect.signature(get_perturbation(name)).parameters.values()
    return frozenset(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)


def get_perturbation(name: str) -> PerturbationFn:
    try:
        return PERTURBATIONS[name]
    except KeyError:
        raise ValueError(f"Unknown perturbation {name!r}. Valid perturbations: {sorted(PERTURBATIONS)}.") from None


def _pixel_noise(grid: list[int], layout: PixelLayout, generator: torch.Generator, device) -> torch.Tensor:
    # Standard normal noise per pixel of the resized frame, patchified like the processor (shared by temporal copies)
    _, grid_h, grid_w = grid
    frame = torch.randn(
        (layout.channels, grid_h * layout.patch_size, grid_w * layout.patch_size), generator=generator, device=device
    )
    return patchify(frame, layout).view(-1, layout.channels, layout.row_size // layout.channels)


@register_perturbation("diffusion")
def diffusion_noise(rows, grid, layout, generator, *, noise_step: int = 500, **_):
    """The paper's perturbation: `I' = sqrt(abar) I + sqrt(1 - abar) eps` in [0, 1] pixel space, clamped."""
    alpha_bar = diffusion_alpha_bar(noise_step)
    unit = layout.to_unit(rows)
    noise = layout.pixel_noise(rows, grid, generator)
    noisy = (math.sqrt(alpha_bar) * unit + math.sqrt(1.0 - alpha_bar) * noise).clamp_(0.0, 1.0)
    return layout.from_unit(noisy, rows.dtype)


@register_perturbation("gaussian")
def gaussian_noise(rows, grid, layout, generator, *, sigma: float = 2.0, **_):
    """The authors' released code: `N(0, sigma^2)` added to the normalised values, no clamp, no schedule."""
    noise = torch.randn(rows.shape, generator=generator, device=rows.device, dtype=torch.float32)
    return (rows.float() + sigma * noise).to(rows.dtype)


# Rollouts per prompt in the authors' released scripts (`worker.rollout.n=12`)
RELEASE_NUM_GENERATIONS = 12


@register_perturbation("gaussian_release")
def gaussian_release_noise(
    rows, grid, layout, generator, *, sigma: float = 2.0, num_generations: int = RELEASE_NUM_GENERATIONS, **_
):
    """The release as it actually runs: noise accumulated once per rollout, `N(0, (sigma * sqrt(n))^2)`, n the
    rollouts per prompt (`num_generations`; 12 in the paper, 6.93 at sigma 2)."""
    # In the release (commit 4247308) a prompt's n rollouts share one input dict and each adds N(0, sigma^2) to the
    # same `pixel_values` in place, so the image is scored with the sum of n draws (std sigma * sqrt(n): 6.93 for
    # sigma 2, n 12), and all n rollouts see that one noisy image. Seeding per image content already gives every
    # rollout of a prompt the same draw here.
    return gaussian_noise(rows, grid, layout, generator, sigma=sigma * math.sqrt(num_generations))


@register_perturbation("mean_image")
def mean_image(rows, grid, layout, generator, **_):
    """The release's "masked image": zeros in normalised space, i.e. every pixel at the dataset mean colour."""
    return torch.zeros_like(rows)


@register_perturbation("black_image")
def black_image(rows, grid, layout, generator, **_):
    """Every pixel black (0 in [0, 1] space)."""
    return layout.black(rows).clone()


@register_perturbation("patch_blackout")
def patch_blackout(rows, grid, layout, generator, *, patch_probability: float = 0.5, **_):
    """Each of the model's patches (its vision tower's patch size, e.g. 14x14 or 16x16) blacked out with probability
    `patch_probability` (VPPO: 0.5, PAPO: 0.6)."""
    return torch.where(layout.patch_drop(rows, generator, patch_probability), layout.black(rows), rows)


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


def perturb_pixel_values(
    name: str,
    pixel_values: torch.Tensor,
    image_grid_thw: torch.Tensor | None,
    layout: PixelLayout | ImageLayout | PositionedPatchLayout | None = None,
    *,
    seed: int = 0,
    step: int = 0,
    image_sizes: torch.Tensor | None = None,
    tile_groups: list[int] | None = None,
    pixel_attention_mask: torch.Tensor | None = None,
    image_position_ids: torch.Tensor | None = None,
    **params,
) -> torch.Tensor:
    """Perturb every image in a batch's `pixel_values` with the named perturbation.

    With a `PixelLayout`, `pixel_values` are patch rows `(sum_i t*h*w, row_size)` and
    `image_grid_thw` says which rows are which image; with an `ImageLayout` (every other family), `pixel_values`
    are `(..., C, H, W)` tiles, each perturbed on its own (`image_grid_thw` is not used; `image_sizes` `(n, 2)` crops
    each image's padding off when the layout says so; `tile_groups` counts the tiles of each response in a flat tile
    tensor, TRL's `num_tiles`, so that each tile is seeded from its image and its position there;
    `pixel_attention_mask` marks each tile's real pixels where the layout crops by it). With a
    `PositionedPatchLayout`, `pixel_values` are padded patch rows `(n_images, max_patches, row_size)` and
    `image_position_ids` says where each lies (-1: padding).
    `params` go to the
    perturbation (`noise_step`, `sigma`, `patch_probability`); ones it does not use are ignored. Returns a new tensor
    of the same shape and dtype.
    """
    layout = layout or PixelLayout()
    fn = get_perturbation(name)
    if isinstance(layout, PositionedPatchLayout):
        return _perturb_positioned(fn, pixel_values, layout, image_position_ids, seed, step, params)
    if isinstance(layout, ImageLayout):
        return _perturb_tiles(
            fn, pixel_values, layout, image_sizes, seed, step, params, tile_groups, pixel_attention_mask
        )
    if image_grid_thw is None:
        raise ValueError("Patch-row pixel_values need their image_grid_thw.")
    if pixel_values.ndim != 2 or pixel_values.shape[1] != layout.row_size:
        raise ValueError(
            f"Expected patch-row pixel_values of shape (rows, {layout.row_size}), got {tuple(pixel_values.shape)}."
        )
    counts = _image_row_counts(image_grid_thw, layout)
    if sum(counts) != pixel_values.shape[0]:
        raise ValueError(
            f"image_grid_thw accounts for {sum(counts)} rows but pixel_values has {pixel_values.shape[0]}."
        )
    seeds = image_seeds(pixel_values, image_grid_thw, seed, step)
    perturbed = []
    for rows, grid, image_seed in zip(pixel_values.split(counts), image_grid_thw.tolist(), seeds):
        generator = torch.Generator(device=pixel_values.device).manual_seed(image_seed)
        perturbed.append(fn(rows, grid, layout, generator, **params))
    return torch.cat(perturbed) if perturbed else pixel_values.clone()
