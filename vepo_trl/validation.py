"""What every value a run takes must be: one table for `VEPOConfig` (VEPO's own fields and the `GRPOConfig` /
`TrainingArguments` ones), the training script's arguments and TRL's `ModelConfig`, plus the few constraints that
join fields.

The table is built from the dataclasses themselves where they say enough: every int / float field gets its type's
check (a whole number, a finite number, `None` only where the field allows it) and every field whose metadata lists
`choices` is checked against them. `RANGES` adds what the types do not carry (positive, a range, a port), written
once. Each refusal is one `ValueError` naming the flag, the value and what would be valid; the CLI prints it as one
line, exit 2.

Light on purpose (no torch, TRL or transformers import at module level): the CLI checks the command line and the
recipe against it before anything heavy is imported (`precheck`), and the dataclasses check their values again once
built (`check_values`), so the Python API gets the same refusals.
"""

from __future__ import annotations

import contextvars
import dataclasses
import enum
import functools
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from .rules import (  # noqa: F401 - the engine, re-exported: the tables here and the commands' declarations use it
    Rule,
    _above,
    _at_least,
    _between,
    _names,
    _number,
    _refuse,
    _show,
    _whole,
    check_value,
)


_PORT = _whole(_between(1, 65535), "a port number in 1..65535")


def _registry_names(saved_at: tuple[str, ...], module: str, load, kind: str = "") -> Iterable[str]:
    """A registry's names: the registry's own once its module is imported (a strategy registered at run time is
    among them), else as a full parse saved them for these versions, at `saved_at` in the saved file (no torch
    import for a command's parse), with every installed plug-in's name of `kind` (a plug-in fixed since the save, or
    broken: the full parse loads it, and decides)."""
    import sys

    from .registry import plugin_names

    saved = None if module in sys.modules else functools.reduce(lambda d, key: (d or {}).get(key), saved_at, _saved())
    return tuple(dict.fromkeys([*saved, *plugin_names(kind)])) if saved else tuple(load())


def _selection_strategies():
    def load():
        from .scoring import SELECTION_STRATEGIES

        return SELECTION_STRATEGIES

    return _registry_names(("rules", "selection_strategy", "choices"), "vepo_trl.scoring", load, "selection strategy")


def _perturbations():
    def load():
        from .perturb import PERTURBATIONS

        return PERTURBATIONS

    return _registry_names(("rules", "perturbation", "choices"), "vepo_trl.perturb.registry", load, "perturbation")


def _broken(module: str, name) -> str | None:
    """Where `name` is a plug-in of that registry that failed to load, the one line saying so (`Registry.broken_line`)."""
    import importlib

    registry = {"scoring": "SELECTION_STRATEGIES", "perturb": "PERTURBATIONS", "rewards": "REWARD_FUNCS"}[module]
    return getattr(importlib.import_module(f"vepo_trl.{module}"), registry).broken_line(name)


def _reward_names():
    def load():
        from .rewards import REWARD_FUNCS

        return REWARD_FUNCS

    return _registry_names(("declared", "rewards"), "vepo_trl.rewards", load, "reward function")


def _loss_types():
    def load():
        from .scoring import SUPPORTED_LOSS_TYPES

        return SUPPORTED_LOSS_TYPES

    return _registry_names(("rules", "loss_type", "choices"), "vepo_trl.scoring", load)


# The constraints the dataclasses' types do not carry. Whole-number rules refuse 1.5; number rules refuse NaN and
# infinities; `optional` lets `None` (unset) through where the field has it.
RANGES: dict[str, Rule] = {
    # GRPOConfig / TrainingArguments: batch arithmetic and schedule
    "per_device_train_batch_size": _whole(_at_least(1), "a whole number >= 1"),
    "per_device_eval_batch_size": _whole(_at_least(1), "a whole number >= 1"),
    "gradient_accumulation_steps": _whole(_at_least(1), "a whole number >= 1"),
    "num_generations": _whole(_at_least(2), "a whole number >= 2 (GRPO compares a prompt's completions)"),
    "num_generations_eval": _whole(_at_least(1), "a whole number >= 1, or unset", True),
    "max_completion_length": _whole(_at_least(1), "a whole number >= 1 (new tokens per completion)"),
    "steps_per_generation": _whole(_at_least(1), "a whole number >= 1, or unset", True),
    "generation_batch_size": _whole(_at_least(1), "a whole number >= 1, or unset", True),
    "num_iterations": _whole(_at_least(1), "a whole number >= 1"),
    "max_steps": _whole(lambda v: v >= -1, "a whole number >= 1 (or -1 / 0: train num_train_epochs)"),
    "logging_steps": _number(_at_least(0), ">= 0 (a step count, or a fraction of the run below 1)"),
    "save_steps": _number(_at_least(0), ">= 0 (a step count, or a fraction of the run below 1)"),
    "eval_steps": _number(_at_least(0), ">= 0, or unset", True),
    "eval_delay": _number(_at_least(0), ">= 0"),
    "num_train_epochs": _number(_above(0), "above 0"),
    "learning_rate": _number(_at_least(0), ">= 0 (0: a frozen run; the paper: 1e-6)"),
    "weight_decay": _number(_at_least(0), ">= 0"),
    "warmup_steps": _number(_at_least(0), ">= 0 (steps, or a fraction of the run below 1)"),
    "max_grad_norm": _number(_at_least(0), ">= 0 (0: no clipping)"),
    "adam_beta1": _number(_between(0, 1, high_open=True), "in [0, 1)"),
    "adam_beta2": _number(_between(0, 1, high_open=True), "in [0, 1)"),
    "adam_epsilon": _number(_above(0), "above 0"),
    "label_smoothing_factor": _number(_between(0, 1, high_open=True), "in [0, 1)"),
    "neftune_noise_alpha": _number(_at_least(0), ">= 0, or unset", True),
    "seed": _whole(_between(0, 2**32 - 1), "a whole number in 0..2**32-1"),
    "data_seed": _whole(_between(0, 2**32 - 1), "a whole number in 0..2**32-1, or unset", True),
    "save_total_limit": _whole(_at_least(0), "a whole number >= 0 (checkpoints kept), or unset", True),
    "eval_accumulation_steps": _whole(_at_least(1), "a whole number >= 1, or unset", True),
    "dataloader_num_workers": _whole(_at_least(0), "a whole number >= 0"),
    "dataloader_prefetch_factor": _whole(_at_least(1), "a whole number >= 1, or unset", True),
    "ddp_bucket_cap_mb": _whole(_at_least(1), "a whole number of MB >= 1, or unset", True),
    "ddp_timeout": _whole(_at_least(1), "a whole number of seconds >= 1"),
    "local_rank": _whole(_at_least(-1), "a whole number >= -1 (set by the launcher)"),
    "num_completions_to_print": _whole(_at_least(0), "a whole number >= 0, or unset", True),
    # GRPO's sampling and loss
    "temperature": _number(_above(0), "above 0: GRPO samples its completions at it (the paper: 1.0)"),
    "top_p": _number(_between(0, 1, low_open=True), "in (0, 1]"),
    "top_k": _whole(_at_least(0), "a whole number >= 0 (0: off), or unset", True),
    "min_p": _number(_between(0, 1), "in [0, 1], or unset", True),
    "repetition_penalty": _number(_above(0), "above 0 (1.0: off)"),
    "beta": _number(_at_least(0), ">= 0 (0: no reference model)"),
    "epsilon": _number(_at_least(0), ">= 0 (the clip range)"),
    "epsilon_high": _number(_at_least(0), ">= 0, or unset", True),
    "delta": _number(_above(0), "above 0 (above 1 + epsilon recommended), or unset", True),
    "reward_weights": Rule("numbers", "finite numbers, one per reward function", optional=True),
    "top_entropy_quantile": _number(_between(0, 1), "in [0, 1]"),
    "router_aux_loss_coef": _number(_at_least(0), ">= 0"),
    "sapo_temperature_neg": _number(_above(0), "above 0"),
    "sapo_temperature_pos": _number(_above(0), "above 0"),
    "vespo_k_pos": _number(_at_least(0), ">= 0"),
    "vespo_k_neg": _number(_at_least(0), ">= 0"),
    "vespo_lambda_pos": _number(_at_least(0), ">= 0"),
    "vespo_lambda_neg": _number(_at_least(0), ">= 0"),
    "ref_model_mixup_alpha": _number(_between(0, 1), "in [0, 1]"),
    "ref_model_sync_steps": _whole(_at_least(1), "a whole number >= 1"),
    "entropy_coef": _number(_at_least(0), ">= 0"),
    "entropy_coef_min": _number(_at_least(0), ">= 0"),
    "entropy_coef_max": _number(_at_least(0), ">= 0"),
    "entropy_coef_delta": _number(_at_least(0), ">= 0"),
    "entropy_target": _number(_at_least(0), ">= 0 (nats)"),
    "max_tool_calling_iterations": _whole(_at_least(0), "a whole number >= 0, or unset", True),
    "off_policy_mask_threshold": _number(_above(0), "above 0, or unset", True),
    # TRL's options that take one of a few names (from GRPOConfig's help)
    "vllm_mode": _names("server", "colocate"),
    "vllm_model_impl": _names("vllm", "transformers"),
    "importance_sampling_level": _names("token", "sequence"),
    "scale_rewards": _names("group", "batch", "none", "true", "false", boolean=True),
    "multi_objective_aggregation": _names("sum_then_normalize", "normalize_then_sum"),
    "vllm_importance_sampling_mode": _names("sequence_mask", "sequence_truncate", "token_mask", "token_truncate"),
    # vLLM
    "vllm_server_port": _PORT,
    "vllm_group_port": _PORT,
    "vllm_server_timeout": _number(_above(0), "above 0 seconds"),
    "vllm_gpu_memory_utilization": _number(_between(0, 1, low_open=True), "in (0, 1]"),
    "vllm_max_model_length": _whole(_at_least(1), "a whole number >= 1, or unset", True),
    "vllm_tensor_parallel_size": _whole(_at_least(1), "a whole number >= 1"),
    "vllm_importance_sampling_clip_max": _number(_above(0), "above 0, or unset", True),
    "vllm_importance_sampling_clip_min": _number(_at_least(0), ">= 0, or unset", True),
    "vllm_importance_sampling_cap": _number(_above(0), "above 0, or unset", True),
    # VEPO's own (VEPOConfig)
    "selection_strategy": Rule(
        "choice", "a selection strategy", choices=_selection_strategies, why_not=lambda v: _broken("scoring", v)
    ),
    "perturbation": Rule("choice", "a perturbation", choices=_perturbations, why_not=lambda v: _broken("perturb", v)),
    "loss_type": Rule("choice", "a loss type with a selected-token (L_VEPO) form", choices=_loss_types),
    "selection_mode": Rule("choice", "mask or weight", choices=lambda: ("mask", "weight")),
    "entropy_scope": Rule("choice", "all or selected", choices=lambda: ("all", "selected")),
    "selection_ratio": _number(
        _between(0, 1, low_open=True), "in (0, 1]: k, the fraction of tokens kept per response (the paper: 0.2)"
    ),
    "selection_alpha": _number(_between(0, 1), "in [0, 1] (the paper: 0.7)"),
    "selection_weight": _number(_at_least(0), ">= 0"),
    "selection_samples_steps": _whole(_at_least(0), "a whole number >= 0 (0: never)"),
    "selection_samples_count": _whole(_at_least(1), "a whole number >= 1"),
    "noise_step": _whole(_between(0, 999), "a whole diffusion step in 0..999 (the paper: 500)"),
    "noise_annealing_coefficient": _number(_above(0), "above 0"),
    "noise_annealing_midpoint": _whole(_at_least(0), "a whole number of steps >= 0"),
    "noise_sigma": _number(_at_least(0), ">= 0"),
    "patch_probability": _number(_between(0, 1), "in [0, 1]"),
    "perturbation_seed": _whole(_between(0, 2**32 - 1), "a whole number in 0..2**32-1, or unset (the seed)", True),
    "scoring_tile_size": _whole(_at_least(1), "a whole number of tokens >= 1, or unset", True),
    "rollout_cache_gb": _number(_at_least(0), "a number of GB >= 0"),
    # The training script's (VEPOScriptArguments)
    "min_pixels": _whole(_at_least(1), "a whole number of pixels >= 1, or unset", True),
    "max_pixels": _whole(_at_least(1), "a whole number of pixels >= 1, or unset", True),
    "max_train_samples": _whole(_at_least(1), "a whole number >= 1, or unset for every row", True),
    "max_eval_samples": _whole(_at_least(1), "a whole number >= 1, or unset for every row", True),
    "synthetic_rows": _whole(_at_least(1), "a whole number >= 1"),
    # The dict fields transformers reads from a file when given text (a DeepSpeed / FSDP / accelerator config)
    "deepspeed": Rule("mapping_file", "a DeepSpeed JSON config file that exists, or the config inline", optional=True),
    "fsdp_config": Rule("mapping_file", "an FSDP JSON config file that exists, or the config inline", optional=True),
    "accelerator_config": Rule(
        "mapping_file", "an accelerator JSON config file that exists, or the config inline", optional=True
    ),
    # TRL's ModelConfig (LoRA)
    "lora_r": _whole(_at_least(1), "a whole number >= 1 (the adapter's rank)"),
    "lora_alpha": _whole(_at_least(1), "a whole number >= 1"),
    "lora_dropout": _number(_between(0, 1, high_open=True), "in [0, 1)"),
}


