"""Sampled evaluation protocols beside greedy, intervals, paired comparisons, provenance and a judge paid once
(`vepo-trl eval --num_samples`, `--compare`; `vepo_trl.eval.stats`, `judge.JudgeCache`): hand-computed avg@k and
pass@k on a scripted model's samples, the bootstrap against scipy's and a plain loop, two stored folders compared,
an interrupted judged run rerun against a judge on 127.0.0.1 that counts what it is sent."""

import json
import shutil

import numpy as np
import pytest

from vepo_trl.cli import main as cli_main
from vepo_trl.commands.eval import main as eval_main
from vepo_trl.eval import generate as generate_module
from vepo_trl.eval.benchmarks import BENCHMARKS
from vepo_trl.eval.run import sample_seed
from vepo_trl.eval.standins import write_standins
from vepo_trl.eval.stats import avg_at_k, bootstrap_means, interval, paired_difference, pass_at_k

from .support import FAST, SECRET, FakeOpenAI, lines


pytestmark = pytest.mark.usefixtures("model_card_left_as_it_was")


def scripted(monkeypatch):
    """The generator answers question i's sample s rightly iff i is even and (i + s) % 3 == 0: each even question
    right in one of three samples, each odd one never (avg@3 = 1/6, pass@3 = 1/2). Samples come in order: every
    question's sample 0, then every question's sample 1, ... (the questions' texts repeat; their images differ)."""
    examples = BENCHMARKS["synthetic"].load_examples(None)
    drawn = []

    def generate(self, texts, images, seeds=None):
        out = []
        for seed in seeds:
            index, sample = len(drawn) % len(examples), len(drawn) // len(examples)
            drawn.append(seed)
            right = index % 2 == 0 and (index + sample) % 3 == 0
            out.append(f"\\boxed{{{examples[index].gold if right else 'no answer'}}}")
        return out

    monkeypatch.setattr(generate_module.TransformersGenerator, "generate", generate)
    return drawn


def test_sampled_protocol_reports_avg_and_pass_at_k_with_intervals_and_provenance(tiny_model_dir, tmp_path,
                                                                                    monkeypatch, capsys):  # fmt: skip
    seeds = scripted(monkeypatch)
    out = tmp_path / "sampled"
    cli_main(["eval", "--model", tiny_model_dir, "--benchmarks", "synthetic", "--num_samples", "3", "--temperature",
              "1.0", "--seed", "10", "--protocol", "rule", "--output_dir", str(out), *FAST])  # fmt: skip
    records = lines(out / "synthetic.jsonl")
    assert len(records) == 3 * 32 and sorted({r["sample"] for r in records}) == [0, 1, 2]
    # Each question's sample its own seed, from --seed, the benchmark, the question and the sample
    expected = [sample_seed(10, "synthetic", str(i), s) for s in range(3) for i in range(32)]
    assert seeds == expected and len(set(seeds)) == 96
    bench = json.loads((out / "summary.json").read_text())["benchmarks"]["synthetic"]
    # Hand-computed with seeds 10, 11, 12: even i is right at the one s with (i + 10 + s) % 3 == 0
    assert bench["num_samples"] == 3 and bench["examples"] == 32
    assert bench["avg_at_k"] == bench["accuracy"] == pytest.approx(100 / 6, abs=0.01)
    assert bench["pass_at_k"] == 50.0
    # Categories count questions, each its samples' mean
    assert sum(group["examples"] for group in bench["categories"]["kind"].values()) == 32
    low, high = bench["ci95"]
    assert low < bench["avg_at_k"] < high and high - low < 30
    origin = bench["provenance"]
    assert origin["seeds"]["seed"] == 10 and origin["judge"] is None
    assert origin["decoding"]["temperature"] == 1.0 and origin["decoding"]["num_samples"] == 3
    assert len(origin["data_sha256"]) == 64 and len(origin["prompt_template_sha256"]) == 64
    assert origin["generation_versions"]["transformers"] and origin["grading"]["versions"]["vepo_trl"]
    table = (out / "summary.md").read_text()
    assert "avg@3 16.67, pass@3 50.00 [" in table and "3 samples per question at temperature 1.0" in table
    # A folder holds one protocol: greedy into it is refused, naming what differs
    with pytest.raises(SystemExit):
        cli_main(["eval", "--model", tiny_model_dir, "--benchmarks", "synthetic", "--protocol", "rule",
                  "--output_dir", str(out), *FAST])  # fmt: skip
    assert "decoding" in capsys.readouterr().err


