"""One training step at the paper's shapes: GRPO (all tokens), top-20% entropy and VEPO, timed by phase.

A randomly initialised Qwen2.5-VL with the 3B model's dimensions (36 layers, hidden 2048, vocabulary 151,936; vision
tower 32 blocks of 1280) in bf16, a 448x448 image (256 visual tokens), 8 completions of 256 and of 1,024 tokens. A
timed step is `VEPOTrainer.compute_loss` on a fresh batch (so VEPO runs its perturbed forward, as on a batch's first
use) and the backward pass.

So that the ratios hold from one run to the next, every method is warmed up before any is timed, then the methods run
in rounds whose order rotates (each method first, middle and last once in three rounds), and the ratios VEPO / full
GRPO and VEPO / top-20% entropy are taken within each round (the same clocks, the same allocator state) and printed as
median and spread. Per method it prints the medians of the step, `compute_loss`, the loss forward, the perturbed
forward, the signals (JSD, entropies in tiles) and the peak memory; then a no-grad forward for reference and the
issue's bound: VEPO's `compute_loss` <= top-20% entropy's + one no-grad forward + 10%. Last, one rollout with
transformers' `generate` (the batch's prompts, exactly that many tokens each) gives the share of a whole RL step that
VEPO adds, which is what a user waits for.

    python benchmarks/bench_gpu_step.py                     # CUDA; ~3 minutes on one H100
    python benchmarks/bench_gpu_step.py --tiny --steps 1 --warmup 1 --completion_length 32 --image_side 112
                                                            # the same code path on a CPU, tiny dimensions

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import statistics
import tempfile
import time
import warnings

import torch


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
warnings.filterwarnings("ignore")

import vepo_trl.perturbed_pass as perturbed_pass_module  # noqa: E402
from vepo_trl import VEPOConfig, VEPOTrainer  # noqa: E402
from vepo_trl.builtin.tiny_models import QWEN_SPECIAL_TOKENS, build_processor  # noqa: E402
from vepo_trl.data import synthetic_training_dataset  # noqa: E402


METHODS = {
    "grpo": {"selection_strategy": "full"},
    "entropy_top20": {"selection_strategy": "entropy", "selection_ratio": 0.2},
    "vepo": {"selection_strategy": "vepo", "selection_ratio": 0.2},
}
QWEN_3B = dict(hidden=2048, intermediate=11008, layers=36, heads=16, kv_heads=2, vocab=151936, vision_depth=32)
TINY = dict(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=151936, vision_depth=2)


def build_model(processor, dims, device, dtype):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    ids = {token: processor.tokenizer.convert_tokens_to_ids(token) for token in QWEN_SPECIAL_TOKENS}
    head_dim = dims["hidden"] // dims["heads"]
    unit = head_dim // 16
    vision_hidden = 1280 if dims is QWEN_3B else 32
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": dims["vocab"],
            "hidden_size": dims["hidden"],
            "intermediate_size": dims["intermediate"],
            "num_hidden_layers": dims["layers"],
            "num_attention_heads": dims["heads"],
            "num_key_value_heads": dims["kv_heads"],
            "max_position_embeddings": 32768,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1000000.0,
                "mrope_section": [2 * unit, 3 * unit, 3 * unit],
            },
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
            "tie_word_embeddings": dims is QWEN_3B,  # the 3B model ties its head to the embeddings
        },
        vision_config={
            "depth": dims["vision_depth"],
            "hidden_size": vision_hidden,
            "intermediate_size": 3420 if dims is QWEN_3B else 64,
            "num_heads": 16 if dims is QWEN_3B else 2,
            "out_hidden_size": dims["hidden"],
            "fullatt_block_indexes": [7, 15, 23, 31] if dims is QWEN_3B else [1],
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen2_5_VLForConditionalGeneration(config)
    finally:
        torch.set_default_dtype(previous)
    model.config.use_cache = False
    return model


def make_batch(processor, device, completions, completion_length, image_side, vocab_limit, seed=0):
    """A batch in the layout TRL's rollout hands `compute_loss`: one prompt with a 448 px image, G completions."""
    from PIL import Image

    generator = torch.Generator().manual_seed(seed)
    pixels = (torch.rand(image_side, image_side, 3, generator=generator) * 255).to(torch.uint8).numpy()
    image = Image.fromarray(pixels)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many shapes?"}]}]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    encoded = processor(images=[image], text=[text], return_tensors="pt")
    g = completions
    prompt_ids = encoded["input_ids"].repeat(g, 1)
    completion_ids = torch.randint(0, vocab_limit, (g, completion_length), generator=generator)
    # A sampled image or vision marker would be read as an image placeholder with no image behind it
    markers = ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"]
    marker_ids = torch.tensor(processor.tokenizer.convert_tokens_to_ids(markers))
    completion_ids[torch.isin(completion_ids, marker_ids)] = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    batch = {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": torch.ones(g, completion_length, dtype=torch.long),
        "advantages": torch.randn(g, generator=generator),  # non-zero: every completion is scored
        "num_items_in_batch": torch.tensor(g * completion_length),
        "pixel_values": encoded["pixel_values"].repeat(g, 1),
        "image_grid_thw": encoded["image_grid_thw"].repeat(g, 1),
        "num_images": [1] * g,
    }
    if "mm_token_type_ids" in encoded:
        prompt_types = encoded["mm_token_type_ids"].repeat(g, 1)
        batch["mm_token_type_ids"] = torch.cat([prompt_types, torch.zeros_like(batch["completion_ids"])], dim=1)
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


