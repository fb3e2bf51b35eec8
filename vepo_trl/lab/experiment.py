"""`vepo-trl lab`: GRPO from the warm start with several token-selection strategies over several seeds.

Each run trains the warm start with `VEPOTrainer` (accuracy 0.9 + format 0.1, the paper's rewards) for a fixed number
of steps, and measures held-out greedy accuracy before and after. The selection statistics (which tokens each rule
keeps) are measured on the models themselves with the library's scoring code (`vepo_trl.insight.signals`): sampled
responses, a clean and a perturbed teacher-forced pass, then every strategy's selection over the same signals.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

import torch

from ..builtin.lab_tasks import COLOURS, DEFAULT_TASK, MAX_COUNT, get_task, make_rl_dataset
from ..builtin.warm_start import WarmStartConfig, evaluate_accuracy, heldout_dataset, warm_start_path
from ..run_folder import LAB_RECORD  # noqa: F401  (the lab's record, by its name here)
from ..utils import count


__all__ = [
    "Arm",
    "LabSettings",
    "QUICK",
    "decision_token_mask",
    "lab_settings",
    "parse_arm",
    "run_lab",
    "run_one",
    "selection_statistics",
]

# Rules whose selection the warm start's statistics always show, whatever the lab compares
WARM_START_RULES = ("full", "entropy", "vepo", "random")
DECISION_WORDS = frozenset([*(str(n) for n in range(1, MAX_COUNT + 1)), *COLOURS])


@dataclass(frozen=True)
class Arm:
    """One compared rule: a selection strategy and the fraction k of each response it trains on."""

    strategy: str
    ratio: float

    @property
    def label(self) -> str:
        """`full`, or `vepo:0.4`: the name in tables, `--strategies` and `--learning_rates`."""
        return "full" if self.strategy == "full" else f"{self.strategy}:{self.ratio:g}"

    @property
    def slug(self) -> str:
        return self.label.replace(":", "-k")


def parse_arm(text: str, default_ratio: float) -> Arm:
    """`vepo` (k = `default_ratio`) or `vepo:0.4`. Raises `ValueError` with a one-line reason."""
    name, _, ratio = text.strip().partition(":")
    if not ratio:
        return Arm(name, default_ratio)
    try:
        value = float(ratio)
    except ValueError:
        raise ValueError(f"{text!r}: k after the colon is a fraction, e.g. vepo:0.4") from None
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{text!r}: k must be in (0, 1], got {value:g}")
    return Arm(name, value)


@dataclass
class LabSettings:
    task: str = DEFAULT_TASK
    # Compared rules: a strategy (`vepo-trl strategies`), optionally with its k (`vepo:0.4`); bare names use
    # `selection_ratio`
    strategies: tuple[str, ...] = ("full", "entropy", "vepo", "random")
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 100
    max_minutes: float = 5.0  # a run stops at this wall time whatever `steps` says
    learning_rate: float = 3e-4  # for rules `learning_rates` does not name
    # Per-rule learning rates (label -> lr), each rule's best from `vepo-trl lab --sweep`
    learning_rates: dict[str, float] = field(default_factory=dict)
    num_generations: int = 8
    prompts_per_step: int = 4
    max_completion_length: int = 28
    # Tokens generated for the held-out accuracy and the selection statistics (default: max_completion_length)
    eval_max_new_tokens: int | None = None
    selection_ratio: float = 0.2
    selection_alpha: float = 0.7
    # A compared strategy's own settings (a plug-in's), by strategy name: {"confident_visual": {"sharpness": 1.0}}
    strategy_params: dict[str, dict] | None = None
    train_rows: int = 1024
    eval_rows: int = 120
    stats_prompts: int = 24  # prompts whose sampled responses measure the selection statistics
    logging_steps: int = 5
    jobs: int = 1  # runs in parallel (processes of one thread each)
    warm_start: WarmStartConfig = field(default_factory=lambda: WarmStartConfig.for_task(DEFAULT_TASK))

    @property
    def eval_tokens(self) -> int:
        return self.eval_max_new_tokens or self.max_completion_length

    def arms(self) -> list[Arm]:
        return list(dict.fromkeys(parse_arm(text, self.selection_ratio) for text in self.strategies))

    def learning_rate_of(self, arm: Arm) -> float:
        return self.learning_rates.get(arm.label, self.learning_rate)


# Each task's lab: the rules compared, the budget, the learning rates from its sweep (docs/lab/sweep/)
TASK_SETTINGS: dict[str, dict] = {
    # The first lab (docs/lab-colour/): one colour token per ~20-token response, one learning rate for all
    "colour": dict(
        strategies=("full", "entropy", "vepo", "random"),
        seeds=(0, 1, 2),
        steps=100,
        learning_rate=3e-4,
        max_completion_length=28,
        eval_max_new_tokens=32,
        eval_rows=120,
        logging_steps=5,
    ),
    "squares": dict(
        strategies=("full", "entropy:0.2", "vepo:0.2", "random:0.2", "entropy:0.4", "vepo:0.4"),
        seeds=tuple(range(14)),  # paired differences of about 3 points visible (docs/lab/lab.md: power)
        steps=40,
        learning_rate=3e-4,
        # Each rule's best of 7.5e-5, 1.5e-4, 3e-4, 6e-4 on validation rows, seeds 100 and 101 (docs/lab/sweep/)
        learning_rates={
            "full": 7.5e-5,
            "entropy:0.2": 7.5e-5,
            "vepo:0.2": 7.5e-5,
            "random:0.2": 7.5e-5,
            "entropy:0.4": 3e-4,
            "vepo:0.4": 7.5e-5,
        },
        max_completion_length=56,
        eval_rows=400,
        logging_steps=1,  # every step's selected fraction and lengths: the tokens each rule trained on
    ),
}


def lab_settings(task: str = DEFAULT_TASK, **overrides) -> LabSettings:
    """The lab of `task` (:data:`TASK_SETTINGS`), with `overrides`."""
    get_task(task)
    return LabSettings(
        **{"task": task, "warm_start": WarmStartConfig.for_task(task), **TASK_SETTINGS[task], **overrides}
    )


# CI: two short runs of two strategies from a warm start built with few SFT steps
QUICK = dict(
    strategies=("full", "vepo"),
    seeds=(0,),
    steps=8,
    max_minutes=1.0,
    eval_rows=20,
    train_rows=64,
    stats_prompts=4,
    logging_steps=1,
)
QUICK_WARM_START = dict(sft_rows=512, sft_steps=60, eval_rows=20)


def decision_token_mask(token_texts: list[str]) -> list[bool]:
    """Tokens that state what the image decides: a count (1..6) or a colour word."""
    return [text.strip().rstrip(".}").lstrip("{") in DECISION_WORDS for text in token_texts]


@torch.no_grad()
def selection_statistics(
    model,
    processor,
    dataset,
    strategies,
    *,
    num_prompts: int,
    num_generations: int = 4,
    ratio: float = 0.2,
    alpha: float = 0.7,
    seed: int = 0,
    max_new_tokens: int = 32,
    strategy_params: dict[str, dict] | None = None,
) -> dict[str, dict]:
    """Per rule (a strategy name at k = `ratio`, `vepo:0.4`, or an `Arm`), over sampled responses of `num_prompts`
    rows: the share of the decision tokens (count, colour) it selects, the share of selected tokens that are decision
    tokens, and mean JSD / entropy of selected vs all tokens. Every rule ranks the same tokens with the same signals
    (clean and perturbed pass at the paper's settings). Keys are the names as given."""
    from ..insight.signals import SignalSettings, completion_signals, encode_prompt, sample_completions
    from ..scoring import get_strategy, select_tokens

    model.eval()
    tokenizer = processor.tokenizer
    arms = {
        (name.label if isinstance(name, Arm) else name): name if isinstance(name, Arm) else parse_arm(name, ratio)
        for name in strategies
    }
    totals = {
        name: dict(decision_kept=0, decision=0, kept=0, kept_decision=0, jsd_kept=0.0, h_kept=0.0) for name in arms
    }
    all_tokens = dict(n=0, jsd=0.0, h=0.0, decision=0, h_decision=0.0, jsd_decision=0.0)
    settings = SignalSettings(strategy="vepo", ratio=ratio, alpha=alpha, seed=seed)
    for index in range(min(num_prompts, len(dataset))):
        row = dataset[index]
        prompt = encode_prompt(processor, row["prompt"], row["images"])
        completions = sample_completions(
            model, processor, prompt, num_generations, max_new_tokens=max_new_tokens, seed=seed + index
        )
        completions = [c for c in completions if c]
        if not completions:
            continue
        example = completion_signals(model, processor, prompt, completions, settings)
        mask, signals = example.mask, example.signals
        decision = torch.zeros_like(mask)
        for r, ids in enumerate(completions):
            texts = [tokenizer.decode([t]) for t in ids]
            decision[r, : len(ids)] = torch.tensor(decision_token_mask(texts), device=mask.device)
        jsd, entropy = signals.jsd.float(), signals.entropy.float()
        all_tokens["n"] += int(mask.sum())
        all_tokens["jsd"] += float(jsd[mask].sum())
        all_tokens["h"] += float(entropy[mask].sum())
        all_tokens["decision"] += int(decision.sum())
        all_tokens["h_decision"] += float(entropy[decision].sum())
        all_tokens["jsd_decision"] += float(jsd[decision].sum())
        for name, arm in arms.items():
            strategy = get_strategy(arm.strategy)
            seeds = None
            if strategy.count == "random":
                seeds = torch.arange(len(completions)) * 7919 + seed * 104729 + index  # cpu: seeds, read by tolist()
            params = (strategy_params or {}).get(arm.strategy)
            selected = select_tokens(strategy, signals, mask, ratio=arm.ratio, alpha=alpha, seeds=seeds, params=params)
            selected &= mask
            t = totals[name]
            t["decision"] += int(decision.sum())
            t["decision_kept"] += int((selected & decision).sum())
            t["kept"] += int(selected.sum())
            t["kept_decision"] += int((selected & decision).sum())
            t["jsd_kept"] += float(jsd[selected].sum())
            t["h_kept"] += float(entropy[selected].sum())
    n = max(all_tokens["n"], 1)
    out = {}
    for name, t in totals.items():
        out[name] = {
            "decision_tokens_selected": t["decision_kept"] / max(t["decision"], 1),
            "selected_that_are_decision": t["kept_decision"] / max(t["kept"], 1),
            "selected_fraction": t["kept"] / n,
            "jsd_selected_mean": t["jsd_kept"] / max(t["kept"], 1),
            "jsd_all_mean": all_tokens["jsd"] / n,
            "entropy_selected_mean": t["h_kept"] / max(t["kept"], 1),
            "entropy_all_mean": all_tokens["h"] / n,
        }
    out["_tokens"] = {
        "tokens": all_tokens["n"],
        "decision_share": all_tokens["decision"] / n,
        "entropy_decision_mean": all_tokens["h_decision"] / max(all_tokens["decision"], 1),
        "jsd_decision_mean": all_tokens["jsd_decision"] / max(all_tokens["decision"], 1),
        "entropy_all_mean": all_tokens["h"] / n,
        "jsd_all_mean": all_tokens["jsd"] / n,
    }
    return out


def _load(path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
    return model, AutoProcessor.from_pretrained(path)


class _TimeLimit:
    """Stop training once `seconds` of wall time have passed (checked after every step)."""

    def __new__(cls, seconds: float):
        from transformers import TrainerCallback

        class TimeLimit(TrainerCallback):
            def __init__(self):
                self.start = time.perf_counter()
                self.stopped_early = False

            def on_step_end(self, args, state, control, **kwargs):
                if time.perf_counter() - self.start > seconds:
                    control.should_training_stop = True
                    self.stopped_early = True

        return TimeLimit()


def validation_dataset(config: WarmStartConfig, num_rows: int):
    """Rows for choosing learning rates (`vepo-trl lab --sweep`): neither training nor the held-out rows."""
    return make_rl_dataset(
        num_rows, seed=20_000 + config.seed, image_size=config.image_size, kinds=get_task(config.task).kinds
    )


# What a run's curve keeps of each logged step: rewards, lengths, and the selection's own figures
CURVE_KEYS = frozenset(
    [
        "step",
        "reward",
        "reward_std",
        "entropy",
        "completions/mean_length",
        "vepo/selected_fraction",
        "vepo/jsd_mean",
        "vepo/jsd_selected_mean",
        "vepo/entropy_selected_mean",
        "vepo/top_jsd_missed_by_entropy",
        "vepo/top_jsd_missed_by_selection",
    ]
)


def curve_entry(logged: dict) -> dict:
    return {k: v for k, v in logged.items() if k in CURVE_KEYS or (k.startswith("rewards/") and k.endswith("/mean"))}


def training_compute(curve: list[dict], completions_per_step: int) -> dict:
    """Tokens each run trained on, from its per-step log (`logging_steps=1`): completion tokens x selected
    fraction, summed over steps; `None` where the log is coarser (an average over steps cannot be summed)."""
    per_step = [e.get("step") for e in curve] == list(range(1, len(curve) + 1))
    if not curve or not per_step or any("completions/mean_length" not in e for e in curve):
        return {"completion_tokens": None, "tokens_trained": None}
    tokens = [e["completions/mean_length"] * completions_per_step for e in curve]
    kept = [t * e.get("vepo/selected_fraction", 1.0) for t, e in zip(tokens, curve)]
    return {"completion_tokens": round(sum(tokens)), "tokens_trained": round(sum(kept))}


def run_one(
    warm_path: str, arm: Arm | str, seed: int, settings: LabSettings, output_dir: str, validation: bool = False
) -> dict:
    """Train one rule (`arm`) from the warm start with one seed; return (and write) its result. The seed fixes the
    data order and sampling: the same seed gives every rule the same prompts in the same order. `validation`
    measures accuracy on the validation rows (learning-rate sweep) instead of the held-out ones."""
    from transformers import set_seed

    from ..config import VEPOConfig
    from ..rewards import get_reward_funcs
    from ..scoring import get_strategy
    from ..trainer import VEPOTrainer

    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if isinstance(arm, str):
        arm = parse_arm(arm, settings.selection_ratio)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    set_seed(seed)
    model, processor = _load(warm_path)
    model.model.visual.requires_grad_(False)  # the paper freezes the vision tower
    ws = settings.warm_start
    task = get_task(ws.task)
    train = make_rl_dataset(settings.train_rows, seed=1000 + seed, image_size=ws.image_size, kinds=task.kinds)
    heldout = validation_dataset(ws, settings.eval_rows) if validation else heldout_dataset(ws, settings.eval_rows)
    learning_rate = settings.learning_rate_of(arm)
    # k and alpha where the arm's strategy reads them (VEPOConfig refuses a setting the run never reads)
    reads = get_strategy(arm.strategy).reads
    selection = {"selection_ratio": arm.ratio} if "ratio" in reads else {}
    if "alpha" in reads:
        selection["selection_alpha"] = settings.selection_alpha
    args = VEPOConfig(
        output_dir=str(output_dir),
        selection_strategy=arm.strategy,
        strategy_params=(settings.strategy_params or {}).get(arm.strategy),
        **selection,
        perturbation="diffusion",
        noise_step=500,
        num_generations=settings.num_generations,
        per_device_train_batch_size=settings.num_generations * settings.prompts_per_step,
        max_completion_length=settings.max_completion_length,
        temperature=1.0,
        learning_rate=learning_rate,
        lr_scheduler_type="constant",
        beta=0.0,
        reward_weights=[0.9, 0.1],
        max_steps=settings.steps,
        logging_steps=settings.logging_steps,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=seed,
        disable_tqdm=True,
        activation_checkpointing=False,
        log_completions=False,
    )
    trainer = VEPOTrainer(
        model=model,
        reward_funcs=get_reward_funcs([task.accuracy_reward, "format"]),
        args=args,
        train_dataset=train,
        processing_class=processor,
    )
    limit = _TimeLimit(settings.max_minutes * 60)
    trainer.add_callback(limit)
    # disable_tqdm makes transformers print every log as a raw dict; the lab prints its own line per run
    from transformers import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    after = evaluate_accuracy(trainer.model, processor, heldout, max_new_tokens=settings.eval_tokens)
    stats = selection_statistics(
        trainer.model,
        processor,
        heldout,
        [arm],
        num_prompts=settings.stats_prompts,
        alpha=settings.selection_alpha,
        seed=seed,
        max_new_tokens=settings.eval_tokens,
        strategy_params=settings.strategy_params,
    )
    history = trainer.state.log_history
    curve = [curve_entry(e) for e in history if "reward" in e]
    compute = training_compute(curve, settings.num_generations * settings.prompts_per_step)
    result = {
        "strategy": arm.label,
        "selection_strategy": arm.strategy,
        "ratio": arm.ratio,
        "learning_rate": learning_rate,
        "seed": seed,
        "evaluated_on": "validation" if validation else "heldout",
        "steps": trainer.state.global_step,
        "stopped_by_time_limit": limit.stopped_early,
        "train_seconds": round(seconds, 1),
        "perturbed_forwards": trainer.num_perturbed_completions,
        **compute,
        "accuracy_after": after["accuracy"],
        "accuracy_after_per_kind": after["per_kind"],
        "correct_after": after["correct"],
        "examples_after": after["examples"],
        "selection_after": stats[arm.label],
        "tokens_after": stats["_tokens"],
        "curve": curve,
    }
    (output_dir / "result.json").write_text(json.dumps(result, indent=1))
    return result


def _run_one_entry(job):
    return run_one(*job)


# The lab's record of the settings its runs were made with (strategies, seeds and jobs may change: runs are per
# strategy and seed, and reused)
# (learning rates are per run: a run found in the folder is reused only at the learning rate this lab gives its rule)
_FREE_SETTINGS = ("strategies", "seeds", "jobs", "learning_rate", "learning_rates")


def _lab_record_settings(settings: LabSettings) -> dict:
    return {k: v for k, v in json.loads(json.dumps(dataclasses.asdict(settings))).items() if k not in _FREE_SETTINGS}


def plan_lab_folder(settings: LabSettings, output_dir: Path, overwrite: bool) -> list[Path]:
    """Refuse (`UsageError`) a folder whose lab used other settings unless `overwrite`; return what of an earlier lab
    is set aside when starting fresh (its warm-start measurement and runs, moved to `previous_run/`, not deleted)."""
    from ..errors import UsageError
    from ..run_folder import check_folder_owner, differences, read_record

    check_folder_owner("--output_dir", output_dir, "lab")

    earlier = [path for path in (output_dir / "warm_start.json", output_dir / "runs") if path.exists()]
    if not earlier:
        return []
    if overwrite:
        return earlier
    record = read_record(output_dir, LAB_RECORD)
    if record is None:
        raise UsageError(
            f"--output_dir {output_dir} holds lab runs without a record of their settings ({LAB_RECORD}): pass "
            "--overwrite_output_dir to recompute them, or choose another --output_dir."
        )
    diff = differences(record["settings"], _lab_record_settings(settings))
    for arm in settings.arms():
        for seed in settings.seeds:
            result = output_dir / "runs" / f"{arm.slug}-seed{seed}" / "result.json"
            if not result.is_file():
                continue
            try:
                there = json.loads(result.read_text()).get("learning_rate")
            except (OSError, json.JSONDecodeError):
                raise UsageError(f"{result} is not a readable run result; move it away to recompute it.") from None
            here = settings.learning_rate_of(arm)
            if there is not None and there != here:
                diff.append(f"{arm.label} seed {seed} trained at learning rate {there:g} there, {here:g} here")
    if diff:
        raise UsageError(
            f"--output_dir {output_dir} holds a lab made with other settings ({'; '.join(diff)}): rerun with its "
            "settings to reuse its runs, pass --overwrite_output_dir to recompute them, or choose another --output_dir."
        )
    return []


def _prepare_folder(settings: LabSettings, output_dir: Path, overwrite: bool, log) -> Path:
    """Refuse or set aside an earlier lab of other settings (see `plan_lab_folder`), then record these settings."""
    import shutil

    from ..run_folder import SET_ASIDE, write_record

    earlier = plan_lab_folder(settings, output_dir, overwrite)
    output_dir.mkdir(parents=True, exist_ok=True)
    if earlier:
        aside = output_dir / SET_ASIDE
        shutil.rmtree(aside, ignore_errors=True)
        aside.mkdir()
        for path in earlier:
            os.replace(path, aside / path.name)
        log(f"{output_dir}/ held a lab with other settings: its runs wait in {aside} until this lab has finished")
    write_record(output_dir, _lab_record_settings(settings), LAB_RECORD)
    return output_dir / SET_ASIDE


def _execute(jobs: list[tuple], settings: LabSettings, log) -> None:
    """Run `run_one(*job)` for every job, `settings.jobs` processes at a time (one thread each)."""
    if settings.jobs > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=settings.jobs, mp_context=get_context("spawn")) as pool:
            for result in pool.map(_run_one_entry, jobs):
                _log_run(result, log)
    else:
        for job in jobs:
            _log_run(run_one(*job), log)


def run_lab(settings: LabSettings, output_dir: str | os.PathLike, log=print, overwrite: bool = False) -> dict:
    """Warm start (cached), its held-out accuracy and selection statistics, then every (rule, seed) run, then the
    report (`lab.md`, `lab.json`, `lab_curves.png`). Finished runs (`runs/<rule>-seed<k>/result.json`) are kept: an
    interrupted lab resumes. A folder whose lab used other settings (`vepo_lab.json`) is refused with a `UsageError`
    unless `overwrite`, which sets the earlier runs aside until this lab has finished."""
    import shutil

    from .results import write_report

    torch.set_num_threads(1)
    output_dir = Path(output_dir)
    aside = _prepare_folder(settings, output_dir, overwrite, log)
    start = time.perf_counter()
    warm = warm_start_path(settings.warm_start, log=log)
    warm_report = json.loads((warm / "lab_warm_start.json").read_text())
    arms = settings.arms()
    base_file = output_dir / "warm_start.json"
    base = json.loads(base_file.read_text()) if base_file.exists() else None
    missing = [arm for arm in arms if base is not None and arm.label not in base.get("selection", {})]
    if missing:  # rules added since: their selection on the warm start, from the same sampled responses
        model, processor = _load(warm)
        base["selection"].update(
            selection_statistics(
                model,
                processor,
                heldout_dataset(settings.warm_start, settings.eval_rows),
                missing,
                num_prompts=settings.stats_prompts,
                alpha=settings.selection_alpha,
                max_new_tokens=settings.eval_tokens,
                strategy_params=settings.strategy_params,
            )
        )
        base_file.write_text(json.dumps(base, indent=1))
    if base is None:
        model, processor = _load(warm)
        heldout = heldout_dataset(settings.warm_start, settings.eval_rows)
        before = evaluate_accuracy(model, processor, heldout, max_new_tokens=settings.eval_tokens)
        stats = selection_statistics(
            model,
            processor,
            heldout,
            list(dict.fromkeys([*(parse_arm(n, settings.selection_ratio) for n in WARM_START_RULES), *arms])),
            num_prompts=settings.stats_prompts,
            alpha=settings.selection_alpha,
            max_new_tokens=settings.eval_tokens,
            strategy_params=settings.strategy_params,
        )
        base = {
            "path": f"$VEPO_TRL_CACHE/{warm.name}",  # where it is cached, without this machine's paths
            "build": {k: warm_report[k] for k in ("key", "parameters", "sft_seconds", "build_seconds", "config")},
            "accuracy": before["accuracy"],
            "per_kind": before["per_kind"],
            "correct": before["correct"],
            "examples": before["examples"],
            "selection": stats,
        }
        base_file.write_text(json.dumps(base, indent=1))
    log(f"warm start: held-out greedy accuracy {base['accuracy']:.1%} {base['per_kind']}")
    jobs = []
    for seed in settings.seeds:
        for arm in arms:
            run_dir = output_dir / "runs" / f"{arm.slug}-seed{seed}"
            if not (run_dir / "result.json").exists():
                jobs.append((str(warm), arm, seed, settings, str(run_dir)))
    log(
        f"{len(jobs)} run(s) to do ({len(arms)} rules x {len(settings.seeds)} seeds), {settings.jobs} at a time, "
        f"at most {settings.steps} steps / {settings.max_minutes:g} min each"
    )
    _execute(jobs, settings, log)
    results = [
        json.loads((output_dir / "runs" / f"{arm.slug}-seed{seed}" / "result.json").read_text())
        for seed in settings.seeds
        for arm in arms
    ]
    settings_dict = dataclasses.asdict(settings)
    settings_dict["wall_seconds"] = round(time.perf_counter() - start)
    summary = write_report(output_dir, base, results, settings_dict)
    shutil.rmtree(aside, ignore_errors=True)
    log(f"lab done in {time.perf_counter() - start:.0f} s: {output_dir / 'lab.md'}")
    return summary


def run_sweep(
    settings: LabSettings,
    learning_rates: list[float],
    output_dir: str | os.PathLike,
    log=print,
    overwrite: bool = False,
) -> dict:
    """Every rule at every learning rate over `settings.seeds`, each scored on the validation rows (not the held-out
    ones the lab reports); writes `sweep.md` / `sweep.json` with each rule's best learning rate and returns them."""
    import shutil

    from .results import write_sweep_report

    torch.set_num_threads(1)
    output_dir = Path(output_dir)
    aside = _prepare_folder(settings, output_dir, overwrite, log)
    start = time.perf_counter()
    warm = warm_start_path(settings.warm_start, log=log)
    arms = settings.arms()
    jobs, dirs = [], []
    for seed in settings.seeds:
        for arm in arms:
            for lr in learning_rates:
                run_dir = output_dir / "runs" / f"{arm.slug}-lr{lr:g}-seed{seed}"
                dirs.append(run_dir)
                if not (run_dir / "result.json").exists():
                    # Accuracy only: the selection statistics are the lab's, not the sweep's
                    per_arm = dataclasses.replace(settings, learning_rates={arm.label: lr}, stats_prompts=0)
                    jobs.append((str(warm), arm, seed, per_arm, str(run_dir), True))
    log(
        f"learning-rate sweep: {len(jobs)} run(s) to do ({len(arms)} rules x {len(learning_rates)} learning rates x "
        f"{len(settings.seeds)} seeds), {settings.jobs} at a time"
    )
    _execute(jobs, settings, log)
    results = [json.loads((d / "result.json").read_text()) for d in dirs]
    settings_dict = dataclasses.asdict(settings)
    settings_dict["sweep_learning_rates"] = list(learning_rates)
    settings_dict["wall_seconds"] = round(time.perf_counter() - start)
    best = write_sweep_report(output_dir, results, settings_dict)
    shutil.rmtree(aside, ignore_errors=True)
    flag = ",".join(f"{label}={lr:g}" for label, lr in best.items())
    log(f"sweep done in {time.perf_counter() - start:.0f} s: {output_dir / 'sweep.md'}\nbest: --learning_rates {flag}")
    return best


def _log_run(result, log):
    where = "validation" if result.get("evaluated_on") == "validation" else "held-out"
    log(
        f"  {result['strategy']:>12} lr {result.get('learning_rate', float('nan')):g} seed {result['seed']}: "
        f"{where} accuracy {result['accuracy_after']:.1%} in {count(result['steps'], 'step')}, {result['train_seconds']:.0f} s"
        + (" (stopped early by the per-run time cap: --max_minutes)" if result.get("stopped_by_time_limit") else "")
    )
