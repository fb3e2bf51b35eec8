"""Rows `vepo-trl eval` cannot evaluate, and a grader that fails mid-run: recorded per row with the reason while the run
goes on, counted as the release counts them under `--protocol paper` (left out: its prepare_prompts skips them) and
wrong under the other protocols; completions are never lost to a grading failure."""

import json

import pytest
from PIL import Image

from vepo_trl.cli import main as cli_main
from vepo_trl.eval.run import generate_rows, release_image

from .support import FAST, SECRET, FakeOpenAI, lines


pytestmark = pytest.mark.usefixtures("model_card_left_as_it_was")


@pytest.mark.parametrize("size", [(20, 4000), (2, 400), (4000, 20), (10, 2000)])
def test_an_aspect_ratio_of_exactly_200_is_refused_on_the_resized_image(size):
    # Exactly 200 passes the processor's own check, but the release's truncating resize makes it 36x7240 (201.1):
    # the check before the resize let these through and the processor then ended the run
    assert max(size) / min(size) == 200
    with pytest.raises(ValueError, match=r"after the release's resize, over 200"):
        release_image(Image.new("RGB", size), 262144, 1000000)
    assert release_image(Image.new("RGB", (40, 4000)), 262144, 1000000).size == (51, 5120)  # ratio 100: kept


class _Generator:
    """Refuses (as a processor does) any batch holding a prompt with "bad" in it."""

    def __init__(self, error=ValueError):
        self.error, self.calls = error, []

    def generate(self, texts, images):
        self.calls.append(list(texts))
        if any("bad" in text for text in texts):
            raise self.error("2 image tokens, 1 image")
        return [text.upper() for text in texts]


def test_a_row_the_processor_refuses_is_recorded_and_the_batch_goes_on():
    generator = _Generator()
    rows = generate_rows(generator, ["a", "bad", "c"], [[], [], []])
    assert rows == [("A", None), ("", "processor error: ValueError: 2 image tokens, 1 image"), ("C", None)]
    assert generator.calls == [["a", "bad", "c"], ["a"], ["bad"], ["c"]]
    assert generate_rows(generator, ["bad"], [[]]) == [("", "processor error: ValueError: 2 image tokens, 1 image")]
    # Every row refused: not the rows' fault (a wrong model or processor), raised as it is
    with pytest.raises(ValueError, match="2 image tokens"):
        generate_rows(_Generator(), ["bad 1", "bad 2"], [[], []])
    # Out of memory or a device fault is no row's fault either: never recorded as a row error
    with pytest.raises(RuntimeError):
        generate_rows(_Generator(RuntimeError), ["a", "bad"], [[], []])
    assert generate_rows(generator, [], []) == []


def _hallusion_folder(root):
    """The official HallusionBench.json layout with five rows: a normal one, one whose text holds `<image>` (plain
    text, as in the release), one holding the model's own image token (the processor refuses it), a 20x4000 image and
    a missing image file."""
    folder = root / "hallubench"
    (folder / "images").mkdir(parents=True)
    questions = [
        ("Is the circle red?", (64, 48)),
        ("Is the <image> tag shown?", (64, 48)),
        ("Is <|image_pad|> a token?", (64, 48)),
        ("Is the strip tall?", (20, 4000)),
        ("Is the file there?", None),
    ]
    rows = []
    for k, (question, size) in enumerate(questions):
        filename = f"./{k}.png"
        if size is not None:
            Image.new("RGB", size, (40 * k, 90, 200)).save(folder / "images" / f"{k}.png")
        rows.append({"category": "VD", "subcategory": "illusion", "visual_input": "1", "set_id": "0", "figure_id": "0",
                     "question_id": str(k), "question": question, "gt_answer": "1", "filename": filename})  # fmt: skip
    (folder / "HallusionBench.json").write_text(json.dumps(rows))
    return root


def test_rows_that_cannot_be_evaluated_are_recorded_and_the_run_goes_on(tiny_model_dir, tmp_path, capsys):
    data = _hallusion_folder(tmp_path / "data")
    out = tmp_path / "out"
    cli_main(["eval", "--model", tiny_model_dir, "--data_dir", str(data), "--output_dir", str(out),
              "--benchmarks", "hallusionbench", *FAST])  # fmt: skip
    records = {r["id"].rsplit("/", 1)[1]: r for r in lines(out / "hallusionbench.jsonl")}
    assert sorted(records) == ["0", "1", "2", "3", "4"]
    # `<image>` in a question is text: sent after the one image, as the release sends it
    assert "<|vision_end|>Is the <image> tag shown? You final answer" in records["1"]["prompt"]
    assert "error" not in records["0"] and "error" not in records["1"]
    assert records["2"]["error"].startswith("processor error: ValueError: ")
    assert "<|image_pad|> tokens" in records["2"]["error"]
    assert "after the release's resize, over 200" in records["3"]["error"]
    assert records["4"]["error"].startswith("unusable image: ")
    # The paper protocol counts them as the release does: left out (its prepare_prompts skips them)
    bench = json.loads((out / "summary.json").read_text())["benchmarks"]["hallusionbench"]
    assert bench["examples"] == 5 and bench["unusable"] == 3 and bench["unusable_left_out"] == 3
    assert bench["by_protocol"]["paper"]["graded"] == 2
    assert (
        "3 rows that could not be evaluated (image or processor), left out, as the release skips them"
        in (out / "summary.md").read_text()
    )
    # Under the rule protocol they are wrong answers
    cli_main(["eval", "--rescore", str(out), "--protocol", "rule"])
    bench = json.loads((out / "summary.json").read_text())["benchmarks"]["hallusionbench"]
    assert bench["unusable_left_out"] == 0 and bench["by_protocol"]["rule"]["graded"] == 5
    assert "counted wrong" in (out / "summary.md").read_text()


def test_a_grader_that_fails_mid_run_keeps_every_completion_and_rescore_finishes(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    from vepo_trl.eval import grading
    from vepo_trl.eval.standins import write_standins

    data = write_standins(tmp_path / "data")
    server = FakeOpenAI()
    monkeypatch.setenv("VEPO_TEST_JUDGE_KEY", SECRET)
    out = tmp_path / "out"
    judge = ["--judge_base_url", server.base_url, "--judge_api_key_env", "VEPO_TEST_JUDGE_KEY"]
    original = grading.paper_grade

    def broken(*args, **kwargs):  # not a JudgeCallError: whatever a judge or a grader bug raises
        raise KeyError("choices")

    monkeypatch.setattr(grading, "paper_grade", broken)
    try:
        with pytest.raises(SystemExit) as stopped:
            cli_main(["eval", "--model", tiny_model_dir, "--data_dir", str(data), "--output_dir", str(out),
                      "--benchmarks", "wemath", *judge, *FAST])  # fmt: skip
        assert stopped.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("vepo-trl eval: error: grading stopped (KeyError: 'choices'); every completion is")
        assert f"--rescore {out} --protocol paper" in err[-1]
        records = lines(out / "wemath.jsonl")
        assert len(records) == 5 and all(r["completion"] and "paper" not in r.get("verdicts", {}) for r in records)
        # The grader fixed: --rescore grades them without the model
        monkeypatch.setattr(grading, "paper_grade", original)
        server.respond = lambda prompt: "OK" if prompt == "Reply with OK." else "Z"
        cli_main(["eval", "--rescore", str(out), *judge])
        assert all(r["verdicts"]["paper"]["correct"] is not None for r in lines(out / "wemath.jsonl"))
    finally:
        server.close()
