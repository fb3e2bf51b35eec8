"""The paper's seven evaluation benchmarks (and a synthetic one for offline trials), one registered adapter each.

An adapter knows where its data set lives (Hub id, config, split; or a local copy under `--data_dir`), how the
published protocol prompts it (NoisyRollout's `eval/`, which the VEPO release reuses), how the gold answer maps to
what a completion is graded against (a choice letter, a value, yes/no), and which sub-categories it reports.
Schemas and protocols are documented per benchmark in `BENCHMARKS.md` of the project notes; the comments below cite
the facts each adapter relies on.

    from vepo_trl.eval import get_benchmark

    bench = get_benchmark("mathvista")
    examples = bench.load_examples(data_dir=None)  # Hub: AI4Math/MathVista, split testmini
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets

from ..data.loaders import IMAGE_PLACEHOLDER, without_decoding
from ..errors import UsageError
from ..registry import PluginError, Registry
from .names import PAPER_BENCHMARKS


logger = logging.getLogger(__name__)

__all__ = [
    "BENCHMARKS",
    "PAPER_BENCHMARKS",
    "Benchmark",
    "EvalDataError",
    "Example",
    "get_benchmark",
    "register_benchmark",
]

# Bump when a prompt or gold mapping changes: a results folder written under another version is refused on resume.
# 2: the release's system prompt (with its newline); MathVision's question unchanged, image first.
# 3: images resized as the release's load_image (sqrt scaling to the pixel bounds, then the processor's own rounding);
#    MathVista's letter-only options kept as choices.
# 4: the release's prompt character for character: images first, then the question as its loaders read it (whitespace
#    kept, `<image>` in a question plain text, pandas' missing cells "nan", a JSON null "None").
PROMPT_VERSION = 4

# The system prompt of the release's evaluation (Leonnnnnn929/VEPO @4247308 run_eval.sh): the training prompt with a
# newline and a space after "final answer." (a bash string spanning two lines), passed to eval/main.py as is.
EVAL_SYSTEM_PROMPT = (
    "You FIRST think about the reasoning process as an internal monologue and then provide the final answer.\n "
    "The reasoning process MUST BE enclosed within <think> </think> tags. The final answer MUST BE put in \\boxed{}."
)


class EvalDataError(UsageError):
    """A benchmark's data cannot be found or read; the message says which data set and how to point at a copy."""


@dataclass
class Example:
    """One evaluation item, ready to prompt and grade.

    The user turn is the images, then `text` verbatim, as the release's `prepare_prompts` sends it: `<image>` or
    `<image1>` inside `text` is plain text, never a placeholder.
    `gold` is what a rule grader compares with (an option letter, a value or "yes"/"no"); `choices` are the option
    texts in letter order when the item is multiple choice, so that an answer naming the option's text also counts.
    """

    id: str
    text: str
    images: list[Any]
    image_refs: list[str]
    gold: str
    choices: list[str] | None = None
    categories: dict[str, str] = field(default_factory=dict)
    judge_question: str | None = None
    # What the official secondary metrics need: HallusionBench's qAcc / fAcc groups, We-Math's problem id and step
    # key, MathVista's question type, answer type and precision
    groups: dict[str, str] = field(default_factory=dict)


