"""The `vepo/` metrics of one freshly made selection mask: a pure function of the batch's signals and masks.

Every metric is a ratio of sums over tokens or responses. The sums are taken locally, reduced across processes in one
call of fixed shape (`reduce`, a sum; every process makes it whatever its batch holds), and only then divided, so a
metric is the same whatever the number of processes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .scoring import TokenSignals, minmax_normalize, selection_miss_counts, vepo_score


def selection_metrics(
    signals: TokenSignals,
    mask: torch.Tensor,
    selected: torch.Tensor,
    scored: torch.Tensor,
    has_image: torch.Tensor,
    *,
    ratio: float,
    alpha: float,
    perturbed_pass: bool,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, float]:
    """`vepo/` metrics of a batch: `signals` `(B, T)` fields, `mask` `(B, T)` the loss mask, `selected` `(B, T)` the
    mask made, `scored` `(B,)` the responses that went through the perturbed pass, `has_image` `(B,)`.

    `perturbed_pass`: whether the strategy scores image responses with a perturbed pass (the other responses are
    ranked by entropy as a stand-in). `reduce`: the cross-process sum of a 1-D tensor (identity on one process). A
    metric with nothing to average over (no valid token, no scored token) is left out rather than reported as 0."""
    reduce = reduce or (lambda values: values)
    selected = selected.bool() & mask
    visual = mask & scored.unsqueeze(-1)
    zero = torch.zeros((), device=mask.device)

    def total(values, where):
        return (values.float() * where).sum() if values is not None else zero

    gap = signals.entropy_gap if signals.entropy is not None and signals.perturbed_entropy is not None else None
    abs_gap = gap.abs() if gap is not None else None
    # VEPO's score c = g * h of every scored token (the release logs its mean and spread)
    score = None
    if signals.jsd is not None and gap is not None:
        score = vepo_score(
            minmax_normalize(signals.jsd, visual),
            minmax_normalize(abs_gap, visual),
            minmax_normalize(signals.entropy, visual),
            alpha,
        )
    top_jsd = entropy_misses = selection_misses = 0
    if signals.jsd is not None and signals.entropy is not None and bool(visual.any()):
        top_jsd, entropy_misses, selection_misses = selection_miss_counts(signals, visual, selected & visual, ratio)
    # Per-response selected share, for its spread across responses
    lengths = mask.sum(-1)
    share = selected.sum(-1).float() / lengths.clamp(min=1)
    has_tokens = lengths > 0
    # Responses whose mask is the strategy's own (not an entropy stand-in for a skipped or text-only response)
    own = (scored if perturbed_pass else mask.any(-1)).unsqueeze(-1)
    count = mask.new_tensor  # a count as a tensor on the batch's device

    sums = {
        "valid": mask.sum().float(),
        "kept": selected.sum().float(),
        "entropy_all": total(signals.entropy, mask),
        "entropy_kept_own": total(signals.entropy, selected & own),
        "kept_own": (selected & own).sum().float(),
        "visual": visual.sum().float(),
        "jsd": total(signals.jsd, visual),
        "gap": total(abs_gap, visual),
        "jsd_kept": total(signals.jsd, selected & visual),
        "gap_kept": total(abs_gap, selected & visual),
        "gap_positive": total((gap > 0) if gap is not None else None, visual),
        "kept_visual": (selected & visual).sum().float(),
        "top_jsd": count(float(top_jsd), dtype=torch.float32),
        "entropy_misses": count(float(entropy_misses), dtype=torch.float32),
        "selection_misses": count(float(selection_misses), dtype=torch.float32),
        "image_rows": has_image.sum().float(),
        "rows": count(float(has_image.numel()), dtype=torch.float32),
        "image_rows_valid": (has_image & mask.any(-1)).sum().float(),
        "scored": scored.sum().float(),
        "share": (share * has_tokens).sum(),
        "share_sq": (share.square() * has_tokens).sum(),
        "responses": has_tokens.sum().float(),
        "score": total(score, visual),
        "score_sq": total(score.square() if score is not None else None, visual),
    }
    # One reduction of fixed shape, mapped back by name
    s = dict(zip(sums, reduce(torch.stack(list(sums.values()))).tolist()))

    metrics: dict[str, float] = {}
    if s["valid"] > 0:  # nothing to report of a batch whose completions are all masked
        metrics["vepo/selected_fraction"] = s["kept"] / s["valid"]
    if s["responses"] > 0:
        mean_share = s["share"] / s["responses"]
        metrics["vepo/selected_fraction_std"] = max(s["share_sq"] / s["responses"] - mean_share**2, 0.0) ** 0.5
    metrics["vepo/image_rows_fraction"] = s["image_rows"] / max(s["rows"], 1.0)
    if signals.entropy is not None and s["valid"] > 0:
        metrics["vepo/entropy_all_mean"] = s["entropy_all"] / s["valid"]
        if s["kept_own"] > 0:
            metrics["vepo/entropy_selected_mean"] = s["entropy_kept_own"] / s["kept_own"]
    if perturbed_pass and s["image_rows_valid"] > 0:
        # The perturbed passes saved by skipping zero-advantage responses (compare `frac_reward_zero_std`)
        metrics["vepo/perturbed_rows_skipped_fraction"] = 1.0 - s["scored"] / s["image_rows_valid"]
    if s["visual"] > 0:
        if signals.jsd is not None:
            metrics["vepo/jsd_mean"] = s["jsd"] / s["visual"]
        if gap is not None:
            metrics["vepo/entropy_gap_abs_mean"] = s["gap"] / s["visual"]
            metrics["vepo/entropy_gap_positive_fraction"] = s["gap_positive"] / s["visual"]
        if score is not None:
            score_mean = s["score"] / s["visual"]
            metrics["vepo/score_mean"] = score_mean
            metrics["vepo/score_std"] = max(s["score_sq"] / s["visual"] - score_mean**2, 0.0) ** 0.5
        if s["kept_visual"] > 0:
            if signals.jsd is not None:
                metrics["vepo/jsd_selected_mean"] = s["jsd_kept"] / s["kept_visual"]
            if gap is not None:
                metrics["vepo/entropy_gap_abs_selected_mean"] = s["gap_kept"] / s["kept_visual"]
    if s["top_jsd"] > 0:
        metrics["vepo/top_jsd_missed_by_entropy"] = s["entropy_misses"] / s["top_jsd"]
        metrics["vepo/top_jsd_missed_by_selection"] = s["selection_misses"] / s["top_jsd"]
    return metrics
