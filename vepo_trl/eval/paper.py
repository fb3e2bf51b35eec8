r"""The VEPO release's grading, procedure for procedure: what `--protocol paper` runs.

Ported from the authors' release, Leonnnnnn929/VEPO @4247308 (`eval/utils/model_parser.py` and
`eval/utils/processing.py`, NoisyRollout's `eval/` with an OpenAI-compatible gpt-4o-mini judge set in `run_eval.sh`):

- Geometry3K: mathruler `extract_boxed_content` + `grade_answer` (the same functions, so identical by construction).
- HallusionBench: the lower-cased last `\boxed{}` (after dropping empty `\boxed{}`) must equal "yes" / "no" exactly.
- MathVista, MathVision: the judge extracts the answer from the response *without the gold* (MathVista's in-context
  extraction prompt), and the stripped extraction must equal the gold string exactly.
- MathVerse: the last `\boxed{...}` (regex `[^}]+`), or the judge's extraction when there is none, is scored 0/1 by the
  official MathVerse prompt against `question_for_eval`; up to three tries for a "0"/"1", else 0.
- We-Math: the judge extracts a single letter; it counts when it is one of A-G and equals the gold letter.
- MMK12 (not in the release; see `MMK12_NOTE`): MM-EUREKA's `eval/k12/extract_calculate.py` yes/no judge.

The prompts are copied verbatim (typos included: "respone", "Judement"), since a judge's verdicts depend on them.
Every judge call goes through a `complete(prompt, temperature)` function; a transport failure (timeout, HTTP error,
connection) raises `JudgeCallError`, which the caller records as an error on the row, never as a verdict.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass


__all__ = [
    "GRADER_VERSION",
    "MMK12_NOTE",
    "MMK12_PROMPT",
    "JudgeCallError",
    "Verdict",
    "build_extract_prompt",
    "build_mathverse_extract_prompt",
    "build_mmk12_prompt",
    "build_score_prompt",
    "build_wemath_extract_prompt",
    "paper_grade",
    "release_boxed",
]

# Bump when a procedure below changes: stored verdicts record the version that gave them.
GRADER_VERSION = 1


class JudgeCallError(RuntimeError):
    """A judge request that got no answer (timeout, HTTP status, connection); the row stays ungraded."""


# ----------------------------------------------------------------------------------------------------------------------
# Prompts, verbatim from Leonnnnnn929/VEPO @4247308 eval/utils/model_parser.py (lines 25-209)
# ----------------------------------------------------------------------------------------------------------------------


def get_gpt4_ICE():
    example_1 = """
Hint: Please answer the question requiring an integer answer and provide the final value,
e.g., 1, 2, 3, at the end.\n
Question: Which number is missing?\n
Model response: The number missing in the sequence is 14.\n
Extracted answer: 14
"""

    example_2 = """
Hint: Please answer the question requiring a floating-point number with one decimal place and provide the final value,
e.g., 1.2, 1.3, 1.4, at the end.\n
Question: What is the fraction of females facing the camera?\n
Model response: The fraction of females facing the camera is 0.6,
which means that six out of ten females in the group are facing the camera.\n
Extracted answer: 0.6
"""

    example_3 = """
Hint: Please answer the question requiring a floating-point number with two decimal places and provide the final value,
e.g., 1.23, 1.34, 1.45, at the end.\n
Question: How much money does Luca need to buy a sour apple candy and a butter-scotch candy? (Unit: $)\n
Model response: Luca needs $1.45 to buy a sour apple candy and a butterscotch candy.\n
Extracted answer: 1.45
"""

    example_4 = """
Hint: Please answer the question requiring a Python list as an answer and provide the final list,
e.g., [1, 2, 3], [1.2, 1.3, 1.4], at the end.\n
Question: Between which two years does the line graph saw its maximum peak?\n
Model response: The line graph saw its maximum peak between 2007 and 2008.\n
Extracted answer: [2007, 2008]
"""

    example_5 = """
