"""VEPO's signals for given completions of one prompt, from a model and its processor, outside training.

The same computation as `VEPOTrainer`: one teacher-forced forward with the clean image and one with the image
perturbed by `perturb.perturb_pixel_values` (the processor's pixel layout, the same seed rule), the final hidden states
of the completion positions captured from the backbone, then `scoring.token_signals` (tiled, from hidden states and the
LM-head weight) and `scoring.select_tokens`. Only the strategy, `k`, `alpha` and perturbation settings come from the
caller (`SignalSettings`), as they come from `VEPOConfig` in a run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

import torch

from ..families import banned_token_ids, family_of, pixel_layout
from ..perturb import PERTURBATIONS, perturb_pixel_values
from ..scoring import (
    SELECTION_STRATEGIES,
    TokenSignals,
    get_strategy,
    row_seeds,
    scatter_to_rows,
    select_tokens,
    token_signals,
)
from ..trl_compat.forward import causal_completion


__all__ = [
    "ExampleSignals",
    "SignalSettings",
    "build_messages",
    "completion_signals",
    "encode_prompt",
    "encode_responses",
    "sample_completions",
]

# Every per-token signal a page or the analysis shows, whatever the strategy needs
_ALL_SIGNALS = ("entropy", "perturbed_entropy", "jsd", "logp", "perturbed_logp")
# `VEPOConfig` keys a recipe may carry, and the `SignalSettings` field each one sets
RECIPE_KEYS = {
    "selection_strategy": "strategy",
    "selection_ratio": "ratio",
    "selection_alpha": "alpha",
    "perturbation": "perturbation",
    "noise_step": "noise_step",
    "noise_sigma": "noise_sigma",
    "patch_probability": "patch_probability",
    "perturbation_seed": "seed",
    "temperature": "temperature",
    "scoring_tile_size": "tile_size",
    "num_generations": "num_generations",
    "strategy_params": "strategy_params",
    "perturbation_params": "perturbation_params",
}


@dataclass(frozen=True)
class SignalSettings:
    """A run's selection and perturbation settings (the `VEPOConfig` fields of the same meaning).

    `step` is the training step the perturbation seed uses; `seed` is `perturbation_seed` (a recipe without one uses
    its `seed`, as `VEPOConfig` does).
    """

    strategy: str = "vepo"
    ratio: float = 0.2
    alpha: float = 0.7
    perturbation: str = "diffusion"
    noise_step: int = 500
    noise_sigma: float = 2.0
    patch_probability: float = 0.5
    seed: int = 42
    step: int = 0
    temperature: float = 1.0
    tile_size: int = 64
    # Rollouts per prompt: `gaussian_release` scales its noise by it, as in a run (the paper's 12)
    num_generations: int = 12
    # The strategy's and the perturbation's own settings (a plug-in's), as `VEPOConfig` takes them
    strategy_params: dict[str, Any] | None = None
    perturbation_params: dict[str, Any] | None = None

    def __post_init__(self):
        if self.strategy not in SELECTION_STRATEGIES:
            raise ValueError(
                f"unknown selection strategy {self.strategy!r}; choose one of: {', '.join(sorted(SELECTION_STRATEGIES))}"
            )
        if not 0.0 < self.ratio <= 1.0:
            raise ValueError(f"k (selection ratio) must be in (0, 1], got {self.ratio}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")
        if self.perturbation not in PERTURBATIONS:
            raise ValueError(
                f"unknown perturbation {self.perturbation!r}; choose one of: {', '.join(sorted(PERTURBATIONS))}"
            )
        if not 0 <= self.noise_step <= 999:
            raise ValueError(f"noise step must be in [0, 999], got {self.noise_step}")
        if self.noise_sigma < 0:
            raise ValueError(f"noise sigma must be non-negative, got {self.noise_sigma}")
        if not 0.0 <= self.patch_probability <= 1.0:
            raise ValueError(f"patch probability must be in [0, 1], got {self.patch_probability}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")
        if self.tile_size < 1:
            raise ValueError(f"tile size must be a positive number of tokens, got {self.tile_size}")
        from types import SimpleNamespace

        from ..validation import check_rule_params

        for name in ("strategy_params", "perturbation_params"):
            if isinstance(getattr(self, name), str):  # JSON text, as the command line and TrainingArguments take it
                object.__setattr__(self, name, json.loads(getattr(self, name)))
        check_rule_params(
            SimpleNamespace(selection_strategy=self.strategy, perturbation=self.perturbation,
                            strategy_params=self.strategy_params, perturbation_params=self.perturbation_params)
        )  # fmt: skip

    @classmethod
    def from_recipe(cls, recipe: Mapping[str, Any], **overrides) -> SignalSettings:
        """Settings from a training recipe's keys (`selection_strategy`, `selection_ratio`, ...), then `overrides`
        (`None` values are ignored)."""
        values = {field: recipe[key] for key, field in RECIPE_KEYS.items() if recipe.get(key) is not None}
        if "seed" not in values and recipe.get("seed") is not None:
            values["seed"] = recipe["seed"]
        given = {key: value for key, value in overrides.items() if value is not None}
        # The recipe's own settings of its strategy or perturbation go with it: another one named here drops them
        for choice, params in (("strategy", "strategy_params"), ("perturbation", "perturbation_params")):
            if choice in given and given[choice] != values.get(choice, getattr(cls, choice)) and params not in given:
                values.pop(params, None)
        values.update(given)
        strategy = SELECTION_STRATEGIES.get(values.get("strategy", cls.strategy))
        if strategy is not None and not strategy.needs_perturbed_pass and "perturbation_params" not in given:
            values.pop("perturbation_params", None)  # the recipe's, for a perturbation this strategy never runs
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in values.items() if key in known})

    def describe(self) -> dict[str, Any]:
        """The settings a page shows: what decides the selection and the perturbed image."""
        out = {"strategy": self.strategy, "k": self.ratio, "alpha": self.alpha, "perturbation": self.perturbation}
        if self.perturbation == "diffusion":
            out["noise_step"] = self.noise_step
        elif self.perturbation == "gaussian":
            out["noise_sigma"] = self.noise_sigma
        elif self.perturbation == "patch_blackout":
            out["patch_probability"] = self.patch_probability
        out.update({f"strategy {k}": v for k, v in sorted((self.strategy_params or {}).items())})
        out.update({f"perturbation {k}": v for k, v in sorted((self.perturbation_params or {}).items())})
        out["temperature"] = self.temperature
        return out


@dataclass
class ExampleSignals:
    """Completions of one prompt with their signals: `completion_ids`, `mask`, `selected` `(B, T)`, `signals` with
    `(B, T)` fields."""

    completion_ids: torch.Tensor
    mask: torch.Tensor
    signals: TokenSignals
    selected: torch.Tensor


# ---------------------------------------------------------------------------------------------------------------------
# Prompt and completions
# ---------------------------------------------------------------------------------------------------------------------


def build_messages(question: str, num_images: int = 1, system_prompt: str | None = None) -> list[dict]:
    """A conversational prompt as the data loaders build it: the system prompt (the paper's by default) and the
    question with image parts where its `<image>` placeholders stand (first, without placeholders)."""
    from ..data.loaders import SYSTEM_PROMPT, build_user_content

    return [
        {
            "role": "system",
            "content": [{"type": "text", "text": SYSTEM_PROMPT if system_prompt is None else system_prompt}],
        },
        {"role": "user", "content": build_user_content(question, num_images)},
    ]


def encode_prompt(
    processor, messages: Sequence[Mapping], images: Sequence[Any], device=None
) -> dict[str, torch.Tensor]:
    """One prompt with its images (batch of 1), as the model's processor encodes it: `input_ids`, `attention_mask`,
    `pixel_values` and the family's own image inputs (`image_grid_thw`, `image_sizes`, `pixel_attention_mask`,
    `token_type_ids`, ...)."""
    from trl.data_utils import prepare_multimodal_messages

    if getattr(processor, "image_processor", None) is None:
        raise ValueError(f"VEPO's signals perturb the model's images, but {type(processor).__name__} has none.")
    if not images:
        raise ValueError("VEPO's signals compare a clean and a perturbed image; this prompt has no image.")
    messages = prepare_multimodal_messages([dict(m) for m in messages], images=list(images))
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], images=list(images), return_tensors="pt")
    # A prefix LM's prompt-only `labels` are no model input here
    return {
        key: value.to(device) if device is not None else value
        for key, value in inputs.items()
        if isinstance(value, torch.Tensor) and key != "labels"
    }


def _eos_ids(model, processor) -> set[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    tokenizer = getattr(processor, "tokenizer", processor)
    if tokenizer.eos_token_id is not None:
        eos.append(tokenizer.eos_token_id)
    return set(eos)


def _trim(ids: list[int], eos: set[int], pad: int | None) -> list[int]:
    # A completion runs up to and including its first end-of-sequence token, as TRL's completion mask does
    for i, token in enumerate(ids):
        if token in eos:
            return ids[: i + 1]
    while ids and pad is not None and ids[-1] == pad:
        ids = ids[:-1]
    return ids


@torch.no_grad()
def sample_completions(
    model,
    processor,
    prompt: Mapping[str, torch.Tensor],
    num: int,
    *,
    max_new_tokens: int = 256,
    temperature: float = 1.0,
    greedy: bool = False,
    seed: int = 0,
) -> list[list[int]]:
    """`num` completions of one encoded prompt (`encode_prompt`), sampled at `temperature` like a rollout (or greedy),
    each cut after its first end-of-sequence token."""
    with torch.random.fork_rng(devices=[prompt["input_ids"].device] if prompt["input_ids"].is_cuda else []):
        torch.manual_seed(seed)
        output = model.generate(
            **prompt,
            max_new_tokens=max_new_tokens,
            do_sample=not greedy,
            temperature=temperature if not greedy else None,
            # The full distribution, as GRPO samples (top_p 1, no top-k): Qwen's own generation config narrows it
            top_p=1.0,
            top_k=0,
            num_return_sequences=num,
            suppress_tokens=banned_token_ids(model.config, processor) or None,
        )
    tokenizer = getattr(processor, "tokenizer", processor)
    eos = _eos_ids(model, processor)
    completions = output[:, prompt["input_ids"].shape[1] :].tolist()
    return [_trim(ids, eos, tokenizer.pad_token_id) for ids in completions]


def encode_responses(processor, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of given response texts (no special tokens added), as the model would have produced them."""
    tokenizer = getattr(processor, "tokenizer", processor)
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


