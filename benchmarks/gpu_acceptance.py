"""One command that proves a release on a GPU, inside the few minutes a GPU is lent (< 8 minutes on one H100).

Sections, each a separate process (a crash in one is reported, the rest still run):

- `bench`       `bench_gpu_step.py` at Qwen2.5-VL-3B's shape: GRPO, top-20% entropy and VEPO step and `compute_loss`
                times, the perturbed forward, peak memory and the overhead bound (VEPO's `compute_loss` <= entropy's
                + one no-grad forward + 10%); every method warmed up first, then three rounds in rotated order at 256
                and 1,024 tokens: VEPO / GRPO and VEPO / entropy per round (median, spread) and the share of a whole
                RL step (a transformers rollout included) VEPO adds. Runs first and alone, so nothing else shares the
                GPU while it is timed.
- `perturbed`   `bench_perturbed.py --model 3b`: the perturbed pass reading each prompt once against every row's whole
                sequence at Qwen2.5-VL-3B's dimensions (1,024 visual tokens, 256-token completions, 4 and 8
                generations), and one RL step of VEPO against top-20% entropy, rotated rounds. Alone too.
- `perturbed:zero3`, `perturbed:fsdp2`   the same with the weights sharded (`--sharding`, one process on the GPU:
                every forward gathers parameters), its RL step through `trainer.train()`.
- `families`    `gpu_families.py`: every family's tiny model (real classes), two bf16 VEPO steps with `diffusion` and
                with `patch_blackout`, and `full` against TRL's `GRPOTrainer` (loss and gradients to bf16 tolerance).
- `smoke`       `gpu_smoke.py --quick`: every strategy, perturbation and loss type's code path on one family.
- `notebook`    `notebook_memory.py`: the Colab notebook's own configuration cell at the 3B shape (random weights,
                LoRA r 64, activation checkpointing, 1000x1000 images, completions to 1,024 tokens), two steps; peak
                GPU memory against 24 GB (L4) and 40 GB (A100 40GB).
- `real_width`  `real_width_check.py --device cuda`: a 7B-wide model (vocabulary 152,064) trained one LoRA step in
                bf16, its signals against a float64 full-logits reference.
- `launch:*`    `accelerate launch --num_processes 1` with each of `recipes/accelerate_configs/*.yaml` on the tiny
                recipe through `launch_probe.py`, which reports what accelerate really ran: three steps saving at step
                2, then the same command in a folder holding only that run's record and checkpoint-2 (a run stopped
                after its second step), which resumes to step 3; its weights must equal the uninterrupted run's (bit
                for bit on the CPU; on a GPU within 5% of what step 3 moved them, the noise of its atomics).

    python benchmarks/gpu_acceptance.py                     # CUDA; prints a table and a final JSON line
    python benchmarks/gpu_acceptance.py --cpu --quick       # the same sections on the CPU, small (what CI runs)
    python benchmarks/gpu_acceptance.py --only bench,smoke  # some sections

On a GPU machine without a package registry, `benchmarks/gpu_prepare.py` (run where PyPI is reachable) gathers the
wheels it lacks and prints the device command. Each section's whole output goes to `--out`/acceptance.log, the
summary to `--out`/acceptance.json. Exits 1 when a section fails.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
CONFIGS = sorted((ROOT / "recipes" / "accelerate_configs").glob("*.yaml"))
TINY_RECIPE = ROOT / "recipes" / "tiny" / "config_vepo.yaml"
# Accelerate's distributed type and DeepSpeed stage each config must really give on a GPU
EXPECTED = {"ddp": ("MULTI_GPU", None), "fsdp": ("FSDP", None), "zero2": ("DEEPSPEED", 2), "zero3": ("DEEPSPEED", 3)}
# Signal pass against float64 at a 152K vocabulary (nats): fp32 accumulation alone gives ~2e-4 in the entropy
SIGNAL_TOLERANCE = {"bf16": 1e-2, "fp32": 1e-3}
# A resumed run against the uninterrupted one on a GPU, as a fraction of what step 3 moved the weights: the run is the
# same, but atomics in the backward (embedding gradients, reductions) add in another order
RESUME_TOLERANCE = 0.05


@dataclass
class Section:
    name: str
    argv: list[str]
    parse: callable
    env: dict = field(default_factory=dict)
    timeout: float = 300.0
    alone: bool = False  # timed: nothing else runs beside it
    skip: str | None = None
    # Commands run after `argv` succeeds, in order, within the same timeout: (prepare, argv, extra env), where
    # `prepare` (or None) runs first in this process
    then: list[tuple] = field(default_factory=list)


@dataclass
class Result:
    name: str
    status: str  # ok | FAIL | skipped | timeout
    seconds: float
    summary: str
    figures: dict
    log: str = ""


def last_json(output: str) -> dict | None:
    for line in reversed(output.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def attention_implementation() -> str:
    """flash-attention 2 when the machine has it, else PyTorch's sdpa (transformers' default)."""
    return "flash_attention_2" if importlib.util.find_spec("flash_attn") is not None else "sdpa"


# ---------------------------------------------------------------------------------------------------------------------
# What each section's output means
# ---------------------------------------------------------------------------------------------------------------------


def parse_bench(output, returncode, cpu):
    data = last_json(output)
    if returncode or not data:
        return "FAIL", "no result", {}
    entropy, vepo, grpo = data["entropy_top20"], data["vepo"], data["grpo"]
    figures = {
        "model": data["model"],
        "step_s": {m: round(data[m]["step"], 4) for m in ("grpo", "entropy_top20", "vepo")},
        "compute_loss_s": {m: round(data[m]["compute_loss"], 4) for m in ("grpo", "entropy_top20", "vepo")},
        "perturbed_forward_s": round(vepo.get("perturbed_forward", 0.0), 4),
        "signals_s": round(vepo.get("signals", 0.0), 4),
        "no_grad_forward_s": round(data["no_grad_forward_seconds"], 4),
        "bound_s": round(data["vepo_compute_loss_bound_seconds"], 4),
        "within_bound": data["vepo_within_time_bound"],
        "peak_gb": {m: round(data[m]["peak_memory_gb"], 2) for m in ("grpo", "entropy_top20", "vepo")},
        # Per completion length: the ratios taken within each rotated round, their median and spread
        "ratios": {
            length: {key: {k: round(v, 4) if isinstance(v, float) else [round(x, 4) for x in v]
                           for k, v in value.items()} for key, value in figures["ratios"].items()}
            for length, figures in data.get("by_length", {}).items()
        },
        "share_of_rl_step": {
            length: {key.removeprefix("vepo_share_of_rl_step_"): round(figures[key], 4) for key in figures
                     if key.startswith("vepo_share_of_rl_step_")}
            for length, figures in data.get("by_length", {}).items()
        },
    }  # fmt: skip
    summary = (
        f"step GRPO {grpo['step']:.3f} / entropy {entropy['step']:.3f} / VEPO {vepo['step']:.3f} s; VEPO compute_loss "
        f"{vepo['compute_loss']:.3f} s vs bound {data['vepo_compute_loss_bound_seconds']:.3f} s; perturbed fwd "
        f"{vepo.get('perturbed_forward', 0.0):.3f} s"
    )
    for length, at_length in data.get("by_length", {}).items():
        ratio = at_length["ratios"]["vepo_over_entropy"]
        summary += (f"; {length} tokens: VEPO / entropy {ratio['median']:.3f} ({ratio['min']:.3f}-{ratio['max']:.3f}), "
                    f"VEPO / GRPO {at_length['ratios']['vepo_over_grpo']['median']:.3f}")  # fmt: skip
        if "vepo_share_of_rl_step_over_grpo" in at_length:
            summary += f", +{at_length['vepo_share_of_rl_step_over_grpo']:.1%} of an RL step"
    if not cpu:
        summary += f"; peak {vepo['peak_memory_gb']:.1f} GB (entropy {entropy['peak_memory_gb']:.1f})"
    # On the CPU the tiny model's times say nothing about the bound: the run itself is the check there
    ok = cpu or data["vepo_within_time_bound"]
    return ("ok" if ok else "FAIL"), summary, figures


def parse_families(output, returncode, cpu):
    data = last_json(output)
    if not data:
        return "FAIL", "no result", {}
    figures = {"passed": data["passed"], "failed": data["failed"], "skipped_families": data["skipped"]}
    worst = [row for row in data["rows"] if row["check"] == "full = GRPOTrainer" and row["status"] == "ok"]
    summary = f"{data['passed']} checks passed, {len(data['failed'])} failed, {data['skipped']} families skipped"
    if worst:
        summary += f"; full = GRPO on {len(worst)} families"
        figures["full_vs_grpo"] = {row["family"]: row["detail"] for row in worst}
    if data["failed"]:
        summary += f"; failed: {', '.join(data['failed'])}"
    return ("ok" if returncode == 0 and not data["failed"] else "FAIL"), summary, figures


def parse_perturbed(output, returncode, cpu):
    data = last_json(output)
    if returncode or not data:
        return "FAIL", "no result", {}
    ratios = {key: round(value, 4) for key, value in data.items() if key.startswith("perturbed_time_ratio_g")
              and isinstance(value, float)}  # fmt: skip
    step, spread = data["vepo_over_entropy"], data["vepo_over_entropy_spread"]
    summary = (
        "perturbed pass, prompt read once / whole: "
        + ", ".join(
            f"{key.removeprefix('perturbed_time_ratio_g')} generations {value:.3f}" for key, value in ratios.items()
        )
        + f" ({data['visual_tokens']} visual tokens, completions {data['completion_length']}); RL step VEPO / entropy "
        f"{step:.3f} ({spread[0]:.3f}-{spread[1]:.3f}); signals shared vs whole {data['max_signal_diff']:.1e}"
    )
    figures = {"ratios": ratios, "vepo_over_entropy": round(step, 4), "vepo_over_entropy_spread": spread,
               "max_signal_diff": data["max_signal_diff"], "visual_tokens": data["visual_tokens"]}  # fmt: skip
    return "ok", summary, figures


def parse_smoke(output, returncode, cpu):
    data = last_json(output)
    if not data:
        return "FAIL", "no result", {}
    summary = f"{data['passed']} cases passed, {len(data['failed'])} failed"
    if data["failed"]:
        summary += f": {', '.join(data['failed'])}"
    return ("ok" if returncode == 0 and not data["failed"] else "FAIL"), summary, data


def parse_notebook(output, returncode, cpu):
    data = last_json(output)
    if returncode or not data:
        return "FAIL", "no result", {}
    figures = {key: data[key] for key in ("model", "steps", "mean_completion_lengths", "perturbed_rows_skipped_fraction",
                                          "peak_allocated_gib", "peak_reserved_gib", "fits")}  # fmt: skip
    summary = f"{data['model']}, {data['steps']} steps, completions of {data['mean_completion_lengths']} tokens"
    if not cpu:
        summary += (
            f"; peak {data['peak_allocated_gib']:.1f} GiB allocated, {data['peak_reserved_gib']:.1f} reserved: "
            + (", ".join(f"{name} {'fits' if ok else 'does not fit'}" for name, ok in data["fits"].items()))
        )
    # The figure is what the section is for: it reports a configuration too large for a GPU, it does not fail on it
    return "ok", summary, figures


def parse_real_width(output, returncode, cpu):
    data = last_json(output)
    if returncode or not data:
        return "FAIL", "no result", {}
    errors = data["max_abs_error"]
    tolerance = SIGNAL_TOLERANCE[data.get("precision", "fp32")]
    ok = data["tokens_checked"] > 0 and all(value <= tolerance for value in errors.values())
    phases = data["phases"]
    figures = {
        "model": data["model"],
        "precision": data.get("precision"),
        "tokens_checked": data["tokens_checked"],
        "max_abs_error": errors,
        "tolerance": tolerance,
        "perturbed_forward_s": phases.get("perturbed forward", {}).get("seconds"),
        "signals_s": phases.get("VEPO signals (tiled)", {}).get("seconds"),
        "peak_gpu_gb": max((p.get("peak_gpu_gb", 0.0) for p in phases.values()), default=None),
    }
    summary = (
        f"{data['model']} {data.get('precision')}, vocab {data['vocab_size']}, {data['tokens_checked']} tokens: "
        f"max |err| entropy {errors['entropy']:.1e}, JSD {errors['jsd']:.1e}, perturbed entropy "
        f"{errors['perturbed_entropy']:.1e} (tolerance {tolerance:.0e})"
    )
    return ("ok" if ok else "FAIL"), summary, figures


def compare_resumed(straight: Path, resumed: Path, checkpoint: Path) -> dict:
    """The resumed run's saved weights against the uninterrupted run's, and how far step 3 moved them (the
    uninterrupted run's final weights against its checkpoint-2, where that holds the weights as safetensors)."""
    from safetensors.torch import load_file

    def weights(folder: Path) -> dict:
        tensors = {}
        for path in sorted(folder.glob("*.safetensors")):
            tensors.update(load_file(str(path)))
        return tensors

    def max_diff(a: dict, b: dict) -> float:
        return max((float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].numel()), default=0.0)

    final, again, before = weights(straight), weights(resumed), weights(checkpoint)
    if not final or final.keys() != again.keys():
        return {"tensors": len(final), "same_names": False}
    return {
        "tensors": len(final),
        "same_names": True,
        "equal_tensors": sum(torch_equal(final[k], again[k]) for k in final),
        "max_abs_diff": max_diff(final, again),
        "step3_moved": max_diff(final, before) if before.keys() == final.keys() else None,
    }


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


