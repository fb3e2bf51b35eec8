"""The perturbed pass with each prompt read once against every row's whole sequence, and VEPO's step against top-k
entropy's.

All `num_generations` completions of a prompt see the same perturbed image, so the perturbed forward can read the
prompt (vision tower and prompt tokens) once and run only the completions per row (`vepo_trl.prompt_cache`). Here, on
the tiny Qwen2.5-VL widened for it (hidden 256, 4 layers; vision tower 2 blocks of 64), a prompt of about 1,000 visual
tokens (an 896 x 896 image: 1,024) and completions of 256 tokens, at 4 and 8 generations:

- the perturbed pass (`PerturbedPass.perturbed_hidden`: the images perturbed, then the no-grad forward) shared and
  whole, rounds in rotated order, with the token positions each forward runs per completion;
- the largest difference of the signals (JSD, entropies) between the two, over the batch's tokens;
- one whole RL step of VEPO and of top-20% entropy at 8 generations: the rollout (`generate`, exactly 256 new tokens
  per completion), `compute_loss` on the batch (VEPO's mask made at first use: its perturbed forward and signals) and
  the backward pass, rotated and interleaved as `bench_gpu_step.py` does, the ratio taken within each round.

    python benchmarks/bench_perturbed.py            # the shape above; about 4 minutes on two CPU cores
    python benchmarks/bench_perturbed.py --quick    # the same code on small shapes (the test suite runs it)
    python benchmarks/bench_perturbed.py --model 3b --rounds 3   # on a GPU: Qwen2.5-VL-3B's dimensions in bf16
                                                                 # (random weights; the GPU acceptance's section)
    python benchmarks/bench_perturbed.py --sharding zero3        # the same on two processes with sharded weights
                                                                 # (zero3 or fsdp2; gloo on CPUs, NCCL on two GPUs)

The last line is one JSON object: `perturbed_time_ratio_g4`, `perturbed_time_ratio_g8` (shared / whole, medians),
`vepo_over_entropy` (at 8 generations), `max_signal_diff`, and the figures behind them. With `--sharding`, the first
run is the one-process measurement (under `one_process`), then two processes run the perturbed pass on the sharded
model inside a training step (every parameter gathered per forward, as ZeRO-3 / FSDP2 do), each with the same batch;
their RL step is whole `trainer.train()` steps (TRL's generation of exactly the completion length, `compute_loss`,
backward and optimiser through accelerate), VEPO / top-20% entropy step by step.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
import warnings

import torch
from transformers import TrainerCallback


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_gpu_step import QWEN_3B, build_model, make_batch, rotations, spread  # noqa: E402

from vepo_trl import VEPOConfig, VEPOTrainer  # noqa: E402
from vepo_trl.batch import Batch, sequence, take_rows  # noqa: E402
from vepo_trl.builtin.tiny_models import build_processor, build_tiny  # noqa: E402
from vepo_trl.data import synthetic_training_dataset  # noqa: E402
from vepo_trl.prompt_cache import continuation_forwards, row_groups  # noqa: E402
from vepo_trl.scoring import TokenSignals  # noqa: E402


WIDE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            vision_hidden_size=64, vision_depth=2, vision_num_heads=2, initializer_range=0.05)  # fmt: skip
# Completion tokens drawn below the tiny tokenizer's special tokens
VOCAB_LIMIT = 500
METHODS = {"entropy_top20": {"selection_strategy": "entropy"}, "vepo": {"selection_strategy": "vepo"}}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="Small shapes: a 224 px image, 16-token completions.")
    parser.add_argument("--image_side", type=int, default=896, help="Image side in pixels (896: 1,024 visual tokens).")
    parser.add_argument("--completion_length", type=int, default=256)
    parser.add_argument("--generations", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--rounds", type=int, default=5, help="Rounds of each comparison, order rotated.")
    parser.add_argument("--model", choices=["wide", "3b"], default="wide",
                        help="wide: the tiny Qwen2.5-VL widened (fp32); 3b: Qwen2.5-VL-3B's dimensions (bf16 on a GPU, "
                        "random weights, as bench_gpu_step.py).")  # fmt: skip
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sharding", choices=["none", "zero3", "fsdp2"], default="none",
                        help="Also measure on two processes with the weights sharded this way.")  # fmt: skip
    parser.add_argument("--processes", type=int, default=2,
                        help="Processes of the sharded run (1: ZeRO-3 / FSDP2 on one GPU still takes the path).")  # fmt: skip
    parser.add_argument("--sharded_only", action="store_true", help="With --sharding: skip the one-process run.")
    parser.add_argument("--worker_report", help=argparse.SUPPRESS)
    parser.add_argument("--worker_phase", help=argparse.SUPPRESS)  # a sharded worker's JSON (rank 0 writes it)
    args = parser.parse_args(argv)
    if args.quick:
        args.image_side, args.completion_length, args.rounds = 224, 16, 2
    if sorted(args.generations) != sorted(set(args.generations)) or min(args.generations) < 2:
        parser.error("--generations: distinct values of at least 2")
    return args


def make_trainer(model, processor, generations, length, settings, output_dir, reward=None):
    cuda = next(model.parameters()).device.type == "cuda"
    settings = {"use_cpu": not cuda, "bf16": cuda, **settings}
    config = VEPOConfig(output_dir=output_dir, per_device_train_batch_size=generations, num_generations=generations,
                        max_completion_length=length, selection_ratio=0.2, loss_type="bnpo", report_to="none",
                        log_selection_diagnostics=False, **settings)  # fmt: skip
    reward = reward or (lambda completions, **_: [0.0] * len(completions))
    trainer = VEPOTrainer(model=model, reward_funcs=reward, args=config,
                          train_dataset=synthetic_training_dataset(4, seed=0), processing_class=processor)  # fmt: skip
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def perturbed_inputs(batch):
    """What `PerturbedPass.score_rows` hands the perturbed pass for every row of `batch`."""
    ids, mask = sequence(batch)
    return ids, mask, batch["completion_ids"].size(1), take_rows(batch, torch.arange(ids.size(0)))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_perturbed(trainer, batch, rounds):
    """Median seconds of the perturbed forward, shared and whole, rotated; token positions per completion each."""
    passes = trainer.perturbed_pass
    ids, mask, length, row_inputs = perturbed_inputs(batch)
    seconds = {True: [], False: []}
    positions = {}
    ratios = []

    groups = len(set(row_groups(Batch.of(batch)).values()))
    slices = continuation_forwards(passes.widths(), rows=ids.size(0), prompts=groups, prompt_length=ids.size(1) - length,
                                   length=length, budget_rows=ids.size(0))  # fmt: skip
    assert slices is not None, "the shape does not fit the memory bound: no prompt sharing to time"

    def run(shared):
        passes.share_prompts = shared
        before = passes.num_positions
        sync(ids.device)
        start = time.perf_counter()
        passes.perturbed_hidden(trainer.model, ids, mask, length, row_inputs, slices if shared else None)
        sync(ids.device)
        elapsed = time.perf_counter() - start
        positions[shared] = (passes.num_positions - before) / ids.size(0)
        return elapsed

    run(True), run(False)  # warm-up
    for order in rotations([True, False], rounds):
        this_round = {shared: run(shared) for shared in order}
        for shared, value in this_round.items():
            seconds[shared].append(value)
        ratios.append(this_round[True] / this_round[False])
    passes.share_prompts = True
    return seconds, positions, ratios


def signal_difference(trainer, batch):
    """Largest |shared - whole| of the JSD and both entropies over the batch's completion tokens."""
    passes, pipeline = trainer.perturbed_pass, trainer.selection_pipeline
    with torch.no_grad(), passes.capture(trainer.model) as captured:
        logps, entropies, _ = pipeline.batch_forward(trainer.model, batch, scoring=True)
    length = batch["completion_ids"].size(1)
    hidden = torch.cat(captured)[:, -length - 1 : -1]
    valid = batch["completion_mask"].bool()
    rows = valid.any(-1)
    out = {}
    for shared in (True, False):
        passes.share_prompts = shared
        out[shared] = passes.signals_for_rows(batch, TokenSignals(entropy=entropies.float(), logp=logps.float()),
                                              rows, lambda i: hidden[i][valid[i]], rows.numel(),
                                              {"jsd", "entropy", "perturbed_entropy"})  # fmt: skip
    passes.share_prompts = True
    return max(
        float((getattr(out[True], name) - getattr(out[False], name))[valid].abs().max())
        for name in ("jsd", "entropy", "perturbed_entropy")
    )


