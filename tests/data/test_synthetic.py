"""Tests for the synthetic visual-reasoning generator.

The answer checks read the PIXELS (connected components, seven-segment sampling, column scans) and only use the
module's layout constants, never the per-row metadata, so a drawing bug cannot hide behind a matching label.
"""

import contextlib
import hashlib
import io
import os
import re
import string
import subprocess
import sys

import datasets
import numpy as np
import pytest
from PIL import Image, ImageFont

import vepo_trl.data.synthetic as synthetic
from vepo_trl.data.synthetic import (
    AXIS_COLOUR,
    BACKGROUND,
    COLOURS,
    DEFAULT_IMAGE_MODES,
    GRID_COLOUR,
    MIN_IMAGE_SIDE,
    PANEL_COLOUR,
    SEGMENT_DIGIT_GAP,
    SEGMENT_DIGIT_HEIGHT,
    SEGMENT_DIGIT_WIDTH,
    SEGMENT_PANEL_PADDING,
    SEGMENT_RECTS,
    SUPPORTED_IMAGE_MODES,
    SYNTHETIC_TASKS,
    make_synthetic_dataset,
    make_synthetic_row,
    register_task,
    render_synthetic_sample,
)


KINDS = ("count_shapes", "read_number", "compare_bars", "trace_program")
# Small, odd, non-square and the largest default size: layout scaling bugs show up at the extremes.
SIZES = ((56, 56), (97, 61), (61, 97), (128, 128), (160, 120), (250, 181), (320, 240))
SEEDS = range(20)
CASES = [(seed, SIZES[seed % len(SIZES)]) for seed in SEEDS]


def _rgb(kind: str, seed: int, size: tuple[int, int]) -> tuple[np.ndarray, dict]:
    row = make_synthetic_row(kind, seed, image_size=size)
    image = row["images"][0]
    assert image.mode == "RGB" and image.size == size
    return np.asarray(image).astype(np.int16), row


def _components(mask: np.ndarray) -> list[tuple[int, int, int, int, int]]:
    """8-connected components of ``mask`` as (area, top, left, bottom, right), ordered left to right."""
    height, width = mask.shape
    grid = mask.tolist()
    seen = [[False] * width for _ in range(height)]
    found = []
    for y0, x0 in zip(*np.nonzero(mask)):
        if seen[y0][x0]:
            continue
        seen[y0][x0] = True
        stack, area = [(int(y0), int(x0))], 0
        top, left, bottom, right = height, width, -1, -1
        while stack:
            y, x = stack.pop()
            area += 1
            top, left, bottom, right = min(top, y), min(left, x), max(bottom, y), max(right, x)
            for ny in (y - 1, y, y + 1):
                for nx in (x - 1, x, x + 1):
                    if 0 <= ny < height and 0 <= nx < width and grid[ny][nx] and not seen[ny][nx]:
                        seen[ny][nx] = True
                        stack.append((ny, nx))
        found.append((area, top, left, bottom, right))
    return sorted(found, key=lambda c: c[2])


def _classify(area: int, top: int, left: int, bottom: int, right: int) -> str:
    # Fill ratio of the bounding box: square 1.0, circle ~0.75-0.81, triangle ~0.50-0.56 at the sizes drawn.
    ratio = area / ((bottom - top + 1) * (right - left + 1))
    if ratio > 0.95:
        return "square"
    if 0.68 < ratio < 0.9:
        return "circle"
    if ratio < 0.62:
        return "triangle"
    raise AssertionError(f"blob with fill ratio {ratio:.3f} is no known shape")


def _mentions(text: str, answer: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(answer)}(?!\w)", text) is not None


# ------------------------------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", SUPPORTED_IMAGE_MODES)
def test_same_arguments_give_identical_rows(kind: str, mode: str) -> None:
    first = make_synthetic_row(kind, 7, image_size=(97, 61), image_mode=mode)
    second = make_synthetic_row(kind, 7, image_size=(97, 61), image_mode=mode)
    a, b = first["images"][0], second["images"][0]
    assert a.mode == b.mode == mode
    assert a.tobytes() == b.tobytes()
    assert a.getpalette() == b.getpalette()
    assert (first["problem"], first["answer"], first["kind"]) == (second["problem"], second["answer"], kind)