# The kinds of value the commands' own options take, for their declarations (`vepo_trl.commands.*`, built with
# `options.option`): a name `RANGES` holds is reused there as it is ("temperature", "noise_step", "min_pixels", ...).
# Beyond the number kinds: "text" (any non-empty text), "url", "out_folder" (a folder the command writes:
# `files.check_output`), "out_file" (a file it writes: its folder is checked the same way), "in_file",
# "in_folder", "in_path" (file or folder), "model" (a model folder or a Hub id, checked by the command with its files).
whole, number, names, at_least, above, between = _whole, _number, _names, _at_least, _above, _between
TEXT = Rule("text", "non-empty text", optional=True)
MAPPING = Rule("mapping", "a mapping: JSON such as '{\"key\": 1}', or key: value lines in a recipe", optional=True)
REWARD_NAME = Rule("choice", "a reward function", choices=_reward_names, why_not=lambda v: _broken("rewards", v))
DEVICE = Rule("device", "a device this machine has (cuda, cpu, ...)", optional=True)  # torch's own test
MODEL = Rule("model", "a model folder or a Hub id (owner/name)", optional=True)
SEED = _whole(_between(0, 2**32 - 1), "a whole number in 0..2**32-1")
FLAG = Rule("bool", "a flag")
OUT_FOLDER = Rule("out_folder", "a folder that can be written", optional=True)
OUT_FILE = Rule("out_file", "a file that can be written", optional=True)
# A file records are appended to: new, or a records file (`files.check_output`)
RECORDS_FILE = Rule("records_out", "a new file or a selection-records file to append to", optional=True)


def path_rule(kind: str, valid: str, optional: bool = True) -> Rule:
    """A path the command reads ("in_file", "in_folder", "in_path") or writes ("out_folder", "out_file")."""
    return Rule(kind, valid, optional=optional)


def optional(rule: Rule) -> Rule:
    """`rule`, with unset (None) allowed: an option whose default is "the recipe's, or the paper's"."""
    return dataclasses.replace(rule, optional=True)


def check_options(rules: Mapping[str, Rule], options: Mapping[str, object], flags: Mapping[str, str]) -> None:
    """A command's parsed options against their declared rules (`options.option`), defaults included (a default
    output folder is written like a given one); the rules that join them come after the read rule
    (`check_combinations`: a rule joining settings a run does not read says nothing). `flags`: how the user writes each
    (`--name`, or a positional's metavar). Raises `UsageError` (one line) for the first option that breaks its rule."""
    from pathlib import Path

    from .errors import UsageError
    from .files import check_output

    for name, value in options.items():
        rule = rules[name]
        if value is None:
            continue
        flag = flags.get(name, f"--{name}")
        values = value if isinstance(value, (list, tuple)) and rule.kind != "numbers" else [value]
        for item in values:
            if rule.kind in ("out_folder", "out_file", "records_out"):  # the one writer's rule
                check_output(
                    flag, item, {"out_folder": "folder", "out_file": "file", "records_out": "records"}[rule.kind]
                )
            elif rule.kind in ("in_file", "in_folder", "in_path"):
                path = Path(item).expanduser()
                try:
                    exists, is_dir = path.exists(), path.is_dir()
                except OSError as error:
                    raise UsageError(f"{flag} {item}: not a usable path ({error.strerror}).") from None
                if not exists:
                    what = {"in_folder": "folder", "in_file": "file"}.get(rule.kind, "file or folder")
                    raise UsageError(f"{flag} {item}: no such {what}; must be {rule.valid}.")
                if rule.kind == "in_folder" and not is_dir:
                    raise UsageError(f"{flag} {item}: a file, not a folder; must be {rule.valid}.")
                if rule.kind == "in_file" and is_dir:
                    raise UsageError(f"{flag} {item}: a folder, not a file; must be {rule.valid}.")
            elif rule.kind in ("text", "model"):
                if not str(item).strip():
                    raise UsageError(f"{flag} is empty: must be {rule.valid}.")
                if rule.test is not None and not rule.test(item):
                    raise UsageError(f"{flag} {item!r}: must be {rule.valid}.")
            elif (
                rule.kind == "device"
            ):  # torch's own test, a tensor made there (its error came after the model loaded)
                import torch

                try:
                    torch.empty(0, device=item)
                except (RuntimeError, AssertionError, ValueError) as error:
                    reason = " ".join(str(error).split())
                    raise UsageError(
                        f"{flag} {item}: {reason} (leave {flag} out to use a GPU when there is one)"
                    ) from None
            elif rule.kind == "url":
                if not str(item).startswith(("http://", "https://")):
                    raise UsageError(f"{flag} {item!r}: must be {rule.valid}.")
            elif rule.kind != "bool":
                try:
                    check_value(name, item, rule)
                    if rule.kind == "numbers" and rule.test is not None and not all(rule.test(v) for v in item):
                        _refuse(name, item, rule)
                except ValueError as error:
                    raise UsageError(str(error)) from None


def _as_list(value) -> list:
    """A YAML scalar (`reward_funcs: accuracy`, `reward_weights: 1.0`) as the one-item list the run makes of it."""
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _is_folder(path) -> bool:
    from pathlib import Path

    return bool(path) and Path(path).expanduser().is_dir()


def _optim_args(text) -> dict[str, str]:
    """transformers' `--optim_args` text ("momentum=0.9,nesterov=True") as a mapping."""
    return dict(part.split("=", 1) for part in (text or "").replace(" ", "").split(",") if "=" in part)


# Facts of a built run that rules in `COMBINATIONS` join with settings: not options, given by the code that knows them
FACTS = {
    "device_type": "the device the run trains on",
    "fsdp_version": "the FSDP version the run shards with",
    "fsdp_state_dict_type": "how its FSDP checkpoints are saved",
}