def rl_step(trainer, processor, batch, length):
    """One RL step's compute: the rollout (`generate`, `length` new tokens per completion), `compute_loss` on the
    batch (a fresh copy: the mask is made at first use) and the backward pass. Seconds."""
    model = trainer.model
    prompt = {"input_ids": batch["prompt_ids"], "attention_mask": batch["prompt_mask"],
              "pixel_values": batch["pixel_values"], "image_grid_thw": batch["image_grid_thw"]}  # fmt: skip
    if "mm_token_type_ids" in batch:
        prompt["mm_token_type_ids"] = batch["mm_token_type_ids"][:, : batch["prompt_ids"].size(1)]
    device = batch["prompt_ids"].device
    sync(device)
    start = time.perf_counter()
    model.eval()
    with torch.no_grad(), trainer.accelerator.autocast():
        model.generate(**prompt, max_new_tokens=length, min_new_tokens=length, do_sample=True, use_cache=True,
                       pad_token_id=processor.tokenizer.pad_token_id)  # fmt: skip
    model.train()
    loss = trainer.compute_loss(model, copy.copy(batch))
    loss.backward()
    model.zero_grad(set_to_none=True)
    sync(device)
    return time.perf_counter() - start


def build(args, device):
    torch.manual_seed(0)
    if args.model == "3b":
        processor = build_processor()
        side = args.image_side**2
        processor.image_processor.min_pixels = processor.image_processor.max_pixels = side
        processor.image_processor.size = {"shortest_edge": side, "longest_edge": side}
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        model = build_model(processor, QWEN_3B, device, dtype)
        model.config.use_cache = True
    else:
        model, processor = build_tiny("qwen2.5-vl", **WIDE, max_pixels=args.image_side**2)
        model.to(device)
    return model, processor


