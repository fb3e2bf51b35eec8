r"""Grading: the rule grader, and the three protocols (`paper`, `lenient`, `rule`) that give a record its verdicts.

The rule grader takes the last `\boxed{}` and compares it with the training reward's grader.

`vepo_trl.rewards.grade_answer` already handles option letters ("B", "(b)", "\text{B}"), yes/no, exact text after
normalisation and math-verify equivalence under its hang guard; this module only adds the option *text*: a
multiple-choice item also counts as right when the box holds the gold option's text ("60^\circ" for "B. 60°").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from ..rewards import extract_boxed_answer, grade_answer
from .benchmarks import LETTERS
from .paper import GRADER_VERSION, PAPER_JUDGED, Verdict, paper_grade


__all__ = ["PROTOCOLS", "grade_one", "grade_records", "rule_grade", "uses_judge"]


def rule_grade(completion: str, gold: str, choices: Sequence[str] | None = None) -> tuple[str | None, bool]:
    r"""`(extracted answer, correct)`: the last `\boxed{}` content of `completion`, graded against `gold`.

    No box, or an unclosed last box, is wrong (a truncated answer is not an answer). When `gold` is an option letter
    and `choices` are given, the gold option's text is accepted too.
    """
    extracted = extract_boxed_answer(completion)
    if extracted is None:
        return None, False
    gold = gold.strip()  # golds keep the release's whitespace (its exact match reads them so); a rule reads the value
    if grade_answer(extracted, gold):
        return extracted, True
    if choices and len(gold) == 1 and gold in LETTERS[: len(choices)]:
        return extracted, grade_answer(extracted, choices[LETTERS.index(gold)])
    return extracted, False


# ----------------------------------------------------------------------------------------------------------------------
# Protocols: which grader gives a record's verdict
# ----------------------------------------------------------------------------------------------------------------------

from .names import PROTOCOL_HELP, PROTOCOLS  # noqa: E402,F401  (light, for the command's parser)


# Benchmarks whose verdict comes from the judge under each protocol
JUDGED = {"paper": PAPER_JUDGED, "lenient": PAPER_JUDGED, "rule": frozenset()}


def uses_judge(protocol: str, benchmark: str) -> bool:
    return benchmark in JUDGED[protocol]


def grader_id(protocol: str, judge_model: str | None, benchmark: str) -> dict:
    """What gave a verdict: a stored verdict from another grader (version, judge model) is graded again."""
    judge = judge_model if uses_judge(protocol, benchmark) else None
    return {"protocol": protocol, "version": GRADER_VERSION, "judge": judge}


def gold_text(gold: str, choices: Sequence[str] | None) -> str:
    """The gold as the lenient judge reads it: "B. 60°" for a letter into `choices`."""
    if choices and len(gold) == 1 and gold in LETTERS[: len(choices)]:
        return f"{gold}. {choices[LETTERS.index(gold)]}"
    return gold


def grade_one(protocol: str, record: Mapping, judge) -> Verdict:
    """The verdict of `protocol` on one stored record (its `benchmark`, `completion`, `gold`, `choices`,
    `judge_question`); `judge` is an `LLMJudge` where the protocol judges this benchmark."""
    benchmark, completion, gold = record["benchmark"], record["completion"], record["gold"]
    if record.get("error"):  # no completion (unreadable image): wrong under every protocol, no judge call
        return Verdict(False, None, note=f"counted wrong: {record['error']}")
    if protocol == "paper" and (benchmark in PAPER_JUDGED or benchmark in ("geometry3k", "hallusionbench")):
        question = record.get("judge_question") or ""
        return paper_grade(benchmark, completion, gold, question, judge.complete if judge else None)
    if protocol == "lenient" and benchmark in JUDGED["lenient"]:
        verdict = judge.grade(question=record.get("judge_question") or "", gold=gold_text(gold, record.get("choices")),
                              response=completion)  # fmt: skip
        return Verdict(verdict.correct, verdict.extracted, verdict.error)
    extracted, correct = rule_grade(completion, gold, record.get("choices"))
    return Verdict(correct, extracted)


def needs_grading(record: Mapping, protocol: str, judge_model: str | None) -> bool:
    verdict = record.get("verdicts", {}).get(protocol)
    expected = grader_id(protocol, judge_model, record["benchmark"])
    return verdict is None or verdict.get("correct") is None or verdict.get("grader") != expected


def grade_records(records: list[dict], protocol: str, judge, *, workers: int = 8) -> int:
    """Fill `record["verdicts"][protocol]` where it is missing, an error, or from another grader; the other
    protocols' verdicts stay. Returns how many records were graded."""
    judge_model = getattr(judge, "model", None)
    todo = [record for record in records if needs_grading(record, protocol, judge_model)]
    if not todo:
        return 0
    uses = any(uses_judge(protocol, r["benchmark"]) for r in todo)
    if uses and judge is None:
        raise ValueError(f"--protocol {protocol} needs a judge for {todo[0]['benchmark']}.")

    def grade(record):
        if judge is None or not hasattr(judge, "record"):
            return grade_one(protocol, record, judge)
        # A record whose last verdict under this protocol was a judge error asks the judge again, past its cache
        fresh = bool((record.get("verdicts", {}).get(protocol) or {}).get("error"))
        with judge.record(fresh=fresh):
            return grade_one(protocol, record, judge)

    with ThreadPoolExecutor(max_workers=max(1, min(workers if uses else 1, len(todo)))) as pool:
        verdicts = list(pool.map(grade, todo))
    for record, verdict in zip(todo, verdicts):
        grader = grader_id(protocol, judge_model, record["benchmark"])
        record.setdefault("verdicts", {})[protocol] = {**verdict.as_dict(), "grader": grader}
    return len(todo)
