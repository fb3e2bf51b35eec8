"""Every family's perturbations on its REAL image processor, at real image sizes, on the CPU.

The tiny models (`vepo_trl.builtin.tiny_models`) use toy processor sizes (28-64 px tiles, a few patches), which hide what only
real sizes show: a 384 px tile the 14 px patch grid does not cover, letterboxed any-res crops, batches padded to the
largest image, a white page cut into identical tiles, a 20x20 image upscaled. Here each family's own transformers
image-processor class is built with its reference checkpoint's `preprocessor_config.json` values and its model config
class with the checkpoint's vision patch size (no weights: each family module's `REFERENCE_PROCESSOR`, citing its source), and
the perturbations are checked on synthetic pictures of 448x448, 1280x720, 300x1200 and 20x20, two images in one
prompt, a batch of prompts and a white diagram:

- identity: `gaussian` at sigma 0 gives `pixel_values` back bit for bit (`diffusion` has no identity step: its step 0
  still adds noise of std 0.0047 in [0, 1] space);
- `black_image` is the processor run on black images of the same sizes;
- `gaussian` noise has std sigma x the checkpoint's normalisation std in [0, 1] space, `diffusion` noise un-scaled is
  standard normal there;
- `patch_blackout` blacks out whole patches of the model's own patch grid (the config's patch size), nothing else;
- padding (SmolVLM / Idefics2 padding tiles and pixels, LLaVA-NeXT / OneVision zero crops and letterbox, Mistral 3
  pixels past `image_sizes`) stays exactly as the processor made it under every registered perturbation;
- an image is perturbed alike alone and batched beside another one;
- identical tiles of one image (the white page) each get their own noise.

A family in `FAMILIES` without a `REFERENCE_PROCESSOR` in its module fails `test_real_processor_table_covers_every_family`. Run with `pytest tests/test_perturb_real_processors.py`.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import transformers
from PIL import Image, ImageDraw

from vepo_trl.families import FAMILIES, get_family, pixel_layout
from vepo_trl.perturb import (
    PERTURBATIONS,
    ImageLayout,
    PixelLayout,
    PositionedPatchLayout,
    anyres_boxes,
    diffusion_alpha_bar,
    perturb_pixel_values,
)

from .reference_processors import REAL_PROCESSORS
from .reference_processors import RealProcessor as Real


REAL = REAL_PROCESSORS  # one per family (its module's REFERENCE_PROCESSOR), citing its source

# Checks that fail on the current code: (check, family) -> why, in one line; each runs as a strict xfail. None now
KNOWN_FAILURES: dict[tuple[str, str], str] = {}


def families(check: str, only=None) -> list:
    """The table's families for one check, a known failure marked as a strict xfail."""
    params = []
    for name, entry in REAL.items():
        if only is not None and not only(entry):
            continue
        reason = KNOWN_FAILURES.get((check, name))
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        params.append(pytest.param(name, marks=marks, id=name))
    return params


# ---------------------------------------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------------------------------------


