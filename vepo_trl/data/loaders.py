"""Load the VEPO training and evaluation data sets in TRL's conversational multimodal format.

Every loader returns a `datasets.Dataset` with the columns that `trl.GRPOTrainer` consumes for vision-language models:

- `prompt`: a system message holding `SYSTEM_PROMPT` and a user message whose content is a list of parts,
  `{"type": "image"}` where the problem text had an `<image>` placeholder and `{"type": "text", "text": ...}` for the
  rest. The trainer fills the image parts from `images` (`trl.data_utils.prepare_multimodal_messages`). Arrow stores
  all parts as one struct type, so image parts read back as `{"type": "image", "text": None}`; TRL and the Qwen
  chat templates look at `type` first and ignore the null text.
- `images`: the row's images, RGB and resized so that width * height lies within `[min_pixels, max_pixels]` with both
  sides multiples of the vision patch factor (28 for Qwen2.5-VL), decoded to PIL on access.
- `answer`: the reference answer (string), for the reward functions.
- `source` / `id`: where the row comes from, e.g. `geometry3k` and `geometry3k/train/17`.

Rows that cannot be used (no image, unreadable image, degenerate size, empty answer, missing problem) are dropped and
counted per reason in the log, or raise a `ValueError` naming the row when `strict=True`.
"""

from __future__ import annotations

import base64
import glob
import io
import logging
import math
import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
from PIL import Image, ImageOps
from qwen_vl_utils import smart_resize
from qwen_vl_utils.vision_process import MAX_RATIO

from ..files import ANSWER_COLUMNS, ID_COLUMNS, IMAGE_COLUMNS, PROBLEM_COLUMNS, check_data_rows, read_data_files
from ..rules import check_value, image_bounds_rules


logger = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You FIRST think about the reasoning process as an internal monologue and then provide the final answer. "
    "The reasoning process MUST BE enclosed within <think> </think> tags. The final answer MUST BE put in \\boxed{}."
)
IMAGE_PLACEHOLDER = "<image>"
# Data sets spell the placeholder `<image>`, `<Image>` or `<IMAGE>`; any case is one placeholder
_PLACEHOLDER_PATTERN = re.compile(re.escape(IMAGE_PLACEHOLDER), re.IGNORECASE)

# Pixel bounds of the paper (min 512 * 512, max 1M pixels per image).
DEFAULT_MIN_PIXELS = 262_144
DEFAULT_MAX_PIXELS = 1_000_000
# Qwen2.5-VL: 14 px patches merged 2 x 2, so image sides must be multiples of 28.
IMAGE_FACTOR = 28
# A side this short carries no readable content (spacer or placeholder images); upscaling it would only add noise.
MIN_IMAGE_SIDE = 4

# Accepted column names, preferred first (`files`, which checks a file's rows before it is read): the first match in a
# data set's columns is used

# Drop reasons, also used in the log and in strict-mode errors.
MISSING_PROBLEM = "missing problem"
EMPTY_ANSWER = "empty answer"
SEVERAL_ANSWERS = "answer is a list of several answers"
NO_IMAGE = "no image"
UNREADABLE_IMAGE = "unreadable image"
IMAGE_TOO_SMALL = "image too small"
EXTREME_ASPECT_RATIO = "extreme aspect ratio"
PIXEL_BOUNDS = "image cannot be resized into the pixel bounds"
PLACEHOLDER_MISMATCH = "image placeholder count differs from image count"

_DROP_COLUMN = "_vepo_drop_reason"
_DETAIL_COLUMN = "_vepo_drop_detail"  # the reason with its detail (which file, which error), for the messages
_LOCAL_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".tsv": "csv"}
# Compressed text files `datasets` reads as they are (`rows.jsonl.gz`, `rows.csv.zst`)
_COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst", ".lz4")


def _file_suffix(path: Path) -> str:
    """The data format's suffix of a file name, under a compression suffix (`.jsonl` for `rows.jsonl.gz`)."""
    suffixes = [suffix.lower() for suffix in path.suffixes]
    if len(suffixes) >= 2 and suffixes[-1] in _COMPRESSIONS and suffixes[-2] in (".json", ".jsonl", ".csv", ".tsv"):
        return suffixes[-2]
    return path.suffix.lower()