@pytest.mark.parametrize("kind", KINDS)
def test_different_seeds_give_different_rows(kind: str) -> None:
    rows = [make_synthetic_row(kind, seed, image_size=(128, 96)) for seed in range(10)]
    assert len({row["images"][0].tobytes() for row in rows}) == len(rows)
    assert len({row["answer"] for row in rows}) > 1


def test_rows_do_not_depend_on_hash_seed_or_process() -> None:
    # Anything iterating a set or relying on global random state would break this.
    script = (
        "import hashlib\n"
        "from vepo_trl.data.synthetic import make_synthetic_dataset\n"
        "h = hashlib.sha256()\n"
        "for row in make_synthetic_dataset(12, seed=5):\n"
        "    h.update(row['images'][0].tobytes() + row['problem'].encode() + row['answer'].encode())\n"
        "print(h.hexdigest())\n"
    )
    digests = set()
    for hash_seed in ("1", "2"):
        result = subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            capture_output=True,
            text=True,
            check=True,
        )
        digests.add(result.stdout.strip())
    local = hashlib.sha256()
    for row in make_synthetic_dataset(12, seed=5):
        local.update(row["images"][0].tobytes() + row["problem"].encode() + row["answer"].encode())
    assert digests == {local.hexdigest()}


# ------------------------------------------------------------------------------------------------------ schema


@pytest.mark.parametrize("kind", KINDS)
def test_row_schema(kind: str) -> None:
    for seed, size in CASES[:7]:
        row = make_synthetic_row(kind, seed, image_size=size)
        assert set(row) == {"images", "problem", "answer", "kind"}
        assert row["kind"] == kind
        assert isinstance(row["images"], list) and len(row["images"]) == 1
        assert isinstance(row["images"][0], Image.Image)
        assert isinstance(row["problem"], str) and row["problem"].count("<image>") == 1
        assert row["problem"].startswith("<image>") and row["problem"].strip() != "<image>"
        assert isinstance(row["answer"], str) and row["answer"].strip() == row["answer"] != ""


def test_registry_holds_the_documented_kinds() -> None:
    assert set(KINDS) <= set(SYNTHETIC_TASKS)


@pytest.mark.parametrize("mode", SUPPORTED_IMAGE_MODES)
def test_modes_are_real_and_keep_the_drawing(mode: str) -> None:
    for kind in KINDS:
        rgb = make_synthetic_row(kind, 3, image_size=(97, 61))["images"][0]
        image = make_synthetic_row(kind, 3, image_size=(97, 61), image_mode=mode)["images"][0]
        assert image.mode == mode and image.size == (97, 61)
        if mode == "L":
            assert np.array_equal(np.asarray(image), np.asarray(rgb.convert("L")))
        elif kind in ("count_shapes", "read_number") or mode != "P":
            # Flat-colour drawings fit an exact palette; RGBA / CMYK conversions are lossless for every kind.
            assert image.convert("RGB").tobytes() == rgb.tobytes()


def test_dataset_round_trip_keeps_pil_images_and_modes(tmp_path) -> None:
    kinds = ["read_number", "count_shapes", "trace_program"]
    for mode in SUPPORTED_IMAGE_MODES:
        ds = make_synthetic_dataset(3, seed=2, kinds=kinds, image_sizes=[(97, 61), (64, 80)], image_modes=[mode])
        assert isinstance(ds.features["images"], datasets.List)
        assert isinstance(ds.features["images"].feature, datasets.Image)
        ds.save_to_disk(str(tmp_path / mode))
        reloaded = datasets.load_from_disk(str(tmp_path / mode))
        for i, row in enumerate(reloaded):
            (image,) = row["images"]
            assert isinstance(image, Image.Image) and image.mode == mode
            # The documented row formula: any row can be regenerated on its own.
            expected = make_synthetic_row(kinds[i], 2 * 1_000_003 + i, image_size=image.size, image_mode=mode)
            assert image.tobytes() == expected["images"][0].tobytes()
            assert (row["problem"], row["answer"], row["kind"]) == (
                expected["problem"],
                expected["answer"],
                expected["kind"],
            )


