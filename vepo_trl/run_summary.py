"""What a run did, in words: the summary `vepo-trl demo` / `vepo-trl train` print and the model card's method line.

Every figure says what ran. A figure that does not apply to the run's strategy or perturbation is left out with the
reason ("no perturbed pass: strategy `entropy` needs none"); one that applies but was not logged reads "not logged",
never `nan`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from .perturb import RELEASE_NUM_GENERATIONS, annealed_noise_step
from .run_folder import write_text_atomically
from .scoring import SELECTION_STRATEGIES, get_strategy
from .utils import count


def method_name(strategy: str) -> str:
    """The training method in words: "VEPO" only for the paper's strategy."""
    if strategy == "vepo":
        return "VEPO"
    if strategy == "full":
        return "plain GRPO (every completion token)"
    if strategy == "entropy":
        return "GRPO on each response's top-k entropy tokens (the 80/20 baseline)"
    if strategy == "random":
        return "GRPO on randomly kept tokens (each with probability k)"
    if strategy == "vppo":
        return "GRPO with VPPO's token filter"
    source = SELECTION_STRATEGIES.source(strategy) if strategy in SELECTION_STRATEGIES else "vepo_trl"
    if source != "vepo_trl":
        return f"the selection strategy `{strategy}` (from {source})"
    return f"the VEPO ablation `{strategy}`"


def _own(params) -> list[str]:
    """A strategy's or perturbation's own settings as given (`strategy_params`, `perturbation_params`)."""
    return [f"{name} = {value!r}" for name, value in sorted((params or {}).items())]


def selection_text(args) -> str:
    strategy = get_strategy(args.selection_strategy)
    parts = [f"`{strategy.name}` ({strategy.description.rstrip('.')})"]
    if "ratio" in strategy.reads:
        parts.append(f"k = {args.selection_ratio:g}")
    if "alpha" in strategy.reads:
        parts.append(f"alpha = {args.selection_alpha:g}")
    return ", ".join([*parts, *_own(getattr(args, "strategy_params", None))])


def perturbation_text(args, noise_steps: list[float] | None = None, max_steps: int | None = None) -> str:
    """The perturbation with exactly the parameters it uses; the annealed noise step as the range it ran over."""
    name = args.perturbation
    if name == "diffusion":
        if not args.noise_annealing:
            return f"`diffusion` at noise step {args.noise_step}"
        if noise_steps:
            first, last = int(noise_steps[0]), int(noise_steps[-1])
        else:
            total = max(max_steps or 1, 1)
            kwargs = {
                "noise_step": args.noise_step,
                "coefficient": args.noise_annealing_coefficient,
                "midpoint": args.noise_annealing_midpoint,
            }
            first, last = annealed_noise_step(0, total, **kwargs), annealed_noise_step(total - 1, total, **kwargs)
        return f"`diffusion`, noise step annealed from {first} to {last} (schedule start {args.noise_step})"
    if name == "gaussian":
        return f"`gaussian`, sigma {args.noise_sigma:g} on normalised pixel values"
    if name == "gaussian_release":
        # The release adds the noise once per rollout of a prompt: this run's num_generations times (12 in the paper)
        rollouts = int(getattr(args, "num_generations", None) or RELEASE_NUM_GENERATIONS)
        effective = args.noise_sigma * math.sqrt(rollouts)
        return (
            f"`gaussian_release`, sigma {args.noise_sigma:g} accumulated over {rollouts} rollouts "
            f"(effective sigma {effective:.2f}, as the authors' release accumulates it)"
        )
    if name == "patch_blackout":
        return f"`patch_blackout`, each patch blacked out with probability {args.patch_probability:g}"
    return ", ".join([f"`{name}`", *_own(getattr(args, "perturbation_params", None))])


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return sum(values) / len(values) if values else None


def _percent(value: float | None) -> str:
    return "not logged" if value is None else f"{value:.1%}"


def _number(value: float | None, digits: int = 4) -> str:
    return "not logged" if value is None else f"{value:.{digits}f}"


def write_metrics(trainer) -> Path:
    """Every entry of the trainer's log history as one JSON line in `output_dir/metrics.jsonl` (written whole to a
    temporary file, then renamed over an earlier run's: that one stays until this one exists)."""
    path = Path(trainer.args.output_dir) / "metrics.jsonl"
    write_text_atomically(path, "".join(json.dumps(entry) + "\n" for entry in trainer.state.log_history))
    return path


