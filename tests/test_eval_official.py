"""Official secondary metrics: We-Math's four-dimensional metric and MathVista's calculate_score.py comparison, on
hand-made problems with hand-computed values, and their place in the summary beside the headline."""

import pytest

from vepo_trl.eval.official import _levenshtein, mathvista_normalize, wemath_four_dimensional


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
