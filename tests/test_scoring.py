r"""Tests for `vepo_trl.scoring`: token signals, per-response normalisation, scores and token selection.

Every expectation comes from a plain reference written here from the paper's definitions (full-logits float64 torch
code for the signals, per-row Python loops for normalisation and selection), never from the module's own code.
"""

import math
from fractions import Fraction

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vepo_trl import scoring
from vepo_trl.scoring import (
    PERTURBED_SIGNALS,
    SELECTION_STRATEGIES,
    SIGNAL_NAMES,
    TokenSignals,
    get_strategy,
    joint_visual_signal,
    minmax_normalize,
    num_selected,
    reference_token_signals,
    register_strategy,
    row_seeds,
    scatter_to_rows,
    select_tokens,
    selection_miss_counts,
    token_signals,
    top_k_mask,
    vepo_score,
    vppo_k3,
)


LN2 = math.log(2.0)
ZERO_LOGIT = -60.0  # log-probability standing in for an exact zero: e^-60 ~ 1e-26 is invisible at any tolerance here


# --------------------------------------------------------------------------------------------------------------------
# References
# --------------------------------------------------------------------------------------------------------------------


def ref_logits(hidden, weight, bias=None, *, logit_scale=1.0, softcap=None, temperature=1.0):
    """The LM head as the spec states it, in float64: (h W^T + b) * scale, soft-capped, divided by T."""
    logits = hidden.double() @ weight.double().T
    if bias is not None:
        logits = logits + bias.double()
    logits = logits * logit_scale
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return logits / temperature


def ref_signals_from_logits(clean_logits, perturbed_logits, targets=None):
    """H(P), H(Q), JSD(P, Q), KL(P || Q) and the sampled token's log-probs from full float64 logits."""
    log_p = clean_logits - torch.logsumexp(clean_logits, -1, keepdim=True)
    log_q = perturbed_logits - torch.logsumexp(perturbed_logits, -1, keepdim=True)
    p, q = log_p.exp(), log_q.exp()
    log_m = torch.log(0.5 * (p + q))
    out = {
        "entropy": -(p * log_p).sum(-1),
        "perturbed_entropy": -(q * log_q).sum(-1),
        "jsd": 0.5 * (p * (log_p - log_m)).sum(-1) + 0.5 * (q * (log_q - log_m)).sum(-1),
        "kl": (p * (log_p - log_q)).sum(-1),
    }
    if targets is not None:
        out["logp"] = log_p[torch.arange(len(targets)), targets]
        out["perturbed_logp"] = log_q[torch.arange(len(targets)), targets]
    return out


def ref_count(valid_length, ratio):
    """ceil(k T) with k read as the decimal it was written as (0.3 means 3/10), at least 1 for a non-empty row."""
    if valid_length == 0:
        return 0
    return min(valid_length, max(1, math.ceil(Fraction(str(ratio)) * valid_length)))


def ref_minmax(values):
    lo, hi = min(values), max(values)
    span = max(hi - lo, 1e-8)
    return [min(max((v - lo) / span, 0.0), 1.0) for v in values]


def ref_top_k(scores, k):
    """Indices of the top-k scores, ties to the earlier position, and whether the cut sits on a near-tie that float32
    versus float64 rounding could flip (a gap that is neither exactly zero nor clearly positive)."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    chosen = set(order[:k])
    ambiguous = False
    if 0 < k < len(scores):
        last_in, first_out = scores[order[k - 1]], scores[order[k]]
        gap = last_in - first_out
        ambiguous = 0.0 < gap <= 1e-5 * max(1.0, abs(last_in))
    return chosen, ambiguous


def ref_g(j, dh, alpha):
    return 1.0 - (1.0 - j) ** alpha * (1.0 - dh) ** (1.0 - alpha)


def ref_k3(logp, perturbed_logp):
    d = min(max(perturbed_logp - logp, -20.0), 20.0)
    return min(max(math.exp(d) - d - 1.0, 0.0), 10.0)


def ref_row_scores(name, row, alpha):
    """Per-token scores of one response (lists of its valid tokens' signals) for a top-k strategy."""
    h, hq, j = row["entropy"], row["perturbed_entropy"], row["jsd"]
    j_hat, h_hat = ref_minmax(j), ref_minmax(h)
    dh_hat = ref_minmax([abs(b - a) for a, b in zip(h, hq)])
    if name == "entropy":
        return list(h)
    if name in ("vepo", "vepo_bottom"):
        return [ref_g(a, b, alpha) * c for a, b, c in zip(j_hat, dh_hat, h_hat)]
    if name == "vepo_no_jsd":
        return [b * c for b, c in zip(dh_hat, h_hat)]
    if name == "vepo_no_entropy_gap":
        return [a * c for a, c in zip(j_hat, h_hat)]
    if name == "vepo_no_entropy":
        return [ref_g(a, b, alpha) for a, b in zip(j_hat, dh_hat)]
    if name == "vepo_kl":
        kl_hat = ref_minmax(row["kl"])
        return [ref_g(a, b, alpha) * c for a, b, c in zip(kl_hat, dh_hat, h_hat)]
    if name == "vepo_positive_gap":
        pos_hat = ref_minmax([max(b - a, 0.0) for a, b in zip(h, hq)])
        return [ref_g(a, b, alpha) * c for a, b, c in zip(j_hat, pos_hat, h_hat)]
    if name == "vepo_additive":
        return [(alpha * a + (1.0 - alpha) * b) * c for a, b, c in zip(j_hat, dh_hat, h_hat)]
    if name == "vppo":
        return [ref_k3(a, b) for a, b in zip(row["logp"], row["perturbed_logp"])]
    raise AssertionError(name)


def ref_select(name, signals, mask, ratio, alpha, has_image=None):
    """Per-row Python reference of `select_tokens` for the deterministic strategies. Returns the (B, T) mask and the
    rows whose cut sits on a float near-tie (excluded from exact comparison)."""
    batch, length = mask.shape
    selected = torch.zeros(batch, length, dtype=torch.bool)
    ambiguous_rows = set()
    needs_perturbed = name not in ("full", "entropy")
    for b in range(batch):
        positions = [t for t in range(length) if mask[b, t]]
        if not positions:
            continue
        row = {
            field: [float(getattr(signals, field)[b, t]) for t in positions]
            for field in SIGNAL_NAMES
            if getattr(signals, field) is not None
        }
        k = ref_count(len(positions), ratio)
        if name == "full":
            chosen = set(range(len(positions)))
        elif needs_perturbed and has_image is not None and not has_image[b]:
            # No image: ranked by entropy alone; VEPO-bottom keeps the complement of that ranking
            chosen, ambiguous = ref_top_k(row["entropy"], k)
            if name == "vepo_bottom":
                chosen = set(range(len(positions))) - chosen
            if ambiguous:
                ambiguous_rows.add(b)
        else:
            chosen, ambiguous = ref_top_k(ref_row_scores(name, row, alpha), k)
            if name == "vepo_bottom":
                chosen = set(range(len(positions))) - chosen
            if ambiguous:
                ambiguous_rows.add(b)
        for i in chosen:
            selected[b, positions[i]] = True
    return selected, ambiguous_rows


# --------------------------------------------------------------------------------------------------------------------
# Input builders
# --------------------------------------------------------------------------------------------------------------------


def head_inputs(n, vocab, dim, seed, dtype=torch.float32):
    """Hidden states and an LM head giving logits of order a few units: peaked but not one-hot distributions. The
    perturbed states are the clean ones plus noise, so P and Q range from close to clearly different."""
    gen = torch.Generator().manual_seed(seed)
    clean = torch.randn(n, dim, generator=gen)
    closeness = torch.rand(n, 1, generator=gen)  # per token, from almost identical to very different
    perturbed = clean + closeness * torch.randn(n, dim, generator=gen) * 2.0
    weight = torch.randn(vocab, dim, generator=gen) * (1.5 / math.sqrt(dim))
    bias = torch.randn(vocab, generator=gen) * 0.3
    targets = torch.randint(0, vocab, (n,), generator=gen)
    return clean.to(dtype), perturbed.to(dtype), weight.to(dtype), bias.to(dtype), targets


def right_padded_mask(lengths, width):
    return torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)


