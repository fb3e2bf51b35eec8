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

from .tasks import COLOURS, MAX_COUNT, make_rl_dataset
from .warm_start import WarmStartConfig, evaluate_accuracy, heldout_dataset, warm_start_path


__all__ = ["LabSettings", "QUICK", "decision_token_mask", "run_lab", "run_one", "selection_statistics"]

DEFAULT_STRATEGIES = ("full", "entropy", "vepo", "random")
DECISION_WORDS = frozenset([*(str(n) for n in range(1, MAX_COUNT + 1)), *COLOURS])


@dataclass
class LabSettings:
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 100
    max_minutes: float = 5.0  # a run stops at this wall time whatever `steps` says
    learning_rate: float = 3e-4
    num_generations: int = 8
    prompts_per_step: int = 4
    max_completion_length: int = 28
    selection_ratio: float = 0.2
    selection_alpha: float = 0.7
    train_rows: int = 1024
    eval_rows: int = 120
    stats_prompts: int = 24  # prompts whose sampled responses measure the selection statistics
    logging_steps: int = 5
    jobs: int = 1  # runs in parallel (processes of one thread each)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)


# CI: two short runs of two strategies from a warm start built with few SFT steps
QUICK = dict(
    strategies=("full", "vepo"),
    seeds=(0,),
    steps=8,
    max_minutes=1.0,
    eval_rows=20,
    train_rows=64,
    stats_prompts=4,
    logging_steps=2,
    warm_start=WarmStartConfig(sft_rows=512, sft_steps=60, eval_rows=20),
)


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
) -> dict[str, dict]:
    """Per strategy, over sampled responses of `num_prompts` rows: the share of the decision tokens (count, colour) it
    selects, the share of selected tokens that are decision tokens, and mean JSD / entropy of selected vs all tokens.
    Every strategy ranks the same tokens with the same signals (clean and perturbed pass at the paper's settings)."""
    from ..insight.signals import SignalSettings, completion_signals, encode_prompt, sample_completions
    from ..scoring import get_strategy, select_tokens

    model.eval()
    tokenizer = processor.tokenizer
    totals = {
        s: dict(decision_kept=0, decision=0, kept=0, kept_decision=0, jsd_kept=0.0, h_kept=0.0) for s in strategies
    }
    all_tokens = dict(n=0, jsd=0.0, h=0.0, decision=0, h_decision=0.0, jsd_decision=0.0)
    settings = SignalSettings(strategy="vepo", ratio=ratio, alpha=alpha, seed=seed)
    for index in range(min(num_prompts, len(dataset))):
        row = dataset[index]
        prompt = encode_prompt(processor, row["prompt"], row["images"])
        completions = sample_completions(
            model, processor, prompt, num_generations, max_new_tokens=32, seed=seed + index
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
        for name in strategies:
            strategy = get_strategy(name)
            seeds = None
            if strategy.count == "random":
                seeds = torch.arange(len(completions)) * 7919 + seed * 104729 + index  # cpu: seeds, read by tolist()
            selected = select_tokens(strategy, signals, mask, ratio=ratio, alpha=alpha, seeds=seeds) & mask
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


def run_one(warm_path: str, strategy: str, seed: int, settings: LabSettings, output_dir: str) -> dict:
    """Train one strategy from the warm start with one seed; return (and write) its result."""
    from transformers import set_seed

    from ..config import VEPOConfig
    from ..rewards import get_reward_funcs
    from ..trainer import VEPOTrainer

    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    set_seed(seed)
    model, processor = _load(warm_path)
    model.model.visual.requires_grad_(False)  # the paper freezes the vision tower
    ws = settings.warm_start
    train = make_rl_dataset(settings.train_rows, seed=1000 + seed, image_size=ws.image_size)
    heldout = heldout_dataset(ws, settings.eval_rows)
    args = VEPOConfig(
        output_dir=str(output_dir),
        selection_strategy=strategy,
        selection_ratio=settings.selection_ratio,
        selection_alpha=settings.selection_alpha,
        perturbation="diffusion",
        noise_step=500,
        num_generations=settings.num_generations,
        per_device_train_batch_size=settings.num_generations * settings.prompts_per_step,
        max_completion_length=settings.max_completion_length,
        temperature=1.0,
        learning_rate=settings.learning_rate,
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
        data_seed=seed,
        disable_tqdm=True,
        activation_checkpointing=False,
        log_completions=False,
    )
    trainer = VEPOTrainer(
        model=model,
        reward_funcs=get_reward_funcs(["accuracy", "format"]),
        args=args,
        train_dataset=train,
        processing_class=processor,
    )
    limit = _TimeLimit(settings.max_minutes * 60)
    trainer.add_callback(limit)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    after = evaluate_accuracy(trainer.model, processor, heldout)
    stats = selection_statistics(
        trainer.model,
        processor,
        heldout,
        [strategy],
        num_prompts=settings.stats_prompts,
        ratio=settings.selection_ratio,
        alpha=settings.selection_alpha,
        seed=seed,
    )
    history = trainer.state.log_history
    curve = [
        {k: e[k] for k in e if k == "step" or k.startswith(("reward", "rewards/", "vepo/")) or k in ("entropy",)}
        for e in history
        if "reward" in e
    ]
    result = {
        "strategy": strategy,
        "seed": seed,
        "steps": trainer.state.global_step,
        "stopped_by_time_limit": limit.stopped_early,
        "train_seconds": round(seconds, 1),
        "accuracy_after": after["accuracy"],
        "accuracy_after_per_kind": after["per_kind"],
        "examples_after": after["examples"],
        "selection_after": stats[strategy],
        "tokens_after": stats["_tokens"],
        "curve": curve,
    }
    (output_dir / "result.json").write_text(json.dumps(result, indent=1))
    return result


def _run_one_entry(job):
    return run_one(*job)


# The lab's record of the settings its runs were made with (strategies, seeds and jobs may change: runs are per
# strategy and seed, and reused)
LAB_RECORD = "vepo_lab.json"
_FREE_SETTINGS = ("strategies", "seeds", "jobs")


def _lab_record_settings(settings: LabSettings) -> dict:
    return {k: v for k, v in json.loads(json.dumps(dataclasses.asdict(settings))).items() if k not in _FREE_SETTINGS}


def plan_lab_folder(settings: LabSettings, output_dir: Path, overwrite: bool) -> list[Path]:
    """Refuse (`UsageError`) a folder whose lab used other settings unless `overwrite`; return what of an earlier lab
    is set aside when starting fresh (its warm-start measurement and runs, moved to `previous_run/`, not deleted)."""
    from ..errors import UsageError
    from ..run_folder import differences, read_record

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
    if diff:
        raise UsageError(
            f"--output_dir {output_dir} holds a lab made with other settings ({'; '.join(diff)}): rerun with its "
            "settings to reuse its runs, pass --overwrite_output_dir to recompute them, or choose another --output_dir."
        )
    return []


def run_lab(settings: LabSettings, output_dir: str | os.PathLike, log=print, overwrite: bool = False) -> dict:
    """Warm start (cached), its held-out accuracy and selection statistics, then every (strategy, seed) run, then
    the report (`lab.md`, `lab.json`, `lab_curves.png`). Finished runs (`runs/<strategy>-seed<k>/result.json`) are
    kept: an interrupted lab resumes. A folder whose lab used other settings (`vepo_lab.json`) is refused with a
    `UsageError` unless `overwrite`, which sets the earlier runs aside until this lab has finished."""
    import shutil

    from ..run_folder import SET_ASIDE, write_record
    from .results import write_report

    torch.set_num_threads(1)
    output_dir = Path(output_dir)
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
    start = time.perf_counter()
    warm = warm_start_path(settings.warm_start, log=log)
    warm_report = json.loads((warm / "lab_warm_start.json").read_text())
    base_file = output_dir / "warm_start.json"
    if base_file.exists():
        base = json.loads(base_file.read_text())
    else:
        model, processor = _load(warm)
        heldout = heldout_dataset(settings.warm_start, settings.eval_rows)
        before = evaluate_accuracy(model, processor, heldout)
        stats = selection_statistics(
            model,
            processor,
            heldout,
            list(dict.fromkeys([*DEFAULT_STRATEGIES, *settings.strategies])),
            num_prompts=settings.stats_prompts,
            ratio=settings.selection_ratio,
            alpha=settings.selection_alpha,
        )
        base = {
            "path": str(warm),
            "build": {k: warm_report[k] for k in ("key", "parameters", "sft_seconds", "build_seconds", "config")},
            "accuracy": before["accuracy"],
            "per_kind": before["per_kind"],
            "examples": before["examples"],
            "selection": stats,
        }
        base_file.write_text(json.dumps(base, indent=1))
    log(f"warm start: held-out greedy accuracy {base['accuracy']:.1%} {base['per_kind']}")
    jobs = []
    for seed in settings.seeds:
        for strategy in settings.strategies:
            run_dir = output_dir / "runs" / f"{strategy}-seed{seed}"
            if (run_dir / "result.json").exists():
                continue
            jobs.append((str(warm), strategy, seed, settings, str(run_dir)))
    log(
        f"{len(jobs)} run(s) to do ({len(settings.strategies)} strategies x {len(settings.seeds)} seeds), "
        f"{settings.jobs} at a time, at most {settings.steps} steps / {settings.max_minutes:g} min each"
    )
    if settings.jobs > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=settings.jobs, mp_context=get_context("spawn")) as pool:
            for result in pool.map(_run_one_entry, jobs):
                _log_run(result, base, log)
    else:
        for job in jobs:
            _log_run(run_one(*job), base, log)
    results = []
    for seed in settings.seeds:
        for strategy in settings.strategies:
            results.append(json.loads((output_dir / "runs" / f"{strategy}-seed{seed}" / "result.json").read_text()))
    settings_dict = dataclasses.asdict(settings)
    summary = write_report(output_dir, base, results, settings_dict)
    shutil.rmtree(output_dir / SET_ASIDE, ignore_errors=True)
    log(f"lab done in {time.perf_counter() - start:.0f} s: {output_dir / 'lab.md'}")
    return summary


def _log_run(result, base, log):
    log(
        f"  {result['strategy']:>8} seed {result['seed']}: accuracy {base['accuracy']:.1%} -> "
        f"{result['accuracy_after']:.1%} in {result['steps']} steps, {result['train_seconds']:.0f} s"
    )
