"""The lab's report: `lab.md` (tables), `lab.json` (every number) and `lab_curves.png` (reward curves, accuracy)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path


__all__ = ["aggregate", "markdown_table", "plot_lab", "write_report"]


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
        }
    return out


def _tail_mean(curve: list[dict], key: str, n: int = 3) -> float | None:
    values = [e[key] for e in curve if key in e]
    return statistics.fmean(values[-n:]) if values else None


def _pct(mean_std) -> str:
    mean, std = mean_std
    return f"{100 * mean:.1f} ± {100 * std:.1f}"


def markdown_table(base: dict, summary: dict) -> str:
    kinds = sorted(base["per_kind"])
    lines = [
        "| strategy | held-out acc. before | after (mean ± sd) | gain (points) | "
        + " | ".join(f"{k} after" for k in kinds)
        + " | final reward | decision tokens selected (warm start) | selected that are decision tokens | "
        "JSD selected / all | s per run |",
        "|---|---:|---:|---:|" + "---:|" * len(kinds) + "---:|---:|---:|---:|---:|",
    ]
    for name, s in summary.items():
        sel = s["warm_start_selection"]
        ratio = sel.get("jsd_selected_mean", float("nan")) / max(sel.get("jsd_all_mean", float("nan")), 1e-12)
        reward = s["final_reward_mean_std"]
        lines.append(
            f"| {name} | {100 * s['accuracy_before']:.1f} | {_pct(s['accuracy_after_mean_std'])} | "
            f"{100 * s['gain_mean_std'][0]:+.1f} ± {100 * s['gain_mean_std'][1]:.1f} | "
            + " | ".join(f"{100 * s['accuracy_after_per_kind_mean'][k]:.1f}" for k in kinds)
            + f" | {reward[0]:.3f} ± {reward[1]:.3f}"
            + f" | {100 * sel.get('decision_tokens_selected', float('nan')):.0f}%"
            + f" | {100 * sel.get('selected_that_are_decision', float('nan')):.0f}%"
            + f" | {ratio:.2f}"
            + f" | {s['train_seconds_mean_std'][0]:.0f} |"
        )
    return "\n".join(lines)


def plot_lab(results: list[dict], base: dict, path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    strategies = list(dict.fromkeys(r["strategy"] for r in results))
    colours = dict(zip(strategies, ["#444444", "#d95f02", "#1b9e77", "#7570b3", "#e7298a", "#66a61e"]))
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4), dpi=80)
    for name in strategies:
        runs = [r for r in results if r["strategy"] == name]
        for i, r in enumerate(runs):
            steps = [e["step"] for e in r["curve"] if "reward" in e]
            rewards = [e["reward"] for e in r["curve"] if "reward" in e]
            left.plot(steps, rewards, color=colours[name], alpha=0.8, lw=1.2, label=name if i == 0 else None)
    left.set_xlabel("step")
    left.set_ylabel("mean reward (0.9 acc + 0.1 format)")
    left.set_title("training reward, each seed")
    left.legend(fontsize=8)
    xs = range(len(strategies))
    for x, name in zip(xs, strategies):
        after = [r["accuracy_after"] for r in results if r["strategy"] == name]
        right.scatter([x] * len(after), [100 * a for a in after], color=colours[name], zorder=3)
        right.bar(x, 100 * statistics.fmean(after), color=colours[name], alpha=0.35)
    right.axhline(100 * base["accuracy"], color="black", ls="--", lw=1, label="warm start")
    right.set_xticks(list(xs), strategies)
    right.set_ylabel("held-out greedy accuracy (%)")
    right.set_title("after RL (bar: mean, dots: seeds)")
    right.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def write_report(output_dir: str | Path, base: dict, results: list[dict], settings: dict) -> dict:
    output_dir = Path(output_dir)
    summary = aggregate(base, results)
    tokens = base["selection"].get("_tokens", {})
    text = [
        "# vepo-trl lab",
        "",
        f"Warm start: {base['build']['parameters']:,} parameters, SFT {base['build']['config']['sft_steps']} steps "
        f"({base['build']['build_seconds']:.0f} s to build), held-out greedy accuracy {100 * base['accuracy']:.1f}% "
        f"({', '.join(f'{k} {100 * v:.0f}%' for k, v in sorted(base['per_kind'].items()))}) on "
        f"{settings['eval_rows']} rows.",
        "",
        f"RL: {len(settings['seeds'])} seed(s) x {len(summary)} strategies, {settings['steps']} steps "
        f"(<= {settings['max_minutes']:g} min) each, {settings['prompts_per_step']} prompts x "
        f"{settings['num_generations']} samples per step, lr {settings['learning_rate']:g}, k = "
        f"{settings['selection_ratio']}, alpha = {settings['selection_alpha']}.",
        "",
        markdown_table(base, summary),
        "",
        "Decision tokens are the tokens that state what the image decides (the count, the colour). On the warm start "
        f"they are {100 * tokens.get('decision_share', float('nan')):.0f}% of the response tokens, with mean entropy "
        f"{tokens.get('entropy_decision_mean', float('nan')):.3f} nats against "
        f"{tokens.get('entropy_all_mean', float('nan')):.3f} over all tokens, and mean JSD "
        f"{tokens.get('jsd_decision_mean', float('nan')):.4f} against {tokens.get('jsd_all_mean', float('nan')):.4f}. "
        "The selection columns apply each rule to the warm start's sampled responses (same signals for every rule).",
        "",
    ]
    (output_dir / "lab.md").write_text("\n".join(text))
    (output_dir / "lab.json").write_text(
        json.dumps(
            {"settings": settings, "warm_start": base, "summary": summary, "runs": results}, indent=1, default=str
        )
    )
    plot_lab(results, base, output_dir / "lab_curves.png")
    return summary