Hint: Please answer the question and provide the correct option letter, e.g., A, B, C, D, at the end.\n
Question: What fraction of the shape is blue?\n
Choices: (A) 3/11 (B) 8/11 (C) 6/11 (D) 3/5\n
Model response: The correct answer is (B) 8/11.\n
Extracted answer: B
"""

    return [example_1, example_2, example_3, example_4, example_5]


def get_gpt4_score_ICE():
    example_1 = """
[Question]: Write the set of numbers represented on the number line in interval notation.
[Standard Answer]: (-2,1]
[Model_answer]: Extracted Answer: \\((-2, 1)\\)
Judgement: 0
"""  # noqa

    example_2 = """
[Question]: As shown in the figure, circle O has a radius 1.0, if angle BAC = 60.0, then the length of BC is ()\nChoices:\nA:2\nB:2\u221a{{3}}\nC:\u221a{{3}}\nD:2\u221a{{2}}
[Standard Answer]: C
[Model_answer]: B:2\u221a{{3}}
Judgement: 0
"""  # noqa

    example_3 = """
[Question]: Find the domain and range of the function f using interval notation.
[Standard Answer]: domain: [-4, 0) and range: (-3, 1]
[Model_answer]: Range: \\((-4, 1]\\)
Judgement: 0
"""  # noqa

    example_4 = """
[Question]: As shown in the figure, circle O has a radius 1.0, if angle BAC = 60.0, then the length of BC is ()\nChoices:\nA:2\nB:2\u221a{{3}}\nC:\u221a{{3}}\nD:2\u221a{{2}}
[Standard Answer]: C
[Model_answer]: null
Judgement: 0
"""  # noqa

    example_4 = """
[Question]: As shown in the figure, circle O has a radius 1.0, if angle BAC = 60.0, then the length of BC is ()\nChoices:\n(A):2\n(B):2\u221a{{3}}\n(C):\u221a{{3}}\n(D):2\u221a{{2}}
[Standard Answer]: (C)
[Model_answer]: C
Judgement: 1
"""  # noqa
    return [example_1, example_2, example_3, example_4]


def get_gpt4_extract_ICE():
    example_1 = """
1.
Model response: 'Rounded to two decimal places, the perimeter of the sector is approximately:\n\n(-2, 1)'
Extracted Answer: (-2, 1)
"""  # noqa

    example_2 = """
2.
Model response: 'at those points.\n\nTherefore, the correct option that represents the meaning of the intersection points of the graphs is:\n\nD. They give the solutions to the equation $f(t)=g(t)$.",'
Extracted Answer: D
"""  # noqa

    example_3 = """
3.
Model response: ' at 1 (there's a closed circle at y = 1), the range in interval notation is \\((-4, 1]\\).\n\nFinal values:\nDomain: \\((-3, 3]\\)\nRange: \\((-4, 1]\\)'
Extracted Answer: Domain: \\((-3, 3]\\)\nRange: \\((-4, 1]\\)
"""  # noqa

    example_4 = """
4.
Model response: 'As it stands, I cannot provide the correct option letter because there isn't enough information to solve for 'y'.'
Extracted Answer: null
"""  # noqa

    example_5 = """
5.
Model response: 'Given that AB = 17.6 meters, we can now substitute into the equation:\n\nd = 17.6 / cos(38\u00b0)\n\nTherefore, to one decimal place, the distance d between Ned and Bart is approximately 22.3 meters.'
Extracted answer: 22.3
"""  # noqa

    example_6 = """
6.
Model response:  have all the coefficients for the quadratic function:\n\\( f(x) = ax^2 + bx + c \\)\n\\( f(x) = -1x^2 - 2x + 1 \\)\n\nTherefore, the equation for the graphed function \\( f \\) is:\n\\( f(x) = -x^2 - 2x + 1 \\)"'
Extracted answer: f(x) = -x^2 - 2x + 1
"""  # noqa

    return [example_1, example_2, example_3, example_4, example_5, example_6]


def build_score_prompt(question, extract, answer):
    task_description = """
