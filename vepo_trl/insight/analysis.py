"""The paper's selection analysis (section 2.2, Fig. 2 and Fig. 5c) over a data set and a model.

For each `k`, per response: how many of the top-k JSD tokens (and of the top-k |dH| tokens) top-k entropy also keeps
(its recall), and how many of the top-k JSD tokens the run's selection (VEPO by default) misses. Counts are pooled over
all responses before dividing, as the trainer's `vepo/top_jsd_missed_by_*` metrics pool them over a batch. The joint
distribution of entropy and JSD over all tokens is the paper's Fig. 2a.

The counting reuses `scoring.top_k_mask`, `scoring.selection_miss_counts` and `scoring.select_tokens`; nothing of the
selection math is restated here.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..scoring import TokenSignals, select_tokens, selection_miss_counts, top_k_mask


__all__ = [
    "ANALYSIS_RATIOS",
    "OverlapCounts",
    "SelectionAnalysis",
    "overlap_counts",
    "plot_joint_distribution",
    "plot_recall",
    "spearman",
]

# The paper's preliminary study (Fig. 2b) uses these k
ANALYSIS_RATIOS = (0.1, 0.2, 0.4, 0.8)
# The paper's reference point (Qwen2.5-VL-7B): at k = 0.2, top-k entropy keeps about 59% of the top-k JSD tokens
PAPER_ENTROPY_RECALL_AT_0_2 = 0.59
# Tokens kept for the joint-distribution plot (a uniform subsample beyond this)
_MAX_JOINT_TOKENS = 200_000


@dataclass
class OverlapCounts:
    """Pooled counts at one `k`. Rates are `None` when their denominator is zero."""

    ratio: float
    responses: int = 0
    tokens: int = 0
    selected: int = 0
    jsd_top_k: int = 0
    jsd_top_k_kept_by_entropy: int = 0
    jsd_top_k_missed_by_selection: int = 0
    gap_top_k: int = 0
    gap_top_k_kept_by_entropy: int = 0

    def __iadd__(self, other: OverlapCounts) -> OverlapCounts:
        if other.ratio != self.ratio:
            raise ValueError(f"Cannot pool counts at k = {self.ratio} and k = {other.ratio}.")
        for name in ("responses", "tokens", "selected", "jsd_top_k", "jsd_top_k_kept_by_entropy",
                     "jsd_top_k_missed_by_selection", "gap_top_k", "gap_top_k_kept_by_entropy"):  # fmt: skip
            setattr(self, name, getattr(self, name) + getattr(other, name))
        return self

    @staticmethod
    def _rate(numerator: int, denominator: int) -> float | None:
        return numerator / denominator if denominator else None

    @property
    def entropy_recall_of_jsd(self) -> float | None:
        """Share of the top-k JSD tokens that top-k entropy keeps (the paper: ~0.59 at k = 0.2)."""
        return self._rate(self.jsd_top_k_kept_by_entropy, self.jsd_top_k)

    @property
    def entropy_recall_of_gap(self) -> float | None:
        """Share of the top-k |dH| tokens that top-k entropy keeps."""
        return self._rate(self.gap_top_k_kept_by_entropy, self.gap_top_k)

    @property
    def entropy_miss_rate(self) -> float | None:
        """Share of the top-k JSD tokens top-k entropy misses (the trainer's `vepo/top_jsd_missed_by_entropy`)."""
        recall = self.entropy_recall_of_jsd
        return None if recall is None else 1.0 - recall

    @property
    def selection_miss_rate(self) -> float | None:
        """Share of the top-k JSD tokens the selection misses (`vepo/top_jsd_missed_by_selection`; paper ~0.2)."""
        return self._rate(self.jsd_top_k_missed_by_selection, self.jsd_top_k)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            entropy_recall_of_jsd=self.entropy_recall_of_jsd,
            entropy_recall_of_gap=self.entropy_recall_of_gap,
            entropy_miss_rate=self.entropy_miss_rate,
            selection_miss_rate=self.selection_miss_rate,
        )
        return out