def test_default_dataset_mixes_sizes_and_modes() -> None:
    ds = make_synthetic_dataset(60, seed=0)
    assert len(ds) == 60
    assert ds["kind"][:4] == sorted(SYNTHETIC_TASKS)
    images = [row["images"][0] for row in ds]
    modes = [image.mode for image in images]
    assert set(modes) == set(DEFAULT_IMAGE_MODES)
    assert modes.count("RGB") > len(modes) / 2
    assert len({image.size for image in images}) >= 5
    # A grayscale image cannot answer "how many red circles": the default mix keeps colour tasks in colour.
    assert all(mode != "L" for mode, kind in zip(modes, ds["kind"]) if kind == "count_shapes")
    assert len(make_synthetic_dataset(0)) == 0


# -------------------------------------------------------------------------------- answers verified from pixels


@pytest.mark.parametrize(("seed", "size"), CASES)
def test_count_shapes_answer_matches_pixels(seed: int, size: tuple[int, int]) -> None:
    pixels, row = _rgb("count_shapes", seed, size)
    match = re.fullmatch(r"<image>How many (\w+) (circle|square|triangle)s are in the picture\?", row["problem"])
    assert match, row["problem"]
    colour, shape = match.groups()
    by_colour = {
        name: [_classify(*c) for c in _components(np.all(pixels == rgb, axis=-1))] for name, rgb in COLOURS.items()
    }
    assert by_colour[colour].count(shape) == int(row["answer"])
    assert 1 <= int(row["answer"]) <= 6
    # Distractors share exactly one attribute, so the question needs both colour and shape.
    assert any(found != shape for found in by_colour[colour])
    assert any(shape in found for name, found in by_colour.items() if name != colour)
    # Nothing but the background and the palette colours: shapes are flat fills that never overlap.
    known = np.all(pixels == BACKGROUND, axis=-1)
    for rgb in COLOURS.values():
        known |= np.all(pixels == rgb, axis=-1)
    assert known.all()


# Written out here rather than imported: decoding with the generator's own table could not catch a wrong table.
STANDARD_DIGITS = {
    "abcdef": "0",
    "bc": "1",
    "abdeg": "2",
    "abcdg": "3",
    "bcfg": "4",
    "acdfg": "5",
    "acdefg": "6",
    "abc": "7",
    "abcdefg": "8",
    "abcdfg": "9",
}


def test_seven_segment_layout_is_standard() -> None:
    # Segment a is the top bar, b the top right, ... g the middle: check each rectangle sits where its name says.
    where = {
        "a": lambda x, y: 0.3 < x < 0.7 and y < 0.2,
        "b": lambda x, y: x > 0.8 and 0.1 < y < 0.5,
        "c": lambda x, y: x > 0.8 and 0.5 < y < 0.9,
        "d": lambda x, y: 0.3 < x < 0.7 and y > 0.8,
        "e": lambda x, y: x < 0.2 and 0.5 < y < 0.9,
        "f": lambda x, y: x < 0.2 and 0.1 < y < 0.5,
        "g": lambda x, y: 0.3 < x < 0.7 and 0.4 < y < 0.6,
    }
    assert set(SEGMENT_RECTS) == set(where)
    cells = set()
    for name, (x0, y0, x1, y1) in SEGMENT_RECTS.items():
        assert 0 <= x0 < x1 <= SEGMENT_DIGIT_WIDTH and 0 <= y0 < y1 <= SEGMENT_DIGIT_HEIGHT
        assert where[name]((x0 + x1) / 2 / SEGMENT_DIGIT_WIDTH, (y0 + y1) / 2 / SEGMENT_DIGIT_HEIGHT), name
        covered = {(x, y) for x in range(x0, x1) for y in range(y0, y1)}
        assert not covered & cells, f"segment {name} overlaps another"
        cells |= covered


