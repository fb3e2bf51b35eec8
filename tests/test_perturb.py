r"""Tests for `vepo_trl.perturb`: image perturbations applied to a Qwen2.5-VL processor's `pixel_values`.

Expectations come from the processor itself (a real `Qwen2VLImageProcessor`), from a loop-by-loop reimplementation of
its patch layout written here, and from the paper's formulas; never from the module's own code.
"""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vepo_trl.builtin.tiny_models import build_processor
from vepo_trl.perturb import (
    PERTURBATIONS,
    PixelLayout,
    annealed_noise_step,
    diffusion_alpha_bar,
    get_perturbation,
    image_seeds,
    patchify,
    perturb_pixel_values,
    register_perturbation,
)


CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
PATCH, TEMPORAL, MERGE, CHANNELS = 14, 2, 2, 3
ROW = CHANNELS * TEMPORAL * PATCH * PATCH  # 1176
BLOCK = ROW // CHANNELS  # 392 values per channel in a row
ALL_PERTURBATIONS = ["diffusion", "gaussian", "gaussian_release", "mean_image", "black_image", "patch_blackout"]
STOCHASTIC = ["diffusion", "gaussian", "gaussian_release", "patch_blackout"]


# --------------------------------------------------------------------------------------------------------------------
# References
# --------------------------------------------------------------------------------------------------------------------


def normalize(frame):
    """[0, 1] frame (C, H, W) -> the processor's normalised values."""
    mean = torch.tensor(CLIP_MEAN, dtype=frame.dtype).view(-1, 1, 1)
    std = torch.tensor(CLIP_STD, dtype=frame.dtype).view(-1, 1, 1)
    return (frame - mean) / std


