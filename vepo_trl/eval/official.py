"""Official secondary metrics, reported beside the headline accuracy (never in its place).

- We-Math's four-dimensional metric (IK, IG, CM, RM; strict and loose), ported from We-Math/We-Math
  `evaluation/four_dimensional_metrics.py` (the same code as VLMEvalKit `vlmeval/dataset/utils/wemath.py`,
  `wemath_evaluate_models`, which feeds it per-row `hit`s as done here).
- MathVista's scoring, ported from lupantech/MathVista `evaluation/calculate_score.py`: the extraction normalised by
  `normalize_extracted_answer` (option letter -> option text, else the most similar option by edit distance; integer;
  float rounded to `precision` places; list as text), then exact equality with the data set's `answer`.

Both are ported rather than imported: the maintained copies live in VLMEvalKit and lmms-eval, which pull in model
back-ends, pandas and API clients to import, and the originals are scripts reading files, not functions.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


__all__ = ["mathvista_normalize", "mathvista_official_correct", "wemath_four_dimensional"]


# ----------------------------------------------------------------------------------------------------------------------
# We-Math: four_dimensional_metrics.py
# ----------------------------------------------------------------------------------------------------------------------


def _is(value: bool | None, expected: bool) -> bool:
    # pandas after a left merge: a missing sub-problem is NaN, and NaN == True and NaN == False are both False
    return value is not None and value is expected


def wemath_four_dimensional(rows: Iterable[tuple[str, str, bool]]) -> dict[str, Any] | None:
    """We-Math's four-dimensional metric from `(ID, key, correct)` per row (`key` as in the data: 2steps_1,
    2steps_2, 2steps_multi, 3steps_1..3, 3steps_multi; `ID` shared by a problem's rows, e.g. "2steps_7").

    A problem is one `Nsteps_1` row joined (by `ID`) with its other sub-problems and its `Nsteps_multi` composite,
    as the official left merges do; each falls in these categories (one-step = the sub-problems):
      IK  insufficient knowledge:  some one-step wrong, composite wrong
      IG  inadequate generalization: all one-step right, composite wrong
      CM  complete mastery:  strict: all one-step right, composite right; loose: some one-step right, composite right
      RM  rote memorization: strict: some one-step wrong, composite right; loose: all one-step wrong, composite right
    Rates: IK, IG, CM over the problems; RM over CM + RM. Score = (N - 0.5 IG - RM - IK) / N.

    The official hard-codes N = 525 (testmini's 360 two-step + 165 three-step problems); here N is the number of
    problems the rows form, which is 525 on the full testmini and keeps a partial run's rates meaningful.
    Returns None when the rows form no problem (no `Nsteps_1` row).
    """
    by_key: dict[tuple[str, str], list[bool]] = {}
    for problem_id, key, correct in rows:
        by_key.setdefault((key, problem_id), []).append(bool(correct))
    counts = dict.fromkeys(("IK", "IG", "CM_strict", "CM_loose", "RM_strict", "RM_loose"), 0)
    problems = 0
    for steps in (2, 3):
        firsts = [pid for (key, pid) in by_key if key == f"{steps}steps_1"]
        for pid in firsts:
            # Every combination a pandas merge would produce (one each when ids are unique, as in testmini)
            parts = [by_key[(f"{steps}steps_1", pid)]]
            parts += [by_key.get((f"{steps}steps_{i}", pid), [None]) for i in range(2, steps + 1)]
            parts.append(by_key.get((f"{steps}steps_multi", pid), [None]))
            for *subs, multi in itertools.product(*parts):
                problems += 1
                all_right = all(_is(s, True) for s in subs)
                any_right = any(_is(s, True) for s in subs)
                all_wrong = all(_is(s, False) for s in subs)
                any_wrong = any(_is(s, False) for s in subs)
                counts["RM_loose"] += all_wrong and _is(multi, True)
                counts["RM_strict"] += any_wrong and _is(multi, True)
                counts["IG"] += all_right and _is(multi, False)
                counts["IK"] += any_wrong and _is(multi, False)
                counts["CM_loose"] += any_right and _is(multi, True)
                counts["CM_strict"] += all_right and _is(multi, True)
    if not problems:
        return None

    def rm_rate(variant: str) -> float | None:
        denominator = counts[f"CM_{variant}"] + counts[f"RM_{variant}"]
        return counts[f"RM_{variant}"] / denominator if denominator else None  # the official divides by zero

    rates = {
        "IK": counts["IK"] / problems,
        "IG": counts["IG"] / problems,
        "CM (strict)": counts["CM_strict"] / problems,
        "RM (strict)": rm_rate("strict"),
        "CM (loose)": counts["CM_loose"] / problems,
        "RM (loose)": rm_rate("loose"),
    }
    scores = {
        f"Score ({variant})": (problems - 0.5 * counts["IG"] - counts[f"RM_{variant}"] - counts["IK"]) / problems
        for variant in ("strict", "loose")
    }
    return {"problems": problems, "counts": counts, "rates": rates, "scores": scores}


# ----------------------------------------------------------------------------------------------------------------------
# MathVista: calculate_score.py
# ----------------------------------------------------------------------------------------------------------------------


def _levenshtein(a: str, b: str) -> int:
    # `Levenshtein.distance` (unit-cost insertions, deletions, substitutions), without the C dependency
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def _most_similar(prediction: str, choices: Sequence[str]) -> str:
    distances = [_levenshtein(prediction, choice) for choice in choices]
    return choices[distances.index(min(distances))]  # the first of equally close options, as the official


def mathvista_normalize(
    extraction: Any, choices: Sequence[str] | None, question_type: str, answer_type: str, precision: Any
) -> str | None:
    """`normalize_extracted_answer` of MathVista's calculate_score.py (with `ignore_empty_extractions=False`, its
    default): what the extraction is compared with the data set's `answer` as.

    One deviation: a free-form `text` answer (none in testmini) raises UnboundLocalError in the official; here it is
    the stripped extraction.
    """
    import re

    if question_type == "multi_choice":
        extraction = extraction.strip() if isinstance(extraction, str) else str(extraction)
        letter = re.findall(r"\(([a-zA-Z])\)", extraction)  # "(A) text" -> "A"
        if letter:
            extraction = letter[0].upper()
        letters = [chr(ord("A") + i) for i in range(len(choices or []))]
        if extraction in letters:
            return choices[letters.index(extraction)]
        return _most_similar(extraction, choices) if choices else None
    try:
        if answer_type == "integer":
            return str(int(float(extraction)))
        if answer_type == "float":
            return str(round(float(extraction), int(precision)))
    except (TypeError, ValueError, OverflowError):
        return None
    if answer_type == "list":
        return str(extraction)
    return str(extraction).strip() if extraction is not None else None


def mathvista_official_correct(record: Mapping[str, Any], extraction: str | None) -> bool:
    """MathVista's verdict on a stored record: its `groups` hold the row's question_type, answer_type and precision;
    the official compares with `answer`, the option *text* for multiple choice (the record's gold is its letter)."""
    groups = record["groups"]
    choices = record.get("choices")
    question_type = groups["question_type"]
    answer = record["gold"]
    if question_type == "multi_choice" and choices:
        answer = choices[ord(answer) - ord("A")]
    precision = groups.get("precision")
    precision = float(precision) if precision not in (None, "") else None  # stored as text, a float in the data
    # No extraction (no box under the rule protocol) is the official's empty extraction
    prediction = mathvista_normalize(
        "" if extraction is None else extraction, choices, question_type, groups["answer_type"], precision
    )
    return prediction == answer
