"""`vepo-trl eval` sends the prompt and the pixels the authors' release sends, on both of our data layouts.

The reference is a port of the release's evaluation (Leonnnnnn929/VEPO @4247308, `eval/` as NoisyRollout wrote it):
its loaders (`eval/utils/data_loaders.py`), its `load_image` and `prepare_prompts` (`eval/utils/processing.py`, version
"7b", the default of `eval/main.py`) and the system prompt `run_eval.sh` passes. Each benchmark gets a few rows written
here with tricky content (whitespace around the question, `<image>` as text, nulls, pandas' missing-value strings),
once in the release's own local layout (the files its loaders read) and once as the Hub's parquet files. The release
builds its prompts from the local files; the same row in the Hub layout must reach the model identically.

For every row the release sends: our `_prepare` text equals the release's `prompt_text` character for character, and
our image equals its `load_image(path, 262144, 1000000)` (mode, size, pixels). For every row the release skips at
prompt time (image file missing or unreadable): ours records an error instead of sending a prompt.
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import subprocess
import types
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from PIL import Image, ImageDraw

from vepo_trl.eval.benchmarks import EVAL_SYSTEM_PROMPT, get_benchmark
from vepo_trl.eval.run import _prepare


MIN_PIXELS, MAX_PIXELS = 262144, 1000000  # run_eval.sh: --min-pixels 262144 --max-pixels 1000000
ARGS = types.SimpleNamespace(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)

# run_eval.sh, verbatim: a bash string spanning two lines ("""...""" is "" "..." "" to bash), passed to eval/main.py
# as --system-prompt="${SYSTEM_PROMPT}"; argparse keeps it as is
RUN_EVAL_SH_SYSTEM_PROMPT = '''SYSTEM_PROMPT="""You FIRST think about the reasoning process as an internal monologue and then provide the final answer.
 The reasoning process MUST BE enclosed within <think> </think> tags. The final answer MUST BE put in \\boxed{}."""'''

HALLUSION_SUFFIX = "? You final answer can only be \\boxed{yes} or \\boxed{no}."  # the release's, typo included

MISSING, CORRUPT = "missing", "corrupt"  # a row's picture: a seed, or no file / a file that is not an image
LARGE = 4  # the seed of a 1400x1000 picture: over max_pixels, scaled down first
CORRUPT_BYTES = b"GIF89a, or so it claims\n"

BENCHMARKS = ("geometry3k", "wemath", "mathvista", "mathverse", "mathvision", "hallusionbench")
RELEASE_FOLDERS = {"geometry3k": "geometry3k", "wemath": "wemath", "mathvista": "mathvista",
                   "mathverse": "mathverse", "mathvision": "mathvision", "hallusionbench": "hallubench"}  # fmt: skip
HUB_FOLDERS = {**RELEASE_FOLDERS, "hallusionbench": "hallusionbench"}


# ----------------------------------------------------------------------------------------------------------------------
# Pictures: 64x48 (scaled up to min_pixels), distinct per row, in several modes (the release converts every one to RGB)
# ----------------------------------------------------------------------------------------------------------------------


def picture_bytes(picture, fmt: str = "PNG", mode: str = "RGB") -> bytes:
    if picture == CORRUPT:
        return CORRUPT_BYTES
    seed = int(picture)
    image = Image.new(
        "RGB",
        (1400, 1000) if seed == LARGE else (64, 48),
        ((37 * seed) % 256, (91 * seed) % 256, (53 * seed + 120) % 256),
    )
    draw = ImageDraw.Draw(image)
    draw.rectangle((4 + seed % 20, 6, 30 + seed % 20, 40), fill=((200 + seed) % 256, 30, (17 * seed) % 256))
    draw.line((0, seed % 48, 63, 47 - seed % 48), fill=(255, 255, 255), width=3)
    if mode == "RGBA":  # half-transparent right half: the release drops alpha (convert("RGB")), never composites
        image = image.convert("RGBA")
        alpha = Image.new("L", image.size, 255)
        ImageDraw.Draw(alpha).rectangle((32, 0, 63, 47), fill=40)
        image.putalpha(alpha)
    elif mode != "RGB":
        image = image.convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **({"quality": 80} if fmt == "JPEG" else {}))
    return buffer.getvalue()


def write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def hub_image(data: bytes, name: str) -> dict:
    return {"bytes": data, "path": name}  # the same bytes as the local file: identical pixels on both layouts


def write_parquet(data: dict, features: datasets.Features, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_dict(data, features=features).to_parquet(str(path))


S = datasets.Value("string")


# ----------------------------------------------------------------------------------------------------------------------
# The rows, one list per benchmark; the trickiness of each row is in its comment
# ----------------------------------------------------------------------------------------------------------------------

# (id, annotat_text, choices, answer letter, picture, mode)
GEOMETRY3K = [
    (2401, "  Find x.\n", ["3", "5", "7", "9"], "A", 1, "RGB"),  # whitespace around
    (2402, "\tIf <image> is a square, find y. ", ["2", "4", "6", "8"], "C", 2, "RGBA"),  # `<image>` as text
    (2403, "<image>Find z.", ["1", "2", "3", "4"], "B", 3, "P"),  # the Hub's problem: "<image><image>Find z."
    (2404, "Find the area. Round to the nearest tenth.", ["6", "12", "24", "36"], "B", LARGE, "L"),  # scaled down
    (2405, "Find m \\angle 2.", ["30", "60", "90", "120"], "D", CORRUPT, "RGB"),  # prepare_prompts skips it
    (2406, "Find w.", ["1", "2", "3", "4"], "A", MISSING, "RGB"),  # load_geo3k_dataset never loads it
]

# (ID, key, question, option, image_path, picture, mode)
WEMATH = [
    ("2steps_7", "2steps_1", "  As shown in the figure, what is x?\n", "A. 1;B. 2;C. 3;D. 4 \t", "2steps/image/7-1.png",
     11, "RGB"),  # whitespace around question and option
    ("2steps_7", "2steps_2", "Look at <image> and the figure: which is larger?", "A. <image>;B. the figure",
     "2steps/image/7-2.png", 12, "RGBA"),  # `<image>` as text
    ("2steps_7", "2steps_multi", None, "\nA. 5;B. 6", "2steps/image/7-m.png", 13, "L"),  # a JSON null: "None"
    ("3steps_165", "3steps_1", "What is the radius?", "A. 1;B. 2", "3steps/image/165-1.png", CORRUPT, "RGB"),
    ("3steps_165", "3steps_2", "What is r²?", "A. 1;B. 4", "3steps/image/165-2.png", MISSING, "RGB"),
]  # fmt: skip

# (sample_index, query_cot, image, picture, mode)
MATHVERSE = [
    ("1", " \nPlease first conduct reasoning, and then answer the question and provide the final value, e.g., 1, 2.5, "
     "300, at the end.\nQuestion: find the length of AB.\t", "image_1.png", 21, "RGB"),  # whitespace around
    ("2", "Please first conduct reasoning.\nQuestion: The figure <image> shows a triangle; find CD.",
     "images_version_5/image_2.png", 22, "L"),  # `<image>` as text, an image in a subfolder
    ("3", "\t \n", "image_3.png", 23, "RGB"),  # whitespace only: the release still sends it
    ("6", None, "image_6.png", 26, "RGBA"),  # a JSON null: "None"
    ("4", "Question: find EF.", "image_4.png", CORRUPT, "RGB"),
    ("5", "Question: find GH.", "image_5.png", MISSING, "RGB"),
]  # fmt: skip

# (index, question, picture, mode); pandas reads "None", "NA", "nan", "" as NaN, which the f-string writes "nan"
MATHVISION = [
    (101, "  How many different digits can you find in this picture?\n<image1>\t", 31, "RGB"),  # `<image1>` stays
    (102, "None", 32, "RGB"),
    (103, "NA", 33, "L"),
    (104, "nan", 34, "RGB"),
    (105, "", 35, "RGB"),
    (106, "Compare <image> with <image1>.", 36, "RGB"),  # `<image>` as text
    (107, "Which cube is red?", CORRUPT, "RGB"),
    (108, "Which cube is blue?", MISSING, "RGB"),
]

# (pid, query, question_type, choices, answer, picture, mode)
MATHVISTA = [
    ("1", " Hint: Please answer the question requiring a floating-point number with one decimal place and provide the "
     "final value, e.g., 1.2, 1.3, 1.4, at the end.\nQuestion: What is the spring constant in N/cm?\n",
     "free_form", None, "1.2", 41, "RGB"),  # whitespace around
    ("2", "Hint: Please answer the question and provide the correct option letter, e.g., A, B, C, D, at the end.\n"
     "Question: Is <image> larger than the square?\nChoices:\n(A) yes\n(B) no", "multi_choice", ["yes", "no"], "no",
     42, "RGB"),  # `<image>` as text
    ("3", "\tQuestion: How many bars are there?", "free_form", None, "3", 43, "L"),
    ("4", "Question: Which is taller?", "free_form", None, "2", CORRUPT, "RGB"),
    ("5", "Question: Which is wider?", "free_form", None, "7", MISSING, "RGB"),
]  # fmt: skip

# (category, subcategory, set_id, figure_id, question_id, question, gt_answer, filename, picture, mode)
HALLUSIONBENCH = [
    ("VD", "illusion", "0", "0", "0", "The sum is 5. ", "1", "./hallusion_bench/VD/illusion/0_0.png", 51, "RGB"),
    ("VD", "illusion", "0", "0", "1", " Is the circle red?", "0", "./hallusion_bench/VD/illusion/0_0.png", 51, "RGB"),
    ("VS", "chart", "1", "0", "0", "Is A bigger? Or is B bigger?", "1", "./hallusion_bench/VS/chart/1_0.png", 52, "P"),
    ("VS", "chart", "1", "1", "0", "Is <image> the same as the chart?\n", "0", "./hallusion_bench/VS/chart/1_1.png",
     53, "RGBA"),
    ("VD", "math", "4", "0", "0", "  ?  ", "1", "./hallusion_bench/VD/math/4_0.png", 54, "RGB"),
    ("VS", "table", "2", "0", "0", "Is the tallest bar blue?", "1", None, None, "RGB"),  # no figure: never loaded
    ("VS", "table", "2", "0", "1", "Is the shortest bar red?", "0", "", None, "RGB"),  # empty filename: same
    ("VD", "figure", "3", "0", "0", "Is this a cat?", "1", "./hallusion_bench/VD/figure/3_0.png", CORRUPT, "RGB"),
    ("VD", "figure", "3", "1", "0", "Is this a dog?", "0", "./hallusion_bench/VD/figure/3_1.png", MISSING, "RGB"),
]  # fmt: skip

# (rows the release sends, rows it skips at prompt time) per benchmark and layout; the Hub has no missing files
EXPECTED_COUNTS = {
    "geometry3k": {"release": (4, 1), "hub": (4, 1)},
    "wemath": {"release": (3, 2), "hub": (3, 1)},
    "mathvista": {"release": (3, 2), "hub": (3, 1)},
    "mathverse": {"release": (4, 2), "hub": (4, 1)},
    "mathvision": {"release": (6, 2), "hub": (6, 1)},
    "hallusionbench": {"release": (5, 2), "hub": (5, 1)},
}


# ----------------------------------------------------------------------------------------------------------------------
# Writers: the release's local files, and the Hub's parquet files of the same rows
# ----------------------------------------------------------------------------------------------------------------------


def write_geometry3k(folder: Path, layout: str) -> None:
    if layout == "release":  # InterGPS: test/<id>/{data.json,img_diagram.png}
        for id_, text, choices, letter, picture, mode in GEOMETRY3K:
            row = folder / "test" / str(id_)
            row.mkdir(parents=True)
            item = {"id": id_, "annotat_text": text, "choices": choices, "answer": letter}
            (row / "data.json").write_text(json.dumps(item, ensure_ascii=False), encoding="utf-8")
            if picture != MISSING:
                write_file(row / "img_diagram.png", picture_bytes(picture, "PNG", mode))
        return
    rows = [r for r in GEOMETRY3K if r[4] != MISSING]
    features = datasets.Features({"images": datasets.List(datasets.Image()), "problem": S, "answer": S,
                                  "id": datasets.Value("int64"), "choices": datasets.List(S), "ground_truth": S})  # fmt: skip
    data = {
        "images": [[hub_image(picture_bytes(r[4], "PNG", r[5]), "img_diagram.png")] for r in rows],
        "problem": ["<image>" + r[1] for r in rows],  # hiyouga/geometry3k's conversion: "<image>" + annotat_text
        "answer": [r[2]["ABCD".index(r[3])] for r in rows],
        "id": [r[0] for r in rows],
        "choices": [r[2] for r in rows],
        "ground_truth": [r[3] for r in rows],
    }
    write_parquet(data, features, folder / "data" / "test-00000-of-00001.parquet")


WEMATH_EXTRA = {"split": "testmini", "knowledge concept": "Area of Circles", "answer": "A", "question number": 1,
                "knowledge concept description": "The area of a circle is pi times the radius squared."}  # fmt: skip


def write_wemath(folder: Path, layout: str) -> None:
    items = [{"ID": id_, "key": key, "question": q, "option": o, "image_path": path, **WEMATH_EXTRA}
             for id_, key, q, o, path, _, _ in WEMATH]  # fmt: skip
    if layout == "release":  # testmini.json + images/<image_path>
        folder.mkdir(parents=True)
        (folder / "testmini.json").write_text(json.dumps(items, ensure_ascii=False), encoding="utf-8")
        for *_, path, picture, mode in WEMATH:
            if picture != MISSING:
                write_file(folder / "images" / path, picture_bytes(picture, "PNG", mode))
        return
    kept = [(item, row) for item, row in zip(items, WEMATH) if row[5] != MISSING]
    features = datasets.Features({**{name: S for name in items[0]}, "image_path": datasets.Image(),
                                  "question number": datasets.Value("int64")})  # fmt: skip
    data = {name: [item[name] for item, _ in kept] for name in items[0]}
    data["image_path"] = [hub_image(picture_bytes(row[5], "PNG", row[6]), row[4]) for _, row in kept]
    write_parquet(data, features, folder / "data" / "testmini-00000-of-00001.parquet")


def write_mathverse(folder: Path, layout: str) -> None:
    def item(index, query, image):
        return {"sample_index": index, "problem_index": index, "problem_version": "Text Lite", "question": "Find it.",
                "image": image, "answer": "5", "question_type": "free-form",
                "metadata": {"split": "testmini", "source": "GeoQA", "subject": "Plane Geometry", "subfield": "Length"},
                "query_wo": "Find it.", "query_cot": query, "question_for_eval": "Find it."}  # fmt: skip

    if layout == "release":  # testmini.json + images/<image>
        folder.mkdir(parents=True)
        items = [item(index, query, image) for index, query, image, _, _ in MATHVERSE]
        (folder / "testmini.json").write_text(json.dumps(items, ensure_ascii=False), encoding="utf-8")
        for _, _, image, picture, mode in MATHVERSE:
            if picture != MISSING:
                write_file(folder / "images" / image, picture_bytes(picture, "PNG", mode))
        return
    items = [item(index, query, hub_image(picture_bytes(picture, "PNG", mode), image))
             for index, query, image, picture, mode in MATHVERSE if picture != MISSING]  # fmt: skip
    features = datasets.Features({**{name: S for name in items[0]}, "image": datasets.Image(),
                                  "metadata": {"split": S, "source": S, "subject": S, "subfield": S}})  # fmt: skip
    write_parquet({name: [i[name] for i in items] for name in items[0]}, features,
                  folder / "data" / "testmini-00000-of-00001.parquet")  # fmt: skip


def write_mathvision(folder: Path, layout: str) -> None:
    if layout == "release":  # MathVision.tsv (VLMEvalKit's columns) + images/<index>.jpg
        folder.mkdir(parents=True)
        frame = pd.DataFrame({"index": [r[0] for r in MATHVISION], "question": [r[1] for r in MATHVISION],
                              "answer": ["3"] * len(MATHVISION), "category": ["counting"] * len(MATHVISION)})  # fmt: skip
        frame.to_csv(folder / "MathVision.tsv", sep="\t", index=False)  # quotes the cells holding "\n" or "\t"
        for index, _, picture, mode in MATHVISION:
            if picture != MISSING:
                write_file(folder / "images" / f"{index}.jpg", picture_bytes(picture, "JPEG", mode))
        return
    rows = [r for r in MATHVISION if r[2] != MISSING]
    features = datasets.Features({"id": S, "question": S, "options": datasets.List(S), "image": S,
                                  "decoded_image": datasets.Image(), "answer": S, "solution": S,
                                  "level": datasets.Value("int64"), "subject": S})  # fmt: skip
    data = {
        "id": [str(r[0]) for r in rows],
        "question": [r[1] for r in rows],  # the TSV's cell strings: "NA" is expected to reach the model as "nan"
        "options": [[] for _ in rows],
        "image": [f"images/{r[0]}.jpg" for r in rows],
        "decoded_image": [hub_image(picture_bytes(r[2], "JPEG", r[3]), f"{r[0]}.jpg") for r in rows],
        "answer": ["3"] * len(rows),
        "solution": [""] * len(rows),
        "level": [1] * len(rows),
        "subject": ["counting"] * len(rows),
    }
    write_parquet(data, features, folder / "data" / "test-00000-of-00001.parquet")


def write_mathvista(folder: Path, layout: str) -> None:
    """The Hub's testmini rows (the release loads them with `load_dataset`); in the release layout also images/<file>,
    whose pixels it reads. There `decoded_image` holds another picture, so that reading the wrong one shows."""
    metadata = {name: S for name in ("category", "context", "grade", "language", "source", "split", "task")}
    metadata.update(img_height=datasets.Value("int64"), img_width=datasets.Value("int64"), skills=datasets.List(S))
    features = datasets.Features({"pid": S, "question": S, "image": S, "decoded_image": datasets.Image(),
                                  "choices": datasets.List(S), "unit": S, "precision": datasets.Value("float64"),
                                  "answer": S, "question_type": S, "answer_type": S, "metadata": metadata,
                                  "query": S})  # fmt: skip
    rows = [r for r in MATHVISTA if layout == "release" or r[5] != MISSING]
    meta = {"category": "math-targeted-vqa", "context": "bar chart", "grade": "daily life", "language": "english",
            "source": "ChartQA", "split": "testmini", "task": "figure question answering", "img_height": 48,
            "img_width": 64, "skills": ["arithmetic reasoning"]}  # fmt: skip
    if layout == "release":
        decoded = [picture_bytes(100 + k, "PNG") for k in range(len(rows))]
        for pid, *_, picture, mode in rows:
            if picture != MISSING:
                write_file(folder / "images" / f"{pid}.jpg", picture_bytes(picture, "JPEG", mode))
    else:
        decoded = [picture_bytes(r[5], "JPEG", r[6]) for r in rows]
    data = {
        "pid": [r[0] for r in rows],
        "question": ["The question."] * len(rows),
        "image": [f"images/{r[0]}.jpg" for r in rows],
        "decoded_image": [hub_image(d, f"{r[0]}.jpg") for d, r in zip(decoded, rows)],
        "choices": [r[3] for r in rows],
        "unit": [None] * len(rows),
        "precision": [1.0 if r[4] == "1.2" else None for r in rows],
        "answer": [r[4] for r in rows],
        "question_type": [r[2] for r in rows],
        "answer_type": ["float" if r[4] == "1.2" else "text" if r[3] else "integer" for r in rows],
        "metadata": [meta] * len(rows),
        "query": [r[1] for r in rows],
    }
    write_parquet(data, features, folder / "data" / "testmini-00000-of-00001.parquet")


def write_hallusionbench(folder: Path, layout: str) -> None:
    items = [{"category": c, "subcategory": sub, "visual_input": "1" if f else "0", "set_id": s, "figure_id": fig,
              "sample_note": "note", "question_id": qid, "question": q, "gt_answer_details": "", "gt_answer": gt,
              "filename": f} for c, sub, s, fig, qid, q, gt, f, _, _ in HALLUSIONBENCH]  # fmt: skip
    if layout == "release":  # the official HallusionBench.json + images/<filename without "./">
        folder.mkdir(parents=True)
        (folder / "HallusionBench.json").write_text(json.dumps(items, ensure_ascii=False), encoding="utf-8")
        for *_, filename, picture, mode in HALLUSIONBENCH:
            if filename and picture != MISSING:
                write_file(folder / "images" / filename.removeprefix("./"), picture_bytes(picture, "PNG", mode))
        return
    # lmms-lab/HallusionBench: split `image` (rows with a figure) and `non_image`
    features = datasets.Features({**{name: S for name in items[0]}, "image": datasets.Image()})
    for split, with_figure in (("image", True), ("non_image", False)):
        kept = [(i, r) for i, r in zip(items, HALLUSIONBENCH) if bool(r[7]) == with_figure and r[8] != MISSING]
        data = {name: [i[name] for i, _ in kept] for name in items[0]}
        data["image"] = [hub_image(picture_bytes(r[8], "PNG", r[9]), r[7]) if with_figure else None for _, r in kept]
        write_parquet(data, features, folder / "data" / f"{split}-00000-of-00001.parquet")


WRITERS = {"geometry3k": write_geometry3k, "wemath": write_wemath, "mathvista": write_mathvista,
           "mathverse": write_mathverse, "mathvision": write_mathvision, "hallusionbench": write_hallusionbench}  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------------
# The release, ported: its loaders read the local layout into {id, image_path, question}
# ----------------------------------------------------------------------------------------------------------------------


def release_geometry3k(data_dir: Path) -> list[dict]:
    # data_loaders.py::load_geo3k_dataset: every folder of geometry3k/test holding both files, annotat_text verbatim
    root = data_dir / "geometry3k" / "test"
    items = []
    for name in os.listdir(root):
        image, data = root / name / "img_diagram.png", root / name / "data.json"
        if (root / name).is_dir() and image.exists() and data.exists():
            item = json.loads(data.read_text(encoding="utf-8"))
            items.append({"id": item["id"], "image_path": image, "question": item["annotat_text"]})
    return items


def release_wemath(data_dir: Path) -> list[dict]:
    # data_loaders.py::load_wemath_dataset: f"{question}\n\nOptions: {option}", images/<image_path>
    items = json.loads((data_dir / "wemath" / "testmini.json").read_text(encoding="utf-8"))
    return [{"id": item["ID"] + "@" + item["key"], "image_path": data_dir / "wemath" / "images" / item["image_path"],
             "question": f"{item['question']}\n\nOptions: {item['option']}"} for item in items]  # fmt: skip


def release_mathvista(data_dir: Path) -> list[dict]:
    # data_loaders.py::load_mathvista_dataset: the Hub's testmini rows (load_dataset("AI4Math/MathVista"); here the
    # same rows from the folder's parquet), `query` verbatim, pixels from mathvista/<image>
    files = sorted((data_dir / "mathvista" / "data").glob("testmini-*.parquet"))
    rows = [row for path in files for row in pq.read_table(path).to_pylist()]
    return [{"id": row.get("pid", ""), "image_path": data_dir / "mathvista" / row["image"], "question": row["query"]}
            for row in rows]  # fmt: skip


def release_mathverse(data_dir: Path) -> list[dict]:
    # data_loaders.py::load_mathverse_dataset: `query_cot` verbatim, images/<image>
    items = json.loads((data_dir / "mathverse" / "testmini.json").read_text(encoding="utf-8"))
    return [{"id": item.get("sample_index", ""), "image_path": data_dir / "mathverse" / "images" / item["image"],
             "question": item["query_cot"]} for item in items]  # fmt: skip


def release_mathvision(data_dir: Path) -> list[dict]:
    # data_loaders.py::load_mathvision_dataset: pd.read_csv(sep="\t") with pandas' default missing values, iterrows,
    # images/<index>.jpg; a missing question is NaN (the f-string writes "nan")
    frame = pd.read_csv(data_dir / "mathvision" / "MathVision.tsv", sep="\t")
    return [{"id": row.get("index", ""), "image_path": data_dir / "mathvision" / "images" / f"{row['index']}.jpg",
             "question": row["question"]} for _, row in frame.iterrows()]  # fmt: skip


def release_hallusionbench(data_dir: Path) -> list[dict]:
    # data_loaders.py::load_hallubench_dataset: rows with a filename; the question up to its first "?" (when it has
    # one), then the suffix; images/<filename with every "./" removed>
    items = json.loads((data_dir / "hallubench" / "HallusionBench.json").read_text(encoding="utf-8"))
    out = []
    for item in items:
        if not item["filename"]:
            continue
        question = item["question"].split("?")[0] if "?" in item["question"] else item["question"]
        out.append({"id": f"{item['set_id']}_{item['figure_id']}_{item['question_id']}",
                    "image_path": data_dir / "hallubench" / "images" / item["filename"].replace("./", ""),
                    "question": question + HALLUSION_SUFFIX})  # fmt: skip
    return out


RELEASE_LOADERS = {"geometry3k": release_geometry3k, "wemath": release_wemath, "mathvista": release_mathvista,
                   "mathverse": release_mathverse, "mathvision": release_mathvision,
                   "hallusionbench": release_hallusionbench}  # fmt: skip


def release_load_image(path: Path, min_pixels: int, max_pixels: int) -> Image.Image | None:
    # processing.py::load_image: RGB, then sqrt scaling down to max_pixels, then up to min_pixels, sides truncated to
    # ints, Pillow's default filter; None when the file does not load
    try:
        image = Image.open(path).convert("RGB")
        if image.width * image.height > max_pixels:
            factor = math.sqrt(max_pixels / (image.width * image.height))
            image = image.resize((int(image.width * factor), int(image.height * factor)))
        if image.width * image.height < min_pixels:
            factor = math.sqrt(min_pixels / (image.width * image.height))
            image = image.resize((int(image.width * factor), int(image.height * factor)))
        return image
    except Exception:
        return None


@dataclass
class Sent:
    key: str
    prompt: str | None  # None: the release skips the row (prepare_prompts' `continue`)
    image: Image.Image | None


def release_prepare(items: list[dict], system_prompt: str) -> list[Sent]:
    # processing.py::prepare_prompts, version "7b": skip a row whose image file is absent or does not load; one image,
    # first, then the question through an f-string
    sent = []
    for item in items:
        image = release_load_image(item["image_path"], MIN_PIXELS, MAX_PIXELS) if item["image_path"].exists() else None
        prompt = None
        if image is not None:
            prompt = (
                f"<|im_start|>system\n{system_prompt}<|im_end|>\n<|im_start|>user\n"
                f"<|vision_start|><|image_pad|><|vision_end|>{item['question']}<|im_end|>\n<|im_start|>assistant\n"
            )
        sent.append(Sent(str(item["id"]), prompt, image))
    return sent


# ----------------------------------------------------------------------------------------------------------------------
# Fixtures
# ----------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def release_system_prompt() -> str:
    """The string run_eval.sh hands to eval/main.py, as bash evaluates it."""
    bash = shutil.which("bash")
    if bash is None:  # the same string, read by hand: a newline and a space after "final answer."
        return ("You FIRST think about the reasoning process as an internal monologue and then provide the final "
                "answer.\n The reasoning process MUST BE enclosed within <think> </think> tags. The final answer MUST "
                "BE put in \\boxed{}.")  # fmt: skip
    script = RUN_EVAL_SH_SYSTEM_PROMPT + '\nprintf %s "$SYSTEM_PROMPT"'
    return subprocess.run([bash, "-c", script], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def data_dirs(tmp_path_factory) -> dict[str, Path]:
    """Both layouts of every benchmark, written once: {"release": dir, "hub": dir}."""
    root = tmp_path_factory.mktemp("release_prompts")
    for bench, write in WRITERS.items():
        write(root / "release" / RELEASE_FOLDERS[bench], "release")
        write(root / "hub" / HUB_FOLDERS[bench], "hub")
    return {"release": root / "release", "hub": root / "hub"}


@pytest.fixture(scope="module")
def processor(tiny_model_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_model_dir)  # Qwen2.5-VL's real chat template


# ----------------------------------------------------------------------------------------------------------------------
# The comparison
# ----------------------------------------------------------------------------------------------------------------------


def missing_keys(bench: str) -> set[str]:
    """The release's ids of the rows whose image file is absent: not written in the Hub layout."""
    ids = {
        "geometry3k": [str(r[0]) for r in GEOMETRY3K if r[4] == MISSING],
        "wemath": [f"{r[0]}@{r[1]}" for r in WEMATH if r[5] == MISSING],
        "mathvista": [r[0] for r in MATHVISTA if r[5] == MISSING],
        "mathverse": [r[0] for r in MATHVERSE if r[3] == MISSING],
        "mathvision": [str(r[0]) for r in MATHVISION if r[2] == MISSING],
        "hallusionbench": [f"{r[2]}_{r[3]}_{r[4]}" for r in HALLUSIONBENCH if r[8] == MISSING],
    }
    return set(ids[bench])