def perturbed_figures(figures, generations, trainer, batch, rounds):
    """Time the shared and whole perturbed pass on `batch` and compare their signals, into `figures`."""
    prompt_length = batch["prompt_ids"].size(1)
    length = batch["completion_ids"].size(1)
    visual = int(batch["image_grid_thw"][0].prod()) // 4
    seconds, positions, ratios = time_perturbed(trainer, batch, rounds)
    shared, whole = statistics.median(seconds[True]), statistics.median(seconds[False])
    ratio = spread(ratios)
    print(f"{generations} generations: prompt {prompt_length} tokens ({visual} visual), completions {length}; "
          f"perturbed forward shared {shared:.3f} s ({positions[True]:.0f} positions per completion), whole "
          f"{whole:.3f} s ({positions[False]:.0f}); shared / whole median {ratio['median']:.3f} "
          f"(spread {ratio['min']:.3f}-{ratio['max']:.3f})")  # fmt: skip
    figures[f"perturbed_time_ratio_g{generations}"] = ratio["median"]
    figures[f"perturbed_time_ratio_g{generations}_spread"] = [ratio["min"], ratio["max"]]
    figures[f"perturbed_seconds_g{generations}"] = {"shared": shared, "whole": whole}
    figures[f"positions_per_completion_g{generations}"] = {"shared": positions[True], "whole": positions[False]}
    figures["prompt_tokens"], figures["visual_tokens"] = prompt_length, visual
    difference = signal_difference(trainer, batch)
    figures["max_signal_diff"] = max(figures.get("max_signal_diff", 0.0), difference)
    print(f"  signals (JSD, entropies) shared vs whole: largest difference {difference:.2e}")


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.worker_report:
        return sharded_worker(args)
    if args.sharded_only and args.sharding != "none":
        figures = run_sharded(args, argv)
        print(json.dumps(figures))
        return figures
    device = torch.device(args.device)
    model, processor = build(args, device)
    length = args.completion_length
    figures: dict = {"model": args.model, "device": str(device), "image_side": args.image_side,
                     "completion_length": length, "rounds": args.rounds}  # fmt: skip
    with tempfile.TemporaryDirectory() as output_dir:
        for generations in args.generations:
            batch = make_batch(processor, device, generations, length, args.image_side, VOCAB_LIMIT)
            trainer = make_trainer(model, processor, generations, length, METHODS["vepo"], output_dir)
            perturbed_figures(figures, generations, trainer, batch, args.rounds)
        generations = max(args.generations)
        batch = make_batch(processor, device, generations, length, args.image_side, VOCAB_LIMIT)
        trainers = {name: make_trainer(model, processor, generations, length, settings, output_dir)
                    for name, settings in METHODS.items()}  # fmt: skip
        for trainer in trainers.values():
            rl_step(trainer, processor, batch, length)  # warm-up
        steps = {name: [] for name in trainers}
        step_ratios = []
        for order in rotations(list(trainers), args.rounds):
            this_round = {name: rl_step(trainers[name], processor, batch, length) for name in order}
            for name, value in this_round.items():
                steps[name].append(value)
            step_ratios.append(this_round["vepo"] / this_round["entropy_top20"])
        ratio = spread(step_ratios)
        medians = {name: statistics.median(values) for name, values in steps.items()}
        print(f"RL step at {generations} generations (rollout + compute_loss + backward): "
              f"VEPO {medians['vepo']:.2f} s, top-20% entropy {medians['entropy_top20']:.2f} s; "
              f"VEPO / entropy median {ratio['median']:.3f} (spread {ratio['min']:.3f}-{ratio['max']:.3f})")  # fmt: skip
        figures["vepo_over_entropy"] = ratio["median"]
        figures["vepo_over_entropy_spread"] = [ratio["min"], ratio["max"]]
        figures["step_seconds"] = medians
    if args.sharding != "none":
        figures = {**run_sharded(args, argv), "one_process": figures}
    print(json.dumps(figures))
    return figures