@dataclass(frozen=True)
class Combination:
    """A constraint between fields, checked where each of `fields` has a value."""

    fields: tuple[str, ...]
    test: Callable[..., bool]
    message: Callable[..., str]
    early: bool = True  # also checked on the raw command line and recipe (`precheck`)
    # Values the rule refuses: the troubleshooting page shows the message they get (`troubleshooting_markdown`)
    example: tuple = ()
    # The commands whose settings it joins ("train" is also `demo` and `VEPOConfig`); empty: any that has the fields
    commands: tuple[str, ...] = ()
    # The test sees None for a field left unset (a rule about a missing setting); otherwise it waits for every value
    unset: bool = False


COMBINATIONS: list[Combination] = [
    Combination(
        ("min_pixels", "max_pixels"),
        lambda low, high: low <= high,
        lambda low, high: f"--min_pixels {low} --max_pixels {high}: need min_pixels <= max_pixels.",
        example=(60000, 50000),
    ),
    Combination(
        ("generation_batch_size", "num_generations"),
        lambda batch, group: batch % group == 0,
        lambda batch, group: (
            f"--generation_batch_size {batch}: must be a multiple of --num_generations {group} (whole groups of "
            "completions per prompt)."
        ),
        example=(7, 2),
    ),
    Combination(
        ("save_strategy", "save_steps"),
        lambda strategy, steps: str(getattr(strategy, "value", strategy)).lower() != "steps" or steps > 0,
        lambda strategy, steps: (
            f"--save_steps {steps} with --save_strategy steps: never saves (a step count >= 1, or a fraction of the "
            "run below 1); for no checkpoints pass --save_strategy no."
        ),
        example=("steps", 0),
    ),
    Combination(
        ("entropy_coef_min", "entropy_coef_max"),
        lambda low, high: low <= high,
        lambda low, high: f"--entropy_coef_min {low} --entropy_coef_max {high}: need entropy_coef_min <= max.",
        example=(0.5, 0.1),
    ),
    Combination(
        ("reward_weights", "reward_funcs"),
        lambda weights, funcs: len(_as_list(weights)) == len(_as_list(funcs)),
        lambda weights, funcs: (
            f"--reward_weights {' '.join(str(w) for w in _as_list(weights))}: one weight per reward function, and "
            f"--reward_funcs has {len(_as_list(funcs))} ({' '.join(map(str, _as_list(funcs)))})."
        ),
        early=False,  # after the reward names are known to exist (an unknown name is the first thing to say)
        example=([0.5, 0.5], ["accuracy"]),
    ),
    # Settings that train, and give a wrong result without a word
    Combination(
        ("selection_strategy", "selection_mode"),
        lambda strategy, mode: not (strategy == "full" and mode == "weight"),
        lambda strategy, mode: (
            "selection_mode weight with selection_strategy full weights every token 1 + selection_weight: GRPO's "
            "policy-gradient term scaled, not GRPO. Use selection_mode mask (full is GRPO exactly), or a strategy "
            "that selects."
        ),
        example=("full", "weight"),
    ),
    Combination(
        ("reward_weights",),
        lambda weights: not _as_list(weights) or any(float(w) != 0 for w in _as_list(weights)),
        lambda weights: (
            f"--reward_weights {' '.join(str(w) for w in _as_list(weights))}: every weight is 0, so every reward "
            "and every advantage is 0 and the run cannot learn; give at least one reward a weight."
        ),
        example=([0, 0],),
    ),
    # TRL's GRPOTrainer.__init__ refuses these after the model loaded: said before
    Combination(
        ("sync_ref_model", "beta"),
        lambda sync, beta: not (_true(sync) and float(beta) == 0.0),
        lambda sync, beta: (
            "--sync_ref_model true with --beta 0: without the KL term there is no reference model to synchronise "
            "(TRL's GRPOTrainer refuses it); drop --sync_ref_model, or give --beta above 0."
        ),
        example=(True, 0.0),
    ),
    Combination(
        ("sync_ref_model", "use_peft"),
        lambda sync, peft: not (_true(sync) and _true(peft)),
        lambda sync, peft: (
            "--sync_ref_model true with --use_peft true: TRL's GRPOTrainer cannot synchronise the reference of a "
            "PEFT model; drop one."
        ),
        example=(True, True),
    ),
    # An evaluation schedule without the set it evaluates on (the set without a schedule is never read: TRAIN_READS)
    Combination(
        ("eval_strategy", "eval_dataset_name"),
        lambda strategy, held: _mode(strategy) == "no" or bool(held),
        lambda strategy, held: (
            f"--eval_strategy {_mode(strategy)} evaluates on an evaluation set, and none is given: add "
            "--eval_dataset_name (e.g. geometry3k, or a local file), or drop --eval_strategy."
        ),
        commands=("train",),
        unset=True,
        example=("steps", None),
    ),
    Combination(
        ("eval_on_start", "eval_dataset_name"),
        lambda start, held: not _true(start) or bool(held),
        lambda *_: (
            "--eval_on_start true evaluates on an evaluation set before the first step, and none is given: add "
            "--eval_dataset_name, or drop --eval_on_start (TRL fails on it after the model loaded)."
        ),
        commands=("train",),
        unset=True,
        example=(True, None),
    ),
    # Facts of the built run (`FACTS`: where it trains, how FSDP saves), checked once it is built
    Combination(
        ("fp16", "device_type"),
        lambda fp16, device: not (_true(fp16) and device == "cpu"),
        lambda fp16, device: (
            "--fp16 true needs a GPU, and this run is on the CPU (use_cpu, or none visible), where it would train in "
            "float32: drop --fp16 (--bf16 runs on the CPU)."
        ),
        early=False,
        example=(True, "cpu"),
    ),
    Combination(
        ("torch_compile", "device_type"),
        lambda compile_, device: not (_true(compile_) and device == "cpu"),
        lambda compile_, device: (
            "--torch_compile true on the CPU compiles for minutes before the first step, and Ctrl-C cannot stop it "
            "while it does; drop it here (it pays off on a GPU)."
        ),
        early=False,
        example=(True, "cpu"),
    ),
    # FSDP2 with FULL_STATE_DICT checkpoints loads the optimizer through torch's
    # `set_optimizer_state_dict(full_state_dict=True)`, which raises "Expected device to be set" for an optimizer
    # without per-parameter state (plain SGD), as of torch 2.14 (tests/distributed/fsdp2_stateless_optimizer.py fails
    # once torch loads it: then drop this row). SHARDED_STATE_DICT loads it.
    Combination(
        ("fsdp_version", "fsdp_state_dict_type", "save_strategy", "optim", "optim_args"),
        lambda version, state, save, optim, optim_args: (
            not (
                str(version) == "2"
                and str(state).upper().startswith("FULL")
                and _mode(save) != "no"
                and _mode(optim) == "sgd"
                and float(_optim_args(optim_args).get("momentum", 0) or 0) == 0
            )
        ),
        lambda *_: (
            "FSDP2 saves FULL_STATE_DICT checkpoints here, and torch cannot load one of plain SGD (no optimizer "
            "state: set_optimizer_state_dict raises 'Expected device to be set'), so this run could not be resumed: "
            "pass --optim_args momentum=0.9, another --optim, or fsdp_state_dict_type: SHARDED_STATE_DICT."
        ),
        early=False,
        unset=True,
        example=("2", "FULL_STATE_DICT", "steps", "sgd", None),
    ),
    Combination(
        ("labels", "runs"),
        lambda labels, runs: not labels or len(labels) == len(runs),
        lambda labels, runs: f"--labels has {len(labels)} names for {len(runs)} runs.",
        commands=("plot",),
        example=(["a", "b"], ["run"]),
    ),
    # vepo-trl eval: what a push and a run need
    Combination(
        ("num_samples", "temperature"),
        lambda samples, temperature: (samples or 1) == 1 or (temperature or 0) > 0,
        lambda samples, _: (
            f"--num_samples {samples} with --temperature 0 draws the same greedy answer {samples} "
            "times: give --temperature > 0 (VPPO's avg@8: --num_samples 8 --temperature 1.0)."
        ),
        commands=("eval",),
        example=(8, 0.0),
    ),
    Combination(
        ("model", "rescore", "compare"),
        lambda model, stored, compared: model is not None or stored is not None or compared is not None,
        lambda *_: "--model is required (or --rescore DIR to grade stored completions, or --compare A B).",
        commands=("eval",),
        unset=True,
        example=(None, None, None),
    ),
    Combination(
        ("compare", "rescore"),
        lambda compared, stored: compared is None or stored is None,
        lambda *_: "--compare reads two results folders and --rescore grades one: run them one after the other.",
        commands=("eval",),
        example=(["a", "b"], "c"),
    ),
    Combination(
        ("compare",),
        lambda compared: compared is None or len(compared) == 2,
        lambda compared: f"--compare takes two results folders (A B), not {len(compared)}.",
        commands=("eval",),
        unset=True,
        example=(["a"],),
    ),
    Combination(
        ("push_to_hub", "hub_model_id"),
        lambda push, repo: not _true(push) or bool(repo),
        lambda *_: "--push_to_hub needs --hub_model_id (owner/name): the repo the card goes to.",
        commands=("eval",),
        unset=True,
        example=(True, None),
    ),
    Combination(
        ("push_to_hub", "no_model_card"),
        lambda push, no_card: not (_true(push) and _true(no_card)),
        lambda *_: "--push_to_hub pushes the model card, and --no_model_card leaves it unwritten.",
        commands=("eval",),
        example=(True, True),
    ),
    Combination(
        ("push_to_hub", "model", "adapter"),
        lambda push, model, adapter: not _true(push) or _is_folder(adapter or model),
        lambda *_: "--push_to_hub pushes the card of a local model folder; --model is not one.",
        commands=("eval",),
        unset=True,
        example=(True, "owner/name", None),
    ),
    # VEPO's token selection against GRPO's options that act on the same tokens or their weights
    Combination(
        ("importance_sampling_level", "selection_strategy"),
        lambda level, strategy: level != "sequence" or strategy == "full",
        lambda level, strategy: (
            "importance_sampling_level='sequence' (GSPO) uses one ratio per response, averaged over all its tokens, "
            f"so selection_strategy={strategy!r} could only reweight whole responses, not choose tokens. Use "
            "importance_sampling_level='token' with token selection, or selection_strategy='full' for GSPO."
        ),
        example=("sequence", "vepo"),
    ),
    Combination(
        ("selection_mode", "top_entropy_quantile"),
        lambda mode, quantile: mode != "weight" or quantile >= 1.0,
        lambda mode, quantile: (
            "selection_mode='weight' and top_entropy_quantile < 1 both weight the policy-gradient term; use one."
        ),
        example=("weight", 0.2),
    ),
    Combination(
        ("use_adaptive_entropy", "selection_strategy"),
        lambda adaptive, strategy: not _true(adaptive) or strategy == "full",
        lambda adaptive, strategy: (
            "use_adaptive_entropy is not supported with token selection: its controller would see TRL's masked "
            "entropy, not VEPO's entropy_scope. Use a fixed entropy_coef, or selection_strategy='full'."
        ),
        example=(True, "vepo"),
    ),
    Combination(
        ("top_entropy_quantile", "selection_strategy"),
        lambda quantile, strategy: quantile >= 1.0 or strategy == "full",
        lambda quantile, strategy: (
            f"top_entropy_quantile={quantile} is GRPO's own batch-wide entropy filter and would stack on "
            f"selection_strategy={strategy!r}. Leave top_entropy_quantile at 1.0 and use selection_strategy='entropy' "
            "with selection_ratio for per-response top-k entropy."
        ),
        example=(0.2, "vepo"),
    ),
]


