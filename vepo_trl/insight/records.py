"""`SelectionRecord`: one completion with its tokens, its per-token signals and the tokens each rule selects.

A record is compact and JSON-serialisable, so a training run can write a few per step (`save_records`, JSON Lines)
and `vepo-trl inspect --records FILE` renders them later, offline. Records hold only a response's valid tokens (the
positions of the loss mask), in order.

The trainer builds them with `records_from_signals` from tensors it already has; `vepo-trl inspect` builds them the
same way from its own forward passes, so a page from a run and a page from `inspect` read the same numbers.
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from ..scoring import TokenSignals, minmax_normalize, top_k_mask, vepo_score


__all__ = [
    "RECORD_VERSION",
    "SelectionRecord",
    "image_to_data_uri",
    "load_records",
    "marked_completion",
    "prompt_text",
    "records_from_signals",
    "save_records",
    "token_texts",
]

RECORD_VERSION = 1
# Signals are stored with this many significant digits: plenty for a page or a plot, a third of the JSON of a float32
_DIGITS = 5


def _round(values: Sequence[float] | None) -> list[float] | None:
    if values is None:
        return None
    return [float(f"{v:.{_DIGITS}g}") if math.isfinite(v) else None for v in values]


@dataclass
class SelectionRecord:
    """One completion, its valid tokens, their signals and which tokens each selection rule keeps.

    Per-token lists all have `len(tokens)` entries. Signals are in nats; `None` where not computed (a prompt without
    an image has no perturbed pass, hence no `perturbed_entropy`, `jsd`, `entropy_gap` or `score`).

    Fields:
        tokens: the completion's text piece by piece (`token_texts`); joined they give the decoded completion.
        token_ids: the token ids.
        entropy: H(P) under the clean image. perturbed_entropy: H(Q) under the perturbed image.
        jsd: JSD(P, Q). entropy_gap: |H(Q) - H(P)|.
        score: VEPO's score c_t = g_t * h_hat (paper eq. 7) with this record's `alpha`, whatever `strategy` is.
        selected: the run's selection (`strategy` at ratio `k`). entropy_top_k: top-k entropy at the same `k`.
        jsd_top_k: top-k JSD at the same `k` (the paper's reference set for the miss rates).
        reward / advantage: of the completion, when known. step: training step, when from a run.
        prompt: the question as text. image: a `data:image/png;base64,...` URI, a file path or `None`.
        group: completions sampled for the same prompt share a group id (pages show a group together).
        meta: anything else worth showing (model, perturbation, noise step, source row...).
    """

    tokens: list[str]
    token_ids: list[int]
    entropy: list[float]
    selected: list[bool]
    entropy_top_k: list[bool]
    strategy: str
    k: float
    alpha: float
    perturbed_entropy: list[float] | None = None
    jsd: list[float] | None = None
    entropy_gap: list[float] | None = None
    score: list[float] | None = None
    jsd_top_k: list[bool] | None = None
    reward: float | None = None
    advantage: float | None = None
    step: int | None = None
    prompt: str = ""
    image: str | None = None
    group: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    version: int = RECORD_VERSION

    def __post_init__(self):
        n = len(self.tokens)
        for name in ("token_ids", "entropy", "selected", "entropy_top_k", *_OPTIONAL_PER_TOKEN):
            values = getattr(self, name)
            if values is not None and len(values) != n:
                raise ValueError(f"SelectionRecord.{name} has {len(values)} entries but there are {n} tokens.")

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def text(self) -> str:
        return "".join(self.tokens)

    @property
    def has_visual_signals(self) -> bool:
        return self.jsd is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SelectionRecord:
        known = {f.name for f in fields(cls)}
        missing = sorted(f.name for f in fields(cls) if f.name in _REQUIRED and f.name not in data)
        if missing:
            raise ValueError(f"missing field(s) {missing}")
        version = data.get("version", RECORD_VERSION)
        if version > RECORD_VERSION:
            raise ValueError(f"record version {version} is newer than this vepo_trl reads ({RECORD_VERSION})")
        return cls(**{key: value for key, value in data.items() if key in known})


_REQUIRED = ("tokens", "token_ids", "entropy", "selected", "entropy_top_k", "strategy", "k", "alpha")
_OPTIONAL_PER_TOKEN = ("perturbed_entropy", "jsd", "entropy_gap", "score", "jsd_top_k")


# ---------------------------------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------------------------------


def save_records(path: str | os.PathLike, records: Sequence[SelectionRecord], *, append: bool = False) -> Path:
    """Write `records` as JSON Lines (one record a line); `append=True` adds to an existing file (one file a run)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record.to_dict(), ensure_ascii=False, separators=(",", ":")) + "\n")
    return path


