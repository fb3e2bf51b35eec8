"""Small local stand-ins of the seven benchmarks, in their real schemas, for tests and offline trials.

`write_standins(root)` writes `root/<benchmark>/...` in the layout `vepo-trl eval --data_dir root` reads: the Hub's
parquet files (column names and types, ids kept as strings, a list of images or a single image, letter or text
answers as on the Hub), with rows quoted in the project's benchmark notes where there are any. Images are small
drawings made with PIL. `layout="noisyrollout"` writes NoisyRollout's `eval_data` files instead where that layout
differs (Geometry3K's raw InterGPS folders, MathVerse / We-Math JSON, the official HallusionBench.json).

    python -c "from vepo_trl.eval.standins import write_standins; write_standins('standins')"
    vepo-trl eval --model vepo-demo --data_dir standins
"""

from __future__ import annotations

import json
from pathlib import Path

import datasets
from PIL import Image, ImageDraw


__all__ = ["write_standins"]

_SIZE = (84, 84)


def _image(seed: int) -> Image.Image:
    colours = [(220, 40, 40), (40, 160, 60), (40, 90, 220), (240, 150, 20)]
    image = Image.new("RGB", _SIZE, (255, 255, 255))
    draw = ImageDraw.Draw(image)
    draw.ellipse((10, 10, 40 + 5 * (seed % 5), 40 + 5 * (seed % 5)), fill=colours[seed % 4])
    draw.rectangle((50, 50, 78, 78), outline=colours[(seed + 1) % 4], width=3)
    return image


