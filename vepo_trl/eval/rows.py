"""Greedy evaluation of a vision-language model on rows in vepo_trl's format (`prompt`, `images`, `answer`).

The paper evaluates with greedy decoding and up to 2048 new tokens, grading Geometry3K by rule (the `accuracy`
reward here). This module scores rows already in vepo_trl's training format with the reward functions (the notebook
uses it); the paper's seven benchmarks, with their own prompts, the LLM judge and a Table-1 summary, are in
`vepo_trl.eval` (`vepo-trl eval`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from trl.data_utils import prepare_multimodal_messages

from ..families import banned_token_ids
from ..rewards import get_reward_funcs


@dataclass
class EvaluationResult:
    """Mean score per reward function, and one record per row (`answer`, `completion`, a score per reward)."""

    scores: dict[str, float]
    records: list[dict]

    def __str__(self) -> str:
        scores = ", ".join(f"{name} {value:.3f}" for name, value in self.scores.items())
        return f"{len(self.records)} rows: {scores}"


def _prompt_parts(row: dict) -> tuple[list[dict], list]:
    images = row.get("images") or ([row["image"]] if row.get("image") is not None else [])
    # Arrow stores image parts with a null `text`; the chat template only needs the part's type
    messages = [
        {
            "role": message["role"],
            "content": message["content"]
            if isinstance(message["content"], str)
            else [{k: v for k, v in part.items() if v is not None} for part in message["content"]],
        }
        for message in row["prompt"]
    ]
    return prepare_multimodal_messages(messages, images=images) if images else messages, images


@torch.no_grad()
def generate_completions(
    model, processor, rows: Sequence[dict], *, max_new_tokens: int = 2048, batch_size: int = 8
) -> list[str]:
    """Greedy completions for `rows`, batched with left padding."""
    processor.tokenizer.padding_side = "left"
    completions: list[str] = []
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        texts, images = [], []
        for row in batch:
            messages, row_images = _prompt_parts(row)
            texts.append(processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
            images.append(row_images)
        kwargs = {"images": images} if any(images) else {}
        inputs = processor(text=texts, padding=True, return_tensors="pt", **kwargs).to(model.device)
        output = model.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            suppress_tokens=banned_token_ids(model.config, processor) or None,
        )
        completions += processor.batch_decode(output[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    return completions


def evaluate(
    model,
    processor,
    dataset,
    *,
    reward_funcs: Sequence[str] = ("accuracy", "format"),
    max_new_tokens: int = 2048,
    batch_size: int = 8,
    limit: int | None = None,
) -> EvaluationResult:
    """Generate greedily for each row of `dataset` and score the completions with the named reward functions."""
    rows = [dataset[i] for i in range(len(dataset) if limit is None else min(limit, len(dataset)))]
    if not rows:
        raise ValueError("Nothing to evaluate: the data set is empty.")
    if "answer" not in rows[0]:
        raise ValueError(f"Evaluation rows need an `answer` column; found {sorted(rows[0])}.")
    completions = generate_completions(model, processor, rows, max_new_tokens=max_new_tokens, batch_size=batch_size)
    conversational = [[{"role": "assistant", "content": text}] for text in completions]
    answers = [row["answer"] for row in rows]
    records = [{"answer": answer, "completion": text} for answer, text in zip(answers, completions)]
    scores = {}
    for name, func in zip(reward_funcs, get_reward_funcs(list(reward_funcs))):
        values = func(completions=conversational, answer=answers)
        for record, value in zip(records, values):
            record[name] = value
        valid = [v for v in values if v is not None]
        scores[name] = sum(valid) / len(valid) if valid else float("nan")
    return EvaluationResult(scores=scores, records=records)
