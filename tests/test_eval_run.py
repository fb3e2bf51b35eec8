"""`vepo-trl eval` end to end on the tiny model and the stand-ins: records, the Table-1 summary, resume, refusals,
one-line usage errors before any model loads, and the judge path against a local server."""

import json

import pytest

from tests.support import overridden
from vepo_trl.cli import main as cli_main
from vepo_trl.eval import generate as generate_module
from vepo_trl.eval.benchmarks import PAPER_BENCHMARKS
from vepo_trl.eval.standins import write_standins

from .support import FAST, SECRET, FakeOpenAI, lines


STANDIN_SIZES = {"geometry3k": 4, "mmk12": 3, "hallusionbench": 4, "mathvista": 2, "wemath": 5, "mathverse": 3,
                 "mathvision": 2}  # fmt: skip


pytestmark = pytest.mark.usefixtures("model_card_left_as_it_was")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(write_standins(tmp_path_factory.mktemp("standins")))


def count_generated(monkeypatch):
    calls = []
    original = generate_module.TransformersGenerator.generate

    def counting(self, texts, images):
        calls.extend(texts)
        return original(self, texts, images)

    monkeypatch.setattr(generate_module.TransformersGenerator, "generate", counting)
    return calls


def test_all_seven_then_resume_then_refuse(tiny_model_dir, data_dir, tmp_path, monkeypatch, capsys,
                                           standins_as_full_splits):  # fmt: skip
    out = tmp_path / "results"
    args = ["eval", "--model", tiny_model_dir, "--data_dir", data_dir, "--output_dir", str(out), "--protocol", "rule",
            *FAST]  # fmt: skip
    generated = count_generated(monkeypatch)
    cli_main(args)
    assert len(generated) == sum(STANDIN_SIZES.values())
    for name, size in STANDIN_SIZES.items():
        records = lines(out / f"{name}.jsonl")
        assert len(records) == size, name
        record = records[0]
        assert {"id", "prompt", "images", "completion", "extracted", "gold", "rule_correct", "verdicts"} <= set(record)
        # The release's evaluation system prompt, newline included
        assert record["prompt"].startswith(
            "<|im_start|>system\nYou FIRST think about the reasoning process as an internal monologue and then "
            "provide the final answer.\n The reasoning process"
        )
        assert "<|image_pad|>" in record["prompt"] and record["prompt"].endswith("<|im_start|>assistant\n")
        assert record["verdicts"]["rule"]["correct"] is record["rule_correct"]
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["benchmarks"]) == list(PAPER_BENCHMARKS)
    row = summary["table"]["this_run"]
    expected = [summary["benchmarks"][name]["accuracy"] for name in PAPER_BENCHMARKS]
    assert row[:7] == expected and row[7] == pytest.approx(sum(expected) / 7, abs=0.01)
    assert summary["generation"]["max_new_tokens"] == 8 and summary["generation"]["decoding"] == "greedy"
    assert summary["generation"]["backend"] == "transformers" and summary["grading"]["protocol"] == "rule"
    assert {"aAcc", "qAcc (image rows)", "fAcc (image rows)"} <= set(
        summary["benchmarks"]["hallusionbench"]["metrics"]
    )
    assert set(summary["benchmarks"]["mathverse"]["categories"]["problem_version"]) == {
        "Text Dominant", "Text Lite", "Vision Only"}  # fmt: skip
    markdown = (out / "summary.md").read_text()
    assert (
        "| Model / Dataset | Geo3K | MMK12 | HalluBench | MathVista | We-Math | MathVerse | MathVision | Avg. |"
        in markdown
    )
    assert markdown in capsys.readouterr().out
    assert "paper:" not in markdown and "No paper rows: `--protocol rule`" in markdown

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
        cli_main(overridden(args, "--max_new_tokens", "16"))
    err = capsys.readouterr().err.strip()
    assert error.value.code == 2 and "\n" not in err
    # The refusal names the setting that differs, and nothing that does not
    assert "holds results of another protocol (generation.max_new_tokens: 8 -> 16)" in err and "--output_dir" in err
    with pytest.raises(SystemExit):
        cli_main([*args, "--dtype", "float32"])
    assert 'generation.dtype: "auto" -> "float32"' in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--benchmarks", "mathvista,foo"], "Unknown benchmark 'foo'. Valid names are: geometry3k"),
        (["--model", "no/such/model-folder"], "--model 'no/such/model-folder': no such model folder"),
        (["--model", "vepo-demo"], "Run `vepo-trl demo` first."),
        (["--model", "run1"], "--model 'run1': no such model folder"),  # a bare name: no Hub id is
        (["--data_dir", "NODIR"], "--data_dir NODIR: no such folder; must be a folder of benchmark copies"),
        (
            ["--data_dir", "EMPTY"],
            "mathverse: AI4Math/MathVerse is not in the local Hugging Face cache and the Hub is offline "
            "(HF_HUB_OFFLINE); --data_dir EMPTY has no mathverse/ folder",
        ),
        (["--limit", "0"], "--limit 0: must be a whole number >= 1"),
        (["--tensor_parallel_size", "0"], "--tensor_parallel_size 0: must be a whole number of GPUs >= 1"),
        (["--rescore", "EMPTY"], "--rescore grades stored completions"),
        (
            ["--data_dir", "STANDINS", "--judge_api_key_env", "NO_SUCH_KEY_VAR"],
            "--protocol paper judges mathverse: The judge needs an API key in $NO_SUCH_KEY_VAR",
        ),
        (  # the paper protocol's judge is not there: said before any model loads
            ["--data_dir", "STANDINS", "--judge_api_key_env", "PATH", "--judge_base_url", "http://127.0.0.1:9/v1"],
            "--protocol paper judges mathverse with gpt-4o-mini, but http://127.0.0.1:9/v1 did not answer "
            "(connection error",
        ),
    ],
)
def test_usage_errors_are_one_line_before_the_model(
    argv, message, tiny_model_dir, data_dir, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(generate_module, "load_model_and_processor", lambda *a, **k: pytest.fail("model loaded"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "EMPTY").mkdir()
    argv = [data_dir if arg == "STANDINS" else arg for arg in argv]
    with pytest.raises(SystemExit) as error:
        cli_main(overridden(["eval", "--model", tiny_model_dir, "--benchmarks", "mathverse"], *argv))
    err = capsys.readouterr().err.strip()
    assert error.value.code == 2 and err.startswith("vepo-trl eval: error: ") and "\n" not in err
    assert message in err


def test_a_python_caller_gets_the_rules_that_join_the_options(tmp_path):
    """The rules that moved into validation.COMBINATIONS hold for `run(args)` from Python too, not only as the CLI
    parses: no model and nothing to rescore is refused in one line, not an AttributeError."""
    from vepo_trl.commands.eval import make_parser
    from vepo_trl.errors import UsageError
    from vepo_trl.eval.run import run

    args = make_parser().parse_args(["--model", "tiny-qwen2.5-vl", "--output_dir", str(tmp_path / "e")])
    args.model = None
    with pytest.raises(UsageError, match=r"--model is required \(or --rescore DIR"):
        run(args)


def test_lenient_judge_path_and_never_writes_the_key(tiny_model_dir, data_dir, tmp_path, monkeypatch,
                                                    standins_as_full_splits):  # fmt: skip
    server = FakeOpenAI()
    server.default = "echo"  # right iff the completion boxes the reference letter: never, for the random model
    server.script = ["OK", "500"]  # the reachability check, then the first grading call fails once and is retried
    monkeypatch.setenv("VEPO_TEST_JUDGE_KEY", SECRET)
    out = tmp_path / "judged"
    try:
        cli_main(["eval", "--model", tiny_model_dir, "--data_dir", data_dir, "--output_dir", str(out),
                  "--benchmarks", "wemath,hallusionbench", "--protocol", "lenient",
                  "--judge_base_url", server.base_url, "--judge_api_key_env", "VEPO_TEST_JUDGE_KEY",
                  "--judge_workers", "1", *FAST])  # fmt: skip
    finally:
        server.close()
    # We-Math (judged in the paper) went to the judge: the check, 5 rows + 1 retry; HallusionBench did not
    assert len(server.requests) == 7 and all(r["auth"] == f"Bearer {SECRET}" for r in server.requests)
    wemath = lines(out / "wemath.jsonl")
    assert all(
        r["verdicts"]["lenient"]["correct"] is False and "error" not in r["verdicts"]["lenient"] for r in wemath
    )
    assert all(r["verdicts"]["lenient"]["grader"]["judge"] is None for r in lines(out / "hallusionbench.jsonl"))
    summary = json.loads((out / "summary.json").read_text())["benchmarks"]
    assert summary["wemath"]["scored_by"] == "judge (gpt-4o-mini)" and summary["wemath"]["accuracy"] == 0.0
    assert summary["hallusionbench"]["scored_by"] == "rule" and summary["wemath"]["complete"]
    for path in out.iterdir():
        assert SECRET not in path.read_text(), path


def test_paper_run_retries_failed_judge_calls_on_resume_then_rescores(tiny_model_dir, data_dir, tmp_path, monkeypatch,
                                                                       capsys, standins_as_full_splits):  # fmt: skip
    server = FakeOpenAI()
    server.respond = lambda prompt: "OK" if prompt == "Reply with OK." else "500"  # the judge fails every grading call
    monkeypatch.setenv("VEPO_TEST_JUDGE_KEY", SECRET)
    out = tmp_path / "paper"
    judge = ["--judge_base_url", server.base_url, "--judge_api_key_env", "VEPO_TEST_JUDGE_KEY",
             "--judge_max_retries", "0", "--judge_workers", "2"]  # fmt: skip
    args = ["eval", "--model", tiny_model_dir, "--data_dir", data_dir, "--output_dir", str(out),
            "--benchmarks", "mathvista,wemath,hallusionbench", *judge, *FAST]  # fmt: skip
    generated = count_generated(monkeypatch)
    try:
        cli_main(args)  # --protocol paper is the default
        assert len(generated) == 2 + 5 + 4
        summary = json.loads((out / "summary.json").read_text())
        wemath = summary["benchmarks"]["wemath"]
        assert wemath["unjudged"] == 5 and wemath["judge_errors"] == 5 and not wemath["complete"]
        assert summary["table"]["this_run"][4] is None  # no number for a benchmark the judge has not graded
        assert all(r["verdicts"]["paper"]["error"] == "HTTP 500" for r in lines(out / "wemath.jsonl"))
        # HallusionBench needs no judge under the paper protocol: graded, complete
        assert summary["benchmarks"]["hallusionbench"]["complete"]
        assert summary["benchmarks"]["hallusionbench"]["scored_by"] == "exact yes/no"
        markdown = capsys.readouterr().out
        assert "INCOMPLETE: 5 rows not graded (5 judge errors" in markdown and "| paper: + VEPO |" not in markdown

        # The judge is back: a rerun generates nothing and grades exactly the failed rows
        server.requests.clear()
        server.respond = lambda prompt: "OK" if prompt == "Reply with OK." else "Z"  # an extraction never matching
        generated.clear()
        cli_main(args)
        summary = json.loads((out / "summary.json").read_text())
        assert generated == [] and len(server.requests) == 1 + 2 + 5  # the check, MathVista's 2, We-Math's 5
        assert all(b["complete"] and b["accuracy"] is not None for b in summary["benchmarks"].values())
        assert summary["benchmarks"]["wemath"]["accuracy"] == 0.0
        # The official secondary metrics, on the paper verdicts: 2steps_7 is the stand-ins' one whole problem, all
        # wrong (IK); MathVista's "Z" is no number and, nearest option "circle", not the gold "square"
        official = summary["benchmarks"]["wemath"]["official"]
        assert official["protocol"] == "paper" and official["problems"] == 1 and official["counts"]["IK"] == 1
        assert official["scores"] == {"Score (strict)": 0.0, "Score (loose)": 0.0}
        assert summary["benchmarks"]["mathvista"]["official"]["accuracy"] == 0.0
        assert "**We-Math four-dimensional**" in capsys.readouterr().out

        # Rescore under the rule protocol: no model, no judge; both protocols' numbers are reported
        monkeypatch.setattr(generate_module, "load_model_and_processor", lambda *a, **k: pytest.fail("model loaded"))
        server.requests.clear()
        cli_main(["eval", "--rescore", str(out), "--protocol", "rule"])
        summary = json.loads((out / "summary.json").read_text())
        assert server.requests == [] and summary["grading"]["protocol"] == "rule"
        for bench in summary["benchmarks"].values():
            assert set(bench["by_protocol"]) == {"paper", "rule"} and bench["complete"]
        assert all(set(r["verdicts"]) == {"paper", "rule"} for r in lines(out / "wemath.jsonl"))
        markdown = (out / "summary.md").read_text()
        assert "| We-Math | 5 / 5 | 0.00 | rule | 0.00 | – | 0.00 |" in markdown
        # --rescore reports the official secondary metrics too, on the rule verdicts now
        assert summary["benchmarks"]["wemath"]["official"]["protocol"] == "rule"
        assert summary["benchmarks"]["mathvista"]["official"]["examples"] == 2
        assert "**MathVista official score**" in markdown and "on the `rule` verdicts" in markdown
        assert "No paper rows" in markdown
    finally:
        server.close()


def test_limit_run_is_partial_everywhere(tiny_model_dir, data_dir, tmp_path, capsys):
    out = tmp_path / "limited"
    cli_main(["eval", "--model", tiny_model_dir, "--data_dir", data_dir, "--output_dir", str(out),
              "--benchmarks", "geometry3k,hallusionbench", "--limit", "2", "--paper_model",
              "Qwen2.5-VL-7B-Instruct", *FAST])  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    # Geometry3K and HallusionBench need no judge under the paper protocol
    assert all(b["partial"] and b["limit"] == 2 and not b["complete"] for b in summary["benchmarks"].values())
    assert summary["table"]["this_run"][-1] is None
    markdown = capsys.readouterr().out
    assert "| **this run** (partial: --limit 2) |" in markdown and "PARTIAL: a --limit 2 run" in markdown
    assert "| Geo3K | 2 / 2 | 0.00 | mathruler |" in markdown and "partial (--limit 2)" in markdown


def test_tensor_parallel_default_divides_the_heads():
    from vepo_trl.eval.run import UsageError, tensor_parallel_size

    # Qwen2.5-VL-7B: 28 attention heads, 4 KV heads, 16 vision heads; 3B: 16, 2, 16
    assert tensor_parallel_size(None, [28, 16], 4, 8) == 4
    assert tensor_parallel_size(None, [16, 16], 2, 8) == 8
    assert tensor_parallel_size(None, [28, 16], 4, 0) == 1
    assert tensor_parallel_size(2, [28, 16], 4, 8) == 2
    with pytest.raises(UsageError, match="does not divide the model's attention heads"):
        tensor_parallel_size(7, [28, 16], 4, 8)
    with pytest.raises(UsageError, match="8 GPU"):
        tensor_parallel_size(16, [16, 16], 2, 8)


def test_missing_local_copy_without_network_fails_fast(tiny_model_dir, tmp_path, monkeypatch, capsys):
    import time

    from vepo_trl.eval import benchmarks

    # Not marked offline, but the Hub cannot be reached: one line at once, not a minute of retries
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(benchmarks, "_HUB_REACHABLE", {})
    (tmp_path / "local").mkdir()
    start = time.perf_counter()
    with pytest.raises(SystemExit) as error:
        cli_main(["eval", "--model", tiny_model_dir, "--benchmarks", "mathvista", "--data_dir",
                  str(tmp_path / "local"), "--protocol", "rule"])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert error.value.code == 2 and "\n" not in err and time.perf_counter() - start < 10
    assert "AI4Math/MathVista is not in the local Hugging Face cache and the Hub is unreachable" in err
    assert "has no mathvista/ folder" in err


def test_a_retrained_model_in_the_same_place_is_not_reported_with_the_old_answers(tiny_model_dir, data_dir, tmp_path,
                                                                                  capsys):  # fmt: skip
    """Eval folders are keyed by the weights' content: the same path with other weights is refused in one line (it
    used to reuse `eval-<folder>` and report the old model's answers without a word)."""
    import shutil

    from safetensors.torch import load_file, save_file

    model = tmp_path / "my-model"
    shutil.copytree(tiny_model_dir, model)
    out = tmp_path / "results"
    args = ["eval", "--model", str(model), "--data_dir", data_dir, "--output_dir", str(out), "--protocol", "rule",
            "--benchmarks", "geometry3k", "--limit", "2", *FAST]  # fmt: skip
    cli_main(args)
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["model_weights"]) == 16
    cli_main(args)  # the same weights: the folder is resumed as before
    capsys.readouterr()
    # Retrained in place: same folder name, other weights
    weights = load_file(str(model / "model.safetensors"))
    save_file({name: tensor + 0.01 if tensor.is_floating_point() else tensor for name, tensor in weights.items()},
              str(model / "model.safetensors"))  # fmt: skip
    records_before = (out / "geometry3k.jsonl").read_text()
    with pytest.raises(SystemExit) as error:
        cli_main(args)
    assert error.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "weights changed" in err[0] and manifest["model_weights"] in err[0]
    assert (out / "geometry3k.jsonl").read_text() == records_before


def test_reporting_names_only_what_ran(tiny_model_dir, data_dir, tmp_path, capsys, monkeypatch):
    """A synthetic run names no judge it never called; `--rescore --benchmarks X` prints X (the folder's summary.md
    keeps every benchmark); an offline run names every benchmark it cannot load in its one line."""
    out = tmp_path / "results"
    cli_main(
        ["eval", "--model", tiny_model_dir, "--benchmarks", "synthetic", "--output_dir", str(tmp_path / "syn"), *FAST]
    )
    grading = json.loads((tmp_path / "syn" / "summary.json").read_text())["grading"]
    assert grading["protocol"] == "paper" and grading["judge_model"] is None
    assert "judge none" in (tmp_path / "syn" / "summary.md").read_text()

    cli_main(["eval", "--model", tiny_model_dir, "--data_dir", data_dir, "--benchmarks", "geometry3k,hallusionbench",
              "--protocol", "rule", "--output_dir", str(out), *FAST])  # fmt: skip
    capsys.readouterr()
    cli_main(["eval", "--rescore", str(out), "--protocol", "rule", "--benchmarks", "geometry3k"])
    printed = capsys.readouterr().out
    assert "Only geometry3k shown" in printed and "\n| HalluBench | " not in printed and "\n| Geo3K | " in printed
    assert "\n| HalluBench | " in (out / "summary.md").read_text()

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = None
    try:
        cli_main(["eval", "--model", tiny_model_dir, "--benchmarks", "geometry3k,mathvista,wemath"])
    except SystemExit as exit_info:
        code = exit_info.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "3 benchmarks cannot load (geometry3k, mathvista, wemath)" in err[0]
