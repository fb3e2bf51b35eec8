r"""Tests for the rule-based rewards (0.9 * accuracy + 0.1 * format), on literal completions."""

import subprocess
import sys
import textwrap
import threading

import pytest
from math_verify.errors import TimeoutException

from vepo_trl import rewards
from vepo_trl.rewards import (
    PAPER_REWARD_FUNCS,
    PAPER_REWARD_WEIGHTS,
    REWARD_FUNCS,
    accuracy_reward,
    completion_to_text,
    extract_boxed_answer,
    format_reward,
    get_reward_funcs,
    grade_answer,
    register_reward,
)


def well_formatted(answer: str) -> str:
    return f"<think>\nLet me look at the figure.\nSo the value follows.\n</think>\nThe answer is \\boxed{{{answer}}}."


def accuracy(text: str, gold: str) -> float:
    return accuracy_reward([text], answer=[gold])[0]


# --------------------------------------------------------------------------------------------------------------------
# extract_boxed_answer
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{3}.", "3"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{\frac{\sqrt{3}}{2}} done", r"\frac{\sqrt{3}}{2}"),
        (r"first \boxed{1}, on second thought \boxed{2}", "2"),
        (r"\boxed {3}", "3"),
        (r"\fbox{7}", "7"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"\boxed{\left\{ 1, 2 \right.}", r"\left\{ 1, 2 \right."),  # escaped braces do not nest
        (r"\boxed{ 4 }", "4"),
        (r"\boxed{}", ""),
        (r"\boxed{\boxed{5}}", "5"),
        ("no box here", None),
        (r"\boxed{3", None),
        (r"\boxed{2} but then \boxed{", None),
        ("", None),
    ],
)
def test_extract_boxed_answer(text, expected):
    assert extract_boxed_answer(text) == expected


def test_extract_boxed_answer_non_string_is_none():
    assert extract_boxed_answer(None) is None


# --------------------------------------------------------------------------------------------------------------------
# accuracy
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("boxed", "gold"),
    [
        ("3", "3"),
        ("46.1", "46.1"),
        ("46.10", "46.1"),
        (r"2\sqrt{221}", r"2\sqrt{221}"),
        (r"2 \sqrt{221}", r"2\sqrt{221}"),
        (r"\frac{1}{2}", "0.5"),
        ("0.5", r"\frac{1}{2}"),
        (r"\dfrac{2}{4}", r"\frac{1}{2}"),
        (r"\sqrt{12}", r"2\sqrt{3}"),
        (r"2\sqrt{3}", r"\sqrt{12}"),
        (r"45^\circ", "45"),
        ("45", r"45^\circ"),
        ("x = 3", "3"),
        ("3", "x=3"),
        ("$4$", "4"),
        (r"10 \text{ cm}", "10"),
        (r"25\%", "0.25"),
        (r"\text{right triangle}", "right triangle"),
        ("3.", "3"),
    ],
)
def test_accuracy_equivalent_forms(boxed, gold):
    assert accuracy(well_formatted(boxed), gold) == 1.0


@pytest.mark.parametrize(
    ("boxed", "gold"),
    [
        ("4", "3"),
        ("46.2", "46.1"),
        (r"\frac{1}{3}", "0.5"),
        (r"2\sqrt{3}", r"3\sqrt{2}"),
        ("29.73", r"2\sqrt{221}"),  # decimal approximations of surds are not accepted
        ("", "3"),
    ],
)
def test_accuracy_wrong_answers(boxed, gold):
    assert accuracy(well_formatted(boxed), gold) == 0.0


def test_accuracy_last_box_wins():
    assert accuracy(r"\boxed{3} no wait, it is \boxed{4}", "4") == 1.0
    assert accuracy(r"\boxed{3} no wait, it is \boxed{4}", "3") == 0.0


def test_accuracy_nested_braces():
    assert accuracy(r"<think>x</think> \boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt{3}}{2}") == 1.0