# When a run reads a setting: a setting given (on the command line in any spelling, in a recipe, to `VEPOConfig` or a
# command's declaration) that the run will not read is refused in one line naming it and what would make it read.


@dataclass(frozen=True)
class Reads:
    """When a run reads a setting: `test`, over the resolved values of the `deciders` (the settings that choose the
    run's mode), is true where it does. `needs`: in words, what makes it read. `unread` / `read`: values of the
    deciders in a mode that does not / does read it (the property test and `benchmarks/bad_inputs.py` run both)."""

    deciders: tuple[str, ...]
    test: Callable[..., bool]
    needs: str | Callable[..., str]  # or a function of the deciders' values
    unread: tuple = ()
    read: tuple = ()

    def reads(self, values: Mapping[str, object]) -> bool | None:
        """Whether a run with `values` reads the setting; None while a decider's value is not known yet."""
        if any(name not in values for name in self.deciders):
            return None
        return bool(self.test(*(values[name] for name in self.deciders)))


ALWAYS = Reads((), lambda: True, "always read")


def _true(value) -> bool:
    """A flag as the command line (text) or a recipe / Python (a bool) gives it."""
    return value is True or (isinstance(value, str) and value.strip().lower() in ("true", "1", "yes"))


def _mode(value) -> str:
    """A strategy setting (`"steps"`, transformers' `IntervalStrategy.STEPS`) as lower-case text."""
    return str(getattr(value, "value", value)).lower()


def _vllm_mode(mode: str, needs: str) -> Reads:
    return Reads(("use_vllm", "vllm_mode"), lambda use, m: _true(use) and m == mode, needs,
                 (True, "server" if mode == "colocate" else "colocate"), (True, mode))  # fmt: skip


def _strategy_is(field: str, *modes: str, needs: str) -> Reads:
    """Read when `field` (save / logging / eval strategy) is one of `modes`, or anything but "no" (no modes)."""
    test = (lambda s: _mode(s) in modes) if modes else (lambda s: _mode(s) != "no")
    return Reads((field,), test, needs, ("no",), (modes[0] if modes else "steps",))


_VLLM = Reads(("use_vllm",), _true, "--use_vllm true", (False,), (True,))
_COLOCATE = _vllm_mode("colocate", "--use_vllm true --vllm_mode colocate")
_SERVER = _vllm_mode("server", "--use_vllm true --vllm_mode server")
_SERVER_ADDRESS = Reads(
    ("use_vllm", "vllm_mode", "vllm_server_base_url"),
    lambda use, mode, url: _true(use) and mode == "server" and not url,
    "--use_vllm true --vllm_mode server, without --vllm_server_base_url (which replaces host and port)",
    (True, "server", "http://10.0.0.2:8000"),
    (True, "server", None),
)
_IS_CORRECTION = Reads(
    ("use_vllm", "vllm_importance_sampling_correction"),
    lambda use, correction: _true(use) and _true(correction),
    "--use_vllm true with --vllm_importance_sampling_correction true",
    (True, False),
    (True, True),
)
PUSHES = Reads(("push_to_hub",), _true, "--push_to_hub", (False,), (True,))
_EVAL_SET = Reads(("eval_dataset_name", "eval_strategy", "eval_on_start"),
                  lambda held, strategy, start: bool(held) and (_mode(strategy) != "no" or _true(start)),
                  "--eval_dataset_name (an evaluation set) with an --eval_strategy other than no (or --eval_on_start)",
                  (None, "no", False), ("geometry3k", "steps", False))  # fmt: skip
_LAB, _SYNTHETIC = "lab", "synthetic"  # data.loaders' generated data sets (light here: no import)

_TRACKERS = ("wandb", "trackio", "comet_ml", "mlflow", "dagshub", "swanlab")  # the integrations that name a run


def _reports_to(report_to, *names: str) -> bool:
    """Whether `report_to` (a name, a list, or "all": every installed one) includes one of `names`."""
    given = [str(item).lower() for item in (_as_list(report_to) if report_to is not None else [])]
    return "all" in given or any(name in given for name in names)


def _above_zero(value) -> bool:
    return value is not None and float(value) > 0


def _never(why: str) -> Reads:
    """A setting no `vepo-trl train` run reads (checked against TRL 1.16 and transformers 5.25): refused when given."""
    return Reads((), lambda: False, lambda: f"no vepo-trl train run reads it: {why}")


_GRPO_OVERRIDES = "GRPOTrainer overrides the Trainer code that reads it"
_CLIPPED_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")  # TRL's two-sided clip (delta) applies to these