def load_records(path: str | os.PathLike) -> list[SelectionRecord]:
    """Read records written by `save_records` (JSON Lines; a JSON list of records is accepted too).

    Raises `ValueError` naming the file and line for anything that is not a record, `FileNotFoundError` for a missing
    file.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            items = [(i + 1, item) for i, item in enumerate(json.loads(stripped))]
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not valid JSON ({error.msg} at line {error.lineno})") from None
    else:
        items = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                items.append((number, json.loads(line)))
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}, line {number}: not valid JSON ({error.msg})") from None
    records = []
    for number, item in items:
        if not isinstance(item, Mapping):
            raise ValueError(f"{path}, record {number}: expected a JSON object, got {type(item).__name__}")
        try:
            records.append(SelectionRecord.from_dict(item))
        except (TypeError, ValueError) as error:
            raise ValueError(f"{path}, record {number}: {error}") from None
    if not records:
        raise ValueError(f"{path}: no records in the file")
    return records


# ---------------------------------------------------------------------------------------------------------------------
# Building records
# ---------------------------------------------------------------------------------------------------------------------


def image_to_data_uri(image, max_side: int = 320) -> str:
    """A PIL image as a small PNG `data:` URI (longest side at most `max_side` pixels) for a self-contained page."""
    image = image.convert("RGB") if image.mode not in ("RGB", "L") else image.copy()
    image.thumbnail((max_side, max_side))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def prompt_text(prompt: Any) -> str:
    """The user's words of a prompt: a string as is; for a conversation, the text parts of its user messages."""
    from ..rewards import content_to_text

    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence):
        texts = [
            content_to_text(message.get("content"))
            for message in prompt
            if isinstance(message, Mapping) and message.get("role") == "user"
        ]
        return "\n".join(text for text in texts if text)
    return ""


def token_texts(tokenizer, token_ids: Sequence[int]) -> list[str]:
    """Each token's share of the decoded text, special tokens included: `"".join(...)` is the decoded completion.

    A character split over several byte-level tokens is given whole to the token that completes it (the earlier
    ones get ""), so no piece shows a broken character.
    """
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
    token_ids = [int(i) for i in token_ids]

    def decode(ids):
        return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    pieces: list[str] = []
    start = 0
    for end in range(1, len(token_ids) + 1):
        text = decode(token_ids[start:end])
        if text.endswith("\ufffd") and end < len(token_ids):
            pieces.append("")  # an unfinished character: the token that completes it shows it
            continue
        if end - start > 1:
            # Bytes that never became a character stay with the tokens that carried them, not the next clean token
            head, own = decode(token_ids[start : end - 1]), decode(token_ids[end - 1 : end])
            if "\ufffd" not in own and head + own == text:
                pieces[-1] = head
                text = own
        pieces.append(text)
        start = end
    return pieces


def _per_row(values, n: int, name: str) -> list:
    if values is None:
        return [None] * n
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().reshape(-1).tolist()
    elif isinstance(values, str) or not isinstance(values, Sequence):
        values = [values] * n
    values = list(values)
    if len(values) != n:
        raise ValueError(f"{name} has {len(values)} entries for {n} completions.")
    return values


