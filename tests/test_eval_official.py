"""Official secondary metrics: We-Math's four-dimensional metric and MathVista's calculate_score.py comparison, on
hand-made problems with hand-computed values, and their place in the summary beside the headline."""

import pytest

from vepo_trl.eval.benchmarks import BENCHMARKS
from vepo_trl.eval.official import (
    _levenshtein,
    mathvista_normalize,
    mathvista_official_correct,
    wemath_four_dimensional,
)
from vepo_trl.eval.table import official_lines, render_markdown, summarize_benchmark


T, F = True, False
# (ID, one-step verdicts by sub-problem (None: the row is missing), composite verdict (None: missing)) -> category
WEMATH_PROBLEMS = [
    ("2steps_1", [T, T], T),  # CM strict and loose
    ("2steps_2", [T, F], T),  # RM strict, CM loose
    ("2steps_3", [F, F], T),  # RM strict and loose
    ("2steps_4", [T, T], F),  # IG
    ("2steps_5", [F, T], F),  # IK
    ("3steps_6", [T, T, T], T),  # CM strict and loose
    ("3steps_7", [F, F, F], F),  # IK
    ("3steps_8", [T, F, T], T),  # RM strict, CM loose
    ("3steps_9", [T, T, T], None),  # no composite row: a problem in no category (NaN after the official merge)
    ("2steps_10", [F, None], F),  # no second sub-problem: IK still (the first is wrong)
]


def wemath_rows():
    rows = []
    for pid, subs, multi in WEMATH_PROBLEMS:
        steps = pid[0]
        rows += [(pid, f"{steps}steps_{i}", v) for i, v in enumerate(subs, 1) if v is not None]
        if multi is not None:
            rows.append((pid, f"{steps}steps_multi", multi))
    rows.append(("2steps_11", "2steps_multi", True))  # a composite without its sub-problems: no problem
    return rows


def test_wemath_four_dimensional_by_hand():
    result = wemath_four_dimensional(wemath_rows())
    assert result["problems"] == 10
    assert result["counts"] == {"IK": 3, "IG": 1, "CM_strict": 2, "CM_loose": 4, "RM_strict": 3, "RM_loose": 1}
    assert result["rates"] == pytest.approx(
        {"IK": 0.3, "IG": 0.1, "CM (strict)": 0.2, "RM (strict)": 3 / 5, "CM (loose)": 0.4, "RM (loose)": 1 / 5}
    )
    # (10 - 0.5 * 1 - RM - 3) / 10
    assert result["scores"] == pytest.approx({"Score (strict)": 0.35, "Score (loose)": 0.55})


def test_wemath_full_testmini_shape_gives_the_official_525():
    rows = [(f"2steps_{k}", key, True) for k in range(360) for key in ("2steps_1", "2steps_2", "2steps_multi")]
    rows += [(f"3steps_{k}", f"3steps_{s}", k % 2 == 0) for k in range(165) for s in ("1", "2", "3", "multi")]
    result = wemath_four_dimensional(rows)
    assert result["problems"] == 525 and len(rows) == 1740
    # 83 three-step problems all right (CM), 82 all wrong (IK): score (525 - 82) / 525
    assert result["counts"]["CM_strict"] == 360 + 83 and result["counts"]["IK"] == 82
    assert result["scores"]["Score (strict)"] == pytest.approx((525 - 82) / 525)
    assert result["rates"]["RM (loose)"] == 0.0


def test_wemath_without_a_whole_problem_is_none():
    assert wemath_four_dimensional([("3steps_165", "3steps_3", True), ("3steps_165", "3steps_multi", False)]) is None


def test_levenshtein():
    assert _levenshtein("kitten", "sitting") == 3 and _levenshtein("", "abc") == 3 and _levenshtein("ab", "ab") == 0


@pytest.mark.parametrize(
    "extraction, question_type, answer_type, precision, expected",
    [
        ("1.20", "free_form", "float", 1.0, "1.2"),  # trailing zero: equal after rounding
        ("1.24", "free_form", "float", 1.0, "1.2"),  # rounded to the precision
        ("1.26", "free_form", "float", 1.0, "1.3"),
        ("1.450", "free_form", "float", 2.0, "1.45"),
        ("1.2 N/cm", "free_form", "float", 1.0, None),  # not a number: no prediction
        ("3.0", "free_form", "integer", None, "3"),
        ("3.7", "free_form", "integer", None, "3"),  # int(float(x)) truncates, as the official
        ("three", "free_form", "integer", None, None),
        ("[2007, 2008]", "free_form", "list", None, "[2007, 2008]"),
        ("B", "multi_choice", "text", None, "square"),  # letter -> option text
        ("(B) square", "multi_choice", "text", None, "square"),
        ("squares", "multi_choice", "text", None, "square"),  # text -> the closest option
        ("A", "multi_choice", "text", None, "circle"),
        ("", "multi_choice", "text", None, "circle"),  # empty: equally far from both, the first wins
    ],
)
def test_mathvista_normalize(extraction, question_type, answer_type, precision, expected):
    choices = ["circle", "square"] if question_type == "multi_choice" else None
    assert mathvista_normalize(extraction, choices, question_type, answer_type, precision) == expected


def mathvista_record(gold, extracted, question_type="free_form", answer_type="float", precision="1", choices=None):
    return {"gold": gold, "choices": choices, "extracted": extracted, "correct": extracted == gold,
            "groups": {"question_type": question_type, "answer_type": answer_type, "precision": precision}}  # fmt: skip


