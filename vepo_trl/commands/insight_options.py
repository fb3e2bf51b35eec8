"""The options `inspect` and `analyze` share (model, VEPO's settings, responses), declared once as dataclasses the
two commands' declarations extend."""

from __future__ import annotations

from dataclasses import dataclass

from ..options import option
from ..validation import (
    DEVICE,
    FLAG,
    MAPPING,
    MODEL,
    RANGES,
    RUNS_MODEL,
    SAMPLES,
    SEED,
    Reads,
    at_least,
    names,
    optional,
    path_rule,
    registry_reads,
    whole,
)


DTYPES = ("auto", "float32", "bfloat16", "float16")
# How inspect and analyze name the strategy, the perturbation and the recipe (`validation.registry_reads`)
INSIGHT = ("strategy", "perturbation", "config")
SETTINGS = "selection settings (default: the paper's, or the training recipe given with --config)"


# inspect's responses are sampled unless given (--response)
SAMPLED = Reads(("response",), lambda given: not given, "sampled responses (no --response: those are given)",
                (["The answer is 4."],), (None,))  # fmt: skip


@dataclass
class ModelOptions:
    model: str | None = option(None, "Model folder or Hub id of a supported family (README), or tiny-qwen2.5-vl / "
                               "tiny-<family>.", reads=RUNS_MODEL, rule=MODEL, group="model")  # fmt: skip
    device: str | None = option(
        None, "cuda, cpu, ... (default: cuda when available).", reads=RUNS_MODEL, rule=DEVICE, group="model"
    )
    dtype: str = option("auto", "", reads=RUNS_MODEL, rule=names(*DTYPES), group="model", choices=DTYPES)


@dataclass
class SettingsOptions:
    config: str | None = option(None, "A training recipe (YAML): its selection and perturbation keys are used.",
                                reads=RUNS_MODEL, rule=path_rule("in_file", "a recipe file (YAML) that exists"), group=SETTINGS)  # fmt: skip
    strategy: str | None = option(None, "Selection strategy (vepo-trl strategies lists them). Default vepo.",
                                  reads=RUNS_MODEL, rule=optional(RANGES["selection_strategy"]), group=SETTINGS)  # fmt: skip
    strategy_params: str | None = option(None, "The strategy's own settings (a plug-in's) as JSON, e.g. "
                                         "'{\"sharpness\": 1.0}'.", reads=RUNS_MODEL, rule=MAPPING, group=SETTINGS)  # fmt: skip
    perturbation_params: str | None = option(None, "The perturbation's own settings (a plug-in's) as JSON.",
                                             reads=RUNS_MODEL, rule=MAPPING, group=SETTINGS)  # fmt: skip
    alpha: float | None = option(None, "alpha: JSD against |dH| in the joint signal. Default 0.7.",
                                 reads=registry_reads("selection_alpha", INSIGHT, ("vepo", None, None)), rule=optional(RANGES["selection_alpha"]), group=SETTINGS)  # fmt: skip
    perturbation: str | None = option(None, "diffusion, gaussian, mean_image, black_image, patch_blackout.",
                                      reads=registry_reads("perturbation", INSIGHT, ("vepo", None, None)), rule=optional(RANGES["perturbation"]), group=SETTINGS)  # fmt: skip
    noise_step: int | None = option(None, "Diffusion step tau in [0, 999]. Default 500.",
                                    reads=registry_reads("noise_step", INSIGHT, ("vepo", "diffusion", None)), rule=optional(RANGES["noise_step"]), group=SETTINGS)  # fmt: skip
    noise_sigma: float | None = option(None, "Std of the gaussian perturbation. Default 2.0.",
                                       reads=registry_reads("noise_sigma", INSIGHT, ("vepo", "gaussian", None)), rule=optional(RANGES["noise_sigma"]), group=SETTINGS)  # fmt: skip
    patch_probability: float | None = option(None, "patch_blackout's drop probability. Default 0.5.",
                                             reads=registry_reads("patch_probability", INSIGHT, ("vepo", "patch_blackout", None)), rule=optional(RANGES["patch_probability"]), group=SETTINGS)  # fmt: skip
    perturbation_seed: int | None = option(None, "Seed of the perturbation noise. Default 42.",
                                           reads=registry_reads("perturbation_seed", INSIGHT, ("vepo", None, None)), rule=RANGES["perturbation_seed"], group=SETTINGS)  # fmt: skip
    step: int = option(0, "Training step the noise seed uses. Default 0.", group=SETTINGS,
                       reads=RUNS_MODEL, rule=whole(at_least(0), "a whole training step >= 0"))  # fmt: skip
    temperature: float | None = option(None, "Sampling and scoring temperature. Default 1.0.",
                                       reads=RUNS_MODEL, rule=optional(RANGES["temperature"]), group=SETTINGS)  # fmt: skip


@dataclass
class ResponseOptions:
    num_generations: int = option(4, "Completions sampled per prompt.", group="responses",
                                  reads=SAMPLES, rule=whole(at_least(1), "a whole number >= 1"))  # fmt: skip
    max_new_tokens: int = option(
        256, "", reads=RUNS_MODEL, rule=whole(at_least(1), "a whole number of tokens >= 1"), group="responses"
    )
    greedy: bool = option(False, "Decode greedily (one completion) instead of sampling.", reads=SAMPLED, rule=FLAG,
                          group="responses")  # fmt: skip
    sample_seed: int = option(0, "Seed of the sampling.", reads=SAMPLES, rule=SEED, group="responses")
    batch_size: int = option(8, "Completions per forward pass.", reads=RUNS_MODEL, rule=whole(at_least(1), "a whole number >= 1"),
                             group="responses")  # fmt: skip
    min_pixels: int | None = option(None, "Resize bound of images (default: the paper's).", reads=RUNS_MODEL, rule=RANGES["min_pixels"],
                                    group="responses")  # fmt: skip
    max_pixels: int | None = option(None, "Resize bound of images (default: the paper's).", reads=RUNS_MODEL, rule=RANGES["max_pixels"],
                                    group="responses")  # fmt: skip
