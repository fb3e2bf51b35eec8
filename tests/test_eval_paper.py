r"""The paper protocol against a real HTTP openai_server on 127.0.0.1 speaking OpenAI's chat-completions API, through the
`openai` client: quoted model outputs replayed through each of the release's judge procedures (Leonnnnnn929/VEPO
@4247308 eval/utils/model_parser.py `llm_eval_score`), asserting the verdicts that code gives for the judge's
scripted replies, beside the lenient judge's and the rule's. Geometry3K against mathruler on generated answers.

The judge's replies are scripted per prompt: an extraction prompt is answered by what the quoted response says
(as gpt-4o-mini does), so what is tested is the procedure around the judge, not the judge.
"""

import itertools

import pytest
from mathruler.grader import extract_boxed_content, grade_answer

from vepo_trl.eval.grading import grade_one, grade_records, rule_grade
from vepo_trl.eval.judge import LLMJudge
from vepo_trl.eval.paper import (
    MMK12_PROMPT,
    build_extract_prompt,
    build_mathverse_extract_prompt,
    build_score_prompt,
    build_wemath_extract_prompt,
    paper_grade,
    release_boxed,
)
from vepo_trl.eval.standins import MATHVISTA_QUERY_1

from .support import SECRET


@pytest.fixture
def judge(openai_server, monkeypatch):
    monkeypatch.setenv("VEPO_TEST_JUDGE_KEY", SECRET)
    return LLMJudge("gpt-4o-mini", base_url=openai_server.base_url, api_key_env="VEPO_TEST_JUDGE_KEY", max_retries=0)


def scripted(openai_server, replies):
    """Reply `replies[key]` to the prompt whose model-response part holds `key` (the release's prompts put it last)."""

    def respond(prompt):
        tail = prompt.rsplit("Model respone: ", 1)[-1].rsplit("Model response: ", 1)[-1]
        tail = tail.rsplit("[Model_answer]: ", 1)[-1].rsplit("Model's solution:", 1)[-1].rsplit("Solution: ", 1)[-1]
        tail = tail.rsplit("Model response:\n", 1)[-1]  # the lenient prompt
        for key, reply in replies.items():
            if key in tail:
                return reply
        raise AssertionError(f"unscripted prompt tail: {tail[:120]!r}")

    openai_server.respond = respond


def record(benchmark, completion, gold, question="", choices=None):
    return {"benchmark": benchmark, "completion": completion, "gold": gold, "judge_question": question,
            "choices": choices}  # fmt: skip


def verdicts(rec, judge):
    return {protocol: grade_one(protocol, rec, judge).correct for protocol in ("rule", "lenient", "paper")}


# -- MathVista / MathVision: extraction without the gold, then an exact string match -----------------------------------

MATHVISTA_CASES = [
    # (response, gold, choices, judge's extraction, lenient judge's reply, expected verdicts)
    # The precision hint asks for one decimal; "1.20" is extracted as written and is not the string "1.2"
    ("<think>W = 1/2 k x^2 = 1.2 J</think> The work is \\boxed{1.20}", "1.2", None, "1.20",
     "Extracted: 1.20\nJudgement: 1", {"rule": True, "lenient": True, "paper": False}),
    # The choice's text, not its letter: the release compares with the letter
    ("<think>four equal sides and right angles</think> \\boxed{square}", "B", ["circle", "square"], "square",
     "Extracted: square\nJudgement: 1", {"rule": True, "lenient": True, "paper": False}),
    # No box (the rule's requirement), but a clear final value: the release's extraction finds it
    ("<think>W = 1.2 J</think> So the work done is 1.2", "1.2", None, "1.2",
     "Extracted: 1.2\nJudgement: 1", {"rule": False, "lenient": True, "paper": True}),
    # A letter, as asked
    ("<think>...</think> \\boxed{B}", "B", ["circle", "square"], "B",
     "Extracted: B\nJudgement: 1", {"rule": True, "lenient": True, "paper": True}),
]  # fmt: skip


@pytest.mark.parametrize("benchmark", ["mathvista", "mathvision"])
@pytest.mark.parametrize("response, gold, choices, extraction, lenient, expected", MATHVISTA_CASES)
def test_mathvista_and_mathvision_extract_then_exact_match(
    benchmark, response, gold, choices, extraction, lenient, expected, openai_server, judge
):
    rec = record(benchmark, response, gold, MATHVISTA_QUERY_1, choices)
    scripted(openai_server, {response: extraction})
    paper = grade_one("paper", rec, judge)
    assert (paper.correct, paper.extracted, paper.error) == (expected["paper"], extraction, None)
    # One request: the release's extraction prompt, which holds the query (hint, choices) and never the gold
    (request,) = openai_server.requests
    prompt = request["body"]["messages"][0]["content"]
    assert prompt == build_extract_prompt(response, MATHVISTA_QUERY_1)
    assert request["body"]["temperature"] == 0.0 and "max_tokens" not in request["body"]
    assert "one decimal place" in prompt and prompt.endswith(f"Model respone: {response}Extracted answer:")
    scripted(openai_server, {response: lenient})
    assert verdicts(rec, judge) | {"paper": paper.correct} == expected


