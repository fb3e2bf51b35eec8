"""`VEPOConfig`: GRPO's configuration plus VEPO's token selection and image perturbation."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from trl import GRPOConfig

from .perturb import PERTURBATIONS
from .registry import doc_summary
from .scoring import SELECTION_STRATEGIES
from .trl_compat import quiet_deprecated_alias
from .validation import check_object, check_rule_params, rules_for


def _checkpointing_renamed() -> bool:
    """TRL declares its default (on) under transformers' deprecated name `gradient_checkpointing`, which makes every
    config warn (`FutureWarning`) about a setting the user never gave. True while that holds; once TRL moves to
    `activation_checkpointing` (or transformers drops the alias) VEPOConfig leaves both fields as TRL declares them."""
    defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    return "activation_checkpointing" in defaults and defaults.get("gradient_checkpointing") is True


_CHECKPOINTING_RENAMED = _checkpointing_renamed()
# The names the help and the docstring list: the package's own registrations, in order (plug-ins: vepo-trl strategies)
_BUILTIN_STRATEGIES = SELECTION_STRATEGIES.registered_by("vepo_trl")
_BUILTIN_PERTURBATIONS = PERTURBATIONS.registered_by("vepo_trl")
quiet_deprecated_alias()  # TRL and PEFT read transformers' deprecated alias on every run (trl_compat)


@dataclass
class VEPOConfig(GRPOConfig):
    r"""
    Configuration class for the [`VEPOTrainer`].

    Only VEPO's own fields are listed here; every [`~trl.GRPOConfig`] and [`~transformers.TrainingArguments`] field
    applies too. Each field is also a command-line flag and a YAML key through [`~trl.TrlParser`].

    One inherited default differs: `bf16` left unset follows the hardware (on where a CUDA device supports bf16, off
    on a CPU-only machine), instead of GRPOConfig's unconditional `True`, which fails on a CPU. Set it to force
    either way.

    Parameters:
        > Token selection

        selection_strategy (`str`, *optional*, defaults to `"vepo"`):
            Which tokens of each response the policy loss trains on, one of these or an installed plug-in's
            (`vepo-trl strategies` lists them all):
            {strategies}.
        strategy_params (`dict` or `str`, *optional*):
            The selection strategy's own settings, by name (its keyword-only parameters beyond `ratio`, `alpha` and
            `seeds`: a plug-in's, see `vepo-trl strategies`), as a mapping or its JSON text. Checked against the
            strategy's signature: a name it does not take is refused, and so is a setting it needs left out.
        selection_ratio (`float`, *optional*, defaults to `0.2`):
            `k`: each response keeps its top `ceil(k * T)` of `T` valid tokens (for `"random"`, the keep probability).
        selection_alpha (`float`, *optional*, defaults to `0.7`):
            `alpha`: weight of JSD against the entropy gap in the joint visual signal.
        selection_mode (`str`, *optional*, defaults to `"mask"`):
            `"mask"` (the paper's L_VEPO): the policy-gradient term trains on the selected tokens only, normalised by
            their count. `"weight"` (an option of the authors' release): every valid token trains, the selected ones
            weighted `1 + selection_weight`.
        selection_weight (`float`, *optional*, defaults to `1.0`):
            `lambda` of `selection_mode="weight"`.
        entropy_scope (`str`, *optional*, defaults to `"all"`):
            Tokens the entropy bonus (`entropy_coef`) averages over: `"all"` valid tokens (the release) or the
            `"selected"` ones (what TRL's `top_entropy_quantile` does).
        eval_selection (`bool`, *optional*, defaults to `False`):
            Select tokens for the evaluation loss too (one perturbed forward per evaluated completion). Off: the
            evaluation loss is GRPO's over all valid tokens and no perturbed pass runs.
        score_zero_advantage_rows (`bool`, *optional*, defaults to `False`):
            Run the perturbed pass for responses whose advantage is exactly zero even when their selection cannot
            change the loss (for complete selection diagnostics). Off, they are skipped where that is safe.
        log_selection_diagnostics (`bool`, *optional*, defaults to `True`):
            Log the share of top-k JSD tokens that top-k entropy would miss and that the selection misses.
        selection_samples_steps (`int`, *optional*, defaults to `0`):
            Every this many steps, write a few of the current rollout's completions with their per-token signals and
            selection to `output_dir/selection_samples.jsonl`; `vepo-trl inspect --records` renders them as a page.
            `0`: never.
        selection_samples_count (`int`, *optional*, defaults to `4`):
            Completions written each time (from the main process's share of the rollout).

        > Perturbed image

        perturbation (`str`, *optional*, defaults to `"diffusion"`):
            How the counterfactual image is made, one of these or an installed plug-in's:
            {perturbations}.
        perturbation_params (`dict` or `str`, *optional*):
            The perturbation's own settings (its keyword-only parameters beyond `noise_step`, `sigma`,
            `patch_probability` and `num_generations`), checked against its signature as `strategy_params` are.
        noise_step (`int`, *optional*, defaults to `500`):
            Diffusion step `tau` in [0, 999] of the `"diffusion"` perturbation.
        noise_annealing (`bool`, *optional*, defaults to `False`):
            Decay the noise step over training with a sigmoid (NoisyRollout's schedule).
        noise_annealing_coefficient (`float`, *optional*, defaults to `30.0`):
            Steepness of the sigmoid decay.
        noise_annealing_midpoint (`int`, *optional*, defaults to `40`):
            Training step at which the noise step has halved.
        noise_sigma (`float`, *optional*, defaults to `2.0`):
            Standard deviation of the `"gaussian"` perturbation (per rollout for `"gaussian_release"`), in normalised
            pixel units.
        patch_probability (`float`, *optional*, defaults to `0.5`):
            Probability that `"patch_blackout"` blacks out each 14x14 patch.
        perturbation_seed (`int`, *optional*):
            Seed of the perturbation noise and of the `"random"` strategy. Defaults to `seed`.

        > Scoring

        scoring_tile_size (`int`, *optional*):
            Tokens whose full-vocabulary distributions are built at a time when computing the signals. Peak extra
            memory is about `5 * tile * V * 4` bytes (194 MB for Qwen's vocabulary at 64). Unset: 64 on the CPU; on a
            GPU the largest power of two in [64, 1024] whose tile takes at most a tenth of the free memory.
        rollout_cache_gb (`float`, *optional*, defaults to `8.0`):
            Host memory, in GB per process, for the clean hidden states kept on the CPU between TRL's rollout-time
            forward and the advantages (`valid completion tokens x hidden size x 2` bytes in bf16: 3.3 GB per process
            at the 7B recipe with 600-token responses, 11 GB at 2,048). Over it (judged from the largest process), every
            process scores each chunk right after its forward instead: memory stays flat, but zero-advantage
            responses no longer skip their perturbed forward. `0` always scores chunk by chunk.
    """

    # transformers parses these from JSON text as it does its own dict fields
    _VALID_DICT_FIELDS = [*GRPOConfig._VALID_DICT_FIELDS, "strategy_params", "perturbation_params"]

    if _CHECKPOINTING_RENAMED:
        # TRL's default (on), kept under the new name; the deprecated one still works (and warns) when a user gives it
        gradient_checkpointing: bool | None = field(
            default=None, metadata={"help": "Deprecated alias of `activation_checkpointing` (transformers)."}
        )

    selection_strategy: str = field(
        default="vepo",
        metadata={"help": f"Tokens the policy loss trains on: {', '.join(_BUILTIN_STRATEGIES)}, or a plug-in's."},
    )
    strategy_params: dict[str, Any] | str | None = field(
        default=None,
        metadata={
            "help": "The selection strategy's own settings (a plug-in's keyword parameters, see vepo-trl strategies) "
            "as JSON, e.g. '{\"threshold\": 0.3}'; checked against its signature."
        },
    )
    selection_ratio: float = field(
        default=0.2,
        metadata={"help": "k: fraction of each response's valid tokens kept, ceil(k * T) (random: keep probability)."},
    )
    selection_alpha: float = field(
        default=0.7,
        metadata={"help": "alpha: weight of JSD against the entropy gap in the joint visual signal, in [0, 1]."},
    )
    selection_mode: str = field(
        default="mask",
        metadata={
            "help": "mask: the policy gradient trains on the selected tokens only (the paper's L_VEPO); weight: all "
            "valid tokens train, selected ones weighted 1 + selection_weight (an option of the authors' release).",
        },
    )
    selection_weight: float = field(
        default=1.0,
        metadata={"help": "lambda of selection_mode=weight: selected tokens get weight 1 + lambda."},
    )
    entropy_scope: str = field(
        default="all",
        metadata={"help": "Tokens the entropy bonus (entropy_coef) averages over: all valid tokens, or selected."},
    )
    eval_selection: bool = field(
        default=False,
        metadata={"help": "Select tokens (with a perturbed forward) for the evaluation loss too; off: GRPO's loss."},
    )
    score_zero_advantage_rows: bool = field(
        default=False,
        metadata={
            "help": "Run the perturbed pass for zero-advantage responses even when their selection cannot change "
            "the loss (complete diagnostics, more compute)."
        },
    )
    log_selection_diagnostics: bool = field(
        default=True,
        metadata={"help": "Log the share of top-k JSD tokens that top-k entropy and the selection miss."},
    )
    selection_samples_steps: int = field(
        default=0,
        metadata={
            "help": "Every this many steps, write a few completions with their signals and selection to "
            "output_dir/selection_samples.jsonl (render: vepo-trl inspect --records FILE; during the run they collect in "
            "selection_samples.jsonl.partial, which replaces it at the end). 0: never."
        },
    )
    selection_samples_count: int = field(
        default=4,
        metadata={"help": "Completions written each time selection samples are written."},
    )
    perturbation: str = field(
        default="diffusion",
        metadata={"help": f"Counterfactual image: {', '.join(_BUILTIN_PERTURBATIONS)}, or a plug-in's."},
    )
    perturbation_params: dict[str, Any] | str | None = field(
        default=None,
        metadata={
            "help": "The perturbation's own settings (a plug-in's keyword parameters) as JSON, e.g. "
            "'{\"strength\": 0.5}'; checked against its signature."
        },
    )
    noise_step: int = field(
        default=500,
        metadata={"help": "Diffusion noise step tau in [0, 999] of the diffusion perturbation."},
    )
    noise_annealing: bool = field(
        default=False,
        metadata={"help": "Decay the noise step over training with a sigmoid (NoisyRollout's schedule)."},
    )
    noise_annealing_coefficient: float = field(
        default=30.0,
        metadata={"help": "Steepness of the sigmoid decay of the noise step."},
    )
    noise_annealing_midpoint: int = field(
        default=40,
        metadata={"help": "Training step at which the annealed noise step has halved."},
    )
    noise_sigma: float = field(
        default=2.0,
        metadata={"help": "Standard deviation of the gaussian perturbation, in normalised pixel units."},
    )
    patch_probability: float = field(
        default=0.5,
        metadata={"help": "Probability that patch_blackout blacks out each 14x14 patch."},
    )
    perturbation_seed: int | None = field(
        default=None,
        metadata={"help": "Seed of the perturbation noise and of the random strategy. Defaults to `seed`."},
    )
    scoring_tile_size: int | None = field(
        default=None,
        metadata={
            "help": "Tokens per tile when computing the signals; peak extra memory ~ 5 * tile * V * 4 bytes. Unset: "
            "64 on the CPU, from free memory on a GPU."
        },
    )

    rollout_cache_gb: float = field(
        default=8.0,
        metadata={
            "help": "GB per process of clean hidden states kept on the CPU from TRL's rollout-time forward until the "
            "advantages exist; over it, each chunk is scored at once (flat memory, no zero-advantage skip)."
        },
    )

    def __post_init__(self):
        # Every value against its rule and the cross-field rules (`validation.RANGES`, `validation.COMBINATIONS`),
        # before TRL's own checks, some of which divide by these.
        # YAML and Python callers bypass argparse's conversion: `noise_step: 500.0` is stored as 500, 500.7 refused
        check_object(self, rules_for(VEPOConfig))
        given = [
            name for name in given_fields(self) if name != "perturbation_seed" or self.perturbation_seed != self.seed
        ]
        # What the caller set, before TrainingArguments fills in its own (do_eval from eval_strategy, ...): what
        # `preflight.check_arguments` holds a Python caller's run to
        self._given = frozenset(given)
        if _CHECKPOINTING_RENAMED and self.activation_checkpointing is None and self.gradient_checkpointing is None:
            self.activation_checkpointing = True  # TRL's default, without transformers' warning about the old name
        if "dataloader_pin_memory" not in given and not _has_accelerator():
            self.dataloader_pin_memory = False  # pinned memory needs a GPU: torch warns on every data loader without
        if self.bf16 is None:
            # GRPOConfig would turn an unset bf16 into True, which TrainingArguments then rejects on a CPU
            self.bf16 = not self.fp16 and not self.use_cpu and _hardware_supports_bf16()
        super().__post_init__()
        from .sharding import fsdp_facts
        from .validation import READS_CHECKED_BY_COMMAND, check_combinations, check_read

        if facts := fsdp_facts(self):  # the rules on how the built run shards (`validation.FACTS`)
            check_combinations({**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}, **facts})

        if not READS_CHECKED_BY_COMMAND.get():  # the CLI checks them with what was typed and what a recipe gave
            check_read(settings_reads(), {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}, given)
        check_rule_params(self)  # a strategy's and a perturbation's own settings against their signatures
        if self.perturbation_seed is None:
            self.perturbation_seed = self.seed


def _listed(entries: dict) -> str:
    """`"name"` (its line), ... for the docstring, wrapped at its indentation."""
    import textwrap

    def line(value) -> str:
        return (getattr(value, "description", None) or doc_summary(value)).rstrip(".")

    text = ", ".join(f'`"{name}"` ({line(value)})' for name, value in entries.items())
    return textwrap.fill(text, width=106, subsequent_indent=" " * 12, break_long_words=False, break_on_hyphens=False)


# The registries' own names and lines, in the docstring as in `--help`: a new strategy or perturbation is one function
VEPOConfig.__doc__ = VEPOConfig.__doc__.replace("{strategies}", _listed(_BUILTIN_STRATEGIES)).replace(
    "{perturbations}", _listed(_BUILTIN_PERTURBATIONS)
)

# When a run reads each setting lives with the other rules (`validation`); the model card imports it from here
from .validation import PERTURBATION_SETTINGS, STRATEGY_SETTINGS, settings_reads, unread_settings  # noqa: E402,F401


def given_fields(config) -> list[str]:
    """The fields of a dataclass instance set to other than their defaults (what a Python caller gave)."""
    given = []
    for f in dataclasses.fields(config):
        if not f.init:
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if default is not dataclasses.MISSING and getattr(config, f.name) != default:
            given.append(f.name)
    return given


def _has_accelerator() -> bool:
    import torch

    return torch.cuda.is_available() or bool(getattr(torch, "xpu", None) and torch.xpu.is_available())


def _hardware_supports_bf16() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