@torch.no_grad()
def overlap_counts(
    signals: TokenSignals,
    mask: torch.Tensor,
    ratio: float,
    *,
    strategy: str = "vepo",
    alpha: float = 0.7,
    seeds: torch.Tensor | None = None,
    params: Mapping[str, object] | None = None,
) -> OverlapCounts:
    """Counts at `k = ratio` for a batch of responses: `signals` with `(B, T)` `entropy`, `perturbed_entropy` and
    `jsd`; `mask` `(B, T)` valid tokens. The selection is `strategy` at the same `k` and `alpha`."""
    for name in ("entropy", "perturbed_entropy", "jsd"):
        if getattr(signals, name) is None:
            raise ValueError(f"The selection analysis needs signals.{name}.")
    mask = mask.bool()
    selected = select_tokens(strategy, signals, mask, ratio=ratio, alpha=alpha, seeds=seeds, params=params)
    jsd_total, entropy_misses, selection_misses = selection_miss_counts(signals, mask, selected, ratio)
    top_gap = top_k_mask(signals.entropy_gap.abs(), mask, ratio)
    top_entropy = top_k_mask(signals.entropy, mask, ratio)
    return OverlapCounts(
        ratio=ratio,
        responses=int(mask.any(-1).sum()),
        tokens=int(mask.sum()),
        selected=int((selected & mask).sum()),
        jsd_top_k=jsd_total,
        jsd_top_k_kept_by_entropy=jsd_total - entropy_misses,
        jsd_top_k_missed_by_selection=selection_misses,
        gap_top_k=int(top_gap.sum()),
        gap_top_k_kept_by_entropy=int((top_gap & top_entropy).sum()),
    )


def spearman(x: torch.Tensor, y: torch.Tensor) -> float | None:
    """Spearman rank correlation of two 1-D samples (average ranks for ties); `None` for fewer than 3 values."""
    if x.numel() < 3:
        return None

    def ranks(v: torch.Tensor) -> torch.Tensor:
        v = v.double()
        order = torch.argsort(v, stable=True)
        sorted_v = v[order]
        r = torch.empty_like(v)
        r[order] = torch.arange(len(v), dtype=torch.float64, device=v.device)
        # Ties share their average rank
        _, inverse, counts = torch.unique_consecutive(sorted_v, return_inverse=True, return_counts=True)
        ends = torch.cumsum(counts, 0).double()
        averages = ends - (counts.double() + 1) / 2
        r[order] = averages[inverse]
        return r

    rx, ry = ranks(x), ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denominator = math.sqrt(float((rx * rx).sum() * (ry * ry).sum()))
    return float((rx * ry).sum()) / denominator if denominator else None


