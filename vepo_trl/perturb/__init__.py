"""Image perturbations for VEPO's counterfactual pass, applied to a processor's `pixel_values`.

TRL keeps the processed `pixel_values` of a rollout, not the raw images, so the perturbations work there, on the
normalised tensor, through a layout that knows its shape (`families` picks the layout of each model family). Three
modules, each below the next: `seeds` (per-image seeds), `layouts` (the three layouts, one protocol), `registry` (the
perturbations, the noise schedule, `perturb_pixel_values`).

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

from .layouts import (
    CLIP_MEAN,
    CLIP_STD,
    ImageLayout,
    PerturbationLayout,
    PixelLayout,
    PositionedPatchLayout,
    anyres_boxes,
    letterbox_boxes,
    patchify,
)
from .registry import (
    PERTURBATIONS,
    RELEASE_NUM_GENERATIONS,
    annealed_noise_step,
    diffusion_alpha_bar,
    get_perturbation,
    perturb_pixel_values,
    perturbation_reads,
    perturbation_settings,
    register_perturbation,
)
from .seeds import image_seeds, tile_seeds


__all__ = [
    "CLIP_MEAN",
    "CLIP_STD",
    "PixelLayout",
    "ImageLayout",
    "PositionedPatchLayout",
    "PerturbationLayout",
    "anyres_boxes",
    "letterbox_boxes",
    "patchify",
    "tile_seeds",
    "image_seeds",
    "PERTURBATIONS",
    "register_perturbation",
    "get_perturbation",
    "perturbation_reads",
    "perturbation_settings",
    "perturb_pixel_values",
    "diffusion_alpha_bar",
    "annealed_noise_step",
    "RELEASE_NUM_GENERATIONS",
]