# `vepo-trl train` / `demo` / `VEPOConfig`: the settings of TRL, transformers and the script read only in some modes.
# VEPO's strategy and perturbation settings follow the registries (`unread_settings`, added by `settings_reads`).
TRAIN_READS: dict[str, Reads] = {
    **dict.fromkeys(("vllm_mode", "vllm_structured_outputs_regex", "vllm_importance_sampling_correction"), _VLLM),
    **dict.fromkeys(("vllm_server_base_url", "vllm_server_timeout", "vllm_group_port"), _SERVER),
    **dict.fromkeys(("vllm_server_host", "vllm_server_port"), _SERVER_ADDRESS),
    **dict.fromkeys(
        (
            "vllm_gpu_memory_utilization",
            "vllm_tensor_parallel_size",
            "vllm_max_model_length",
            "vllm_enable_sleep_mode",
            "vllm_model_impl",
        ),
        _COLOCATE,
    ),  # fmt: skip
    **dict.fromkeys(
        (
            "vllm_importance_sampling_mode",
            "vllm_importance_sampling_clip_min",
            "vllm_importance_sampling_clip_max",
            "vllm_importance_sampling_cap",
        ),
        _IS_CORRECTION,
    ),  # fmt: skip
    "save_steps": _strategy_is("save_strategy", "steps", needs="--save_strategy steps"),
    # (save_on_each_node is read by the final save too; logging_first_step and eval_on_start whatever the strategy;
    # the evaluation's batch settings by a Python caller's trainer.evaluate(): always read)
    **dict.fromkeys(
        ("save_total_limit", "save_only_model"), _strategy_is("save_strategy", needs="a --save_strategy other than no")
    ),  # fmt: skip
    # transformers takes logging_steps as eval_steps where evaluation runs by steps without its own
    "logging_steps": Reads(
        ("logging_strategy", "eval_strategy", "eval_steps"),
        lambda logging, evaluation, steps: (
            _mode(logging) == "steps" or (_mode(evaluation) == "steps" and steps is None)
        ),
        "--logging_strategy steps (or --eval_strategy steps without --eval_steps)",
        ("no", "no", None),
        ("steps", "no", None),
    ),  # fmt: skip
    **dict.fromkeys(
        ("eval_steps", "eval_delay"), _strategy_is("eval_strategy", "steps", needs="--eval_strategy steps")
    ),
    "max_eval_samples": _EVAL_SET,
    # (an evaluation schedule without a set is a rule of its own: `COMBINATIONS`)
    "eval_dataset_name": Reads(
        ("eval_strategy", "eval_on_start"),
        lambda strategy, start: _mode(strategy) != "no" or _true(start),
        "--eval_strategy steps or epoch (or --eval_on_start true)",
        ("no", False),
        ("steps", False),
    ),  # fmt: skip
    # hub_model_id is read without a push too: the model card's usage snippet names it
    **dict.fromkeys(("hub_strategy", "hub_private_repo", "hub_always_push", "hub_revision"), PUSHES),
    **dict.fromkeys(
        ("ref_model_sync_steps", "ref_model_mixup_alpha"),
        Reads(("sync_ref_model",), _true, "--sync_ref_model true", (False,), (True,)),
    ),  # fmt: skip
    "selection_samples_count": Reads(
        ("selection_samples_steps",),
        lambda steps: steps is not None and float(steps) > 0,
        "--selection_samples_steps N above 0",
        (0,),
        (5,),
    ),  # fmt: skip
    # (torch_compile_backend / _mode are read whenever given: transformers turns torch_compile on for them)
    **dict.fromkeys(
        (
            "lora_r",
            "lora_alpha",
            "lora_dropout",
            "lora_target_modules",
            "lora_target_parameters",
            "lora_modules_to_save",
            "lora_task_type",
            "use_rslora",
            "use_dora",
        ),
        Reads(("use_peft",), _true, "--use_peft true (an adapter is trained, not the whole model)", (False,), (True,)),
    ),  # fmt: skip
    "synthetic_rows": Reads(
        ("dataset_name", "eval_dataset_name"),
        lambda train, held: bool({_SYNTHETIC, _LAB} & {train, held}),
        "dataset_name synthetic or lab (generated rows; --max_train_samples keeps the first N rows of a file)",
        ("my/data.jsonl", None),
        (_SYNTHETIC, None),
    ),  # fmt: skip
    # transformers runs num_train_epochs only where no step count is given
    "num_train_epochs": Reads(
        ("max_steps",),
        lambda steps: steps is None or float(steps) <= 0,
        "--max_steps -1 (a step count stops the run there)",
        (60,),
        (-1,),
    ),  # fmt: skip
    "optim_target_modules": Reads(
        ("optim",),
        lambda optim: _mode(optim).startswith(("galore", "apollo")),
        "--optim galore_* or apollo_* (low-rank optimizers)",
        ("adamw_torch",),
        ("galore_adamw",),
    ),  # fmt: skip
    "liger_kernel_config": Reads(("use_liger_kernel",), _true, "--use_liger_kernel true", (False,), (True,)),
    "run_name": Reads(
        ("report_to",),
        lambda report_to: _reports_to(report_to, *_TRACKERS),
        "--report_to wandb, trackio, comet_ml, mlflow, dagshub or swanlab (the tracker names the run)",
        ("none",),
        ("wandb",),
    ),  # fmt: skip
    **dict.fromkeys(
        ("project", "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id"),
        Reads(
            ("report_to",),
            lambda report_to: _reports_to(report_to, "trackio"),
            "--report_to trackio",
            ("none",),
            ("trackio",),
        ),
    ),  # fmt: skip
    **dict.fromkeys(
        ("dataloader_persistent_workers", "dataloader_prefetch_factor", "dataloader_multiprocessing_context"),
        Reads(
            ("dataloader_num_workers",), _above_zero, "--dataloader_num_workers above 0 (worker processes)", (0,), (2,)
        ),
    ),  # fmt: skip
    "cache_implementation": Reads(
        ("use_vllm",), lambda use: not _true(use), "transformers generation (--use_vllm false)", (True,), (False,)
    ),  # fmt: skip
    # TRL's loss options, by the loss that reads them
    "delta": Reads(
        ("loss_type",),
        lambda loss: loss in _CLIPPED_LOSSES,
        f"--loss_type {' / '.join(_CLIPPED_LOSSES)} (two-sided clipping)",
        ("sapo",),
        ("grpo",),
    ),  # fmt: skip
    **dict.fromkeys(
        ("sapo_temperature_neg", "sapo_temperature_pos"),
        Reads(("loss_type",), lambda loss: loss == "sapo", "--loss_type sapo", ("grpo",), ("sapo",)),
    ),  # fmt: skip
    **dict.fromkeys(
        ("vespo_k_pos", "vespo_k_neg", "vespo_lambda_pos", "vespo_lambda_neg"),
        Reads(("loss_type",), lambda loss: loss == "vespo", "--loss_type vespo", ("grpo",), ("vespo",)),
    ),  # fmt: skip
    "use_bias_correction_kl": Reads(("beta",), _above_zero, "--beta above 0 (the KL term)", (0.0,), (0.04,)),
    **dict.fromkeys(
        ("entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target"),
        Reads(("use_adaptive_entropy",), _true, "--use_adaptive_entropy true (its controller)", (False,), (True,)),
    ),  # fmt: skip
    **dict.fromkeys(
        ("num_completions_to_print", "log_completions_hub_repo"),
        Reads(("log_completions",), _true, "--log_completions true", (False,), (True,)),
    ),  # fmt: skip
    "dataset_test_split": _EVAL_SET,
    **dict.fromkeys(
        ("bnb_4bit_quant_type", "use_bnb_nested_quant", "bnb_4bit_quant_storage"),
        Reads(("load_in_4bit",), _true, "--load_in_4bit true", (False,), (True,)),
    ),  # fmt: skip
    # Read by no GRPO run (the Trainer paths that read them are overridden, or nothing reads them)
    **dict.fromkeys(
        (
            "average_tokens_across_devices",
            "label_smoothing_factor",
            "prediction_loss_only",
            "label_names",
            "train_sampling_strategy",
            "length_column_name",
        ),
        _never(_GRPO_OVERRIDES),
    ),  # fmt: skip
    "include_for_metrics": _never("it feeds compute_metrics, which GRPOTrainer takes none of"),
    "data_seed": _never("it seeds a RandomSampler; GRPOTrainer samples with its own RepeatSampler (seeded by seed)"),
    **dict.fromkeys(
        ("do_train", "do_eval", "do_predict"), _never("transformers' example scripts read it, no trainer")
    ),
    "max_tool_calling_iterations": _never("it bounds tool calls, and vepo-trl train passes no tools"),
    **dict.fromkeys(
        ("dataset_config", "dataset_streaming", "ignore_bias_buffers"),
        _never("TRL's own scripts read it; vepo-trl train's data loader takes a name or a file"),
    ),  # fmt: skip
    **dict.fromkeys(
        ("min_pixels", "max_pixels"),
        Reads(
            ("dataset_name", "eval_dataset_name"),
            lambda train, held: not (train == _LAB and held in (None, "", _LAB)),
            "data other than dataset_name lab (which draws its images at the warm start's own size)",
            (_LAB, None),
            (_SYNTHETIC, None),
        ),
    ),  # fmt: skip
}


# VEPO's own settings, read as the registries say. A registered function's keyword argument -> the VEPOConfig settings
# that feed it (`unread_settings`)
STRATEGY_SETTINGS = {"ratio": ("selection_ratio",), "alpha": ("selection_alpha",)}
PERTURBATION_SETTINGS = {
    "noise_step": ("noise_step", "noise_annealing", "noise_annealing_coefficient", "noise_annealing_midpoint"),
    "sigma": ("noise_sigma",),
    "patch_probability": ("patch_probability",),
}


def unread_settings(args) -> dict[str, str]:
    """The VEPO settings this run never reads, each with why, derived from the registries: a strategy reads the
    settings its function takes (`SelectionStrategy.reads`), a perturbation likewise (`perturbation_reads`), and no
    perturbation setting is read by a strategy without a perturbed pass. The model card and the report leave these
    out; `check_read` refuses one that was set (`settings_reads`)."""
    from .perturb import perturbation_reads
    from .scoring import get_strategy

    strategy = get_strategy(args.selection_strategy)
    unread = {}
    for keyword, names in STRATEGY_SETTINGS.items():
        if keyword not in strategy.reads:
            unread.update(dict.fromkeys(names, f"selection_strategy {strategy.name} does not read it"))
    perturbation = (
        "perturbation",
        "perturbation_seed",
        *(n for names in PERTURBATION_SETTINGS.values() for n in names),
    )
    if not strategy.needs_perturbed_pass:
        unread.update(dict.fromkeys(perturbation, f"selection_strategy {strategy.name} runs no perturbed pass"))
        if strategy.count == "random":  # its token draws are seeded by perturbation_seed (selection_pipeline)
            unread.pop("perturbation_seed")
        return unread
    reads = perturbation_reads(args.perturbation)
    for keyword, names in PERTURBATION_SETTINGS.items():
        if keyword not in reads:
            unread.update(dict.fromkeys(names, f"perturbation {args.perturbation} does not read it"))
    if "noise_step" in reads and not args.noise_annealing:
        why = "noise_annealing is false (the noise step stays at noise_step)"
        unread.update(dict.fromkeys(("noise_annealing_coefficient", "noise_annealing_midpoint"), why))
    return unread


def check_rule_params(args) -> None:
    """`strategy_params` and `perturbation_params` against the signatures of the run's strategy and perturbation
    (`SelectionStrategy.settings`, `perturbation_settings`): a name the function does not take, a setting it needs
    left out, or perturbation settings for a run without a perturbed pass are refused, in one line each."""
    import inspect

    from .perturb import perturbation_settings
    from .scoring import get_strategy

    strategy = get_strategy(args.selection_strategy)
    checks = [("strategy_params", f"selection_strategy {strategy.name}", strategy.settings, args.strategy_params)]
    if strategy.needs_perturbed_pass:
        checks.append(
            (
                "perturbation_params",
                f"perturbation {args.perturbation}",
                perturbation_settings(args.perturbation),
                args.perturbation_params,
            )  # fmt: skip
        )
    elif args.perturbation_params:
        raise ValueError(
            f"--perturbation_params is never read: selection_strategy {strategy.name} runs no perturbed pass; "
            "remove it."
        )
    for option, owner, settings, given in checks:
        given = given or {}
        if not isinstance(given, Mapping):
            raise ValueError(f"--{option} {given!r}: must be a mapping of setting names to values (JSON).")
        takes = ", ".join(sorted(settings)) or "none"
        unknown = sorted(set(given) - set(settings))
        if unknown:
            raise ValueError(
                f"--{option}: {owner} takes no setting {', '.join(map(repr, unknown))} (its settings: {takes})."
            )
        missing = sorted(
            name for name, default in settings.items() if default is inspect.Parameter.empty and name not in given
        )
        if missing:
            example = ", ".join(f'"{name}": ...' for name in missing)
            raise ValueError(f"{owner} needs its setting(s) {', '.join(missing)}: give --{option} '{{{example}}}'.")


