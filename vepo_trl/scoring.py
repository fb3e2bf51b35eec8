"""VEPO's math, as pure tensor functions: token signals, per-response normalisation, scores and token selection.

Shapes: `N` tokens flattened, `(B, T)` per response (batch, completion length), `V` vocabulary, `d` hidden size.
Natural logarithms throughout. Everything here is independent of the trainer; the trainer only gathers the inputs,
calls `token_signals` and `select_tokens`, and logs what comes back. Paper equations: signals (eqs. 2-6), score
(eq. 7), per-response top-k mask (eq. 8).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields

import torch

from .registry import Registry, call_with, check_signature, doc_summary, keyword_settings
from .utils import stable_seed


__all__ = [
    "SIGNAL_NAMES",
    "PERTURBED_SIGNALS",
    "TokenSignals",
    "token_signals",
    "reference_token_signals",
    "minmax_normalize",
    "num_selected",
    "top_k_mask",
    "vepo_score",
    "joint_visual_signal",
    "vppo_k3",
    "SelectionStrategy",
    "SELECTION_STRATEGIES",
    "register_strategy",
    "get_strategy",
    "select_tokens",
    "row_seeds",
    "selection_miss_counts",
    "scatter_to_rows",
    "PER_RESPONSE_LOSSES",
    "PER_MICRO_BATCH_LOSSES",
    "CONSTANT_NORMALISED_LOSSES",
    "TOKEN_COUNT_NORMALISED_LOSSES",
    "policy_token_weights",
]

# Per-token signals `token_signals` can compute. The perturbed ones need the forward pass with the perturbed image.
SIGNAL_NAMES = ("entropy", "perturbed_entropy", "jsd", "kl", "logp", "perturbed_logp")
PERTURBED_SIGNALS = frozenset({"perturbed_entropy", "jsd", "kl", "perturbed_logp"})
_CLEAN_DISTRIBUTION = frozenset({"entropy", "jsd", "kl", "logp"})
_PERTURBED_DISTRIBUTION = frozenset({"perturbed_entropy", "jsd", "kl", "perturbed_logp"})
_LN2 = math.log(2.0)


@dataclass
class TokenSignals:
    """Per-token signals, each `(N,)` or `(B, T)`, `None` when not computed.

    `entropy` is H(P) under the clean image, `perturbed_entropy` H(Q) under the perturbed one, `jsd` the
    Jensen-Shannon divergence JSD(P, Q), `kl` KL(P || Q), `logp` / `perturbed_logp` the sampled token's log-probability
    under P / Q.
    """

    entropy: torch.Tensor | None = None
    perturbed_entropy: torch.Tensor | None = None
    jsd: torch.Tensor | None = None
    kl: torch.Tensor | None = None
    logp: torch.Tensor | None = None
    perturbed_logp: torch.Tensor | None = None

    @property
    def entropy_gap(self) -> torch.Tensor:
        """dH = H(Q) - H(P): positive where the perturbed image makes the model less sure."""
        if self.entropy is None or self.perturbed_entropy is None:
            raise ValueError("The entropy gap needs both `entropy` and `perturbed_entropy`.")
        return self.perturbed_entropy - self.entropy

    def computed(self) -> set[str]:
        return {f.name for f in fields(self) if getattr(self, f.name) is not None}

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> TokenSignals:
        """Apply `fn` to every computed signal (e.g. scatter `(N,)` signals into `(B, T)`)."""
        return TokenSignals(**{f.name: None if (v := getattr(self, f.name)) is None else fn(v) for f in fields(self)})


def _signal_set(signals: Iterable[str]) -> frozenset[str]:
    """`signals` as a set of `SIGNAL_NAMES` (an unknown name refused)."""
    signals = frozenset((signals,) if isinstance(signals, str) else signals)
    unknown = signals - set(SIGNAL_NAMES)
    if unknown:
        raise ValueError(f"Unknown signal(s) {sorted(unknown)}; valid signals are {list(SIGNAL_NAMES)}.")
    return signals


@contextmanager
def _full_lm_head(weight: torch.Tensor, bias: torch.Tensor | None):
    """The whole LM-head weight for a direct read: gathers ZeRO-3 shards (TRL's helper) and FSDP2 DTensors."""
    from torch.distributed.tensor import DTensor
    from trl.trainer.utils import maybe_gather_lm_head_ctx

    if isinstance(weight, DTensor):
        yield weight.full_tensor(), bias.full_tensor() if isinstance(bias, DTensor) else bias
        return
    with maybe_gather_lm_head_ctx(weight, bias):
        yield weight, bias


def _project_logits(
    hidden: torch.Tensor,  # (n, d)
    weight: torch.Tensor,  # (V, d)
    bias: torch.Tensor | None,
    *,
    temperature: float,
    logit_scale: float,
    final_logit_softcapping: float | None,
    vocab_chunk_size: int,
) -> torch.Tensor:  # (n, V) fp32
    vocab = weight.shape[0]
    if weight.dtype == torch.float32:
        # An fp32 head (fp32 training, or `cast_lm_head_to_fp32`) is used as it is: no copy of it at all
        logits = hidden.float() @ weight.t()
    elif hidden.device.type == "cuda" and hidden.dtype == weight.dtype and hidden.dtype != torch.float64:
        # fp32 output straight from the half-precision GEMM: no fp32 copy of the head, no rounding of the logits
        logits = torch.mm(hidden, weight.t(), out_dtype=torch.float32)
    else:
        # Upcast the head one vocabulary chunk at a time, so the fp32 copy stays bounded by the chunk
        logits = torch.empty((hidden.shape[0], vocab), dtype=torch.float32, device=hidden.device)
        hidden32 = hidden.float()
        for start in range(0, vocab, vocab_chunk_size):
            end = min(start + vocab_chunk_size, vocab)
            torch.mm(hidden32, weight[start:end].float().t(), out=logits[:, start:end])
    if bias is not None:
        logits += bias.float()
    if logit_scale != 1.0:
        logits *= logit_scale
    if final_logit_softcapping is not None:
        logits = torch.tanh(logits.div_(final_logit_softcapping)).mul_(final_logit_softcapping)
    if temperature != 1.0:
        logits /= temperature
    return logits


def _log_softmax_(logits: torch.Tensor) -> torch.Tensor:
    # In place: the logits tile becomes log-probabilities without a second (tile, V) tensor
    return logits.sub_(torch.logsumexp(logits, dim=-1, keepdim=True))


def _rowdot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # sum_v a * b per row, as a batched GEMV: no (n, V) product tensor
    return torch.einsum("nv,nv->n", a, b)


@torch.no_grad()
def token_signals(
    clean_hidden: torch.Tensor,
    perturbed_hidden: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    targets: torch.Tensor | None = None,
    signals: Iterable[str] = ("entropy", "perturbed_entropy", "jsd"),
    temperature: float = 1.0,
    logit_scale: float = 1.0,
    final_logit_softcapping: float | None = None,
    tile_size: int = 64,
    vocab_chunk_size: int = 32768,
) -> TokenSignals:
    """Per-token signals of the clean (P) and perturbed (Q) next-token distributions, from final hidden states.

    The logits `hidden @ weight.T (+ bias)`, scaled, soft-capped and divided by `temperature` as the model's LM head
    and the sampler do, are only ever built for `tile_size` tokens at a time, in fp32 whatever the input dtype, so
    peak extra memory is about `5 * tile_size * V * 4` bytes (194 MB for Qwen's 151,936-token vocabulary at 64 tokens),
    independent of `N`. Within a tile the softmax is exact (full vocabulary rows), so no online statistics or second
    projection pass are needed: the cost is the same two projections a full-logits implementation pays.

    Args:
        clean_hidden: `(N, d)` final hidden states (after the last norm) that predict each completion token, with the
            clean image.
        perturbed_hidden: `(N, d)` the same with the perturbed image, or `None` when only clean signals are asked.
        weight: `(V, d)` LM-head weight; ZeRO-3 shards and FSDP2 DTensors are gathered for the duration.
        bias: optional `(V,)` LM-head bias.
        targets: `(N,)` sampled token ids, needed for `logp` / `perturbed_logp`.
        signals: which of `SIGNAL_NAMES` to compute; the others stay `None`.
        tile_size: tokens per tile.
        vocab_chunk_size: vocabulary rows upcast at a time when the head is not fp32 (CPU).
    """
    signals = _signal_set(signals)
    if signals & PERTURBED_SIGNALS and perturbed_hidden is None:
        raise ValueError(f"Signals {sorted(signals & PERTURBED_SIGNALS)} need `perturbed_hidden`.")
    if signals & {"logp", "perturbed_logp"} and targets is None:
        raise ValueError("`logp` and `perturbed_logp` need the sampled token ids as `targets`.")
    if perturbed_hidden is not None and perturbed_hidden.shape != clean_hidden.shape:
        raise ValueError(
            f"clean_hidden {tuple(clean_hidden.shape)} and perturbed_hidden {tuple(perturbed_hidden.shape)} differ."
        )
    if tile_size < 1:
        raise ValueError(f"tile_size must be a positive number of tokens, got {tile_size}.")
    n_tokens, device = clean_hidden.shape[0], clean_hidden.device
    out = {name: torch.zeros(n_tokens, dtype=torch.float32, device=device) for name in signals}
    need_p = bool(signals & _CLEAN_DISTRIBUTION)
    need_q = bool(signals & _PERTURBED_DISTRIBUTION)
    project_kwargs = {
        "temperature": temperature,
        "logit_scale": logit_scale,
        "final_logit_softcapping": final_logit_softcapping,
        "vocab_chunk_size": vocab_chunk_size,
    }

    with _full_lm_head(weight, bias) as (weight, bias):
        for start in range(0, n_tokens, tile_size):
            tile = slice(start, min(start + tile_size, n_tokens))
            log_p = log_q = p = q = None
            if need_p:
                log_p = _log_softmax_(_project_logits(clean_hidden[tile], weight, bias, **project_kwargs))
            if need_q:
                log_q = _log_softmax_(_project_logits(perturbed_hidden[tile], weight, bias, **project_kwargs))
            if signals & {"entropy", "jsd", "kl"}:
                p = log_p.exp()
            if signals & {"perturbed_entropy", "jsd"}:
                q = log_q.exp()
            # Everything that reads log P / log Q intact comes first: the JSD below overwrites them in place
            if "entropy" in signals:
                out["entropy"][tile] = -_rowdot(p, log_p)
            if "perturbed_entropy" in signals:
                out["perturbed_entropy"][tile] = -_rowdot(q, log_q)
            if "logp" in signals:
                out["logp"][tile] = log_p.gather(-1, targets[tile, None]).squeeze(-1)
            if "perturbed_logp" in signals:
                out["perturbed_logp"][tile] = log_q.gather(-1, targets[tile, None]).squeeze(-1)
            if "kl" in signals:
                out["kl"][tile] = _rowdot(p, log_p - log_q)
            if "jsd" in signals:
                # Summing P (log P - log M) term by term keeps JSD accurate when P ~ Q; H(M) - (H(P) + H(Q)) / 2 would
                # lose it to cancellation between entropies of order log V. In place: five (tile, V) tensors at most.
                log_m = torch.logaddexp(log_p, log_q).sub_(_LN2)
                jsd = _rowdot(p, log_p.sub_(log_m))
                out["jsd"][tile] = 0.5 * (jsd + _rowdot(q, log_q.sub_(log_m)))
                del log_m
            del log_p, log_q, p, q
    if "jsd" in out:
        # JSD lies in [0, ln 2]; rounding can step just outside
        out["jsd"].clamp_(0.0, _LN2)
    if "kl" in out:
        out["kl"].clamp_(min=0.0)
    return TokenSignals(**out)


@torch.no_grad()
def reference_token_signals(
    clean_logits: torch.Tensor,
    perturbed_logits: torch.Tensor,
    targets: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> TokenSignals:
    """The same signals from full `(..., V)` logits, written as plainly as the paper states them. For tests only:
    it holds several tensors the size of the logits."""
    log_p = torch.log_softmax(clean_logits.double() / temperature, -1)
    log_q = torch.log_softmax(perturbed_logits.double() / temperature, -1)
    p, q = log_p.exp(), log_q.exp()
    m = 0.5 * (p + q)
    kl_pm = torch.where(p > 0, p * (log_p - m.log()), 0.0).sum(-1)
    kl_qm = torch.where(q > 0, q * (log_q - m.log()), 0.0).sum(-1)
    signals = TokenSignals(
        entropy=-(torch.where(p > 0, p * log_p, 0.0)).sum(-1),
        perturbed_entropy=-(torch.where(q > 0, q * log_q, 0.0)).sum(-1),
        jsd=0.5 * kl_pm + 0.5 * kl_qm,
        kl=torch.where(p > 0, p * (log_p - log_q), 0.0).sum(-1),
    )
    if targets is not None:
        signals.logp = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        signals.perturbed_logp = log_q.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return signals.map(lambda x: x.float())


# ---------------------------------------------------------------------------------------------------------------------
# Per-response normalisation, score and top-k
# ---------------------------------------------------------------------------------------------------------------------


def minmax_normalize(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """`(x - min) / max(max - min, eps)` over each response's valid tokens, clamped to [0, 1], zero on padding.

    A response whose valid values are all equal normalises to all zeros. A valid token whose value is NaN or infinite
    (a numerical failure in one position) is left out of the min and max and comes out NaN, so any score built from it
    is NaN and `top_k_mask` ranks that token last; the response's other tokens normalise as if it were absent.
    Shapes: `x`, `mask` `(B, T)`.
    """
    mask = mask.bool()
    x = x.float()
    if x.shape[-1] == 0:
        return torch.zeros_like(x)
    finite = mask & torch.isfinite(x)
    x_min = x.masked_fill(~finite, math.inf).amin(-1, keepdim=True)
    x_max = x.masked_fill(~finite, -math.inf).amax(-1, keepdim=True)
    span = (x_max - x_min).clamp(min=eps)
    normalized = ((x - x_min) / span).clamp(0.0, 1.0)
    # Rows without a finite valid token have min = +inf and max = -inf: zero them through the mask, never through NaN
    normalized = torch.where(finite, normalized.nan_to_num(0.0), 0.0)
    return torch.where(mask & ~finite, math.nan, normalized)


def num_selected(valid_lengths: torch.Tensor, ratio: float) -> torch.Tensor:
    """`ceil(ratio * T_valid)` per response, at least 1 for a non-empty response and 0 for an empty one. `(B,)`"""
    lengths = valid_lengths.to(torch.float64)
    # ratio * T carries binary rounding (0.3 * 10 = 3.0000000000000004); the guard keeps exact products exact
    count = torch.ceil(lengths * ratio - 1e-9).clamp(min=1.0)
    count = torch.minimum(count, lengths)
    return torch.where(valid_lengths > 0, count, 0.0).long()


def top_k_mask(scores: torch.Tensor, mask: torch.Tensor, ratio: float) -> torch.Tensor:
    """Boolean `(B, T)` mask of each response's top `ceil(ratio * T_valid)` valid tokens by `scores`.

    Ties go to the earlier position (a stable sort), so the mask depends on nothing but the response's own scores.
    """
    mask = mask.bool()
    # A valid token whose score is NaN or infinite still ranks above every padding position (-inf)
    big = torch.finfo(torch.float32).max
    scores = scores.float().nan_to_num(nan=-big, posinf=big, neginf=-big).masked_fill(~mask, -math.inf)
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    positions = torch.arange(scores.shape[-1], device=scores.device).expand_as(order)
    ranks = torch.empty_like(order).scatter_(-1, order, positions)
    count = num_selected(mask.sum(-1), ratio)
    return (ranks < count.unsqueeze(-1)) & mask


def joint_visual_signal(jsd_hat: torch.Tensor, gap_hat: torch.Tensor, alpha: float) -> torch.Tensor:
    """Soft noisy-OR of the two visual signals: `g = 1 - (1 - j)^alpha * (1 - dh)^(1 - alpha)` (paper eq. 7)."""
    return 1.0 - (1.0 - jsd_hat).pow(alpha) * (1.0 - gap_hat).pow(1.0 - alpha)


def vepo_score(jsd_hat: torch.Tensor, gap_hat: torch.Tensor, entropy_hat: torch.Tensor, alpha: float) -> torch.Tensor:
    """VEPO's score `c = g * h_hat` from normalised JSD, |dH| and entropy (paper eq. 7)."""
    return joint_visual_signal(jsd_hat, gap_hat, alpha) * entropy_hat


def vppo_k3(logp: torch.Tensor, perturbed_logp: torch.Tensor) -> torch.Tensor:
    """VPPO's per-token visual dependency: the k3 estimator of the sampled token, `exp(d) - d - 1` with
    `d = log Q(o_t) - log P(o_t)` clamped to +-20, the result clamped to [0, 10]."""
    d = (perturbed_logp - logp).clamp(-20.0, 20.0)
    return (torch.exp(d) - d - 1.0).clamp(0.0, 10.0)


# ---------------------------------------------------------------------------------------------------------------------
# Selection strategies
# ---------------------------------------------------------------------------------------------------------------------

SelectionFn = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class SelectionStrategy:
    """A named token-selection rule.

    `fn(signals, mask, *, ratio, alpha, seeds) -> (B, T) bool` reads only `signals`' fields listed in `signals`, so
    the trainer computes nothing more. `count` says how many tokens a response of `T` valid tokens keeps: "top_k"
    (`ceil(ratio * T)`), "bottom" (the complement, `T - ceil(ratio * T)`), "all", or "random" (not known ahead).
    """

    name: str
    fn: SelectionFn
    signals: frozenset[str]
    count: str
    description: str

    @property
    def needs_perturbed_pass(self) -> bool:
        return bool(self.signals & PERTURBED_SIGNALS)

    @property
    def reads(self) -> frozenset[str]:
        """The settings `fn` takes (`ratio`, `alpha`, `seeds`, its own): its keyword-only parameters, so what a
        strategy reads is what its function declares (`config.unread_settings` refuses a setting none of the run's
        parts reads)."""
        return frozenset(keyword_settings(self.fn))

    @property
    def settings(self) -> dict[str, object]:
        """The strategy's own settings (`strategy_params`): the keyword-only parameters the trainer does not supply,
        each with its default (`inspect.Parameter.empty`: required)."""
        return {k: v for k, v in keyword_settings(self.fn).items() if k not in SUPPLIED_TO_STRATEGIES}

    @property
    def needs_signals(self) -> bool:
        return bool(self.signals)

    def selected_count(self, valid_lengths: torch.Tensor, ratio: float) -> torch.Tensor | None:
        """Tokens kept per response, known from the lengths alone; `None` for stochastic strategies."""
        if self.count == "top_k":
            return num_selected(valid_lengths, ratio)
        if self.count == "bottom":
            return valid_lengths.long() - num_selected(valid_lengths, ratio)
        if self.count == "all":
            return valid_lengths.long()
        return None


# What every strategy may declare and the trainer gives: k, alpha and the per-response seeds of a "random" count
SUPPLIED_TO_STRATEGIES = ("ratio", "alpha", "seeds")
SELECTION_STRATEGIES: Registry[SelectionStrategy] = Registry("selection strategy", plural="strategies")
_COUNT_RULES = ("top_k", "bottom", "all", "random")


def register_strategy(name: str, *, signals: Iterable[str] = (), count: str = "top_k", description: str = ""):
    """Register `fn(signals, mask, *, ...) -> (B, T) bool tensor` as the selection strategy `name` (a decorator,
    exported as `vepo_trl.register_strategy`).

    The contract:

    - `signals` (`TokenSignals`): `(B, T)` float tensors, one per response token; only the fields named in `signals`
      here are computed (any of `SIGNAL_NAMES`: "entropy", "perturbed_entropy", "jsd", "kl", "logp",
      "perturbed_logp"). Naming a perturbed one runs the perturbed forward (`PERTURBED_SIGNALS`).
    - `mask` `(B, T)` bool: the valid response tokens. The strategy returns a bool tensor of that shape; only tokens
      inside `mask` count. Responses whose prompt has no image are ranked by entropy instead, without calling it.
    - Keyword-only parameters are what it reads: `ratio` (k, `selection_ratio`), `alpha` (`selection_alpha`),
      `seeds` (`(B,)` per-response seeds, for `count="random"`), and any others are its own settings, given as
      `--strategy_params '{"name": value}'` (or `strategy_params:` in a recipe) and checked against the signature.
    - `count`: how many tokens a response of `T` keeps, "top_k" (`ceil(ratio * T)`: use `top_k_mask`), "bottom"
      (`T - ceil(ratio * T)`), "all", or "random" (not known ahead).
    - `description`: one line for `vepo-trl strategies` (default: the docstring's first line).

    Registering a name twice is an error."""
    signals = _signal_set(signals)
    if count not in _COUNT_RULES:
        raise ValueError(f"count must be one of {_COUNT_RULES}, got {count!r}.")

    def decorator(fn: SelectionFn) -> SelectionFn:
        check_signature(fn, "selection strategy", ("signals", "mask"))
        doc = description or doc_summary(fn)
        SELECTION_STRATEGIES.add(name, SelectionStrategy(name, fn, signals, count, doc), module=fn.__module__)
        return fn

    return decorator


def get_strategy(name: str) -> SelectionStrategy:
    """The registered selection strategy `name` (`SELECTION_STRATEGIES`); an unknown name raises `ValueError` listing
    the registered ones."""
    return SELECTION_STRATEGIES.lookup(name)


def _normalized(signals: TokenSignals, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        minmax_normalize(signals.jsd, mask),
        minmax_normalize(signals.entropy_gap.abs(), mask),
        minmax_normalize(signals.entropy, mask),
    )


_VEPO_SIGNALS = ("entropy", "perturbed_entropy", "jsd")


@register_strategy("full", count="all", description="All valid tokens (plain GRPO).")
def _full(signals, mask, **_):
    return mask.bool().clone()


@register_strategy("entropy", signals=["entropy"], description="Top-k entropy per response (the 80/20 baseline).")
def _entropy(signals, mask, *, ratio, **_):
    return top_k_mask(signals.entropy, mask, ratio)


@register_strategy("random", count="random", description="Each valid token kept with probability k (Bernoulli).")
def _random(signals, mask, *, ratio, seeds, **_):
    if seeds is None:
        raise ValueError("The `random` strategy needs one seed per response (`seeds`).")
    mask = mask.bool()
    selected = torch.zeros_like(mask)
    for row, seed in enumerate(seeds.tolist()):
        valid = mask[row].nonzero().squeeze(-1)
        # One generator per response, drawing exactly T_valid numbers: the draw ignores padding and other rows
        # cpu: the same draws whatever the device (CUDA and CPU generators differ); moved to the mask's device below
        generator = torch.Generator().manual_seed(int(seed))
        keep = torch.rand(valid.numel(), generator=generator) < ratio  # cpu: see above
        selected[row, valid[keep.to(valid.device)]] = True
    return selected


@register_strategy("vepo", signals=_VEPO_SIGNALS, description="VEPO: (1 - (1-j)^a (1-|dh|)^(1-a)) * h, top-k.")
def _vepo(signals, mask, *, ratio, alpha, **_):
    jsd_hat, gap_hat, entropy_hat = _normalized(signals, mask)
    return top_k_mask(vepo_score(jsd_hat, gap_hat, entropy_hat, alpha), mask, ratio)


@register_strategy("vepo_no_jsd", signals=_VEPO_SIGNALS, description="Ablation without JSD: g = |dh|_hat.")
def _vepo_no_jsd(signals, mask, *, ratio, **_):
    _, gap_hat, entropy_hat = _normalized(signals, mask)
    return top_k_mask(gap_hat * entropy_hat, mask, ratio)


@register_strategy("vepo_no_entropy_gap", signals=_VEPO_SIGNALS, description="Ablation without |dH|: g = j_hat.")
def _vepo_no_entropy_gap(signals, mask, *, ratio, **_):
    jsd_hat, _, entropy_hat = _normalized(signals, mask)
    return top_k_mask(jsd_hat * entropy_hat, mask, ratio)


@register_strategy("vepo_no_entropy", signals=_VEPO_SIGNALS, description="Ablation without entropy: c = g.")
def _vepo_no_entropy(signals, mask, *, ratio, alpha, **_):
    jsd_hat, gap_hat, _ = _normalized(signals, mask)
    return top_k_mask(joint_visual_signal(jsd_hat, gap_hat, alpha), mask, ratio)


@register_strategy(
    "vepo_kl", signals=("entropy", "perturbed_entropy", "kl"), description="Ablation: KL(P||Q) in place of JSD."
)
def _vepo_kl(signals, mask, *, ratio, alpha, **_):
    kl_hat = minmax_normalize(signals.kl, mask)
    gap_hat = minmax_normalize(signals.entropy_gap.abs(), mask)
    entropy_hat = minmax_normalize(signals.entropy, mask)
    return top_k_mask(vepo_score(kl_hat, gap_hat, entropy_hat, alpha), mask, ratio)


@register_strategy(
    "vepo_bottom", signals=_VEPO_SIGNALS, count="bottom", description="Ablation: the complement of VEPO's top-k."
)
def _vepo_bottom(signals, mask, *, ratio, alpha, **_):
    return mask.bool() & ~_vepo(signals, mask, ratio=ratio, alpha=alpha)


@register_strategy("vepo_positive_gap", signals=_VEPO_SIGNALS, description="Ablation: max(dH, 0) in place of |dH|.")
def _vepo_positive_gap(signals, mask, *, ratio, alpha, **_):
    jsd_hat = minmax_normalize(signals.jsd, mask)
    gap_hat = minmax_normalize(signals.entropy_gap.clamp(min=0.0), mask)
    entropy_hat = minmax_normalize(signals.entropy, mask)
    return top_k_mask(vepo_score(jsd_hat, gap_hat, entropy_hat, alpha), mask, ratio)


@register_strategy("vepo_additive", signals=_VEPO_SIGNALS, description="Ablation: g = a j_hat + (1-a) |dh|_hat.")
def _vepo_additive(signals, mask, *, ratio, alpha, **_):
    jsd_hat, gap_hat, entropy_hat = _normalized(signals, mask)
    return top_k_mask((alpha * jsd_hat + (1.0 - alpha) * gap_hat) * entropy_hat, mask, ratio)


@register_strategy(
    "vppo", signals=("logp", "perturbed_logp"), description="VPPO's token filter: top-k of the sampled token's k3."
)
def _vppo(signals, mask, *, ratio, **_):
    return top_k_mask(vppo_k3(signals.logp, signals.perturbed_logp), mask, ratio)


def select_tokens(
    strategy: str | SelectionStrategy,
    signals: TokenSignals,
    mask: torch.Tensor,
    *,
    ratio: float,
    alpha: float = 0.7,
    seeds: torch.Tensor | None = None,
    has_image: torch.Tensor | None = None,
    params: Mapping[str, object] | None = None,
) -> torch.Tensor:
    """Boolean `(B, T)` mask of the tokens to train on, per response, within `mask`. `params`: the strategy's own
    settings (`SelectionStrategy.settings`, checked by `VEPOConfig`).

    Responses whose prompt has no image (`has_image[b]` False) carry no visual signal: a strategy that needs the
    perturbed pass ranks them by entropy alone instead (its top-k, or for a "bottom" strategy the complement), and
    their perturbed signals are ignored, and may be missing.
    """
    strategy = get_strategy(strategy) if isinstance(strategy, str) else strategy
    missing = strategy.signals - signals.computed()
    if strategy.needs_perturbed_pass and has_image is not None and not bool(has_image.any()):
        missing -= PERTURBED_SIGNALS
    if missing:
        raise ValueError(f"Strategy {strategy.name!r} needs signals {sorted(missing)}, which were not computed.")
    mask = mask.bool()
    if not strategy.needs_perturbed_pass or has_image is None or bool(has_image.all()):
        return _call(strategy, signals, mask, ratio, alpha, seeds, params)
    with_image = mask & has_image.bool().unsqueeze(-1)
    without_image = mask & ~has_image.bool().unsqueeze(-1)
    if "entropy" not in signals.computed():
        raise ValueError(f"Strategy {strategy.name!r} needs `entropy` to rank responses that have no image.")
    selected = top_k_mask(signals.entropy, without_image, ratio)
    if strategy.count == "bottom":
        # Keep the strategy's meaning (and its token count): the complement of the entropy top-k
        selected = without_image & ~selected
    if bool(with_image.any()):
        selected |= _call(strategy, signals, with_image, ratio, alpha, seeds, params)
    return selected


def _call(strategy: SelectionStrategy, signals, mask, ratio, alpha, seeds, params) -> torch.Tensor:
    selected = call_with(strategy.fn, signals, mask, ratio=ratio, alpha=alpha, seeds=seeds, **dict(params or {}))
    if not isinstance(selected, torch.Tensor) or selected.shape != mask.shape:
        got = tuple(selected.shape) if isinstance(selected, torch.Tensor) else type(selected).__name__
        raise TypeError(
            f"Selection strategy {strategy.name!r} returned {got}; a strategy returns a boolean tensor shaped like "
            f"its mask {tuple(mask.shape)}."
        )
    return selected.bool() & mask


def row_seeds(token_ids: torch.Tensor, mask: torch.Tensor, base_seed: int, step: int) -> torch.Tensor:
    """One 63-bit seed per response from its own valid tokens, the base seed and the step: a response draws the same
    randomness whichever rows share its batch or process, and however it is padded. `(B,)`"""
    seeds = [
        stable_seed(base_seed, step, ",".join(str(t) for t, v in zip(ids, valid) if v))
        for ids, valid in zip(token_ids.tolist(), mask.bool().tolist())
    ]
    return torch.tensor(seeds, dtype=torch.int64)  # cpu: seeds, read back with tolist()


def selection_miss_counts(
    signals: TokenSignals, mask: torch.Tensor, selected: torch.Tensor, ratio: float
) -> tuple[int, int, int]:
    """The paper's diagnostic (Fig. 2b / 5c): of each response's top-k JSD tokens, how many top-k entropy would miss,
    and how many `selected` misses. Returns `(jsd_top_k, missed_by_entropy, missed_by_selection)` summed over the
    batch, so callers can pool counts across processes before dividing."""
    top_jsd = top_k_mask(signals.jsd, mask, ratio)
    top_entropy = top_k_mask(signals.entropy, mask, ratio)
    total = int(top_jsd.sum())
    return total, int((top_jsd & ~top_entropy).sum()), int((top_jsd & ~selected.bool()).sum())


def scatter_to_rows(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Place `(N,)` per-token values at the `True` positions of a `(B, T)` mask; zero elsewhere."""
    out = torch.zeros(mask.shape, dtype=values.dtype, device=values.device)
    out[mask.bool()] = values
    return out


# ---------------------------------------------------------------------------------------------------------------------
# The selection in the loss: per-token weights on the policy-gradient term
# ---------------------------------------------------------------------------------------------------------------------

# How each TRL `loss_type` normalises its token sum, hence where L_VEPO's selected count must replace the valid count
PER_RESPONSE_LOSSES = ("grpo", "sapo", "luspo")  # sum over a response / its valid count (luspo: times it)
PER_MICRO_BATCH_LOSSES = ("bnpo",)  # sum over the micro-batch / its valid count
CONSTANT_NORMALISED_LOSSES = ("dr_grpo",)  # sum / (B * max_completion_length)
TOKEN_COUNT_NORMALISED_LOSSES = ("dapo", "cispo", "vespo")  # sum / valid count of the generation batch
SUPPORTED_LOSS_TYPES = (
    PER_RESPONSE_LOSSES + PER_MICRO_BATCH_LOSSES + CONSTANT_NORMALISED_LOSSES + (TOKEN_COUNT_NORMALISED_LOSSES)
)


def policy_token_weights(
    selected: torch.Tensor,
    valid: torch.Tensor,
    loss_type: str,
    *,
    mode: str = "mask",
    bonus: float = 1.0,
    count_scale: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token weights `w` on the policy-gradient term that turn a TRL loss, which divides by VALID token counts,
    into L_VEPO, which divides by SELECTED counts (paper eq. 9): `sum_t w_t l_t / n_valid == sum_t s_t l_t / n_sel`
    at the granularity the loss type normalises at. The KL term and the entropy terms keep the valid tokens.

    - `mode="mask"` (the paper): `w = s * n_valid / n_sel`, with the counts per response (`grpo`, `sapo`, `luspo`),
      per micro-batch (`bnpo`), or given as `count_scale` = valid / selected count of the generation batch (`dapo`,
      `cispo`, `vespo`) or `max_completion_length / selected count of a max-length response` (`dr_grpo`).
    - `mode="weight"` (the authors' release option): every valid token trains, selected ones weighted `1 + bonus`;
      the loss keeps its valid-token normalisation.

    Shapes: `selected`, `valid` `(B, T)` bool; returns `(B, T)` float32, zero off `valid` and, in mask mode, off
    `selected`. A response (or micro-batch) with nothing selected gets zero weight.
    """
    selected = selected.bool() & valid.bool()
    valid_f, selected_f = valid.float(), selected.float()
    if mode == "weight":
        return valid_f + bonus * selected_f
    if mode != "mask":
        raise ValueError(f"Unknown selection mode {mode!r}; use 'mask' or 'weight'.")
    if loss_type in PER_RESPONSE_LOSSES:
        scale = valid_f.sum(-1, keepdim=True) / selected_f.sum(-1, keepdim=True).clamp(min=1.0)  # (B, 1)
    elif loss_type in PER_MICRO_BATCH_LOSSES:
        scale = valid_f.sum() / selected_f.sum().clamp(min=1.0)
    elif loss_type in CONSTANT_NORMALISED_LOSSES + TOKEN_COUNT_NORMALISED_LOSSES:
        if count_scale is None:
            raise ValueError(f"loss_type={loss_type!r} needs `count_scale` (its valid / selected count ratio).")
        scale = torch.as_tensor(count_scale, dtype=torch.float32, device=selected.device)
    else:
        raise ValueError(
            f"loss_type={loss_type!r} has no L_VEPO form here; supported: {', '.join(SUPPORTED_LOSS_TYPES)}."
        )
    return selected_f * scale
