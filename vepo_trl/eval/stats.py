"""Accuracy over sampled completions and its uncertainty: avg@k, pass@k, bootstrap intervals, paired differences.

A benchmark's graded records are a list of rows, each the verdicts of its `k` samples (`k = 1`: greedy). avg@k is
the mean over rows of each row's mean (VPPO's avg@8 at temperature 1.0), pass@k the share of rows with a right sample
(`k` samples drawn, so the estimator of Chen et al. 2021 with `n = k`). Intervals are percentile bootstraps: rows
drawn with replacement and, for `k > 1`, each drawn row's samples drawn with replacement too (the two sources of noise
in a sampled protocol); with `k = 1` this is the plain row bootstrap `scipy.stats.bootstrap` computes. A paired
difference of two result folders resamples the rows they share, the same draw for both, so what they have in common
cancels. Pure functions of lists of verdicts (numpy); fixed seeds, so a summary is the same when written again.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


__all__ = [
    "RESAMPLES",
    "avg_at_k",
    "bench_seed",
    "stable_seed",
    "bootstrap_means",
    "interval",
    "paired_difference",
    "pass_at_k",
]

RESAMPLES = 10_000
_CHUNK = 500


def stable_seed(*parts) -> int:
    """A 31-bit seed from JSON-able parts, the same on every machine and run (SHA-256 of their JSON)."""
    import hashlib
    import json

    return int.from_bytes(hashlib.sha256(json.dumps(list(parts)).encode()).digest()[:4], "big") >> 1


def bench_seed(name: str) -> int:
    """A benchmark's own bootstrap seed: benchmarks averaged together are drawn independently (one seed for all
    would draw every benchmark's rows at the same relative positions)."""
    return stable_seed("bootstrap", name)


def avg_at_k(rows: Sequence[Sequence[bool]]) -> float:
    """Mean over rows of the share of right samples."""
    return float(np.mean([np.mean(row) for row in rows])) if rows else float("nan")


def pass_at_k(rows: Sequence[Sequence[bool]]) -> float:
    """Share of rows with at least one right sample."""
    return float(np.mean([any(row) for row in rows])) if rows else float("nan")


def _padded(rows: Sequence[Sequence[bool]]) -> tuple[np.ndarray, np.ndarray]:
    counts = np.array([len(row) for row in rows])
    values = np.zeros((len(rows), int(counts.max())))
    for index, row in enumerate(rows):
        values[index, : len(row)] = row
    return values, counts


def bootstrap_means(
    rows: Sequence[Sequence[bool]], *, resamples: int = RESAMPLES, seed: int = 0, row_draws: np.ndarray | None = None
) -> np.ndarray:
    """`(resamples,)` avg@k of the resampled benchmark: rows with replacement, then each drawn row's samples with
    replacement. `row_draws` `(resamples, rows)` gives the row draws (a paired comparison shares them)."""
    values, counts = _padded(rows)
    generator = np.random.default_rng(seed)
    n, k = values.shape
    if row_draws is None:
        row_draws = generator.integers(0, n, size=(resamples, n))
    out = np.empty(len(row_draws))
    for start in range(0, len(row_draws), _CHUNK):
        picked = row_draws[start : start + _CHUNK]  # (c, n)
        if k == 1 and bool((counts == 1).all()):
            means = values[picked, 0]
        else:
            # Each drawn row's samples redrawn among its own (a row may hold fewer than k)
            slots = (generator.random((*picked.shape, k)) * counts[picked][..., None]).astype(int)
            taken = np.take_along_axis(values[picked], slots, axis=-1)
            valid = np.arange(k) < counts[picked][..., None]
            means = (taken * valid).sum(-1) / counts[picked]
        out[start : start + _CHUNK] = means.mean(-1)
    return out


def interval(draws: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The percentile interval of bootstrap draws."""
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(draws, [tail, 100 - tail])
    return float(low), float(high)


def paired_difference(
    a: dict[str, Sequence[bool]], b: dict[str, Sequence[bool]], *, resamples: int = RESAMPLES, seed: int = 0
) -> dict:
    """avg@k of `a` minus `b` over the row ids both hold (`{id: sample verdicts}`), and its 95% interval from the
    same row draws for both (`draws`: the resampled differences, for an average over benchmarks)."""
    shared = sorted(set(a) & set(b))
    if not shared:
        return {"rows": 0, "difference": float("nan"), "low": float("nan"), "high": float("nan"), "draws": None}
    rows_a, rows_b = [a[i] for i in shared], [b[i] for i in shared]
    draws = np.random.default_rng(seed).integers(0, len(shared), size=(resamples, len(shared)))
    differences = bootstrap_means(rows_a, seed=seed + 1, row_draws=draws) - bootstrap_means(
        rows_b, seed=seed + 2, row_draws=draws
    )
    low, high = interval(differences)
    return {"rows": len(shared), "difference": avg_at_k(rows_a) - avg_at_k(rows_b), "low": low, "high": high,
            "draws": differences}  # fmt: skip