# -- MathVerse: last \boxed{} (regex [^}]+) or LLM extraction, then the official scoring prompt -----------------------

MATHVERSE_QUESTION = (
    "In triangle ABC, angle A = 80.0, angle B = 60.0, DE parallel BC, then the size of angle CED is ()"
)


def test_mathverse_boxed_answer_goes_straight_to_the_scoring_prompt(openai_server, judge):
    response = "<think>angle C = 40, CED = 180 - 40</think> \\boxed{D}"
    scripted(openai_server, {"D\n": "1"})
    verdict = grade_one("paper", record("mathverse", response, "D", MATHVERSE_QUESTION), judge)
    assert (verdict.correct, verdict.extracted) == (True, "D")
    (request,) = openai_server.requests  # no extraction call: the box was read by the release's regex
    assert request["body"]["messages"][0]["content"] == build_score_prompt(MATHVERSE_QUESTION, "D", "D")
    assert (
        f"[Question]: {MATHVERSE_QUESTION}\n    [Standard Answer]: D\n    [Model_answer]: D\n"
        in (request["body"]["messages"][0]["content"])
    )


def test_mathverse_nested_braces_are_cut_by_the_release_regex(openai_server, judge):
    # `\\boxed{([^}]+)}` stops at the first "}": the scorer sees "\frac{1", and says 0; the rule reads the whole box
    response = "<think>...</think> \\boxed{\\frac{1}{2}}"
    assert release_boxed(response) == "\\frac{1"
    scripted(openai_server, {"\\frac{1\n": "0"})
    rec = record("mathverse", response, "0.5", "Find the ratio.")
    assert grade_one("paper", rec, judge).correct is False
    assert rule_grade(response, "0.5") == ("\\frac{1}{2}", True)


def test_mathverse_unboxed_answer_is_extracted_by_the_judge_then_scored(openai_server, judge):
    response = "<think>...</think> Therefore angle CED = 140°, which is option D."
    scripted(openai_server, {f"'{response}'": "D", "D\n": "1"})
    verdict = grade_one("paper", record("mathverse", response, "D", MATHVERSE_QUESTION), judge)
    assert (verdict.correct, verdict.extracted, verdict.note) == (True, "D", "extracted by the judge")
    extract, score = (r["body"]["messages"][0]["content"] for r in openai_server.requests)
    assert extract == build_mathverse_extract_prompt(response) and score == build_score_prompt(
        MATHVERSE_QUESTION, "D", "D"
    )
    assert rule_grade(response, "D", ["40°", "60°", "120°", "140°"]) == (None, False)  # the rule needs a box


def test_mathverse_three_unusable_scores_are_zero_as_released(openai_server, judge):
    scripted(openai_server, {"7\n": "The answer is consistent."})
    verdict = grade_one("paper", record("mathverse", "\\boxed{7}", "7", "q"), judge)
    assert verdict.correct is False and verdict.error is None and "no 0/1 in 3 replies" in verdict.note
    assert len(openai_server.requests) == 3


# -- We-Math: one letter extracted, then an exact match --------------------------------------------------------------

WEMATH_QUESTION = "what is the area of the flower bed (  ) m²?(π = 3.14)\n\nOptions: A. 200.96;B. 3215.36;C. 6280"


@pytest.mark.parametrize(
    "response, extraction, expected",
    [
        ("<think>r = 32, S = 3215.36</think> \\boxed{B}", "B", {"rule": True, "lenient": True, "paper": True}),
        ("<think>...</think> \\boxed{B}", "b", {"rule": True, "lenient": True, "paper": True}),  # upper-cased
        # The extractor answered "B." (not one letter): the release's ^[A-G]$ check fails it
        ("<think>...</think> \\boxed{3215.36}", "B.", {"rule": True, "lenient": True, "paper": False}),
        # Unboxed but clear: the extraction reads it, the rule cannot
        ("<think>...</think> The area is 3215.36, option B", "B", {"rule": False, "lenient": True, "paper": True}),
        ("<think>...</think> \\boxed{A}", "A", {"rule": False, "lenient": False, "paper": False}),
    ],
)
def test_wemath_single_letter(response, extraction, expected, openai_server, judge):
    rec = record("wemath", response, "B", WEMATH_QUESTION, ["200.96", "3215.36", "6280"])
    scripted(openai_server, {response: extraction})
    paper = grade_one("paper", rec, judge)
    (request,) = openai_server.requests
    assert request["body"]["messages"][0]["content"] == build_wemath_extract_prompt(response, WEMATH_QUESTION)
    assert "<image>" not in request["body"]["messages"][0]["content"]
    lenient = "Extracted: B\nJudgement: 1" if expected["lenient"] else "Extracted: A\nJudgement: 0"
    scripted(openai_server, {response: lenient})
    assert verdicts(rec, judge) | {"paper": paper.correct} == expected