def _write(dataset: datasets.Dataset, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    dataset.to_parquet(str(path))


S = datasets.Value("string")


def _geometry3k(root: Path, layout: str) -> None:
    rows = [
        ("<image>Find x.", "3", ["3", "5", "7", "9"], "A"),
        (
            "<image>If $\\overline{B E} \\cong \\overline{E D}$ and $m \\widehat{E D}=120,$ find $m \\widehat{B E}$",
            "120",
            ["60", "120", "180", "240"],
            "B",
        ),  # fmt: skip
        (
            "<image>Find the area of the circle. Round to the nearest tenth.",
            "12 \\pi",
            ["6 \\pi", "12 \\pi", "24", "36"],
            "B",
        ),
        ("<image>Find y.", "2 \\sqrt { 221 }", ["2 \\sqrt { 221 }", "17", "30", "40"], "A"),
    ]
    if layout == "noisyrollout":
        for index, (problem, _, choices, letter) in enumerate(rows):
            folder = root / "geometry3k" / "test" / str(2401 + index)
            folder.mkdir(parents=True, exist_ok=True)
            _image(index).save(folder / "img_diagram.png")
            item = {
                "id": 2401 + index,
                "annotat_text": problem.removeprefix("<image>"),
                "choices": choices,
                "answer": letter,
            }
            (folder / "data.json").write_text(json.dumps(item))
        return
    features = datasets.Features(
        {
            "images": datasets.List(datasets.Image()),
            "problem": S,
            "answer": S,
            "id": datasets.Value("int64"),
            "choices": datasets.List(S),
            "ground_truth": S,
        }  # fmt: skip
    )
    data = {
        "images": [[_image(i)] for i in range(len(rows))],
        "problem": [r[0] for r in rows],
        "answer": [r[1] for r in rows],
        "id": list(range(len(rows))),
        "choices": [r[2] for r in rows],
        "ground_truth": [r[3] for r in rows],
    }
    _write(
        datasets.Dataset.from_dict(data, features=features),
        root / "geometry3k" / "data" / "test-00000-of-00001.parquet",
    )


def _mmk12(root: Path) -> None:
    features = datasets.Features({"id": S, "subject": S, "question": S, "answer": S, "image": datasets.Image()})
    data = {
        "id": [
            "5f0c2a7e-0b1d-4c39-9a57-1f6f7d0b8a11",
            "a3e1c9d2-6b7f-4e0a-8c15-2d9b4f6e7a30",
            "0d9c8b7a-1e2f-4a3b-9c8d-7e6f5a4b3c21",
        ],  # fmt: skip
        "subject": ["math", "physics", "biology"],
        "question": [
            "As shown in the figure, what is the measure of angle 1?\nA. 30°\nB. 45°\nC. 60°\nD. 90°",
            "The block in the figure is at rest. Which force balances gravity?\nA. friction\nB. the normal force\n"
            "C. tension\nD. none",
            "Which organelle is labelled X in the figure?\nA. nucleus\nB. mitochondrion\nC. ribosome\nD. vacuole",
        ],
        "answer": ["B", "B", "A"],
        "image": [_image(10), _image(11), _image(12)],
    }
    _write(
        datasets.Dataset.from_dict(data, features=features), root / "mmk12" / "data" / "test-00000-of-00001.parquet"
    )


MATHVERSE_QUERY_COT = (
    "Please first conduct reasoning, and then answer the question and provide the correct option letter, e.g., A, B, "
    "C, D, at the end.\nQuestion: As shown in the figure, in triangle ABC, it is known that angle A = 80.0, angle B = "
    "60.0, DE parallel BC, then the size of angle CED is ()\nChoices:\nA:40°\nB:60°\nC:120°\nD:140°"
)


def _mathverse(root: Path, layout: str) -> None:
    free_cot = (
        "Please first conduct reasoning, and then answer the question and provide the final value, e.g., 1, 2.5, 300, "
        "at the end.\nQuestion: According to the question shown in the image, find the length of AB."
    )
    rows = {
        "sample_index": ["1", "2", "5"],
        "problem_index": ["1", "1", "2"],
        "problem_version": ["Text Dominant", "Text Lite", "Vision Only"],
        "question": ["As shown in the figure, ... then the size of angle CED is ()"] * 2 + [""],
        "answer": ["D", "D", "5"],
        "question_type": ["multi-choice", "multi-choice", "free-form"],
        "metadata": [{"split": "testmini", "source": "GeoQA", "subject": "Plane Geometry", "subfield": "Angle"}] * 3,
        "query_wo": ["...", "...", "..."],
        "query_cot": [
            MATHVERSE_QUERY_COT,
            MATHVERSE_QUERY_COT.replace("it is known that angle A = 80.0, ", ""),
            free_cot,
        ],
        "question_for_eval": [
            "In triangle ABC, angle A = 80.0, angle B = 60.0, DE parallel BC; the size of angle CED is ()",
            "DE parallel BC; the size of angle CED is ()",
            "Find the length of AB.",
        ],
    }
    folder = root / "mathverse"
    if layout == "noisyrollout":
        (folder / "images").mkdir(parents=True, exist_ok=True)
        items = []
        for k in range(3):
            _image(20 + k).save(folder / "images" / f"{k}.png")
            items.append({**{key: values[k] for key, values in rows.items()}, "image": f"{k}.png"})
        (folder / "testmini.json").write_text(json.dumps(items))
        return
    features = datasets.Features(
        {
            **{key: S for key in rows if key != "metadata"},
            "image": datasets.Image(),
            "metadata": {"split": S, "source": S, "subject": S, "subfield": S},
        }  # fmt: skip
    )
    data = {**rows, "image": [_image(20 + k) for k in range(3)]}
    _write(
        datasets.Dataset.from_dict(data, features=features), folder / "testmini" / "testmini-00000-of-00001.parquet"
    )


def _mathvision(root: Path) -> None:
    features = datasets.Features(
        {
            "id": S,
            "question": S,
            "options": datasets.List(S),
            "image": S,
            "decoded_image": datasets.Image(),
            "answer": S,
            "solution": S,
            "level": datasets.Value("int64"),
            "subject": S,
        }  # fmt: skip
    )
    data = {
        "id": ["4", "39"],
        "question": [
            "How many different digits can you find in this picture?\n<image1>",
            "Ingrid has 4 red, 3 blue, 2 green and 1 yellow cube. Which colour is the cube with the question mark?\n"
            "<image1>",
        ],
        "options": [[], ["red", "blue", "green", "Yellow", "This cannot be worked out for certain."]],
        "image": ["images/4.jpg", "images/39.jpg"],
        "decoded_image": [_image(30), _image(31)],
        "answer": ["6", "A"],
        "solution": ["", ""],
        "level": [1, 3],
        "subject": ["counting", "logic"],
    }
    _write(
        datasets.Dataset.from_dict(data, features=features),
        root / "mathvision" / "data" / "test-00000-of-00001.parquet",
    )


MATHVISTA_QUERY_1 = (
    "Hint: Please answer the question requiring a floating-point number with one decimal place and provide the final "
    "value, e.g., 1.2, 1.3, 1.4, at the end.\nQuestion: When a spring does work on an object, we cannot find the work "
    "by simply multiplying the spring force by the object's displacement. ... What is the spring constant in N/cm?"
)


def _mathvista(root: Path) -> None:
    metadata = {name: S for name in ("category", "context", "grade", "language", "source", "split", "task")}
    metadata.update(img_height=datasets.Value("int64"), img_width=datasets.Value("int64"), skills=datasets.List(S))
    features = datasets.Features(
        {
            "pid": S,
            "question": S,
            "image": S,
            "decoded_image": datasets.Image(),
            "choices": datasets.List(S),
            "unit": S,
            "precision": datasets.Value("float64"),
            "answer": S,
            "question_type": S,
            "answer_type": S,
            "metadata": metadata,
            "query": S,
        }  # fmt: skip
    )

    def meta(task):
        return {"category": "math-targeted-vqa", "context": "scientific figure", "grade": "college", "language": "english",
                "source": "SciBench", "split": "testmini", "task": task, "img_height": 84, "img_width": 84,
                "skills": ["scientific reasoning"]}  # fmt: skip

    data = {
        "pid": ["1", "2"],
        "question": ["What is the spring constant in N/cm?", "Which shape is larger?"],
        "image": ["images/1.jpg", "images/2.jpg"],
        "decoded_image": [_image(40), _image(41)],
        "choices": [None, ["circle", "square"]],
        "unit": [None, None],
        "precision": [1.0, None],
        "answer": ["1.2", "square"],
        "question_type": ["free_form", "multi_choice"],
        "answer_type": ["float", "text"],
        "metadata": [meta("textbook question answering"), meta("figure question answering")],
        "query": [
            MATHVISTA_QUERY_1,
            "Hint: Please answer the question and provide the correct option letter, e.g., A, B, C, D, at the end.\n"
            "Question: Which shape is larger?\nChoices:\n(A) circle\n(B) square",
        ],
    }
    _write(
        datasets.Dataset.from_dict(data, features=features),
        root / "mathvista" / "data" / "testmini-00000-of-00001.parquet",
    )


WEMATH_ROW = {
    "ID": "3steps_165", "split": "testmini", "knowledge concept": "Area of Circles",
    "question": "As shown in the figure, there is a circular flower bed... what is the area of the flower bed (  ) m²?(π = 3.14)",
    "option": "A. 200.96;B. 3215.36;C. 6280;D. 32; E. No correct answer", "answer": "B",
    "image_path": "3steps/image/165-3.png", "key": "3steps_3", "question number": 1575,
    "knowledge concept description": "The area of a circle is pi times the radius squared.",
}  # fmt: skip


def _wemath(root: Path, layout: str) -> None:
    rows = [
        WEMATH_ROW,
        {**WEMATH_ROW, "key": "3steps_multi", "question number": 1576, "answer": "A",
         "option": "A. 200.96;B. 3215.36;C. 6280;D. 32;E. No correct answer", "image_path": "3steps/image/165-m.png"},
        {**WEMATH_ROW, "ID": "2steps_7", "key": "2steps_multi", "question number": 21, "answer": "C",
         "option": "A. 1;B. 2;C. 3;D. 4", "image_path": "2steps/image/7-m.png"},
        # 2steps_7's two one-step sub-problems: a whole problem for the four-dimensional metric
        {**WEMATH_ROW, "ID": "2steps_7", "key": "2steps_1", "question number": 19, "answer": "A",
         "option": "A. 1;B. 2;C. 3;D. 4", "image_path": "2steps/image/7-1.png"},
        {**WEMATH_ROW, "ID": "2steps_7", "key": "2steps_2", "question number": 20, "answer": "D",
         "option": "A. 1;B. 2;C. 3;D. 4", "image_path": "2steps/image/7-2.png"},
    ]  # fmt: skip
    folder = root / "wemath"
    if layout == "noisyrollout":
        for k, row in enumerate(rows):
            (folder / "images" / row["image_path"]).parent.mkdir(parents=True, exist_ok=True)
            _image(50 + k).save(folder / "images" / row["image_path"])
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "testmini.json").write_text(json.dumps(rows, ensure_ascii=False))
        return
    features = datasets.Features(
        {**{key: S for key in WEMATH_ROW}, "image_path": datasets.Image(), "question number": datasets.Value("int64")}
    )
    data = {key: [row[key] for row in rows] for key in WEMATH_ROW}
    data["image_path"] = [_image(50 + k) for k in range(len(rows))]
    _write(datasets.Dataset.from_dict(data, features=features), folder / "data" / "testmini-00000-of-00001.parquet")