@functools.cache
def picture(width: int, height: int, seed: int) -> Image.Image:
    """A synthetic photo: two gradients, a wave and a few shapes, no pure black or white, no two equal tiles."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    red = 30 + 190 * x / max(width - 1, 1)
    green = 30 + 190 * y / max(height - 1, 1)
    blue = 128 + 90 * np.sin(x * (0.031 + 0.007 * seed) + y * 0.023 + seed)
    image = Image.fromarray(np.stack([red, green, blue], -1).clip(12, 243).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    draw.ellipse((width // 5, height // 5, width // 2, height // 2), fill=(200, 40 + 20 * seed, 60))
    draw.rectangle((width // 2, height // 2, width * 4 // 5, height * 4 // 5), outline=(20, 160, 220), width=3)
    return image


@functools.cache
def diagram() -> Image.Image:
    """A white page with a few black strokes in one corner: the rest of it cuts into identical white tiles."""
    page = Image.new("RGB", (896, 896), (255, 255, 255))
    draw = ImageDraw.Draw(page)
    draw.rectangle((40, 40, 200, 160), outline=(0, 0, 0), width=6)
    draw.line((40, 200, 260, 120), fill=(0, 0, 0), width=3)
    for row in range(4):  # a few lines of "text"
        draw.line((60, 230 + 14 * row, 60 + 40 * (row + 2), 230 + 14 * row), fill=(0, 0, 0), width=4)
    return page


SQUARE, WIDE, TALL, TINY = (448, 448, 0), (1280, 720, 1), (300, 1200, 2), (20, 20, 3)
# Each case: prompts, each a list of (width, height, seed) pictures or "diagram"
CASES = {
    "1280x720": [[WIDE]],
    "300x1200": [[TALL]],
    "20x20": [[TINY]],
    "two images": [[SQUARE, WIDE]],
    "two prompts": [[WIDE], [TALL, TINY]],  # a batch that pads: tiles, crops, pixels
    "diagram": [["diagram"]],
}


def images_of(prompts, black=False) -> list[list[Image.Image]]:
    out = []
    for prompt in prompts:
        images = [diagram() if spec == "diagram" else picture(*spec) for spec in prompt]  # (w, h, seed) or a page
        out.append([Image.new("RGB", image.size) for image in images] if black else images)
    return out


# ---------------------------------------------------------------------------------------------------------------------
# The real processors
# ---------------------------------------------------------------------------------------------------------------------


@functools.cache
def real_processor(name: str):
    """(family, image processor, model config, layout) of a family's reference checkpoint."""
    family, entry = get_family(name), REAL[name]
    image_processor = getattr(transformers, entry.processor)(**entry.kwargs)
    config = getattr(transformers, entry.config)(**entry.config_kwargs)
    return family, image_processor, config, pixel_layout(config, image_processor)


def vision_patch(config) -> int:
    patch = config.vision_config.patch_size
    return int(patch[0] if isinstance(patch, (list, tuple)) else patch)


@dataclass
class Encoded:
    """A batch as the family's processor makes it: `pixel_values` and `image_grid_thw`, the other keyword arguments
    the trainer hands `perturb_pixel_values` (`image_sizes`, `pixel_attention_mask`, `tile_groups`), which values are
    the images' own (`real`, shaped like `pixel_values`) and the model's patch size."""

    pixel_values: torch.Tensor
    grid: torch.Tensor | None
    layout: PixelLayout | ImageLayout
    options: dict
    real: torch.Tensor
    # Padding the processor fills with zeros (the rest of what is not `real` is any-res letterbox, black)
    zero: torch.Tensor
    patch: int


def encode(name: str, case, black: bool = False) -> Encoded:
    """A case of `CASES` by name, or any prompts (lists of picture specs), through the family's real processor; one
    encoding for prompts its processor and the trainer cannot tell apart (the same images, where neither groups them
    per prompt)."""
    family = real_processor(name)[0]
    prompts = CASES[case] if isinstance(case, str) else case
    if not (REAL[name].per_prompt or family.tiles_per_prompt):
        prompts = [[spec for prompt in prompts for spec in prompt]]
    return _encode(name, json.dumps(prompts), black)


@functools.cache
def _encode(name: str, prompts: str, black: bool) -> Encoded:
    family, image_processor, config, layout = real_processor(name)
    entry = REAL[name]
    prompts = images_of(json.loads(prompts), black)
    images = prompts if entry.per_prompt else [image for prompt in prompts for image in prompt]
    out = image_processor(images=images, return_tensors="pt", **entry.call)
    pixel_values = out["pixel_values"]
    options = {"image_sizes": out.get("image_sizes"), "pixel_attention_mask": out.get("pixel_attention_mask")}
    if isinstance(layout, PositionedPatchLayout):
        options["image_position_ids"] = out["image_position_ids"]
    if family.tiles_per_prompt:  # TRL's `num_tiles`: each prompt's tiles, counted by the image processor
        counts = torch.as_tensor(out["num_patches"]).split([len(prompt) for prompt in prompts])
        options["tile_groups"] = [int(count.sum()) for count in counts]
    real, zero = real_pixels(entry, layout, pixel_values, out)
    return Encoded(pixel_values, out.get("image_grid_thw"), layout, options, real, zero, vision_patch(config))


