"""Tiled token signals (`vepo_trl.scoring.token_signals`) against a full-logits implementation.

The full-logits side computes H(P), H(Q) and JSD the way the authors' release does: both `(N, V)` logits, log-softmax,
softmax, the mixture and its log, all in fp32. Both sides get the same final hidden states and LM head. For each
`(N, d)` the script prints wall time (median of repeats) and peak extra memory (above what was allocated before the
call), and the tiled/full ratios. Peak memory is the process's resident-set high-water mark on the CPU (reset through
/proc/self/clear_refs before each call) and `torch.cuda.max_memory_allocated` on a GPU.

    python benchmarks/bench_scoring.py                  # CPU; also the GPU when one is present
    python benchmarks/bench_scoring.py --sizes 1024x256 --repeats 3

The last line is one JSON object for the headline size (N=1024, V=151936, d=256 on the CPU), with `peak_mem_ratio`
and `time_ratio` (tiled over full logits).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import time

import torch

from vepo_trl.scoring import token_signals


QWEN_VOCAB = 151_936
HEADLINE = (1024, 256)


def full_logits_signals(clean_hidden, perturbed_hidden, weight, temperature=1.0):
    """H(P), H(Q), JSD from materialised full logits (the release's `compute_jsd_and_entropy_from_logits`)."""
    log_p = torch.log_softmax((clean_hidden.float() @ weight.float().t()) / temperature, dim=-1)
    log_q = torch.log_softmax((perturbed_hidden.float() @ weight.float().t()) / temperature, dim=-1)
    p, q = log_p.exp(), log_q.exp()
    entropy_p = -(p * log_p).sum(-1)
    entropy_q = -(q * log_q).sum(-1)
    # The release adds 1e-8 inside this log, which biases JSD by ~1e-3 nats over a 152K vocabulary; exact here
    log_m = torch.log(0.5 * (p + q))
    jsd = 0.5 * (p * (log_p - log_m)).sum(-1) + 0.5 * (q * (log_q - log_m)).sum(-1)
    return entropy_p, entropy_q, jsd


def tiled_signals(clean_hidden, perturbed_hidden, weight, tile_size):
    signals = token_signals(
        clean_hidden, perturbed_hidden, weight, signals=("entropy", "perturbed_entropy", "jsd"), tile_size=tile_size
    )
    return signals.entropy, signals.perturbed_entropy, signals.jsd


# ---------------------------------------------------------------------------------------------------------------------
# Memory probes
# ---------------------------------------------------------------------------------------------------------------------


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _measure_cpu(fn) -> tuple[float, int]:
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM, the peak resident set, to the current resident set
    before = _status_kb("VmRSS")
    start = time.perf_counter()
    fn()
    seconds = time.perf_counter() - start
    return seconds, max(0, _status_kb("VmHWM") - before) * 1024


def _measure_cuda(fn) -> tuple[float, int]:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start, torch.cuda.max_memory_allocated() - before


def measure(fn, device: torch.device, repeats: int) -> tuple[float, int]:
    probe = _measure_cuda if device.type == "cuda" else _measure_cpu
    results = [probe(fn) for _ in range(repeats)]
    return statistics.median(r[0] for r in results), max(r[1] for r in results)


# ---------------------------------------------------------------------------------------------------------------------


def run(n_tokens, hidden, vocab, device, dtype, repeats, tile_size):
    generator = torch.Generator().manual_seed(0)
    weight = (torch.randn(vocab, hidden, generator=generator) / math.sqrt(hidden)).to(device, dtype)
    clean = (torch.randn(n_tokens, hidden, generator=generator) * 2).to(device, dtype)
    perturbed = (clean.float().cpu() + 0.3 * torch.randn(n_tokens, hidden, generator=generator)).to(device, dtype)
    outputs = {}

    def full():
        outputs["full"] = full_logits_signals(clean, perturbed, weight)

    def tiled():
        outputs["tiled"] = tiled_signals(clean, perturbed, weight, tile_size)

    tiled()  # warm-up (allocator, kernels)
    tiled_time, tiled_mem = measure(tiled, device, repeats)
    full_time, full_mem = measure(full, device, max(1, repeats - 1))
    error = max((a.float() - b.float()).abs().max().item() for a, b in zip(outputs["tiled"], outputs["full"]))
    return {
        "device": device.type,
        "dtype": str(dtype).replace("torch.", ""),
        "N": n_tokens,
        "V": vocab,
        "d": hidden,
        "tile_size": tile_size,
        "tiled_seconds": round(tiled_time, 4),
        "full_seconds": round(full_time, 4),
        "tiled_peak_mb": round(tiled_mem / 2**20, 1),
        "full_peak_mb": round(full_mem / 2**20, 1),
        "peak_mem_ratio": round(tiled_mem / max(full_mem, 1), 4),
        "time_ratio": round(tiled_time / full_time, 4),
        "max_abs_diff": error,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["256x256", "1024x256", "1024x1024"], help="NxD pairs")
    parser.add_argument("--vocab", type=int, default=QWEN_VOCAB)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tile_size", type=int, default=64, help="VEPOConfig.scoring_tile_size")
    parser.add_argument("--no_gpu", action="store_true", help="Skip the GPU even when one is present.")
    args = parser.parse_args()
    sizes = [tuple(int(x) for x in size.lower().split("x")) for size in args.sizes]

    devices = [(torch.device("cpu"), torch.float32)]
    if torch.cuda.is_available() and not args.no_gpu:
        devices += [(torch.device("cuda"), torch.float32), (torch.device("cuda"), torch.bfloat16)]
    rows = []
    header = f"{'device':<6} {'dtype':<9} {'N':>6} {'d':>6} {'tiled s':>9} {'full s':>9} {'time x':>7} "
    header += f"{'tiled MB':>9} {'full MB':>9} {'mem x':>7} {'max diff':>9}"
    print(
        f"V = {args.vocab}, tile = {args.tile_size} tokens, torch {torch.__version__}, threads {torch.get_num_threads()}"
    )
    print(header)
    for device, dtype in devices:
        for n_tokens, hidden in sizes:
            row = run(n_tokens, hidden, args.vocab, device, dtype, args.repeats, args.tile_size)
            rows.append(row)
            print(
                f"{row['device']:<6} {row['dtype']:<9} {n_tokens:>6} {hidden:>6} {row['tiled_seconds']:>9.3f} "
                f"{row['full_seconds']:>9.3f} {row['time_ratio']:>7.3f} {row['tiled_peak_mb']:>9.1f} "
                f"{row['full_peak_mb']:>9.1f} {row['peak_mem_ratio']:>7.4f} {row['max_abs_diff']:>9.2e}",
                flush=True,
            )
    headline = next(
        (r for r in rows if r["device"] == "cpu" and (r["N"], r["d"]) == HEADLINE and r["V"] == QWEN_VOCAB), rows[-1]
    )
    print(json.dumps(headline))


if __name__ == "__main__":
    main()