def test_mathvista_official_against_the_exact_match_headline():
    # The headline (the release's exact match) and the official comparison disagree where precision or text matters
    records = [
        mathvista_record("1.2", "1.20"),  # headline wrong, official right
        mathvista_record("1.2", "1.2"),  # both right
        mathvista_record("3", "3.0", answer_type="integer", precision=""),  # headline wrong, official right
        mathvista_record("B", "square", "multi_choice", "text", "", ["circle", "square"]),  # text for the letter
        mathvista_record("B", "A", "multi_choice", "text", "", ["circle", "square"]),  # both wrong
        mathvista_record("1.2", None),  # no extraction: wrong
    ]
    assert [mathvista_official_correct(r, r["extracted"]) for r in records] == [T, T, T, T, F, F]
    official = BENCHMARKS["mathvista"].official_metrics(records)
    assert official["correct"] == 4 and official["examples"] == 6 and official["accuracy"] == pytest.approx(4 / 6)
    # An unreadable image is wrong whatever its stored extraction
    assert not BENCHMARKS["mathvista"].official_metrics([{**records[1], "error": "unusable image"}])["correct"]
    # Records written before the answer type was stored get no official score (rather than a wrong one)
    assert BENCHMARKS["mathvista"].official_metrics([{**records[0], "groups": {}}]) is None


def _wemath_records():
    return [
        {"id": f"{pid}@{key}", "verdicts": {"paper": {"correct": v, "extracted": "A"}}, "rule_correct": v,
         "categories": {}, "groups": {"wemath_id": pid, "wemath_key": key}}
        for pid, key, v in wemath_rows()
    ]  # fmt: skip


def test_official_metrics_are_not_computed_on_a_partial_run():
    # A --limit 3 We-Math run printed four-dimensional scores of 100.00 beside a 33.33 headline: a slice of the split
    summary = summarize_benchmark("wemath", _wemath_records(), {"examples": 1740, "limit": 3}, "paper")
    assert summary["partial"] and summary["official"]["skipped"] == "partial run"
    lines = official_lines({**summary, "title": "We-Math"})
    assert lines == ["- We-Math: **We-Math four-dimensional** not computed: partial run (it scores the whole split)."]


def test_summary_shows_both_beside_the_headline(standins_as_full_splits):
    wemath = [
        {"id": f"{pid}@{key}", "verdicts": {"paper": {"correct": v, "extracted": "A"}}, "rule_correct": v,
         "categories": {}, "groups": {"wemath_id": pid, "wemath_key": key}}
        for pid, key, v in wemath_rows()
    ]  # fmt: skip
    mathvista = [
        {**r, "verdicts": {"paper": {"correct": r["extracted"] == r["gold"], "extracted": r["extracted"]}},
         "rule_correct": False, "categories": {}}
        for r in (mathvista_record("1.2", "1.20"), mathvista_record("1.2", "1.2"), mathvista_record("1.2", "7"))
    ]  # fmt: skip
    summaries = {
        "mathvista": summarize_benchmark("mathvista", mathvista, 3, "paper"),
        "wemath": summarize_benchmark("wemath", wemath, len(wemath), "paper"),
    }
    assert summaries["mathvista"]["accuracy"] == pytest.approx(33.33)  # the headline stays the exact match
    assert summaries["mathvista"]["official"]["accuracy"] == pytest.approx(66.67)
    assert summaries["mathvista"]["official"]["protocol"] == "paper"
    official = summaries["wemath"]["official"]
    assert official["scores"] == {"Score (strict)": 35.0, "Score (loose)": 55.0} and official["problems"] == 10
    assert official["rates"]["RM (strict)"] == 60.0 and official["counts"]["IK"] == 3
    summary = {"model": "m", "benchmarks": summaries, "generation": {"max_new_tokens": 2048, "min_pixels": 1,
               "max_pixels": 2}, "grading": {"protocol": "paper", "grader_version": 1, "judge_model": "gpt-4o-mini"},
               "table": {"this_run": [None] * 8, "paper_model": None, "paper": {}}}  # fmt: skip
    markdown = render_markdown(summary)
    assert "Official secondary metrics (beside the headline, not in Table 1):" in markdown
    assert "- MathVista: **MathVista official score** (lupantech/MathVista evaluation/calculate_score.py" in markdown
    assert "on the `paper` verdicts): 66.67 (2 / 3), beside the headline's 33.33." in markdown
    assert (
        "- We-Math: **We-Math four-dimensional** (We-Math/We-Math evaluation/four_dimensional_metrics.py; on the "
        "`paper` verdicts, 10 problems): Score (strict) 35.00, Score (loose) 55.00; IK 30.00 (3), IG 10.00 (1), "
        "CM (strict) 20.00 (2), RM (strict) 60.00 (3), CM (loose) 40.00 (4), RM (loose) 20.00 (1)." in markdown
    )
    # A benchmark with rows still to grade gets no official metric, like its headline
    wemath[0]["verdicts"]["paper"] = {"correct": None, "error": "HTTP 500"}
    assert "official" not in summarize_benchmark("wemath", wemath, len(wemath), "paper")


def test_mathvista_letter_only_options_keep_their_choices():
    """15 testmini items have the option letters as their options' text (choices "A".."D", answer "B"); without
    the choices stored, calculate_score could not map an extracted letter and marked every one wrong."""
    row = {"pid": "7", "query": "Which one? Choices: (A) (B) (C) (D)", "answer": "B", "question_type": "multi_choice",
           "answer_type": "text", "precision": None, "choices": ["A", "B", "C", "D"], "metadata": {"task": "x"}}  # fmt: skip
    example = BENCHMARKS["mathvista"].to_example(row, 0, None)
    assert example.gold == "B" and example.choices == ["A", "B", "C", "D"]
    record = {"gold": example.gold, "choices": example.choices, "groups": example.groups}
    assert mathvista_official_correct(record, "B") and not mathvista_official_correct(record, "C")