def loop_patchify(frame):
    """The processor's row layout written out patch by patch: merged 2x2 blocks in raster order, the four patches of a
    block in raster order, each row = (channel, temporal copy, 14, 14) with the still frame repeated twice."""
    _, height, width = frame.shape
    grid_h, grid_w = height // PATCH, width // PATCH
    rows = []
    for block_y in range(grid_h // MERGE):
        for block_x in range(grid_w // MERGE):
            for in_y in range(MERGE):
                for in_x in range(MERGE):
                    y = (block_y * MERGE + in_y) * PATCH
                    x = (block_x * MERGE + in_x) * PATCH
                    patch = frame[:, y : y + PATCH, x : x + PATCH]
                    parts = [patch[c].flatten() for c in range(CHANNELS) for _ in range(TEMPORAL)]
                    rows.append(torch.cat(parts))
    return torch.stack(rows)


def ref_alpha_bar(noise_step):
    """abar_tau = prod_{i <= tau} (1 - beta_i), beta_i = sigmoid(-6 + 12 i / 999) * (5e-3 - 1e-5) + 1e-5."""
    alpha_bar = 1.0
    for i in range(noise_step + 1):
        x = -6.0 + 12.0 * i / 999.0
        beta = 1.0 / (1.0 + math.exp(-x)) * (5e-3 - 1e-5) + 1e-5
        alpha_bar *= 1.0 - beta
    return alpha_bar


def random_frame(height, width, seed):
    return torch.rand(CHANNELS, height, width, generator=torch.Generator().manual_seed(seed))


def image_rows(grid_h, grid_w, seed):
    """Normalised rows of one random still image with a (1, grid_h, grid_w) patch grid."""
    return loop_patchify(normalize(random_frame(grid_h * PATCH, grid_w * PATCH, seed)))


def batch_of(grids, seeds):
    rows = [image_rows(h, w, s) for (h, w), s in zip(grids, seeds)]
    grid_thw = torch.tensor([[1, h, w] for h, w in grids])
    return torch.cat(rows), grid_thw, rows


@pytest.fixture(scope="module")
def image_processor():
    return build_processor().image_processor


# --------------------------------------------------------------------------------------------------------------------
# Layout
# --------------------------------------------------------------------------------------------------------------------


def test_pixel_layout_defaults_are_clip_stats():
    layout = PixelLayout()
    assert layout.image_mean == pytest.approx(CLIP_MEAN)
    assert layout.image_std == pytest.approx(CLIP_STD)
    assert (layout.patch_size, layout.temporal_patch_size, layout.merge_size) == (PATCH, TEMPORAL, MERGE)
    assert layout.channels == CHANNELS
    assert layout.row_size == ROW == 1176


def test_pixel_layout_from_real_image_processor(image_processor):
    layout = PixelLayout.from_image_processor(image_processor)
    assert layout.image_mean == pytest.approx(CLIP_MEAN)
    assert layout.image_std == pytest.approx(CLIP_STD)
    assert (layout.patch_size, layout.temporal_patch_size, layout.merge_size) == (PATCH, TEMPORAL, MERGE)


def test_pixel_layout_from_scalar_stats():
    # A processor with one scalar mean / std for all channels and another patch size
    fake = SimpleNamespace(image_mean=0.5, image_std=0.25, patch_size=16, temporal_patch_size=2, merge_size=2)
    layout = PixelLayout.from_image_processor(fake)
    assert layout.image_mean == (0.5, 0.5, 0.5) and layout.image_std == (0.25, 0.25, 0.25)
    assert layout.row_size == 3 * 2 * 16 * 16


def test_unit_round_trip():
    rows = image_rows(4, 6, seed=1)
    layout = PixelLayout()
    unit = layout.to_unit(rows)
    # Back in [0, 1]: the random frame was drawn there
    assert unit.shape == (rows.shape[0], CHANNELS, BLOCK)
    assert unit.min() >= -1e-6 and unit.max() <= 1 + 1e-6
    torch.testing.assert_close(layout.from_unit(unit, rows.dtype), rows, atol=1e-6, rtol=0)


def test_processor_layout_matches_loop_reference(image_processor):
    # Checks our understanding of the layout against the real processor (and so the premise of every test below)
    frame = random_frame(112, 140, seed=2)
    out = image_processor(images=[frame], do_rescale=False, return_tensors="pt")
    assert out["image_grid_thw"].tolist() == [[1, 8, 10]]
    torch.testing.assert_close(out["pixel_values"], loop_patchify(normalize(frame)), atol=1e-5, rtol=0)


@pytest.mark.parametrize(("height", "width"), [(112, 140), (56, 56), (224, 112)])
def test_patchify_matches_processor(image_processor, height, width):
    frame = random_frame(height, width, seed=height + width)
    out = image_processor(images=[frame], do_rescale=False, return_tensors="pt")
    torch.testing.assert_close(patchify(normalize(frame), PixelLayout()), out["pixel_values"], atol=1e-5, rtol=0)


# --------------------------------------------------------------------------------------------------------------------
# Noise schedule
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("noise_step", "expected"), [(500, 0.7448), (450, 0.8294), (250, 0.9784)])
def test_diffusion_alpha_bar_paper_values(noise_step, expected):
    assert round(diffusion_alpha_bar(noise_step), 4) == expected


@pytest.mark.parametrize("noise_step", [0, 1, 100, 499, 500, 750, 998, 999])
def test_diffusion_alpha_bar_matches_schedule(noise_step):
    assert diffusion_alpha_bar(noise_step) == pytest.approx(ref_alpha_bar(noise_step), rel=1e-10)


def test_diffusion_alpha_bar_decreases():
    values = [diffusion_alpha_bar(t) for t in range(1000)]
    assert all(a > b for a, b in zip(values, values[1:]))
    assert 0.0 < values[-1] < values[0] < 1.0


@pytest.mark.parametrize("noise_step", [-1, 1000, 5000])
def test_diffusion_alpha_bar_out_of_range(noise_step):
    with pytest.raises(ValueError, match="noise_step"):
        diffusion_alpha_bar(noise_step)


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (0, 499),  # sigmoid(30 * -40 / 160) = 5.5e-4: just under tau0
        (30, 433),
        (40, 250),  # the midpoint: half of tau0
        (50, 66),
        (60, 11),
        (80, 0),  # sigmoid(7.5) = 0.99945: 500 * 5.5e-4 = 0.28 -> 0
        (120, 0),
        (160, 0),
    ],
)
def test_annealed_noise_step_table(step, expected):
    assert annealed_noise_step(step, 160) == expected


