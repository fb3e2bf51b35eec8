"""The benchmark scripts the README quotes keep running: each one's quick path, as a user starts it (a fresh
process). Figures are printed, never asserted against a time; what is asserted is that the script ran to its JSON
line and that its counts are the ones the method implies. (`bench_step.py` crashed unnoticed when `VEPOConfig`
refused the `learning_rate 0` it trains with.)"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[1]


def test_bench_step_quick_path_runs_and_reports_every_method(tmp_path):
    env = {**os.environ, "VEPO_TRL_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_step.py"), "--steps", "3", "--warmup", "1", "--rounds", "1",
         "--completion_length", "8"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(figures["round_median_step_seconds"]) == {"grpo", "entropy_top20", "vepo"}
    # The methods' forwards as their definitions say: one loss forward each, VEPO's perturbed pass on top, counted
    # per completion (skipped for completions with a zero advantage)
    forwards = figures["loss_forwards_per_step"]
    assert forwards["grpo"] == forwards["entropy_top20"] == forwards["vepo"] == 1.0
    assert 0 <= figures["perturbed_forwards_per_completion"] <= 1


def _run(script, *argv, tmp_path, timeout=600):
    env = {**os.environ, "VEPO_TRL_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *argv], capture_output=True, text=True,
                            env=env, cwd=tmp_path, timeout=timeout)  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout


def test_bench_gpu_step_rotates_the_order_and_takes_ratios_within_rounds(tmp_path):
    out = _run("bench_gpu_step.py", "--tiny", "--steps", "1", "--warmup", "1", "--completions", "2",
               "--completion_length", "8", "16", "--image_side", "56", tmp_path=tmp_path)  # fmt: skip
    figures = json.loads(out.strip().splitlines()[-1])
    assert set(figures["by_length"]) == {"8", "16"} and figures["completion_length"] == 8
    for length in figures["by_length"].values():
        # Each method first once in three rounds; ratios per round, summarised
        assert [order[0] for order in length["orders"]] == ["grpo", "entropy_top20", "vepo"]
        for ratio in length["ratios"].values():
            assert len(ratio["rounds"]) == 3 and ratio["median"] == sorted(ratio["rounds"])[1]
        assert length["generation_seconds"] > 0 and "vepo_share_of_rl_step_over_grpo" in length
        assert length["vepo"]["perturbed_completions"] > 0 and length["grpo"]["perturbed_completions"] == 0
    assert "VEPO / top-20% entropy   median" in out


def test_bench_perturbed_quick_path_reads_each_prompt_once(tmp_path):
    out = _run("bench_perturbed.py", "--quick", tmp_path=tmp_path)
    figures = json.loads(out.strip().splitlines()[-1])
    for generations in (4, 8):
        assert figures[f"perturbed_time_ratio_g{generations}"] > 0
        # The prompt once per group and each completion, against every row's whole sequence
        positions = figures[f"positions_per_completion_g{generations}"]
        prompt, length = figures["prompt_tokens"], figures["completion_length"]
        assert positions["whole"] == prompt + length
        assert positions["shared"] == prompt / generations + length
    # Float32 noise of two ways to sum (tests/test_prompt_cache.py holds every family to 1e-5, two to 1e-10 in float64)
    assert figures["max_signal_diff"] <= 1e-4 and figures["vepo_over_entropy"] > 0


@pytest.mark.slow
def test_bench_perturbed_sharded_quick_path_runs_on_two_zero3_processes(tmp_path):
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install -e '.[deepspeed]')")
    out = _run("bench_perturbed.py", "--quick", "--sharding", "zero3", "--generations", "2", "--rounds", "1",
               "--completion_length", "4", tmp_path=tmp_path)  # fmt: skip
    figures = json.loads(out.strip().splitlines()[-1])
    assert (figures["sharding"], figures["processes"]) == ("zero3", 2)
    assert figures["distributed_type"] == "DistributedType.DEEPSPEED"
    assert figures["perturbed_time_ratio_g2"] > 0 and figures["vepo_over_entropy"] > 0
    assert figures["max_signal_diff"] <= 1e-4
    assert figures["positions_per_completion_g2"]["shared"] < figures["positions_per_completion_g2"]["whole"]
    assert figures["one_process"]["perturbed_time_ratio_g2"] > 0


def test_bench_scoring_quick_path(tmp_path):
    out = _run("bench_scoring.py", "--sizes", "64x32", "--vocab", "2048", "--repeats", "1", "--no_gpu",
               tmp_path=tmp_path)  # fmt: skip
    figures = json.loads(out.strip().splitlines()[-1])
    # The tiled signals equal the full-logits ones; memory is the resident set's growth, which a small size may not
    # show at all (the allocator reuses the warm-up's pages)
    assert figures["max_abs_diff"] < 1e-4 and figures["time_ratio"] > 0 and figures["peak_mem_ratio"] >= 0


def test_bench_rollout_cache_quick_path(tmp_path):
    out = _run("bench_rollout_cache.py", tmp_path=tmp_path)
    assert "Qwen2.5-VL-7B" in out


def test_bad_inputs_quick_path(tmp_path):
    out = _run("bad_inputs.py", "--only", "vepo-trl strategies", tmp_path=tmp_path)
    assert "1 cases: 1 exit 2, 1 one stderr line, 0 tracebacks" in out


def test_readme_figures_quick_path_finds_the_readme_true(tmp_path):
    # The README's test count against `pytest --collect-only`: a test added without `readme_figures.py --write` fails
    out = _run("readme_figures.py", "--only", "tests", tmp_path=tmp_path, timeout=900)
    assert "tests" in out


def _readme_figures():
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_figures", REPO / "benchmarks" / "readme_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _acceptance_summary(**overrides):
    summary = {
        "device": "NVIDIA H200",
        "gpu_memory_gb": 139.8,
        "cuda": "13.0",
        "attention": "sdpa",
        "versions": {
            "torch": "2.11.0",
            "transformers": "5.24.0",
            "trl": "1.16.0",
            "accelerate": "1.15.0",
            "peft": "0.21.2",
            "deepspeed": None,
            "datasets": "4.0.0",
        },  # fmt: skip
        "passed": True,
        "seconds": 201.4,
        "sections": {
            "bench": {
                "status": "ok",
                "seconds": 88.2,
                "summary": "VEPO / entropy 1.12 (1.10-1.14) | median",
                "figures": {},
            },
            "launch:zero3": {
                "status": "skipped",
                "seconds": 0.0,
                "summary": "deepspeed is not installed",
                "figures": {},
            },
        },
    }
    summary.update(overrides)
    return summary


def test_readme_figures_renders_the_gpu_table_from_the_acceptance_json_and_checks_it_afterwards(tmp_path, capsys):
    module = _readme_figures()
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n\n{module.TABLE_START}\nan old table\n{module.TABLE_END}\n\nafter\n")
    results = tmp_path / "benchmarks" / "results" / "acceptance.json"
    run_json = tmp_path / "run" / "acceptance.json"
    run_json.parent.mkdir()
    run_json.write_text(json.dumps(_acceptance_summary()))
    common = ["--readme", str(readme), "--results", str(results)]
    with pytest.raises(SystemExit):  # the old table differs from the run's
        module.main(["--acceptance", str(run_json), *common])
    module.main(["--acceptance", str(run_json), "--write", *common])
    text = readme.read_text()
    assert text.startswith("intro\n\n") and text.endswith("\n\nafter\n") and "an old table" not in text
    assert (
        "Last measured on one NVIDIA H200 139.8 GiB (CUDA 13.0, torch 2.11.0, transformers 5.24.0, TRL 1.16.0, "
        "accelerate 1.15.0, peft 0.21.2; sdpa), 201 s in all, every section passed "
        "(`benchmarks/results/acceptance.json`):"
    ) in text
    assert "| bench | 88 | VEPO / entropy 1.12 (1.10-1.14) \\| median |" in text
    assert "| launch:zero3 | 0 | **skipped**: deepspeed is not installed |" in text
    assert json.loads(results.read_text()) == _acceptance_summary()  # the copy the README names
    # Later checks render the kept copy: equal now, a differing copy fails
    module.main(["--only", "gpu", *common])
    results.write_text(json.dumps(_acceptance_summary(seconds=250.0)))
    with pytest.raises(SystemExit):
        module.main(["--only", "gpu", *common])
    assert "DIFFERS" in capsys.readouterr().out


def test_readme_figures_rewrites_each_figure_in_place_and_holds_timings_to_a_tolerance(tmp_path, monkeypatch):
    module = _readme_figures()
    readme = tmp_path / "README.md"
    readme.write_text(
        "VEPO 1.18x full GRPO (`GRPOTrainer`; per-round range 1.18-1.18), 1.16x top-20% entropy (range 1.16-1.30; "
        "paper), VEPO's median step 0.17 s, with 0.91 perturbed forwards per completion\n"
    )
    measured = {"step_over_grpo": ("1.25", "1.18", "1.40"), "step_over_entropy": ("1.16", "1.05", "1.16"),
                "step_seconds": "0.20", "step_perturbed": "0.91"}  # fmt: skip
    monkeypatch.setitem(module.MEASURE, "bench_step", lambda: measured)
    module.main(["--only", "bench_step", "--readme", str(readme)])  # timings within 50%: no difference
    measured["step_perturbed"] = "0.88"  # a count differs exactly
    with pytest.raises(SystemExit):
        module.main(["--only", "bench_step", "--readme", str(readme)])
    module.main(["--only", "bench_step", "--readme", str(readme), "--write"])
    assert readme.read_text() == (
        "VEPO 1.25x full GRPO (`GRPOTrainer`; per-round range 1.18-1.40), 1.16x top-20% entropy (range 1.05-1.16; "
        "paper), VEPO's median step 0.20 s, with 0.88 perturbed forwards per completion\n"
    )


def test_structure_figures_hold_the_contract_and_the_test_layout(tmp_path):
    out = _run("structure.py", tmp_path=tmp_path)
    assert "outside it (VEPO's own hooks aside): 0" in out
    assert "test modules importing another test module: 0" in out


def test_tiny_builds_fingerprint_is_the_same_on_a_second_build(tmp_path):
    """The same seed builds the same model, so a refactor's before/after fingerprints compare builds, not chance."""
    first = _run("tiny_builds.py", "qwen2.5-vl", tmp_path=tmp_path)
    assert first.split()[0] == "qwen2.5-vl" and len(first.split()[1]) == 16
    assert _run("tiny_builds.py", "qwen2.5-vl", tmp_path=tmp_path) == first