def settings_reads() -> dict:
    """When a run reads each setting that some runs do not (`validation.Reads`): the table of TRL's, transformers' and
    the script's (`validation.TRAIN_READS`), and VEPO's strategy and perturbation settings as the registries say."""
    from .perturb import PERTURBATIONS, perturbation_reads

    deciders = ("selection_strategy", "perturbation", "noise_annealing")
    table = {}
    for name in ("perturbation", "perturbation_seed", *STRATEGY_SETTINGS.values(), *PERTURBATION_SETTINGS.values()):
        names = (name,) if isinstance(name, str) else name
        keyword = next((k for k, group in PERTURBATION_SETTINGS.items() if names == group), None)
        # A run that reads them: VEPO with the first perturbation that takes the keyword (annealing on for its own)
        perturbation = next(p for p in PERTURBATIONS if keyword is None or keyword in perturbation_reads(p))
        for one in names:
            table[one] = registry_reads(
                one, deciders, ("vepo", perturbation, True if keyword == "noise_step" else None)
            )
    return {**TRAIN_READS, **table}


# The commands' own options (their declarations name these)
GENERATES = Reads(("rescore", "compare"), lambda stored, compared: stored is None and compared is None,
                  "a run that generates (--rescore grades stored completions and --compare reads two folders: no "
                  "model, no generation)", ("eval-old", None), (None, None))  # fmt: skip
VLLM_ENGINE = Reads(("backend", "rescore", "compare"),
                    lambda backend, stored, compared: backend != "transformers" and stored is None and compared is None,
                    "--backend vllm (or auto, where vLLM is installed)", ("transformers", None, None),
                    ("vllm", None, None))  # fmt: skip
EVALUATES = Reads(("compare",), lambda compared: compared is None,
                  "a run that evaluates or grades (--compare only reads two folders)", (["a", "b"],), (None,))  # fmt: skip
JUDGED = Reads(("protocol", "compare"), lambda protocol, compared: protocol != "rule" and compared is None,
               "--protocol paper or lenient (rule has no judge; --compare reads stored verdicts)", ("rule", None),
               ("paper", None))  # fmt: skip
SAMPLES = Reads(("greedy",), lambda greedy: not greedy, "sampled responses (not --greedy)", (True,), (False,))
SAMPLED_EVAL = Reads(("rescore", "compare", "temperature"),
                     lambda stored, compared, temperature: stored is None and compared is None and (temperature or 0) > 0,
                     "sampled generation (--temperature > 0)", (None, None, 0.0), (None, None, 1.0))  # fmt: skip
RUNS_MODEL = Reads(("records",), lambda records: records is None, "a model run (--records renders saved records)",
                   ("records.jsonl",), (None,))  # fmt: skip
DATA_ROW = Reads(("dataset",), lambda dataset: dataset is not None, "--dataset", (None,), ("synthetic",))
OWN_PROMPT = Reads(("image",), lambda image: image is not None, "--image", (None,), ("fig.png",))


def registry_reads(name: str, deciders: tuple[str, str, str], read: tuple) -> Reads:
    """A strategy or perturbation setting (`name`, as `VEPOConfig` calls it), read as the registries say
    (`unread_settings`). `deciders`: how the command calls the strategy, the perturbation and, for `inspect` /
    `analyze`, the recipe (`train`: noise_annealing), whose choice is judged where it is read; `read`: their values
    in a run that reads it."""

    def run(strategy, perturbation, third):
        annealing = _true(third) if deciders[2] == "noise_annealing" else False
        strategy, perturbation = strategy or "vepo", perturbation or "diffusion"
        saved = (early_declared() or {}).get("unread", {}).get(f"{strategy}|{perturbation}|{annealing}")
        if saved is not None:  # the registries as a full parse saved them: no torch import
            return saved.get(name)
        from types import SimpleNamespace

        run = SimpleNamespace(selection_strategy=strategy, perturbation=perturbation, noise_annealing=annealing)
        return unread_settings(run).get(name)

    def test(strategy, perturbation, third):
        if deciders[2] == "config" and third is not None and (strategy is None or perturbation is None):
            return True
        return run(strategy, perturbation, third) is None

    return Reads(deciders, test, run, ("full", None, None), read)


def flag_name(token: str) -> str:
    """The option a command-line word names, in its one spelling: `--max-steps=3` -> `max_steps`."""
    return token[2:].split("=", 1)[0].replace("-", "_")


def check_repeated(argv: list[str], repeatable: dict[str, bool] | None = None) -> None:
    """A flag given twice is a mistake to say, not a value to replace silently (a recipe's key and the command line
    are not a repeat: the command line overrides the recipe by design). `repeatable`: the flags that add up."""
    from .errors import UsageError

    seen: dict[str, str] = {}
    for index, token in enumerate(argv):
        if not token.startswith("--") or len(token) == 2:
            continue
        if token == "--":
            break
        flag, equals, value = token.partition("=")
        if repeatable is not None and repeatable.get(flag, False):
            continue
        flag = "--" + flag_name(flag)  # `--max-steps` and `--max_steps` are one option
        if not equals:
            value = argv[index + 1] if index + 1 < len(argv) and not argv[index + 1].startswith("--") else ""
        if flag in seen:
            first, then = seen[flag], value
            both = f" ({first}, then {then})" if first or then else ""
            raise UsageError(f"{flag} is given twice{both}: give it once.")
        seen[flag] = value


def named_options(argv: list[str], options) -> set[str]:
    """The options the command-line words name, each in its one spelling: `--max-steps` is `max_steps`, and TRL's
    `--no_X` (for a flag that defaults to true) is `X`, where `X` is one of `options`."""
    names = {flag_name(word) for word in argv if word.startswith("--") and len(word) > 2}
    return {name[3:] if name.startswith("no_") and name[3:] in options else name for name in names}


# Set while a command parses (it checks the settings read with what was typed and what its recipe gave)
READS_CHECKED_BY_COMMAND = contextvars.ContextVar("reads_checked_by_command", default=False)


def check_read(reads: Mapping[str, Reads], values: Mapping[str, object], given: Iterable[str],
               typed: Iterable[str] | None = None) -> None:  # fmt: skip
    """Refuse a given setting the run will not read (`UsageError`, one line naming it and what makes it read).
    `values`: the run's resolved settings (a decider missing from them leaves its settings unjudged); `given`: the
    names the user set (command line, recipe, constructor); `typed`: those of the command line alone, where a recipe is
    read too: a recipe's setting left unread by a mode the user typed (`--use_vllm false` over a vLLM recipe) stays
    quiet, as a recipe's defaults do."""
    from .errors import UsageError

    given = set(given)
    typed = given if typed is None else set(typed)
    for name in [name for name in reads if name in given]:  # in the table's order: the same line every time
        rule = reads[name]
        if values.get(name, "") is None or rule.reads(values) is not False:  # a recipe's null leaves it unset
            continue
        if name not in typed and any(decider in typed for decider in rule.deciders):
            continue
        value = values.get(name)
        value = getattr(value, "value", value)
        shown = " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
        if callable(rule.needs):
            why = rule.needs(*(values[d] for d in rule.deciders))
        else:
            why = f"it is read only with {rule.needs}"
        raise UsageError(f"--{name} {shown} is set, and this run never reads it ({why}): drop it, or change that.")


def troubleshooting_markdown() -> str:
    """The troubleshooting page's generated part (docs/troubleshooting.md): every option's range as `RANGES` holds it,
    and every combination rule with the one-line refusal its example values get, rendered from the rules that raise
    them (a test keeps the page equal to this)."""
    rows = ["| option | must be |", "|---|---|"]
    rows += [f"| `--{name}` | {rule.valid} |" for name, rule in sorted(RANGES.items())]
    combos = [_combination_line(c) for c in COMBINATIONS]
    reads = ["| setting | read only with |", "|---|---|"]
    reads += [
        f"| `--{name}` | {rule.needs() if callable(rule.needs) and not rule.deciders else rule.needs} |"
        for name, rule in TRAIN_READS.items()
    ]
    return "\n".join([
        "### Values", "", *rows, "", "### Settings that cannot go together", "", *combos, "",
        "### Settings a train run reads only in some modes", "",
        "Given in another mode, each is refused in one line naming it (the strategy's and perturbation's settings follow "
        "the registries: `vepo-trl strategies`; every other command's options state theirs in `--help`'s declaration).",
        "", *reads,
    ]) + "\n"  # fmt: skip


def _combination_line(c: Combination) -> str:
    """A combination's example as the user writes it (a fact as what it is), then the line it gets."""
    given = [(field, value) for field, value in zip(c.fields, c.example) if value is not None]
    flags = bool(c.commands) and "train" not in c.commands  # the other commands' switches take no value
    options = " ".join(
        f"--{field}" if value is True and flags else f"--{field} {_show_example(value)}"
        for field, value in given
        if field not in FACTS
    )
    facts = ", ".join(f"{FACTS[field]}: {_show_example(value)}" for field, value in given if field in FACTS)
    where = f" ({', '.join(c.commands)})" if c.commands else ""
    return f"- `{options or '(none given)'}`{f' ({facts})' if facts else ''}{where}: {c.message(*c.example)}"