_METADATA_FILES = ("metadata.jsonl", "metadata.csv", "metadata.parquet")
_WRITER_BATCH_SIZE = 64  # rows hold up to a few MB of encoded images each
_PNG_COMPRESS_LEVEL = 1  # lossless; much faster than the default level at a similar size for diagrams

OUTPUT_FEATURES = datasets.Features(
    {
        "prompt": datasets.List(
            {
                "role": datasets.Value("string"),
                "content": datasets.List({"type": datasets.Value("string"), "text": datasets.Value("string")}),
            }
        ),
        "images": datasets.List(datasets.Image()),
        "answer": datasets.Value("string"),
        "source": datasets.Value("string"),
        "id": datasets.Value("string"),
    }
)


@dataclass(frozen=True)
class HubDataset:
    """A named data set on the Hugging Face Hub and the splits it publishes."""

    repo_id: str
    splits: tuple[str, ...]
    description: str


HUB_DATASETS: dict[str, HubDataset] = {
    "geometry3k": HubDataset(
        "hiyouga/geometry3k", ("train", "validation", "test"), "Geometry3K (train 2,101 / validation 300 / test 601)"
    ),
    "k12": HubDataset(
        "xyliu6/k12-freeform",
        ("train", "mini_train", "test"),
        "K12 free-form (train 6,457 / mini_train 2,100 / test 808)",
    ),
    "mmk12": HubDataset("FanqingM/MMK12", ("train", "test"), "MMK12 (single image per problem)"),
}
# The paper's ~4.2K training problems: Geometry3K train + K12 free-form mini_train.
PAPER_MIX = (("geometry3k", "train"), ("k12", "mini_train"))
PAPER_MIX_NAME = "paper_mix"

NAME_ALIASES = {
    **{name: name for name in HUB_DATASETS},
    **{spec.repo_id.lower(): name for name, spec in HUB_DATASETS.items()},
    "k12-freeform": "k12",
    "k12_freeform": "k12",
    "geo3k": "geometry3k",
}


class UnusableRowError(ValueError):
    """A row that cannot become a training example; `reason` is one of the drop reasons of this module."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class UnusableRowsError(ValueError):
    """A data set whose rows cannot be used: the first unusable row in strict mode, or every row unusable.

    `where` names the file (or `source/split`), `row` the first unusable row's index, `problem` what is wrong with it
    (reason and detail), `unusable` / `total` the counts. The message ends with a hint for the Python API; the CLI
    words its own with `describe()`."""

    def __init__(self, where: str, row: int, problem: str, unusable: int, total: int, strict: bool):
        self.where, self.row, self.problem, self.unusable, self.total, self.strict = (
            where, row, problem, unusable, total, strict
        )  # fmt: skip
        hint = "pass strict=False to drop them" if strict else "no usable row is left"
        super().__init__(self.describe(hint))

    def describe(self, hint: str) -> str:
        return f"{self.where} row {self.row}: {self.problem} ({self.unusable} of {self.total} rows unusable; {hint})"


# ----------------------------------------------------------------------------------------------------------------------
# Images
# ----------------------------------------------------------------------------------------------------------------------


def read_image(value: Any, base_dir: str | os.PathLike | None) -> Image.Image:
    """Open one image given as a PIL image, `{"bytes", "path"}` dict, bytes, path, data URI or array."""
    if isinstance(value, Image.Image):
        image = value
    elif isinstance(value, Mapping):
        if value.get("bytes"):
            image = Image.open(io.BytesIO(value["bytes"]))
        elif value.get("path"):
            image = _open_path(value["path"], base_dir)
        else:
            raise UnusableRowError(UNREADABLE_IMAGE, "image entry has neither bytes nor path")
    elif isinstance(value, bytes | bytearray | memoryview):
        image = Image.open(io.BytesIO(bytes(value)))
    elif isinstance(value, str):
        if value.startswith("data:image") and "base64," in value:
            image = Image.open(io.BytesIO(base64.b64decode(value.split("base64,", 1)[1], validate=True)))
        else:
            image = _open_path(value, base_dir)
    elif isinstance(value, np.ndarray):
        image = Image.fromarray(value)
    else:
        raise UnusableRowError(UNREADABLE_IMAGE, f"unsupported image entry of type {type(value).__name__}")
    # Decode now so that truncated or corrupt data fails here rather than inside the trainer.
    image.load()
    return image


def _open_path(path: str, base_dir: str | os.PathLike | None) -> Image.Image:
    if path.startswith(("http://", "https://")):
        raise UnusableRowError(UNREADABLE_IMAGE, f"remote image URLs are not fetched: {path}")
    path = path.removeprefix("file://")
    resolved = Path(path).expanduser()
    if not resolved.is_absolute() and base_dir is not None:
        resolved = Path(base_dir) / resolved
    # Read the bytes up front so that no file handle stays open with the lazily decoded image.
    return Image.open(io.BytesIO(resolved.read_bytes()))


def _high_bit_depth_to_l(image: Image.Image) -> Image.Image:
    """Map 16/32-bit integer and float grayscale to 8 bits; Pillow's own conversion clips everything above 255."""
    array = np.nan_to_num(np.asarray(image, dtype=np.float64))
    high = float(array.max()) if array.size else 0.0
    if image.mode == "F" and high <= 1.0:
        array = array * 255.0
    elif high > 255.0:
        array = array * (255.0 / (65535.0 if high <= 65535.0 else high))
    return Image.fromarray(np.clip(np.rint(array), 0, 255).astype(np.uint8))