def _trl_grpo_tests():
    import importlib.util

    spec = importlib.util.spec_from_file_location("trl_grpo_tests", REPO / "benchmarks" / "trl_grpo_tests.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_trl_grpo_tests_report_counts_honestly(tmp_path):
    """TRL's test file's report: a refusal is excused only by its expected message, a test with no result on a
    VEPOTrainer run that was made is lost, runs of another commit are left out, and the report says how many tests
    ran the paper's selection."""
    bench = _trl_grpo_tests()

    def junit(trainer, cases, commit="abc"):
        body = "".join(
            f'<testcase classname="trl_tests.test_grpo_trainer.TestGRPOTrainer" name="{name}">'
            + (
                f'<properties><property name="selection_strategy" value="{strategy}"/></properties>'
                if strategy
                else ""
            )
            + (f'<failure message="{reason}"/>' if reason else "")
            + "</testcase>"
            for name, strategy, reason in cases
        )
        (tmp_path / f"junit-{trainer}-all.xml").write_text(f"<testsuites><testsuite>{body}</testsuite></testsuites>")
        (tmp_path / f"junit-{trainer}-all.json").write_text(json.dumps({"commit": commit, "trainer": trainer}))

    names = ["test_init_minimal", "test_liger_kernel_with_peft_lm_head_raises", "test_a", "test_b"]
    junit("grpo", [(name, "", "") for name in names])
    junit("full", [
        ("test_init_minimal", "full", "ValueError: selection_strategy='vepo' perturbs the model's images, but the model is a text-only 'qwen2' model"),
        ("test_liger_kernel_with_peft_lm_head_raises", "full", "AssertionError: something else entirely"),
        ("test_a", "full", ""),
    ])  # fmt: skip
    junit("vepo", [(name, "vepo" if name == "test_a" else "full", "") for name in names])
    results = bench.merged_results(tmp_path, "abc")
    lost = {(test.split("::")[1], trainer): outcome for test, trainer, outcome in bench.lost_tests(results)}
    assert set(lost) == {
        ("test_init_minimal", "full"),
        ("test_liger_kernel_with_peft_lm_head_raises", "full"),
        ("test_b", "full"),  # no result: lost, not passed
    }
    assert lost[("test_b", "full")].status == "missing"
    assert bench.excused("TestGRPOTrainer::test_init_minimal", lost[("test_init_minimal", "full")])
    assert not bench.excused(  # listed, but failed with another message
        "TestGRPOTrainer::test_liger_kernel_with_peft_lm_head_raises",
        lost[("test_liger_kernel_with_peft_lm_head_raises", "full")],
    )
    report = bench.markdown_report(results, {"commit": "abc"})
    assert "vepo_trl commit abc" in report
    assert "ran the paper's selection (the vepo column's vision-language tests): 1 of 4" in report
    # A run made on another commit is not merged
    junit("full", [(name, "full", "") for name in names], commit="def")
    assert bench.merged_results(tmp_path, "abc")["full"] == {}
    # A VEPOTrainer run whose pytest died before writing its JUnit file: every test GRPOTrainer passes is lost
    junit("vepo", [], commit="abc")
    (tmp_path / "junit-vepo-all.xml").unlink()
    results = bench.merged_results(tmp_path, "abc")
    assert {(t.split("::")[1], tr) for t, tr, o in bench.lost_tests(results) if tr == "vepo"} == {
        (name, "vepo") for name in names
    }


def test_soak_quick_path_ends_on_the_uninterrupted_weights(tmp_path):
    """The soak's short form: 8 steps, a checkpoint every 2, killed twice at random moments (SIGTERM or SIGKILL) and
    rerun with the same command: the same final weights as the uninterrupted run."""
    out = _run("soak.py", "--steps", "8", "--save_steps", "2", "--interruptions", "2", "--quick", "--out",
               str(tmp_path / "soak"), tmp_path=tmp_path)  # fmt: skip
    figures = json.loads(out.strip().splitlines()[-1])
    assert figures["max_weight_difference"] == 0.0
    assert sum(figures["interruptions"].values()) >= 1
