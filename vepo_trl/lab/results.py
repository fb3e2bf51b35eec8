"""The lab's report: `lab.md` (tables), `lab.json` (every number) and `lab_curves.png` (reward curves, accuracy)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path


__all__ = ["aggregate", "markdown_table", "plot_lab", "sweep_table", "write_report", "write_sweep_report"]


def _mean_std(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if v is not None]
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def aggregate(base: dict, results: list[dict]) -> dict:
    """Per strategy: accuracy after (mean, std over seeds), gain over the warm start, selection statistics."""
    strategies = list(dict.fromkeys(r["strategy"] for r in results))
    out = {}
    for name in strategies:
        runs = [r for r in results if r["strategy"] == name]
        after = [r["accuracy_after"] for r in runs]
        kinds = sorted({k for r in runs for k in r["accuracy_after_per_kind"]})
        warm_sel = base["selection"].get(name, {})
        after_sel = [r["selection_after"] for r in runs]
        out[name] = {
            "seeds": [r["seed"] for r in runs],
            "accuracy_before": base["accuracy"],
            "accuracy_after": after,
            "accuracy_after_mean_std": _mean_std(after),
            "gain_mean_std": _mean_std([a - base["accuracy"] for a in after]),
            "accuracy_after_per_kind_mean": {
                k: _mean_std([r["accuracy_after_per_kind"].get(k) for r in runs])[0] for k in kinds
            },
            "train_seconds_mean_std": _mean_std([r["train_seconds"] for r in runs]),
            "steps": [r["steps"] for r in runs],
            "warm_start_selection": warm_sel,
            "selection_after_mean": {
                key: _mean_std([s[key] for s in after_sel])[0] for key in (after_sel[0] if after_sel else {})
            },
            "final_reward_mean_std": _mean_std([_tail_mean(r["curve"], "reward") for r in runs]),
            "learning_rate": runs[0].get("learning_rate"),
            "accuracy_after_ci95": mean_ci(after),
            "tokens_trained_mean": _mean_or_none([r.get("tokens_trained") for r in runs]),
            "completion_tokens_mean": _mean_or_none([r.get("completion_tokens") for r in runs]),
            "perturbed_forwards_mean": _mean_or_none([r.get("perturbed_forwards") for r in runs]),
        }
    return out


def _mean_or_none(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def mean_ci(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """Student-t confidence interval of the mean over seeds."""
    from scipy import stats

    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return (float("nan"), float("nan"))
    half = stats.t.ppf(0.5 + level / 2, n - 1) * statistics.stdev(values) / n**0.5
    return (mean - half, mean + half)


def paired_comparison(a: dict[int, float], b: dict[int, float], effect: float = 0.03, alpha: float = 0.05) -> dict:
    """Rule A against rule B over the seeds both ran (same seed: same warm start, prompts and order): the mean
    per-seed difference with its 95% t interval, the paired t-test and Wilcoxon signed-rank p-values, the power of
    the t-test against a true difference of `effect`, and the smallest difference it detects with 80% power
    (two-sided, `alpha`), both from the observed spread of the differences."""
    from scipy import stats

    seeds = sorted(set(a) & set(b))
    # Rounded: accuracies are counts over the same rows, so equal differences must compare equal (Wilcoxon's ties)
    diffs = [round(a[s] - b[s], 9) for s in seeds]
    n = len(diffs)
    out = {"seeds": seeds, "differences": diffs, "n": n, "mean_difference": statistics.fmean(diffs) if diffs else None}
    if n < 2:
        return out
    sd = statistics.stdev(diffs)
    se = sd / n**0.5
    df = n - 1
    t_crit = stats.t.ppf(1 - alpha / 2, df)
    out.update(
        sd_difference=sd,
        ci95=(out["mean_difference"] - t_crit * se, out["mean_difference"] + t_crit * se),
        wins=sum(d > 0 for d in diffs),
        losses=sum(d < 0 for d in diffs),
        t_test_p=float(stats.ttest_rel([a[s] for s in seeds], [b[s] for s in seeds]).pvalue) if sd > 0 else None,
        wilcoxon_p=float(stats.wilcoxon(diffs).pvalue) if any(diffs) else None,
    )
    if se > 0:
        nc = effect / se
        out["power_at_effect"] = float(1 - stats.nct.cdf(t_crit, df, nc) + stats.nct.cdf(-t_crit, df, nc))
        out["detectable_at_80_power"] = float((t_crit + stats.t.ppf(0.8, df)) * se)
    out["effect"] = effect
    return out


# Which rules the report compares, pair by pair: every rule against full GRPO; VEPO against top-k entropy and random
# at the same k
def comparison_pairs(labels: list[str]) -> list[tuple[str, str]]:
    pairs = []
    for label in labels:
        strategy, _, k = label.partition(":")
        if label != "full" and "full" in labels:
            pairs.append((label, "full"))
        if strategy == "vepo":
            for other in ("entropy", "random"):
                rival = f"{other}:{k}" if k else other
                if rival in labels:
                    pairs.append((label, rival))
    return pairs


def paired_table(results: list[dict]) -> tuple[list[dict], str]:
    """`paired_comparison` for each of `comparison_pairs`, and a markdown table of them."""
    by_rule: dict[str, dict[int, float]] = {}
    steps: dict[str, dict[int, int]] = {}
    for r in results:
        by_rule.setdefault(r["strategy"], {})[r["seed"]] = r["accuracy_after"]
        steps.setdefault(r["strategy"], {})[r["seed"]] = r["steps"]
    rows = []
    unequal = []
    lines = [
        "| A vs B | seeds | mean A - B (points) | 95% CI | A better / worse | paired t p | Wilcoxon p | "
        "power at 3 points | detectable (80% power) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for a, b in comparison_pairs(list(by_rule)):
        # A pair compares equal training: a run the time cap cut short is not paired with a longer one
        seeds = [s for s in by_rule[a] if s in by_rule[b] and steps[a][s] == steps[b][s]]
        left_out = sorted(s for s in by_rule[a] if s in by_rule[b] and s not in seeds)
        unequal += [f"{a} vs {b} seed {s} ({steps[a][s]} vs {steps[b][s]} steps)" for s in left_out]
        c = paired_comparison({s: by_rule[a][s] for s in seeds}, {s: by_rule[b][s] for s in seeds})
        rows.append({"a": a, "b": b, **c, "left_out_unequal_steps": left_out})
        if c["n"] < 2:
            continue
        lines.append(
            f"| {a} vs {b} | {c['n']} | {100 * c['mean_difference']:+.1f} | "
            f"[{100 * c['ci95'][0]:+.1f}, {100 * c['ci95'][1]:+.1f}] | {c['wins']} / {c['losses']} | "
            f"{_or_na(c['t_test_p'], '.3f')} | {_or_na(c['wilcoxon_p'], '.3f')} | "
            f"{_or_na(c.get('power_at_effect'), '.0%')} | {_or_na(c.get('detectable_at_80_power'), '.1f', 100)} |"
        )
    if unequal:
        lines += ["", f"Left out of the pairs, runs of unequal length: {'; '.join(unequal)}."]
    return rows, "\n".join(lines)


def _tail_mean(curve: list[dict], key: str, n: int = 3) -> float | None:
    values = [e[key] for e in curve if key in e]
    return statistics.fmean(values[-n:]) if values else None


def _or_na(value: float | None, spec: str, scale: float = 1.0) -> str:
    """`value * scale` formatted with `spec`, or "n/a" where there is no value."""
    return "n/a" if value is None else format(scale * value, spec)


def _pct(mean_std) -> str:
    mean, std = mean_std
    return f"{100 * mean:.1f} ± {100 * std:.1f}"


def _interval(low: float, high: float) -> str:
    """A 95% interval in points; with one seed there is none to give (not `[nan, nan]`)."""
    return "n/a (one seed)" if math.isnan(low) or math.isnan(high) else f"[{100 * low:.1f}, {100 * high:.1f}]"


def markdown_table(base: dict, summary: dict) -> str:
    """Accuracy per rule (mean ± sd over seeds, its 95% interval, per seed), gain, selection and compute."""
    lines = [
        "| rule | lr | after, mean ± sd | 95% CI | per seed | gain (points) | decision tokens selected (warm start) | "
        "selected that are decision tokens | JSD selected / all | tokens trained | perturbed forwards | s per run |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in summary.items():
        sel = s["warm_start_selection"]
        ratio = sel.get("jsd_selected_mean", float("nan")) / max(sel.get("jsd_all_mean", float("nan")), 1e-12)
        low, high = s.get("accuracy_after_ci95", (float("nan"), float("nan")))
        lr = s.get("learning_rate")
        lines.append(
            f"| {name} | {'' if lr is None else f'{lr:g}'} | {_pct(s['accuracy_after_mean_std'])} | "
            f"{_interval(low, high)} | {', '.join(f'{100 * a:.0f}' for a in s['accuracy_after'])} | "
            f"{100 * s['gain_mean_std'][0]:+.1f} ± {100 * s['gain_mean_std'][1]:.1f}"
            + f" | {100 * sel.get('decision_tokens_selected', float('nan')):.0f}%"
            + f" | {100 * sel.get('selected_that_are_decision', float('nan')):.0f}%"
            + f" | {ratio:.2f}"
            + f" | {_or_na(s.get('tokens_trained_mean'), ',.0f')}"
            + f" | {_or_na(s.get('perturbed_forwards_mean'), ',.0f')}"
            + f" | {s['train_seconds_mean_std'][0]:.0f} |"
        )
    return "\n".join(lines)


def plot_lab(results: list[dict], base: dict, path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    strategies = list(dict.fromkeys(r["strategy"] for r in results))
    palette = ["#444444", "#d95f02", "#1b9e77", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d"]
    colours = {name: palette[i % len(palette)] for i, name in enumerate(strategies)}
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), dpi=80)
    for name in strategies:
        # The mean over seeds at each logged step (a seed's own curve is too noisy to read among dozens)
        by_step: dict[int, list[float]] = {}
        for r in results:
            if r["strategy"] == name:
                for e in r["curve"]:
                    if "reward" in e:
                        by_step.setdefault(e["step"], []).append(e["reward"])
        steps = sorted(by_step)
        means = [statistics.fmean(by_step[step]) for step in steps]
        window = max(1, len(steps) // 10)  # a moving average over a tenth of the run
        smooth = [statistics.fmean(means[max(0, i - window + 1) : i + 1]) for i in range(len(means))]
        left.plot(steps, smooth, color=colours[name], lw=1.5, label=name)
    left.set_xlabel("step")
    left.set_ylabel("mean reward (0.9 acc + 0.1 format)")
    left.set_title("training reward, mean over seeds")
    left.legend(fontsize=8)
    xs = range(len(strategies))
    for x, name in zip(xs, strategies):
        after = [r["accuracy_after"] for r in results if r["strategy"] == name]
        right.scatter([x] * len(after), [100 * a for a in after], color=colours[name], zorder=3)
        right.bar(x, 100 * statistics.fmean(after), color=colours[name], alpha=0.35)
    right.axhline(100 * base["accuracy"], color="black", ls="--", lw=1, label="warm start")
    right.set_xticks(list(xs), strategies, rotation=30, ha="right", fontsize=8)
    right.set_ylabel("held-out greedy accuracy (%)")
    right.set_title("after RL (bar: mean, dots: seeds)")
    right.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def _cut_note(results: list[dict], settings: dict) -> str:
    """Which runs the per-run time cap stopped before `steps` (none: an empty note)."""
    cut = [r for r in results if r["steps"] < settings["steps"]]
    if not cut:
        return ""
    runs = ", ".join(f"{r['strategy']} seed {r['seed']} ({r['steps']})" for r in cut)
    return (
        f" (**{len(cut)} of {len(results)} runs were stopped early by the {settings['max_minutes']:g}-minute cap**: "
        f"{runs} steps; paired comparisons use equal-length runs only)"
    )


def write_report(output_dir: str | Path, base: dict, results: list[dict], settings: dict) -> dict:
    output_dir = Path(output_dir)
    summary = aggregate(base, results)
    comparisons, paired = paired_table(results)
    tokens = base["selection"].get("_tokens", {})
    text = [
        "# vepo-trl lab",
        "",
        f"Warm start: {base['build']['parameters']:,} parameters, SFT {base['build']['config']['sft_steps']} steps "
        f"({base['build']['build_seconds']:.0f} s to build), held-out greedy accuracy {100 * base['accuracy']:.1f}% "
        f"({', '.join(f'{k} {100 * v:.0f}%' for k, v in sorted(base['per_kind'].items()))}) on "
        f"{settings['eval_rows']} rows.",
        "",
        f"Task `{settings['warm_start']['task']}`. RL: {len(settings['seeds'])} seed(s) x {len(summary)} rules, "
        f"{settings['steps']} steps (<= {settings['max_minutes']:g} min) each{_cut_note(results, settings)}, "
        f"{settings['prompts_per_step']} prompts "
        f"x {settings['num_generations']} samples per step, alpha = {settings['selection_alpha']}, learning rate per "
        "rule as in the table; the same seed gives every rule the same prompts in the same order"
        + (
            f"; {settings['wall_seconds'] / 60:.1f} min with {settings['jobs']} job(s)."
            if "wall_seconds" in settings
            else "."
        )
        + " Accuracy: greedy, on the held-out rows.",
        "",
        markdown_table(base, summary),
        "",
        "Paired across seeds (A - B per seed; power and detectable difference from the observed spread of the "
        "differences, two-sided t-test at 0.05):",
        "",
        paired,
        "",
        "Decision tokens are the tokens that state what the image decides (a count, a colour). On the warm start "
        f"they are {100 * tokens.get('decision_share', float('nan')):.0f}% of the response tokens, with mean entropy "
        f"{tokens.get('entropy_decision_mean', float('nan')):.3f} nats against "
        f"{tokens.get('entropy_all_mean', float('nan')):.3f} over all tokens, and mean JSD "
        f"{tokens.get('jsd_decision_mean', float('nan')):.4f} against {tokens.get('jsd_all_mean', float('nan')):.4f}. "
        "The selection columns apply each rule to the warm start's sampled responses (same signals for every rule). "
        "Tokens trained: completion tokens in the loss mask over the run; perturbed forwards: completions that went "
        "through the noisy-image pass.",
        "",
    ]
    (output_dir / "lab.md").write_text("\n".join(text))
    (output_dir / "lab.json").write_text(
        json.dumps(
            {"settings": settings, "warm_start": base, "summary": summary, "paired": comparisons, "runs": results},
            separators=(",", ":"),  # compact: every run's curve and per-row outcomes make an indented file large
            default=str,
        )
    )
    plot_lab(results, base, output_dir / "lab_curves.png")
    return summary


def sweep_table(results: list[dict]) -> tuple[dict[str, float], dict[str, dict[float, list[float]]], str]:
    """Per rule and learning rate, the validation accuracies over seeds; each rule's best learning rate (highest
    mean, the lower rate on a tie); a markdown table of both."""
    grid: dict[str, dict[float, list[float]]] = {}
    for r in results:
        grid.setdefault(r["strategy"], {}).setdefault(r["learning_rate"], []).append(r["accuracy_after"])
    rates = sorted({lr for by_lr in grid.values() for lr in by_lr})
    best = {label: min(by_lr, key=lambda lr: (-statistics.fmean(by_lr[lr]), lr)) for label, by_lr in grid.items()}
    lines = [
        "| rule | " + " | ".join(f"lr {lr:g}" for lr in rates) + " | best |",
        "|---|" + "---:|" * len(rates) + "---:|",
    ]
    for label, by_lr in grid.items():
        cells = []
        for lr in rates:
            values = by_lr.get(lr)
            text = "" if not values else f"{_pct(_mean_std(values))} ({', '.join(f'{100 * v:.0f}' for v in values)})"
            cells.append(f"**{text}**" if lr == best[label] and values else text)
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {best[label]:g} |")
    return best, grid, "\n".join(lines)


def write_sweep_report(output_dir: str | Path, results: list[dict], settings: dict) -> dict[str, float]:
    """`sweep.md` and `sweep.json`: validation accuracy per rule x learning rate (mean ± sd, per seed), the best."""
    output_dir = Path(output_dir)
    best, grid, table = sweep_table(results)
    flag = ",".join(f"{label}={lr:g}" for label, lr in best.items())
    text = [
        "# vepo-trl lab: learning-rate sweep",
        "",
        f"Task `{settings['warm_start']['task']}`; {len(settings['seeds'])} seeds ({', '.join(map(str, settings['seeds']))}) "
        f"x {len(grid)} rules x {len(settings['sweep_learning_rates'])} learning rates, {settings['steps']} steps each"
        f"{_cut_note(results, settings).replace('paired comparisons use equal-length runs only', 'compare with care')} "
        f"({settings['wall_seconds'] / 60:.1f} min with {settings['jobs']} job(s)). Accuracy is greedy, on "
        f"{settings['eval_rows']} validation rows (neither training nor the lab's held-out rows), so choosing on it "
        "does not bias the lab's comparison. Cells: mean ± sd (per seed); bold: each rule's best.",
        "",
        table,
        "",
        f"The lab with these: `--learning_rates {flag}`",
        "",
    ]
    (output_dir / "sweep.md").write_text("\n".join(text))
    (output_dir / "sweep.json").write_text(
        json.dumps(
            {
                "settings": settings,
                "best_learning_rates": best,
                "grid": {k: {str(lr): v for lr, v in by_lr.items()} for k, by_lr in grid.items()},
                "runs": [{k: v for k, v in r.items() if k not in ("curve", "examples_after")} for r in results],
            },
            indent=1,
            default=str,
        )
    )
    return best