def to_rgb(image: Image.Image) -> Image.Image:
    """Convert any PIL mode to RGB; transparent pixels are composited on white, as diagrams are drawn on paper."""
    try:
        image = ImageOps.exif_transpose(image)
    except Exception:  # a malformed EXIF block should not cost the row; keep the stored orientation
        pass
    if image.mode == "RGB":
        return image
    if image.mode in ("I", "F") or image.mode.startswith("I;16"):
        return _high_bit_depth_to_l(image).convert("RGB")
    has_alpha = image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in image.info
    if has_alpha:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def prepare_image(
    image: Any,
    *,
    min_pixels: int = DEFAULT_MIN_PIXELS,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    image_factor: int = IMAGE_FACTOR,
    base_dir: str | os.PathLike | None = None,
) -> Image.Image:
    """Open one image, convert it to RGB and resize it with `qwen_vl_utils.smart_resize`.

    The result keeps the aspect ratio (up to rounding), has both sides divisible by `image_factor` and
    `min_pixels <= width * height <= max_pixels`. Raises `UnusableRowError` if the image cannot be used.
    """
    try:
        image = to_rgb(read_image(image, base_dir))
    except UnusableRowError:
        raise
    except Exception as err:  # Pillow signals bad data with many exception types (OSError, ValueError, SyntaxError...)
        # Name the file (Pillow only sees the bytes read from it), not the in-memory buffer Pillow names
        where = f"{image}: " if isinstance(image, str) and not image.startswith("data:") else ""
        message = re.sub(r" ?<_io\.BytesIO object at 0x[0-9a-fA-F]+>", "", str(err))
        if isinstance(err, FileNotFoundError):
            where, message = "", f"no such file {err.filename}"
        raise UnusableRowError(UNREADABLE_IMAGE, f"{where}{type(err).__name__}: {message}") from err
    width, height = image.size
    if min(width, height) < MIN_IMAGE_SIDE:
        raise UnusableRowError(IMAGE_TOO_SMALL, f"{width}x{height}")
    if max(width, height) / min(width, height) > MAX_RATIO:
        raise UnusableRowError(EXTREME_ASPECT_RATIO, f"{width}x{height} exceeds {MAX_RATIO}:1")
    try:
        new_height, new_width = smart_resize(
            height, width, factor=image_factor, min_pixels=min_pixels, max_pixels=max_pixels
        )
    except ValueError as err:
        raise UnusableRowError(EXTREME_ASPECT_RATIO, str(err)) from err
    # Very elongated images can round to a side of 0 or land outside the bounds when they are tight.
    if min(new_width, new_height) < image_factor or not min_pixels <= new_width * new_height <= max_pixels:
        raise UnusableRowError(PIXEL_BOUNDS, f"{width}x{height} -> {new_width}x{new_height}")
    if (new_width, new_height) != (width, height):
        image = image.resize((new_width, new_height), resample=Image.Resampling.BICUBIC)
    return image