@pytest.mark.parametrize(
    "text",
    ["The answer is 3.", r"The answer is \boxed{3", "", "   ", r"\boxed{}", r"<think>3</think> 3"],
)
def test_accuracy_without_usable_box_is_zero(text):
    # "3" appears in every text: only a closed \boxed{} counts as the answer.
    assert accuracy(text, "3") == 0.0


def test_accuracy_boxed_with_space_and_fbox():
    assert accuracy(r"so \boxed {3}", "3") == 1.0
    assert accuracy(r"so \fbox{3}", "3") == 1.0


@pytest.mark.parametrize(
    ("boxed", "gold"),
    [
        ("√3", r"\sqrt{3}"),
        (r"\sqrt{3}", "√3"),
        ("2√3", r"2\sqrt{3}"),
        ("√(12)", r"2\sqrt{3}"),
        ("π", r"\pi"),
        ("6π", r"6\pi"),
        ("３", "3"),
        ("４６.１", "46.1"),
        ("x²", "x^2"),
        ("60°", "60"),
        ("−2", "-2"),
    ],
)
def test_accuracy_unicode(boxed, gold):
    assert accuracy(rf"\boxed{{{boxed}}}", gold) == 1.0


def test_accuracy_unicode_wrong_answer():
    assert accuracy(r"\boxed{√2}", r"\sqrt{3}") == 0.0
    assert accuracy("\\boxed{π} ☃ ∮ 𝔸", "3") == 0.0


@pytest.mark.parametrize("gold", ["B", "(B)", "B.", "[B]"])
@pytest.mark.parametrize(
    "boxed",
    ["B", "b", "(B)", "(b)", "B.", r"B. 45^\circ", r"(B) 45", "(b) 45", "Answer: B", r"\text{B}", r"\text{(B)}"],
)
def test_accuracy_multiple_choice_right_letter(gold, boxed):
    assert accuracy(rf"<think>...</think> \boxed{{{boxed}}}", gold) == 1.0


@pytest.mark.parametrize(
    "boxed", ["C", "c", "(C)", r"\text{C}", "B, C", "B and C", "(B) and (C)", "45", "", "A = 3", "b triangle"]
)
def test_accuracy_multiple_choice_wrong_or_no_letter(boxed):
    assert accuracy(rf"\boxed{{{boxed}}}", "B") == 0.0


def test_accuracy_multiple_choice_equation_is_not_a_letter():
    assert accuracy(r"\boxed{A = 3}", "A") == 0.0
    assert accuracy(r"\boxed{a + b}", "A") == 0.0


@pytest.mark.parametrize(
    ("boxed", "gold", "expected"),
    [
        ("Yes", "Yes", 1.0),
        ("yes", "Yes", 1.0),
        ("YES", "yes", 1.0),
        (r"\text{Yes}", "yes", 1.0),
        ("Yes.", "Yes", 1.0),
        ("No", "no", 1.0),
        ("No", "Yes", 0.0),
        (r"\text{yes}", "No", 0.0),
        ("None", "No", 0.0),
        ("3", "Yes", 0.0),
    ],
)
def test_accuracy_yes_no(boxed, gold, expected):
    assert accuracy(rf"\boxed{{{boxed}}}", gold) == expected


def test_accuracy_non_string_ground_truths():
    # datasets may load numeric answers as int/float
    assert accuracy_reward([r"\boxed{3}", r"\boxed{46.1}"], answer=[3, 46.1]) == [1.0, 1.0]


def test_accuracy_missing_ground_truth_is_skipped():
    completions = [r"\boxed{3}"] * 4
    assert accuracy_reward(completions, answer=["", None, float("nan"), "3"]) == [None, None, None, 1.0]


HUGE_ANSWERS = [r"\boxed{9^{9^{9^{9}}}}", r"\boxed{99999999999^{99999999}}", r"\boxed{(x+1)^{2023}}"]
# Factorials and binomials that each hung math-verify for over 45 s in a worker thread
HUGE_FACTORIALS = [r"\boxed{99999!!}", r"\boxed{(10^{7})!}", r"\boxed{\binom{2000000}{1000000}}"]


