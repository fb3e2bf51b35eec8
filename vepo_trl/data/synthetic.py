"""Deterministic synthetic visual-reasoning rows in the Geometry3K schema.

Every row has the columns of ``hiyouga/geometry3k`` -- ``images`` (a list holding one PIL image), ``problem`` (a
string with the ``<image>`` placeholder exactly once) and ``answer`` (a string) -- plus ``kind``, the name of the task
that produced it. The answer is only knowable by looking at the image: the problem text never contains it.

Rows are a pure function of ``(kind, seed, image_size, image_mode)``: every random choice comes from a private
``random.Random(seed)``, so the same arguments give byte-identical images for a given Pillow version (text is
rasterised by FreeType, whose output may change between Pillow releases). That makes the data usable as a fixture
for tests and benchmarks that need real-looking multimodal rows without any hub access.

Task kinds live in :data:`SYNTHETIC_TASKS`; add one with :func:`register_task`.
"""

import functools
import random
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import datasets
from PIL import Image, ImageDraw, ImageFont

from ..registry import Registry
from ..rules import Rule, check_value


__all__ = [
    "SYNTHETIC_TASKS",
    "SyntheticSample",
    "make_synthetic_dataset",
    "make_synthetic_row",
    "register_synthetic_task",
    "register_task",
    "render_synthetic_sample",
]

IMAGE_PLACEHOLDER = "<image>"
# Below 56 px the seven-segment panel and the bar chart can no longer be drawn with >= 2 px strokes.
MIN_IMAGE_SIDE = 56
# Guards against a typo (e.g. 22400) allocating gigabytes; real VLM inputs are far smaller.
MAX_IMAGE_SIDE = 4096
DEFAULT_IMAGE_SIZE = (224, 224)
# Square, landscape, portrait and odd sizes, so that resizing / patching code downstream sees awkward shapes.
DEFAULT_IMAGE_SIZES: tuple[tuple[int, int], ...] = (
    (56, 56),
    (97, 61),
    (128, 128),
    (160, 120),
    (224, 224),
    (250, 181),
    (320, 240),
    (81, 143),
)
SUPPORTED_IMAGE_MODES = ("RGB", "L", "RGBA", "P", "CMYK")
# Repeating "RGB" weights the default mix: most rows are plain RGB, the rest exercise RGB conversion downstream.
DEFAULT_IMAGE_MODES: tuple[str, ...] = ("RGB",) * 6 + ("L", "RGBA", "P", "CMYK")

BACKGROUND = (255, 255, 255)
# Saturated colours that are far apart in RGB, so a flat fill is unambiguous to a model and to a pixel test.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 160, 60),
    "blue": (40, 90, 220),
    "orange": (240, 150, 20),
    "purple": (150, 60, 190),
}
SHAPES = ("circle", "square", "triangle")

# Seven-segment layout, in "units" (the stroke thickness). A digit is 5 x 9 units; segments are axis-aligned
# rectangles (x0, y0, x1, y1), half-open, so a reader can decode a digit by sampling each rectangle's centre.
SEGMENT_DIGIT_WIDTH = 5
SEGMENT_DIGIT_HEIGHT = 9
SEGMENT_DIGIT_GAP = 2
SEGMENT_PANEL_PADDING = 2
SEGMENT_RECTS: dict[str, tuple[int, int, int, int]] = {
    "a": (1, 0, 4, 1),  # top
    "b": (4, 1, 5, 4),  # top right
    "c": (4, 5, 5, 8),  # bottom right
    "d": (1, 8, 4, 9),  # bottom
    "e": (0, 5, 1, 8),  # bottom left
    "f": (0, 1, 1, 4),  # top left
    "g": (1, 4, 4, 5),  # middle
}
DIGIT_SEGMENTS: dict[int, str] = {
    0: "abcdef",
    1: "bc",
    2: "abdeg",
    3: "abcdg",
    4: "bcfg",
    5: "acdfg",
    6: "acdefg",
    7: "abc",
    8: "abcdefg",
    9: "abcdfg",
}
# Lit segments sit on a dark panel (like an LED display); the panel's bounding box gives the reader the unit size.
PANEL_COLOUR = (30, 30, 30)
SEGMENT_COLOURS = ((255, 70, 70), (90, 255, 90), (255, 190, 0), (90, 220, 255))