def real_pixels(entry: Real, layout, pixel_values: torch.Tensor, out) -> tuple[torch.Tensor, torch.Tensor]:
    """Which values of `pixel_values` are the images' own, and which are zero padding, from what the processor
    returned: everything, the pixel mask, each image's top-left `image_sizes`, or each any-res crop's box (the rest of
    the crop letterbox, crops past an image's own zero padding)."""
    everything = torch.ones_like(pixel_values, dtype=torch.bool)
    if isinstance(layout, PixelLayout) or entry.real == "all":
        return everything, ~everything
    if entry.real == "positions":  # a row is the image's own or padding, as a whole
        real = (out["image_position_ids"] >= 0).all(-1, keepdim=True).expand_as(pixel_values)
        return real, ~real
    channels, height, width = pixel_values.shape[-3:]
    tiles = math.prod(pixel_values.shape[:-3])
    real = torch.ones(tiles, height, width, dtype=torch.bool)
    if entry.real == "pixel_mask":
        real &= out["pixel_attention_mask"].reshape(tiles, height, width).bool()
        zero = ~real
    elif entry.real == "image_sizes":
        for index, (h, w) in enumerate(out["image_sizes"].tolist()):
            real[index, h:] = False
            real[index, :, w:] = False
        zero = ~real
    elif entry.real == "anyres":
        crops = pixel_values.shape[1]
        zero = torch.zeros_like(real)
        for index, size in enumerate(out["image_sizes"].tolist()):
            boxes = anyres_boxes(tuple(size), entry.kwargs["image_grid_pinpoints"], layout.crop_size)
            assert len(boxes) <= crops, (size, len(boxes), crops)
            zero[index * crops + len(boxes) : (index + 1) * crops] = True
            boxes += [None] * (crops - len(boxes))
            for k, box in enumerate(boxes):
                tile = real[index * crops + k]
                tile[:] = False
                if box is not None:
                    tile[box[0] : box[1], box[2] : box[3]] = True
    else:
        raise ValueError(entry.real)

    def expand(mask):
        return mask.unsqueeze(1).expand(-1, channels, -1, -1).reshape(pixel_values.shape)

    return expand(real), expand(zero)


def perturb(name: str, enc: Encoded, **params) -> torch.Tensor:
    return perturb_pixel_values(name, enc.pixel_values, enc.grid, enc.layout, **enc.options, **params)


def tiles_of(values: torch.Tensor) -> torch.Tensor:
    return values.reshape(-1, *values.shape[-3:])


def unit_channels(enc: Encoded, values: torch.Tensor) -> list[torch.Tensor]:
    """The images' own values in [0, 1] space, one flat tensor per channel."""
    layout = enc.layout
    if isinstance(layout, PixelLayout):
        unit = layout.to_unit(values)  # (rows, C, T * P * P)
        return [unit[:, c].flatten() for c in range(layout.channels)]
    if isinstance(layout, PositionedPatchLayout):  # rows (images, max_patches, P * P * C), channels last
        pixels = values.float().reshape(*values.shape[:2], -1, layout.channels)
        rows = enc.real[..., 0]
        return [(pixels[..., c] * layout.image_std[c] + layout.image_mean[c])[rows].flatten()
                for c in range(layout.channels)]  # fmt: skip
    unit, real = layout.to_unit(tiles_of(values)), tiles_of(enc.real)
    return [unit[:, c][real[:, c]] for c in range(layout.channels)]


# Every size at least once per check: "two images" is 448x448 and 1280x720 in one prompt
SIZES = ["two images", "300x1200", "20x20"]


def within(measured: float, expected: float, samples: int, spread: float = 1.0) -> bool:
    """`measured` a statistic of `samples` draws with standard error `spread / sqrt(samples)`: within 5 of those
    (and 0.005) of `expected`."""
    return abs(measured - expected) < 5 * spread / math.sqrt(samples) + 0.005


# ---------------------------------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------------------------------


def test_real_processor_table_covers_every_family():
    """A new family cannot skip these checks: each one in `FAMILIES` has its real processor here."""
    missing = [family.name for family in FAMILIES if family.name not in REAL]
    assert not missing, f"no REFERENCE_PROCESSOR in the family modules of {missing}"