def test_accuracy_huge_expressions_skip_math_verify(monkeypatch):
    # sympy would build integers with billions of digits (or expand a 2024-term polynomial) for these answers.
    parsed = []
    real_parse = rewards.parse

    def recording_parse(text, *args, **kwargs):
        parsed.append(text)
        return real_parse(text, *args, **kwargs)

    monkeypatch.setattr(rewards, "parse", recording_parse)
    assert accuracy_reward(HUGE_ANSWERS, answer=["3", "3", "3"]) == [0.0, 0.0, 0.0]
    assert not any("9^" in text or "2023" in text for text in parsed)
    # still graded exactly when the ground truth is literally the same expression
    assert accuracy(r"\boxed{(x+1)^{2023}}", "(x+1)^{2023}") == 1.0


@pytest.mark.parametrize("answers", [HUGE_ANSWERS, HUGE_FACTORIALS], ids=["powers", "factorials"])
def test_huge_expressions_in_a_worker_thread_do_not_hang(answers):
    # Off the main thread math-verify runs without a timeout, and the big-integer arithmetic holds the GIL, so a hang
    # would freeze the whole interpreter: check in a child process that can be killed.
    # `vepo_trl.rewards` imports neither TRL nor transformers (the package's exports are lazy): the child starts fast.
    code = textwrap.dedent(
        f"""
        import threading
        from vepo_trl.rewards import accuracy_reward
        out = []
        thread = threading.Thread(target=lambda: out.append(accuracy_reward({answers!r}, answer=["3"] * 3)))
        thread.start()
        thread.join()
        print(out)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[[0.0, 0.0, 0.0]]"


def test_grade_answer_never_raises_when_math_verify_fails(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("grader bug")

    def timed_out(*args, **kwargs):
        raise TimeoutException("Operation timed out!")

    # "0.5" vs "\frac{1}{2}" is not a string match, so it reaches math-verify.
    for failure in (broken, timed_out):
        monkeypatch.setattr(rewards, "verify", failure)
        assert grade_answer("0.5", r"\frac{1}{2}") is False
        assert accuracy(r"\boxed{0.5}", r"\frac{1}{2}") == 0.0
    # exact matches do not need math-verify at all
    assert grade_answer("3", "3") is True


def test_small_factorials_and_binomials_are_still_graded():
    assert accuracy(r"\boxed{5!}", "120") == 1.0
    assert accuracy(r"\boxed{\binom{5}{2}}", "10") == 1.0


def test_grade_answer_list_ground_truth():
    assert grade_answer("4", ["3", "4"]) is True
    assert grade_answer("5", ["3", "4"]) is False


# --------------------------------------------------------------------------------------------------------------------
# Threads
# --------------------------------------------------------------------------------------------------------------------


def test_accuracy_in_a_worker_thread(monkeypatch):
    timeouts = []
    real_parse = rewards.parse

    def recording_parse(*args, **kwargs):
        timeouts.append(kwargs.get("parsing_timeout"))
        return real_parse(*args, **kwargs)

    monkeypatch.setattr(rewards, "parse", recording_parse)
    result = {}

    def work():
        try:
            # symbolic matches (not string matches), so math-verify really runs in the thread
            result["rewards"] = accuracy_reward(
                [r"\boxed{0.5}", r"\boxed{\sqrt{12}}", r"\boxed{0.25}", r"<think>x</think> \boxed{x=3}"],
                answer=[r"\frac{1}{2}", r"2\sqrt{3}", r"\frac{1}{3}", "3"],
            )
        except BaseException as error:  # surfaced through the assertion below
            result["error"] = error

    # daemon: should grading block, the test fails after the join timeout instead of blocking interpreter exit
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "accuracy_reward hung in a worker thread"
    assert "error" not in result, result.get("error")
    assert result["rewards"] == [1.0, 1.0, 0.0, 1.0]
    # signal-based timeouts cannot be used off the main thread
    assert timeouts and all(timeout is None for timeout in timeouts)


def test_accuracy_uses_timeouts_in_main_thread(monkeypatch):
    timeouts = []
    real_verify = rewards.verify

    def recording_verify(*args, **kwargs):
        timeouts.append(kwargs.get("timeout_seconds"))
        return real_verify(*args, **kwargs)

    monkeypatch.setattr(rewards, "verify", recording_verify)
    assert accuracy(r"\boxed{0.5}", r"\frac{1}{2}") == 1.0
    assert timeouts == [rewards.VERIFY_TIMEOUT_S]


# --------------------------------------------------------------------------------------------------------------------
# format
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"<think>reasoning</think>\boxed{3}", 1.0),
        (r"<think>reasoning</think> The answer is \boxed{3}.", 1.0),
        ("<think>\nline 1\n\nline 2\n</think>\n\nSo \\boxed{3}\n", 1.0),  # newlines inside
        ("\n  <think>x</think> \\boxed{3}  \n", 1.0),  # surrounding whitespace
        (r"< think >x</ think > \boxed{3}", 1.0),  # spaced tags, normalised as the authors' framework does
        (r"<think>x</think> <think>y</think> \boxed{3}", 1.0),
        (r"<think>x</think> \boxed{\frac{1}{2}}", 1.0),
        (r"The answer is \boxed{3}", 0.0),  # missing think
        (r"<think>x</think> The answer is 3", 0.0),  # missing box
        (r"Sure! <think>x</think> \boxed{3}", 0.0),  # text before <think>
        (r"<think>x \boxed{3}", 0.0),  # think never closed
        (r"\boxed{3} <think>x</think>", 0.0),  # box before the reasoning
        (r"<think>x</think> \boxed{3", 0.0),  # box never closed
        (r"<think>x</think> \fbox{3}", 0.0),  # the format asks for \boxed specifically
        ("", 0.0),
    ],
)
def test_format_reward(text, expected):
    assert format_reward([text]) == [expected]


# --------------------------------------------------------------------------------------------------------------------
# Completion forms and TRL calling convention
# --------------------------------------------------------------------------------------------------------------------


def test_completion_to_text_forms():
    assert completion_to_text("plain") == "plain"
    assert completion_to_text([{"role": "assistant", "content": "msg"}]) == "msg"
    assert (
        completion_to_text(
            [{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
        )
        == "ab"
    )
    assert (
        completion_to_text([{"role": "assistant", "content": [{"type": "image"}, {"type": "text", "text": "t"}]}])
        == "t"
    )
    assert completion_to_text({"role": "assistant", "content": "single"}) == "single"
    assert completion_to_text([{"role": "assistant", "content": None}]) == ""
    assert completion_to_text(None) == ""
    assert completion_to_text([]) == ""
    assert completion_to_text(42) == ""
    multi_turn = [
        {"role": "assistant", "content": "call"},
        {"role": "tool", "content": "tool output"},
        {"role": "assistant", "content": "final"},
    ]
    assert completion_to_text(multi_turn) == "call\nfinal"


def test_rewards_with_trl_keyword_arguments():
    good, wrong = well_formatted("3"), well_formatted("4")
    completions = [
        [{"role": "assistant", "content": good}],
        [{"role": "assistant", "content": [{"type": "text", "text": good}]}],
        [{"role": "assistant", "content": wrong}],
        good,
        r"\boxed{3}",
    ]
    logged = {}
    kwargs = {
        "prompts": [[{"role": "user", "content": "What is x?"}]] * 5,
        "completion_ids": [[1, 2, 3]] * 5,
        "answer": ["3"] * 5,
        "image": [None] * 5,
        "trainer_state": None,
        "log_extra": lambda column, values: logged.setdefault(column, values),
        "log_metric": lambda name, value: None,
    }
    assert accuracy_reward(completions=completions, **kwargs) == [1.0, 1.0, 0.0, 1.0, 1.0]
    assert format_reward(completions=completions, **kwargs) == [1.0, 1.0, 1.0, 1.0, 0.0]
    assert logged == {"boxed_answer": ["3", "3", "4", "3", "3"]}


def test_accuracy_accepts_solution_column():
    assert accuracy_reward([r"\boxed{3}"], solution=["3"]) == [1.0]


def test_accuracy_missing_answer_column_raises():
    with pytest.raises(ValueError, match="'answer'.*'solution'.*problem"):
        accuracy_reward(completions=[r"\boxed{3}"], prompts=["p"], problem=["q"], trainer_state=None)


def test_accuracy_length_mismatch_raises():
    with pytest.raises(ValueError, match="2 completions but 1"):
        accuracy_reward([r"\boxed{3}", r"\boxed{3}"], answer=["3"])


def test_reward_function_names_for_trl_logging():
    # TRL logs rewards/<__name__>/mean
    assert accuracy_reward.__name__ == "accuracy_reward"
    assert format_reward.__name__ == "format_reward"


# --------------------------------------------------------------------------------------------------------------------
# Paper reward and registry
# --------------------------------------------------------------------------------------------------------------------


def weighted_reward(completions, answers):
    """What GRPOTrainer computes with reward_weights: sum of weight * reward over reward functions."""
    funcs = get_reward_funcs(PAPER_REWARD_FUNCS)
    per_func = [func(completions=completions, answer=answers) for func in funcs]
    return [sum(w * r for w, r in zip(PAPER_REWARD_WEIGHTS, column)) for column in zip(*per_func)]


def test_paper_reward_weighted_by_hand():
    completions = [
        well_formatted("3"),  # correct, formatted:     0.9 * 1 + 0.1 * 1
        well_formatted("5"),  # wrong, formatted:       0.9 * 0 + 0.1 * 1
        r"The answer is \boxed{3}",  # correct, no think:   0.9 * 1 + 0.1 * 0
        "<think>hmm</think> it is 3",  # no box at all:    0.9 * 0 + 0.1 * 0
        well_formatted(r"\frac{1}{2}"),  # equivalent form: 0.9 * 1 + 0.1 * 1
    ]
    answers = ["3", "3", "3", "3", "0.5"]
    assert weighted_reward(completions, answers) == pytest.approx([1.0, 0.1, 0.9, 0.0, 1.0])


def test_paper_constants():
    assert PAPER_REWARD_FUNCS == ["accuracy", "format"]
    assert PAPER_REWARD_WEIGHTS == [0.9, 0.1]
    assert get_reward_funcs(PAPER_REWARD_FUNCS) == [accuracy_reward, format_reward]
    assert REWARD_FUNCS["accuracy"] is accuracy_reward
    assert REWARD_FUNCS["format"] is format_reward


def test_get_reward_funcs_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match=r"\['acuracy'\].*'accuracy'.*'format'"):
        get_reward_funcs(["acuracy", "format"])


def test_get_reward_funcs_single_string():
    assert get_reward_funcs("format") == [format_reward]


def test_register_reward_twice_raises():
    with pytest.raises(ValueError, match="already registered"):

        @register_reward("accuracy")
        def another_accuracy(completions, **kwargs):
            return [0.0] * len(completions)

    assert REWARD_FUNCS["accuracy"] is accuracy_reward


def test_register_new_reward():
    @register_reward("length")
    def length_reward(completions, **kwargs):
        return [float(len(completion_to_text(c))) for c in completions]

    try:
        assert get_reward_funcs(["length"]) == [length_reward]
        assert length_reward(["abc"]) == [3.0]
        assert REWARD_FUNCS.source("length") == "tests"  # the package that registered it
    finally:
        REWARD_FUNCS.pop("length")


def test_answer_mentioned_reward_whole_words_only():
    from vepo_trl.rewards import answer_mentioned_reward

    completions = [
        [{"role": "assistant", "content": "there are 3 circles"}],  # whole number present
        [{"role": "assistant", "content": "13 circles"}],  # 3 only inside 13: no credit
        [{"role": "assistant", "content": "answer: B."}],  # a letter followed by punctuation
        [{"role": "assistant", "content": ""}],  # empty completion
    ]
    assert answer_mentioned_reward(completions, answer=["3", "3", "B", "3"]) == [1.0, 0.0, 1.0, 0.0]
    assert answer_mentioned_reward(completions[:1], answer=[""]) == [None]
