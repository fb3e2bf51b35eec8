"""The perturbations (a registry, as the selection strategies are), the paper's noise schedule, and
`perturb_pixel_values`, which runs one over a batch through its layout (`layouts`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import torch

from ..registry import Registry, call_with, check_signature, keyword_settings
from .layouts import ImageLayout, PixelLayout, PositionedPatchLayout


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
# Registry
# ---------------------------------------------------------------------------------------------------------------------

# fn(rows (R_i, row_size), grid (t, h, w), layout, generator, **params) -> perturbed rows, one image at a time
PerturbationFn = Callable[..., torch.Tensor]
PERTURBATIONS: Registry[PerturbationFn] = Registry("perturbation")
# The settings the trainer gives every perturbation that declares them (from VEPOConfig's fields); any other keyword-only
# parameter is the perturbation's own setting (`perturbation_params`)
SUPPLIED_TO_PERTURBATIONS = ("noise_step", "sigma", "patch_probability", "num_generations")


def register_perturbation(name: str):
    """Register `fn(rows, grid, layout, generator, *, ...) -> rows` as the perturbation `name` (a decorator, exported
    as `vepo_trl.register_perturbation`).

    The contract: `fn` perturbs one image at a time. `rows` is that image's pixel values in the model's own layout
    (Qwen's patch rows `(t*h*w, row_size)`, or a `(C, H, W)` tile), normalised as the processor leaves them; `grid` its
    `(t, h, w)` where the layout has one; `layout` converts (`layout.to_unit(rows)` to [0, 1] pixels and
    `layout.from_unit(x, dtype)` back, `layout.black(rows)`, `layout.pixel_noise(rows, grid, generator)`,
    `layout.patch_drop(rows, generator, p)`); `generator` is a `torch.Generator` seeded per image and step, the only
    source of randomness it may use. It returns a tensor shaped and typed like `rows`.

    Keyword-only parameters are what it reads: `noise_step` (the annealed diffusion step), `sigma` (`noise_sigma`),
    `patch_probability`, `num_generations`, and any others are its own settings, given as
    `--perturbation_params '{"name": value}'` and checked against the signature. Registering a name twice is an
    error."""

    def decorator(fn: PerturbationFn) -> PerturbationFn:
        check_signature(fn, "perturbation", ("rows", "grid", "layout", "generator"))
        PERTURBATIONS.add(name, fn, module=getattr(fn, "__module__", None))
        return fn

    return decorator


def perturbation_reads(name: str) -> frozenset[str]:
    """The settings a perturbation takes (`noise_step`, `sigma`, `patch_probability`, its own): its keyword-only
    parameters, as its function declares them."""
    return frozenset(keyword_settings(get_perturbation(name)))


def perturbation_settings(name: str) -> dict[str, object]:
    """A perturbation's own settings (`perturbation_params`), each with its default (`inspect.Parameter.empty`:
    required)."""
    return {k: v for k, v in keyword_settings(get_perturbation(name)).items() if k not in SUPPLIED_TO_PERTURBATIONS}


def get_perturbation(name: str) -> PerturbationFn:
    """The registered perturbation `name` (`PERTURBATIONS`); an unknown name raises `ValueError` listing the
    registered ones (`PluginError` where a plug-in of that name failed to load)."""
    return PERTURBATIONS.lookup(name)


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
    perturbation (`noise_step`, `sigma`, `patch_probability`, its own settings); ones it does not declare are not
    passed. Returns a new tensor
    of the same shape and dtype.
    """
    layout = layout or PixelLayout()
    return layout.perturb(
        _declared_call(name), pixel_values, seed=seed, step=step, params=params, image_grid_thw=image_grid_thw,
        image_sizes=image_sizes, tile_groups=tile_groups, pixel_attention_mask=pixel_attention_mask,
        image_position_ids=image_position_ids,
    )  # fmt: skip


def _declared_call(name: str) -> PerturbationFn:
    """The perturbation `name`, given only the settings it declares, its result checked against its contract."""
    fn = get_perturbation(name)

    def perturb_one(rows, grid, layout, generator, **params):
        out = call_with(fn, rows, grid, layout, generator, **params)
        if not isinstance(out, torch.Tensor) or out.shape != rows.shape:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise TypeError(
                f"Perturbation {name!r} returned {got} for an image of shape {tuple(rows.shape)}; a perturbation "
                "returns a tensor of its input's shape."
            )
        return out.to(rows.dtype)

    return perturb_one