@torch.no_grad()
def records_from_signals(
    completion_ids: torch.Tensor,
    tokenizer,
    signals: TokenSignals,
    mask: torch.Tensor,
    selected: torch.Tensor,
    *,
    ratio: float,
    alpha: float,
    strategy: str = "vepo",
    rewards: torch.Tensor | Sequence[float] | None = None,
    advantages: torch.Tensor | Sequence[float] | None = None,
    has_image: torch.Tensor | None = None,
    prompts: Sequence[Any] | str | None = None,
    images: Sequence[Any] | None = None,
    groups: Sequence[int] | None = None,
    step: int | None = None,
    rows: Sequence[int] | None = None,
    meta: Mapping[str, Any] | None = None,
    image_max_side: int = 320,
) -> list[SelectionRecord]:
    """Build one `SelectionRecord` per completion from the tensors a VEPO step already holds.

    Args:
        completion_ids: `(B, T)` sampled token ids (right-padded).
        tokenizer: the tokenizer, or a processor with a `.tokenizer`.
        signals: `TokenSignals` with `(B, T)` fields. `entropy` is required; `perturbed_entropy` and `jsd` give the
            visual signals, the gap and VEPO's score (rows without an image, see `has_image`, get none).
        mask: `(B, T)` loss mask (completion mask times tool mask). Only its `True` positions go into a record.
        selected: `(B, T)` bool, the run's selection (`select_tokens`' output).
        ratio, alpha: the run's `k` and `alpha`; top-k entropy and top-k JSD are taken at the same `k`.
        strategy: the run's selection strategy name.
        rewards, advantages: `(B,)` per completion (a tensor or a list), optional.
        has_image: `(B,)` bool; `False` rows keep only `entropy` (their visual signals are meaningless zeros).
            Default: every row has an image when `signals.jsd` is computed.
        prompts: one prompt per completion (a string or a conversation; `prompt_text` extracts the user's words), or
            one string for all.
        images: one image per completion: a PIL image (stored as a small PNG `data:` URI of at most `image_max_side`
            pixels a side), a string (path or URI, stored as is), a list of these (the first is used) or `None`.
        groups: `(B,)` ids of the prompt each completion answers (e.g. `row // num_generations`), optional.
        step: the training step.
        rows: keep only these completion indices (e.g. `range(4)` for a few of the rollout); default all.
        meta: extra key/values stored on every record (model name, perturbation, noise step...).

    Returns:
        `len(rows)` records, in `rows` order. Pure: nothing on the inputs changes; works on any device.

    Example (inside the trainer's `_select`, after `select_tokens`):

        records = records_from_signals(
            inputs["completion_ids"], self.processing_class, signals, mask, selected,
            ratio=self.args.selection_ratio, alpha=self.args.selection_alpha, strategy=self.args.selection_strategy,
            has_image=has_image, step=self.state.global_step, rows=range(min(4, len(mask))),
        )
        save_records(os.path.join(self.args.output_dir, "selection_records.jsonl"), records, append=True)
    """
    if signals.entropy is None:
        raise ValueError("records_from_signals needs signals.entropy.")
    mask = mask.bool()
    batch = mask.shape[0]
    for name, tensor in (
        ("completion_ids", completion_ids),
        ("selected", selected),
        ("signals.entropy", signals.entropy),
    ):
        if tuple(tensor.shape) != tuple(mask.shape):
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}; mask has {tuple(mask.shape)}.")
    visual = signals.jsd is not None and signals.perturbed_entropy is not None
    if has_image is None:
        has_image = torch.full((batch,), visual, dtype=torch.bool, device=mask.device)
    has_image = has_image.bool().cpu() & visual

    entropy_top_k = top_k_mask(signals.entropy, mask, ratio)
    jsd_top_k = gap = score = None
    if visual:
        gap = signals.entropy_gap.abs()
        jsd_top_k = top_k_mask(signals.jsd, mask, ratio)
        score = vepo_score(
            minmax_normalize(signals.jsd, mask),
            minmax_normalize(gap, mask),
            minmax_normalize(signals.entropy, mask),
            alpha,
        )

    def cpu(x):
        return None if x is None else x.detach().float().cpu() if x.is_floating_point() else x.detach().cpu()

    ids, mask_c, selected_c = completion_ids.detach().cpu(), mask.cpu(), selected.bool().cpu()
    entropy, perturbed, jsd = cpu(signals.entropy), cpu(signals.perturbed_entropy), cpu(signals.jsd)
    gap, score, entropy_top_k, jsd_top_k = cpu(gap), cpu(score), cpu(entropy_top_k), cpu(jsd_top_k)

    rewards_l = _per_row(rewards, batch, "rewards")
    advantages_l = _per_row(advantages, batch, "advantages")
    prompts_l = _per_row(prompts, batch, "prompts")
    images_l = list(images) if images is not None else [None] * batch
    if len(images_l) != batch:
        raise ValueError(f"images has {len(images_l)} entries for {batch} completions.")
    groups_l = _per_row(groups, batch, "groups")
    image_cache: dict[int, str | None] = {}

    def image_value(image) -> str | None:
        if isinstance(image, (list, tuple)):
            image = image[0] if image else None
        if image is None or isinstance(image, str):
            return image
        # One encoding per distinct image: a group's completions share theirs
        if id(image) not in image_cache:
            image_cache[id(image)] = image_to_data_uri(image, image_max_side)
        return image_cache[id(image)]

    records = []
    for row in range(batch) if rows is None else rows:
        valid = mask_c[row]
        row_ids = ids[row][valid].tolist()
        with_image = bool(has_image[row])

        def take(values, cast=float, row=row, valid=valid):
            if values is None:
                return None
            picked = values[row][valid].tolist()
            return _round(picked) if cast is float else [bool(v) for v in picked]

        reward, advantage = rewards_l[row], advantages_l[row]
        records.append(
            SelectionRecord(
                tokens=token_texts(tokenizer, row_ids),
                token_ids=row_ids,
                entropy=take(entropy),
                selected=take(selected_c, bool),
                entropy_top_k=take(entropy_top_k, bool),
                strategy=strategy,
                k=float(ratio),
                alpha=float(alpha),
                perturbed_entropy=take(perturbed) if with_image else None,
                jsd=take(jsd) if with_image else None,
                entropy_gap=take(gap) if with_image else None,
                score=take(score) if with_image else None,
                jsd_top_k=take(jsd_top_k, bool) if with_image else None,
                reward=None if reward is None or not math.isfinite(float(reward)) else float(reward),
                advantage=None if advantage is None or not math.isfinite(float(advantage)) else float(advantage),
                step=step,
                prompt=prompt_text(prompts_l[row]) if prompts_l[row] is not None else "",
                image=image_value(images_l[row]),
                group=None if groups_l[row] is None else int(groups_l[row]),
                meta=dict(meta or {}),
            )
        )
    return records


def marked_completion(record: SelectionRecord, open_mark: str = "[[", close_mark: str = "]]") -> str:
    """The completion with each run of selected tokens wrapped in marks: a text column for TRL's completions table
    (`log_completions`), e.g. `"The [[answer is]] 3"`."""
    out, inside = [], False
    for piece, chosen in zip(record.tokens, record.selected):
        if chosen and not inside:
            out.append(open_mark)
        elif not chosen and inside:
            out.append(close_mark)
        inside = chosen
        out.append(piece)
    if inside:
        out.append(close_mark)
    return "".join(out)