Below are two answers to a math question. Question is [Question], [Standard Answer] is the standard answer to the question, and [Model_answer] is the answer extracted from a model's output to this question.  Determine whether these two answers are consistent.
Please note that only when the [Model_answer] completely matches the [Standard Answer] means they are consistent. For non-multiple-choice questions, if the meaning is expressed in the same way, it is also considered consistent, for example, 0.5m and 50cm.
If they are consistent, Judement is 1; if they are different, Judement is 0.\n\n
"""  # noqa
    demo_prompt = task_description
    examples = get_gpt4_score_ICE()
    for example in examples:
        demo_prompt += example + "\n\n"
    test_prompt = f"""
    Please output the judgement score directly with no explanation.
    [Question]: {question}
    [Standard Answer]: {answer}
    [Model_answer]: {extract}
    Judgement:"""
    full_prompt = f"{demo_prompt}{test_prompt}"

    return full_prompt


def build_extract_prompt(prediction, question):
    task_description = """
Please read the following example.
Then output the answer extracted from the model response directly. No "Extracted answer:" in your answer.\n
"""
    prompt = task_description
    examples = get_gpt4_ICE()
    for example in examples:
        prompt += example + "\n"
    prompt += question + "\n"
    prompt += "Model respone: " + prediction
    prompt += "Extracted answer:"
    return prompt


def build_wemath_extract_prompt(extraction: str, question: str) -> str:
    prompt = f"""You are evaluating answers to math questions. Extract the final answer from the text.

Question: {question}

Model's solution:
{extraction}

Extract the final answer as a single letter (A, B, C, D, or E) without any explanation or other text.
If the final answer is not clear, make your best determination based on the reasoning provided.
Your output should be ONLY the letter corresponding to the answer choice.
"""
    return prompt


def build_mathverse_extract_prompt(prediction):
    task_description = """
I am providing you a response from a model to a math problem, termed 'Model Response'. You should extract the answer from the response as 'Extracted Answer'. Directly output the extracted answer with no explanation.\n\n
"""  # noqa
    demo_prompt = task_description
    examples = get_gpt4_extract_ICE()
    for example in examples:
        demo_prompt += example + "\n\n"
    test_prompt = f"Model response: '{prediction}'\nExtracted Answer: "
    full_prompt = f"{demo_prompt}7.\n{test_prompt}"

    return full_prompt


# The release's `extract_boxed_answer` (model_parser.py): the last `\boxed{...}` without nested braces, used by
# MathVerse only; Geometry3K and HallusionBench use mathruler's brace-matching `extract_boxed_content`.
_RELEASE_BOXED = re.compile(r"\\boxed{([^}]+)}")


def release_boxed(text: str) -> str | None:
    matches = _RELEASE_BOXED.findall(text)
    return matches[-1].strip() if matches else None


# ----------------------------------------------------------------------------------------------------------------------
# MMK12: not in the release. MM-EUREKA's yes/no judge (ModalMinds/MM-EUREKA eval/k12/extract_calculate.py)
# ----------------------------------------------------------------------------------------------------------------------

MMK12_UNKNOWN = (
    "The paper's MMK12 protocol is unknown: the VEPO release has no MMK12 evaluation, the paper says only that "
    "gpt-4o-mini judged, and no single row count reproduces every MMK12 cell of Table 1."
)
MMK12_READING = (
    "This run reads FanqingM/MMK12 test (2,000 multiple-choice items, its authors' test split) and grades with "
    "MM-EUREKA's yes/no judge prompt (eval/k12), with the run's judge model (MM-EUREKA's default is gpt-4o)."
)
MMK12_NOTE = f"{MMK12_UNKNOWN} {MMK12_READING}"

# Verbatim, including "\b" in "\boxed", which Python reads as a backspace character: the byte the MM-EUREKA judge got.
MMK12_PROMPT = """You are given a question, the solution and the correct answer. Please determine if the solution matches the correct answer.
Focus only on the mathematical or semantic correctness of the content. Ignore any differences in formatting, such as LaTeX syntax, symbols, styles, or additional wrappers (e.g., \boxed, $...$, or similar). Compare only the core mathematical or textual meaning of the solution and the correct answer.
The process or reasoning leading to the Solution is irrelevant, ONLY the correctness of the result matters.
Return only "Yes" if the solution is correct or "No" if it is incorrect.
Only return "Yes" or "No" with no additional text or formatting.