def test_greedy_samples_are_refused_in_one_line(tiny_model_dir, tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli_main(["eval", "--model", tiny_model_dir, "--benchmarks", "synthetic", "--num_samples", "4",
                  "--output_dir", str(tmp_path / "x")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--temperature > 0" in err[0]
    assert not (tmp_path / "x").exists()


def test_help_documents_the_sampled_protocol_and_the_comparison(capsys):
    with pytest.raises(SystemExit):
        cli_main(["eval", "--help"])
    text = capsys.readouterr().out
    for option in ("--num_samples", "--temperature", "--top_p", "--seed", "--compare"):
        assert option in text
    assert "avg@k" in text and "pass@k" in text


# ---------------------------------------------------------------------------------------------------------------------
# Statistics against references
# ---------------------------------------------------------------------------------------------------------------------


def test_avg_and_pass_at_k_by_hand():
    rows = [[True, False, False, False], [False, False, False, False], [True, True, True, True], [False, True]]
    assert avg_at_k(rows) == pytest.approx((0.25 + 0 + 1 + 0.5) / 4)
    assert pass_at_k(rows) == 0.75


def test_greedy_interval_equals_scipys_percentile_bootstrap():
    from scipy.stats import bootstrap

    verdicts = np.random.default_rng(3).random(400) < 0.58
    ours = interval(bootstrap_means([[bool(v)] for v in verdicts]))
    theirs = bootstrap((verdicts.astype(float),), np.mean, n_resamples=10_000, method="percentile", random_state=7)
    assert ours == pytest.approx(tuple(theirs.confidence_interval), abs=0.01)


def test_sampled_interval_equals_a_plain_two_level_bootstrap():
    """Questions drawn with replacement, then each drawn question's samples: a loop written out, other draws."""
    generator = np.random.default_rng(5)
    rows = [list(generator.random(4) < p) for p in generator.random(120)]
    draws = []
    reference = np.random.default_rng(11)
    for _ in range(4_000):
        picked = reference.integers(0, len(rows), len(rows))
        means = [np.mean([rows[i][j] for j in reference.integers(0, len(rows[i]), len(rows[i]))]) for i in picked]
        draws.append(np.mean(means))
    assert interval(bootstrap_means(rows)) == pytest.approx(interval(np.array(draws)), abs=0.012)
    # Wider than the row bootstrap of the per-question means alone: the samples' own noise counts
    low, high = interval(bootstrap_means(rows))
    plain = interval(bootstrap_means([[float(np.mean(row))] for row in rows]))
    assert high - low > plain[1] - plain[0]


def _folder(path, verdicts):
    """A results folder of the synthetic benchmark: `verdicts[id]` the rule verdicts of its samples."""
    path.mkdir()
    (path / "manifest.json").write_text(json.dumps({"generation": {"decoding": "greedy"}}))
    with open(path / "synthetic.jsonl", "w") as file:
        for qid, samples in verdicts.items():
            for sample, correct in enumerate(samples):
                file.write(json.dumps({"id": qid, "sample": sample, "benchmark": "synthetic",
                                       "verdicts": {"rule": {"correct": correct}}}) + "\n")  # fmt: skip
    return str(path)


def test_compare_two_stored_folders(tmp_path, capsys):
    a = _folder(tmp_path / "a", {"0": [True], "1": [True], "2": [True], "3": [False], "9": [True]})
    b = _folder(tmp_path / "b", {"0": [True], "1": [False], "2": [False], "3": [False]})
    result = eval_main(["--compare", a, b, "--protocol", "rule"])
    row = result["benchmarks"]["synthetic"]
    # The four questions both hold: A 3 / 4, B 1 / 4 -> +50.00; question 9 (A only) left out
    assert row["questions"] == 4 and row["difference"] == 50.0
    assert row["low"] <= 50.0 <= row["high"] and row["low"] >= 0.0
    # The reference: the paired bootstrap of the per-question differences, same draws
    reference = paired_difference({"0": [True], "1": [True], "2": [True], "3": [False]},
                                  {"0": [True], "1": [False], "2": [False], "3": [False]})  # fmt: skip
    assert (row["low"], row["high"]) == (round(100 * reference["low"], 2), round(100 * reference["high"], 2))
    assert "| Synthetic | 4 | +50.00 |" in capsys.readouterr().out
    # A folder against itself: no difference, an interval of width 0
    same = eval_main(["--compare", a, a, "--protocol", "rule"])["benchmarks"]["synthetic"]
    assert (same["difference"], same["low"], same["high"]) == (0.0, 0.0, 0.0)


def test_compare_needs_two_results_folders(tmp_path, capsys):
    a = _folder(tmp_path / "a", {"0": [True]})
    with pytest.raises(SystemExit):
        cli_main(["eval", "--compare", a, "--protocol", "rule"])
    assert "--compare takes two results folders" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["eval", "--compare", a, str(tmp_path)])
    assert "not a `vepo-trl eval` results folder" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------------
# The judge, paid once
# ---------------------------------------------------------------------------------------------------------------------


def test_an_interrupted_judged_run_rerun_sends_each_request_once(tiny_model_dir, tmp_path, monkeypatch,
                                                                 standins_as_full_splits):  # fmt: skip
    data_dir = str(write_standins(tmp_path / "standins"))
    server = FakeOpenAI()
    server.default = "echo"
    monkeypatch.setenv("VEPO_TEST_JUDGE_KEY", SECRET)
    out = tmp_path / "judged"
    judge = ["--judge_base_url", server.base_url, "--judge_api_key_env", "VEPO_TEST_JUDGE_KEY", "--judge_workers", "1"]
    args = ["eval", "--model", tiny_model_dir, "--data_dir", data_dir, "--output_dir", str(out), "--benchmarks",
            "wemath", "--protocol", "lenient", *judge, *FAST]  # fmt: skip

    def run(argv):
        server.script = ["OK"]  # the reachability check of each run
        cli_main(argv)

    def grading_requests():
        bodies = [r["body"] for r in server.requests]
        return [json.dumps(b, sort_keys=True) for b in bodies if b["messages"][0]["content"] != "Reply with OK."]

    try:
        run(args)
        first = grading_requests()
        assert len(first) == 5 == len(set(first))
        # Killed after the judge answered, before the last three records were written: they are generated again
        records = (out / "wemath.jsonl").read_text().splitlines(keepends=True)
        (out / "wemath.jsonl").write_text("".join(records[:2]))
        run(args)
        assert len(lines(out / "wemath.jsonl")) == 5
        assert sorted(grading_requests()) == sorted(first)  # nothing sent twice
        # --rescore after the verdicts are gone: every reply is in the folder
        cached = json.loads((out / "summary.json").read_text())["benchmarks"]["wemath"]["accuracy"]
        stripped = [{k: v for k, v in r.items() if k != "verdicts"} for r in lines(out / "wemath.jsonl")]
        (out / "wemath.jsonl").write_text("".join(json.dumps(r) + "\n" for r in stripped))
        run(["eval", "--rescore", str(out), "--protocol", "lenient", *judge])
        assert sorted(grading_requests()) == sorted(first)
        assert json.loads((out / "summary.json").read_text())["benchmarks"]["wemath"]["accuracy"] == cached
        # Another judge model is another request
        run(["eval", "--rescore", str(out), "--protocol", "lenient", *judge, "--judge_model", "other-judge"])
        assert len(grading_requests()) == 10
    finally:
        server.close()
    assert (out / "judge_requests.jsonl").is_file()
    assert SECRET not in (out / "judge_requests.jsonl").read_text()
    origin = json.loads((out / "summary.json").read_text())["benchmarks"]["wemath"]["provenance"]
    assert origin["judge"] == {"model": "other-judge", "endpoint_host": "127.0.0.1", "temperature": 0.0}
    shutil.rmtree(out)


def test_the_model_card_carries_each_numbers_interval_and_provenance():
    from vepo_trl.eval.card import eval_results

    origin = {"judge": {"model": "gpt-4o-mini", "endpoint_host": "api.openai.com", "temperature": 0.0},
              "prompt_template_sha256": "a" * 64, "decoding": {"decoding": "sampled", "temperature": 1.0,
              "num_samples": 8}, "seeds": {"seed": 3, "per_sample": "..."}, "data_sha256": "b" * 64,
              "generation_versions": {"vepo_trl": "0.1.0", "transformers": "5.25.0", "vllm": None}}  # fmt: skip
    summary = {
        "generation": {"decoding": "sampled", "num_samples": 8},
        "grading": {"protocol": "paper", "judge_model": "gpt-4o-mini"},
        "benchmarks": {"mathvista": {"complete": True, "accuracy": 71.2, "num_samples": 8, "pass_at_k": 88.1,
                                     "ci95": [69.9, 72.5], "provenance": origin}},
    }  # fmt: skip
    (result,), left_out = eval_results(summary)
    assert left_out == [] and result.metric_value == 71.2
    assert result.metric_name == "avg@8 accuracy (paper protocol, judge gpt-4o-mini)"
    args = result.metric_args
    assert args["ci95"] == [69.9, 72.5] and args["pass_at_k"] == 88.1 and args["seed"] == 3
    assert args["judge_endpoint_host"] == "api.openai.com" and args["judge_temperature"] == 0.0
    assert args["data_sha256"] == "b" * 64 and args["prompt_template_sha256"] == "a" * 64
    assert args["versions"] == "vepo_trl 0.1.0, transformers 5.25.0"
    assert "temperature=1.0" in args["decoding"]


def test_the_judge_cache_replays_a_records_asks_in_order_and_a_failed_verdict_asks_again(openai_server, tmp_path,
                                                                                         monkeypatch):  # fmt: skip
    """The paper's MathVerse scoring asks one request again when the reply is no score: each ask is its own entry
    (`attempt`), replayed in order on a rerun; a record whose verdict was a judge error asks the endpoint anew."""
    from vepo_trl.eval.judge import JudgeCache, LLMJudge

    monkeypatch.setenv("VEPO_TEST_JUDGE_KEY", SECRET)
    replies = iter(["maybe", "1", "0"])
    openai_server.respond = lambda prompt: next(replies)

    def judge():
        return LLMJudge("m", base_url=openai_server.base_url, api_key_env="VEPO_TEST_JUDGE_KEY", max_retries=0,
                        cache=JudgeCache(tmp_path / "judge_requests.jsonl"))  # fmt: skip

    first = judge()
    with first.record():
        assert [first.complete("score it"), first.complete("score it")] == ["maybe", "1"]
    assert first.sent == 2
    again = judge()  # a rerun: the same two asks, from the folder
    with again.record():
        assert [again.complete("score it"), again.complete("score it")] == ["maybe", "1"]
    assert again.sent == 0 and len(openai_server.requests) == 2
    with again.record(fresh=True):
        assert again.complete("score it") == "0"
    assert again.sent == 1
    # Another endpoint is another key
    assert JudgeCache.key("http://a/v1", {"model": "m"}) != JudgeCache.key("http://b/v1", {"model": "m"})


def test_compare_refuses_folders_read_from_other_rows(tmp_path, capsys):
    a = _folder(tmp_path / "a", {"0": [True]})
    b = _folder(tmp_path / "b", {"0": [False]})
    for folder, digest in ((a, "1" * 64), (b, "2" * 64)):
        manifest = json.loads((tmp_path / folder / "manifest.json").read_text())
        (tmp_path / folder / "manifest.json").write_text(
            json.dumps({**manifest, "data_sha256": {"synthetic": digest}})
        )
    with pytest.raises(SystemExit):
        cli_main(["eval", "--compare", a, b, "--protocol", "rule"])
    assert "the same ids are not the same questions" in capsys.readouterr().err