@pytest.mark.parametrize("name", families("registry"))
def test_real_processor_matches_the_registry(name):
    """The family's registry agrees with its real checkpoint: reference, normalisation, the layout's patch geometry
    and the model's."""
    family, image_processor, config, layout = real_processor(name)
    entry = REAL[name]
    std = torch.tensor(layout.image_std)
    if family.reference is not None:
        assert family.reference[0] == entry.checkpoint
        torch.testing.assert_close(std, torch.tensor(family.reference[1]), atol=1e-6, rtol=0)
    torch.testing.assert_close(std, torch.tensor(entry.kwargs["image_std"]), atol=1e-6, rtol=0)
    patch = vision_patch(config)
    assert layout.patch_size == patch
    if isinstance(layout, PixelLayout):
        # The rows the processor makes are the vision tower's patches
        vision = config.vision_config
        assert layout.merge_size == getattr(vision, "spatial_merge_size", layout.merge_size)
        assert layout.temporal_patch_size == getattr(vision, "temporal_patch_size", layout.temporal_patch_size)
        enc = encode(name, "1280x720")
        assert enc.pixel_values.shape[1] == layout.channels * layout.temporal_patch_size * patch**2


# ---------------------------------------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", families("identity"))
def test_real_processor_identity_is_exact(name):
    """`gaussian` at sigma 0 gives the processor's pixels back, bit for bit."""
    real_processor(name)
    for case in SIZES:
        enc = encode(name, case)
        assert torch.equal(perturb("gaussian", enc, seed=1, step=2, sigma=0.0), enc.pixel_values), case


@pytest.mark.parametrize("name", families("black"))
def test_real_processor_black_image_is_the_processor_on_black_images(name):
    """Black in normalised space is the family's own: the processor run on black images of the same sizes."""
    real_processor(name)
    for case in SIZES:
        enc, black = encode(name, case), encode(name, case, black=True)
        assert black.pixel_values.shape == enc.pixel_values.shape
        assert enc.grid is None or torch.equal(enc.grid, black.grid)
        out = perturb("black_image", enc, seed=3)
        torch.testing.assert_close(out, black.pixel_values, atol=1e-5, rtol=0, msg=lambda m, case=case: f"{case}: {m}")


@pytest.mark.parametrize("name", families("noise"))
def test_real_processor_noise_strength_in_image_space(name):
    """`gaussian` at sigma: std sigma x the checkpoint's std per channel in [0, 1] space; `diffusion` at step tau:
    `(I' - sqrt(abar) I) / sqrt(1 - abar)` standard normal where the clamp did not bite (compared with the same
    clamp of a standard normal draw)."""
    real_processor(name)
    std = REAL[name].kwargs["image_std"]
    noise_step = 500
    abar = diffusion_alpha_bar(noise_step)
    for case in ("two images", "20x20"):
        enc = encode(name, case)
        clean = unit_channels(enc, enc.pixel_values)
        noisy = unit_channels(enc, perturb("gaussian", enc, seed=4, step=1, sigma=2.0))
        for channel, (n, c) in enumerate(zip(noisy, clean)):
            measured = float((n - c).std())
            assert within(measured / (2.0 * std[channel]), 1.0, c.numel(), 0.71), (case, channel, measured)
        out = perturb("diffusion", enc, seed=4, step=1, noise_step=noise_step)
        if isinstance(enc.layout, PixelLayout):
            # Both temporal copies of a still frame carry the same noise
            unit = enc.layout.to_unit(out)
            half = unit.shape[-1] // 2
            assert torch.equal(unit[..., :half], unit[..., half:])
        clean, noisy = torch.cat(clean), torch.cat(unit_channels(enc, out))
        assert noisy.min() >= -1e-5 and noisy.max() <= 1 + 1e-5
        generator = torch.Generator().manual_seed(0)
        reference = math.sqrt(abar) * clean + math.sqrt(1 - abar) * torch.randn(clean.shape, generator=generator)
        stats = []
        for values in (noisy, reference.clamp(0, 1)):
            inside = (values > 1e-4) & (values < 1 - 1e-4)
            noise = ((values - math.sqrt(abar) * clean) / math.sqrt(1 - abar))[inside]
            stats.append((float(noise.std()), float(noise.mean()), float(inside.float().mean()), int(inside.sum())))
        (std_n, mean_n, inside_n, count), (std_r, mean_r, inside_r, _) = stats
        assert within(std_n, std_r, count), (case, std_n, std_r)
        assert within(mean_n, mean_r, count, 1.42), (case, mean_n, mean_r)
        assert within(inside_n, inside_r, clean.numel(), 0.71), (case, inside_n, inside_r)