def test_colour_names_match_their_rgb() -> None:
    # The count test trusts COLOURS to map a name to its fill; make sure each name describes its RGB value.
    r, g, b = zip(*(COLOURS[name] for name in ("red", "green", "blue", "orange", "purple")))
    assert r[0] > 2 * max(g[0], b[0]) and g[1] > 2 * max(r[1], b[1]) and b[2] > 2 * max(r[2], g[2])
    assert r[3] > g[3] > 2 * b[3] and min(r[4], b[4]) > 2 * g[4]
    assert len(set(COLOURS.values())) == len(COLOURS)


def _decode_seven_segment(pixels: np.ndarray) -> str:
    ink = np.any(pixels != BACKGROUND, axis=-1)
    ys, xs = np.nonzero(ink)
    top, left = ys.min(), xs.min()
    panel_h, panel_w = ys.max() - top + 1, xs.max() - left + 1
    assert np.all(ink[top : top + panel_h, left : left + panel_w]), "the panel is not a solid rectangle"
    unit, rest = divmod(int(panel_h), 2 * SEGMENT_PANEL_PADDING + SEGMENT_DIGIT_HEIGHT)
    assert rest == 0 and unit >= 2
    digits, rest = divmod(
        panel_w // unit - 2 * SEGMENT_PANEL_PADDING + SEGMENT_DIGIT_GAP, SEGMENT_DIGIT_WIDTH + SEGMENT_DIGIT_GAP
    )
    assert rest == 0 and panel_w % unit == 0 and 1 <= digits <= 3
    by_segments = {frozenset(segments): digit for segments, digit in STANDARD_DIGITS.items()}
    text = ""
    for index in range(digits):
        digit_x = SEGMENT_PANEL_PADDING + index * (SEGMENT_DIGIT_WIDTH + SEGMENT_DIGIT_GAP)
        lit = set()
        for name, (x0, y0, x1, y1) in SEGMENT_RECTS.items():
            px = left + int((digit_x + (x0 + x1) / 2) * unit)
            py = top + int((SEGMENT_PANEL_PADDING + (y0 + y1) / 2) * unit)
            if tuple(pixels[py, px]) != PANEL_COLOUR:
                lit.add(name)
        assert frozenset(lit) in by_segments, f"segments {sorted(lit)} are no digit"
        text += by_segments[frozenset(lit)]
    return text


@pytest.mark.parametrize(("seed", "size"), CASES)
def test_read_number_answer_matches_pixels(seed: int, size: tuple[int, int]) -> None:
    pixels, row = _rgb("read_number", seed, size)
    shown = _decode_seven_segment(pixels)
    assert shown == row["answer"]
    assert shown == str(int(shown)), "no leading zeros: the display shows exactly the number"


def _measure_bars(pixels: np.ndarray) -> tuple[list[int], int]:
    """Bar heights in grid units, left to right, and the grid unit in pixels, read from the image."""
    saturated = (pixels.max(axis=-1) - pixels.min(axis=-1)) > 60
    bars = _components(saturated)
    assert 3 <= len(bars) <= 5
    for area, top, left, bottom, right in bars:
        assert area == (bottom - top + 1) * (right - left + 1), "bars are solid rectangles"
    bottoms = {bottom for _, _, _, bottom, _ in bars}
    assert len(bottoms) == 1, "all bars stand on the same axis"
    baseline = bottoms.pop() + 1
    assert np.all(pixels[baseline, bars[0][2] : bars[-1][4] + 1] == AXIS_COLOUR)

    grid = np.all(pixels == GRID_COLOUR, axis=-1).sum(axis=1) >= 0.2 * pixels.shape[1]
    grid_rows = sorted(np.nonzero(grid)[0].tolist(), reverse=True)
    assert grid_rows, "no grid lines"
    unit = baseline - grid_rows[0]
    assert unit >= 3
    assert grid_rows == [baseline - k * unit for k in range(1, len(grid_rows) + 1)], "grid lines are evenly spaced"
    heights = []
    for _, top, _, bottom, _ in bars:
        units, rest = divmod(bottom - top + 1, unit)
        assert rest == 0 and 1 <= units <= len(grid_rows), "bar tops sit on grid lines"
        heights.append(units)
    return heights, unit