@dataclass
class SelectionAnalysis:
    """Accumulates `overlap_counts` over batches of responses, and the tokens' (H, JSD, |dH|) for Fig. 2a."""

    ratios: Sequence[float] = ANALYSIS_RATIOS
    strategy: str = "vepo"
    alpha: float = 0.7
    strategy_params: Mapping[str, object] | None = None
    counts: dict[float, OverlapCounts] = field(default_factory=dict)
    entropy: list[torch.Tensor] = field(default_factory=list)
    jsd: list[torch.Tensor] = field(default_factory=list)
    gap: list[torch.Tensor] = field(default_factory=list)
    prompts: int = 0

    def __post_init__(self):
        self.ratios = tuple(float(r) for r in self.ratios)
        for ratio in self.ratios:
            if not 0.0 < ratio <= 1.0:
                raise ValueError(f"every k must be in (0, 1], got {ratio}")
        self.counts = {ratio: OverlapCounts(ratio) for ratio in self.ratios}

    def add(self, signals: TokenSignals, mask: torch.Tensor, seeds: torch.Tensor | None = None) -> None:
        """Add the responses of one batch (typically the G completions of one prompt)."""
        mask = mask.bool()
        for ratio in self.ratios:
            self.counts[ratio] += overlap_counts(
                signals, mask, ratio, strategy=self.strategy, alpha=self.alpha, seeds=seeds,
                params=self.strategy_params,
            )  # fmt: skip
        self.entropy.append(signals.entropy[mask].float().cpu())
        self.jsd.append(signals.jsd[mask].float().cpu())
        self.gap.append(signals.entropy_gap.abs()[mask].float().cpu())
        self.prompts += 1

    def token_values(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cat = lambda parts: torch.cat(parts) if parts else torch.zeros(0)  # noqa: E731  # cpu: parts are on the CPU
        return cat(self.entropy), cat(self.jsd), cat(self.gap)

    def summary(self) -> dict[str, Any]:
        entropy, jsd, gap = self.token_values()
        return {
            "strategy": self.strategy,
            "alpha": self.alpha,
            "prompts": self.prompts,
            "responses": self.counts[self.ratios[0]].responses if self.ratios else 0,
            "tokens": int(entropy.numel()),
            "spearman_entropy_jsd": spearman(entropy, jsd),
            "spearman_entropy_gap": spearman(entropy, gap),
            "spearman_jsd_gap": spearman(jsd, gap),
            "by_k": [self.counts[ratio].as_dict() for ratio in self.ratios],
        }

    def markdown(self, title: str = "Selection analysis") -> str:
        """The table the CLI prints and writes: one row per k."""
        summary = self.summary()
        label = "VEPO" if self.strategy == "vepo" else self.strategy

        def pct(value):
            return "n/a" if value is None else f"{value:.1%}"

        lines = [
            f"# {title}",
            "",
            f"{summary['prompts']} prompts, {summary['responses']} responses, {summary['tokens']:,} tokens; "
            f"selection `{self.strategy}` (alpha {self.alpha}). Per response, top `ceil(k T)` tokens by each signal; "
            "counts pooled over responses.",
            "",
            f"| k | top-k entropy recall of top-k JSD | top-k entropy recall of top-k \\|dH\\| | "
            f"top-k JSD missed by top-k entropy | top-k JSD missed by {label} |",
            "|---|---|---|---|---|",
        ]
        for ratio in self.ratios:
            c = self.counts[ratio]
            lines.append(
                f"| {ratio:g} | {pct(c.entropy_recall_of_jsd)} | {pct(c.entropy_recall_of_gap)} | "
                f"{pct(c.entropy_miss_rate)} | {pct(c.selection_miss_rate)} |"
            )

        def corr(value):
            return "n/a" if value is None else f"{value:+.3f}"

        lines += [
            "",
            f"Spearman rank correlation over tokens: H vs JSD {corr(summary['spearman_entropy_jsd'])}, "
            f"H vs |dH| {corr(summary['spearman_entropy_gap'])}, JSD vs |dH| {corr(summary['spearman_jsd_gap'])}.",
            "",
            f"The paper (Qwen2.5-VL-7B, Fig. 2b): at k = 0.2 top-k entropy keeps about "
            f"{PAPER_ENTROPY_RECALL_AT_0_2:.0%} of the top-k JSD tokens; VEPO misses about 20% (Fig. 5c).",
        ]
        return "\n".join(lines) + "\n"

    def write(self, output_dir: str | os.PathLike, *, meta: dict[str, Any] | None = None) -> dict[str, Path]:
        """Write `analysis.json`, `analysis.md`, `recall.png` and `entropy_vs_jsd.png` under `output_dir`."""
        output_dir = Path(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        paths = {
            "json": output_dir / "analysis.json",
            "markdown": output_dir / "analysis.md",
            "recall": output_dir / "recall.png",
            "joint": output_dir / "entropy_vs_jsd.png",
        }
        paths["json"].write_text(json.dumps({**(meta or {}), **self.summary()}, indent=2) + "\n")
        paths["markdown"].write_text(self.markdown())
        plot_recall(self, paths["recall"])
        plot_joint_distribution(*self.token_values()[:2], paths["joint"])
        return paths


# ---------------------------------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------------------------------


def plot_recall(analysis: SelectionAnalysis, path: str | os.PathLike) -> Path:
    """Recall of the top-k JSD / |dH| tokens by top-k entropy and by the selection, against k (Fig. 2b, Fig. 5c)."""
    from .plots import _pyplot, save_figure

    plt = _pyplot()
    ratios = list(analysis.ratios)
    counts = [analysis.counts[r] for r in ratios]
    label = "VEPO" if analysis.strategy == "vepo" else analysis.strategy

    def series(values: Iterable[float | None]) -> list[float]:
        return [math.nan if v is None else v for v in values]

    fig, ax = plt.subplots(figsize=(5.6, 3.6), dpi=100)
    ax.plot(
        ratios,
        series(c.entropy_recall_of_jsd for c in counts),
        "o-",
        color="#e07b00",
        label="top-k entropy vs top-k JSD",
    )
    ax.plot(
        ratios,
        series(c.entropy_recall_of_gap for c in counts),
        "s--",
        color="#c0392b",
        label="top-k entropy vs top-k |dH|",
    )
    ax.plot(
        ratios,
        series(None if c.selection_miss_rate is None else 1 - c.selection_miss_rate for c in counts),
        "^-",
        color="#1f6fc5",
        label=f"{label} vs top-k JSD",
    )
    ax.plot([0, 1], [0, 1], ":", color="#999", label="random selection (recall = k)")
    ax.plot(
        [0.2], [PAPER_ENTROPY_RECALL_AT_0_2], "*", color="#333", markersize=10, label="paper, entropy @ k=0.2 (7B)"
    )
    ax.set_xlabel("k (fraction of each response kept)")
    ax.set_ylabel("recall of the reference top-k")
    ax.set_xlim(0, 0.85)
    ax.set_ylim(0, 1.02)
    ax.set_xticks(ratios)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7.5, loc="lower right")
    ax.set_title(
        f"Which top-k tokens does each rule keep? ({analysis.summary()['responses']} responses)", fontsize=9.5
    )
    fig.tight_layout()
    return save_figure(fig, path)


def plot_joint_distribution(entropy: torch.Tensor, jsd: torch.Tensor, path: str | os.PathLike) -> Path:
    """2-D histogram of the tokens' entropy against their JSD, log-scaled counts (the paper's Fig. 2a)."""
    from .plots import _pyplot, save_figure

    plt = _pyplot()
    from matplotlib.colors import LogNorm

    if entropy.numel() > _MAX_JOINT_TOKENS:
        # cpu: a fixed subsample of CPU values for the plot, the same draw on any machine
        keep = torch.randperm(entropy.numel(), generator=torch.Generator().manual_seed(0))[:_MAX_JOINT_TOKENS]
        entropy, jsd = entropy[keep], jsd[keep]
    fig, ax = plt.subplots(figsize=(5.2, 3.8), dpi=100)
    if entropy.numel():
        bins = max(10, min(60, int(math.sqrt(entropy.numel()))))
        _, _, _, image = ax.hist2d(entropy.numpy(), jsd.numpy(), bins=bins, norm=LogNorm(), cmap="viridis", cmin=1)
        fig.colorbar(image, ax=ax, label="tokens")
        rho = spearman(entropy, jsd)
        if rho is not None:
            ax.text(0.02, 0.96, f"Spearman {rho:+.2f}", transform=ax.transAxes, va="top", fontsize=8.5)
    ax.set_xlabel("entropy H (nats)")
    ax.set_ylabel("JSD(clean, perturbed) (nats)")
    ax.set_title(f"Entropy vs visual dependence ({entropy.numel():,} tokens)", fontsize=9.5)
    fig.tight_layout()
    return save_figure(fig, path)