@dataclass
class Benchmark:
    """Base adapter: subclasses set the class attributes and implement `to_example`."""

    name: str = ""
    title: str = ""  # column header of the paper's Table 1
    hub_id: str | None = None
    hub_config: str | None = None
    split: str = "test"
    judged_in_paper: bool = False  # the paper graded it with gpt-4o-mini
    paper_rows: int | None = None  # the rows of the split the paper evaluated: fewer loaded make a partial result
    in_paper_table: bool = True
    folders: tuple[str, ...] = ()  # folder names accepted under --data_dir
    category_fields: tuple[str, ...] = ()
    description: str = ""

    # -- data --------------------------------------------------------------------------------------------------------

    def source(self, data_dir: str | os.PathLike | None) -> str:
        """Where the rows come from, as recorded in the results manifest."""
        folder = self.local_folder(data_dir)
        if folder is not None:
            return str(folder.resolve())
        if self.hub_id is None:  # rows a subclass makes itself (`load_rows`): name the class that makes them
            return f"{type(self).__module__}.{type(self).__qualname__}"
        return f"{self.hub_id}" + (f" ({self.hub_config})" if self.hub_config else "") + f" @{self.split}"

    def local_folder(self, data_dir: str | os.PathLike | None) -> Path | None:
        if data_dir is None:
            return None
        for name in self.folders or (self.name,):
            candidate = Path(data_dir).expanduser() / name
            if candidate.is_dir():
                return candidate
        return None

    def unavailable(self, data_dir: str | os.PathLike | None) -> str | None:
        """Why the rows cannot come from anywhere (no local copy, and offline), said before anything loads; or None."""
        if self.hub_id is None or self.local_folder(data_dir) is not None:
            return None
        if (_offline() or not _hub_reachable()) and not _hub_cached(self.hub_id):
            folder = (self.folders or (self.name,))[0]
            where = (
                f"--data_dir {data_dir} has no {folder}/ folder"
                if data_dir
                else f"pass --data_dir DIR with DIR/{folder}/"
            )
            return (
                f"{self.name}: {self.hub_id} is not in the local Hugging Face cache and the Hub is "
                f"{'offline (HF_HUB_OFFLINE)' if _offline() else 'unreachable'}; "
                f"{where} ({self.local_layout()})."
            )
        return None

    def local_layout(self) -> str:
        return f"parquet files of split {self.split!r} as on the Hub"

    def load_rows(self, data_dir: str | os.PathLike | None) -> tuple[Iterable[Mapping[str, Any]], Path | None]:
        """The raw rows and the folder relative image paths resolve against."""
        folder = self.local_folder(data_dir)
        if folder is not None:
            return self.load_local(folder), folder
        if problem := self.unavailable(data_dir):
            raise EvalDataError(problem)
        return self.load_hub(), None

    def load_hub(self) -> datasets.Dataset:
        try:
            dataset = datasets.load_dataset(self.hub_id, self.hub_config, split=self.split)
        except Exception as err:
            raise EvalDataError(
                f"{self.name}: cannot load {self.hub_id} split {self.split!r} ({type(err).__name__}: "
                f"{str(err).splitlines()[0] if str(err) else ''}); pass --data_dir DIR with a local copy in "
                f"DIR/{(self.folders or (self.name,))[0]}/ ({self.local_layout()})."
            ) from err
        return _undecoded(dataset)

    def load_local(self, folder: Path) -> Iterable[Mapping[str, Any]]:
        """A local copy in the Hub's layout: parquet (or JSON) data files of the split, or `save_to_disk` output."""
        return _load_data_files(folder, self.split, self.name)

    def load_examples(self, data_dir: str | os.PathLike | None = None, limit: int | None = None) -> list[Example]:
        rows, base_dir = self.load_rows(data_dir)
        examples: list[Example] = []
        checked = False
        for index, row in enumerate(rows):
            missing = [] if checked else [column for column in self.required_columns if column not in row]
            if missing:  # the first row's columns against the benchmark's schema
                raise EvalDataError(
                    f"{self.name}: the data has no column(s) {missing}; found {sorted(row)}. "
                    f"Expected the schema of {self.hub_id}."
                )
            checked = True
            example = self.to_example(row, index, base_dir)
            if example is None:  # left out by the protocol (e.g. HallusionBench questions without a figure)
                continue
            examples.append(example)
            if limit is not None and len(examples) >= limit:
                break
        if not examples:
            raise EvalDataError(f"{self.name}: no usable rows in {self.source(data_dir)}.")
        return _unique_ids(examples, self.name)

    # -- adapter -----------------------------------------------------------------------------------------------------

    required_columns: tuple[str, ...] = ()

    def to_example(self, row: Mapping[str, Any], index: int, base_dir: Path | None) -> Example | None:
        raise NotImplementedError

    def extra_metrics(self, records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        """Benchmark-specific metrics over graded records (fractions in [0, 1])."""
        return {}

    def official_metrics(self, records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
        """The benchmark's official secondary metric over graded records (each with `correct` and `extracted`, the
        verdict of the summary's protocol): a dict with `name`, `source` and its values, or None where it has none."""
        return None


BENCHMARKS: Registry[Benchmark] = Registry("benchmark")


def register_benchmark(cls: type[Benchmark]) -> type[Benchmark]:
    """Register one instance of a `Benchmark` subclass under `cls.name` (a class decorator, exported as
    `vepo_trl.register_benchmark`).

    The contract: set `name` (what `--benchmarks` takes), `title` (its column), `description`, and where the rows come
    from: `hub_id` / `hub_config` / `split` for a Hub data set, `folders` for a copy under `--data_dir` (parquet or
    JSON files of the split), or your own `load_rows(data_dir) -> (rows, base_dir)`. `required_columns` are checked on
    the first row; `to_example(row, index, base_dir)` returns an `Example` (its `gold` is what the rule grader
    compares the boxed answer with; `choices` for multiple choice), or None to leave a row out. `in_paper_table =
    False` keeps it out of the paper's average. A name registered twice is an error."""
    if not (isinstance(cls, type) and issubclass(cls, Benchmark)):
        raise TypeError(f"register_benchmark decorates a subclass of vepo_trl.Benchmark, got {cls!r}.")
    instance = cls()
    for spec in dataclasses.fields(instance):
        # A plain subclass's `name = "..."` (no @dataclass of its own): `Benchmark.__init__` set the base default
        owner = next(klass for klass in cls.__mro__ if spec.name in vars(klass))
        value = vars(owner)[spec.name]
        if "__dataclass_fields__" not in vars(owner) and not isinstance(value, dataclasses.Field):
            setattr(instance, spec.name, value)
    if instance.name != instance.name.strip().lower():
        raise ValueError(f"A benchmark's name is lower case (--benchmarks reads it so), got {instance.name!r}.")
    BENCHMARKS.add(instance.name, instance, module=cls.__module__)
    return cls


def get_benchmark(name: str) -> Benchmark:
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in BENCHMARKS:
        if line := BENCHMARKS.broken_line(name.strip()):
            raise PluginError(line)
        raise ValueError(f"Unknown benchmark {name!r}. Valid names are: {', '.join(BENCHMARKS)}.")
    return BENCHMARKS[key]


# ----------------------------------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------------------------------


def _offline() -> bool:
    return any(
        os.environ.get(name, "").lower() in ("1", "true", "yes") for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


_HUB_REACHABLE: dict[str, bool] = {}


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hub's host accepts a TCP connection (asked once per process): without one, `load_dataset` would
    retry for a minute before failing, so a missing local copy is reported at once instead."""
    import socket
    from urllib.parse import urlparse

    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or (443 if endpoint.scheme == "https" else 80)
    if host not in _HUB_REACHABLE:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            _HUB_REACHABLE[host] = True
        except OSError:
            _HUB_REACHABLE[host] = False
    return _HUB_REACHABLE[host]


def _hub_cached(repo_id: str) -> bool:
    """Whether `load_dataset(repo_id)` can work offline: the repo is in the Hub cache or the datasets cache."""
    try:
        from huggingface_hub import scan_cache_dir

        if any(repo.repo_id == repo_id and repo.repo_type == "dataset" for repo in scan_cache_dir().repos):
            return True
    except Exception:
        pass
    cache = Path(datasets.config.HF_DATASETS_CACHE)
    return (cache / repo_id.replace("/", "___")).is_dir()


def _undecoded(dataset: datasets.Dataset) -> datasets.Dataset:
    # Images stay bytes until an example is prompted; corrupt bytes then fail on that row only
    for name, feature in dataset.features.items():
        plain = without_decoding(feature)
        if plain != feature:
            dataset = dataset.cast_column(name, plain)
    return dataset


def _load_data_files(folder: Path, split: str, name: str) -> datasets.Dataset:
    if (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file():
        loaded = datasets.load_from_disk(str(folder))
        return _undecoded(loaded[split] if isinstance(loaded, datasets.DatasetDict) else loaded)
    for suffix, builder in ((".parquet", "parquet"), (".jsonl", "json"), (".json", "json")):
        files = sorted(p for p in folder.rglob(f"*{suffix}") if _is_split_file(p.relative_to(folder), split))
        if files:
            from ..files import read_data_files

            try:
                return _undecoded(read_data_files(builder, files))
            except UsageError as error:  # a truncated, empty or foreign file: named, with the benchmark
                raise EvalDataError(f"{name}: {error}") from None
    raise EvalDataError(
        f"{name}: {folder} holds no parquet/JSON data files of split {split!r} (file names must contain the split)."
    )


def _is_split_file(relative: Path, split: str) -> bool:
    # "data/test-00000-of-00001.parquet", "testmini/testmini-0000.parquet", "image.jsonl"; not "non_image-0.parquet"
    stem = relative.name.split(".")[0]
    return (
        stem == split or stem.startswith(split + "-") or stem.startswith(split + "_") or split in relative.parts[:-1]
    )


def _image_ref(value: Any, fallback: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and value.get("path"):
        return str(value["path"])
    return fallback


def _as_list(value: Any) -> list:
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return list(value)
    return [value]


def _raw(value: Any) -> str:
    """A text field as the release's f-strings write it: unstripped, a JSON null "None", a float "3.0"."""
    return f"{value}"


def _pandas_cell(value: Any) -> str:
    """A text cell as the release reads its TSVs (`pd.read_csv`): pandas' missing-value strings ("", "NA", "None",
    "nan", ...) become NaN, which its f-string writes "nan"."""
    from pandas._libs.parsers import STR_NA_VALUES  # the set read_csv's default na_values is built from

    if (
        value is None
        or (isinstance(value, float) and value != value)
        or (isinstance(value, str) and value in STR_NA_VALUES)
    ):
        return "nan"
    return _raw(value)


def _read_tsv(path: Path) -> list[dict[str, Any]]:
    """Rows of a TSV read as the release reads MathVision.tsv (`pd.read_csv(path, sep="\t")`, then iterrows)."""
    import pandas as pd

    frame = pd.read_csv(path, sep="\t")
    return [{key: (None if pd.isna(value) else value) for key, value in row.items()} for _, row in frame.iterrows()]


def _without_leading_placeholders(text: str, num_images: int) -> str:
    """A Hub `problem` written "<image>" + text (hiyouga/geometry3k's conversion script, EasyR1's layout): the text
    after up to `num_images` leading marks, verbatim; a mark anywhere else stays text, as in the release."""
    for _ in range(num_images):
        if not text.startswith(IMAGE_PLACEHOLDER):
            break
        text = text[len(IMAGE_PLACEHOLDER) :]
    return text


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip()


def _resolve_path(path: str, candidates: Sequence[Path]) -> str:
    path = path.removeprefix("./")
    for base in candidates:
        if (base / path).is_file():
            return str(base / path)
    return str(candidates[0] / path)


def _unique_ids(examples: list[Example], name: str) -> list[Example]:
    # Resume keys on the id: a duplicate would be skipped as "done"; make repeats distinct and say so
    counts = Counter(example.id for example in examples)
    repeated = [key for key, count in counts.items() if count > 1]
    if repeated:
        logger.warning("%s: %d ids repeat (e.g. %r); repeats get a #n suffix", name, len(repeated), repeated[0])
        seen: Counter = Counter()
        for example in examples:
            if counts[example.id] > 1:
                seen[example.id] += 1
                example.id = f"{example.id}#{seen[example.id]}"
    return examples


LETTERS = "ABCDEFGHIJ"
# Inline options: "A. 40°", "(B) 60", "C: 120" at the start of a line
_INLINE_OPTION = re.compile(r"^\s*\(?([A-J])[).:：]\s*(.+?)\s*$", re.MULTILINE)


def parse_inline_options(text: str) -> list[str] | None:
    """Option texts written as lines "A. ..." / "A: ..." / "(A) ..." in a question, if they run A, B, C, ..."""
    found = _INLINE_OPTION.findall(text)
    # The options are the last run that starts at "A"
    for start in range(len(found) - 1, -1, -1):
        if found[start][0] == "A":
            run = found[start:]
            letters = "".join(letter for letter, _ in run)
            if LETTERS.startswith(letters) and len(run) >= 2:
                return [option for _, option in run]
    return None


# ----------------------------------------------------------------------------------------------------------------------
# Adapters
# ----------------------------------------------------------------------------------------------------------------------


@register_benchmark
@dataclass
class Geometry3K(Benchmark):
    """hiyouga/geometry3k test (601): `<image>` + InterGPS text; the gold is the correct choice's text, not its letter.

    The prompt is the problem alone, without the choices (NoisyRollout's geo3k loader), so the answer is a value.
    """

    paper_rows: int | None = 601

    name: str = "geometry3k"
    title: str = "Geo3K"
    hub_id: str = "hiyouga/geometry3k"
    split: str = "test"
    folders: tuple[str, ...] = ("geometry3k", "geo3k")
    required_columns: tuple[str, ...] = ("problem", "answer", "images")

    def local_layout(self) -> str:
        return (
            "Hub parquet files data/test-*.parquet, or NoisyRollout's eval_data test/<id>/{data.json,img_diagram.png}"
        )

    def load_local(self, folder: Path) -> Iterable[Mapping[str, Any]]:
        raw = sorted((folder / self.split).glob("*/data.json"), key=lambda p: (len(p.parent.name), p.parent.name))
        if not raw:
            return super().load_local(folder)
        rows = []
        for path in raw:
            # Raw InterGPS: the answer is a letter into `choices`
            item = json.loads(path.read_text())
            letter = _text(item.get("answer"))
            choices = [_text(choice) for choice in item.get("choices", [])]
            if letter not in LETTERS[: len(choices)]:
                raise EvalDataError(f"geometry3k: {path} has answer {letter!r}, not a letter into its choices.")
            rows.append(
                {
                    "id": _text(item.get("id", path.parent.name)),
                    "problem": IMAGE_PLACEHOLDER + _raw(item["annotat_text"]),  # the Hub's layout of the same text
                    "answer": choices[LETTERS.index(letter)],
                    "images": [str(path.parent / "img_diagram.png")],
                    "choices": choices,
                }
            )
        return rows

    def to_example(self, row, index, base_dir):
        images = _as_list(row["images"])
        return Example(
            id=_text(row.get("id", index)) or str(index),
            # The release's `annotat_text` as read from data.json; the Hub's `problem` is "<image>" + the same text
            text=_without_leading_placeholders(_raw(row["problem"]), len(images)),
            images=images,
            image_refs=[_image_ref(image, f"{self.split}[{index}].images[{k}]") for k, image in enumerate(images)],
            gold=_text(row["answer"]),
        )


@register_benchmark
@dataclass
class MMK12(Benchmark):
    """FanqingM/MMK12 test (2,000 multiple-choice items): options inline as "A. ..." lines, the gold is the letter."""

    paper_rows: int | None = 2000

    name: str = "mmk12"
    title: str = "MMK12"
    hub_id: str = "FanqingM/MMK12"
    split: str = "test"
    folders: tuple[str, ...] = ("mmk12", "MMK12")
    category_fields: tuple[str, ...] = ("subject",)
    required_columns: tuple[str, ...] = ("question", "answer", "image")

    def to_example(self, row, index, base_dir):
        images = _as_list(row["image"])
        text = _without_leading_placeholders(_raw(row["question"]), len(images))
        return Example(
            id=_text(row.get("id")) or str(index),
            text=text,
            images=images,
            image_refs=[_image_ref(image, f"{self.split}[{index}].image") for image in images],
            gold=_text(row["answer"]),
            choices=parse_inline_options(text),
            categories={"subject": _text(row.get("subject")) or "unknown"},
            judge_question=_text(row["question"]),  # MM-EUREKA's judge reads the question as written
        )


@register_benchmark
@dataclass
class MathVerse(Benchmark):
    """AI4Math/MathVerse testmini (3,940 = 788 problems x 5 versions), prompted with `query_cot`.

    The judge sees `question_for_eval`; sub-accuracy by `problem_version`.
    """

    paper_rows: int | None = 3940

    name: str = "mathverse"
    title: str = "MathVerse"
    hub_id: str = "AI4Math/MathVerse"
    hub_config: str = "testmini"
    split: str = "testmini"
    judged_in_paper: bool = True
    category_fields: tuple[str, ...] = ("problem_version",)
    required_columns: tuple[str, ...] = ("sample_index", "problem_version", "image", "answer", "query_cot")

    def local_layout(self) -> str:
        return "Hub parquet files, or NoisyRollout's eval_data testmini.json + images/<image>"

    def load_local(self, folder: Path) -> Iterable[Mapping[str, Any]]:
        if (folder / "testmini.json").is_file():
            return json.loads((folder / "testmini.json").read_text())
        return super().load_local(folder)

    def to_example(self, row, index, base_dir):
        image = row["image"]
        if isinstance(image, str) and base_dir is not None:
            image = _resolve_path(image, [base_dir / "images", base_dir])
        images = [image] if image not in (None, "") else []
        answer = _text(row["answer"])
        query = _raw(row["query_cot"])  # the release's `query_cot`, unstripped
        multi_choice = _text(row.get("question_type")) == "multi-choice"
        return Example(
            id=_text(row["sample_index"]),
            text=query,
            images=images,
            image_refs=[_image_ref(row["image"], f"{self.split}[{index}].image")] if images else [],
            gold=answer,
            choices=parse_inline_options(query) if multi_choice else None,
            categories={"problem_version": _text(row["problem_version"])},
            judge_question=_raw(row["question_for_eval"]) if row.get("question_for_eval") is not None else query,
        )


@register_benchmark
@dataclass
class MathVision(Benchmark):
    """MathLLMs/MathVision test (3,040): the image first and the question unchanged (`<image1>` included), as the
    release prompts its MathVision.tsv, on the Hub path too: options the Hub keeps in a separate column are not
    appended (the release's TSV has no such column; appending them changed 184 of 3,040 verdicts).

    The gold is the letter when `options` is non-empty, else the value. Sub-accuracy by `subject`.
    """

    paper_rows: int | None = 3040

    name: str = "mathvision"
    title: str = "MathVision"
    hub_id: str = "MathLLMs/MathVision"
    split: str = "test"
    judged_in_paper: bool = True
    category_fields: tuple[str, ...] = ("subject",)
    required_columns: tuple[str, ...] = ("question", "answer")

    def local_layout(self) -> str:
        return "Hub parquet files data/test-*.parquet, or NoisyRollout's eval_data MathVision.tsv + images/<index>.jpg"

    def load_local(self, folder: Path) -> Iterable[Mapping[str, Any]]:
        tsv = folder / "MathVision.tsv"
        if not tsv.is_file():
            return super().load_local(folder)
        return [
            {
                "id": _raw(row["index"]),
                "question": row["question"],
                "answer": row["answer"],
                "options": [],
                "decoded_image": str(folder / "images" / f"{row['index']}.jpg"),
                "subject": row.get("category", ""),
            }
            for row in _read_tsv(tsv)  # read as the release reads it: pandas, its missing cells and number types
        ]

    def to_example(self, row, index, base_dir):
        image = row.get("decoded_image")
        if image is None:
            image = row.get("image")
            if isinstance(image, str) and base_dir is not None:
                image = _resolve_path(image, [base_dir, base_dir / "images"])
        images = [image] if image not in (None, "") else []
        options = [_text(option) for option in _as_list(row.get("options"))]
        # The question as the release reads its MathVision.tsv with pandas, on the Hub path too (the same cells): no
        # options appended (the TSV has no such column; options the Hub keeps apart only serve rule grading's letter
        # -> text), surrounding whitespace kept, a missing cell ("NA", "None", "") "nan"; `<image1>` stays text
        question = _pandas_cell(row["question"])
        return Example(
            id=_text(row["id"]),
            text=question,
            images=images,
            image_refs=[_image_ref(row.get("image") or image, f"{self.split}[{index}].decoded_image")]
            if images
            else [],
            # As the release reads it: one answer is "11 ", which its `extracted.strip() == answer` never matches
            gold=_pandas_cell(row["answer"]),
            choices=options or None,
            categories={"subject": _text(row.get("subject")) or "unknown"},
            judge_question=question,
        )


@register_benchmark
@dataclass
class MathVista(Benchmark):
    """AI4Math/MathVista testmini (1,000), prompted with `query`.

    Multiple-choice golds are choice texts on the Hub; they become letters (`choices.index(answer)`), as in
    NoisyRollout, and the choice text counts too. Sub-accuracy by `metadata.task`.
    """

    paper_rows: int | None = 1000

    name: str = "mathvista"
    title: str = "MathVista"
    hub_id: str = "AI4Math/MathVista"
    split: str = "testmini"
    judged_in_paper: bool = True
    category_fields: tuple[str, ...] = ("task",)
    required_columns: tuple[str, ...] = ("pid", "query", "answer", "question_type")

    def local_layout(self) -> str:
        return (
            "Hub parquet files data/testmini-*.parquet, and/or the release's images/<pid>.jpg (rows then from the Hub)"
        )

    def load_local(self, folder: Path) -> Iterable[Mapping[str, Any]]:
        # The release's eval data holds only mathvista/images/: it reads the rows from the Hub and the pixels from
        # those files (`os.path.join(data_path, "mathvista", item["image"])`), and so does this adapter
        if not any(folder.rglob("*.parquet")) and not any(folder.rglob("*.json*")) and (folder / "images").is_dir():
            if (_offline() or not _hub_reachable()) and not _hub_cached(self.hub_id):
                raise EvalDataError(f"mathvista: {folder} holds images/ only, and the rows come from {self.hub_id}, "
                                    "which is not cached and the Hub is not reachable; add its parquet files under "
                                    f"{folder}/data/.")  # fmt: skip
            return self.load_hub()
        return super().load_local(folder)

    def to_example(self, row, index, base_dir):
        image = row.get("decoded_image")
        if (
            isinstance(row.get("image"), str)
            and base_dir is not None
            and (image is None or (base_dir / "images").is_dir())
        ):
            # Beside the release's images/ folder the pixels are its files, not the parquet's copy; a file missing
            # there is a row the release skips (recorded as unusable here), never filled in from the parquet
            image = _resolve_path(row["image"], [base_dir, base_dir / "images"])
        images = [image] if image not in (None, "") else []
        answer = _text(row["answer"])
        choices = [_text(choice) for choice in _as_list(row.get("choices"))] or None
        gold = answer
        if _text(row["question_type"]) == "multi_choice":
            if not choices or answer not in choices:
                raise EvalDataError(
                    f"mathvista pid {row['pid']}: multi_choice answer {answer!r} is not among {choices}."
                )
            gold = LETTERS[choices.index(answer)]
        metadata = row.get("metadata") or {}
        return Example(
            id=_text(row["pid"]),
            text=_raw(row["query"]),  # the release's `query`, unstripped
            images=images,
            image_refs=[_image_ref(row.get("image") or image, f"{self.split}[{index}].decoded_image")]
            if images
            else [],
            gold=gold,
            # Kept for every multiple-choice item, letter-only options too ("A".."D" as the options' text): MathVista's
            # calculate_score maps an extracted letter through them, and without them marked those 15 items wrong
            choices=choices if _text(row["question_type"]) == "multi_choice" else None,
            categories={"task": _text(metadata.get("task")) or "unknown"},
            # The release's judge reads `query`: the hint (precision, answer type), the question and the choices
            judge_question=_raw(row["query"]),
            groups={
                "question_type": _text(row["question_type"]),
                "answer_type": _text(row.get("answer_type")),
                "precision": _text(row.get("precision")),
            },
        )

    def official_metrics(self, records):
        """MathVista's calculate_score.py on the protocol's extraction (see `official.mathvista_normalize`)."""
        from .official import mathvista_official_correct

        if not records or any("answer_type" not in (r.get("groups") or {}) for r in records):
            return None  # records written before the answer type was stored
        # A row without a completion (unreadable image) is wrong, as in the headline
        right = [not r.get("error") and mathvista_official_correct(r, r.get("extracted")) for r in records]
        return {
            "name": "MathVista official score",
            "source": "lupantech/MathVista evaluation/calculate_score.py: answer normalised by answer type and "
            "precision, option letter to text (else the closest option), then exact match",
            "accuracy": sum(right) / len(right),
            "correct": sum(right),
            "examples": len(right),
        }


def wemath_steps(key: str) -> str:
    """We-Math's step level of a row from its `key`: 2steps_1 -> "one-step", 2steps_multi -> "two-step"."""
    if key.endswith("_multi"):
        return {"2steps": "two-step", "3steps": "three-step"}.get(key.split("_")[0], key)
    return "one-step"


@register_benchmark
@dataclass
class WeMath(Benchmark):
    """We-Math/We-Math testmini (1,740 rows): `question + "\\n\\nOptions: " + option`, the gold is a letter.

    Ids are `ID@key` as in NoisyRollout; accuracy by step level (one-step sub-problems, two- and three-step
    composites).
    """

    paper_rows: int | None = 1740

    name: str = "wemath"
    title: str = "We-Math"
    hub_id: str = "We-Math/We-Math"
    split: str = "testmini"
    judged_in_paper: bool = True
    folders: tuple[str, ...] = ("wemath", "We-Math")
    category_fields: tuple[str, ...] = ("steps",)
    required_columns: tuple[str, ...] = ("ID", "question", "option", "answer", "image_path", "key")

    def local_layout(self) -> str:
        return "Hub parquet files, or NoisyRollout's eval_data testmini.json + images/<image_path>"

    def load_local(self, folder: Path) -> Iterable[Mapping[str, Any]]:
        if (folder / "testmini.json").is_file():
            return json.loads((folder / "testmini.json").read_text())
        return super().load_local(folder)

    def to_example(self, row, index, base_dir):
        image = row["image_path"]
        ref = _image_ref(image, f"{self.split}[{index}].image_path")
        if isinstance(image, str) and base_dir is not None:
            image = _resolve_path(image, [base_dir / "images", base_dir])
        option = _text(row["option"])
        key = _text(row["key"])
        choices = [re.sub(r"^[A-J]\.\s*", "", part.strip()) for part in option.split(";") if part.strip()]
        # The release's f"{question}\n\nOptions: {option}", whitespace as in the file (81 of 1,740 questions have some)
        question = _raw(row["question"]) + "\n\nOptions: " + _raw(row["option"])
        return Example(
            id=f"{_text(row['ID'])}@{key}",
            text=question,
            images=[image],
            image_refs=[ref],
            gold=_text(row["answer"]),
            choices=choices or None,
            categories={"steps": wemath_steps(key)},
            judge_question=question,
            groups={"wemath_id": _text(row["ID"]), "wemath_key": key},
        )

    def official_metrics(self, records):
        """We-Math's four-dimensional metric over the protocol's verdicts (see `official.wemath_four_dimensional`)."""
        from .official import wemath_four_dimensional

        if any("wemath_key" not in (r.get("groups") or {}) for r in records):
            return None
        result = wemath_four_dimensional(
            (r["groups"]["wemath_id"], r["groups"]["wemath_key"], bool(r["correct"])) for r in records
        )
        if result is None:
            return None
        return {
            "name": "We-Math four-dimensional",
            "source": "We-Math/We-Math evaluation/four_dimensional_metrics.py",
            **result,
        }


HALLUSION_SUFFIX = "? You final answer can only be \\boxed{yes} or \\boxed{no}."


@register_benchmark
@dataclass
class HallusionBench(Benchmark):
    """HallusionBench (lmms-lab/HallusionBench split `image`: the 951 questions with a figure).

    NoisyRollout's prompt: the question up to its first "?", then `HALLUSION_SUFFIX` (typo included, verbatim). Gold
    "yes" when `gt_answer` is "1". Reports aAcc (the headline), qAcc and fAcc over the image rows, and accuracy by
    `subcategory`.
    """

    paper_rows: int | None = 951

    name: str = "hallusionbench"
    title: str = "HalluBench"
    hub_id: str = "lmms-lab/HallusionBench"
    split: str = "image"
    folders: tuple[str, ...] = ("hallusionbench", "hallubench", "HallusionBench")
    category_fields: tuple[str, ...] = ("subcategory",)
    required_columns: tuple[str, ...] = ("category", "subcategory", "set_id", "figure_id", "question_id",
                                         "question", "gt_answer")  # fmt: skip

    def local_layout(self) -> str:
        return "Hub parquet files data/image-*.parquet, or the official HallusionBench.json + images/<filename>"

    def load_local(self, folder: Path) -> Iterable[Mapping[str, Any]]:
        if (folder / "HallusionBench.json").is_file():
            return json.loads((folder / "HallusionBench.json").read_text())
        return super().load_local(folder)

    def to_example(self, row, index, base_dir):
        image = row.get("image")
        filename = row.get("filename")  # absent or null on rows without a figure (official JSON)
        if image is None:
            if not filename:
                return None  # no figure: left out, as NoisyRollout does
            image = _resolve_path(filename, [base_dir / "images", base_dir] if base_dir else [Path(".")])
        question = _raw(row["question"])  # unstripped: " Is ..." and "... 5. " (no "?") reach the model as written
        gold = {"1": "yes", "0": "no"}.get(_text(row["gt_answer"]))
        if gold is None:
            raise EvalDataError(f"hallusionbench row {index}: gt_answer {row['gt_answer']!r} is neither '1' nor '0'.")
        category, subcategory, set_id = _text(row["category"]), _text(row["subcategory"]), _text(row["set_id"])
        figure_id, question_id = _text(row["figure_id"]), _text(row["question_id"])
        return Example(
            id=f"{category}/{subcategory}/{set_id}/{figure_id}/{question_id}",
            text=question.split("?")[0] + HALLUSION_SUFFIX,
            images=[image],
            image_refs=[_image_ref(filename or image, f"{self.split}[{index}].image")],
            gold=gold,
            categories={"subcategory": subcategory},
            groups={
                "question": f"{category}/{subcategory}/{set_id}/{question_id}",
                "figure": f"{category}/{subcategory}/{set_id}/{figure_id}",
            },
        )

    def extra_metrics(self, records):
        """aAcc: per question; qAcc: all figures of a question right; fAcc: all questions of a figure right.

        Named for what they are: the official qAcc also counts the 178 figure-less questions (and VLMEvalKit's fAcc
        their figure-0 groups), which the release's protocol leaves out, so both are over the image rows only."""

        def all_right(key: str) -> float:
            groups: dict[str, bool] = {}
            for record in records:
                group = record["groups"][key]
                groups[group] = groups.get(group, True) and bool(record["correct"])
            return sum(groups.values()) / len(groups) if groups else float("nan")

        if not records:
            return {}
        return {
            "aAcc": sum(bool(r["correct"]) for r in records) / len(records),
            "qAcc (image rows)": all_right("question"),
            "fAcc (image rows)": all_right("figure"),
        }


@register_benchmark
@dataclass
class Synthetic(Benchmark):
    """Generated visual-reasoning rows (counting, reading numbers, bars, programs): an offline trial, not a result."""

    name: str = "synthetic"
    title: str = "Synthetic"
    in_paper_table: bool = False
    split: str = "test"
    category_fields: tuple[str, ...] = ("kind",)
    num_rows: int = 32
    seed: int = 20_260_000  # away from the training demo's seeds

    def source(self, data_dir):
        return f"vepo_trl.data.make_synthetic_dataset({self.num_rows}, seed={self.seed})"

    def load_rows(self, data_dir):
        from ..data.synthetic import make_synthetic_dataset

        return _undecoded(make_synthetic_dataset(self.num_rows, seed=self.seed)), None

    def to_example(self, row, index, base_dir):
        images = _as_list(row["images"])
        return Example(
            id=str(index),
            text=_without_leading_placeholders(_text(row["problem"]), len(images)),
            images=images,
            image_refs=[f"synthetic[{index}].images[{k}]" for k in range(len(images))],
            gold=_text(row["answer"]),
            categories={"kind": _text(row["kind"])},
        )


_ALIASES = {"geo3k": "geometry3k", "hallubench": "hallusionbench", "we-math": "wemath", "mathvison": "mathvision"}


def resolve_benchmarks(names: str | Sequence[str] | None) -> list[Benchmark]:
    """`None`, "all" or "paper": the seven of Table 1; otherwise names separated by commas (or a list)."""
    if names is None:
        names = ["all"]
    if isinstance(names, str):
        names = [names]
    parts = [part.strip() for name in names for part in name.split(",") if part.strip()]
    resolved: list[Benchmark] = []
    for part in parts:
        for bench in (
            [BENCHMARKS[n] for n in PAPER_BENCHMARKS] if part.lower() in ("all", "paper") else [get_benchmark(part)]
        ):
            if bench not in resolved:
                resolved.append(bench)
    if not resolved:
        raise ValueError(f"No benchmark named. Valid names are: {', '.join(BENCHMARKS)} (or all).")
    return resolved