def test_annealed_noise_step_matches_formula():
    def ref(step, total, tau0, c, mid):
        x = c * (step - mid) / total
        sigmoid = 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
        return int(tau0 * (1.0 - sigmoid))

    for total in (50, 160, 1000):
        for step in range(0, total + 1, max(1, total // 40)):
            got = annealed_noise_step(step, total, noise_step=300, coefficient=20.0, midpoint=25)
            assert got == ref(step, total, 300, 20.0, 25), (total, step)
    with pytest.raises(ValueError):
        annealed_noise_step(0, 0)


def test_annealed_noise_step_single_step_run():
    # A one-step run (the trainer passes max(max_steps, 1)): x = 30 * (0 - 40) / 1 = -1200, a sigmoid of ~0, so the
    # full noise step. The function must not overflow on the way
    assert annealed_noise_step(0, 1) in (499, 500)
    assert annealed_noise_step(100, 1) == 0


# --------------------------------------------------------------------------------------------------------------------
# The key property: perturbing pixel_values equals noising the image and processing it again
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("noise_step", "seed", "step"), [(500, 0, 0), (250, 3, 17), (999, 11, 2)])
def test_diffusion_equals_processing_the_noised_image(image_processor, noise_step, seed, step):
    height, width = 112, 140  # multiples of 28 inside the processor's pixel bounds: its resize is the identity
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    processed = image_processor(images=[image], return_tensors="pt")
    pixel_values, grid = processed["pixel_values"], processed["image_grid_thw"]
    assert grid.tolist() == [[1, height // PATCH, width // PATCH]]

    got = perturb_pixel_values("diffusion", pixel_values, grid, seed=seed, step=step, noise_step=noise_step)

    # Assumption about the module's randomness (the only thing taken from it): the noise of an image is one standard
    # normal draw of shape (3, H, W), in image layout, from a CPU generator seeded with the image's seed
    image_seed = image_seeds(pixel_values, grid, seed, step)[0]
    eps = torch.randn((3, height, width), generator=torch.Generator().manual_seed(image_seed))
    alpha_bar = ref_alpha_bar(noise_step)
    x = torch.from_numpy(image).permute(2, 0, 1).double() / 255.0
    noised = (math.sqrt(alpha_bar) * x + math.sqrt(1.0 - alpha_bar) * eps.double()).clamp(0.0, 1.0)
    expected = image_processor(images=[noised.float()], do_rescale=False, return_tensors="pt")["pixel_values"]

    assert got.shape == pixel_values.shape and got.dtype == pixel_values.dtype
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    # The noise really moved the image (and by how much the schedule says, roughly): a clean image is not a pass
    change = (got - pixel_values).abs().mean().item()
    assert change > 0.1 * math.sqrt(1.0 - alpha_bar)


def test_diffusion_shares_noise_between_temporal_copies():
    # A still image is stored as two identical temporal copies; noising the image keeps them identical
    rows, grid, _ = batch_of([(4, 4)], [5])
    out = perturb_pixel_values("diffusion", rows, grid, seed=1, step=2)
    copies = out.view(-1, CHANNELS, TEMPORAL, PATCH * PATCH)
    assert torch.equal(copies[:, :, 0], copies[:, :, 1])


def test_diffusion_output_stays_in_pixel_range():
    # Clamped to [0, 1] before re-normalising, whatever the noise level
    rows, grid, _ = batch_of([(6, 6)], [6])
    layout = PixelLayout()
    for noise_step in (0, 500, 999):
        unit = layout.to_unit(perturb_pixel_values("diffusion", rows, grid, noise_step=noise_step))
        assert unit.min() >= -1e-5 and unit.max() <= 1 + 1e-5


# --------------------------------------------------------------------------------------------------------------------
# The other perturbations
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sigma", [0.5, 2.0])
def test_gaussian_adds_normal_noise_without_clamp(sigma):
    rows, grid, _ = batch_of([(10, 10)], [7])
    out = perturb_pixel_values("gaussian", rows, grid, seed=4, step=1, sigma=sigma)
    noise = (out - rows).double()
    # 100 rows x 1176 values: the sample moments of N(0, sigma^2) are within a few per mille
    assert abs(noise.mean().item()) < 0.02 * sigma
    assert noise.std().item() == pytest.approx(sigma, rel=0.02)
    # No clamp: values leave the normalised range of a [0, 1] image
    lowest = min(-m / s for m, s in zip(CLIP_MEAN, CLIP_STD))
    highest = max((1 - m) / s for m, s in zip(CLIP_MEAN, CLIP_STD))
    assert out.min() < lowest - 1.0 and out.max() > highest + 1.0


def test_gaussian_sigma_zero_is_identity():
    rows, grid, _ = batch_of([(4, 4)], [8])
    assert torch.equal(perturb_pixel_values("gaussian", rows, grid, sigma=0.0), rows)


def test_gaussian_default_sigma_is_two():
    rows, grid, _ = batch_of([(10, 10)], [9])
    noise = perturb_pixel_values("gaussian", rows, grid, seed=2) - rows
    assert noise.std().item() == pytest.approx(2.0, rel=0.02)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mean_image_is_zero(dtype):
    # Every pixel at the normalisation mean is 0 once normalised
    rows, grid, _ = batch_of([(4, 6)], [10])
    out = perturb_pixel_values("mean_image", rows.to(dtype), grid)
    assert out.dtype == dtype and out.shape == rows.shape
    assert not out.any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_black_image_values(dtype):
    # Black is 0 in [0, 1] space, so (0 - mean_c) / std_c in each channel's block of 392 values
    rows, grid, _ = batch_of([(4, 6)], [11])
    out = perturb_pixel_values("black_image", rows.to(dtype), grid)
    assert out.dtype == dtype and out.shape == rows.shape
    expected_row = torch.cat([torch.full((BLOCK,), -m / s) for m, s in zip(CLIP_MEAN, CLIP_STD)])
    # Every row is the same black row, equal to the formula up to the rounding of the output dtype
    assert torch.equal(out, out[:1].expand_as(out))
    tolerance = {"atol": 1e-6, "rtol": 0} if dtype == torch.float32 else {"atol": 0, "rtol": 2**-8}
    torch.testing.assert_close(out[0].double(), expected_row.double(), **tolerance)
    if dtype == torch.float32:
        assert PixelLayout().to_unit(out).abs().max() < 1e-6


def test_black_image_with_custom_layout():
    # Mean 0.5, std 0.25: black is (0 - 0.5) / 0.25 = -2 everywhere
    layout = PixelLayout(image_mean=(0.5, 0.5, 0.5), image_std=(0.25, 0.25, 0.25))
    rows, grid, _ = batch_of([(2, 2)], [12])
    assert torch.equal(perturb_pixel_values("black_image", rows, grid, layout), torch.full_like(rows, -2.0))


def test_patch_blackout_rows_are_untouched_or_black():
    rows, grid, _ = batch_of([(20, 20)], [13])
    black = perturb_pixel_values("black_image", rows, grid)[0]
    for probability, low, high in ((0.5, 0.4, 0.6), (0.6, 0.5, 0.7), (0.2, 0.12, 0.28)):
        out = perturb_pixel_values("patch_blackout", rows, grid, seed=3, step=5, patch_probability=probability)
        is_black = (out == black).all(-1)
        is_same = (out == rows).all(-1)
        # Every 14x14 patch is either bit-identical to the input or fully black, never partly changed
        assert (is_black | is_same).all()
        # About p of the 400 patches go black (binomial sd <= 0.025: the bounds are 4 sigma)
        assert low < is_black.float().mean().item() < high, probability
    assert torch.equal(perturb_pixel_values("patch_blackout", rows, grid, patch_probability=0.0), rows)
    all_black = perturb_pixel_values("patch_blackout", rows, grid, patch_probability=1.0)
    assert torch.equal(all_black, black.expand_as(rows))


def test_patch_blackout_default_probability_is_half():
    rows, grid, _ = batch_of([(20, 20)], [14])
    black = perturb_pixel_values("black_image", rows, grid)[0]
    out = perturb_pixel_values("patch_blackout", rows, grid, seed=8)
    assert 0.4 < (out == black).all(-1).float().mean().item() < 0.6


# --------------------------------------------------------------------------------------------------------------------
# Properties every perturbation shares
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_PERTURBATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shape_dtype_no_mutation_reproducible(name, dtype):
    pixel_values, grid, _ = batch_of([(4, 4), (2, 6)], [15, 16])
    pixel_values = pixel_values.to(dtype)
    before = pixel_values.clone()
    grid_before = grid.clone()
    out = perturb_pixel_values(name, pixel_values, grid, seed=5, step=3)
    assert out.shape == pixel_values.shape and out.dtype == dtype
    assert out.data_ptr() != pixel_values.data_ptr()
    assert torch.equal(pixel_values, before) and torch.equal(grid, grid_before)
    assert torch.equal(perturb_pixel_values(name, pixel_values, grid, seed=5, step=3), out)
    # Writing into the result leaves the input alone (a new tensor, not a view)
    out.add_(1.0)
    assert torch.equal(pixel_values, before)


@pytest.mark.parametrize("name", STOCHASTIC)
def test_seed_and_step_change_the_noise(name):
    pixel_values, grid, _ = batch_of([(4, 4)], [17])
    base = perturb_pixel_values(name, pixel_values, grid, seed=5, step=3)
    assert not torch.equal(perturb_pixel_values(name, pixel_values, grid, seed=6, step=3), base)
    assert not torch.equal(perturb_pixel_values(name, pixel_values, grid, seed=5, step=4), base)
    assert not torch.equal(base, pixel_values)


@pytest.mark.parametrize("name", ALL_PERTURBATIONS)
def test_image_perturbation_independent_of_batch(name):
    grids = [(4, 4), (2, 6), (6, 4)]
    pixel_values, grid, rows = batch_of(grids, [18, 19, 20])
    together = perturb_pixel_values(name, pixel_values, grid, seed=9, step=7).split([h * w for h, w in grids])
    reversed_batch = perturb_pixel_values(name, torch.cat(rows[::-1]), grid.flip(0), seed=9, step=7).split(
        [h * w for h, w in grids[::-1]]
    )[::-1]
    for i, ((h, w), image) in enumerate(zip(grids, rows)):
        alone = perturb_pixel_values(name, image, torch.tensor([[1, h, w]]), seed=9, step=7)
        assert torch.equal(together[i], alone), i
        assert torch.equal(reversed_batch[i], alone), i


def test_image_seeds():
    grids = [(4, 4), (2, 6)]
    pixel_values, grid, rows = batch_of(grids, [21, 22])
    seeds = image_seeds(pixel_values, grid, seed=1, step=2)
    assert len(seeds) == 2 and seeds[0] != seeds[1]
    # An image's seed depends on itself, not on its neighbours or its place in the batch
    assert image_seeds(rows[1], torch.tensor([[1, 2, 6]]), 1, 2) == [seeds[1]]
    assert image_seeds(torch.cat(rows[::-1]), grid.flip(0), 1, 2) == seeds[::-1]
    # Two copies of the same image in one batch get the same seed (and so the same perturbation)
    twins = image_seeds(torch.cat([rows[0], rows[0]]), torch.tensor([[1, 4, 4], [1, 4, 4]]), 1, 2)
    assert twins == [seeds[0], seeds[0]]
    # Another base seed, another step or other content gives another seed
    assert image_seeds(rows[0], grid[:1], 2, 2) != [seeds[0]]
    assert image_seeds(rows[0], grid[:1], 1, 3) != [seeds[0]]
    changed = rows[0].clone()
    changed[5, 100] += 0.5
    assert image_seeds(changed, grid[:1], 1, 2) != [seeds[0]]
    # Swapping two patches (same pixel sum, other content) also changes it
    swapped = rows[0][torch.tensor([1, 0, *range(2, 16)])]
    assert image_seeds(swapped, grid[:1], 1, 2) != [seeds[0]]


def test_identical_images_get_identical_noise():
    pixel_values, grid, rows = batch_of([(4, 4)], [23])
    doubled = perturb_pixel_values(
        "diffusion", torch.cat([rows[0], rows[0]]), torch.tensor([[1, 4, 4], [1, 4, 4]]), seed=1
    )
    assert torch.equal(doubled[:16], doubled[16:])


# --------------------------------------------------------------------------------------------------------------------
# Registry and errors
# --------------------------------------------------------------------------------------------------------------------


def test_registry():
    assert set(ALL_PERTURBATIONS) <= set(PERTURBATIONS)
    for name in ALL_PERTURBATIONS:
        assert get_perturbation(name) is PERTURBATIONS[name]


def test_register_perturbation():
    name = "test_only_invert"
    try:

        @register_perturbation(name)
        def _invert(rows, grid, layout, generator, **_):
            return -rows

        rows, grid, _ = batch_of([(2, 2)], [24])
        assert torch.equal(perturb_pixel_values(name, rows, grid), -rows)
        with pytest.raises(ValueError, match="already"):
            register_perturbation(name)(lambda rows, *args, **kwargs: rows)
    finally:
        PERTURBATIONS.pop(name, None)
    for existing in ALL_PERTURBATIONS:
        with pytest.raises(ValueError):
            register_perturbation(existing)(lambda rows, *args, **kwargs: rows)


def test_unknown_perturbation_lists_valid_names():
    rows, grid, _ = batch_of([(2, 2)], [25])
    for call in (lambda: get_perturbation("blur"), lambda: perturb_pixel_values("blur", rows, grid)):
        with pytest.raises(ValueError) as info:
            call()
        for name in ALL_PERTURBATIONS:
            assert name in str(info.value)


def test_bad_inputs():
    rows, grid, _ = batch_of([(2, 2), (2, 4)], [26, 27])
    # pixel_values rows of the wrong width (not 3 * 2 * 14 * 14)
    with pytest.raises(ValueError, match="1176"):
        perturb_pixel_values("diffusion", rows[:, :1000], grid)
    with pytest.raises(ValueError, match="1176"):
        perturb_pixel_values("diffusion", rows.view(-1), grid)
    # The grid accounts for 12 rows, pixel_values has 11 (or 13)
    with pytest.raises(ValueError, match="12"):
        perturb_pixel_values("diffusion", rows[:-1], grid)
    with pytest.raises(ValueError, match="12"):
        perturb_pixel_values("diffusion", torch.cat([rows, rows[:1]]), grid)
    # A video grid (t = 2), even with a matching row count
    with pytest.raises(ValueError, match="t = 2"):
        perturb_pixel_values("diffusion", torch.cat([rows, rows[:4]]), torch.tensor([[2, 2, 2], [1, 2, 4]]))
    # A grid that is not (num_images, 3), and one not divisible by the 2x2 merge
    with pytest.raises(ValueError):
        perturb_pixel_values("diffusion", rows, grid[:, :2])
    with pytest.raises(ValueError, match="merge"):
        perturb_pixel_values("diffusion", rows[:3], torch.tensor([[1, 1, 3]]))
    # The noise step must be a step of the 1000-step schedule
    for noise_step in (-1, 1000):
        with pytest.raises(ValueError, match="noise_step"):
            perturb_pixel_values("diffusion", rows, grid, noise_step=noise_step)


def test_empty_batch():
    # No image in the batch: nothing to perturb, an empty result of the same shape
    empty = torch.zeros(0, ROW)
    out = perturb_pixel_values("diffusion", empty, torch.zeros(0, 3, dtype=torch.long))
    assert out.shape == (0, ROW)


def test_gaussian_release_accumulates_noise_like_the_release():
    # The release adds N(0, 2^2) once per rollout to one shared input dict: 12 rollouts leave sigma 2 * sqrt(12)
    rows, grid, _ = batch_of([(10, 10)], [7])
    noise = (perturb_pixel_values("gaussian_release", rows, grid, seed=4, step=1, sigma=2.0) - rows).double()
    assert noise.std().item() == pytest.approx(2.0 * math.sqrt(12), rel=0.02)
    assert noise.std().item() == pytest.approx(6.93, rel=0.02)
    four = perturb_pixel_values("gaussian_release", rows, grid, seed=4, step=1, sigma=2.0, num_generations=4) - rows
    assert four.double().std().item() == pytest.approx(4.0, rel=0.02)


def test_gaussian_release_gives_every_rollout_of_a_prompt_the_same_image():
    # Three rollouts of one prompt carry the same image: in the release all of them see one noisy image
    rows, grid, _ = batch_of([(6, 6)], [3])
    batch = torch.cat([rows, rows, rows])
    grids = torch.cat([grid, grid, grid])
    out = perturb_pixel_values("gaussian_release", batch, grids, seed=1, step=0).split(rows.shape[0])
    assert torch.equal(out[0], out[1]) and torch.equal(out[1], out[2]) and not torch.equal(out[0], rows)


@pytest.mark.parametrize("num_generations, effective", [(12, "6.93"), (4, "4.00")])
def test_gaussian_release_is_described_as_it_behaves(num_generations, effective):
    # The noise accumulates over the run's rollouts per prompt, so the summary and model card state that run's sigma
    from types import SimpleNamespace

    from vepo_trl.run_summary import perturbation_text

    args = SimpleNamespace(perturbation="gaussian_release", noise_sigma=2.0, num_generations=num_generations)
    text = perturbation_text(args)
    assert f"over {num_generations} rollouts" in text and f"effective sigma {effective}" in text
    # (test_gaussian_release_accumulates_noise_like_the_release measures those sigmas on the noise itself)


def test_grouped_tile_seeds_keep_the_content_seed_for_the_first_of_identical_tiles():
    from vepo_trl.perturb.seeds import _grouped_tile_seeds, tile_seeds

    a, b = torch.full((3, 4, 4), 0.5), torch.full((3, 4, 4), -0.25)
    tiles = torch.stack([a, a, b, a])
    seeds = _grouped_tile_seeds(tiles, [(4, 4)] * 4, [4], seed=7, step=2)
    assert seeds[0] == tile_seeds(a[None], 7, 2)[0] and seeds[2] == tile_seeds(b[None], 7, 2)[0]
    assert len(set(seeds)) == 4  # the repeats of `a` get seeds of their own
    # Groups do not see each other: the same tile first in its own group has the content seed again
    assert _grouped_tile_seeds(tiles, [(4, 4)] * 4, [2, 2], seed=7, step=2)[2:] == tile_seeds(tiles[2:], 7, 2)


# --------------------------------------------------------------------------------------------------------------------
# Padded patch rows addressed by position ids (Gemma 4)
# --------------------------------------------------------------------------------------------------------------------


def gemma4_batch(sizes, seed=0, **call):
    """Random RGB images through transformers' real `Gemma4ImageProcessor` (its class defaults: patch 16,
    280 soft tokens, pooling 3, no normalisation)."""
    from PIL import Image
    from transformers.models.gemma4.image_processing_gemma4 import Gemma4ImageProcessor

    rng = np.random.default_rng(seed)
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]
    processor = Gemma4ImageProcessor()
    out = processor(images, return_tensors="pt", **call)
    return out["pixel_values"], out["image_position_ids"], processor


def test_positioned_layout_puts_the_processors_own_image_back_together():
    """Without a resize the processor only rescales and cuts: reassembling its rows gives the image it was handed,
    and cutting that again gives its rows in its order."""
    from PIL import Image
    from transformers.models.gemma4.image_processing_gemma4 import Gemma4ImageProcessor

    from vepo_trl.perturb import PositionedPatchLayout

    rng = np.random.default_rng(1)
    array = rng.integers(0, 256, (96, 144, 3), dtype=np.uint8)  # 6 x 9 patches of 16
    processor = Gemma4ImageProcessor()
    out = processor([Image.fromarray(array)], return_tensors="pt", do_resize=False)
    layout = PositionedPatchLayout.from_image_processor(processor)
    assert (layout.image_mean, layout.image_std, layout.patch_size) == ((0.0,) * 3, (1.0,) * 3, 16)
    real, columns, rows = layout.real_rows(out["image_position_ids"][0])
    assert int(real.sum()) == 54 and not real[54:].any()
    image = layout.to_image(out["pixel_values"][0][real], columns, rows)
    expected = torch.from_numpy(array).permute(2, 0, 1).float() / 255
    assert torch.allclose(image, expected, atol=1e-6)
    assert torch.equal(layout.to_rows(image, columns, rows), out["pixel_values"][0][real])


@pytest.mark.parametrize("name", ALL_PERTURBATIONS)
def test_positioned_layout_perturbs_real_patches_only_and_alone_as_batched(name):
    from vepo_trl.perturb import PositionedPatchLayout

    pixel_values, positions, processor = gemma4_batch([(300, 500), (200, 200), (120, 640)])
    layout = PositionedPatchLayout.from_image_processor(processor)
    out = perturb_pixel_values(name, pixel_values, None, layout, seed=3, step=2, image_position_ids=positions)
    assert out.shape == pixel_values.shape and out.dtype == pixel_values.dtype
    padding = (positions < 0).any(-1)
    assert padding.any() and torch.equal(out[padding], pixel_values[padding])
    assert not torch.equal(out[~padding], pixel_values[~padding])
    for index in range(3):
        # Alone, the image is perturbed exactly as in the batch (the padded length is the same for every image)
        alone = perturb_pixel_values(
            name, pixel_values[index : index + 1], None, layout, seed=3, step=2,
            image_position_ids=positions[index : index + 1],
        )  # fmt: skip
        assert torch.equal(alone[0], out[index])
        # And as one whole image `(C, H, W)` under an ImageLayout with the same statistics: same seed, same result
        real, columns, rows = layout.real_rows(positions[index])
        image = layout.to_image(pixel_values[index][real], columns, rows)
        as_tile = perturb_pixel_values(name, image[None], None, layout.image_layout, seed=3, step=2)[0]
        assert torch.equal(layout.to_rows(as_tile, columns, rows), out[index][real])


def test_positioned_layout_blacks_out_whole_patches_and_gives_identical_images_identical_noise():
    from vepo_trl.perturb import PositionedPatchLayout

    pixel_values, positions, processor = gemma4_batch([(256, 256), (256, 256)], seed=4)
    pixel_values[1], positions[1] = pixel_values[0], positions[0]  # the same image twice (G rollouts of a prompt)
    layout = PositionedPatchLayout.from_image_processor(processor)
    out = perturb_pixel_values(
        "patch_blackout", pixel_values, None, layout, seed=0, image_position_ids=positions, patch_probability=0.5
    )
    real = (positions[0] >= 0).all(-1)
    before, after = pixel_values[0][real], out[0][real]
    black = (after == 0).all(-1)
    # Every 16x16 patch (one row) either untouched or entirely black; about half of them black
    assert torch.equal(after[~black], before[~black]) and 0.35 < float(black.float().mean()) < 0.65
    assert torch.equal(out[0], out[1])
    noisy = perturb_pixel_values("diffusion", pixel_values, None, layout, seed=0, image_position_ids=positions)
    assert torch.equal(noisy[0], noisy[1])
    other = perturb_pixel_values("diffusion", pixel_values, None, layout, seed=0, step=1, image_position_ids=positions)
    assert not torch.equal(other[0], noisy[0])  # another step, another draw


def test_positioned_layout_refuses_inputs_it_cannot_place():
    from vepo_trl.perturb import PositionedPatchLayout

    pixel_values, positions, processor = gemma4_batch([(200, 200)])
    layout = PositionedPatchLayout.from_image_processor(processor)
    with pytest.raises(ValueError, match="need their image_position_ids"):
        perturb_pixel_values("diffusion", pixel_values, None, layout)
    with pytest.raises(ValueError, match=r"Expected pixel_values \(n_images, max_patches, 768\)"):
        perturb_pixel_values("diffusion", pixel_values[0], None, layout, image_position_ids=positions)
    doubled = positions.clone()
    doubled[0, 1] = doubled[0, 0]  # two rows claiming one cell
    with pytest.raises(ValueError, match="each cell once expected"):
        perturb_pixel_values("diffusion", pixel_values, None, layout, image_position_ids=doubled)