def patch_hits(name: str, enc: Encoded, out: torch.Tensor) -> tuple[int, int]:
    """Checks `out` changes whole model patches to black and nothing else; returns (patches changed, image
    patches)."""
    p = enc.patch
    if isinstance(enc.layout, PositionedPatchLayout):
        # A real row is one of the model's patches: the clean one or entirely black; padding rows never change
        real = enc.real[..., 0]
        kept = (out == enc.pixel_values).all(-1)
        dropped = (
            (torch.stack(unit_channels(enc, out)).abs() < 1e-5).view(enc.layout.channels, -1, p * p).all(0).all(-1)
        )
        assert bool(kept[~real].all()), "a padding row changed"
        assert bool((kept[real] | dropped).all()), "a patch row changed in part"
        return int(dropped.sum()), int(real.sum())
    if isinstance(enc.layout, PixelLayout):
        # A row is one of the model's patches: the clean one or entirely black
        kept = (out == enc.pixel_values).all(-1)
        dropped = (enc.layout.to_unit(out).abs() < 1e-5).flatten(1).all(-1)
        assert bool((kept | dropped).all()), "a patch row changed in part"
        return int(dropped.sum()), dropped.numel()
    clean, perturbed, real = tiles_of(enc.pixel_values), tiles_of(out), tiles_of(enc.real)[:, 0]
    changed = (perturbed != clean).any(1)
    assert not (changed & ~real).any(), "a value outside the images changed"
    black = (enc.layout.to_unit(perturbed).abs() < 1e-5).all(1)
    assert bool(black[changed].all()), "a changed pixel is not black"
    height, width = clean.shape[-2:]
    if REAL[name].partial_patches:  # the grid covers each image rounded up to whole patches
        pad = (0, -width % p, 0, -height % p)
        changed, real = torch.nn.functional.pad(changed, pad), torch.nn.functional.pad(real, pad)
        height, width = changed.shape[-2:]
    gh, gw = height // p, width // p
    # Pixels past the patch grid (a 384 px tile's last 6 rows and columns at 14 px patches) are never read: they stay
    assert not changed[:, gh * p :].any() and not changed[:, :, gw * p :].any(), "a pixel past the patch grid changed"

    def squares(mask):
        return mask[:, : gh * p, : gw * p].reshape(-1, gh, p, gw, p)

    changed_sq, real_sq = squares(changed), squares(real)
    hit = changed_sq.any(4).any(2)
    # A patch changes entirely: all of its image pixels (none of its padding, checked above)
    whole = (changed_sq == real_sq).all(4).all(2)
    assert bool(whole[hit].all()), "a patch changed in part"
    image_patches = real_sq.any(4).any(2)
    return int(hit[image_patches].sum()), int(image_patches.sum())


@pytest.mark.parametrize("name", families("patch_blackout"))
def test_real_processor_patch_blackout_blacks_out_whole_model_patches(name):
    """Only whole patches of the model's own grid (its config's patch size, from each tile's top-left corner)
    change, each to black over all of its image pixels: about half of them at probability 0.5, all at 1."""
    real_processor(name)
    hits = total = 0
    for case in SIZES:
        enc = encode(name, case)
        half = patch_hits(name, enc, perturb("patch_blackout", enc, seed=5, step=1, patch_probability=0.5))
        hits, total = hits + half[0], total + half[1]
        everything = patch_hits(name, enc, perturb("patch_blackout", enc, seed=5, step=1, patch_probability=1.0))
        assert everything[0] == everything[1], (case, everything)
    assert within(hits / total, 0.5, total, 0.5), (hits, total)


@pytest.mark.parametrize("name", families("padding"))
def test_real_processor_padding_stays_as_the_processor_made_it(name):
    """Padding tiles and pixels, zero crops and letterbox: exactly as the processor made them under every registered
    perturbation, on batches that have them."""
    real_processor(name)
    entry = REAL[name]
    # 1280x720 in one prompt, 300x1200 and 20x20 in another: tiles, crops and pixels padded, letterbox of all shapes
    enc = encode(name, "two prompts")
    padding = ~enc.real
    if entry.real != "all":
        assert padding.any(), f"{name}'s processor padded nothing"
    # What the processor made there: zeros, or black letterbox (any-res)
    assert not enc.pixel_values[enc.zero].any()
    if isinstance(enc.layout, ImageLayout):
        letterbox = tiles_of(padding & ~enc.zero)[:, 0]
        assert bool((enc.layout.to_unit(tiles_of(enc.pixel_values)).abs() < 1e-5).all(1)[letterbox].all())
    for perturbation in sorted(PERTURBATIONS):
        out = perturb(perturbation, enc, seed=6, step=2, sigma=2.0, noise_step=500, patch_probability=0.5)
        changed = (out != enc.pixel_values) & padding
        assert not changed.any(), (
            f"{perturbation}: {int(changed.sum())} of {int(padding.sum())} padding values changed, by up to "
            f"{float((out - enc.pixel_values)[changed].abs().max()):.3g}"
        )


