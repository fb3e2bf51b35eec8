"""A long run, killed and requeued: does it end where the uninterrupted run ends, with memory and step time flat?

Trains the CPU demo's recipe (`recipes/tiny/config_vepo.yaml`: VEPO on the tiny Qwen2.5-VL, the rollout cache at its
default) for `--steps` steps with a checkpoint every `--save_steps`, twice, each as a user starts it
(`python -m vepo_trl train ...`, a fresh process):

- uninterrupted, sampling the process's resident memory (VmRSS) as it runs;
- interrupted `--interruptions` times at random moments (SIGTERM, as a scheduler's preemption sends it, or SIGKILL, as
  the OOM killer or a lost node leaves it: a kill can land in the middle of a save), each followed by the very same
  command, as `sbatch --requeue` reruns it, until the run finishes.

Prints the figures and, last, one JSON line: steps, interruptions (by signal), how many reruns resumed from a
checkpoint and how many checkpoints a kill left incomplete (set aside on the rerun), the largest weight difference
between the two final models (0.0: the same weights), resident memory at the start and the end of the uninterrupted
run, and the median step time of its first and last quarter.

    python benchmarks/soak.py                          # 300 steps, a checkpoint every 5, 8 interruptions
    python benchmarks/soak.py --steps 16 --save_steps 4 --interruptions 2 --quick   # the suite's short form
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "tiny" / "config_vepo.yaml"


def command(output_dir: Path, steps: int, save_steps: int, extra: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "vepo_trl", "train", "--config", str(RECIPE), "--output_dir", str(output_dir),
        "--max_steps", str(steps), "--save_strategy", "steps", "--save_steps", str(save_steps),
        "--logging_steps", "1", "--disable_tqdm", "true", "--report_to", "none", *extra,
    ]  # fmt: skip


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def uninterrupted(
    folder: Path, steps: int, save_steps: int, extra: list[str], log
) -> tuple[list[float], float, float]:
    """Runs to the end, sampling VmRSS every 0.2 s. Returns the samples taken once training started (the first
    checkpoint is written: model and data are loaded), the seconds to that first checkpoint and in all."""
    samples, first = [], None
    start = time.monotonic()
    process = subprocess.Popen(command(folder, steps, save_steps, extra), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, env=environment())  # fmt: skip
    while process.poll() is None:
        value = rss_mib(process.pid)
        if first is None and any(folder.glob("checkpoint-*")):
            first = time.monotonic() - start
        if value is not None and first is not None:
            samples.append(value)
        time.sleep(0.2)
    err = process.stderr.read()
    if process.returncode != 0:
        raise SystemExit(f"the uninterrupted run failed ({process.returncode}):\n{err[-3000:]}")
    total = time.monotonic() - start
    log(f"uninterrupted: {steps} steps in {total:.0f} s (first checkpoint at {first or 0:.0f} s)")
    return samples, first or total, total


def interrupted(folder: Path, steps: int, save_steps: int, extra: list[str], interruptions: int, rng, log,
                timing: tuple[float, float]) -> dict:  # fmt: skip
    """Kills the run `interruptions` times at random moments, rerunning the same command after each, until it
    finishes; returns what happened."""
    kills = {"SIGTERM": 0, "SIGKILL": 0}
    resumed = set_aside = 0
    launches = 0
    while True:
        launches += 1
        if launches > interruptions + 20:
            raise SystemExit("the interrupted run did not finish after 20 plain reruns")
        process = subprocess.Popen(command(folder, steps, save_steps, extra), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=environment())  # fmt: skip
        killed = None
        if sum(kills.values()) < interruptions:
            # A moment from late in start-up (model and data loading) to a share of the training the uninterrupted run
            # took, so that a kill lands before training, during a step or during a save and each rerun goes on
            first, total = timing
            deadline = time.monotonic() + rng.uniform(0.7 * first, first + (total - first) / (interruptions + 1))
            while process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if process.poll() is None:
                killed = rng.choice(["SIGTERM", "SIGKILL"])
                process.send_signal(getattr(signal, killed))
        try:
            out, err = process.communicate(timeout=1800)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise SystemExit(f"run {launches} hung past 30 minutes: killed") from None
        resumed += "Resuming from" in out + err
        set_aside += (out + err).count("incomplete (a save cut short)")
        if killed is not None and process.returncode != 0:
            kills[killed] += 1
            log(f"run {launches}: {killed} (exit {process.returncode})")
            continue
        if process.returncode != 0:
            raise SystemExit(f"a rerun failed ({process.returncode}):\n{err[-3000:]}")
        log(f"run {launches}: finished")
        break
    return {"interruptions": kills, "reruns_resumed": resumed, "incomplete_checkpoints_set_aside": set_aside}


def final_weights(folder: Path) -> Path:
    """The run's model: `model.safetensors` in its folder, or, where a kill landed in the final save (the rerun then
    says the run is finished and its last checkpoint's weights are the model), the last checkpoint's."""
    if (folder / "model.safetensors").is_file():
        return folder / "model.safetensors"
    from transformers.trainer_utils import get_last_checkpoint

    last = get_last_checkpoint(str(folder))
    if last is None or not (Path(last) / "model.safetensors").is_file():
        raise SystemExit(f"{folder} holds no model and no checkpoint with one")
    return Path(last) / "model.safetensors"


def weight_difference(a: Path, b: Path) -> float:
    from safetensors.torch import load_file

    left, right = load_file(str(final_weights(a))), load_file(str(final_weights(b)))
    if left.keys() != right.keys():
        return float("inf")
    return max(float((left[k].double() - right[k].double()).abs().max()) for k in left)


def step_times(folder: Path) -> list[float]:
    state = json.loads((folder / "trainer_state.json").read_text())
    return [entry["step_time"] for entry in state["log_history"] if "step_time" in entry]


def quarter_medians(values: list[float]) -> tuple[float, float]:
    quarter = max(len(values) // 4, 1)
    return statistics.median(values[:quarter]), statistics.median(values[-quarter:])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--save_steps", type=int, default=5)
    parser.add_argument("--interruptions", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0, help="seeds the moments and signals of the interruptions")
    parser.add_argument("--out", type=Path, help="folder for the two runs (default: a new temporary folder)")
    parser.add_argument(
        "--quick", action="store_true", help="shorter completions (16 tokens) and 2 prompts per step: the suite's form"
    )
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="vepo-soak-"))
    extra = ["--max_completion_length", "16"] if args.quick else []
    rng = random.Random(args.seed)

    def log(message: str) -> None:
        print(message, flush=True)

    start = time.perf_counter()
    memory, first, total = uninterrupted(out / "uninterrupted", args.steps, args.save_steps, extra, log)
    story = interrupted(
        out / "interrupted", args.steps, args.save_steps, extra, args.interruptions, rng, log, (first, total)
    )
    difference = weight_difference(out / "uninterrupted", out / "interrupted")
    times = step_times(out / "uninterrupted")
    first, last = quarter_medians(times) if times else (float("nan"), float("nan"))
    mem_first, mem_last = quarter_medians(memory) if memory else (float("nan"), float("nan"))
    figures = {
        "steps": args.steps,
        "save_steps": args.save_steps,
        "interruptions": story["interruptions"],
        "reruns_resumed": story["reruns_resumed"],
        "incomplete_checkpoints_set_aside": story["incomplete_checkpoints_set_aside"],
        "max_weight_difference": difference,
        "rss_mib_first_quarter": round(mem_first, 1),
        "rss_mib_last_quarter": round(mem_last, 1),
        "step_time_s_first_quarter": round(first, 4),
        "step_time_s_last_quarter": round(last, 4),
        "seconds": round(time.perf_counter() - start, 1),
    }
    log(f"largest weight difference, interrupted vs uninterrupted: {difference:.3g}")
    log(f"resident memory (median, MiB): first quarter {mem_first:.1f}, last quarter {mem_last:.1f}")
    log(f"step time (median, s): first quarter {first:.3f}, last quarter {last:.3f}")
    print(json.dumps(figures))
    return 0 if difference == 0.0 else 1


if __name__ == "__main__":
    sys.exit(main())