def _show_example(value) -> str:
    if isinstance(value, (list, tuple)):
        return " ".join(map(_show_example, value))
    return str(value).lower() if isinstance(value, bool) else str(value)


def _allows_none(annotation) -> bool:
    return any(part in str(annotation) for part in ("None", "Optional"))


def field_annotations(cls) -> dict:
    """The fields' types as the classes declare them: transformers' argument parser rewrites `field.type` in place
    (`float | None` becomes `float`), so they are read from the class annotations."""
    import typing

    hints = {}
    for klass in reversed(cls.__mro__):
        try:
            hints.update(typing.get_type_hints(klass))
        except Exception:  # an annotation that does not resolve: keep the raw ones
            hints.update(getattr(klass, "__annotations__", {}))
    return hints


def _type_rule(field, annotation) -> Rule | None:
    """A field's own rule from its dataclass: `choices` in its metadata, or its int / float type."""
    choices = field.metadata.get("choices") if field.metadata else None
    # An enum among the annotation's types (transformers' SaveStrategy, OptimizerNames, ...): its values, read off the
    # upstream class (and saved for the early check), not restated here
    enums = [t for t in (annotation, *typing.get_args(annotation)) if isinstance(t, type) and issubclass(t, enum.Enum)]
    if not choices and enums:
        choices = [member.value for member in enums[0]]
    if choices:
        names = tuple(choices)
        return Rule("choice", f"one of {', '.join(map(str, names))}", choices=lambda: names, optional=True)
    annotation = str(annotation)
    optional = _allows_none(annotation)
    if annotation.replace("typing.Optional[bool]", "bool").replace(" | None", "") in ("bool", "<class 'bool'>"):
        return Rule("bool", "true or false" + (", or unset" if optional else ""), optional=optional)
    if any(part in annotation for part in ("dict", "list", "str", "bool")):
        return None
    if "float" in annotation:
        return _number(None, "a finite number" + (", or unset" if optional else ""), optional)
    if "int" in annotation:
        return _whole(None, "a whole number" + (", or unset" if optional else ""), optional)
    return None


def rules_for(*dataclass_types) -> dict[str, Rule]:
    """The rule of every field of `dataclass_types` that has one: `RANGES` first, else its type's."""
    rules = {}
    for cls in dataclass_types:
        rules.update(_class_rules(cls))
    return rules


@functools.cache
def _class_rules(cls) -> dict[str, Rule]:
    """One class's rules, derived once per process (every config built, every parse reads them)."""
    rules = {}
    annotations = field_annotations(cls)
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        annotation = annotations.get(field.name, field.type)
        rule = RANGES.get(field.name) or _type_rule(field, annotation)
        if rule is None and field.name in getattr(cls, "_VALID_DICT_FIELDS", ()):
            rule = Rule(
                "mapping", "a mapping: JSON such as '{\"key\": 1}', or key: value lines in a recipe", optional=True
            )
        if rule is None:
            continue
        # A field the dataclass lets be None (unset) keeps that, whatever RANGES says
        if _allows_none(annotation) and not rule.optional:
            rule = dataclasses.replace(rule, optional=True)
        rules[field.name] = rule
    return rules


def check_values(values: Mapping[str, object], rules: Mapping[str, Rule], *, early: bool = False) -> dict[str, object]:
    """Each named value against its rule, then the combinations whose fields all have values; returns the values
    as checked (whole floats as ints). Raises `ValueError` with one line."""
    checked = {}
    for name, rule in rules.items():
        if name in values:
            checked[name] = check_value(name, values[name], rule)
    check_combinations({**values, **checked}, early=early)
    return checked


def check_combinations(values: Mapping[str, object], *, early: bool = False, command: str = "train") -> None:
    """`COMBINATIONS`, the one table of rules that join settings, over a command's values. A row waits for its
    fields: a field absent from `values` (a fact only the built run knows, such as `device_type`) skips it."""
    for combination in COMBINATIONS:
        if (early and not combination.early) or (combination.commands and command not in combination.commands):
            continue
        if any(name not in values for name in combination.fields):
            continue
        args = [values[name] for name in combination.fields]
        if not combination.unset and any(arg is None for arg in args):
            continue
        if not combination.test(*args):
            raise ValueError(combination.message(*args))


def check_object(obj, rules: Mapping[str, Rule]) -> None:
    """The rules on an object's attributes (a built dataclass); whole floats are stored back as ints."""
    # A dataclass: every field, for the combinations too (whether or not it has a rule of its own)
    names = [field.name for field in dataclasses.fields(obj)] if dataclasses.is_dataclass(obj) else rules
    values = {name: getattr(obj, name) for name in names if hasattr(obj, name)}
    for name, value in check_values(values, rules).items():
        if value is not values[name]:
            object.__setattr__(obj, name, value)


# The command line and recipes, before anything heavy loads


def _convert(name: str, text, rule: Rule):
    """A value from the command line (text) or a recipe (YAML's own type) as the rule's kind."""
    if rule.kind == "numbers":
        items = text if isinstance(text, list) else [text]
        return [_convert(name, item, Rule("number", rule.valid)) for item in items]
    if not isinstance(text, str):
        return text
    if text.strip().lower() in ("none", "null"):
        return None
    if rule.kind in ("choice", "choice_or_bool", "mapping", "mapping_file"):
        return text
    if rule.kind == "bool":
        lowered = text.strip().lower()
        if lowered == "":  # a bare `--bf16`: transformers' parser reads it as true
            return True
        if lowered in ("true", "yes", "1", "t", "y"):
            return True
        if lowered in ("false", "no", "0", "f", "n"):
            return False
        raise ValueError(f"--{name} {text!r}: must be {rule.valid}.")
    try:
        return float(text) if any(c in text.lower() for c in ".en") else int(text)
    except ValueError:
        raise ValueError(f"--{name} {text!r}: must be {rule.valid}.") from None


def values_from(argv: list[str], recipe: Mapping | None, rules: Mapping[str, Rule]) -> dict[str, object]:
    """The values `argv` and a recipe give to the fields of `rules` (the command line wins, as in TRL's parser)."""
    values = {name: value for name, value in (recipe or {}).items() if name in rules or name == "reward_funcs"}
    index = 0
    while index < len(argv):
        token = argv[index]
        name = token[2:].split("=", 1)[0] if token.startswith("--") else None
        if name in rules or name == "reward_funcs":
            if "=" in token:
                given, index = [token.split("=", 1)[1]], index + 1
            else:
                given, index = [], index + 1
                while index < len(argv) and not (argv[index].startswith("--") and len(argv[index]) > 2):
                    given.append(argv[index])
                    index += 1
            many = name == "reward_funcs" or rules[name].kind == "numbers"
            values[name] = given if many else (given[0] if given else "")
        else:
            index += 1
    return values


def precheck(argv: list[str], recipe: Mapping | None, rules: Mapping[str, Rule]) -> None:
    """The command line's and the recipe's values against `rules` and `COMBINATIONS`, before any heavy import."""
    given = values_from(argv, recipe, rules)
    converted = {name: _convert(name, value, rules[name]) for name, value in given.items() if name in rules}
    # Unset (null / None) is the dataclasses' to judge once built: whether a field may be unset is in its type
    converted = {name: value for name, value in converted.items() if value is not None}
    given = {name: value for name, value in given.items() if name not in rules or name in converted}
    check_values({**given, **converted}, rules, early=True)


def precheck_declared(argv: list[str], recipe: Mapping | None, command: str) -> None:
    """`train`'s refusals that need TRL's declarations, from what a full parse saved (`early_declared`): an option
    it does not take, a reward name it does not know, a whole number given as other text, a given setting the run
    will not read. Before TRL, transformers or torch is imported; silent until the first full parse has saved them."""
    from .errors import UsageError

    declared = early_declared()
    if declared is None:
        return
    options = {*declared["options"], "config", "help_all"}
    negated = {f"no_{name}" for name in declared["options"]}  # TRL's `--no_X` for a flag that defaults to true
    for word in argv[: argv.index("--")] if "--" in argv else argv:
        if word.startswith("--") and len(word) > 2 and flag_name(word) not in options | negated:
            raise UsageError(f"unrecognized arguments: {word.split('=', 1)[0]} (not an option of vepo-trl {command}; "
                             f"vepo-trl {command} --help-all lists them).")  # fmt: skip
    unknown = [key for key in recipe or {} if key not in options and key != "env"]
    if unknown:
        hint = (f" (a mapping kept for YAML anchors and `<<:` merges? name it x-{unknown[0]}: keys that start with x- "
                "or . are skipped)" if isinstance(recipe[unknown[0]], Mapping) else
                f"; vepo-trl {command} --help-all lists them")  # fmt: skip
        raise UsageError(f"--config: {unknown[0]!r} is not an option of vepo-trl {command}{hint}.")
    text = {name: Rule("text", "") for name in options}
    given_values = values_from(argv, recipe, text)
    funcs = given_values.get("reward_funcs")
    if funcs is not None:
        unknown = [name for name in _as_list(funcs) if name not in declared["rewards"]]
        if unknown:
            raise UsageError(f"reward_funcs: Unknown reward function(s) {unknown}. Valid names are: "
                             f"{sorted(declared['rewards'])}.")  # fmt: skip
    saved_rules = _saved().get("rules", {})
    for name, value in values_from(argv, None, text).items():  # typed: TRL's parser takes int("...") only
        if saved_rules.get(name, {}).get("kind") == "whole" or RANGES.get(name, Rule("", "")).kind == "whole":
            try:
                int(value)
            except (TypeError, ValueError):
                if str(value).strip().lower() not in ("none", "null"):
                    valid = (RANGES.get(name) or Rule("", saved_rules[name]["valid"])).valid
                    raise UsageError(f"--{name} {value!r}: text, must be {valid}.") from None
    typed = named_options(argv, options)
    nulls = {name for name, value in given_values.items() if value is None}  # a recipe's `key: null`: left unset
    given = (typed | set(recipe or {})) - nulls
    values = {**declared["defaults"], **given_values}
    for name, value in given_values.items():  # a list, a mapping or null is the full parse's to say (its type)
        if value is None or isinstance(value, (list, tuple, Mapping)) and name != "reward_funcs":
            values.pop(name)
    table = {name: reads for name, reads in TRAIN_READS.items()}
    deciders = ("selection_strategy", "perturbation", "noise_annealing")
    for name in {n for entry in declared["unread"].values() for n in entry}:
        table[name] = registry_reads(name, deciders, ())
    check_read(table, values, given, typed)