# -- two processes, sharded weights ------------------------------------------------------------------------------------


def run_sharded(args, argv) -> dict:
    """This script's worker on `--processes` processes (`torch.distributed.run`), once per measurement (a process
    holds one sharded trainer: DeepSpeed's ZeRO-3 set-up is process-wide); rank 0's figures, merged."""
    import subprocess

    figures: dict = {}
    phases = [f"perturbed:{generations}" for generations in args.generations] + [f"step:{name}" for name in METHODS]
    with tempfile.TemporaryDirectory() as folder:
        for number, phase in enumerate(phases):
            report = os.path.join(folder, f"report-{number}.json")
            command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.processes),
                       "--master_port", str(29_500 + (os.getpid() + number) % 1_000), os.path.abspath(__file__),
                       *(argv if argv is not None else sys.argv[1:]), "--worker_report", report, "--worker_phase",
                       phase]  # fmt: skip
            threads = max(1, (os.cpu_count() or 2) // args.processes)
            subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
            with open(report) as file:
                part = json.load(file)
            steps = part.pop("steps", None)
            if steps is not None:
                figures.setdefault("steps", {})[phase.split(":")[1]] = steps
            figures["max_signal_diff"] = max(figures.get("max_signal_diff", 0.0), part.pop("max_signal_diff", 0.0))
            figures.update(part)
    steps = figures.pop("steps")
    ratios = [vepo / entropy for vepo, entropy in zip(steps["vepo"], steps["entropy_top20"])]
    ratio = spread(ratios)
    print(f"RL step at {max(args.generations)} generations on {args.processes} processes ({args.sharding}; "
          f"trainer.train: generation, compute_loss, backward, optimiser): VEPO / entropy median {ratio['median']:.3f} "
          f"(spread {ratio['min']:.3f}-{ratio['max']:.3f})")  # fmt: skip
    figures["vepo_over_entropy"] = ratio["median"]
    figures["vepo_over_entropy_spread"] = [ratio["min"], ratio["max"]]
    figures["step_seconds"] = {name: statistics.median(values) for name, values in steps.items()}
    return figures


def varied_reward(completions, **_):
    """Rewards that differ within a group, so every response has a non-zero advantage and VEPO scores it."""
    return [float(sum(map(ord, completion[0]["content"])) % 7) for completion in completions]


def sharded_worker(args) -> dict:
    """One process of a sharded run, one measurement (`--worker_phase`): `perturbed:G`, the perturbed pass timed and
    compared inside the first training step of the sharded model at G generations; `step:METHOD`, `--rounds` + 1 RL
    steps of a method through `trainer.train()` (the first warms up)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from accelerate import PartialState

    from tests.distributed.trainer_ranks import force_sharding

    sharding = force_sharding(args.sharding)
    if torch.cuda.is_available():  # the test set-up's CPU settings give way to the GPU's
        sharding.pop("use_cpu", None)
        if "deepspeed" in sharding:
            sharding["deepspeed"]["bf16"] = {"enabled": "auto"}
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", rank) if torch.cuda.is_available() else torch.device("cpu")
    length = args.completion_length
    figures: dict = {"model": args.model, "device": str(device), "image_side": args.image_side,
                     "completion_length": length, "rounds": args.rounds, "sharding": args.sharding}  # fmt: skip
    kind, value = args.worker_phase.split(":")
    model, processor = build(args, device)
    with tempfile.TemporaryDirectory() as output_dir:
        if kind == "perturbed":
            generations = int(value)
            batch = make_batch(processor, device, generations, length, args.image_side, VOCAB_LIMIT)
            trainer = make_trainer(model, processor, generations, length,
                                   {**METHODS["vepo"], **sharding, "max_steps": 1}, output_dir)  # fmt: skip

            def measure(*a, **k):
                perturbed_figures(figures, generations, trainer, batch, args.rounds)
                raise Measured  # every process at the same point: the step's backward is not this phase's

            trainer.compute_loss = measure
            try:
                trainer.train()
            except Measured:
                pass
        else:
            generations = max(args.generations)
            trainer = make_trainer(model, processor, generations, length,
                                   {**METHODS[value], **sharding, "max_steps": args.rounds + 1, "learning_rate": 1e-9,
                                    "generation_kwargs": {"min_new_tokens": length}}, output_dir,
                                   reward=varied_reward)  # fmt: skip
            timer = StepTimer(device)
            trainer.add_callback(timer)
            trainer.train()
            figures["steps"] = timer.seconds[1:]
        state = PartialState()
        figures["processes"] = state.num_processes
        figures["distributed_type"] = str(trainer.accelerator.distributed_type)
    if state.is_main_process:
        with open(args.worker_report, "w") as file:
            json.dump(figures, file)
    state.wait_for_everyone()
    return figures


class Measured(Exception):
    """The perturbed pass was measured inside the first training step; the step stops there."""


class StepTimer(TrainerCallback):
    """Seconds of each optimiser step, from its start to its end."""

    def __init__(self, device):
        self.device, self.seconds, self.start = device, [], 0.0

    def on_step_begin(self, *a, **k):
        sync(self.device)
        self.start = time.perf_counter()

    def on_step_end(self, *a, **k):
        sync(self.device)
        self.seconds.append(time.perf_counter() - self.start)


if __name__ == "__main__":
    main()
