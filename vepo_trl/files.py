"""The one reader of the data files a command is given (training data, benchmark copies): a file that is missing,
empty, truncated, of another format or unreadable is named with its problem in one line (`UsageError`), never left
to `datasets` or pyarrow to report 60 lines deep. Light: `datasets` and pyarrow load on first use."""

from __future__ import annotations

import glob
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import UsageError


def file_problem(path: Path, builder: str) -> str | None:
    """What is wrong with a local data file that `datasets` failed on or read as empty; None if nothing is found."""
    if builder == "parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.read_metadata(path).num_rows
        except Exception as err:  # pyarrow reports a broken file with several exception types
            return f"not a readable parquet file ({type(err).__name__}: {err})"
        return "the file has no rows" if rows == 0 else None
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        return "the file is empty: no rows"
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    else:
        if isinstance(whole, list):
            if not whole:
                return "the file holds an empty JSON list: no rows"
            bad = next((index for index, row in enumerate(whole) if not isinstance(row, dict)), None)
            if bad is not None:
                return f"entry {bad} of the JSON list is a {type(whole[bad]).__name__}, not an object of columns"
            return None
        if isinstance(whole, dict):
            return None
        return f"the file holds a JSON {type(whole).__name__}, not rows (a list of objects or one object per line)"
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            return f"line {number} is not valid JSON ({err.msg} at column {err.colno})"
        if not isinstance(row, dict):
            return f"line {number} is a JSON {type(row).__name__}, not an object of columns"
    return None


def read_data_files(builder: str, files: Sequence[Path], *, split: str = "train", **load_kwargs: Any):
    """`datasets.load_dataset(builder, data_files=files)` as one split; a file it cannot read (or that holds no rows)
    is a `UsageError` naming the file and its problem."""
    import datasets

    # `data_files` are glob patterns: a literal "[1]" in a folder name would otherwise match nothing
    patterns = [glob.escape(str(path)) for path in files]
    # `datasets` logs a bad file at ERROR level before raising; the error raised below says it in one line
    datasets_logger = logging.getLogger("datasets")
    level = datasets_logger.level
    datasets_logger.setLevel(logging.CRITICAL)
    try:
        dataset = datasets.load_dataset(builder, data_files={split: patterns}, split=split, **load_kwargs)
    except Exception as err:  # StopIteration for an empty JSONL, DatasetGenerationError for a bad line, ArrowInvalid
        for path in files:
            problem = _problem_or_unreadable(Path(path), builder)
            if problem is not None:
                raise UsageError(f"cannot read {path}: {problem}") from err
        raise
    finally:
        datasets_logger.setLevel(level)
    if len(dataset) == 0:
        first = files[0] if len(files) == 1 else f"{len(files)} files ({files[0]}, ...)"
        raise UsageError(f"cannot read {first}: {file_problem(Path(files[0]), builder) or 'the file has no rows'}")
    return dataset


def _problem_or_unreadable(path: Path, builder: str) -> str | None:
    try:
        return file_problem(path, builder)
    except OSError as error:  # gone, a folder, no permission
        return f"{error.strerror or type(error).__name__}"


def read_recipe(path: str | Path, flag: str = "--config") -> dict[str, Any]:
    """A recipe (YAML) that exists, can be read, is valid YAML and a non-empty mapping of keys. Any other state
    (an empty file among them) is a `UsageError` naming the file and the problem (a YAML error's line and column)."""
    import yaml

    path = Path(path).expanduser()
    if not path.exists():
        raise UsageError(f"{flag} {path}: no such file.")
    if path.is_dir():
        raise UsageError(f"{flag} {path}: a folder, not a recipe file (YAML).")
    try:
        recipe = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise UsageError(f"{flag} {path} is not valid YAML{where}: {problem}.") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"{flag} {path} cannot be read ({type(error).__name__}: {error}).") from None
    if recipe is None:
        raise UsageError(f"{flag} {path} is empty: a recipe holds key: value lines (recipes/tiny/config_vepo.yaml).")
    if not isinstance(recipe, dict):
        raise UsageError(f"{flag} {path} is not a mapping of recipe keys (key: value lines).")
    return recipe