# ----------------------------------------------------------------------------------------------------------------------
# Rows
# ----------------------------------------------------------------------------------------------------------------------


def build_user_content(problem: str, num_images: int) -> list[dict[str, str]]:
    """Split the problem at its `<image>` placeholders into text and image parts.

    Image parts go exactly where the placeholders stood (`<image>` in any letter case); without placeholders all images come first. Empty or
    whitespace-only text parts are dropped, other text is kept verbatim.
    """
    pieces = _PLACEHOLDER_PATTERN.split(problem)
    num_placeholders = len(pieces) - 1
    if num_placeholders and num_placeholders != num_images:
        raise UnusableRowError(PLACEHOLDER_MISMATCH, f"{num_placeholders} placeholders, {num_images} images")
    content: list[dict[str, str]] = []
    if not num_placeholders:
        content.extend({"type": "image"} for _ in range(num_images))
    for index, piece in enumerate(pieces):
        if index:
            content.append({"type": "image"})
        if piece.strip():
            content.append({"type": "text", "text": piece})
    return content


def _from_messages(messages: list) -> tuple[str, str | None]:
    """(problem, system prompt or None) of a conversational prompt in TRL's format: the user turns' text with
    `<image>` where each image part stands, and the system turn's text where there is one."""
    system, user = None, []
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in ("system", "user"):
            raise UnusableRowError(MISSING_PROBLEM, "a prompt turn that is not a system or user message")
        content = message.get("content")
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        text = "".join(
            "<image>" if part.get("type") == "image" else part.get("text") or ""
            for part in parts
            if isinstance(part, dict)
        )
        if message["role"] == "system":
            system = text
        else:
            user.append(text)
    return "\n".join(user), system


def _as_image_list(value: Any) -> list:
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return list(value)
    if isinstance(value, np.ndarray) and value.dtype == object:
        return list(value)
    return [value]


def _is_missing(value: Any) -> bool:
    # NaN is how pandas-backed data sets spell an empty cell (float NaN, numpy NaN, pandas NA)
    if value is None:
        return True
    try:
        return bool(value != value)
    except (TypeError, ValueError):
        return False


