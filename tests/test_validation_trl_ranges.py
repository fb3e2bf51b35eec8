"""No rule stricter than TRL where the value means something: across GRPOConfig's numeric fields, every value
GRPOConfig takes is taken by our rules too, except the ones listed here, each with why it cannot train (a learning
rate of 0 is a frozen run and must pass; a temperature of 0 divides the logits by zero and must not)."""

import dataclasses
import functools
import math
import warnings

import pytest
from trl import GRPOConfig

from vepo_trl.validation import RANGES, check_value


EDGES = (-1, 0, 1e-30, 0.5, 1, 2, 1000)

# Values GRPOConfig takes that no run can use; anything GRPOConfig takes and is not here must pass our rules
ZERO_IS_NONSENSE = {
    "per_device_train_batch_size": "no completions per step", "per_device_eval_batch_size": "no rows per step",
    "gradient_accumulation_steps": "no micro-batch per step", "num_generations_eval": "no completion per prompt",
    "max_completion_length": "no token to train on", "steps_per_generation": "no step per generation",
    "generation_batch_size": "no completion generated", "num_iterations": "no optimisation pass",
    "num_train_epochs": "no step", "eval_accumulation_steps": "never hands predictions over",
    "adam_epsilon": "Adam divides by sqrt(v) + 0, v is 0 for frozen entries: NaN",
    "ddp_bucket_cap_mb": "a bucket of 0 MB", "ddp_timeout": "every collective times out at once",
    "temperature": "logits / 0", "top_p": "keeps no token", "repetition_penalty": "logits / 0",
    "delta": "clips every ratio to 0", "sapo_temperature_neg": "divides by 0", "sapo_temperature_pos": "divides by 0",
    "ref_model_sync_steps": "syncs every 0 steps (modulo by zero)", "off_policy_mask_threshold": "masks every token",
    "vllm_server_port": "not a port", "vllm_group_port": "not a port", "vllm_server_timeout": "gives up at once",
    "vllm_gpu_memory_utilization": "no memory for the engine", "vllm_max_model_length": "no token fits",
    "vllm_tensor_parallel_size": "no GPU", "vllm_importance_sampling_clip_max": "weights every token 0",
    "vllm_importance_sampling_cap": "weights every token 0",
}  # fmt: skip
# Above the top of a probability, a quantile or a decay rate
ABOVE_ONE_IS_NONSENSE = {"adam_beta1", "adam_beta2", "label_smoothing_factor", "top_p", "min_p",
                         "top_entropy_quantile", "ref_model_mixup_alpha", "vllm_gpu_memory_utilization"}  # fmt: skip


def refused_on_purpose(name: str, value, rule) -> bool:
    if value < 0 and not (name in ("max_steps", "local_rank") and value == -1):
        return True  # a negative count, rate, length or coefficient
    if rule.kind == "whole" and not float(value).is_integer():
        return True  # a fraction of a count
    if value == 0 and name in ZERO_IS_NONSENSE:
        return True
    return value >= 1 and name in ABOVE_ONE_IS_NONSENSE


@functools.cache
def grpo_takes(name, value) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            GRPOConfig(output_dir="unused", report_to="none", bf16=False, use_cpu=True, **{name: value})
    except Exception:
        return False
    return True


NUMERIC = [
    name
    for name in sorted({f.name for f in dataclasses.fields(GRPOConfig)})
    if name in RANGES and RANGES[name].kind in ("whole", "number")
]


@pytest.mark.parametrize("name", NUMERIC)
def test_every_value_grpo_config_trains_with_is_ours_too(name):
    rule = RANGES[name]
    too_strict = []
    for value in EDGES:
        if not grpo_takes(name, value) or refused_on_purpose(name, value, rule):
            continue
        try:
            check_value(name, value, rule)
        except ValueError as error:
            too_strict.append(f"{value}: {error}")
    assert not too_strict, too_strict


# What makes a setting's value matter to GRPOConfig (without it, any value is refused for another reason)
CONTEXT = {"dataloader_prefetch_factor": {"dataloader_num_workers": 2}}


def grpo_refuses(name, value) -> bool:
    """GRPOConfig refuses `value` as it is built, with its own error (a ValueError; a ZeroDivisionError is a crash)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            GRPOConfig(output_dir="unused", report_to="none", bf16=False, use_cpu=True, **CONTEXT.get(name, {}),
                       **{name: value})  # fmt: skip
    except ValueError:
        return True
    except Exception:  # noqa: BLE001 - upstream fails on it without saying why: our row is the refusal
        return False
    return False


def test_no_row_restates_a_rule_grpo_config_enforces_itself():
    """A row whose every refusal GRPOConfig makes too, as it is built, restates it: such rules are upstream's (their
    errors are the one line: torch_empty_cache_steps, the strategies' names from their enums). Every numeric row
    refuses some value GRPOConfig takes (one that trains wrong, or fails after the model loaded)."""
    restated = []
    for name in NUMERIC:
        ours = []
        for value in (*EDGES, 1.5, math.nan, math.inf):
            try:
                check_value(name, value, RANGES[name])
            except ValueError:
                ours.append(value)
        if ours and all(grpo_refuses(name, value) for value in ours):
            restated.append(name)
    assert not restated, restated


def test_the_comparison_covers_the_fields_and_its_exceptions_are_real():
    assert len(NUMERIC) > 60
    # Each listed exception is one GRPOConfig takes and we refuse (a stale entry would hide nothing)
    for name in ZERO_IS_NONSENSE:
        assert grpo_takes(name, 0), name
        with pytest.raises(ValueError):
            check_value(name, 0, RANGES[name])


@pytest.mark.parametrize(("name", "value"), [("learning_rate", 0.0), ("max_steps", 0), ("epsilon", 0.0),
                                             ("num_completions_to_print", 0), ("neftune_noise_alpha", 0.0)])  # fmt: skip
def test_values_that_mean_something_pass_the_config(name, value):
    from vepo_trl import VEPOConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        read = {"log_completions": True} if name == "num_completions_to_print" else {}  # what makes it read
        config = VEPOConfig(output_dir="unused", report_to="none", bf16=False, use_cpu=True, **read, **{name: value})
    assert getattr(config, name) == value