@pytest.mark.parametrize(("seed", "size"), CASES)
def test_compare_bars_answer_matches_pixels(seed: int, size: tuple[int, int]) -> None:
    pixels, row = _rgb("compare_bars", seed, size)
    heights, _ = _measure_bars(pixels)
    assert len(set(heights)) == len(heights), "distinct heights keep the answer unique"
    labels = string.ascii_uppercase[: len(heights)]
    height_question = re.fullmatch(r"<image>What is the height of bar ([A-Z]) in grid units\?.*", row["problem"])
    if height_question:
        assert height_question.group(1) in labels
        assert row["answer"] == str(heights[labels.index(height_question.group(1))])
    else:
        assert row["problem"] == "<image>Which bar in the chart is the tallest? Reply with its letter."
        assert row["answer"] == labels[heights.index(max(heights))]


def test_compare_bars_asks_both_variants() -> None:
    problems = [make_synthetic_row("compare_bars", seed, image_size=(97, 61))["problem"] for seed in SEEDS]
    assert any("tallest" in p for p in problems) and any("height of bar" in p for p in problems)


def _ink_bands(ink: np.ndarray) -> int:
    rows = ink.any(axis=1)
    return int(rows[0]) + int(np.count_nonzero(rows[1:] & ~rows[:-1]))


@pytest.mark.parametrize(("seed", "size"), CASES)
def test_trace_program_answer_matches_program(seed: int, size: tuple[int, int]) -> None:
    pixels, row = _rgb("trace_program", seed, size)
    sample = render_synthetic_sample("trace_program", seed, image_size=size)
    program = sample.metadata["program"]
    # ``first = k`` / ``second = first op k`` / ``print(second op k)`` or ``print(first op second)``.
    shape = r"(\w) ?= ?\d\n(\w) ?= ?\1 ?[-+*] ?\d\nprint\((\2 ?[-+*] ?\d|\1 ?[-+*] ?\2)\)"
    assert re.fullmatch(shape, program), program
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(program, {"__builtins__": {"print": print}})
    assert out.getvalue() == row["answer"] + "\n"
    # The row's image is the rendering of that program, and rendering is reproducible.
    assert sample.image.tobytes() == row["images"][0].tobytes()
    assert render_synthetic_sample("trace_program", seed, image_size=size).image.tobytes() == sample.image.tobytes()
    # Legible text: a real amount of dark ink, one band of rows per program line, nothing clipped at the border.
    luminance = pixels.mean(axis=-1)
    assert (luminance < 128).sum() > 60
    visible = luminance < 250  # faint antialiased edges count, so a glyph never splits into two bands
    assert _ink_bands(visible) == 3
    assert not (visible[0].any() or visible[-1].any() or visible[:, 0].any() or visible[:, -1].any())


@pytest.mark.skipif(not hasattr(ImageFont, "load_default_imagefont"), reason="needs Pillow >= 10.1")
def test_text_fallback_for_fixed_size_bitmap_font(monkeypatch) -> None:
    # Old Pillow (or no FreeType) only has a fixed-size bitmap font: text must be scaled into the box, not clipped.
    monkeypatch.setattr(synthetic, "_font", lambda size: ImageFont.load_default_imagefont())
    for seed, size in CASES[:7]:
        luminance = np.asarray(render_synthetic_sample("trace_program", seed, image_size=size).image).mean(axis=-1)
        visible = luminance < 250
        assert _ink_bands(visible) == 3 and (luminance < 128).sum() > 30
        assert not (visible[0].any() or visible[-1].any() or visible[:, 0].any() or visible[:, -1].any())
        bars = np.asarray(render_synthetic_sample("compare_bars", seed, image_size=size).image).astype(np.int16)
        _measure_bars(bars)