class PhaseTimer:
    """Wall time of named phases, synchronised with the device so GPU work is counted where it runs."""

    def __init__(self, device):
        self.device, self.totals = device, {}

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def phase(self, name):
        self.sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self.sync()
            self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - start

    def wrap(self, owner, attribute, name):
        original = getattr(owner, attribute)

        def timed(*args, **kwargs):
            with self.phase(name):
                return original(*args, **kwargs)

        setattr(owner, attribute, timed)


def make_trainer(settings, model, processor, args, device, output_dir):
    config = VEPOConfig(
        output_dir=output_dir,
        per_device_train_batch_size=args.completions,
        num_generations=args.completions,
        max_completion_length=max(args.completion_length),
        loss_type="bnpo",
        report_to="none",
        use_cpu=device.type == "cpu",
        bf16=device.type == "cuda",
        log_selection_diagnostics=False,
        **settings,
    )
    trainer = VEPOTrainer(
        model=model,
        reward_funcs=lambda completions, **_: [0.0] * len(completions),
        args=config,
        train_dataset=synthetic_training_dataset(4, seed=0),
        processing_class=processor,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    timer = PhaseTimer(device)
    timer.wrap(trainer, "_forward", "loss_forward")
    timer.wrap(trainer.perturbed_pass, "perturbed_hidden", "perturbed_forward")
    trainer.bench_timer = timer
    return trainer


def run_steps(trainer, batch, steps, device):
    """`steps` timed steps of one method: `compute_loss` on a fresh batch (the mask made anew, as at a batch's first
    use) and the backward pass; one dict of phase times per step."""
    timer = trainer.bench_timer
    original_signals = perturbed_pass_module.token_signals

    def timed_signals(*a, **k):
        with timer.phase("signals"):
            return original_signals(*a, **k)

    perturbed_pass_module.token_signals = timed_signals
    times = []
    try:
        for _ in range(steps):
            timer.totals = {}
            with timer.phase("compute_loss"):
                loss = trainer.compute_loss(trainer.model, copy.copy(batch))
            with timer.phase("backward"):
                loss.backward()
            trainer.model.zero_grad(set_to_none=True)
            times.append({**timer.totals, "step": timer.totals["compute_loss"] + timer.totals["backward"]})
    finally:
        perturbed_pass_module.token_signals = original_signals
    return times


def rotations(names, rounds):
    """Round r runs the methods starting at the r-th: each method comes first, middle and last in turn, so whatever
    drifts within a round (clocks, the allocator) does not land on one method."""
    return [names[r % len(names) :] + names[: r % len(names)] for r in range(rounds)]


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "rounds": values}