# ---------------------------------------------------------------------------------------------------------------------
# Signals
# ---------------------------------------------------------------------------------------------------------------------


@contextmanager
def _capture_final_hidden(model):
    # The backbone's last hidden state (after the final norm), which the LM head reads: as VEPOTrainer captures it
    captured: list[torch.Tensor] = []

    def hook(module, args, output):
        hidden = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]
        captured.append(hidden.detach())

    handle = model.base_model.register_forward_hook(hook)
    try:
        yield captured
    finally:
        handle.remove()


def _completion_hidden(model, inputs: dict[str, torch.Tensor], length: int) -> torch.Tensor:
    with _capture_final_hidden(model) as captured:
        model(**inputs, logits_to_keep=1, use_cache=False)
    # Position i predicts token i + 1: completion token j comes from the position before it
    return captured[-1][:, -length - 1 : -1]


@torch.no_grad()
def completion_signals(
    model,
    processor,
    prompt: Mapping[str, torch.Tensor],
    completions: Sequence[Sequence[int]],
    settings: SignalSettings,
    *,
    batch_size: int = 8,
) -> ExampleSignals:
    """Signals and selections of `completions` (token-id lists) of one encoded prompt (`encode_prompt`).

    Runs the clean and the perturbed teacher-forced forward `batch_size` completions at a time and computes every
    signal a page shows (H, H', JSD, |dH|, sampled-token log-probs, and KL when the strategy needs it), then
    `select_tokens` with `settings`' strategy, `k` and `alpha`.
    """
    if not completions:
        raise ValueError("No completions to score.")
    layout = pixel_layout(model.config, processor.image_processor, settings.strategy)  # one line for other models
    family = family_of(model)
    tokenizer = getattr(processor, "tokenizer", processor)
    device = prompt["input_ids"].device
    strategy = get_strategy(settings.strategy)
    names = set(_ALL_SIGNALS) | set(strategy.signals)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    length = max(1, max(len(c) for c in completions))
    ids = torch.full((len(completions), length), pad, dtype=torch.long, device=device)
    mask = torch.zeros((len(completions), length), dtype=torch.bool, device=device)
    for row, completion in enumerate(completions):
        ids[row, : len(completion)] = torch.tensor(list(completion), dtype=torch.long, device=device)
        mask[row, : len(completion)] = True

    pixel_values = prompt["pixel_values"]
    perturbed_pixels = perturb_prompt_pixels(prompt, layout, settings, family)
    head = model.get_output_embeddings()
    text_config = model.config.get_text_config()
    logit_scale = getattr(text_config, "logit_scale", None)
    parts: list[TokenSignals] = []
    for start in range(0, len(completions), batch_size):
        rows = slice(start, min(start + batch_size, len(completions)))
        n = rows.stop - rows.start
        inputs = _repeated(prompt, ids[rows], mask[rows], prefix_lm=family is not None and family.prefix_lm)
        clean = _completion_hidden(model, {**inputs, "pixel_values": _repeat(pixel_values, n)}, length)
        perturbed = _completion_hidden(model, {**inputs, "pixel_values": _repeat(perturbed_pixels, n)}, length)
        rows_mask = mask[rows]
        computed = token_signals(
            clean[rows_mask],
            perturbed[rows_mask],
            head.weight,
            head.bias,
            targets=ids[rows][rows_mask],
            signals=names,
            temperature=settings.temperature,
            logit_scale=1.0 if logit_scale is None else float(logit_scale),
            final_logit_softcapping=getattr(text_config, "final_logit_softcapping", None),
            tile_size=settings.tile_size,
        )
        parts.append(computed.map(lambda values, m=rows_mask: scatter_to_rows(values, m)))
    signals = TokenSignals(
        **{name: torch.cat([getattr(p, name) for p in parts]) if name in names else None for name in _signal_fields()}
    )
    seeds = None
    if strategy.count == "random":
        sequence = torch.cat([prompt["input_ids"].expand(len(completions), -1), ids], dim=1)
        token_mask = torch.cat([prompt["attention_mask"].bool().expand(len(completions), -1), mask], dim=1)
        seeds = row_seeds(sequence, token_mask, settings.seed, settings.step)
    selected = select_tokens(
        strategy, signals, mask, ratio=settings.ratio, alpha=settings.alpha, seeds=seeds,
        params=settings.strategy_params,
    )  # fmt: skip
    return ExampleSignals(completion_ids=ids, mask=mask, signals=signals, selected=selected)


