"""`vepo-trl eval` end to end on the tiny model and the stand-ins: records, the Table-1 summary, resume, refusals,
one-line usage errors before any model loads, and the judge path against a local server."""

import json

import pytest

from tests.test_eval_judge import SECRET, FakeOpenAI
from vepo_trl.cli import main as cli_main
from vepo_trl.eval import generate as generate_module
from vepo_trl.eval.benchmarks import PAPER_BENCHMARKS
from vepo_trl.eval.standins import write_standins


# Small images and few tokens: the tiny random model only has to run the pipeline
FAST = ["--max_new_tokens", "8", "--min_pixels", "3136", "--max_pixels", "50176", "--batch_size", "4"]
STANDIN_SIZES = {"geometry3k": 4, "mmk12": 3, "hallusionbench": 4, "mathvista": 2, "wemath": 3, "mathverse": 3,
                 "mathvision": 2}  # fmt: skip


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(write_standins(tmp_path_factory.mktemp("standins")))


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def count_generated(monkeypatch):
    calls = []
    original = generate_module.TransformersGenerator.generate

    def counting(self, texts, images):
        calls.extend(texts)
        return original(self, texts, images)

    monkeypatch.setattr(generate_module.TransformersGenerator, "generate", counting)
    return calls


def test_all_seven_then_resume_then_refuse(tiny_model_dir, data_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "results"
    args = ["eval", "--model", tiny_model_dir, "--data_dir", data_dir, "--output_dir", str(out), *FAST]
    generated = count_generated(monkeypatch)
    cli_main(args)
    assert len(generated) == sum(STANDIN_SIZES.values())
    for name, size in STANDIN_SIZES.items():
        records = lines(out / f"{name}.jsonl")
        assert len(records) == size, name
        record = records[0]
        assert {"id", "prompt", "images", "completion", "extracted", "gold", "rule_correct", "correct"} <= set(record)
        assert (
            record["prompt"].startswith("<|im_start|>system\nYou FIRST think") and "<|image_pad|>" in record["prompt"]
        )
        assert record["prompt"].endswith("<|im_start|>assistant\n") and record["scored_by"] == "rule"
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["benchmarks"]) == list(PAPER_BENCHMARKS)
    row = summary["table"]["this_run"]
    expected = [summary["benchmarks"][name]["accuracy"] for name in PAPER_BENCHMARKS]
    assert row[:7] == expected and row[7] == pytest.approx(sum(expected) / 7, abs=0.01)
    assert summary["protocol"]["max_new_tokens"] == 8 and summary["protocol"]["decoding"] == "greedy"
    assert {"aAcc", "qAcc", "fAcc"} <= set(summary["benchmarks"]["hallusionbench"])
    assert set(summary["benchmarks"]["mathverse"]["categories"]["problem_version"]) == {
        "Text Dominant", "Text Lite", "Vision Only"}  # fmt: skip
    markdown = (out / "summary.md").read_text()
    assert (
        "| Model / Dataset | Geo3K | MMK12 | HalluBench | MathVista | We-Math | MathVerse | MathVision | Avg. |"
        in markdown
    )
    assert markdown in capsys.readouterr().out

    # Interrupted: the last two MathVista records are lost and a third is half written
    path = out / "mathvista.jsonl"
    kept = path.read_text().splitlines()[:0]
    path.write_text("".join(line + "\n" for line in kept) + '{"id": "2", "benchm')
    generated.clear()
    cli_main(args)
    assert len(generated) == 2  # only MathVista's two, nothing else again
    assert [r["id"] for r in lines(path)] == ["1", "2"]
    capsys.readouterr()

    # Another protocol into the same folder is refused, before any model loads
    monkeypatch.setattr(generate_module, "load_model_and_processor", lambda *a, **k: pytest.fail("model loaded"))
    with pytest.raises(SystemExit) as error:
        cli_main([*args, "--max_new_tokens", "16"])
    err = capsys.readouterr().err.strip()
    assert error.value.code == 2 and "\n" not in err
    assert "holds results of another protocol" in err and "--output_dir" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--benchmarks", "mathvista,foo"], "Unknown benchmark 'foo'. Valid names are: geometry3k"),
        (["--model", "no/such/model-folder"], "--model no/such/model-folder: no such folder"),
        (["--model", "vepo-demo"], "Run `vepo-trl demo` first."),
        (["--data_dir", "NODIR"], "--data_dir NODIR: no such folder."),
        (
            ["--data_dir", "EMPTY"],
            "mathverse: AI4Math/MathVerse is not in the local Hugging Face cache and the Hub is offline; --data_dir",
        ),
        (["--limit", "0"], "--limit must be at least 1"),
        (
            ["--benchmarks", "synthetic", "--judge_model", "gpt-4o-mini", "--judge_api_key_env", "NO_SUCH_KEY_VAR"],
            "needs an API key in $NO_SUCH_KEY_VAR",
        ),
    ],
)
def test_usage_errors_are_one_line_before_the_model(argv, message, tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(generate_module, "load_model_and_processor", lambda *a, **k: pytest.fail("model loaded"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "EMPTY").mkdir()
    with pytest.raises(SystemExit) as error:
        cli_main(["eval", "--model", tiny_model_dir, "--benchmarks", "mathverse", *argv])
    err = capsys.readouterr().err.strip()
    assert error.value.code == 2 and err.startswith("vepo-trl eval: error: ") and "\n" not in err
    assert message in err


def test_judge_path_keeps_both_verdicts_and_never_writes_the_key(tiny_model_dir, data_dir, tmp_path, monkeypatch):
    server = FakeOpenAI()
    server.default = "echo"  # right iff the completion boxes the reference letter: never, for the random model
    server.script = ["500"]  # the first call fails once and is retried
    monkeypatch.setenv("VEPO_TEST_JUDGE_KEY", SECRET)
    out = tmp_path / "judged"
    try:
        cli_main(["eval", "--model", tiny_model_dir, "--data_dir", data_dir, "--output_dir", str(out),
                  "--benchmarks", "wemath,hallusionbench", "--judge_model", "gpt-4o-mini",
                  "--judge_base_url", server.base_url, "--judge_api_key_env", "VEPO_TEST_JUDGE_KEY",
                  "--judge_workers", "1", *FAST])  # fmt: skip
    finally:
        server.close()
    # We-Math (judged in the paper) went to the judge, 3 rows + 1 retry; HallusionBench (rule in the paper) did not
    assert len(server.requests) == 4 and all(r["auth"] == f"Bearer {SECRET}" for r in server.requests)
    wemath = lines(out / "wemath.jsonl")
    assert all(r["scored_by"] == "judge" and r["judge_correct"] is False and r["judge_error"] is None for r in wemath)
    assert all("judge_correct" not in r for r in lines(out / "hallusionbench.jsonl"))
    summary = json.loads((out / "summary.json").read_text())["benchmarks"]
    # Both graders say wrong for every row (the random model never boxes a letter): agreement 100%
    assert summary["wemath"]["scored_by"] == "judge" and summary["wemath"]["judge_agreement"] == 100.0
    assert summary["wemath"]["judge_accuracy"] == 0.0 and summary["hallusionbench"]["scored_by"] == "rule"
    for path in out.iterdir():
        assert SECRET not in path.read_text(), path