# -- MMK12: MM-EUREKA's yes/no judge -----------------------------------------------------------------------------------


def test_mmk12_yes_no_judge_retries_with_rising_temperature(openai_server, judge):
    scripted(openai_server, {"\\boxed{B}": "Yes", "\\boxed{C}": "It is hard to say."})
    right = grade_one("paper", record("mmk12", "<think>...</think> \\boxed{B}", "B", "Which angle?"), judge)
    assert right.correct is True and len(openai_server.requests) == 1
    body = openai_server.requests[0]["body"]
    assert body["messages"][0]["content"] == MMK12_PROMPT.format(
        question="Which angle?", answer="B", solution="<think>...</think> \\boxed{B}"
    )
    assert body["max_tokens"] == 256 and body["temperature"] == 0.0
    openai_server.requests.clear()
    unclear = grade_one("paper", record("mmk12", "\\boxed{C}", "B", "Which angle?"), judge)
    assert unclear.correct is False and unclear.error is None  # MM-EUREKA's fallback is "no"
    assert [r["body"]["temperature"] for r in openai_server.requests] == [0.0, 0.5, 1.0, 1.5, 2.0]


# -- Judge failures are errors, never verdicts -------------------------------------------------------------------------


def test_judge_failure_is_an_error_and_is_graded_again(openai_server, judge):
    records = [record("mathvista", "\\boxed{1.2}", "1.2", MATHVISTA_QUERY_1),
               record("mathverse", "\\boxed{D}", "D", MATHVERSE_QUESTION)]  # fmt: skip
    openai_server.respond = lambda prompt: "500"
    assert grade_records(records, "paper", judge, workers=2) == 2
    assert [r["verdicts"]["paper"]["correct"] for r in records] == [None, None]
    assert [r["verdicts"]["paper"]["error"] for r in records] == ["HTTP 500", "HTTP 500"]
    scripted(openai_server, {"\\boxed{1.2}": "1.2", "D\n": "1"})
    assert grade_records(records, "paper", judge) == 2  # both again
    assert [r["verdicts"]["paper"]["correct"] for r in records] == [True, True]
    assert grade_records(records, "paper", judge) == 0  # nothing left to grade
    grade_records(records, "rule", None)
    assert set(records[0]["verdicts"]) == {"paper", "rule"}  # every protocol's verdict is kept


# -- The rule-graded columns -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "response, gold, paper, rule",
    [
        ("<think>same size</think> \\boxed{Yes}", "yes", True, True),  # lower-cased
        ("\\boxed{\\text{yes}}", "yes", False, True),  # the release compares the box's text as is
        ("Yes, the circles are the same size.", "yes", False, False),  # no box
        ("\\boxed{no}.", "yes", False, False),
        ("\\boxed{} so \\boxed{no}", "no", True, True),  # empty boxes dropped first
        ("\\boxed{No.}", "no", False, True),
    ],
)
def test_hallusionbench_exact_lowercased_box(response, gold, paper, rule):
    assert paper_grade("hallusionbench", response, gold, "", None).correct is paper
    assert rule_grade(response, gold)[1] is rule


GEO3K_GOLDS = ["3", "120", "12 \\pi", "2 \\sqrt { 221 }", "4.5", "\\frac { 3 } { 2 }", "8 \\sqrt { 3 }", "60",
               "17.3", "\\frac { 40 } { 3 }"]  # fmt: skip
GEO3K_ANSWERS = ["3", "3.0", "120^\\circ", "120", "12\\pi", "12 \\pi", "37.7", "2\\sqrt{221}", "\\sqrt{884}", "29.7",
                 "4.5", "9/2", "\\frac{9}{2}", "1.5", "\\frac{3}{2}", "3/2", "8\\sqrt{3}", "13.86", "60", "60.0",
                 "17.3", "17.32", "\\frac{40}{3}", "13.33", "x = 3", "\\text{A}", ""]  # fmt: skip
GEO3K_WRAPPERS = ["<think>...</think> \\boxed{{{}}}", "The answer is {}", "\\boxed{{{}}} then \\boxed{{7}}",
                  "  \\boxed{{{}}}  \n", "\\boxed{{{}"]  # fmt: skip


def test_geometry3k_equals_mathruler_on_generated_answers():
    cases = [(wrap.format(answer), gold) for gold, answer, wrap in
             itertools.product(GEO3K_GOLDS, GEO3K_ANSWERS, GEO3K_WRAPPERS)]  # fmt: skip
    assert len(cases) >= 300
    right = 0
    for completion, gold in cases:
        release = grade_answer(extract_boxed_content(completion.strip()), gold)
        ours = grade_one("paper", record("geometry3k", completion, gold), None).correct
        assert ours == release, (completion, gold)
        right += release
    assert 0 < right < len(cases)  # both outcomes exercised