def resume_problem(resume: dict, cpu: bool) -> str | None:
    if not resume.get("same_names"):
        return f"resumed model's tensors differ in names from the uninterrupted run's ({resume.get('tensors')})"
    if resume["max_abs_diff"] == 0.0:
        return None if resume["step3_moved"] != 0.0 else "step 3 moved no weight, so the resume proves nothing"
    if cpu:
        return f"resumed weights differ from the uninterrupted run's by {resume['max_abs_diff']:.1e}"
    moved = resume["step3_moved"]
    if moved is None or resume["max_abs_diff"] > RESUME_TOLERANCE * moved:
        return (
            f"resumed weights differ from the uninterrupted run's by {resume['max_abs_diff']:.1e}"
            f" (step 3 moved them {moved if moved is None else f'{moved:.1e}'})"
        )
    return None


def make_parse_launch(config: str, report_path: Path, resume_dirs: tuple[Path, Path] | None = None):
    def parse(output, returncode, cpu):
        try:
            data = json.loads(report_path.read_text())
        except (OSError, json.JSONDecodeError):
            return "FAIL", f"exit {returncode}, no report", {}
        problems = []
        resumed = None
        if resume_dirs is not None:
            straight, again = resume_dirs
            resumed_report = again.with_suffix(".json")
            if not resumed_report.is_file():
                problems.append("the resumed run wrote no report")
            else:
                data["resumed"] = resumed = json.loads(resumed_report.read_text())
                data["resume"] = compare_resumed(straight, again, straight / "checkpoint-2")
                problem = resume_problem(data["resume"], cpu)
                if problem:
                    problems.append(problem)
                if resumed.get("steps_this_process") != [3]:
                    problems.append(f"the resumed run ran steps {resumed.get('steps_this_process')}, not step 3 alone")
        expected_type, expected_stage = EXPECTED.get(config, (None, None))
        if (
            not cpu
            and expected_type
            and (data["distributed_type"], data["zero_stage"]) != (expected_type, expected_stage)
        ):
            problems.append(
                f"ran as {data['distributed_type']} (stage {data['zero_stage']}), expected {expected_type}"
            )
        if not data["losses_finite"] or data["global_step"] < 2:
            problems.append(f"steps {data['global_step']}, losses {data['losses']}")
        if not data["saved"]:
            problems.append("no model saved")
        if returncode:
            problems.append(f"exit {returncode}")
        stage = f" stage {data['zero_stage']}" if data["zero_stage"] else ""
        fsdp = f" v{data['fsdp_version']}" if data.get("fsdp_version") else ""
        summary = (
            f"{data['distributed_type']}{stage}{fsdp}, {data['mixed_precision']}, {data['attention']}, "
            f"{data['device']}: {data['global_step']} steps, loss {data['losses'][-1] if data['losses'] else None}, "
            f"saved {', '.join(data['saved']) or 'nothing'}"
        )
        resume = data.get("resume") or {}
        if resumed is not None and resume.get("same_names"):
            moved = resume["step3_moved"]
            summary += (
                f"; resumed at 2 to {resumed['global_step']}: {resume['equal_tensors']} of {resume['tensors']} tensors "
                f"equal, max diff {resume['max_abs_diff']:.1e}"
                + (f" (step 3 moved {moved:.1e})" if moved is not None else "")
            )
        if problems:
            summary += "; " + "; ".join(problems)
        return ("FAIL" if problems else "ok"), summary, data

    return parse