# Bar charts: grey horizontal grid lines one "grid unit" apart, black axes, saturated bars.
GRID_COLOUR = (200, 200, 200)
AXIS_COLOUR = (0, 0, 0)
TEXT_COLOUR = (0, 0, 0)


@dataclass(frozen=True)
class SyntheticSample:
    """What a task generator draws: an RGB image, the question (without placeholder) and its answer.

    ``metadata`` records how the image was made (e.g. the program text for ``trace_program``); it never goes into
    a dataset row, it only lets tests and debugging code inspect the generator.
    """

    image: Image.Image
    question: str
    answer: str
    metadata: dict[str, Any] = field(default_factory=dict)


TaskFn = Callable[[random.Random, int, int], SyntheticSample]

SYNTHETIC_TASKS: Registry[TaskFn] = Registry("synthetic task")
# Tasks whose question names a colour: in mode "L" the colour is gone, so the default dataset mix avoids "L" for them.
_COLOUR_TASKS: set[str] = set()


def register_task(name: str, *, needs_colour: bool = False) -> Callable[[TaskFn], TaskFn]:
    """Register ``fn(rng, width, height) -> SyntheticSample`` as the task kind ``name``.

    The generator must take every random choice from ``rng`` (never the global ``random`` state) and return an RGB
    image of exactly ``(width, height)``. Set ``needs_colour`` when the question refers to colours, so the default
    dataset mix does not render it in grayscale. Registering a name twice raises ``ValueError``: silently replacing a
    task would change existing datasets.
    """

    def decorator(fn: TaskFn) -> TaskFn:
        SYNTHETIC_TASKS.add(name, fn, module=getattr(fn, "__module__", None))
        if needs_colour:
            _COLOUR_TASKS.add(name)
        return fn

    return decorator


register_synthetic_task = register_task  # the name the package exports (`vepo_trl.register_synthetic_task`)


# ---------------------------------------------------------------------------------------------------------------
# Drawing helpers
# ---------------------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=128)
def _font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    """Pillow's bundled font at ``size`` px (works offline); the fixed bitmap font on Pillow < 10.1."""
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, ImportError, OSError):
        # Pillow < 10.1 has no ``size`` argument, and builds without FreeType cannot scale the font.
        return ImageFont.load_default()