def interleaved(trainers, batch, args, device):
    """Every method warmed up before any is timed, then `args.rounds` rounds in rotated order, `args.steps` steps per
    method per round; ratios are taken within a round (the same clocks) and summarised over rounds."""
    for trainer in trainers.values():
        run_steps(trainer, batch, args.warmup, device)
    by_method = {name: [] for name in trainers}
    peaks = {name: 0.0 for name in trainers}
    ratios = {"vepo_over_grpo": [], "vepo_over_entropy": []}
    orders = rotations(list(trainers), args.rounds)
    for order in orders:
        round_step = {}
        for name in order:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            times = run_steps(trainers[name], batch, args.steps, device)
            if device.type == "cuda":
                peaks[name] = max(peaks[name], torch.cuda.max_memory_allocated(device) / 1e9)
            by_method[name] += times
            round_step[name] = statistics.median(t["step"] for t in times)
        ratios["vepo_over_grpo"].append(round_step["vepo"] / round_step["grpo"])
        ratios["vepo_over_entropy"].append(round_step["vepo"] / round_step["entropy_top20"])
    results = {}
    for name, steps in by_method.items():
        phases = sorted({key for step in steps for key in step})
        result = {phase: statistics.median(step.get(phase, 0.0) for step in steps) for phase in phases}
        result["peak_memory_gb"] = peaks[name] if device.type == "cuda" else float("nan")
        trainer = trainers[name]
        result["perturbed_completions"] = trainer.num_perturbed_completions
        needs = trainer.selection.needs_perturbed_pass
        result["tile_size"] = trainer.perturbed_pass.tile_size(device) if needs else None
        results[name] = result
    return results, {key: spread(values) for key, values in ratios.items()}, orders


def generation_seconds(model, processor, batch, length, device):
    """One rollout with transformers' `generate`: the batch's prompts, exactly `length` new tokens each (sampled), the
    part of an RL step every method shares."""
    timer = PhaseTimer(device)
    inputs = {"input_ids": batch["prompt_ids"], "attention_mask": batch["prompt_mask"],
              "pixel_values": batch["pixel_values"], "image_grid_thw": batch["image_grid_thw"]}  # fmt: skip
    if "mm_token_type_ids" in batch:
        inputs["mm_token_type_ids"] = batch["mm_token_type_ids"][:, : batch["prompt_ids"].shape[1]]
    model.eval()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    try:
        with torch.no_grad(), autocast, timer.phase("generate"):
            model.generate(**inputs, max_new_tokens=length, min_new_tokens=length, do_sample=True, use_cache=True,
                           pad_token_id=processor.tokenizer.pad_token_id)  # fmt: skip
    finally:
        model.train()
    return timer.totals["generate"]


def no_grad_forward_seconds(model, batch, device, repeats=3):
    inputs = {
        "input_ids": torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1),
        "attention_mask": torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1),
        "pixel_values": batch["pixel_values"],
        "image_grid_thw": batch["image_grid_thw"],
    }
    if "mm_token_type_ids" in batch:
        inputs["mm_token_type_ids"] = batch["mm_token_type_ids"]
    timer = PhaseTimer(device)
    times = []
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    for _ in range(repeats + 1):
        timer.totals = {}
        with torch.no_grad(), autocast, timer.phase("forward"):
            model(**inputs, logits_to_keep=1)
        times.append(timer.totals["forward"])
    return statistics.median(times[1:])