def perturb_prompt_pixels(
    prompt: Mapping[str, torch.Tensor], layout, settings: SignalSettings, family=None
) -> torch.Tensor:
    """The prompt's `pixel_values` perturbed as `VEPOTrainer` perturbs them for this prompt's responses: the same
    layout inputs and, for tiles counted per response (TRL's `num_tiles`), the prompt's tiles as one group."""
    pixel_values = prompt["pixel_values"]
    tile_groups = [pixel_values.size(0)] if family is not None and family.tiles_per_prompt else None
    return perturb_pixel_values(
        settings.perturbation,
        pixel_values,
        prompt.get("image_grid_thw"),
        layout,
        seed=settings.seed,
        step=settings.step,
        image_sizes=prompt.get("image_sizes"),
        pixel_attention_mask=prompt.get("pixel_attention_mask"),
        image_position_ids=prompt.get("image_position_ids"),
        tile_groups=tile_groups,
        noise_step=settings.noise_step,
        sigma=settings.noise_sigma,
        patch_probability=settings.patch_probability,
        num_generations=settings.num_generations,
        **(settings.perturbation_params or {}),
    )


def _repeat(value: torch.Tensor, n: int) -> torch.Tensor:
    """A one-prompt image input for `n` responses of it: its images (tiles, patch rows, sizes) `n` times over."""
    return value.repeat(n, *[1] * (value.ndim - 1))


def _repeated(prompt, completion_ids, completion_mask, *, prefix_lm: bool) -> dict[str, torch.Tensor]:
    """Model inputs of `n` responses to one prompt, pixel values aside: prompt + completion ids and masks, the
    per-token types extended over the completion (0 = text; 1 for a prefix LM's causal suffix), every
    other image input repeated."""
    n = completion_ids.size(0)
    inputs = {
        "input_ids": torch.cat([prompt["input_ids"].expand(n, -1), completion_ids], dim=1),
        "attention_mask": torch.cat([prompt["attention_mask"].expand(n, -1), completion_mask.long()], dim=1),
    }
    for key, value in prompt.items():
        if key in inputs or key == "pixel_values":
            continue
        if key in ("token_type_ids", "mm_token_type_ids"):
            types = torch.cat([value.expand(n, -1), torch.zeros_like(completion_ids, dtype=value.dtype)], dim=1)
            if prefix_lm and key == "token_type_ids":
                types = causal_completion(types, completion_ids.size(1))
            inputs[key] = types
        else:
            inputs[key] = _repeat(value, n)
    return inputs


def _signal_fields() -> tuple[str, ...]:
    return tuple(f.name for f in fields(TokenSignals))