def random_lengths(batch, width, gen):
    lengths = torch.randint(0, width + 1, (batch,), generator=gen).tolist()
    # Always include an empty response and a one-token response when there is room
    if batch >= 3:
        lengths[0], lengths[1] = 0, min(1, width)
    return lengths


def random_mask(batch, width, gen, layout):
    """A (B, T) mask: right-padded, left-padded, or with holes in the middle (a tool mask)."""
    lengths = random_lengths(batch, width, gen)
    right = right_padded_mask(lengths, width)
    if layout == "right":
        return right
    if layout == "left":
        return right.flip(-1)
    holes = torch.rand(batch, width, generator=gen) < 0.7
    mask = right & holes
    if batch >= 3 and width >= 1:
        mask[1] = False
        mask[1, width // 2] = True  # keep exactly one valid token in row 1
    return mask


def random_signals(batch, width, gen, mask):
    """All six signals, valid tokens random and distinct, padding filled with garbage (NaN and huge values) that no
    strategy may look at."""

    def draw(low, high):
        return low + (high - low) * torch.rand(batch, width, generator=gen)

    values = {
        "entropy": draw(0.0, 5.0),
        "perturbed_entropy": draw(0.0, 5.0),
        "jsd": draw(0.0, LN2),
        "kl": draw(0.0, 3.0),
        "logp": draw(-5.0, 0.0),
        "perturbed_logp": draw(-5.0, 0.0),
    }
    garbage = torch.where(torch.rand(batch, width, generator=gen) < 0.5, math.nan, 1e6)
    return TokenSignals(**{name: torch.where(mask, v, garbage) for name, v in values.items()})


DETERMINISTIC_STRATEGIES = [
    "full",
    "entropy",
    "vepo",
    "vepo_no_jsd",
    "vepo_no_entropy_gap",
    "vepo_no_entropy",
    "vepo_kl",
    "vepo_bottom",
    "vepo_positive_gap",
    "vepo_additive",
    "vppo",
]
ALL_STRATEGIES = [*DETERMINISTIC_STRATEGIES, "random"]
PERTURBED_STRATEGIES = [name for name in DETERMINISTIC_STRATEGIES if name not in ("full", "entropy")]


# --------------------------------------------------------------------------------------------------------------------
# token_signals against the full-logits reference
# --------------------------------------------------------------------------------------------------------------------


def assert_signals_close(got, expected, names, rtol, atol):
    for name in names:
        value = getattr(got, name)
        assert value is not None, name
        assert value.dtype == torch.float32, name
        torch.testing.assert_close(value.double(), expected[name], rtol=rtol, atol=atol, msg=name)


@pytest.mark.parametrize("n", [1, 7, 64])
@pytest.mark.parametrize("vocab", [5, 50, 1000])
@pytest.mark.parametrize("dim", [4, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_signals_match_full_logits_reference(n, vocab, dim, dtype):
    clean, perturbed, weight, bias, targets = head_inputs(n, vocab, dim, seed=n * 1000 + vocab + dim, dtype=dtype)
    # The reference sees exactly the values the module sees (bf16 values upcast exactly to float64)
    expected = ref_signals_from_logits(ref_logits(clean, weight), ref_logits(perturbed, weight), targets)
    rtol, atol = (1e-5, 1e-5) if dtype == torch.float32 else (1e-4, 1e-5)
    for tile_size in sorted({1, 3, n, n + 5}):
        got = token_signals(clean, perturbed, weight, targets=targets, signals=SIGNAL_NAMES, tile_size=tile_size)
        assert_signals_close(got, expected, SIGNAL_NAMES, rtol, atol)


@pytest.mark.parametrize(
    ("logit_scale", "softcap", "temperature", "with_bias"),
    [
        (1.0, None, 1.0, True),
        (0.5, None, 1.0, False),
        (1.0, 3.0, 1.0, True),
        (1.0, None, 0.7, True),
        (2.0, 4.0, 1.3, True),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_signals_head_options(logit_scale, softcap, temperature, with_bias, dtype):
    clean, perturbed, weight, bias, targets = head_inputs(13, 300, 16, seed=7, dtype=dtype)
    bias = bias if with_bias else None
    options = {"logit_scale": logit_scale, "softcap": softcap, "temperature": temperature}
    expected = ref_signals_from_logits(
        ref_logits(clean, weight, bias, **options), ref_logits(perturbed, weight, bias, **options), targets
    )
    rtol, atol = (1e-5, 1e-5) if dtype == torch.float32 else (1e-4, 1e-5)
    for tile_size in (1, 4, 13, 100):
        got = token_signals(
            clean,
            perturbed,
            weight,
            bias,
            targets=targets,
            signals=SIGNAL_NAMES,
            temperature=temperature,
            logit_scale=logit_scale,
            final_logit_softcapping=softcap,
            tile_size=tile_size,
        )
        assert_signals_close(got, expected, SIGNAL_NAMES, rtol, atol)


@pytest.mark.parametrize("vocab_chunk_size", [1, 7, 64, 299, 300, 10_000])
def test_token_signals_half_precision_head_any_vocab_chunk(vocab_chunk_size):
    # The non-fp32 head is upcast a vocabulary chunk at a time: every chunking must give the same result
    clean, perturbed, weight, bias, targets = head_inputs(9, 300, 8, seed=3, dtype=torch.bfloat16)
    expected = ref_signals_from_logits(ref_logits(clean, weight, bias), ref_logits(perturbed, weight, bias), targets)
    got = token_signals(
        clean,
        perturbed,
        weight,
        bias,
        targets=targets,
        signals=SIGNAL_NAMES,
        tile_size=4,
        vocab_chunk_size=vocab_chunk_size,
    )
    assert_signals_close(got, expected, SIGNAL_NAMES, 1e-4, 1e-5)


def test_token_signals_mixed_dtypes():
    # fp32 hidden states with a bf16 head (and the reverse) are compared to the same values in float64
    clean, perturbed, weight, bias, targets = head_inputs(11, 200, 8, seed=5)
    weight16 = weight.bfloat16()
    for h_clean, h_pert, w in ((clean, perturbed, weight16), (clean.bfloat16(), perturbed.bfloat16(), weight)):
        expected = ref_signals_from_logits(ref_logits(h_clean, w, bias), ref_logits(h_pert, w, bias), targets)
        got = token_signals(h_clean, h_pert, w, bias, targets=targets, signals=SIGNAL_NAMES, tile_size=3)
        assert_signals_close(got, expected, SIGNAL_NAMES, 1e-4, 1e-5)


def test_token_signals_identical_distributions_have_zero_divergence():
    # P == Q: JSD and KL are exactly 0 in theory, and the perturbed signals equal the clean ones
    clean, _, weight, bias, targets = head_inputs(20, 500, 16, seed=11)
    got = token_signals(clean, clean.clone(), weight, bias, targets=targets, signals=SIGNAL_NAMES, tile_size=6)
    assert got.jsd.abs().max() < 1e-6
    assert got.kl.abs().max() < 1e-6
    torch.testing.assert_close(got.perturbed_entropy, got.entropy)
    torch.testing.assert_close(got.perturbed_logp, got.logp)


def test_token_signals_jsd_stays_within_bounds_for_extreme_logits():
    # A huge logit scale makes P and Q near one-hot on different symbols: JSD approaches ln 2 and must never pass it
    clean, perturbed, weight, _, _ = head_inputs(64, 50, 16, seed=13)
    got = token_signals(clean, perturbed, weight, signals=("jsd", "kl", "entropy"), logit_scale=200.0, tile_size=5)
    assert (got.jsd >= 0).all() and (got.jsd <= LN2).all()
    assert (got.kl >= 0).all()
    assert (got.entropy >= 0).all()
    assert got.jsd.max() > LN2 - 1e-3  # some tokens flip their argmax: nearly disjoint supports


@pytest.mark.parametrize(
    "requested",
    [
        ("entropy",),
        ("perturbed_entropy",),
        ("jsd",),
        ("kl",),
        ("logp",),
        ("perturbed_logp",),
        ("entropy", "perturbed_entropy", "jsd"),
        ("entropy", "kl", "perturbed_logp"),
        SIGNAL_NAMES,
    ],
)
def test_token_signals_computes_only_requested(requested):
    clean, perturbed, weight, _, targets = head_inputs(7, 50, 4, seed=17)
    expected = ref_signals_from_logits(ref_logits(clean, weight), ref_logits(perturbed, weight), targets)
    got = token_signals(clean, perturbed, weight, targets=targets, signals=requested, tile_size=3)
    assert got.computed() == set(requested)
    for name in SIGNAL_NAMES:
        if name not in requested:
            assert getattr(got, name) is None, name
    assert_signals_close(got, expected, requested, 1e-5, 1e-5)


def test_token_signals_clean_only_without_perturbed_hidden():
    # Clean signals need no perturbed pass at all
    clean, _, weight, _, targets = head_inputs(7, 50, 4, seed=19)
    got = token_signals(clean, None, weight, targets=targets, signals=("entropy", "logp"))
    assert got.computed() == {"entropy", "logp"}


def test_token_signals_errors():
    clean, perturbed, weight, _, targets = head_inputs(7, 50, 4, seed=23)
    # Perturbed signals without the perturbed hidden states
    for name in sorted(PERTURBED_SIGNALS):
        with pytest.raises(ValueError, match="perturbed_hidden"):
            token_signals(clean, None, weight, targets=targets, signals=(name,))
    # Log-probabilities of the sampled tokens without the sampled tokens
    for name in ("logp", "perturbed_logp"):
        with pytest.raises(ValueError, match="targets"):
            token_signals(clean, perturbed, weight, signals=(name,))
    # A signal name that does not exist is listed back with the valid names
    with pytest.raises(ValueError, match="entropyy") as info:
        token_signals(clean, perturbed, weight, signals=("entropy", "entropyy"))
    assert "perturbed_entropy" in str(info.value)
    # Clean and perturbed hidden states of different shapes
    with pytest.raises(ValueError, match="differ"):
        token_signals(clean, perturbed[:-1], weight, signals=("jsd",))
    with pytest.raises(ValueError):
        token_signals(clean, torch.cat([perturbed, perturbed], -1), weight, signals=("jsd",))
    # Tiles must hold at least one token
    for tile_size in (0, -1):
        with pytest.raises(ValueError, match="tile_size"):
            token_signals(clean, perturbed, weight, signals=("jsd",), tile_size=tile_size)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_signals_no_tokens(dtype):
    # N = 0 (no completion token in the batch): empty results, not an error
    _, _, weight, _, _ = head_inputs(1, 50, 4, seed=29, dtype=dtype)
    empty = torch.zeros(0, 4, dtype=dtype)
    got = token_signals(
        empty, empty, weight, targets=torch.zeros(0, dtype=torch.long), signals=SIGNAL_NAMES, tile_size=3
    )
    for name in SIGNAL_NAMES:
        value = getattr(got, name)
        assert value is not None and value.shape == (0,), name


class _LargestOutput(TorchDispatchMode):
    """Records the shape of every tensor any torch operation produces."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(value, torch.Tensor):
                self.shapes.append(tuple(value.shape))
        return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tile_size", [1, 4])
def test_token_signals_never_builds_full_logits(dtype, tile_size, monkeypatch):
    n, vocab, dim = 96, 700, 8
    clean, perturbed, weight, bias, targets = head_inputs(n, vocab, dim, seed=31, dtype=dtype)
    expected = ref_signals_from_logits(ref_logits(clean, weight, bias), ref_logits(perturbed, weight, bias), targets)

    # Every softmax normaliser (the log-sum-exp over the vocabulary) covers at most one tile of tokens
    original = torch.logsumexp
    rows_seen = []

    def spy(x, *args, **kwargs):
        rows_seen.append(x.shape[0])
        return original(x, *args, **kwargs)

    monkeypatch.setattr(torch, "logsumexp", spy)
    with _LargestOutput() as recorder:
        got = token_signals(clean, perturbed, weight, bias, targets=targets, signals=SIGNAL_NAMES, tile_size=tile_size)
    monkeypatch.undo()

    assert rows_seen and max(rows_seen) <= tile_size
    # No intermediate anywhere is as large as an (N, V) tensor: the largest allowed are a tile's logits and the head
    largest = max(math.prod(shape) for shape in recorder.shapes)
    assert largest <= max(tile_size * vocab, vocab * dim) < n * vocab
    rtol = 1e-5 if dtype == torch.float32 else 1e-4
    assert_signals_close(got, expected, SIGNAL_NAMES, rtol, 1e-5)


def test_token_signals_many_tokens_tile_of_one():
    # A moderately large problem computed one token at a time still matches the full-logits reference
    clean, perturbed, weight, bias, targets = head_inputs(400, 3000, 8, seed=37)
    expected = ref_signals_from_logits(ref_logits(clean, weight, bias), ref_logits(perturbed, weight, bias), targets)
    got = token_signals(clean, perturbed, weight, bias, targets=targets, signals=SIGNAL_NAMES, tile_size=1)
    assert_signals_close(got, expected, SIGNAL_NAMES, 1e-5, 2e-5)


# --------------------------------------------------------------------------------------------------------------------
# Proposition 3 on a three-symbol vocabulary
# --------------------------------------------------------------------------------------------------------------------


def near_one_hot_logits(probs):
    """Log-probabilities with ZERO_LOGIT standing in for log 0."""
    return [math.log(p) if p > 0 else ZERO_LOGIT for p in probs]


PROPOSITION_3 = [
    # Disjoint one-hot distributions: maximal divergence, yet both entropies are 0 so the entropy gap misses it
    ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), LN2, 0.0),
    # Half the mass moves: M = (3/4, 1/4, 0), KL(P||M) = ln(4/3), KL(Q||M) = ln(4/3) / 2, so JSD = 0.75 ln(4/3);
    # H(P) = 0 and H(Q) = ln 2
    ((1.0, 0.0, 0.0), (0.5, 0.5, 0.0), 0.75 * math.log(4.0 / 3.0), LN2),
    # Disjoint supports again (JSD = ln 2), now with an entropy gap of ln 2 as well
    ((0.0, 0.0, 1.0), (0.5, 0.5, 0.0), LN2, LN2),
]


@pytest.mark.parametrize(("p", "q", "jsd", "abs_gap"), PROPOSITION_3)
def test_proposition_3_reference_token_signals(p, q, jsd, abs_gap):
    clean = torch.tensor([near_one_hot_logits(p)])
    perturbed = torch.tensor([near_one_hot_logits(q)])
    got = reference_token_signals(clean, perturbed)
    assert got.jsd.item() == pytest.approx(jsd, abs=1e-6)
    assert got.entropy_gap.abs().item() == pytest.approx(abs_gap, abs=1e-6)


@pytest.mark.parametrize(("p", "q", "jsd", "abs_gap"), PROPOSITION_3)
@pytest.mark.parametrize("tile_size", [1, 2])
def test_proposition_3_token_signals(p, q, jsd, abs_gap, tile_size):
    # With an identity head (d = V = 3) the hidden state is the logit vector itself. The same pair is repeated so
    # the case also runs across tile boundaries
    weight = torch.eye(3)
    clean = torch.tensor([near_one_hot_logits(p)] * 3)
    perturbed = torch.tensor([near_one_hot_logits(q)] * 3)
    got = token_signals(
        clean, perturbed, weight, signals=SIGNAL_NAMES, targets=torch.tensor([0, 1, 2]), tile_size=tile_size
    )
    torch.testing.assert_close(got.jsd, torch.full((3,), jsd), atol=1e-6, rtol=0)
    torch.testing.assert_close(got.entropy_gap.abs(), torch.full((3,), abs_gap), atol=1e-6, rtol=0)
    # The sampled token's log-probabilities are the logits we wrote (a log-softmax of log-probabilities)
    torch.testing.assert_close(got.logp, clean[[0, 1, 2], [0, 1, 2]], atol=1e-5, rtol=0)
    torch.testing.assert_close(got.perturbed_logp, perturbed[[0, 1, 2], [0, 1, 2]], atol=1e-5, rtol=0)


def test_proposition_3_kl_of_half_moved_mass():
    # KL((1,0,0) || (1/2,1/2,0)) = 1 * ln(1 / (1/2)) = ln 2
    clean = torch.tensor([near_one_hot_logits((1.0, 0.0, 0.0))])
    perturbed = torch.tensor([near_one_hot_logits((0.5, 0.5, 0.0))])
    got = token_signals(clean, perturbed, torch.eye(3), signals=("kl",))
    assert got.kl.item() == pytest.approx(LN2, abs=1e-6)


def test_reference_token_signals_matches_own_reference():
    clean, perturbed, weight, _, targets = head_inputs(10, 40, 8, seed=41)
    clean_logits, perturbed_logits = clean @ weight.T, perturbed @ weight.T
    expected = ref_signals_from_logits(clean_logits.double(), perturbed_logits.double(), targets)
    got = reference_token_signals(clean_logits, perturbed_logits, targets, temperature=1.0)
    assert_signals_close(got, expected, SIGNAL_NAMES, 1e-6, 1e-6)
    expected = ref_signals_from_logits(clean_logits.double() / 0.6, perturbed_logits.double() / 0.6)
    got = reference_token_signals(clean_logits, perturbed_logits, temperature=0.6)
    assert got.logp is None
    assert_signals_close(got, expected, ("entropy", "perturbed_entropy", "jsd", "kl"), 1e-6, 1e-6)


def test_token_signals_dataclass_helpers():
    signals = TokenSignals(entropy=torch.tensor([1.0, 2.0]), perturbed_entropy=torch.tensor([1.5, 0.5]))
    # dH = H(Q) - H(P), signed
    torch.testing.assert_close(signals.entropy_gap, torch.tensor([0.5, -1.5]))
    assert signals.computed() == {"entropy", "perturbed_entropy"}
    doubled = signals.map(lambda x: 2 * x)
    assert doubled.computed() == {"entropy", "perturbed_entropy"}
    torch.testing.assert_close(doubled.entropy, torch.tensor([2.0, 4.0]))
    with pytest.raises(ValueError):
        _ = TokenSignals(entropy=torch.zeros(2)).entropy_gap


# --------------------------------------------------------------------------------------------------------------------
# Normalisation, counts, top-k
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("batch", "width"), [(1, 1), (5, 9), (8, 40)])
@pytest.mark.parametrize("layout", ["right", "left", "holes"])
def test_minmax_normalize_matches_reference(batch, width, layout):
    gen = torch.Generator().manual_seed(batch * 100 + width)
    mask = random_mask(batch, width, gen, layout)
    x = torch.randn(batch, width, generator=gen) * 3.0
    padded = torch.where(mask, x, torch.where(torch.rand(batch, width, generator=gen) < 0.5, math.nan, -1e9))
    got = minmax_normalize(padded, mask)
    assert got.shape == (batch, width)
    assert not got.isnan().any()
    expected = torch.zeros(batch, width, dtype=torch.float64)
    for b in range(batch):
        positions = [t for t in range(width) if mask[b, t]]
        if positions:
            for t, v in zip(positions, ref_minmax([float(x[b, t]) for t in positions])):
                expected[b, t] = v
    torch.testing.assert_close(got.double(), expected, atol=1e-6, rtol=0)


def test_minmax_normalize_hand_cases():
    mask = torch.tensor(
        [
            [True, True, True, False],  # ordinary row: (x - 1) / (3 - 1)
            [True, True, True, True],  # all equal: the span is clamped to eps, every value normalises to 0
            [False, False, False, False],  # all padding: zeros, no NaN from min = +inf, max = -inf
            [False, True, False, False],  # one valid token: a single value is all-equal, so 0
        ]
    )
    x = torch.tensor(
        [
            [1.0, 3.0, 2.0, 100.0],
            [4.0, 4.0, 4.0, 4.0],
            [math.nan, 1.0, -math.inf, 5.0],
            [9.0, 7.0, math.inf, -9.0],
        ]
    )
    expected = torch.tensor(
        [
            [0.0, 1.0, 0.5, 0.0],
            [0.0, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
        ]
    )
    torch.testing.assert_close(minmax_normalize(x, mask), expected)


@pytest.mark.parametrize(
    ("length", "ratio", "expected"),
    [
        (10, 0.3, 3),  # 0.3 * 10 = 3.0000000000000004 in binary: still exactly 3
        (5, 0.2, 1),  # 0.2 * 5 = 1
        (10, 0.7, 7),  # 0.7 * 10 = 7.000000000000001 in binary: still 7
        (10, 0.2, 2),
        (3, 0.5, 2),  # ceil(1.5)
        (7, 0.2, 2),  # ceil(1.4)
        (1, 0.2, 1),  # a one-token response keeps its token
        (4, 0.01, 1),  # at least one token for a non-empty response
        (0, 0.2, 0),  # nothing to keep in an empty response
        (0, 1.0, 0),
        (9, 1.0, 9),  # k = 1 keeps everything
        (100, 0.2, 20),
        (1000, 0.3, 300),
        (100, 0.07, 7),  # 0.07 * 100 = 7.000000000000001 in binary: still 7
        (50, 0.14, 7),  # 0.14 * 50 = 7.000000000000001 in binary: still 7
    ],
)
def test_num_selected_hand_cases(length, ratio, expected):
    got = num_selected(torch.tensor([length]), ratio)
    assert got.dtype == torch.long
    assert got.tolist() == [expected]


@pytest.mark.parametrize("ratio", [0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0])
def test_num_selected_matches_exact_arithmetic(ratio):
    lengths = list(range(0, 513))
    got = num_selected(torch.tensor(lengths), ratio).tolist()
    assert got == [ref_count(t, ratio) for t in lengths]


def test_num_selected_every_two_decimal_ratio():
    # k = p / 100 for p = 1..100 and T = 0..2000, against integer arithmetic: ceil(p T / 100) = -(-p T // 100).
    # Binary rounding pushes many of these products just above an integer (0.07 * 100 = 7.000000000000001)
    lengths = torch.arange(0, 2001)
    for percent in range(1, 101):
        got = num_selected(lengths, percent / 100).tolist()
        expected = [0 if t == 0 else max(1, -(-percent * t // 100)) for t in range(2001)]
        assert got == expected, percent


@pytest.mark.parametrize(("batch", "width"), [(1, 1), (6, 9), (7, 33)])
@pytest.mark.parametrize("layout", ["right", "left", "holes"])
@pytest.mark.parametrize("tied", [False, True])
def test_top_k_mask_matches_reference(batch, width, layout, tied):
    gen = torch.Generator().manual_seed(batch * 1000 + width + tied)
    mask = random_mask(batch, width, gen, layout)
    if tied:
        # Scores from a tiny set of values: ties everywhere, all broken toward the earlier position
        scores = torch.randint(0, 3, (batch, width), generator=gen).float()
    else:
        scores = torch.randn(batch, width, generator=gen)
    # Padding carries the highest scores of all: it must still never be picked
    scores = torch.where(mask, scores, 1e9)
    for ratio in (0.1, 0.3, 0.5, 1.0):
        got = top_k_mask(scores, mask, ratio)
        assert got.dtype == torch.bool and got.shape == (batch, width)
        expected = torch.zeros_like(got)
        for b in range(batch):
            positions = [t for t in range(width) if mask[b, t]]
            chosen, _ = ref_top_k([float(scores[b, t]) for t in positions], ref_count(len(positions), ratio))
            for i in chosen:
                expected[b, positions[i]] = True
        assert torch.equal(got, expected), ratio
        assert not (got & ~mask).any()


def test_top_k_mask_hand_cases():
    mask = torch.tensor(
        [
            [True, False, False, False, False],  # one valid token: it is selected
            [True, True, True, True, True],  # all scores equal: the first ceil(0.4 * 5) = 2 positions
            [False, False, False, False, False],  # all padding: nothing selected
            [True, True, True, True, False],  # a clear top-2 at positions 3 and 1
            [True, True, True, True, True],  # tie at the cut: 5.0 at 2, then 3.0 at 0 and 4, the earlier one wins
        ]
    )
    scores = torch.tensor(
        [
            [-7.0, 9.0, 9.0, 9.0, 9.0],
            [1.0, 1.0, 1.0, 1.0, 1.0],
            [5.0, 4.0, 3.0, 2.0, 1.0],
            [0.1, 0.5, 0.2, 0.9, 99.0],
            [3.0, 1.0, 5.0, 2.0, 3.0],
        ]
    )
    expected = torch.tensor(
        [
            [True, False, False, False, False],
            [True, True, False, False, False],
            [False, False, False, False, False],
            [False, True, False, True, False],
            [True, False, True, False, False],
        ]
    )
    assert torch.equal(top_k_mask(scores, mask, 0.4), expected)


def test_top_k_mask_row_independent_of_batch_and_padding():
    gen = torch.Generator().manual_seed(43)
    width = 12
    lengths = [12, 5, 1, 0, 9]
    mask = right_padded_mask(lengths, width)
    scores = torch.randint(0, 4, (5, width), generator=gen).float()  # ties included
    batch_result = top_k_mask(scores, mask, 0.3)
    for b, length in enumerate(lengths):
        for extra in (0, 3, 17):
            row_scores = torch.cat([scores[b : b + 1, :length], torch.full((1, extra), 50.0)], -1)
            row_mask = right_padded_mask([length], length + extra)
            alone = top_k_mask(row_scores, row_mask, 0.3)
            assert torch.equal(alone[0, :length], batch_result[b, :length]), (b, extra)
            assert not alone[0, length:].any()


def test_top_k_mask_nan_score_counts_as_lowest_valid_token():
    # A NaN score ranks below every real score, but the token is still a valid token: with k = 1 both valid tokens of
    # this row must be kept, even though a padding position sits before the NaN (left padding, or a tool-mask hole)
    mask = torch.tensor([[False, True, True]])
    scores = torch.tensor([[0.0, 1.0, math.nan]])
    got = top_k_mask(scores, mask, 1.0)
    assert got.tolist() == [[False, True, True]]


# --------------------------------------------------------------------------------------------------------------------
# Scores
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.7, 1.0])
def test_vepo_score_matches_formula(alpha):
    grid = torch.linspace(0.0, 1.0, 11)
    j, dh, h = torch.meshgrid(grid, grid, torch.tensor([0.0, 0.4, 1.0]), indexing="ij")
    got_g = joint_visual_signal(j, dh, alpha)
    got_c = vepo_score(j, dh, h, alpha)
    expected_g = torch.tensor([ref_g(a, b, alpha) for a, b in zip(j.flatten().tolist(), dh.flatten().tolist())])
    torch.testing.assert_close(got_g.flatten(), expected_g, atol=1e-6, rtol=0)
    torch.testing.assert_close(got_c.flatten(), expected_g * h.flatten(), atol=1e-6, rtol=0)
    assert not got_g.isnan().any()


def test_vepo_score_alpha_edges():
    gen = torch.Generator().manual_seed(47)
    j, dh, h = torch.rand(3, 50, generator=gen)
    j[0], dh[1] = 1.0, 1.0  # include the corners where a base of the power is 0 (0^0 = 1)
    # alpha = 0: g = 1 - (1 - dh) = dh, the JSD term drops out
    torch.testing.assert_close(joint_visual_signal(j, dh, 0.0), dh, atol=1e-6, rtol=0)
    # alpha = 1: g = 1 - (1 - j) = j, the entropy-gap term drops out
    torch.testing.assert_close(joint_visual_signal(j, dh, 1.0), j, atol=1e-6, rtol=0)
    torch.testing.assert_close(vepo_score(j, dh, h, 0.0), dh * h, atol=1e-6, rtol=0)
    torch.testing.assert_close(vepo_score(j, dh, h, 1.0), j * h, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    ("logp", "perturbed_logp", "expected"),
    [
        (-1.0, -1.0, 0.0),  # d = 0: e^0 - 0 - 1 = 0
        (-2.0, -1.0, math.e - 2.0),  # d = 1
        (-1.0, -2.0, math.exp(-1.0)),  # d = -1: e^-1 + 1 - 1
        (-1.0, -4.0, math.exp(-3.0) + 2.0),  # d = -3: e^-3 + 3 - 1
        (-30.0, 0.0, 10.0),  # d = 30 clamps to 20, e^20 - 21 is capped at 10
        (0.0, -30.0, 10.0),  # d = -30 clamps to -20, e^-20 + 19 is capped at 10
        (-5.0, -2.5, math.exp(2.5) - 3.5),  # d = 2.5: e^2.5 - 3.5 = 8.68, just below the cap
        (-5.0, -2.0, 10.0),  # d = 3: e^3 - 4 = 16.1, capped at 10
    ],
)
def test_vppo_k3_values(logp, perturbed_logp, expected):
    got = vppo_k3(torch.tensor([logp]), torch.tensor([perturbed_logp]))
    assert got.item() == pytest.approx(expected, abs=1e-5)


def test_vppo_k3_matches_reference_on_a_sweep():
    logp = torch.linspace(-40.0, 0.0, 201)
    perturbed = torch.linspace(0.0, -40.0, 201).roll(37)
    got = vppo_k3(logp, perturbed)
    expected = torch.tensor([ref_k3(a, b) for a, b in zip(logp.tolist(), perturbed.tolist())])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-6)


# --------------------------------------------------------------------------------------------------------------------
# Strategy registry
# --------------------------------------------------------------------------------------------------------------------


def test_registry_has_every_strategy():
    assert set(ALL_STRATEGIES) <= set(SELECTION_STRATEGIES)
    for name in ALL_STRATEGIES:
        strategy = get_strategy(name)
        assert strategy.name == name
        assert strategy.description


def test_strategy_signals_and_perturbed_pass():
    assert get_strategy("full").signals == frozenset()
    assert get_strategy("random").signals == frozenset()
    assert get_strategy("entropy").signals == frozenset({"entropy"})
    for name in ("full", "entropy", "random"):
        assert not get_strategy(name).needs_perturbed_pass, name
    assert not get_strategy("full").needs_signals and not get_strategy("random").needs_signals
    for name in PERTURBED_STRATEGIES:
        strategy = get_strategy(name)
        assert strategy.needs_perturbed_pass, name
        assert strategy.needs_signals, name
    assert get_strategy("vppo").signals == frozenset({"logp", "perturbed_logp"})
    assert get_strategy("vepo_kl").signals >= {"kl", "entropy", "perturbed_entropy"}
    for name in set(PERTURBED_STRATEGIES) - {"vppo", "vepo_kl"}:
        assert get_strategy(name).signals >= {"entropy", "perturbed_entropy", "jsd"}, name


def test_get_strategy_unknown_lists_valid_names():
    with pytest.raises(ValueError) as info:
        get_strategy("vepo_typo")
    message = str(info.value)
    assert "vepo_typo" in message
    for name in ALL_STRATEGIES:
        assert name in message
    with pytest.raises(ValueError):
        select_tokens("vepo_typo", TokenSignals(), torch.ones(1, 2, dtype=torch.bool), ratio=0.5)


def test_register_strategy():
    name = "test_only_first_token"
    try:

        @register_strategy(name, signals=["entropy"], count="top_k", description="First tokens.")
        def _first(signals, mask, *, ratio, **_):
            return top_k_mask(-torch.arange(mask.shape[1]).float().expand(mask.shape), mask, ratio)

        strategy = get_strategy(name)
        assert strategy.signals == frozenset({"entropy"}) and strategy.count == "top_k"
        signals = TokenSignals(entropy=torch.zeros(1, 4))
        got = select_tokens(name, signals, torch.ones(1, 4, dtype=torch.bool), ratio=0.5)
        assert got.tolist() == [[True, True, False, False]]
        # The same name twice is an error, and the first registration survives
        with pytest.raises(ValueError, match="already"):
            register_strategy(name)(lambda signals, mask, **_: mask)
        assert get_strategy(name) is strategy
    finally:
        SELECTION_STRATEGIES.pop(name, None)
    for existing in ALL_STRATEGIES:
        with pytest.raises(ValueError):
            register_strategy(existing)(lambda signals, mask, **_: mask)
    with pytest.raises(ValueError):
        register_strategy("test_only_bad_signal", signals=["entropie"])
    with pytest.raises(ValueError):
        register_strategy("test_only_bad_count", count="some")
    assert "test_only_bad_signal" not in SELECTION_STRATEGIES and "test_only_bad_count" not in SELECTION_STRATEGIES


# --------------------------------------------------------------------------------------------------------------------
# select_tokens against the per-row reference
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", DETERMINISTIC_STRATEGIES)
@pytest.mark.parametrize(
    ("batch", "width", "layout"), [(1, 1, "right"), (6, 9, "right"), (8, 33, "right"), (7, 20, "holes")]
)
def test_select_tokens_matches_reference(name, batch, width, layout):
    gen = torch.Generator().manual_seed(batch * 100 + width + len(layout))
    mask = random_mask(batch, width, gen, layout)
    signals = random_signals(batch, width, gen, mask)
    strategy = get_strategy(name)
    lengths = mask.sum(-1)
    compared = 0
    for ratio in (0.2, 0.5, 0.8):
        for alpha in (0.0, 0.7, 1.0):
            got = select_tokens(name, signals, mask, ratio=ratio, alpha=alpha)
            assert got.dtype == torch.bool and got.shape == (batch, width)
            assert not (got & ~mask).any()
            expected, ambiguous = ref_select(name, signals, mask, ratio, alpha)
            for b in range(batch):
                if b not in ambiguous:
                    assert torch.equal(got[b], expected[b]), (ratio, alpha, b)
                    compared += 1
            torch.testing.assert_close(got.sum(-1), strategy.selected_count(lengths, ratio))
    assert compared >= 0.9 * 9 * batch  # near-ties are rare: almost every row is compared exactly


def test_reference_selection_is_not_vacuous():
    # The strategies really disagree on these inputs, so agreeing with the reference for each is informative
    gen = torch.Generator().manual_seed(53)
    mask = random_mask(8, 33, gen, "right")
    signals = random_signals(8, 33, gen, mask)
    masks = {name: select_tokens(name, signals, mask, ratio=0.3, alpha=0.5) for name in DETERMINISTIC_STRATEGIES}
    distinct = {tuple(m.flatten().tolist()) for m in masks.values()}
    assert len(distinct) == len(DETERMINISTIC_STRATEGIES)


@pytest.mark.parametrize("name", DETERMINISTIC_STRATEGIES)
def test_select_tokens_row_independent_of_batch_and_padding(name):
    gen = torch.Generator().manual_seed(59)
    width = 15
    lengths = [15, 6, 1, 0, 11]
    mask = right_padded_mask(lengths, width)
    signals = random_signals(5, width, gen, mask)
    batch_result = select_tokens(name, signals, mask, ratio=0.3, alpha=0.7)
    for b, length in enumerate(lengths):
        for extra in (0, 4) if length else (1, 4):
            row_mask = right_padded_mask([length], length + extra)

            def row(value, b=b, length=length, extra=extra):
                return torch.cat([value[b : b + 1, :length], torch.full((1, extra), 7.0)], -1)

            alone = select_tokens(name, signals.map(row), row_mask, ratio=0.3, alpha=0.7)
            assert torch.equal(alone[0, :length], batch_result[b, :length]), (b, extra)
            assert not alone[0, length:].any()


@pytest.mark.parametrize("name", PERTURBED_STRATEGIES)
def test_select_tokens_rows_without_image_use_entropy(name):
    gen = torch.Generator().manual_seed(61)
    width = 14
    mask = right_padded_mask([14, 10, 7, 0, 1, 12], width)
    signals = random_signals(6, width, gen, mask)
    has_image = torch.tensor([True, False, True, False, False, True])
    # A prompt without an image has no meaningful perturbed signals: poison them to prove they are never read
    for field in PERTURBED_SIGNALS:
        value = getattr(signals, field)
        if value is not None:
            value[~has_image] = math.nan
    got = select_tokens(name, signals, mask, ratio=0.3, alpha=0.7, has_image=has_image)
    expected, ambiguous = ref_select(name, signals, mask, 0.3, 0.7, has_image=has_image)
    assert not ambiguous
    assert torch.equal(got, expected)
    torch.testing.assert_close(got.sum(-1), get_strategy(name).selected_count(mask.sum(-1), 0.3))


def test_select_tokens_vepo_bottom_without_image_is_entropy_complement():
    # Hand case: one image-less response of 4 tokens, k = 0.5. Entropy's top-2 are positions 0 and 1, so the
    # bottom ablation keeps the other two (T - ceil(kT) = 2 tokens, as its selected_count says)
    signals = TokenSignals(
        entropy=torch.tensor([[3.0, 2.0, 1.0, 0.0]]),
        perturbed_entropy=torch.zeros(1, 4),
        jsd=torch.zeros(1, 4),
    )
    mask = torch.ones(1, 4, dtype=torch.bool)
    got = select_tokens("vepo_bottom", signals, mask, ratio=0.5, has_image=torch.tensor([False]))
    assert got.tolist() == [[False, False, True, True]]


@pytest.mark.parametrize("name", PERTURBED_STRATEGIES)
def test_select_tokens_batch_without_any_image_needs_no_perturbed_signal(name):
    gen = torch.Generator().manual_seed(67)
    mask = right_padded_mask([8, 3, 0], 8)
    full = random_signals(3, 8, gen, mask)
    # Only the clean signals a strategy reads (plus entropy for the fallback ranking) are present
    clean = TokenSignals(entropy=full.entropy, logp=full.logp if "logp" in get_strategy(name).signals else None)
    has_image = torch.tensor([False, False, False])
    got = select_tokens(name, clean, mask, ratio=0.4, has_image=has_image)
    expected, _ = ref_select(name, full, mask, 0.4, 0.7, has_image=has_image)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("name", DETERMINISTIC_STRATEGIES)
def test_select_tokens_all_images_same_as_no_flag(name):
    gen = torch.Generator().manual_seed(71)
    mask = random_mask(5, 10, gen, "right")
    signals = random_signals(5, 10, gen, mask)
    plain = select_tokens(name, signals, mask, ratio=0.3, alpha=0.6)
    flagged = select_tokens(name, signals, mask, ratio=0.3, alpha=0.6, has_image=torch.ones(5, dtype=torch.bool))
    assert torch.equal(plain, flagged)


@pytest.mark.parametrize("name", [n for n in DETERMINISTIC_STRATEGIES if n != "full"])
def test_select_tokens_missing_signal_raises(name):
    gen = torch.Generator().manual_seed(73)
    mask = right_padded_mask([5, 2], 5)
    signals = random_signals(2, 5, gen, mask)
    for missing in get_strategy(name).signals:
        partial = TokenSignals(**{field: getattr(signals, field) for field in SIGNAL_NAMES if field != missing})
        with pytest.raises(ValueError, match=missing):
            select_tokens(name, partial, mask, ratio=0.5)


def test_select_tokens_image_less_rows_need_entropy():
    # vppo does not read entropy, but image-less responses are ranked by it
    mask = right_padded_mask([3, 3], 3)
    signals = TokenSignals(logp=torch.zeros(2, 3), perturbed_logp=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="entropy"):
        select_tokens("vppo", signals, mask, ratio=0.5, has_image=torch.tensor([True, False]))


@pytest.mark.parametrize("name", DETERMINISTIC_STRATEGIES)
def test_select_tokens_hand_cases(name):
    mask = torch.tensor(
        [
            [True, False, False, False, False],  # one valid token: every top-k strategy keeps it (bottom: none)
            [True, True, True, True, True],  # all signals equal: every score ties, the first ceil(0.4 * 5) = 2 win
            [False, False, False, False, False],  # all padding: nothing selected, nothing NaN
        ]
    )
    constant = torch.tensor([[0.5, 9.0, 9.0, 9.0, 9.0], [0.5] * 5, [math.nan] * 5])
    signals = TokenSignals(**{field: constant.clone() for field in SIGNAL_NAMES})
    got = select_tokens(name, signals, mask, ratio=0.4, alpha=0.7)
    if name == "full":
        expected = mask
    elif name == "vepo_bottom":
        # The complement of the top-k: nothing left in the one-token row, the last 3 positions of the tied row
        expected = torch.tensor([[False] * 5, [False, False, True, True, True], [False] * 5])
    else:
        expected = torch.tensor([[True, False, False, False, False], [True, True, False, False, False], [False] * 5])
    assert torch.equal(got, expected)


# --------------------------------------------------------------------------------------------------------------------
# The random strategy
# --------------------------------------------------------------------------------------------------------------------


def test_random_needs_seeds():
    with pytest.raises(ValueError, match="seed"):
        select_tokens("random", TokenSignals(), torch.ones(2, 4, dtype=torch.bool), ratio=0.5)


def test_random_keep_rate_and_determinism():
    batch, width, ratio = 40, 500, 0.3
    gen = torch.Generator().manual_seed(79)
    lengths = torch.randint(250, width + 1, (batch,), generator=gen).tolist()
    mask = right_padded_mask(lengths, width)
    seeds = torch.arange(batch, dtype=torch.int64) * 7919 + 1
    got = select_tokens("random", TokenSignals(), mask, ratio=ratio, seeds=seeds)
    assert got.dtype == torch.bool and not (got & ~mask).any()
    # About k of the ~15,000 valid tokens (binomial standard deviation ~0.004: the bound is ~5 sigma)
    rate = got.sum().item() / mask.sum().item()
    assert abs(rate - ratio) < 0.02
    # Not the same fixed count per row: each token is an independent draw
    assert len(set(got.sum(-1).tolist())) > 1
    assert get_strategy("random").selected_count(mask.sum(-1), ratio) is None
    # Same seeds, same mask; other seeds, another mask
    assert torch.equal(select_tokens("random", TokenSignals(), mask, ratio=ratio, seeds=seeds), got)
    other = select_tokens("random", TokenSignals(), mask, ratio=ratio, seeds=seeds + 1)
    assert not torch.equal(other, got)


def test_random_row_independent_of_batch_and_padding():
    width = 30
    lengths = [30, 12, 1, 0, 25]
    mask = right_padded_mask(lengths, width)
    seeds = torch.tensor([11, 22, 33, 44, 55], dtype=torch.int64)
    batch_result = select_tokens("random", TokenSignals(), mask, ratio=0.5, seeds=seeds)
    for b, length in enumerate(lengths):
        # Alone, with extra right padding
        alone = select_tokens(
            "random", TokenSignals(), right_padded_mask([length], length + 9), ratio=0.5, seeds=seeds[b : b + 1]
        )
        assert torch.equal(alone[0, :length], batch_result[b, :length]) and not alone[0, length:].any()
        # Alone, left-padded: the same valid tokens, in order, get the same decisions
        left = select_tokens(
            "random",
            TokenSignals(),
            right_padded_mask([length], length + 9).flip(-1),
            ratio=0.5,
            seeds=seeds[b : b + 1],
        )
        assert torch.equal(left[0, 9:], batch_result[b, :length]) and not left[0, :9].any()
    # Rows with the same seed in the same batch decide identically
    twins = select_tokens("random", TokenSignals(), right_padded_mask([30, 30], 30), ratio=0.5, seeds=seeds[[0, 0]])
    assert torch.equal(twins[0], twins[1])


def test_random_extreme_ratios():
    mask = right_padded_mask([10, 4, 0], 10)
    seeds = torch.tensor([1, 2, 3], dtype=torch.int64)
    # k = 1 keeps every valid token; k = 0 keeps none
    assert torch.equal(select_tokens("random", TokenSignals(), mask, ratio=1.0, seeds=seeds), mask)
    assert not select_tokens("random", TokenSignals(), mask, ratio=0.0, seeds=seeds).any()


def test_full_and_counts():
    mask = right_padded_mask([4, 0, 2], 5)
    assert torch.equal(select_tokens("full", TokenSignals(), mask, ratio=0.1), mask)
    lengths = torch.tensor([10, 5, 1, 0])
    assert get_strategy("full").selected_count(lengths, 0.3).tolist() == [10, 5, 1, 0]
    assert get_strategy("vepo").selected_count(lengths, 0.3).tolist() == [3, 2, 1, 0]
    # The bottom ablation keeps what VEPO leaves: T - ceil(kT)
    assert get_strategy("vepo_bottom").selected_count(lengths, 0.3).tolist() == [7, 3, 0, 0]


# --------------------------------------------------------------------------------------------------------------------
# Diagnostics and seeds
# --------------------------------------------------------------------------------------------------------------------


def test_selection_miss_counts_hand_case():
    mask = torch.tensor(
        [
            [True, True, True, True],  # k = 0.5: top-2 JSD {0, 2}, top-2 entropy {1, 2}; entropy misses 0
            [True, True, True, False],  # ceil(1.5) = 2: top-2 JSD {1, 2}, top-2 entropy {1, 2}; entropy misses none
            [False, False, False, False],  # no tokens, nothing counted
        ]
    )
    jsd = torch.tensor([[0.9, 0.1, 0.8, 0.2], [0.1, 0.5, 0.6, 9.0], [1.0, 1.0, 1.0, 1.0]])
    entropy = torch.tensor([[0.1, 0.9, 0.8, 0.2], [0.0, 2.0, 3.0, 9.0], [1.0, 1.0, 1.0, 1.0]])
    # The selection keeps 1 and 3 in row 0 (misses both JSD picks 0 and 2) and 2 in row 1 (misses 1)
    selected = torch.tensor([[False, True, False, True], [False, False, True, False], [False, False, False, False]])
    signals = TokenSignals(entropy=entropy, jsd=jsd)
    assert selection_miss_counts(signals, mask, selected, 0.5) == (4, 1, 3)
    # A selection equal to the JSD top-k misses nothing
    assert selection_miss_counts(signals, mask, top_k_mask(jsd, mask, 0.5), 0.5) == (4, 1, 0)


def test_row_seeds():
    # Row 0 and row 2 hold the same valid tokens (1, 2, 3), padded differently and at different positions
    token_ids = torch.tensor([[1, 2, 3, 0, 0], [4, 5, 6, 7, 8], [9, 9, 1, 2, 3], [1, 2, 3, 4, 0]])
    mask = torch.tensor(
        [
            [True, True, True, False, False],
            [True, True, True, True, True],
            [False, False, True, True, True],
            [True, True, True, True, False],
        ]
    )
    seeds = row_seeds(token_ids, mask, base_seed=0, step=3)
    assert seeds.dtype == torch.int64 and seeds.shape == (4,)
    assert (seeds >= 0).all()
    assert seeds[0] == seeds[2]
    assert len({seeds[0].item(), seeds[1].item(), seeds[3].item()}) == 3
    # A row's seed is the same alone as in a batch
    assert row_seeds(token_ids[3:], mask[3:], 0, 3).tolist() == [seeds[3].item()]
    # Another base seed or another step gives other seeds
    assert (row_seeds(token_ids, mask, base_seed=1, step=3) != seeds).all()
    assert (row_seeds(token_ids, mask, base_seed=0, step=4) != seeds).all()
    # Reproducible
    assert torch.equal(row_seeds(token_ids, mask, 0, 3), seeds)


def test_scatter_to_rows():
    mask = torch.tensor([[True, False, True], [False, False, False], [False, True, True]])
    values = torch.tensor([1.0, 2.0, 3.0, 4.0])
    # Values fill the True positions in row-major order
    expected = torch.tensor([[1.0, 0.0, 2.0], [0.0, 0.0, 0.0], [0.0, 3.0, 4.0]])
    assert torch.equal(scatter_to_rows(values, mask), expected)


def test_scoring_module_exports():
    for name in scoring.__all__:
        assert hasattr(scoring, name), name


def test_one_bad_value_ranks_that_token_last_and_keeps_the_rest():
    # Row 0: a NaN JSD at position 1; row 1: a NaN entropy at position 3. Each used to zero its whole response, and
    # the selection fell back to the first k tokens
    mask = torch.ones(2, 5, dtype=torch.bool)
    jsd = torch.tensor([[0.1, math.nan, 0.3, 0.6, 0.2], [0.1, 0.2, 0.3, 0.6, 0.2]])
    entropy = torch.tensor([[1.0, 2.0, 3.0, 4.0, 0.5], [1.0, 2.0, 3.0, math.nan, 5.0]])
    got = minmax_normalize(jsd, mask)
    # The rest normalise over their own finite range: (x - 0.1) / (0.6 - 0.1)
    torch.testing.assert_close(got[0, [0, 2, 3, 4]], torch.tensor([0.0, 0.4, 1.0, 0.2]))
    assert got[0, 1].isnan() and not got[1].isnan().any()
    signals = TokenSignals(entropy=entropy, perturbed_entropy=entropy * 0.5, jsd=jsd)
    selected = select_tokens("vepo", signals, mask, ratio=0.8, alpha=0.7)
    # Four of five kept per row: exactly the token with the bad value is the one left out
    assert selected.tolist() == [[True, False, True, True, True], [True, True, True, False, True]]
    # Selections that do not use the bad signal are unaffected by it
    by_entropy = select_tokens("entropy", TokenSignals(entropy=entropy[:1]), mask[:1], ratio=0.4)
    assert by_entropy.tolist() == [[False, False, True, True, False]]