def _answer_text(value: Any) -> str:
    """The reference answer as text; "" when the cell is empty. A list must hold exactly one answer."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, list | tuple):
        present = [item for item in value if not _is_missing(item) and str(item).strip()]
        if len(present) > 1:
            # Stored as "['4', 'four']" this matched no completion: every reward of the row was 0
            raise UnusableRowError(
                SEVERAL_ANSWERS, f"{value!r}; give one reference answer per row (the accuracy reward grades one)"
            )
        value = present[0] if present else None
    if _is_missing(value):
        return ""
    if isinstance(value, Mapping):
        raise UnusableRowError(EMPTY_ANSWER, f"answer is a {type(value).__name__}, not text: {value!r}")
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, np.generic):
        value = value.item()
        if isinstance(value, float) and value.is_integer():
            value = int(value)
    return str(value).strip()


def to_conversational(
    example: Mapping[str, Any],
    *,
    problem_column: str = "problem",
    answer_column: str = "answer",
    image_column: str = "images",
    min_pixels: int = DEFAULT_MIN_PIXELS,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    image_factor: int = IMAGE_FACTOR,
    base_dir: str | os.PathLike | None = None,
    system_prompt: str = SYSTEM_PROMPT,
) -> dict[str, Any]:
    """Turn one raw row into `{"prompt", "images", "answer"}` in TRL's conversational multimodal format.

    Args:
        example: the raw row, e.g. `{"images": [...], "problem": "<image>Find x.", "answer": "3"}`.
        problem_column, answer_column, image_column: where to find the problem text, the reference answer and the
            image(s); the image column may hold one image or a list (PIL, `{"bytes", "path"}`, bytes or a path).
        min_pixels, max_pixels, image_factor: resize bounds, see `prepare_image`.
        base_dir: directory that relative image paths are resolved against.
        system_prompt: the system message.

    Raises:
        UnusableRowError: the row cannot be used; its `reason` says why.
        ValueError: a column is missing from the row.
    """
    missing = [column for column in (problem_column, answer_column, image_column) if column not in example]
    if missing:
        raise ValueError(f"row has no column(s) {missing}; its columns are {sorted(example)}")
    problem = example[problem_column]
    if isinstance(problem, list):  # TRL's conversational prompt: its text, images where its image parts stand
        problem, own_system = _from_messages(problem)
        system_prompt = own_system if own_system is not None else system_prompt
    if not isinstance(problem, str) or not problem.strip():
        raise UnusableRowError(MISSING_PROBLEM)
    answer = _answer_text(example[answer_column])
    if not answer:
        raise UnusableRowError(EMPTY_ANSWER)
    raw_images = _as_image_list(example[image_column])
    present = [image for image in raw_images if image is not None]
    if not present:
        raise UnusableRowError(NO_IMAGE)
    if len(present) != len(raw_images):
        raise UnusableRowError(UNREADABLE_IMAGE, "image list contains empty entries")
    content = build_user_content(problem, len(raw_images))
    images = [
        prepare_image(
            image, min_pixels=min_pixels, max_pixels=max_pixels, image_factor=image_factor, base_dir=base_dir
        )
        for image in raw_images
    ]
    prompt = [
        {"role": "system", "content": [{"type": "text", "text": system_prompt}]},
        {"role": "user", "content": content},
    ]
    return {"prompt": prompt, "images": images, "answer": answer}


# ----------------------------------------------------------------------------------------------------------------------
# Data sets
# ----------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Columns:
    problem: str
    answer: str
    image: str
    id: str | None


def _find_column(column_names: Sequence[str], candidates: Sequence[str], role: str, source: str) -> str:
    for candidate in candidates:
        if candidate in column_names:
            return candidate
    lowered = {name.lower(): name for name in column_names}
    for candidate in candidates:
        if candidate in lowered:
            return lowered[candidate]
    raise ValueError(
        f"{source}: no {role} column found; columns present: {list(column_names)}; accepted names: {list(candidates)}"
    )


def _resolve_columns(column_names: Sequence[str], source: str) -> _Columns:
    ids = [name for name in ID_COLUMNS if name in column_names]
    return _Columns(
        problem=_find_column(column_names, PROBLEM_COLUMNS, "problem", source),
        answer=_find_column(column_names, ANSWER_COLUMNS, "answer", source),
        image=_find_column(column_names, IMAGE_COLUMNS, "image", source),
        id=ids[0] if ids else None,
    )


def without_decoding(feature: Any) -> Any:
    """Same feature with image decoding turned off, so that corrupt bytes reach the converter instead of crashing."""
    if isinstance(feature, datasets.Image):
        return datasets.Image(mode=feature.mode, decode=False)
    if isinstance(feature, datasets.List | datasets.LargeList):
        kwargs = {"length": feature.length} if isinstance(feature, datasets.List) else {}
        return type(feature)(without_decoding(feature.feature), **kwargs)
    if isinstance(feature, dict):
        return {key: without_decoding(value) for key, value in feature.items()}
    return feature


def _convert_row(
    example: dict[str, Any],
    index: int,
    *,
    columns: _Columns,
    source: str,
    split: str,
    base_dir: str | None,
    min_pixels: int,
    max_pixels: int,
    image_factor: int,
) -> dict[str, Any]:
    try:
        row = to_conversational(
            example,
            problem_column=columns.problem,
            answer_column=columns.answer,
            image_column=columns.image,
            min_pixels=min_pixels,
            max_pixels=max_pixels,
            image_factor=image_factor,
            base_dir=base_dir,
        )
        # Encode once here: handing PIL images to the Image feature would PNG-encode each of them twice, at a
        # slower compression level, and encoding dominates the conversion time.
        row["images"] = [_png_entry(image) for image in row["images"]]
        reason = ""
    except UnusableRowError as err:
        row = {"prompt": [], "images": [], "answer": ""}
        reason = err.reason
        row[_DETAIL_COLUMN] = " ".join(str(err).split())
    row_id = example.get(columns.id) if columns.id else None
    if "source" not in example:  # a row's own source (a column of the user's data) is kept
        row["source"] = source
    row["id"] = f"{source}/{split}/{index if row_id is None or row_id == '' else row_id}"
    row[_DROP_COLUMN] = reason
    row.setdefault(_DETAIL_COLUMN, "")
    return row


def _png_entry(image: Image.Image) -> dict[str, Any]:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=_PNG_COMPRESS_LEVEL)
    return {"bytes": buffer.getvalue(), "path": None}


def _is_usable(reason: str) -> bool:
    return not reason


def convert_dataset(
    dataset: datasets.Dataset,
    *,
    source: str,
    split: str = "train",
    min_pixels: int = DEFAULT_MIN_PIXELS,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    image_factor: int = IMAGE_FACTOR,
    strict: bool = False,
    num_proc: int | None = None,
    base_dir: str | os.PathLike | None = None,
    origin: str | None = None,
) -> datasets.Dataset:
    """Convert an already loaded data set (any of the accepted column names) to the output format.

    Unusable rows are dropped and counted per reason in the log; with `strict=True` the first one raises an
    `UnusableRowsError` (a `ValueError`) naming its row index (in `dataset`) and the problem, and so does a data set
    whose every row is unusable. `origin` (the file read) names the data in those messages instead of `source/split`.
    """
    bounds = {"image_factor": image_factor, "min_pixels": min_pixels, "max_pixels": max_pixels}
    for name, rule in image_bounds_rules(min_pixels, image_factor).items():
        check_value(name, bounds[name], rule)
    where = origin or f"{source}/{split}"
    columns = _resolve_columns(dataset.column_names, where)
    # The row's other columns stay as they are (`difficulty`, a user's own `source`): TRL hands a data set's extra
    # columns to the reward functions, and a custom reward may read them. The converted ones (and a column named as
    # an output other than `source`) are replaced.
    consumed = {columns.problem, columns.answer, columns.image, columns.id} | (set(OUTPUT_FEATURES) - {"source"})
    kept = [name for name in dataset.column_names if name not in consumed]
    for name in (columns.image, *kept):  # images stay undecoded bytes until they are read (never, for extra ones)
        feature = dataset.features.get(name)
        if feature is not None and without_decoding(feature) != feature:
            dataset = dataset.cast_column(name, without_decoding(feature))
    if kept:
        logger.info("%s: kept the columns %s beside the prompt, images and answer", where, kept)
    total = len(dataset)
    converted = dataset.map(
        _convert_row,
        with_indices=True,
        fn_kwargs={
            "columns": columns,
            "source": source,
            "split": split,
            "base_dir": None if base_dir is None else str(base_dir),
            "min_pixels": min_pixels,
            "max_pixels": max_pixels,
            "image_factor": image_factor,
        },
        remove_columns=[name for name in dataset.column_names if name not in kept],
        features=datasets.Features(
            {
                **OUTPUT_FEATURES,
                **{name: dataset.features[name] for name in kept},
                _DROP_COLUMN: datasets.Value("string"),
                _DETAIL_COLUMN: datasets.Value("string"),
            }
        ),
        num_proc=num_proc,
        writer_batch_size=_WRITER_BATCH_SIZE,
        desc=f"Converting {source}/{split}",
    )
    reasons = list(converted[_DROP_COLUMN])
    dropped = Counter(reason for reason in reasons if reason)
    if dropped:
        first = next(index for index, reason in enumerate(reasons) if reason)
        unusable = sum(dropped.values())
        if strict or unusable == total:
            problem = converted[first][_DETAIL_COLUMN] or reasons[first]
            raise UnusableRowsError(where, first, problem, unusable, total, strict)
        details = ", ".join(f"{count} {reason}" for reason, count in dropped.most_common())
        logger.warning(
            "dropped %d of %d rows from %s: %s (first at row %d: %s)",
            unusable,
            total,
            where,
            details,
            first,
            converted[first][_DETAIL_COLUMN],
        )
        converted = converted.filter(
            _is_usable, input_columns=[_DROP_COLUMN], num_proc=num_proc, writer_batch_size=_WRITER_BATCH_SIZE
        )
    else:
        logger.info("converted %d rows from %s/%s", total, source, split)
    return converted.remove_columns([_DROP_COLUMN, _DETAIL_COLUMN])


def accepted_names() -> str:
    names = [*HUB_DATASETS, PAPER_MIX_NAME, *(spec.repo_id for spec in HUB_DATASETS.values())]
    return (
        f"{', '.join(repr(name) for name in names)}, a local .json/.jsonl/.parquet file, or a local directory "
        "(an image folder with metadata.jsonl/csv/parquet, data files, or a data set saved with save_to_disk)"
    )


def _load_hub(name: str, split: str, load_kwargs: dict[str, Any]) -> datasets.Dataset:
    spec = HUB_DATASETS[name]
    if split not in spec.splits:
        logger.warning("%s publishes the splits %s; trying split %r anyway", spec.repo_id, spec.splits, split)
    return datasets.load_dataset(spec.repo_id, split=split, **load_kwargs)


def _has_metadata_file(directory: Path) -> bool:
    # Image folders keep metadata next to the images, either at the top level or in one folder per split.
    candidates = [directory, *(child for child in directory.iterdir() if child.is_dir())]
    return any((folder / name).is_file() for folder in candidates for name in _METADATA_FILES)


def _load_local_file(path: Path, split: str, load_kwargs: dict[str, Any]) -> datasets.Dataset:
    suffix = _file_suffix(path)
    builder = _LOCAL_FILE_BUILDERS.get(suffix)
    if builder is None:
        raise ValueError(
            f"unsupported file type {path.suffix!r} for {path}; accepted: {sorted(_LOCAL_FILE_BUILDERS)}, "
            f"each also compressed ({', '.join(_COMPRESSIONS)}) but parquet"
        )
    if suffix == ".tsv":
        load_kwargs = {**load_kwargs, "sep": "\t"}
    check_data_rows(path)
    return read_data_files(builder, [path], split=split, **load_kwargs)


def _load_local(path: Path, split: str, load_kwargs: dict[str, Any]) -> datasets.Dataset:
    if path.is_file():
        return _load_local_file(path, split, load_kwargs)
    if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
        loaded = datasets.load_from_disk(str(path))
        return loaded[split] if isinstance(loaded, datasets.DatasetDict) else loaded
    if _has_metadata_file(path):
        return datasets.load_dataset("imagefolder", data_dir=glob.escape(str(path)), split=split, **load_kwargs)
    return datasets.load_dataset(glob.escape(str(path)), split=split, **load_kwargs)


def load_vepo_dataset(
    name_or_path: str,
    split: str = "train",
    *,
    min_pixels: int = DEFAULT_MIN_PIXELS,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    image_factor: int = IMAGE_FACTOR,
    strict: bool = False,
    num_proc: int | None = None,
    seed: int = 0,
    **load_kwargs: Any,
) -> datasets.Dataset:
    """Load a training or evaluation data set in TRL's conversational multimodal format.

    Args:
        name_or_path: one of
            - `"geometry3k"` (`hiyouga/geometry3k`; splits train / validation / test),
            - `"k12"` (`xyliu6/k12-freeform`; splits train / mini_train / test),
            - `"mmk12"` (`FanqingM/MMK12`; splits train / test),
            - `"paper_mix"`: the paper's ~4.2K training problems, Geometry3K train + K12 free-form mini_train,
              concatenated and shuffled with `seed` (only `split="train"`),
            - a local `.json`, `.jsonl` or `.parquet` file (image paths relative to the file's directory),
            - a local directory: an image folder with `metadata.jsonl` (`file_name` or `file_names` plus
              `problem` / `answer`), data files in the Hub layout, or the output of `save_to_disk`.
            Registered names win over a local path of the same name; write `./geometry3k` for the directory.
        split: the split to load (for a single local file, just the split's label).
        min_pixels, max_pixels: bounds on width * height of every image (defaults: the paper's 262,144 and 1,000,000).
        image_factor: both image sides are rounded to multiples of it (28 for Qwen2.5-VL).
        strict: raise a `ValueError` naming the row index and reason for the first unusable row instead of dropping.
        num_proc: processes for the conversion.
        seed: shuffle seed of `"paper_mix"`.
        **load_kwargs: passed to `datasets.load_dataset` (e.g. `cache_dir`, `revision`).

    Returns:
        A `datasets.Dataset` with the columns `prompt`, `images`, `answer`, `source` and `id`.
    """
    bounds = {"image_factor": image_factor, "min_pixels": min_pixels, "max_pixels": max_pixels}
    for name, rule in image_bounds_rules(min_pixels, image_factor).items():
        check_value(name, bounds[name], rule)
    options = {
        "min_pixels": min_pixels,
        "max_pixels": max_pixels,
        "image_factor": image_factor,
        "strict": strict,
        "num_proc": num_proc,
    }
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"name_or_path must be a data set name or a path, got {type(name_or_path).__name__}.")
    name_or_path = os.fspath(name_or_path)  # a pathlib.Path is a path like any other
    key = name_or_path.strip().lower()
    if key == PAPER_MIX_NAME:
        if split != "train":
            raise ValueError(
                f"{PAPER_MIX_NAME!r} is a training mix and only has split 'train'; for evaluation load a data set by "
                f"name, e.g. load_vepo_dataset('k12', split='test')"
            )
        parts = [
            convert_dataset(_load_hub(part, part_split, load_kwargs), source=part, split=part_split, **options)
            for part, part_split in PAPER_MIX
        ]
        # The parts' own extra columns differ (Geometry3K's choices): the mix keeps the columns they share
        shared = [name for name in parts[0].column_names if all(name in part.column_names for part in parts)]
        return datasets.concatenate_datasets([part.select_columns(shared) for part in parts]).shuffle(seed=seed)
    if key in NAME_ALIASES:
        name = NAME_ALIASES[key]
        return convert_dataset(_load_hub(name, split, load_kwargs), source=name, split=split, **options)
    path = Path(name_or_path).expanduser()
    if path.exists():
        raw = _load_local(path, split, load_kwargs)
        source = path.stem if path.is_file() else path.resolve().name
        base_dir = path.parent if path.is_file() else path
        return convert_dataset(
            raw, source=source, split=split, base_dir=base_dir.resolve(), origin=name_or_path, **options
        )
    looks_like_path = os.sep in name_or_path or _file_suffix(Path(name_or_path)) in _LOCAL_FILE_BUILDERS
    problem = "no such file or directory" if looks_like_path else "unknown data set"
    raise ValueError(f"{problem}: {name_or_path!r}; accepted: {accepted_names()}")


__all__ = [
    "DEFAULT_MAX_PIXELS",
    "DEFAULT_MIN_PIXELS",
    "HUB_DATASETS",
    "IMAGE_FACTOR",
    "IMAGE_PLACEHOLDER",
    "OUTPUT_FEATURES",
    "PAPER_MIX",
    "SEVERAL_ANSWERS",
    "SYSTEM_PROMPT",
    "HubDataset",
    "UnusableRowError",
    "UnusableRowsError",
    "build_user_content",
    "convert_dataset",
    "load_vepo_dataset",
    "prepare_image",
    "to_conversational",
    "to_rgb",
]