# ------------------------------------------------------------------------------------------ answer not leaked


@pytest.mark.parametrize("kind", KINDS)
def test_problem_does_not_leak_the_answer(kind: str) -> None:
    for seed, size in CASES:
        row = make_synthetic_row(kind, seed, image_size=size)
        problem = row["problem"]
        assert not re.search(r"\d", problem), problem
        if kind == "compare_bars" and "height of bar" in problem:
            continue  # the question names a bar letter; the numeric answer is covered by the digit check
        assert not _mentions(problem, row["answer"]), (problem, row["answer"])


# ------------------------------------------------------------------------------------------------- bad input


def test_unknown_kind_lists_valid_kinds() -> None:
    with pytest.raises(ValueError, match=r"--kind 'nope': must be a synthetic task kind.*count_shapes.*read_number"):
        make_synthetic_row("nope", 0)
    with pytest.raises(ValueError, match="must be a synthetic task kind"):
        make_synthetic_dataset(2, kinds=["count_shapes", "nope"])


@pytest.mark.parametrize("size", [(55, 100), (100, 55), (10, 10), (0, 0)])
def test_too_small_size_is_rejected(size: tuple[int, int]) -> None:
    with pytest.raises(ValueError, match=rf"--image_size .*pixels in {MIN_IMAGE_SIDE}\.\."):
        make_synthetic_row("count_shapes", 0, image_size=size)
    with pytest.raises(ValueError, match="--image_size"):
        make_synthetic_dataset(1, image_sizes=[size])


def test_smallest_allowed_size_works_for_every_kind() -> None:
    for kind in KINDS:
        assert make_synthetic_row(kind, 0, image_size=(MIN_IMAGE_SIDE, MIN_IMAGE_SIDE))["images"][0].size == (56, 56)


@pytest.mark.parametrize("size", [(100,), (100, 100, 3), (100.0, 100), (100, 5000), 100, (True, 100)])
def test_malformed_size_is_rejected(size) -> None:
    with pytest.raises(ValueError, match="image_size"):
        make_synthetic_row("read_number", 0, image_size=size)


@pytest.mark.parametrize("mode", ["rgb", "1", "YCbCr", "LA", ""])
def test_unknown_mode_is_rejected(mode: str) -> None:
    with pytest.raises(ValueError, match=r"--image_mode .*one of CMYK, L, P, RGB, RGBA"):
        make_synthetic_row("read_number", 0, image_mode=mode)
    with pytest.raises(ValueError, match="--image_mode"):
        make_synthetic_dataset(1, image_modes=[mode])


def test_bad_counts_and_seeds_are_rejected() -> None:
    with pytest.raises(ValueError, match="seed"):
        make_synthetic_row("read_number", -1)
    with pytest.raises(ValueError, match="num_rows"):
        make_synthetic_dataset(-1)
    with pytest.raises(ValueError, match="kinds"):
        make_synthetic_dataset(1, kinds=[])


def test_register_task_rejects_duplicates_and_accepts_new_kinds() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_task("count_shapes")(SYNTHETIC_TASKS["read_number"])
    assert SYNTHETIC_TASKS["count_shapes"].__name__ == "_count_shapes"

    def blank(rng, width, height):
        return SYNTHETIC_TASKS["read_number"](rng, width, height)

    register_task("test_only_kind")(blank)
    try:
        assert make_synthetic_row("test_only_kind", 4, image_size=(64, 64))["kind"] == "test_only_kind"
    finally:
        del SYNTHETIC_TASKS["test_only_kind"]