def _yaml_forms(annotation) -> set[str] | None:
    """The YAML forms a field's declared type takes: "text", "number", "bool", "list", "mapping", "null", and "object"
    for a class with no YAML form (`ParallelismConfig`). None where the annotation did not resolve."""
    import enum
    import types
    import typing

    if isinstance(annotation, str):
        return None
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        forms = set()
        for part in typing.get_args(annotation):
            part_forms = _yaml_forms(part)
            if part_forms is None:
                return None
            forms |= part_forms
        return forms
    if origin is typing.Literal:
        return set().union(*(_yaml_forms(type(value)) for value in typing.get_args(annotation)))
    kind = origin or annotation
    if kind is type(None):
        return {"null"}
    if kind is typing.Any:
        return {"text", "number", "bool", "list", "mapping", "null"}
    if kind is bool:
        return {"bool"}
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return {"text"} if issubclass(kind, str) else {"object"}
    for forms, kinds in (("text", (str,)), ("number", (int, float)), ("list", (list, tuple)), ("mapping", (dict,))):
        if kind in kinds or (isinstance(kind, type) and issubclass(kind, Mapping) and forms == "mapping"):
            return {forms}
    return {"object"}


def _yaml_kind(value) -> str:
    if isinstance(value, bool):
        return f"{str(value).lower()} (a YAML boolean)"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return repr(value) if isinstance(value, str) else str(value)


def recipe_values(recipe: Mapping, annotations: Mapping[str, object]) -> dict:
    """A recipe's values of any YAML type against the fields' declared types, for every key: a list or a mapping
    where one value goes, null where the field cannot be unset, a date, a number or a boolean where the type takes
    none of them, a value for a field that takes a Python object, are refused naming the key and the type (TRL's
    parser passes a recipe's values on as they are, to fail deep in a run: `accelerator_config: 7` opened file
    descriptor 7); a number or a date where text goes is taken as its text (`run_name: 2024`). Returns the recipe as
    the run will read it. Which numbers, texts and choices are valid is the rules' (`precheck`)."""
    import datetime

    checked = {}
    for key, value in recipe.items():
        annotation = annotations.get(key)
        forms = _yaml_forms(annotation) if annotation is not None else None
        if forms is None:
            checked[key] = value
            continue
        declared = str(annotation).replace("<class '", "").replace("'>", "")
        if "object" in forms and forms <= {"object", "null"}:
            if value is not None:
                objects = [
                    part.__name__ for part in getattr(annotation, "__args__", (annotation,)) if part is not type(None)
                ]
                raise ValueError(
                    f"--config: {key}: {_yaml_kind(value)}, and {key} takes a {objects[0]} object, which a recipe "
                    "cannot give; remove the line (set it in Python)."
                )
        elif isinstance(value, (list, tuple)) and "list" not in forms:
            raise ValueError(
                f"--config: {key}: a list ([{', '.join(map(str, value))}]), and {key} takes one value; give one (e.g. {key}: "
                f"{value[0] if value else '...'})."
            )
        elif isinstance(value, Mapping) and "mapping" not in forms:
            raise ValueError(f"--config: {key}: a mapping, and {key} takes one value, not key: value pairs.")
        elif value is None and "null" not in forms and "Literal" not in declared:
            raise ValueError(
                f"--config: {key}: null (unset), and {key} must have a value ({declared}); remove the line to keep the "
                "default."
            )
        elif isinstance(value, (datetime.date, datetime.datetime)):
            if "text" not in forms:
                raise ValueError(
                    f"--config: {key}: a YAML date ({value}), not a value of {key}; quote it if it is text."
                )
            value = value.isoformat()
        elif isinstance(value, bool) and "bool" not in forms:
            if "text" in forms:
                raise ValueError(
                    f"--config: {key}: {str(value).lower()} (a YAML boolean: unquoted yes / no / on / off read as "
                    f"one), and {key} is text; quote it."
                )
            raise ValueError(f"--config: {key}: {str(value).lower()} (a YAML boolean), and {key} takes {declared}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and "number" not in forms:
            if "text" not in forms:
                raise ValueError(f"--config: {key}: {value}, and {key} takes {declared}.")
            value = str(value)
        checked[key] = value
    return checked


# The type-derived rules for the command line's early check. Deriving them imports TRL and transformers (seconds), so
# the first full parse writes them to the cache, keyed by the versions that define the fields; later commands check
# a mistyped `--bf16 maybe` or `--past_index 1.5` in a fraction of a second. Without the file only `RANGES` is early.


@functools.cache
def _declarations_key() -> str | None:
    """The versions that define the fields, and a digest of the modules declaring vepo_trl's own (an editable install
    changes them without a version) and of the installed plug-ins' entry points: computed once a process."""
    import hashlib
    from importlib.metadata import PackageNotFoundError, version
    from pathlib import Path

    try:
        key = "-".join(version(name) for name in ("trl", "transformers", "vepo-trl"))
    except PackageNotFoundError:
        return None
    from .registry import plugin_entry_points

    here = Path(__file__).resolve().parent
    digest = hashlib.sha256(
        b"".join(
            (here / name).read_bytes()
            for name in ("validation.py", "config.py", "train.py", "scoring.py", "perturb/registry.py", "rewards.py")
        )
    )
    # The installed plug-ins add names (and their settings' reads): installing or removing one saves the tables anew
    digest.update(repr(plugin_entry_points()).encode())
    return key + "-" + digest.hexdigest()[:12]


def _type_rules_file():
    from .utils import cache_root

    key = _declarations_key()
    return None if key is None else cache_root() / f"field-rules-{key}.json"


def save_type_rules(rules: Mapping[str, Rule], declared: Callable[[], Mapping[str, object]] | None = None) -> None:
    """Write the rules `RANGES` does not hold (their kind, whether unset passes, the choices) for `early_rules`, and
    what else the early check reads (`early_declared`): every option's name, the defaults of the settings that decide
    whether another is read, the registries' reads and the reward names. `declared` is called only where the file is
    still to be written."""
    import json
    import os

    path = _type_rules_file()
    if path is None or path.is_file():
        return
    table = {
        name: {"kind": rule.kind, "valid": rule.valid, "optional": rule.optional, "choices": list(rule.choices())}
        if rule.choices is not None
        else {"kind": rule.kind, "valid": rule.valid, "optional": rule.optional}
        for name, rule in rules.items()
        # The registries' names too (strategies, perturbations, loss types): listing them imports torch
        if (name not in RANGES or rule.choices is not None) and rule.kind in ("bool", "whole", "number", "choice")
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        saved = {"rules": table, "declared": dict(declared() if declared is not None else {})}
        temporary.write_text(json.dumps(saved, sort_keys=True))
        temporary.replace(path)
    except (OSError, TypeError, ValueError):  # a read-only cache, a default JSON cannot hold: the early check is less
        pass


_SAVED: dict = {}  # the saved file as read, by path and modification time (every registry check reads it)


def _saved() -> dict:
    import json

    path = _type_rules_file()
    try:
        stamp = (path, path.stat().st_mtime_ns)
    except (AttributeError, OSError):  # no key, or not saved yet
        return {}
    if stamp not in _SAVED:
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):
            saved = {}
        _SAVED.clear()
        _SAVED[stamp] = saved if isinstance(saved, dict) else {}
    return _SAVED[stamp]


def early_declared() -> dict | None:
    """What a full parse saved for these versions (`save_type_rules`): "options" (every name train takes),
    "defaults" (of the settings that decide another's reading), "unread" (per "strategy|perturbation|annealing", the
    registry settings unread and why), "rewards" (the reward names). None before the first full parse."""
    return _saved().get("declared") or None


def early_rules() -> dict[str, Rule]:
    """`RANGES` plus the saved type-derived rules, where a full parse has saved them for these versions."""

    rules = dict(RANGES)
    saved = _saved().get("rules", {})
    for name, entry in saved.items():
        names = tuple(entry.get("choices") or ())
        if name in RANGES and names:  # a registry's names as saved: the early check needs no torch import
            rules[name] = dataclasses.replace(RANGES[name], choices=lambda n=names: n)
            continue
        rules.setdefault(
            name,
            Rule(
                entry["kind"],
                entry["valid"],
                optional=entry["optional"],
                choices=(lambda n=names: n) if names else None,
            ),
        )
    return rules