def _draw_text(
    image: Image.Image,
    rng: random.Random,
    text: str,
    box: tuple[int, int, int, int],
    *,
    max_size: int,
    centre: bool = False,
) -> None:
    """Draw ``text`` (may be multi-line) as large as fits in ``box`` = (x0, y0, x1, y1), randomly placed inside it.

    Sizes are searched from ``max_size`` down so short labels stay readable on small images. If even the smallest
    font does not fit (only possible with the fixed bitmap fallback font), the text is rendered on its own canvas and
    downscaled into the box, so it is never clipped.
    """
    x0, y0, x1, y1 = box
    box_w, box_h = x1 - x0, y1 - y0
    draw = ImageDraw.Draw(image)
    for size in range(max(max_size, 6), 5, -1):
        font = _font(size)
        spacing = max(3, size // 2)  # keeps blank pixel rows between lines, even with descenders and antialiasing
        left, top, right, bottom = draw.multiline_textbbox((0, 0), text, font=font, spacing=spacing)
        text_w, text_h = right - left, bottom - top
        if text_w <= box_w and text_h <= box_h:
            break
    if text_w > box_w or text_h > box_h:
        # Wide line gaps survive the downscale; BOX filtering averages pixels without LANCZOS ringing.
        spacing = 8
        left, top, right, bottom = draw.multiline_textbbox((0, 0), text, font=font, spacing=spacing)
        text_w, text_h = right - left, bottom - top
        canvas = Image.new("RGB", (text_w, text_h), BACKGROUND)
        ImageDraw.Draw(canvas).multiline_text((-left, -top), text, font=font, fill=TEXT_COLOUR, spacing=spacing)
        scale = min(box_w / text_w, box_h / text_h)
        canvas = canvas.resize((max(1, int(text_w * scale)), max(1, int(text_h * scale))), Image.Resampling.BOX)
        image.paste(canvas, (x0 + (box_w - canvas.width) // 2, y0 + (box_h - canvas.height) // 2))
        return
    if centre:
        x, y = x0 + (box_w - text_w) // 2, y0 + (box_h - text_h) // 2
    else:
        x, y = x0 + rng.randint(0, box_w - text_w), y0 + rng.randint(0, box_h - text_h)
    draw.multiline_text((x - left, y - top), text, font=font, fill=TEXT_COLOUR, spacing=spacing)


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, x: int, y: int, size: int, fill: tuple[int, int, int]) -> None:
    # ImageDraw does not antialias these primitives, so every pixel of a shape is exactly ``fill``.
    x1, y1 = x + size - 1, y + size - 1
    if shape == "circle":
        draw.ellipse((x, y, x1, y1), fill=fill)
    elif shape == "square":
        draw.rectangle((x, y, x1, y1), fill=fill)
    elif shape == "triangle":
        draw.polygon([(x + (size - 1) // 2, y), (x, y1), (x1, y1)], fill=fill)
    else:  # pragma: no cover - guarded by SHAPES
        raise ValueError(f"unknown shape {shape!r}")


# ---------------------------------------------------------------------------------------------------------------
# Task kinds
# ---------------------------------------------------------------------------------------------------------------


@register_task("count_shapes", needs_colour=True)
def _count_shapes(rng: random.Random, width: int, height: int) -> SyntheticSample:
    """1-6 shapes of a target colour and kind, plus distractors that share only the colour or only the kind."""
    image = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(image)
    # One shape per grid cell, inset by a pixel: shapes never overlap or touch, so each is one connected blob.
    cell = max(14, min(width, height) // 4)
    cols, rows = width // cell, height // cell
    cell_w, cell_h = width // cols, height // rows
    cells = [(c, r) for r in range(rows) for c in range(cols)]
    rng.shuffle(cells)

    colour, shape = rng.choice(sorted(COLOURS)), rng.choice(SHAPES)
    count = rng.randint(1, 6)
    other_colours = [c for c in sorted(COLOURS) if c != colour]
    other_shapes = [s for s in SHAPES if s != shape]
    # The first two distractors differ in exactly one attribute, so answering needs both colour and shape.
    distractors = [(colour, rng.choice(other_shapes)), (rng.choice(other_colours), shape)]
    for _ in range(rng.randint(0, min(4, len(cells) - count - 2))):
        candidate = (rng.choice(sorted(COLOURS)), rng.choice(SHAPES))
        distractors.append(candidate if candidate != (colour, shape) else (colour, rng.choice(other_shapes)))

    inner = min(cell_w, cell_h) - 2
    for (col, row), (c_name, s_name) in zip(cells, [(colour, shape)] * count + distractors):
        size = rng.randint(max(8, inner * 11 // 20), inner)
        x = col * cell_w + 1 + rng.randint(0, cell_w - 2 - size)
        y = row * cell_h + 1 + rng.randint(0, cell_h - 2 - size)
        _draw_shape(draw, s_name, x, y, size, COLOURS[c_name])
    return SyntheticSample(
        image=image,
        question=f"How many {colour} {shape}s are in the picture?",
        answer=str(count),
        metadata={"colour": colour, "shape": shape, "distractors": distractors},
    )


def _panel_units(num_digits: int) -> tuple[int, int]:
    """Width and height of a seven-segment panel holding ``num_digits`` digits, in units."""
    width = 2 * SEGMENT_PANEL_PADDING + num_digits * SEGMENT_DIGIT_WIDTH + (num_digits - 1) * SEGMENT_DIGIT_GAP
    return width, 2 * SEGMENT_PANEL_PADDING + SEGMENT_DIGIT_HEIGHT


@register_task("read_number")
def _read_number(rng: random.Random, width: int, height: int) -> SyntheticSample:
    """A 1-3 digit number on a seven-segment display; every stroke is an exact filled rectangle."""
    num_digits = rng.randint(1, 3)
    number = rng.randint(0 if num_digits == 1 else 10 ** (num_digits - 1), 10**num_digits - 1)
    panel_w, panel_h = _panel_units(num_digits)
    # Integer unit size keeps every segment edge on the pixel grid; >= 2 px so the strokes stay visible.
    max_unit = min((width - 2) // panel_w, (height - 2) // panel_h)
    unit = rng.randint(max(2, (max_unit * 3 + 4) // 5), max(2, max_unit))
    px_w, px_h = panel_w * unit, panel_h * unit
    left, top = rng.randint(0, width - px_w), rng.randint(0, height - px_h)

    image = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(image)
    draw.rectangle((left, top, left + px_w - 1, top + px_h - 1), fill=PANEL_COLOUR)
    lit = rng.choice(SEGMENT_COLOURS)
    for index, digit in enumerate(f"{number:0{num_digits}d}"):
        digit_x = SEGMENT_PANEL_PADDING + index * (SEGMENT_DIGIT_WIDTH + SEGMENT_DIGIT_GAP)
        for segment in DIGIT_SEGMENTS[int(digit)]:
            sx0, sy0, sx1, sy1 = SEGMENT_RECTS[segment]
            draw.rectangle(
                (
                    left + (digit_x + sx0) * unit,
                    top + (SEGMENT_PANEL_PADDING + sy0) * unit,
                    left + (digit_x + sx1) * unit - 1,
                    top + (SEGMENT_PANEL_PADDING + sy1) * unit - 1,
                ),
                fill=lit,
            )
    return SyntheticSample(
        image=image,
        question="What number is shown on the display?",
        answer=str(number),
        metadata={"unit": unit, "origin": (left, top)},
    )


@register_task("compare_bars")
def _compare_bars(rng: random.Random, width: int, height: int) -> SyntheticSample:
    """3-5 lettered bars with distinct integer heights on a unit grid; asks for the tallest bar or one height."""
    num_bars = rng.randint(3, 5)
    grid_max = rng.randint(max(num_bars, 5), 9)
    heights = rng.sample(range(1, grid_max + 1), num_bars)  # distinct, so "tallest" has a unique answer
    labels = string.ascii_uppercase[:num_bars]

    margin = max(2, min(width, height) // 20)
    label_h = max(9, height // 8)
    plot_x0, plot_x1 = margin + 1, width - margin  # the y axis takes the column at ``margin``
    baseline = height - margin - label_h  # the x axis row; bars stand on it
    unit = (baseline - margin) // grid_max
    slot = (plot_x1 - plot_x0) // num_bars
    bar_w = max(3, slot * 3 // 5)

    image = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(image)
    for k in range(1, grid_max + 1):
        draw.line((plot_x0, baseline - k * unit, plot_x1 - 1, baseline - k * unit), fill=GRID_COLOUR)
    draw.line((margin, baseline - grid_max * unit, margin, baseline), fill=AXIS_COLOUR)
    draw.line((margin, baseline, plot_x1 - 1, baseline), fill=AXIS_COLOUR)
    colour = COLOURS[rng.choice(sorted(COLOURS))]
    for index, bar_height in enumerate(heights):
        x0 = plot_x0 + index * slot + (slot - bar_w) // 2
        # Exactly ``bar_height * unit`` pixel rows above the axis: the top row covers grid line ``bar_height``.
        draw.rectangle((x0, baseline - bar_height * unit, x0 + bar_w - 1, baseline - 1), fill=colour)
        label_box = (x0 + bar_w // 2 - slot // 2, baseline + 2, x0 + bar_w // 2 + slot - slot // 2, height - 1)
        _draw_text(image, rng, labels[index], label_box, max_size=label_h, centre=True)

    if rng.random() < 0.5:
        tallest = labels[heights.index(max(heights))]
        question, answer = "Which bar in the chart is the tallest? Reply with its letter.", tallest
    else:
        target = rng.randrange(num_bars)
        question = f"What is the height of bar {labels[target]} in grid units? Count the grid lines."
        answer = str(heights[target])
    return SyntheticSample(image=image, question=question, answer=answer, metadata={"heights": heights, "unit": unit})


@register_task("trace_program")
def _trace_program(rng: random.Random, width: int, height: int) -> SyntheticSample:
    """A three-line straight-line program with small integers and + - *; the answer is what it prints."""
    first, second = rng.choice((("a", "b"), ("x", "y"), ("m", "n"), ("p", "q"), ("u", "v")))

    def term(op: str) -> int:
        # Keep products small so the answer is mental arithmetic, not a multiplication table exercise.
        return rng.randint(2, 4) if op == "*" else rng.randint(1, 9)

    start = rng.randint(1, 9)
    op1 = rng.choice("+-*")
    c1 = term(op1)
    middle = _apply(start, op1, c1)
    op2 = rng.choice("+-*")
    if rng.random() < 0.5:
        c2 = term(op2)
        lhs, rhs, printed = second, str(c2), _apply(middle, op2, c2)
    else:
        lhs, rhs, printed = first, second, _apply(start, op2, middle)
    # Narrow images drop the spaces around operators: a few extra pixels per glyph matter at 56 px.
    sp = " " if width >= 128 else ""
    program = f"{first}{sp}={sp}{start}\n{second}{sp}={sp}{first}{sp}{op1}{sp}{c1}\nprint({lhs}{sp}{op2}{sp}{rhs})"

    image = Image.new("RGB", (width, height), BACKGROUND)
    margin = max(3, min(width, height) // 16)
    _draw_text(image, rng, program, (margin, margin, width - margin, height - margin), max_size=height // 5)
    return SyntheticSample(
        image=image,
        question="What does the program in the image print?",
        answer=str(printed),
        metadata={"program": program},
    )


def _apply(left: int, op: str, right: int) -> int:
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    raise ValueError(f"unsupported operator {op!r}")  # pragma: no cover - the generator only emits + - *


# ---------------------------------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------------------------------


# The generator's arguments, each against its rule (`rules.check_value`: one line naming the argument)
def _side(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and MIN_IMAGE_SIDE <= value <= MAX_IMAGE_SIDE


def _pair(size):
    """A size, which must be a (width, height) pair (each side then checked against its rule)."""
    if not (isinstance(size, (tuple, list)) and len(size) == 2):
        raise ValueError(f"--image_size {size!r}: must be {_RULES['image_size'].valid}.")
    return size


_RULES = {
    "kind": Rule("choice", "a synthetic task kind", choices=lambda: sorted(SYNTHETIC_TASKS)),
    # random.Random folds the sign of an int seed (Random(-3) == Random(3)): refusing negatives avoids silent twins
    "seed": Rule("whole", "a whole number >= 0", lambda v: v >= 0),
    "num_rows": Rule("whole", "a whole number >= 0", lambda v: v >= 0),
    "image_size": Rule(
        "numbers",
        f"a (width, height) pair of whole numbers of pixels in {MIN_IMAGE_SIDE}..{MAX_IMAGE_SIDE} (smaller drawings "
        "are not legible)",
        _side,
    ),
    "image_mode": Rule("choice", "an image mode", choices=lambda: SUPPORTED_IMAGE_MODES),
}


def render_synthetic_sample(kind: str, seed: int, *, image_size: tuple[int, int] | None = None) -> SyntheticSample:
    """Run task ``kind`` with ``random.Random(seed)`` and return its RGB :class:`SyntheticSample` (with metadata).

    ``image_size`` is ``(width, height)``, both sides in ``[56, 4096]``; ``None`` means :data:`DEFAULT_IMAGE_SIZE`.
    """
    image_size = DEFAULT_IMAGE_SIZE if image_size is None else image_size
    for name, value in (("kind", kind), ("seed", seed), ("image_size", _pair(image_size))):
        check_value(name, value, _RULES[name])
    width, height = image_size
    sample = SYNTHETIC_TASKS[kind](random.Random(seed), width, height)
    # Generators are pluggable, so enforce the contract here rather than trusting each one.
    if sample.image.mode != "RGB" or sample.image.size != (width, height):
        raise ValueError(f"task {kind!r} returned a {sample.image.mode} {sample.image.size} image")
    if IMAGE_PLACEHOLDER in sample.question or not sample.answer:
        raise ValueError(f"task {kind!r} returned a question with a placeholder or an empty answer")
    return sample


def _convert(image: Image.Image, mode: str) -> Image.Image:
    if mode == "P":
        # An adaptive palette is exact whenever the drawing has <= 256 colours (always for the flat-colour kinds,
        # almost always for antialiased text); the default web palette would dither and shift the named colours.
        return image.convert("P", palette=Image.Palette.ADAPTIVE, colors=256)
    return image.convert(mode)


def make_synthetic_row(
    kind: str, seed: int, *, image_size: tuple[int, int] | None = None, image_mode: str = "RGB"
) -> dict[str, Any]:
    """One Geometry3K-style row: ``{"images": [PIL image], "problem": str, "answer": str, "kind": str}``.

    The image is drawn in RGB and then converted to ``image_mode`` (one of "RGB", "L", "RGBA", "P", "CMYK") so
    downstream code that must convert to RGB gets exercised. Note that in "L" the colours named by ``count_shapes``
    questions are lost; :func:`make_synthetic_dataset` avoids that combination in its default mix.
    Same arguments, same row (byte-identical pixels).
    """
    check_value("image_mode", image_mode, _RULES["image_mode"])
    sample = render_synthetic_sample(kind, seed, image_size=image_size)
    return {
        "images": [_convert(sample.image, image_mode)],
        "problem": IMAGE_PLACEHOLDER + sample.question,
        "answer": sample.answer,
        "kind": kind,
    }


def _features() -> datasets.Features:
    # ``List`` replaced ``Sequence`` for plain lists in datasets 4; fall back so older versions still load.
    list_type = getattr(datasets, "List", datasets.Sequence)
    return datasets.Features(
        {
            "images": list_type(datasets.Image()),
            "problem": datasets.Value("string"),
            "answer": datasets.Value("string"),
            "kind": datasets.Value("string"),
        }
    )


def make_synthetic_dataset(
    num_rows: int,
    seed: int = 0,
    *,
    kinds: Sequence[str] | None = None,
    image_sizes: Sequence[tuple[int, int]] = DEFAULT_IMAGE_SIZES,
    image_modes: Sequence[str] = DEFAULT_IMAGE_MODES,
) -> datasets.Dataset:
    """An in-memory ``datasets.Dataset`` of ``num_rows`` synthetic rows (images stored as ``List(Image())``).

    Row ``i`` is ``make_synthetic_row(kinds[i % len(kinds)], seed * 1_000_003 + i, ...)``, with its size and mode
    drawn from ``image_sizes`` / ``image_modes`` by a ``random.Random`` seeded from the row seed, so any row can be
    regenerated on its own. ``kinds`` defaults to every registered kind (sorted). Repeat an entry of
    ``image_modes`` to weight it. With the default modes, colour-dependent kinds fall back from "L" to "RGB".
    """
    kinds = sorted(SYNTHETIC_TASKS) if kinds is None else list(kinds)
    if not kinds or not image_sizes or not image_modes:
        raise ValueError("kinds, image_sizes and image_modes must each name at least one")
    check_value("num_rows", num_rows, _RULES["num_rows"])
    check_value("seed", seed, _RULES["seed"])
    for name, values in (("kind", kinds), ("image_size", image_sizes), ("image_mode", image_modes)):
        for value in values:
            check_value(name, _pair(value) if name == "image_size" else value, _RULES[name])
    sizes = [tuple(size) for size in image_sizes]
    modes = list(image_modes)
    default_modes = tuple(image_modes) == DEFAULT_IMAGE_MODES

    features = _features()
    chunks: list[datasets.Dataset] = []
    columns: dict[str, list[Any]] = {name: [] for name in features}
    for i in range(num_rows):
        kind = kinds[i % len(kinds)]
        row_seed = seed * 1_000_003 + i
        # A separate, string-seeded stream for size/mode, so they do not shift the task's own random choices.
        mixer = random.Random(f"synthetic-mix-{row_seed}")
        size, mode = mixer.choice(sizes), mixer.choice(modes)
        if default_modes and mode == "L" and kind in _COLOUR_TASKS:
            mode = "RGB"
        for name, value in make_synthetic_row(kind, row_seed, image_size=size, image_mode=mode).items():
            columns[name].append(value)
        # Encode in chunks so peak memory is bounded by a chunk of decoded images, not the whole dataset.
        if len(columns["kind"]) == 256 or i == num_rows - 1:
            chunks.append(datasets.Dataset.from_dict(columns, features=features))
            columns = {name: [] for name in features}
    if not chunks:
        return datasets.Dataset.from_dict(columns, features=features)
    return chunks[0] if len(chunks) == 1 else datasets.concatenate_datasets(chunks)
