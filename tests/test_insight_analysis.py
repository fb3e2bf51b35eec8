"""The selection analysis against a plain per-response loop written from the paper's definitions, on random signals
of several shapes; its files are written and non-empty."""

import json
import math
from fractions import Fraction

import pytest
import torch

from vepo_trl.insight.analysis import ANALYSIS_RATIOS, OverlapCounts, SelectionAnalysis, overlap_counts, spearman
from vepo_trl.scoring import TokenSignals


def loop_top_k(values, valid, ratio):
    """Indices of the top ceil(k T) valid tokens, ties to the earlier position."""
    positions = [t for t in range(len(values)) if valid[t]]
    if not positions:
        return set()
    count = min(len(positions), max(1, math.ceil(Fraction(str(ratio)) * len(positions))))
    ranked = sorted(positions, key=lambda t: (-values[t], t))
    return set(ranked[:count])


def loop_minmax(values, valid):
    kept = [values[t] for t in range(len(values)) if valid[t]]
    low, high = min(kept), max(kept)
    span = max(high - low, 1e-8)
    return [min(max((v - low) / span, 0.0), 1.0) if ok else 0.0 for v, ok in zip(values, valid)]


def loop_counts(entropy, perturbed, jsd, mask, ratio, alpha):
    """The paper's counts, one response at a time, VEPO's score written out (eq. 7)."""
    totals = dict(jsd_top_k=0, kept_jsd=0, missed_sel=0, gap_top_k=0, kept_gap=0, selected=0)
    for b in range(len(mask)):
        valid = mask[b]
        if not any(valid):
            continue
        gap = [abs(q - p) for p, q in zip(perturbed[b], entropy[b])]
        top_h = loop_top_k(entropy[b], valid, ratio)
        top_j = loop_top_k(jsd[b], valid, ratio)
        top_g = loop_top_k(gap, valid, ratio)
        j_hat, g_hat, h_hat = loop_minmax(jsd[b], valid), loop_minmax(gap, valid), loop_minmax(entropy[b], valid)
        score = [(1 - (1 - j) ** alpha * (1 - g) ** (1 - alpha)) * h for j, g, h in zip(j_hat, g_hat, h_hat)]
        selected = loop_top_k(score, valid, ratio)
        totals["jsd_top_k"] += len(top_j)
        totals["kept_jsd"] += len(top_j & top_h)
        totals["missed_sel"] += len(top_j - selected)
        totals["gap_top_k"] += len(top_g)
        totals["kept_gap"] += len(top_g & top_h)
        totals["selected"] += len(selected)
    return totals


def random_batch(batch, length, seed):
    generator = torch.Generator().manual_seed(seed)
    entropy = torch.rand(batch, length, generator=generator) * 5
    perturbed = entropy + torch.randn(batch, length, generator=generator) * 0.3
    jsd = torch.rand(batch, length, generator=generator) * math.log(2)
    lengths = torch.randint(0, length + 1, (batch,), generator=generator)
    lengths[0] = length  # at least one full response
    mask = torch.arange(length) < lengths[:, None]
    return TokenSignals(entropy=entropy, perturbed_entropy=perturbed, jsd=jsd), mask


@pytest.mark.parametrize("batch, length, seed", [(1, 1, 0), (3, 7, 1), (8, 40, 2), (5, 113, 3)])
@pytest.mark.parametrize("ratio", ANALYSIS_RATIOS)
def test_counts_match_a_plain_loop(batch, length, seed, ratio):
    signals, mask = random_batch(batch, length, seed)
    counts = overlap_counts(signals, mask, ratio, alpha=0.7)
    expected = loop_counts(
        signals.entropy.tolist(), signals.perturbed_entropy.tolist(), signals.jsd.tolist(), mask.tolist(), ratio, 0.7
    )
    assert counts.jsd_top_k == expected["jsd_top_k"]
    assert counts.jsd_top_k_kept_by_entropy == expected["kept_jsd"]
    assert counts.jsd_top_k_missed_by_selection == expected["missed_sel"]
    assert counts.gap_top_k == expected["gap_top_k"]
    assert counts.gap_top_k_kept_by_entropy == expected["kept_gap"]
    assert counts.selected == expected["selected"]
    assert counts.tokens == int(mask.sum()) and counts.responses == int(mask.any(-1).sum())
    assert counts.entropy_recall_of_jsd == pytest.approx(expected["kept_jsd"] / expected["jsd_top_k"])
    assert counts.selection_miss_rate == pytest.approx(expected["missed_sel"] / expected["jsd_top_k"])


def test_identical_signals_recall_everything():
    # When JSD and |dH| rank tokens exactly like entropy, top-k entropy keeps every top-k JSD / |dH| token
    entropy = torch.tensor([[0.1, 0.5, 0.9, 0.3, 0.7]])
    signals = TokenSignals(entropy=entropy, perturbed_entropy=entropy * 2, jsd=entropy / 2)
    counts = overlap_counts(signals, torch.ones_like(entropy, dtype=torch.bool), 0.4)
    assert counts.entropy_recall_of_jsd == 1.0 and counts.entropy_recall_of_gap == 1.0
    assert counts.selection_miss_rate == 0.0


def test_pooling_adds_counts_and_rejects_mixed_k():
    signals, mask = random_batch(4, 20, 5)
    whole = overlap_counts(signals, mask, 0.2)
    pooled = OverlapCounts(0.2)
    for rows in (slice(0, 1), slice(1, 4)):
        pooled += overlap_counts(signals.map(lambda x, r=rows: x[r]), mask[rows], 0.2)
    assert pooled == whole
    with pytest.raises(ValueError, match="k = 0.2 and k = 0.4"):
        pooled += OverlapCounts(0.4)


def test_spearman_matches_a_plain_computation():
    assert spearman(torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([10.0, 20.0, 30.0, 40.0])) == pytest.approx(1.0)
    assert spearman(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([3.0, 2.0, 1.0])) == pytest.approx(-1.0)
    # Ties: x ranks (1, 2.5, 2.5, 4), y ranks (1, 2, 3, 4); Pearson of the ranks by hand
    rx, ry = [1, 2.5, 2.5, 4], [1, 2, 3, 4]
    mx, my = sum(rx) / 4, sum(ry) / 4
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    assert spearman(torch.tensor([1.0, 2.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 3.0, 4.0])) == pytest.approx(num / den)
    assert spearman(torch.tensor([1.0]), torch.tensor([2.0])) is None


def test_analysis_writes_table_json_and_plots(tmp_path):
    analysis = SelectionAnalysis()
    for seed in range(3):
        analysis.add(*random_batch(4, 30, seed))
    paths = analysis.write(tmp_path, meta={"model": "random"})
    summary = json.loads(paths["json"].read_text())
    assert summary["model"] == "random" and summary["prompts"] == 3
    assert [row["ratio"] for row in summary["by_k"]] == list(ANALYSIS_RATIOS)
    table = paths["markdown"].read_text()
    assert "| 0.2 |" in table and "top-k JSD missed by VEPO" in table
    for key in ("recall", "joint"):
        data = paths[key].read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 2000


def test_analysis_rejects_bad_k():
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        SelectionAnalysis(ratios=(0.2, 1.5))