def units(enc: Encoded) -> int:
    """How many units (patch rows, or tiles) a batch holds."""
    values = enc.pixel_values
    return values.shape[0] if values.ndim <= 3 else tiles_of(values).shape[0]


def image_start(name: str, prompts, batch: Encoded, position: tuple[int, int]) -> int:
    """Where the image at `(prompt, index in it)` starts among the batch's units: rows per prompt (SmolVLM,
    Idefics2), rows per image (LLaVA-NeXT / OneVision), or a flat run of patch rows or tiles."""
    row, index = position
    values = batch.pixel_values
    if values.ndim == 5 and REAL[name].per_prompt:
        return row * values.shape[1] + sum(units(encode(name, [[spec]])) for spec in prompts[row][:index])
    before = [spec for prompt in prompts[:row] for spec in prompt] + list(prompts[row][:index])
    if values.ndim == 5:
        return len(before) * values.shape[1]
    return sum(units(encode(name, [[spec]])) for spec in before)


@pytest.mark.parametrize("name", families("alone_as_batched"))
def test_real_processor_each_image_perturbed_alone_as_batched(name):
    """An image's perturbed pixels depend on it alone: processed alone, or first or second beside another image, in
    prompts of their own or in one prompt."""
    real_processor(name)
    params = dict(seed=7, step=3, sigma=2.0, noise_step=500, patch_probability=0.5)
    perturbations = ("diffusion", "gaussian", "patch_blackout")
    batches = [
        (WIDE, (0, 0), [[WIDE], [TALL]]),
        (WIDE, (1, 0), [[TALL], [WIDE]]),
        (WIDE, (0, 1), [[TALL, WIDE]]),
        (TINY, (1, 0), [[WIDE], [TINY]]),
    ]
    alone, seen = {}, set()
    for image, position, prompts in batches:
        if image not in alone:
            enc = encode(name, [[image]])
            alone[image] = {None: enc.pixel_values, **{p: perturb(p, enc, **params) for p in perturbations}}
        batch = encode(name, prompts)
        start, n = image_start(name, prompts, batch, position), units(encode(name, [[image]]))
        if (id(batch), start) in seen:
            continue  # the same batch as an earlier one to this family's processor and trainer
        seen.add((id(batch), start))
        for perturbation in (None, *perturbations):  # the processor's own pixels first
            expected = alone[image][perturbation]
            source = batch.pixel_values if perturbation is None else perturb(perturbation, batch, **params)
            if expected.ndim <= 3:  # patch rows, or padded patch rows per image
                got = source[start : start + n]
            else:
                height, width = expected.shape[-2:]
                got = tiles_of(source)[start : start + n, :, :height, :width]
            assert torch.equal(got, expected.reshape(got.shape)), (prompts, perturbation)


@pytest.mark.parametrize("name", families("identical_tiles", only=lambda entry: entry.tiles))
def test_real_processor_identical_tiles_get_their_own_noise(name):
    """A white page's background tiles are identical: each still gets its own noise (and drop mask), a function of
    the image alone."""
    real_processor(name)
    enc = encode(name, "diagram")
    tiles, real = tiles_of(enc.pixel_values), tiles_of(enc.real)
    own = [i for i in range(tiles.shape[0]) if real[i].any()]
    assert len({tiles[i].numpy().tobytes() for i in own}) < len(own), "the page has no identical tiles"
    for perturbation in ("diffusion", "gaussian", "patch_blackout"):
        params = dict(seed=0, step=3, sigma=2.0, noise_step=500, patch_probability=0.5)
        out = perturb(perturbation, enc, **params)
        noise = tiles_of(out) - tiles
        fields = {noise[i].numpy().tobytes() for i in own}
        assert len(fields) == len(own), f"{perturbation}: {len(own)} image tiles carry {len(fields)} noise fields"
        assert torch.equal(perturb(perturbation, enc, **params), out)