Question: 
{question}
--------------------------------
Correct Answer:
{answer}
--------------------------------
Solution: 
{solution}
--------------------------------
"""  # noqa: E501, W291
MMK12_TRIES = 5  # MM-EUREKA's `retry`, temperature 0.5 * attempt
MMK12_MAX_TOKENS = 256


def build_mmk12_prompt(question: str, answer: str, response: str) -> str:
    return MMK12_PROMPT.format(question=question, answer=answer, solution=str(response))


# ----------------------------------------------------------------------------------------------------------------------
# The procedures
# ----------------------------------------------------------------------------------------------------------------------

Complete = Callable[..., str]  # complete(prompt, temperature=0.0, max_tokens=None) -> the reply, stripped
PAPER_JUDGED = frozenset({"mathvista", "mathvision", "mathverse", "wemath", "mmk12"})
MATHVERSE_SCORE_TRIES = 3


@dataclass
class Verdict:
    """One grader's verdict on one record. `correct` is None only with an `error` (the row is still to grade)."""

    correct: bool | None
    extracted: str | None = None
    error: str | None = None
    note: str | None = None

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None or k == "correct"}


def paper_grade(benchmark: str, completion: str, gold: str, question: str, complete: Complete | None) -> Verdict:
    """The release's verdict on `completion` (see the module docstring); `complete` is needed for judged benchmarks."""
    from mathruler.grader import extract_boxed_content, grade_answer

    prediction = completion.strip()  # the release grades `output.outputs[0].text.strip()`
    if benchmark == "geometry3k":
        extracted = extract_boxed_content(prediction)  # "None" when there is no closed box, as in the release
        return Verdict(bool(grade_answer(extracted, gold)), extracted)
    if benchmark == "hallusionbench":
        extracted = extract_boxed_content(prediction.replace("\\boxed{}", ""))
        return Verdict(extracted.lower() == gold, extracted)
    if benchmark not in PAPER_JUDGED:
        raise ValueError(f"The paper protocol has no procedure for {benchmark!r}.")
    if complete is None:
        raise ValueError(f"{benchmark}: the paper protocol needs a judge.")
    try:
        if benchmark in ("mathvista", "mathvision"):
            extracted = complete(build_extract_prompt(prediction, question))
            return Verdict(extracted.strip() == gold, extracted)
        if benchmark == "wemath":
            extracted = complete(build_wemath_extract_prompt(prediction, question)).strip().upper()
            return Verdict(bool(re.match(r"^[A-G]$", extracted)) and extracted == gold, extracted)
        if benchmark == "mathverse":
            extracted = release_boxed(prediction)
            note = None
            if extracted is None:
                extracted, note = complete(build_mathverse_extract_prompt(prediction)), "extracted by the judge"
            prompt = build_score_prompt(question, extracted, gold)
            for _ in range(MATHVERSE_SCORE_TRIES):
                reply = complete(prompt).strip()
                if reply in ("0", "1"):
                    return Verdict(reply == "1", extracted, note=note)
            return Verdict(False, extracted, note=f"no 0/1 in {MATHVERSE_SCORE_TRIES} replies: scored 0, as released")
        # mmk12: MM-EUREKA grades the raw response (not stripped) and answers "no" after five unusable replies
        prompt = build_mmk12_prompt(question, gold, completion)
        failures = []
        for attempt in range(MMK12_TRIES):
            try:
                reply = complete(prompt, temperature=0.5 * attempt, max_tokens=MMK12_MAX_TOKENS).strip()
            except JudgeCallError as err:
                failures.append(str(err))
                continue
            if reply.lower() in ("yes", "no"):
                return Verdict(reply.lower() == "yes", reply)
        if failures:  # MM-EUREKA would say "no"; a judge that did not answer is an error here, retried later
            raise JudgeCallError(failures[-1])
        return Verdict(False, None, note=f"no yes/no in {MMK12_TRIES} replies: 'no', as MM-EUREKA does")
    except JudgeCallError as err:
        return Verdict(None, None, error=str(err))
