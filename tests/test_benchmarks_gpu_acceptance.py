"""The GPU acceptance command and its wheel preparation, on the CPU: `benchmarks/gpu_acceptance.py --cpu --quick`
runs end to end (so the script a lent GPU runs never rots), its verdicts fail where they must, and
`benchmarks/gpu_prepare.py` plans and checks the wheel folder that travels to a GPU machine without a registry."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement


REPO = Path(__file__).resolve().parents[1]


def load(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def prepare():
    return load("gpu_prepare")


@pytest.fixture(scope="module")
def acceptance():
    return load("gpu_acceptance")


# ---------------------------------------------------------------------------------------------------------------------
# gpu_prepare.py: what travels
# ---------------------------------------------------------------------------------------------------------------------


def test_prepare_carries_what_the_image_lacks_and_nothing_it_has(prepare):
    carried, notes = prepare.plan()
    names = {item.name for item in carried}
    # Not in the image: TRL and its data stack, the rewards' parsers
    assert {"trl", "datasets", "math-verify", "qwen-vl-utils", "dill", "multiprocess"} <= names
    # In the image at a version our pins exclude (5.17 < 5.23): carried
    assert "transformers" in names
    # In the image at versions that fit: never carried (torch alone is GBs)
    assert not names & {"torch", "torchvision", "numpy", "pyarrow", "pandas"}
    # An image package travels only for a requirement its version misses, named (transformers 5.25 needs
    # huggingface-hub>=2.4 where the image has 1.33)
    for item in carried:
        if item.name in prepare.GPU_IMAGE_VERSIONS:
            assert (
                item.why.startswith(f"image has {prepare.GPU_IMAGE_VERSIONS[item.name]}; ") and " needs " in item.why
            )
    assert any(note.startswith("left out av") for note in notes)
    for item in carried:  # the versions this environment (CI) tests
        assert item.version == prepare.metadata.version(item.name)


def test_prepare_carries_an_image_package_whose_version_misses_a_pin(prepare, monkeypatch):
    assert prepare._misses("transformers", [("vepo-trl", Requirement("transformers>=5.23,<6"))])
    assert not prepare._misses("accelerate", [("vepo-trl", Requirement("accelerate>=1.15"))])
    monkeypatch.setitem(prepare.GPU_IMAGE_VERSIONS, "accelerate", "1.10.0")
    assert prepare._misses("accelerate", [("vepo-trl", Requirement("accelerate>=1.15"))])
    assert "accelerate" in {item.name for item in prepare.plan()[0]}


def _wheel(folder, filename, size=10):
    path = folder / filename
    with open(path, "wb") as handle:
        handle.truncate(size)
    return path


def test_prepare_check_finds_every_problem_of_a_folder(prepare, tmp_path):
    wanted = [
        prepare.Carried("trl", "1.16.0", ""),
        prepare.Carried("pydantic-core", "2.50.5", ""),
        prepare.Carried("dill", "0.4.1", ""),
    ]
    _wheel(tmp_path, "trl-1.16.0-py3-none-any.whl")
    core = _wheel(tmp_path, "pydantic_core-2.50.5-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
    _wheel(tmp_path, "dill-0.4.1-py3-none-any.whl")
    assert prepare.check(tmp_path, wanted) == []

    core.rename(tmp_path / "pydantic_core-2.50.5-cp311-cp311-manylinux_2_17_x86_64.whl")  # the wrong Python
    _wheel(tmp_path, "dill-0.4.0-py3-none-any.whl")  # two versions of one package
    _wheel(tmp_path, "six-1.16.0-py2.py3-none-any.whl")  # not in the plan
    (tmp_path / "notes.txt").write_text("x")
    problems = "\n".join(prepare.check(tmp_path, wanted))
    assert "does not install on CPython 3.12" in problems
    assert "dill: 2 wheels" in problems and "keep one" in problems
    assert "not in the plan: six" in problems and "not wheels: notes.txt" in problems

    for path in tmp_path.iterdir():
        path.unlink()
    _wheel(tmp_path, "trl-1.15.0-py3-none-any.whl")  # another version than this environment tests
    _wheel(tmp_path, "pydantic_core-2.50.5-cp312-cp312-macosx_11_0_arm64.whl")
    _wheel(tmp_path, "dill-0.4.1-py3-none-any.whl", size=prepare.LIMIT_BYTES + 1)
    problems = "\n".join(prepare.check(tmp_path, wanted))
    assert "trl: wheel 1.15.0, this environment tests 1.16.0" in problems
    assert "pydantic_core-2.50.5-cp312-cp312-macosx_11_0_arm64.whl does not install" in problems
    assert "over the 64 MiB" in problems
    assert prepare.check(tmp_path / "absent", wanted)[0].endswith("run benchmarks/gpu_prepare.py")


def test_prepare_device_command_installs_offline_then_runs_the_acceptance(prepare):
    command = prepare.device_command(prepare.WHEEL_DIR)
    assert command.startswith("python3 -m pip install -q --no-index --no-deps")
    assert ".gpu-wheels/*.whl" in command and "--target /tmp/site" in command
    assert command.endswith("python3 benchmarks/gpu_acceptance.py --out ${OUT:-gpu-acceptance}")
    assert len(command) < 2000  # fits one device call
    ignored = (REPO / ".gitignore").read_text().splitlines()
    assert ".gpu-wheels/" in ignored and "gpu-acceptance/" in ignored


# ---------------------------------------------------------------------------------------------------------------------
# gpu_acceptance.py: the verdicts
# ---------------------------------------------------------------------------------------------------------------------


def test_gpu_smoke_quick_covers_every_strategy_perturbation_and_loss_type():
    smoke = load("gpu_smoke")
    from vepo_trl.perturb import PERTURBATIONS
    from vepo_trl.scoring import SELECTION_STRATEGIES, SUPPORTED_LOSS_TYPES

    quick = [overrides for _, overrides in smoke.cases(quick=True)]
    full = [overrides for _, overrides in smoke.cases(quick=False)]
    assert {o.get("selection_strategy", "vepo") for o in quick} == set(SELECTION_STRATEGIES)
    assert {o.get("perturbation", "diffusion") for o in quick} == set(PERTURBATIONS)
    assert {o["loss_type"] for o in quick if "loss_type" in o} == set(SUPPORTED_LOSS_TYPES)
    assert len(quick) < len(full)  # the cross product is what --quick leaves out


def _launch_report(tmp_path, **overrides):
    report = {
        "distributed_type": "FSDP",
        "num_processes": 1,
        "zero_stage": None,
        "fsdp_version": 2,
        "mixed_precision": "bf16",
        "attention": "sdpa",
        "device": "cuda:0",
        "global_step": 3,
        "losses": [0.1, 0.2, 0.0],
        "losses_finite": True,
        "saved": ["model.safetensors"],
    }
    report.update(overrides)
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    return path


def test_acceptance_launch_fails_when_accelerate_ran_something_else(acceptance, tmp_path):
    parse = acceptance.make_parse_launch("fsdp", _launch_report(tmp_path))
    assert parse("", 0, False)[0] == "ok"
    # accelerate quietly falling back to a plain run, a NaN loss, nothing saved: each fails on a GPU
    for overrides in ({"distributed_type": "NO"}, {"losses_finite": False}, {"saved": []}, {"global_step": 1}):
        parse = acceptance.make_parse_launch("fsdp", _launch_report(tmp_path, **overrides))
        assert parse("", 0, False)[0] == "FAIL", overrides
    parse = acceptance.make_parse_launch("zero3", _launch_report(tmp_path, distributed_type="DEEPSPEED", zero_stage=2))
    assert parse("", 0, False)[0] == "FAIL"
    assert acceptance.make_parse_launch("ddp", tmp_path / "absent.json")("", 1, False)[0] == "FAIL"


def _resume_folders(tmp_path, final, resumed, checkpoint, steps=(3,)):
    """The files a launch section leaves: the uninterrupted run's model and checkpoint-2, the resumed run's model and
    report (each weight a single-tensor model here)."""
    import torch
    from safetensors.torch import save_file

    straight, again = tmp_path / "straight", tmp_path / "again"
    (straight / "checkpoint-2").mkdir(parents=True)
    again.mkdir()
    save_file({"w": torch.tensor([final])}, str(straight / "model.safetensors"))
    save_file({"w": torch.tensor([checkpoint])}, str(straight / "checkpoint-2" / "model.safetensors"))
    save_file({"w": torch.tensor([resumed])}, str(again / "model.safetensors"))
    report = json.loads(_launch_report(tmp_path).read_text())
    again.with_suffix(".json").write_text(json.dumps({**report, "steps_this_process": list(steps)}))
    return straight, again


@pytest.mark.parametrize(
    "final, resumed, checkpoint, steps, cpu, verdict",
    [
        (1.0, 1.0, 0.5, (3,), True, "ok"),  # bit for bit
        (1.0, 1.0 + 1e-7, 0.5, (3,), True, "FAIL"),  # the CPU is deterministic: any difference fails
        (1.0, 1.0 + 1e-3, 0.5, (3,), False, "ok"),  # a GPU's atomics: within 5% of step 3's move
        (1.0, 1.1, 0.5, (3,), False, "FAIL"),  # 20% of it: not the same run
        (1.0, 1.0, 0.5, (1, 2, 3), True, "FAIL"),  # trained from step 1 again: equal weights prove nothing
        (1.0, 1.0, 1.0, (3,), True, "FAIL"),  # step 3 moved nothing: neither does the comparison
    ],
)  # fmt: skip
def test_acceptance_launch_fails_when_the_resumed_run_differs(acceptance, tmp_path, final, resumed, checkpoint, steps,
                                                               cpu, verdict):  # fmt: skip
    folders = _resume_folders(tmp_path, final, resumed, checkpoint, steps)
    status, summary, figures = acceptance.make_parse_launch("fsdp", _launch_report(tmp_path), folders)("", 0, cpu)
    assert status == verdict, summary
    assert "resume" in figures and summary.count("resumed") >= 1


def test_acceptance_bench_fails_over_the_overhead_bound_on_a_gpu(acceptance):
    method = {"step": 1.0, "compute_loss": 0.5, "peak_memory_gb": 16.0, "perturbed_forward": 0.2}
    data = {
        "model": "qwen2.5-vl-3b-shaped",
        "no_grad_forward_seconds": 0.3,
        "vepo_compute_loss_bound_seconds": 1.2,
        "vepo_within_time_bound": False,
        **{name: dict(method) for name in ("grpo", "entropy_top20", "vepo")},
    }
    output = "timings\n" + json.dumps(data)
    assert acceptance.parse_bench(output, 0, cpu=False)[0] == "FAIL"
    assert acceptance.parse_bench(output, 0, cpu=True)[0] == "ok"  # a tiny CPU model says nothing about the bound
    data["vepo_within_time_bound"] = True
    assert acceptance.parse_bench("\n" + json.dumps(data), 0, cpu=False)[0] == "ok"
    assert acceptance.parse_bench("Traceback ...", 1, cpu=False)[0] == "FAIL"


def test_acceptance_real_width_fails_beyond_the_signal_tolerance(acceptance):
    data = {
        "model": "Qwen2.5-VL-7B-shaped",
        "precision": "bf16",
        "vocab_size": 152064,
        "tokens_checked": 64,
        "max_abs_error": {"entropy": 8.6e-6, "jsd": 7.5e-8, "perturbed_entropy": 1.3e-5},
        "phases": {},
    }
    assert acceptance.parse_real_width(json.dumps(data), 0, False)[0] == "ok"
    data["max_abs_error"]["jsd"] = 0.05
    assert acceptance.parse_real_width(json.dumps(data), 0, False)[0] == "FAIL"
    data["max_abs_error"]["jsd"], data["tokens_checked"] = 0.0, 0  # nothing compared proves nothing
    assert acceptance.parse_real_width(json.dumps(data), 0, False)[0] == "FAIL"


@pytest.mark.slow(minutes=3)
def test_acceptance_cpu_quick_runs_every_section(tmp_path):
    result = subprocess.run(
        # The budget is for a lent GPU's minutes: here the run must pass however loaded the machine is
        [sys.executable, str(REPO / "benchmarks" / "gpu_acceptance.py"), "--cpu", "--quick", "--out", str(tmp_path),
         "--budget", "3000"],
        capture_output=True,
        text=True,
        timeout=3300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary == json.loads((tmp_path / "acceptance.json").read_text())
    sections = summary["sections"]
    assert set(sections) == {"bench", "perturbed", "perturbed:zero3", "perturbed:fsdp2", "families", "smoke",
                             "notebook", "real_width", "launch:ddp", "launch:fsdp", "launch:zero2", "launch:zero3"}  # fmt: skip
    for name in ("bench", "perturbed", "families", "smoke", "notebook", "real_width", "launch:ddp", "launch:fsdp"):
        assert sections[name]["status"] == "ok", (name, sections[name])
    # fp32 on the CPU: full equals GRPOTrainer bit for bit on every family run
    assert all("bit for bit" in detail for detail in sections["families"]["figures"]["full_vs_grpo"].values())
    assert sections["real_width"]["figures"]["tokens_checked"] > 0
    # The notebook's configuration ran its steps with the perturbed forward (no row skipped for a zero advantage)
    assert sections["notebook"]["figures"]["perturbed_rows_skipped_fraction"] == [0.0]
    # The step benchmark: three rotated rounds, ratios within each, and the share of a whole RL step
    ratios = sections["bench"]["figures"]["ratios"]["32"]
    assert len(ratios["vepo_over_entropy"]["rounds"]) == len(ratios["vepo_over_grpo"]["rounds"]) == 3
    assert (
        ratios["vepo_over_entropy"]["min"]
        <= ratios["vepo_over_entropy"]["median"]
        <= ratios["vepo_over_entropy"]["max"]
    )
    assert set(sections["bench"]["figures"]["share_of_rl_step"]["32"]) == {"over_grpo", "over_entropy"}
    # The perturbed pass with each prompt read once, at 4 and 8 generations
    assert set(sections["perturbed"]["figures"]["ratios"]) == {"perturbed_time_ratio_g4", "perturbed_time_ratio_g8"}
    assert sections["launch:ddp"]["figures"]["global_step"] == 3
    # Each launch resumed at step 2 ran step 3 alone and ended on the uninterrupted run's weights, which step 3 moved
    for name in ("launch:ddp", "launch:fsdp"):
        figures = sections[name]["figures"]
        assert figures["resumed"]["steps_this_process"] == [3]
        assert figures["resume"]["equal_tensors"] == figures["resume"]["tensors"] > 0
        assert figures["resume"]["max_abs_diff"] == 0.0 < figures["resume"]["step3_moved"]
    assert (tmp_path / "acceptance.log").stat().st_size > 0