# ---------------------------------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------------------------------


def sections(cpu: bool, quick: bool, scratch: Path) -> list[Section]:
    py = sys.executable
    plan = [
        Section(
            "bench",
            [py, str(BENCH / "bench_gpu_step.py")]
            + (
                # The CPU run checks the code path: tiny widths, a short batch
                [
                    "--tiny",
                    "--steps",
                    "1",
                    "--warmup",
                    "1",
                    "--completions",
                    "4",
                    "--completion_length",
                    "32",
                    "--image_side",
                    "112",
                ]
                if cpu
                # Warm-up for every method before any is timed, three rotated rounds, at 256 and 1,024 tokens
                else ["--steps", "1", "--warmup", "1", "--rounds", "3", "--completion_length", "256", "1024"]
            ),
            parse_bench,
            timeout=400,
            alone=True,
        ),
        Section(
            "perturbed",
            [py, str(BENCH / "bench_perturbed.py")]
            # On a GPU at Qwen2.5-VL-3B's dimensions: 1,024 visual tokens, 256-token completions, 4 and 8 generations
            + (["--quick"] if cpu else ["--model", "3b", "--rounds", "3"]),
            parse_perturbed,
            timeout=400,
            alone=True,
        ),
        *[
            Section(
                f"perturbed:{sharding}",
                # The same on the sharded model (one process on one GPU takes ZeRO-3's / FSDP2's gathers)
                [
                    py,
                    str(BENCH / "bench_perturbed.py"),
                    "--model",
                    "3b",
                    "--rounds",
                    "3",
                    "--sharding",
                    sharding,
                    "--processes",
                    "1",
                    "--sharded_only",
                ],  # fmt: skip
                parse_perturbed,
                timeout=400,
                alone=True,
                skip="on two CPU processes in tests/test_benchmarks.py" if cpu else None,
            )
            for sharding in ("zero3", "fsdp2")
        ],
        Section(
            "families",
            [py, str(BENCH / "gpu_families.py")]
            + (["--cpu"] if cpu else [])
            # CI's CPU run checks the section's path on one family: tests/test_families.py trains every family
            + (["--families", "llava-next"] if cpu and quick else []),
            parse_families,
        ),
        Section(
            "smoke",
            [py, str(BENCH / "gpu_smoke.py"), "--quick"] + (["--cpu"] if cpu else []),
            parse_smoke,
        ),
        Section(
            "notebook",
            [py, str(BENCH / "notebook_memory.py")] + (["--tiny", "--steps", "1"] if cpu else []),
            parse_notebook,
        ),
        Section(
            "real_width",
            [py, str(BENCH / "real_width_check.py")]
            + (
                [
                    "--device",
                    "cpu",
                    "--model",
                    "3b",
                    "--layers",
                    "1",
                    "--vision_depth",
                    "1",
                    "--completion_length",
                    "8",
                ]
                if cpu
                else ["--device", "cuda", "--model", "7b"]
            ),  # fmt: skip
            parse_real_width,
        ),
    ]
    attention = attention_implementation()
    for port, config in enumerate(CONFIGS, start=29611):
        name = config.stem
        deepspeed = "zero" in name
        skip = None
        if cpu and deepspeed:
            skip = "accelerate runs DeepSpeed on an accelerator only"
        elif deepspeed and importlib.util.find_spec("deepspeed") is None:
            skip = "deepspeed is not installed (benchmarks/gpu_prepare.py carries it)"
        output_dir, again = scratch / f"launch-{name}", scratch / f"launch-{name}-resumed"
        report = scratch / f"launch-{name}.json"

        def launch(folder, config=config, port=port):
            argv = [py, "-m", "accelerate.commands.launch", "--config_file", str(config), "--num_processes", "1",
                    "--main_process_port", str(port)]  # fmt: skip
            if cpu:
                argv += ["--cpu", "--mixed_precision", "no"]
            # A reward that varies on the random model, so that every step moves the weights
            argv += [str(BENCH / "launch_probe.py"), "--config", str(TINY_RECIPE), "--output_dir", str(folder),
                     "--max_steps", "3", "--save_strategy", "steps", "--save_steps", "2", "--logging_steps", "1",
                     "--synthetic_rows", "16", "--selection_samples_steps", "0", "--disable_tqdm", "true",
                     "--reward_funcs", "launch_probe_length", "--reward_weights", "1.0",
                     "--attn_implementation", attention]  # fmt: skip
            return argv + (
                ["--use_cpu", "true", "--bf16", "false"] if cpu else ["--use_cpu", "false", "--bf16", "true"]
            )

        def stopped_after_step_2(straight=output_dir, folder=again):
            # What a run killed after its second step leaves: its record and checkpoint-2
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copy(straight / "vepo_run.json", folder)
            shutil.copytree(straight / "checkpoint-2", folder / "checkpoint-2")

        plan.append(
            Section(
                f"launch:{name}",
                launch(output_dir),
                make_parse_launch(name, report, (output_dir, again)),
                env={"VEPO_LAUNCH_REPORT": str(report)},
                skip=skip,
                then=[(stopped_after_step_2, launch(again), {"VEPO_LAUNCH_REPORT": str(again.with_suffix(".json"))})],
            )  # fmt: skip
        )
    return plan