def measure(model, processor, trainers, args, device, length, dims):
    batch = make_batch(processor, device, args.completions, length, args.image_side, 600)
    print(
        f"{'tiny' if args.tiny else 'Qwen2.5-VL-3B-shaped'} model, {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B "
        f"parameters, {next(model.parameters()).dtype}, {device}; prompt {batch['prompt_ids'].shape[1]} tokens "
        f"({int(batch['image_grid_thw'][0].prod()) // 4} visual), {args.completions} x {length} completion tokens; "
        f"warm-up {args.warmup} step(s) per method, then {args.rounds} rounds x {args.steps} step(s), order rotated"
    )
    results, ratios, orders = interleaved(trainers, batch, args, device)
    for name, r in results.items():
        print(
            f"{name:<14} step {r['step']:.3f} s  compute_loss {r['compute_loss']:.3f} s  "
            f"loss fwd {r.get('loss_forward', 0):.3f} s  perturbed fwd {r.get('perturbed_forward', 0):.3f} s  "
            f"signals {r.get('signals', 0):.3f} s  backward {r['backward']:.3f} s  peak {r['peak_memory_gb']:.2f} GB"
            + (f"  tile {r['tile_size']}" if r["tile_size"] else "")
        )
    for key, label in (("vepo_over_grpo", "VEPO / full GRPO"), ("vepo_over_entropy", "VEPO / top-20% entropy")):
        value = ratios[key]
        print(f"{label:<24} median {value['median']:.3f}  spread {value['min']:.3f}-{value['max']:.3f}  rounds "
              + " ".join(f"{v:.3f}" for v in value["rounds"]))  # fmt: skip
    forward = no_grad_forward_seconds(model, batch, device)
    entropy, vepo, grpo = results["entropy_top20"], results["vepo"], results["grpo"]
    bound = (entropy["compute_loss"] + forward) * 1.10
    memory_ratio = vepo["peak_memory_gb"] / entropy["peak_memory_gb"] if device.type == "cuda" else float("nan")
    print(f"no-grad forward {forward:.3f} s")
    print(
        f"VEPO compute_loss {vepo['compute_loss']:.3f} s vs bound (entropy + one no-grad forward) x 1.10 = {bound:.3f} s: "
        f"{'within' if vepo['compute_loss'] <= bound else 'OVER'}; peak memory VEPO / entropy = {memory_ratio:.3f}"
    )
    figures = {
        "completion_length": length,
        "no_grad_forward_seconds": forward,
        "vepo_compute_loss_bound_seconds": bound,
        "vepo_within_time_bound": vepo["compute_loss"] <= bound,
        "peak_memory_ratio_vepo_over_entropy": memory_ratio,
        "ratios": ratios,
        "orders": orders,
        **results,
    }
    if args.generation:
        generate = generation_seconds(model, processor, batch, length, device)
        # What a user feels: the whole RL step is the rollout plus the training step
        figures["generation_seconds"] = generate
        figures["vepo_share_of_rl_step_over_grpo"] = (vepo["step"] - grpo["step"]) / (generate + vepo["step"])
        figures["vepo_share_of_rl_step_over_entropy"] = (vepo["step"] - entropy["step"]) / (generate + vepo["step"])
        print(
            f"generation (transformers, {args.completions} x {length} tokens) {generate:.3f} s; of a whole RL step "
            f"(generation + VEPO's step) VEPO adds {figures['vepo_share_of_rl_step_over_grpo']:.1%} over full GRPO, "
            f"{figures['vepo_share_of_rl_step_over_entropy']:.1%} over top-20% entropy"
        )
    return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny dimensions (a CPU check of the code path)")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per method per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each running every method in a rotated order")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per method before any is timed")
    parser.add_argument("--completions", type=int, default=8)
    parser.add_argument("--completion_length", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--image_side", type=int, default=448)
    parser.add_argument("--no_generation", dest="generation", action="store_false",
                        help="leave out the timed rollout (and the share of a whole RL step)")  # fmt: skip
    args = parser.parse_args()
    if args.rounds < 3 or min(args.steps, args.warmup) < 1:
        parser.error("--rounds must be at least 3 (each method first once), --steps and --warmup at least 1")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dims = TINY if args.tiny else QWEN_3B
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    processor = build_processor()
    processor.image_processor.min_pixels = processor.image_processor.max_pixels = args.image_side**2
    processor.image_processor.size = {"shortest_edge": args.image_side**2, "longest_edge": args.image_side**2}
    torch.manual_seed(0)
    model = build_model(processor, dims, device, dtype)
    if device.type == "cuda":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    by_length = {}
    with tempfile.TemporaryDirectory() as output_dir:
        trainers = {name: make_trainer(settings, model, processor, args, device, output_dir)
                    for name, settings in METHODS.items()}  # fmt: skip
        for length in args.completion_length:
            by_length[str(length)] = measure(model, processor, trainers, args, device, length, dims)
    first = by_length[str(args.completion_length[0])]
    # The first length's figures at the top level (what the acceptance table quotes), every length under by_length
    print(
        json.dumps(
            {
                "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                "model": "tiny" if args.tiny else "qwen2.5-vl-3b-shaped",
                **first,
                "by_length": by_length,
            }
        )
    )


if __name__ == "__main__":
    main()
