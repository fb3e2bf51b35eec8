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


# The data loader's accepted column names, preferred first (`data.loaders` resolves columns with them). `prompt` last:
# TRL's own column, plain text or a conversation (`[{"role": "user", "content": [...]}]`)
PROBLEM_COLUMNS = ("problem", "question", "query", "prompt")
ANSWER_COLUMNS = ("answer", "ground_truth", "gt_answer", "final_answer")
IMAGE_COLUMNS = ("images", "image", "image_paths", "image_path")
ID_COLUMNS = ("id", "pid", "question_id", "problem_id")
# What a compressed file's first bytes are (`datasets` reads these compressions as they are)
_MAGIC = {
    ".gz": b"\x1f\x8b",
    ".bz2": b"BZh",
    ".xz": b"\xfd7zXZ\x00",
    ".zst": b"\x28\xb5\x2f\xfd",
    ".lz4": b"\x04\x22\x4d\x18",
}
# An image's bytes as base64 text begin so (PNG, JPEG, GIF, WebP, BMP)
_BASE64_IMAGES = ("iVBORw0KGgo", "/9j/", "R0lGOD", "UklGR", "Qk")
ROWS_CHECKED = 1000  # the first rows a data file's format and schema are checked on, before anything is decoded


def _opener(path: Path):
    """`open` for the file's compression (by its suffix), after checking its first bytes are that compression."""
    suffix = path.suffix.lower()
    if suffix not in _MAGIC:
        return lambda: open(path, encoding="utf-8")
    with open(path, "rb") as file:
        head = file.read(len(_MAGIC[suffix]))
    if head and head != _MAGIC[suffix]:
        raise UsageError(f"cannot read {path}: its name ends in {suffix}, and it is not {suffix[1:]}-compressed "
                         f"(it begins {head[:8]!r}); rename it without {suffix}, or compress it.")  # fmt: skip
    import importlib

    module = {".gz": "gzip", ".bz2": "bz2", ".xz": "lzma"}.get(suffix)
    if module is None:  # .zst / .lz4: `datasets` reads them with packages of their own
        return None
    return lambda: importlib.import_module(module).open(path, "rt", encoding="utf-8")


def _object_once(pairs):
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise ValueError(f"the key {key!r} is given twice in one row")
        seen.add(key)
    return dict(pairs)


def _roles(row: dict) -> tuple[str | None, ...]:
    """The columns of a row the loader would take for the problem, the answer and the images."""
    return tuple(next((name for name in names if name in row), None)
                 for names in (PROBLEM_COLUMNS, ANSWER_COLUMNS, IMAGE_COLUMNS))  # fmt: skip


def check_data_rows(path: str | Path) -> None:
    """A JSON Lines file of training or evaluation rows (compressed or not), from its first `ROWS_CHECKED` rows and
    before any image is decoded: its compression is what its name says; each row is one JSON object without a key
    given twice; every row names its problem, answer and images with the same keys (not two schemas mixed); the
    problem is text; an image given as base64 text carries its `data:image/...;base64,` prefix. A `UsageError`
    naming the file, the row and the fix; nothing for other formats (`datasets` checks those as it reads)."""
    path = Path(path).expanduser()
    if not path.is_file():
        return
    stat = path.stat()
    state = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if state in _ROWS_CHECKED_FOR:  # once per file as it is: the CLI checks it before the loader reads it
        return
    opener = _opener(path)  # any format: a compression suffix on a file that is not so compressed
    if opener is None or ".jsonl" not in [suffix.lower() for suffix in path.suffixes][-2:]:
        return
    first: tuple[int, tuple] | None = None
    try:
        with opener() as file:
            number = 0
            for number, line in enumerate(file, start=1):
                if number > ROWS_CHECKED:
                    break
                if not line.strip():
                    continue
                try:
                    row = json.loads(line, object_pairs_hook=_object_once)
                except json.JSONDecodeError as error:
                    raise UsageError(f"cannot read {path}: line {number} is not valid JSON ({error.msg}).") from None
                except ValueError as error:  # a key twice (`_object_once`)
                    raise UsageError(f"cannot read {path}: line {number}: {error}.") from None
                if not isinstance(row, dict):
                    raise UsageError(f"cannot read {path}: line {number} is not a JSON object (one row per line).")
                roles = _roles(row)
                if first is None:
                    first = (number, roles)
                elif roles != first[1] and all(roles) and all(first[1]):
                    raise UsageError(
                        f"{path} mixes two schemas: line {first[0]} names its problem, answer and images "
                        f"{'/'.join(first[1])}, line {number} {'/'.join(roles)}; give every row the same keys."
                    )
                problem = row.get(roles[0]) if roles[0] else None
                if isinstance(problem, (int, float)) and not isinstance(problem, bool):
                    raise UsageError(f"{path}, line {number}: {roles[0]} is a number ({problem}), not the problem's "
                                     "text; quote it if the number is the question.")  # fmt: skip
                images = row.get(roles[2]) if roles[2] else None
                for image in images if isinstance(images, list) else [images]:
                    if isinstance(image, str) and image.startswith(_BASE64_IMAGES) and len(image) > 64:
                        raise UsageError(
                            f"{path}, line {number}: {roles[2]} holds base64 text without its prefix; write it as "
                            "data:image/png;base64,<the text> (or the image's path), which the loader reads."
                        )
    except (OSError, EOFError, UnicodeDecodeError) as error:
        raise UsageError(f"cannot read {path}: {type(error).__name__}: {error}.") from None
    _ROWS_CHECKED_FOR.add(state)


