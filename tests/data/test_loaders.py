"""Tests for the data loaders, on small local stand-ins that mirror the schemas of the real Hub data sets."""

import io
import json
import logging
import math
import re

import datasets
import numpy as np
import pytest
from PIL import Image, ImageDraw
from trl.data_utils import is_conversational, prepare_multimodal_messages

from vepo_trl.data import loaders
from vepo_trl.data.loaders import (
    DEFAULT_MAX_PIXELS,
    DEFAULT_MIN_PIXELS,
    SYSTEM_PROMPT,
    UnusableRowError,
    load_vepo_dataset,
    prepare_image,
    to_conversational,
)


# Qwen2.5-VL's chat template (as shipped with Qwen/Qwen2.5-VL-7B-Instruct).
QWEN25_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
VISION = "<|vision_start|><|image_pad|><|vision_end|>"
OUTPUT_COLUMNS = ["prompt", "images", "answer", "source", "id"]


# ----------------------------------------------------------------------------------------------------------------------
# Synthetic images
# ----------------------------------------------------------------------------------------------------------------------


def drawing(size, mode="RGB"):
    """A small diagram-like image: white background, a dark rectangle in the top-left quarter."""
    image = Image.new("RGB", size, (255, 255, 255))
    ImageDraw.Draw(image).rectangle([0, 0, size[0] // 2, size[1] // 2], fill=(20, 40, 200))
    return image.convert(mode)


def encoded(image, fmt="PNG"):
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def entry(image, fmt="PNG"):
    """An image as the Hub parquet files store it (datasets' Image feature, undecoded)."""
    return {"bytes": encoded(image, fmt), "path": None}


def rgba_half_transparent(size=(300, 200)):
    image = Image.new("RGBA", size, (255, 0, 0, 255))
    ImageDraw.Draw(image).rectangle([0, 0, size[0] // 2, size[1]], fill=(255, 0, 0, 0))
    return image


def palette_with_transparency(size=(256, 256)):
    image = Image.new("P", size, 0)
    image.putpalette([0, 0, 0, 0, 200, 0] + [0] * (256 * 3 - 6))
    ImageDraw.Draw(image).rectangle([size[0] // 2, 0, size[0], size[1]], fill=1)
    image.info["transparency"] = 0
    return image


def sixteen_bit_gradient(size=(320, 240)):
    row = np.linspace(0, 65535, size[0]).astype(np.uint16)
    return Image.fromarray(np.tile(row, (size[1], 1)))


# ----------------------------------------------------------------------------------------------------------------------
# Stand-ins of the Hub data sets, written in the Hub's parquet layout (data/{split}-00000-of-00001.parquet)
# ----------------------------------------------------------------------------------------------------------------------

GEOMETRY3K_FEATURES = datasets.Features(
    {
        "images": datasets.List(datasets.Image()),
        "problem": datasets.Value("string"),
        "answer": datasets.Value("string"),
        "id": datasets.Value("int64"),
        "choices": datasets.List(datasets.Value("string")),
        "ground_truth": datasets.Value("string"),
    }
)
K12_FEATURES = datasets.Features(
    {
        "images": datasets.List(datasets.Image()),
        "problem": datasets.Value("string"),
        "answer": datasets.Value("string"),
    }
)
MMK12_FEATURES = datasets.Features(
    {
        "id": datasets.Value("string"),
        "subject": datasets.Value("string"),
        "image": datasets.Image(),
        "question": datasets.Value("string"),
        "answer": datasets.Value("string"),
    }
)

# (images, problem, answer) of the Geometry3K train stand-in; six rows are unusable.
GEOMETRY3K_TRAIN = [
    ([entry(drawing((120, 90)))], "<image>Find x.", "3"),  # 0: tiny, upsized
    ([entry(drawing((2400, 1800)))], "In the figure <image> find the area.", "12"),  # 1: huge, placeholder mid-text
    (
        [entry(rgba_half_transparent((300, 200))), entry(palette_with_transparency((180, 360)))],
        "Compare <image> and <image>. Which is larger?",
        "A",
    ),  # 2: two placeholders, RGBA + P
    ([entry(drawing((400, 300), "L"))], "<image>Find y.", "5"),  # 3
    ([{"bytes": b"definitely not an image", "path": None}], "<image>Find z.", "1"),  # 4: corrupt bytes
    ([], "<image>Find w.", "2"),  # 5: no image
    ([entry(drawing((300, 300)))], "<image>Find v.", "  "),  # 6: empty answer
    ([entry(palette_with_transparency())], "<image>Find u.", "7"),  # 7: P with transparency
    ([entry(drawing((320, 240), "CMYK"), "JPEG")], "<image>Find t.", "8"),  # 8: CMYK JPEG
    ([entry(sixteen_bit_gradient())], "<image>Find s.", "9"),  # 9: I;16
    ([entry(drawing((256, 256), "1"))], "<image>Find r.", "10"),  # 10: bilevel
    ([entry(drawing((256, 256), "LA"))], "<image>Find q.", "11"),  # 11: LA
    ([entry(drawing((1000, 4)))], "<image>Find p.", "12"),  # 12: aspect ratio 250:1
    ([{"bytes": encoded(drawing((300, 300)))[:120], "path": None}], "<image>Find o.", "13"),  # 13: truncated
    ([entry(drawing((3, 3)))], "<image>Find n.", "14"),  # 14: too small
]
GEOMETRY3K_TRAIN_KEPT = 9
GEOMETRY3K_TRAIN_DROPS = {
    "unreadable image": 2,
    "no image": 1,
    "empty answer": 1,
    "extreme aspect ratio": 1,
    "image too small": 1,
}


def geometry3k_split(rows):
    return datasets.Dataset.from_dict(
        {
            "images": [images for images, _, _ in rows],
            "problem": [problem for _, problem, _ in rows],
            "answer": [answer for _, _, answer in rows],
            "id": list(range(len(rows))),
            "choices": [["1", "2", "3", "4"]] * len(rows),
            "ground_truth": ["A"] * len(rows),
        },
        features=GEOMETRY3K_FEATURES,
    )


def k12_split(num_rows, with_missing_problem=False):
    rows = {
        "images": [[entry(drawing((200 + 20 * i, 150)))] for i in range(num_rows)],
        "problem": [f"<image>As shown, compute the value {i}." for i in range(num_rows)],
        "answer": [f"{i + 1}" for i in range(num_rows)],
    }
    if with_missing_problem:
        rows["images"].append([entry(drawing((200, 200)))])
        rows["problem"].append(None)
        rows["answer"].append("4")
    return datasets.Dataset.from_dict(rows, features=K12_FEATURES)


def mmk12_split(num_rows, with_bad_rows=False):
    rows = {
        "id": [f"mmk12-{i}" for i in range(num_rows)],
        "subject": ["math"] * num_rows,
        "image": [entry(drawing((640, 480))) for _ in range(num_rows)],
        "question": [f"What is the length of segment AB? ({i})" for i in range(num_rows)],
        "answer": ["B"] * num_rows,
    }
    if with_bad_rows:
        for column, values in {
            "id": ["mmk12-noimage", "mmk12-noanswer"],
            "subject": ["physics", "physics"],
            "image": [None, entry(drawing((640, 480)))],
            "question": ["Which force is larger?", "Which force is larger?"],
            "answer": ["A", ""],
        }.items():
            rows[column].extend(values)
    return datasets.Dataset.from_dict(rows, features=MMK12_FEATURES)


def write_hub_layout(root, splits):
    (root / "data").mkdir(parents=True)
    for split, dataset in splits.items():
        dataset.to_parquet(str(root / "data" / f"{split}-00000-of-00001.parquet"))
    return str(root)


@pytest.fixture(scope="module")
def standins(tmp_path_factory):
    """Local copies of the three Hub data sets, keyed by their Hub id."""
    root = tmp_path_factory.mktemp("hub")
    return {
        "hiyouga/geometry3k": write_hub_layout(
            root / "geometry3k",
            {
                "train": geometry3k_split(GEOMETRY3K_TRAIN),
                "validation": geometry3k_split(GEOMETRY3K_TRAIN[:2]),
                "test": geometry3k_split(GEOMETRY3K_TRAIN[:3]),
            },
        ),
        "xyliu6/k12-freeform": write_hub_layout(
            root / "k12",
            {"train": k12_split(6), "mini_train": k12_split(4, with_missing_problem=True), "test": k12_split(3)},
        ),
        "FanqingM/MMK12": write_hub_layout(
            root / "mmk12", {"train": mmk12_split(3, with_bad_rows=True), "test": mmk12_split(2)}
        ),
    }


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    """No network, and every cache inside the test's directory."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")


@pytest.fixture
def hub(standins, tmp_path, monkeypatch):
    """Redirect `datasets.load_dataset` from the Hub ids to the stand-ins; returns the (path, split) calls."""
    calls = []
    load_dataset = datasets.load_dataset

    def redirected(path, *args, **kwargs):
        calls.append((path, kwargs.get("split")))
        kwargs.setdefault("cache_dir", str(tmp_path / "hf_cache"))
        return load_dataset(standins.get(path, path), *args, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", redirected)
    return calls


def user_content(row):
    assert [message["role"] for message in row["prompt"]] == ["system", "user"]
    return row["prompt"][1]["content"]


def part_types(row):
    return [part["type"] for part in user_content(row)]


def assert_image_ok(image, min_pixels=DEFAULT_MIN_PIXELS, max_pixels=DEFAULT_MAX_PIXELS):
    assert isinstance(image, Image.Image)
    assert image.mode == "RGB"
    width, height = image.size
    assert width % 28 == 0 and height % 28 == 0
    assert min_pixels <= width * height <= max_pixels


# ----------------------------------------------------------------------------------------------------------------------
# Tests
# ----------------------------------------------------------------------------------------------------------------------


def test_system_prompt_text():
    assert SYSTEM_PROMPT == (
        "You FIRST think about the reasoning process as an internal monologue and then provide the final answer. "
        "The reasoning process MUST BE enclosed within <think> </think> tags. The final answer MUST BE put in "
        "\\boxed{}."
    )
    assert "\\boxed{}" in SYSTEM_PROMPT and "\\\\boxed" not in SYSTEM_PROMPT


def test_geometry3k_conversion_and_drop_log(hub, caplog):
    caplog.set_level(logging.WARNING, logger=loaders.__name__)
    dataset = load_vepo_dataset("geometry3k")

    assert hub == [("hiyouga/geometry3k", "train")]
    # The release's extra columns stay beside the output ones (TRL hands them to the reward functions)
    assert dataset.column_names == [*OUTPUT_COLUMNS, "choices", "ground_truth"]
    assert dataset[0]["choices"] == ["1", "2", "3", "4"]
    assert isinstance(dataset.features["images"], datasets.List)
    assert isinstance(dataset.features["images"].feature, datasets.Image)
    assert len(dataset) == GEOMETRY3K_TRAIN_KEPT
    kept_ids = [f"geometry3k/train/{i}" for i in (0, 1, 2, 3, 7, 8, 9, 10, 11)]
    assert dataset["id"] == kept_ids
    assert set(dataset["source"]) == {"geometry3k"}
    assert dataset["answer"] == ["3", "12", "A", "5", "7", "8", "9", "10", "11"]

    for row in dataset:
        assert is_conversational(row)
        assert row["prompt"][0] == {"role": "system", "content": [{"type": "text", "text": SYSTEM_PROMPT}]}
        assert part_types(row).count("image") == len(row["images"]) >= 1
        for image in row["images"]:
            assert_image_ok(image)

    [message] = [record.getMessage() for record in caplog.records if "dropped" in record.getMessage()]
    assert "dropped 6 of 15 rows from geometry3k/train" in message
    for reason, count in GEOMETRY3K_TRAIN_DROPS.items():
        assert f"{count} {reason}" in message


def test_image_parts_follow_placeholders(hub):
    dataset = load_vepo_dataset("geometry3k")
    tiny, huge, pair = dataset[0], dataset[1], dataset[2]

    assert user_content(tiny) == [{"type": "image", "text": None}, {"type": "text", "text": "Find x."}]
    # Placeholder in the middle: text, image, text, with the surrounding text kept verbatim.
    assert user_content(huge) == [
        {"type": "text", "text": "In the figure "},
        {"type": "image", "text": None},
        {"type": "text", "text": " find the area."},
    ]
    assert part_types(pair) == ["text", "image", "text", "image", "text"]
    assert [part["text"] for part in user_content(pair) if part["type"] == "text"] == [
        "Compare ",
        " and ",
        ". Which is larger?",
    ]
    # Images stay in order: the landscape RGBA first, the portrait palette image second.
    first, second = pair["images"]
    assert first.width > first.height and second.height > second.width


def test_resize_bounds_and_aspect_ratio(hub):
    dataset = load_vepo_dataset("geometry3k")
    tiny, huge = dataset[0]["images"][0], dataset[1]["images"][0]
    assert tiny.width * tiny.height >= DEFAULT_MIN_PIXELS  # 120x90 upsized
    assert huge.width * huge.height <= DEFAULT_MAX_PIXELS  # 2400x1800 downsized
    for image in (tiny, huge):
        assert image.width / image.height == pytest.approx(4 / 3, rel=0.06)

    small = load_vepo_dataset("geometry3k", min_pixels=28 * 28 * 4, max_pixels=200_000)
    for row in small:
        for image in row["images"]:
            assert_image_ok(image, min_pixels=28 * 28 * 4, max_pixels=200_000)

    with pytest.raises(ValueError, match="min_pixels"):
        load_vepo_dataset("geometry3k", min_pixels=2_000_000, max_pixels=1_000_000)


@pytest.mark.parametrize(
    ("image", "expected_corner"),
    [
        (drawing((64, 48), "L"), None),
        (drawing((64, 48), "LA"), None),
        (drawing((64, 48), "P"), None),
        (drawing((64, 48), "1"), None),
        (drawing((64, 48), "CMYK"), None),
        (rgba_half_transparent(), (255, 255, 255)),  # transparent left half composited on white
        (palette_with_transparency(), (255, 255, 255)),  # palette index 0 is transparent
    ],
    ids=["L", "LA", "P", "1", "CMYK", "RGBA", "P-transparency"],
)
def test_prepare_image_modes(image, expected_corner):
    for value in (image, encoded(image, "JPEG" if image.mode == "CMYK" else "PNG")):
        result = prepare_image(value)
        assert_image_ok(result)
        if expected_corner is not None:
            assert result.getpixel((2, 2)) == expected_corner


def test_prepare_image_sixteen_bit_keeps_contrast():
    result = prepare_image(encoded(sixteen_bit_gradient()))
    assert_image_ok(result)
    gray = np.asarray(result.convert("L"), dtype=np.float64)
    # Pillow's plain conversion would clip almost every pixel to white.
    assert gray[:, :10].mean() < 30 and gray[:, -10:].mean() > 225


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"\x89PNG\r\n\x1a\n garbage", "unreadable image"),
        ({"bytes": None, "path": None}, "unreadable image"),
        (drawing((2, 300)), "image too small"),
        (drawing((2000, 5)), "extreme aspect ratio"),
    ],
    ids=["corrupt", "empty-entry", "too-small", "aspect-ratio"],
)
def test_prepare_image_rejects(value, reason):
    with pytest.raises(UnusableRowError) as error:
        prepare_image(value)
    assert error.value.reason == reason


def test_strict_mode_names_the_row(hub):
    with pytest.raises(ValueError, match=r"geometry3k/train row 4: unreadable image: .*\(6 of 15 rows unusable"):
        load_vepo_dataset("geometry3k", strict=True)
    assert len(load_vepo_dataset("geometry3k", "validation", strict=True)) == 2


def test_num_proc_gives_the_same_rows(hub):
    single = load_vepo_dataset("geometry3k")
    parallel = load_vepo_dataset("geometry3k", num_proc=2)
    assert list(parallel["id"]) == list(single["id"])
    assert [image.size for row in parallel for image in row["images"]] == [
        image.size for row in single for image in row["images"]
    ]


def test_hub_ids_and_splits(hub):
    assert len(load_vepo_dataset("hiyouga/geometry3k", "test")) == 3
    assert len(load_vepo_dataset("xyliu6/k12-freeform", "test")) == 3
    assert len(load_vepo_dataset("K12", "train")) == 6
    assert hub == [("hiyouga/geometry3k", "test"), ("xyliu6/k12-freeform", "test"), ("xyliu6/k12-freeform", "train")]


def test_k12_missing_problem_dropped(hub, caplog):
    caplog.set_level(logging.WARNING, logger=loaders.__name__)
    dataset = load_vepo_dataset("k12", "mini_train")
    assert len(dataset) == 4
    assert dataset.column_names == OUTPUT_COLUMNS
    assert part_types(dataset[0]) == ["image", "text"]
    assert any("dropped 1 of 5 rows from k12/mini_train: 1 missing problem" in r.getMessage() for r in caplog.records)


def test_mmk12_single_image_without_placeholder(hub, caplog):
    caplog.set_level(logging.WARNING, logger=loaders.__name__)
    dataset = load_vepo_dataset("FanqingM/MMK12")
    assert hub == [("FanqingM/MMK12", "train")]
    assert len(dataset) == 3
    assert dataset["id"] == ["mmk12/train/mmk12-0", "mmk12/train/mmk12-1", "mmk12/train/mmk12-2"]
    row = dataset[0]
    # No <image> in the question: the image part comes first.
    assert user_content(row) == [
        {"type": "image", "text": None},
        {"type": "text", "text": "What is the length of segment AB? (0)"},
    ]
    assert len(row["images"]) == 1
    assert_image_ok(row["images"][0])
    message = next(r.getMessage() for r in caplog.records if "dropped" in r.getMessage())
    assert "dropped 2 of 5 rows from mmk12/train" in message
    assert "1 no image" in message and "1 empty answer" in message


def test_paper_mix(hub):
    mix = load_vepo_dataset("paper_mix", seed=3)
    assert hub == [("hiyouga/geometry3k", "train"), ("xyliu6/k12-freeform", "mini_train")]
    geometry3k = load_vepo_dataset("geometry3k")
    k12 = load_vepo_dataset("k12", "mini_train")
    assert len(mix) == len(geometry3k) + len(k12) == 13
    unshuffled = list(geometry3k["id"]) + list(k12["id"])
    assert sorted(mix["id"]) == sorted(unshuffled)
    assert mix.column_names == OUTPUT_COLUMNS
    # Shuffled, and deterministically so.
    assert list(mix["id"]) != unshuffled
    assert list(load_vepo_dataset("paper_mix", seed=3)["id"]) == list(mix["id"])
    with pytest.raises(ValueError, match="only has split 'train'"):
        load_vepo_dataset("paper_mix", "test")


def test_unknown_name():
    with pytest.raises(ValueError, match="unknown data set: 'geometry4k'") as error:
        load_vepo_dataset("geometry4k")
    for accepted in ("'geometry3k'", "'k12'", "'mmk12'", "'paper_mix'", "'hiyouga/geometry3k'", ".jsonl"):
        assert accepted in str(error.value)
    with pytest.raises(ValueError, match="no such file or directory"):
        load_vepo_dataset("does/not/exist.jsonl")


def test_local_jsonl_with_relative_paths(tmp_path, hub):
    (tmp_path / "imgs").mkdir()
    drawing((300, 200)).save(tmp_path / "imgs" / "a.png")
    drawing((200, 300), "P").save(tmp_path / "imgs" / "b.png")
    rows = [
        {"images": ["imgs/a.png"], "problem": "<image>Find x.", "answer": "1"},
        {"images": ["imgs/a.png", "imgs/b.png"], "problem": "Left <image> right <image>", "answer": "2"},
        {"images": ["imgs/missing.png"], "problem": "<image>Find y.", "answer": "3"},
    ]
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in rows))

    dataset = load_vepo_dataset(str(path))
    assert dataset["id"] == ["mine/train/0", "mine/train/1"]
    assert part_types(dataset[1]) == ["text", "image", "text", "image"]
    assert [image.width > image.height for image in dataset[1]["images"]] == [True, False]

    parquet = tmp_path / "mine.parquet"
    datasets.Dataset.from_list(rows[:2]).to_parquet(str(parquet))
    assert len(load_vepo_dataset(str(parquet), "test")) == 2

    with pytest.raises(ValueError, match=r"mine\.jsonl row 2: unreadable image"):
        load_vepo_dataset(str(path), strict=True)


def test_image_folder(tmp_path, hub):
    folder = tmp_path / "folder"
    folder.mkdir()
    drawing((300, 200)).save(folder / "a.png")
    rgba_half_transparent().save(folder / "b.png")
    (folder / "broken.png").write_bytes(b"not a png")
    metadata = [
        {"file_name": "a.png", "problem": "<image>Find x.", "answer": "1"},
        {"file_name": "b.png", "problem": "Which colour is it?", "answer": "red"},
        {"file_name": "broken.png", "problem": "<image>Find y.", "answer": "3"},
    ]
    (folder / "metadata.jsonl").write_text("\n".join(json.dumps(row) for row in metadata))

    dataset = load_vepo_dataset(str(folder))
    assert dataset.column_names == OUTPUT_COLUMNS
    assert sorted(dataset["answer"]) == ["1", "red"]
    for row in dataset:
        assert part_types(row)[0] == "image"
        assert_image_ok(row["images"][0])


def test_image_folder_with_several_images_per_row(tmp_path, hub):
    folder = tmp_path / "multi" / "test"
    folder.mkdir(parents=True)
    drawing((300, 200)).save(folder / "wide.png")
    drawing((200, 300)).save(folder / "tall.png")
    row = {"file_names": ["wide.png", "tall.png"], "problem": "<image> vs <image>", "answer": "wide"}
    (folder / "metadata.jsonl").write_text(json.dumps(row))

    [converted] = load_vepo_dataset(str(tmp_path / "multi"), "test")
    assert part_types(converted) == ["image", "text", "image"]
    assert [image.width > image.height for image in converted["images"]] == [True, False]


def test_local_directories(tmp_path, hub, standins):
    # A downloaded snapshot in the Hub layout, and a data set saved with save_to_disk.
    assert len(load_vepo_dataset(standins["FanqingM/MMK12"], "test")) == 2
    saved = tmp_path / "saved"
    k12_split(2).save_to_disk(str(saved))
    dataset = load_vepo_dataset(str(saved))
    assert list(dataset["id"]) == ["saved/train/0", "saved/train/1"]


def test_missing_image_column_is_a_clear_error(tmp_path, hub):
    path = tmp_path / "text_only.jsonl"
    path.write_text(json.dumps({"problem": "1+1?", "answer": "2", "picture": "a.png"}))
    with pytest.raises(ValueError, match=r"no image column found; columns present: \[.*'picture'.*accepted"):
        load_vepo_dataset(str(path))


def test_to_conversational_on_synthetic_rows(tmp_path):
    drawing((100, 100)).save(tmp_path / "c.png")
    row = {
        "images": [drawing((150, 100)), encoded(drawing((100, 150))), str(tmp_path / "c.png")],
        "problem": "A <image> B <image> C <image>",
        "answer": 42.0,
    }
    out = to_conversational(row)
    assert out["answer"] == "42"
    assert [part["type"] for part in out["prompt"][1]["content"]] == ["text", "image"] * 3
    assert len(out["images"]) == 3
    for image in out["images"]:
        assert_image_ok(image)

    with pytest.raises(UnusableRowError, match="placeholder"):
        to_conversational({**row, "images": row["images"][:2]})
    with pytest.raises(UnusableRowError, match="missing problem"):
        to_conversational({**row, "problem": None})
    with pytest.raises(ValueError, match="no column"):
        to_conversational(row, image_column="image")


def make_qwen25_vl_processor():
    """A Qwen2.5-VL processor built offline: the real image processor and a word-level stand-in tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
    )

    backend = Tokenizer(models.WordLevel(vocab={"[UNK]": 0}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[UNK]")
    special = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    tokenizer.add_special_tokens({"additional_special_tokens": special})
    return Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(),
        chat_template=QWEN25_VL_CHAT_TEMPLATE,
    )


def test_chat_template_places_image_tokens(hub):
    dataset = load_vepo_dataset("geometry3k")
    processor = make_qwen25_vl_processor()
    huge, pair = dataset[1], dataset[2]

    # What GRPOTrainer does with a row: fill the image parts from `images`, then apply the chat template.
    messages = prepare_multimodal_messages(pair["prompt"], images=pair["images"])
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n"
        f"<|im_start|>user\nCompare {VISION} and {VISION}. Which is larger?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    mid = processor.apply_chat_template(
        prepare_multimodal_messages(huge["prompt"], images=huge["images"]), tokenize=False
    )
    assert f"<|im_start|>user\nIn the figure {VISION} find the area.<|im_end|>" in mid

    batch = processor.apply_chat_template(
        [messages], tokenize=True, return_dict=True, add_generation_prompt=True, return_tensors="pt"
    )
    # The processor keeps our sizes (already multiples of 28 within its bounds) and the images' order.
    expected_grids = [[1, image.height // 14, image.width // 14] for image in pair["images"]]
    assert batch["image_grid_thw"].tolist() == expected_grids
    image_pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    num_image_tokens = int((batch["input_ids"][0] == image_pad).sum())
    assert num_image_tokens == sum(t * h * w for t, h, w in expected_grids) // 4

    with pytest.raises(ValueError, match="does not match"):
        prepare_multimodal_messages(pair["prompt"], images=pair["images"][:1])


# ----------------------------------------------------------------------------------------------------------------------
# Bad input: answers, empty or broken files, odd paths
# ----------------------------------------------------------------------------------------------------------------------


def one_row(tmp_path, answer, problem="<image>Find x."):
    drawing((300, 200)).save(tmp_path / "a.png")
    return {"images": [str(tmp_path / "a.png")], "problem": problem, "answer": answer}


@pytest.mark.parametrize("answer", [math.nan, np.float64("nan"), None, [], [None], "  "])
def test_missing_answers_make_the_row_unusable(tmp_path, answer):
    # A NaN answer used to become the text 'nan' and the row was kept
    with pytest.raises(UnusableRowError, match="empty answer"):
        to_conversational(one_row(tmp_path, answer))


@pytest.mark.parametrize(("answer", "text"), [(["4"], "4"), (4.0, "4"), (np.int64(7), "7"), ((" 2.5 ",), "2.5")])
def test_single_answers_in_any_container_become_text(tmp_path, answer, text):
    assert to_conversational(one_row(tmp_path, answer))["answer"] == text


def test_an_answer_list_is_rejected_with_the_row_named(tmp_path, hub, caplog):
    # ["4", "four"] used to be stored as the text "['4', 'four']", which no completion ever matched
    rows = [one_row(tmp_path, ["4", "four"]), one_row(tmp_path, ["5"])]
    path = tmp_path / "lists.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in rows))
    with pytest.raises(ValueError, match=r"lists\.jsonl row 0: answer is a list of several answers"):
        load_vepo_dataset(str(path), strict=True)
    with caplog.at_level(logging.WARNING):
        dataset = load_vepo_dataset(str(path))
    assert dataset["answer"] == ["5"]
    assert "1 answer is a list of several answers" in caplog.text and "first at row 0" in caplog.text


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.jsonl", "", "the file is empty: no rows"),  # was a bare StopIteration
        ("blank.jsonl", "\n\n", "the file is empty: no rows"),
        ("empty.json", "[]", "the file holds an empty JSON list: no rows"),
        ("broken.jsonl", '{"problem": "a", "answer": "1", "images": []}\n{"problem": \n', "line 2 is not valid JSON"),
        ("scalar.json", "3", "the file holds a JSON int, not rows"),
    ],
)
def test_unreadable_local_files_name_the_file_and_the_problem(tmp_path, hub, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ValueError, match=f"cannot read {re.escape(str(path))}: {message}"):
        load_vepo_dataset(str(path))


def test_zero_row_parquet_names_the_file(tmp_path, hub):
    path = tmp_path / "none.parquet"
    datasets.Dataset.from_dict({"problem": [], "answer": [], "images": []}).to_parquet(str(path))
    with pytest.raises(ValueError, match=f"cannot read {re.escape(str(path))}: the file has no rows"):
        load_vepo_dataset(str(path))


def test_a_path_with_brackets_is_a_path_not_a_pattern(tmp_path, hub):
    folder = tmp_path / "run[1]"
    folder.mkdir()
    row = one_row(folder, "3")
    path = folder / "data.jsonl"
    path.write_text(json.dumps(row))
    assert load_vepo_dataset(str(path))["answer"] == ["3"]


@pytest.mark.parametrize("placeholder", ["<Image>", "<IMAGE>", "<image>"])
def test_image_placeholder_in_any_case(tmp_path, placeholder):
    row = to_conversational(one_row(tmp_path, "3", problem=f"Look: {placeholder} Find x."))
    parts = row["prompt"][1]["content"]
    assert [part["type"] for part in parts] == ["text", "image", "text"]
    assert all(placeholder not in part.get("text", "") for part in parts)