def run_summary(trainer, seconds: float, command: str = "demo") -> str:
    """The summary of a finished run, from its arguments, its strategy and its logged metrics."""
    args = trainer.args
    strategy = get_strategy(args.selection_strategy)
    steps = [entry for entry in trainer.state.log_history if "loss" in entry]

    def series(name):
        return [entry[name] for entry in steps if name in entry]

    import re

    model_name = str(getattr(trainer.model.config, "_name_or_path", "") or "the model")
    # A built-in tiny model is cached as `<cache>/tiny-<family>-seed<N>`: named by its family, not by the cache path
    built_in = re.search(r"tiny-(.+)-seed\d+/?$", model_name)
    tiny = built_in is not None
    if tiny:
        model_name = f"the tiny random {built_in.group(1)} model `tiny-{built_in.group(1)}`"
    elif "lab-warm-start" in model_name:
        model_name = "the lab's warm start, a small Qwen2.5-VL supervised-fine-tuned on the lab's colour task"
    parameters = sum(p.numel() for p in trainer.model.parameters())
    device = trainer.accelerator.device.type
    where = "the CPU" if device == "cpu" else f"{trainer.accelerator.num_processes} x {device.upper()}"
    lines = [
        f"# vepo-trl {command}",
        "",
        f"Trained {model_name} ({parameters:,} parameters) with {method_name(strategy.name)} for "
        f"{count(trainer.state.global_step, 'step')} in {seconds:.0f} s on {where}.",
        "",
        f"- Selection: {selection_text(args)}.",
    ]
    if strategy.needs_perturbed_pass:
        skipped = getattr(trainer, "num_skipped_completions", 0)
        scored = trainer.num_perturbed_completions
        skip_note = (
            f" ({skipped} more had a zero advantage, so their selection could not change the loss and their "
            "perturbed forward was skipped)"
            if skipped
            else ""
        )
        lines.append(
            f"- Perturbation: {perturbation_text(args, series('vepo/noise_step'), trainer.state.max_steps)}; "
            f"{scored} sampled completions each went through one perturbed-image forward{skip_note}."
        )
    else:
        lines.append(f"- No perturbed pass: strategy `{strategy.name}` needs none.")
    if not steps:
        lines.append(
            f"- No training step was logged (logging_steps {args.logging_steps:g}, "
            f"{count(trainer.state.global_step, 'step')}), so there are no per-step figures; lower `--logging_steps` to get them."
        )
    else:
        rewards = series("reward")
        quarter = max(1, len(rewards) // 4)
        start, end = _mean(rewards[:quarter]), _mean(rewards[-quarter:])
        reward = "not logged" if start is None else f"{start:.3f} -> {end:.3f}"
        lines.append(f"- Reward (mean of the first / last quarter of {count(len(steps), 'logged step')}): {reward}.")
        fraction = _mean(series("vepo/selected_fraction"))
        if fraction is None and strategy.count == "all":
            lines.append("- Tokens trained on: every valid completion token.")
        else:
            lines.append(f"- Tokens trained on: {_percent(fraction)} of valid completion tokens.")
        if strategy.needs_perturbed_pass:
            jsd, gap = _mean(series("vepo/jsd_mean")), _mean(series("vepo/entropy_gap_abs_mean"))
            if jsd is None and gap is None and trainer.num_perturbed_completions == 0:
                lines.append(
                    "- Mean JSD and |entropy gap|: none measured, no completion went through the perturbed forward."
                )
            else:
                lines.append(
                    f"- Mean JSD between clean and perturbed next-token distributions: {_number(jsd)} nats; "
                    f"mean |entropy gap| {_number(gap)} nats."
                )
            if args.log_selection_diagnostics:
                missed_entropy = _mean(series("vepo/top_jsd_missed_by_entropy"))
                missed_selection = _mean(series("vepo/top_jsd_missed_by_selection"))
                lines.append(
                    f"- Of each response's top-k JSD tokens, top-k entropy would miss {_percent(missed_entropy)}; "
                    f"this run's selection misses {_percent(missed_selection)} (the paper's Fig. 5c diagnostic)."
                )
    lines += [
        "",
        f"Saved to `{args.output_dir}`: the model and processor (load with "
        "`AutoModelForImageTextToText.from_pretrained`), per-step metrics `metrics.jsonl`, this summary `summary.md` "
        "and the model card `README.md`.",
    ]
    if "lab-warm-start" in str(getattr(trainer.model.config, "_name_or_path", "")):
        lines += ["", "Compare selection strategies from this warm start over several seeds with `vepo-trl lab`."]
    if tiny:
        lines += [
            "",
            "A random tiny model learns nothing useful; the run shows the pipeline a GPU run uses. For the paper's "
            "run see `recipes/README.md`.",
        ]
    return "\n".join(lines) + "\n"


def write_run_report(trainer, seconds: float, command: str = "demo") -> str:
    """Write `metrics.jsonl` and `summary.md` next to the saved model; return the summary."""
    write_metrics(trainer)
    summary = run_summary(trainer, seconds, command)
    write_text_atomically(Path(trainer.args.output_dir) / "summary.md", summary)
    return summary