_ROWS_CHECKED_FOR: set[tuple[str, int, int]] = set()  # files whose rows passed, as they were (path, mtime, size)


# A selection record's fields without a default (`insight.records.SelectionRecord`; a test keeps them equal)
RECORD_KEYS = ("tokens", "token_ids", "entropy", "selected", "entropy_top_k", "strategy", "k", "alpha")


def check_output(flag: str, path, kind: str = "folder", *, owner: tuple[str, list[str], list[str]] | None = None):
    """The one rule for what a command writes, before it loads anything (a `UsageError` naming `flag` otherwise).
    `kind`: "folder" (a folder results go to: not a file, not under a file, in a writable place with room; it need
    not exist), "file" (a file: not a folder, its folder checked the same way), "records" (a file selection records
    are appended to: new, empty, or a records file; any other file, the user's data or a page, is never replaced).
    `owner`: (the record a folder's writer keeps of whose files they are, those files, this run's): a folder holding
    another run's files is refused, never written over (the same run writing again replaces its own)."""
    import os
    import shutil

    if path is None or not str(path).strip():
        raise UsageError(f"{flag} is empty: give a {'folder' if kind == 'folder' else 'file name'}.")
    target = Path(path).expanduser()
    if kind == "records" and target.is_file() and target.stat().st_size:
        try:
            with open(target, encoding="utf-8") as file:
                row = json.loads(next((line for line in file if line.strip()), ""))
        except (OSError, UnicodeDecodeError, ValueError):
            row = None
        if not (isinstance(row, dict) and set(RECORD_KEYS) <= row.keys()):
            raise UsageError(
                f"{flag} {target}: a file of another kind exists there (its first line is not a selection record); "
                "records are appended to a records file and never replace another file: give a new file name."
            )
    if kind != "folder" and target.is_dir():
        raise UsageError(f"{flag} {target}: a folder of that name exists; give a file name.")
    folder, shown = (target, path) if kind == "folder" else (target.parent, target.parent)
    try:
        os.stat(folder)
    except (FileNotFoundError, NotADirectoryError):  # not made yet, or under a file (said below)
        pass
    except OSError as error:  # a name longer than the file system takes, a component that is not a folder, ...
        raise UsageError(f"{flag} {shown}: not a usable folder name ({error.strerror}).") from None
    if folder.is_symlink() and not folder.exists():
        raise UsageError(f"{flag} {shown}: a link to {os.readlink(folder)}, which does not exist; give a folder.")
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{flag} {shown}: a file of that name exists; give a folder.")
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{flag} {shown}: {existing} is a file, so no folder can be made under it.")
    # Names still to be made: the kernel says ENOENT before ENAMETOOLONG when a parent is missing, so a name
    # longer than the file system takes is only found at the first write (after the model loaded)
    try:
        longest = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        longest = 255
    to_make = folder.absolute().relative_to(existing.absolute()).parts if folder != existing else ()
    too_long = [part for part in to_make if len(os.fsencode(part)) > longest]
    if too_long:
        raise UsageError(
            f"{flag} {shown}: not a usable folder name (a name of {len(os.fsencode(too_long[0]))} bytes, and the "
            f"file system takes {longest})."
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {shown}: {existing} is not writable; choose a folder you can write to.")
    if shutil.disk_usage(existing).free == 0:
        raise UsageError(f"{flag} {shown}: the disk holding {existing} is full (0 bytes free).")
    record, files, mine = owner or (None, [], None)
    written = [name for name in files if (folder / name).is_file()]
    if written and (folder / record).is_file():  # files written before their writer kept a record say nothing
        try:
            theirs = json.loads((folder / record).read_text()).get("runs")
        except (OSError, ValueError, AttributeError):
            theirs = None
        if theirs != mine:
            raise UsageError(
                f"{flag} {folder} holds the files of {', '.join(theirs) if theirs else 'another run'} "
                f"({', '.join(written)}); they are never replaced by another run's: give another {flag}."
            )


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


class _KeyTwice(Exception):
    def __init__(self, key, first: int, then: int):
        self.key, self.first, self.then = key, first, then


def _one_key_once_loader():
    import yaml

    class OneKeyOnce(yaml.SafeLoader):
        """YAML's safe loader, refusing a mapping that names a key twice (PyYAML keeps the last silently)."""

        def construct_mapping(self, node, deep=False):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                line = key_node.start_mark.line + 1
                if isinstance(key, str) and key in seen:
                    raise _KeyTwice(key, seen[key], line)
                seen[key] = line
            return super().construct_mapping(node, deep=deep)

    return OneKeyOnce


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
        recipe = yaml.load(path.read_text(encoding="utf-8"), Loader=_one_key_once_loader())  # a SafeLoader
    except _KeyTwice as twice:
        raise UsageError(f"{flag} {path}: the key {twice.key!r} is written twice (lines {twice.first} and "
                         f"{twice.then}), and YAML keeps the last without a word: keep one.") from None  # fmt: skip
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