def _hallusion_rows() -> list[dict]:
    def row(category, sub, set_id, figure_id, question_id, question, gt, visual="1"):
        filename = None if visual == "0" else f"./hallusion_bench/{category}/{sub}/{set_id}_{figure_id}.png"
        return {
            "category": category, "subcategory": sub, "visual_input": visual, "set_id": set_id,
            "figure_id": figure_id, "sample_note": "circle", "question_id": question_id, "question": question,
            "gt_answer_details": "", "gt_answer": gt, "filename": filename,
        }  # fmt: skip

    same = "Is the right orange circle the same size as the left orange circle?"
    larger = "Is the right orange circle larger than the left orange circle?"
    return [
        row("VD", "illusion", "0", "0", "0", same, "1"),
        row("VD", "illusion", "0", "0", "1", larger, "0"),
        row("VD", "illusion", "0", "1", "0", same, "0"),
        row("VD", "illusion", "0", "1", "1", larger, "1"),
        row("VS", "chart", "3", "0", "0", "Is the tallest bar blue?", "1", visual="0"),
    ]


def _hallusionbench(root: Path, layout: str) -> None:
    rows = _hallusion_rows()
    folder = root / "hallusionbench"
    if layout == "noisyrollout":
        folder = root / "hallubench"
        for k, row in enumerate(rows):
            if row["filename"]:
                path = folder / "images" / row["filename"].removeprefix("./")
                path.parent.mkdir(parents=True, exist_ok=True)
                _image(60 + k).save(path)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "HallusionBench.json").write_text(json.dumps(rows))
        return
    features = datasets.Features({**{key: S for key in rows[0]}, "image": datasets.Image()})
    for split, keep in (("image", True), ("non_image", False)):
        part = [row for row in rows if bool(row["filename"]) == keep]
        data = {key: [row[key] for row in part] for key in rows[0]}
        data["image"] = [_image(60 + k) if keep else None for k in range(len(part))]
        _write(
            datasets.Dataset.from_dict(data, features=features), folder / "data" / f"{split}-00000-of-00001.parquet"
        )


def write_standins(root: str | Path, layout: str = "hub") -> Path:
    """Write the seven stand-ins under `root` (`layout`: "hub" parquet, or "noisyrollout" eval_data where it
    differs); returns `root`."""
    if layout not in ("hub", "noisyrollout"):
        raise ValueError(f"layout must be 'hub' or 'noisyrollout', got {layout!r}")
    root = Path(root)
    _geometry3k(root, layout)
    _mmk12(root)
    _mathverse(root, layout)
    _mathvision(root)
    _mathvista(root)
    _wemath(root, layout)
    _hallusionbench(root, layout)
    return root