def difference(expected: str, actual: str) -> str:
    at = next((k for k, (a, b) in enumerate(zip(expected, actual)) if a != b), min(len(expected), len(actual)))
    start = max(0, at - 30)
    return f"from char {at}:\n    release: {expected[start : at + 60]!r}\n    ours:    {actual[start : at + 60]!r}"


@pytest.mark.parametrize("layout", ["release", "hub"])
@pytest.mark.parametrize("bench", BENCHMARKS)
def test_prompt_and_pixels_are_the_releases(bench, layout, data_dirs, processor, release_system_prompt):
    # run_eval.sh's system prompt is the one we send
    assert EVAL_SYSTEM_PROMPT == release_system_prompt

    reference = release_prepare(RELEASE_LOADERS[bench](data_dirs["release"]), release_system_prompt)
    if layout == "hub":  # the same rows; a missing file has no Hub counterpart
        reference = [ref for ref in reference if ref.key not in missing_keys(bench)]
    sent = [ref for ref in reference if ref.prompt is not None]
    skipped = [ref for ref in reference if ref.prompt is None]
    assert (len(sent), len(skipped)) == EXPECTED_COUNTS[bench][layout]  # the rows compared below

    examples = get_benchmark(bench).load_examples(data_dirs[layout])
    if bench == "hallusionbench":
        # Ids differ by design (ours name the category); both keep the file's order of the rows with a figure
        assert len(examples) == len(reference), [e.id for e in examples]
        ours = {ref.key: example for ref, example in zip(reference, examples)}
    else:
        ours = {example.id: example for example in examples}

    problems, identical, recorded = [], 0, 0
    for ref in reference:
        example = ours.pop(ref.key, None)
        if example is None:
            problems.append(f"{ref.key}: not loaded ({'the release sends it' if ref.prompt else 'nor recorded'})")
            continue
        try:
            text, images, error = _prepare(example, processor, ARGS)
        except Exception as err:
            problems.append(f"{ref.key}: _prepare raised {type(err).__name__}: {err}")
            continue
        if ref.prompt is None:  # the release skips it: ours records an error, sends nothing
            if error is None:
                problems.append(f"{ref.key}: the release skips it (image missing or unreadable), ours sends it")
            else:
                recorded += 1
            continue
        if error is not None:
            problems.append(f"{ref.key}: the release sends it, ours records {error!r}")
            continue
        row_problems = []
        if text != ref.prompt:
            row_problems.append(f"{ref.key}: prompt differs {difference(ref.prompt, text)}")
        if len(images) != 1:
            row_problems.append(f"{ref.key}: {len(images)} images, the release sends one")
        else:
            image = images[0]
            if (image.mode, image.size) != (ref.image.mode, ref.image.size):
                row_problems.append(f"{ref.key}: image {image.mode} {image.size}, release {ref.image.mode} "
                                    f"{ref.image.size}")  # fmt: skip
            elif not np.array_equal(np.asarray(image), np.asarray(ref.image)):
                row_problems.append(f"{ref.key}: image pixels differ from the release's")
        problems += row_problems
        identical += not row_problems

    # Rows ours loads and the release never does: only geometry3k's folder without its image (load_geo3k_dataset
    # leaves it out), and then only as a recorded error, never a prompt
    for key, example in ours.items():
        release_never_loads = bench == "geometry3k" and layout == "release" and key in missing_keys(bench)
        if not release_never_loads:
            problems.append(f"{key}: ours loads a row the release never loads")
        elif _prepare(example, processor, ARGS)[2] is None:
            problems.append(f"{key}: the release never loads it (no img_diagram.png), ours sends it")

    print(f"{bench} {layout}: {identical}/{len(sent)} rows identical, {recorded}/{len(skipped)} rows the release "
          f"skips recorded as errors")  # fmt: skip
    assert not problems, f"{bench} {layout}:\n" + "\n".join(problems)
    assert (identical, recorded) == (len(sent), len(skipped))