def run_section(section: Section, cpu: bool, threads: int, deadline: float) -> Result:
    if section.skip:
        return Result(section.name, "skipped", 0.0, section.skip, {})
    timeout = max(1.0, min(section.timeout, deadline - time.monotonic()))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads), **section.env}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    start = time.monotonic()
    output, returncode = "", 0
    for prepare, argv, extra in [(None, section.argv, {}), *section.then]:
        if prepare is not None:
            try:
                prepare()
            except OSError as error:  # what the step before should have left is missing: the section fails
                output, returncode = output + f"\n{type(error).__name__}: {error}\n", 1
                break
        process = subprocess.Popen(argv, cwd=ROOT, env={**env, **extra}, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
        try:
            out, _ = process.communicate(timeout=max(1.0, timeout - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # accelerate's children too
            output += process.communicate()[0]
            seconds = time.monotonic() - start
            return Result(section.name, "timeout", seconds, f"stopped after {seconds:.0f} s", {}, output)
        output += out
        returncode = process.returncode
        if returncode:
            break
    seconds = time.monotonic() - start
    try:
        status, summary, figures = section.parse(output, returncode, cpu)
    except Exception as error:  # a changed output format is a failure to report, not a crash of the whole run
        status, summary, figures = "FAIL", f"unreadable output ({type(error).__name__}: {error})", {}
    if status == "FAIL" and summary == "no result":
        tail = [line for line in output.strip().splitlines() if line.strip()][-1:] or [""]
        summary = f"exit {returncode}: {tail[0][:160]}"
    return Result(section.name, status, seconds, summary, figures, output)


def environment(cpu: bool) -> dict:
    import torch

    versions = {}
    for name in ("torch", "transformers", "trl", "accelerate", "peft", "deepspeed", "datasets"):
        try:
            versions[name] = __import__(name).__version__
        except Exception:  # not installed, or broken: say so
            versions[name] = None
    cuda = not cpu and torch.cuda.is_available()
    return {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "gpu_memory_gb": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1) if cuda else None,
        "cuda": torch.version.cuda if cuda else None,
        "bf16": bool(cuda and torch.cuda.is_bf16_supported()),
        "attention": attention_implementation(),
        "python": sys.version.split()[0],
        "versions": versions,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="run the sections on the CPU (fp32)")
    parser.add_argument("--quick", action="store_true", help="smaller sections (with --cpu: what CI runs)")
    parser.add_argument("--only", default=None, help="comma-separated section names (launch:* matches prefixes)")
    parser.add_argument("--jobs", type=int, default=None, help="sections run at once after the timed one "
                        "(default: 4 on a GPU, 1 on the CPU)")  # fmt: skip
    parser.add_argument("--budget", type=float, default=450.0, help="seconds for the whole run; sections still "
                        "running then are stopped and reported as timeouts")  # fmt: skip
    parser.add_argument("--out", type=Path, default=ROOT / "gpu-acceptance", help="folder for the log and JSON")
    args = parser.parse_args()
    import torch

    if not args.cpu and not torch.cuda.is_available():
        sys.exit("gpu_acceptance.py: no CUDA device; pass --cpu (with --quick for CI's size) to run on the CPU")
    jobs = args.jobs or (1 if args.cpu else 4)
    threads = max(1, (os.cpu_count() or 1) // jobs)
    deadline = time.monotonic() + args.budget
    info = environment(args.cpu)
    print(f"device {info['device']}" + (f" ({info['gpu_memory_gb']} GiB, CUDA {info['cuda']})" if info["cuda"] else "")
          + f"; attention {info['attention']}; Python {info['python']}; "
          + ", ".join(f"{k} {v}" for k, v in info["versions"].items()), flush=True)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        plan = sections(args.cpu, args.quick, Path(scratch))
        if args.only:
            wanted = args.only.split(",")
            plan = [s for s in plan if any(s.name == w or s.name.startswith(w.rstrip("*")) for w in wanted)]
        results: dict[str, Result] = {}

        def run(section):
            result = run_section(section, args.cpu, threads if not section.alone else os.cpu_count() or 1, deadline)
            results[section.name] = result
            print(f"  {result.status:<7} {result.seconds:6.1f} s  {section.name}", flush=True)
            return result

        for section in [s for s in plan if s.alone]:
            run(section)
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(run, [s for s in plan if not s.alone]))
    ordered = [results[s.name] for s in plan]
    with open(args.out / "acceptance.log", "w") as log:
        for result in ordered:
            log.write(
                f"\n{'=' * 30} {result.name}: {result.status} in {result.seconds:.1f} s {'=' * 30}\n{result.log}"
            )
    width = max(len(r.name) for r in ordered) if ordered else 8
    print(f"\n{'section':<{width}}  {'status':<7} {'seconds':>7}  result")
    for result in ordered:
        print(f"{result.name:<{width}}  {result.status:<7} {result.seconds:7.1f}  {result.summary}")
    passed = all(r.status in ("ok", "skipped") for r in ordered)
    total = time.monotonic() - start
    print(f"{'all sections passed' if passed else 'FAILED'} in {total:.0f} s on {info['device']}; "
          f"full logs in {args.out / 'acceptance.log'}")  # fmt: skip
    summary = {
        **info,
        "mode": ("cpu" if args.cpu else "gpu") + ("-quick" if args.quick else ""),
        "passed": passed,
        "seconds": round(total, 1),
        "sections": {
            r.name: {"status": r.status, "seconds": round(r.seconds, 1), "summary": r.summary, "figures": r.figures}
            for r in ordered
        },  # fmt: skip
    }
    (args.out / "acceptance.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
