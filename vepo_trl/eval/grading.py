r"""Rule-based grading of one completion: the last `\boxed{}`, compared with the training reward's grader.

`vepo_trl.rewards.grade_answer` already handles option letters ("B", "(b)", "\text{B}"), yes/no, exact text after
normalisation and math-verify equivalence under its hang guard; this module only adds the option *text*: a
multiple-choice item also counts as right when the box holds the gold option's text ("60^\circ" for "B. 60°").
"""

from __future__ import annotations

from collections.abc import Sequence

from ..rewards import extract_boxed_answer, grade_answer
from .benchmarks import LETTERS


__all__ = ["rule_grade"]


def rule_grade(completion: str, gold: str, choices: Sequence[str] | None = None) -> tuple[str | None, bool]:
    r"""`(extracted answer, correct)`: the last `\boxed{}` content of `completion`, graded against `gold`.

    No box, or an unclosed last box, is wrong (a truncated answer is not an answer). When `gold` is an option letter
    and `choices` are given, the gold option's text is accepted too.
    """
    extracted = extract_boxed_answer(completion)
    if extracted is None:
        return None, False
    if grade_answer(extracted, gold):
        return extracted, True
    if choices and len(gold) == 1 and gold in LETTERS[: len(choices)]:
        return extracted, grade_answer(extracted, choices[LETTERS.index(gold)])
    return extracted, False
