"""The LLM judge against a real HTTP openai_server on 127.0.0.1 speaking OpenAI's chat-completions JSON, through the
official `openai` client: a verdict, a 5xx then success (retried), a timeout, an unparseable reply, and the key
reaching the openai_server but never the outputs."""

import time

import pytest

from vepo_trl.eval.judge import LLMJudge, parse_judgement

from .support import SECRET


@pytest.fixture
def key(monkeypatch):
    monkeypatch.setenv("VEPO_TEST_JUDGE_KEY", SECRET)
    return "VEPO_TEST_JUDGE_KEY"


def make_judge(openai_server, key, **kwargs):
    return LLMJudge("gpt-4o-mini", base_url=openai_server.base_url, api_key_env=key, **kwargs)


def test_verdict_and_request(openai_server, key):
    verdict = make_judge(openai_server, key).grade(question="Which angle?", gold="B. 60°", response="\\boxed{B}")
    assert (verdict.correct, verdict.extracted, verdict.error) == (True, "B", None)
    (request,) = openai_server.requests
    assert request["path"] == "/v1/chat/completions" and request["auth"] == f"Bearer {SECRET}"
    body = request["body"]
    assert body["model"] == "gpt-4o-mini" and body["temperature"] == 0.0
    assert "Reference answer:\nB. 60°" in body["messages"][0]["content"]


def test_5xx_is_retried_then_succeeds(openai_server, key):
    openai_server.script = ["500", "Extracted: 7\nJudgement: 0"]
    verdict = make_judge(openai_server, key, max_retries=2).grade(question="q", gold="6", response="\\boxed{7}")
    assert (verdict.correct, verdict.extracted, verdict.error) == (False, "7", None)
    assert len(openai_server.requests) == 2


def test_5xx_without_retries_is_an_error_verdict(openai_server, key):
    openai_server.script = ["500"]
    verdict = make_judge(openai_server, key, max_retries=0).grade(question="q", gold="6", response="r")
    assert (verdict.correct, verdict.error) == (None, "HTTP 500")


def test_timeout_is_an_error_verdict(openai_server, key):
    openai_server.script = ["sleep"]
    start = time.perf_counter()
    verdict = make_judge(openai_server, key, timeout=0.3, max_retries=0).grade(question="q", gold="6", response="r")
    assert (verdict.correct, verdict.error) == (None, "timeout")
    assert time.perf_counter() - start < 1.4  # gave up before the openai_server answered


def test_unparseable_reply_is_not_a_guess():
    assert parse_judgement("I think it is right").correct is None
    assert parse_judgement("Extracted: NONE\nJudgement: 0").extracted is None
    assert parse_judgement("Extracted: 3\n**Judgement: 1**").correct is True


def test_missing_key_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    with pytest.raises(ValueError, match=r"needs an API key in \$NO_SUCH_KEY_VAR"):
        LLMJudge("m", api_key_env="NO_SUCH_KEY_VAR")
    judge = LLMJudge("m", base_url="http://127.0.0.1:1/v1", api_key_env="PATH")
    assert "PATH" not in repr(judge) and "/usr" not in repr(judge)


def test_an_empty_reply_is_asked_again_then_is_a_judge_error_not_a_wrong_answer(openai_server, key):
    """An HTTP 200 with empty content used to be graded (wrong) after one request; the release asks up to 8 times."""
    from vepo_trl.eval.judge import EMPTY_REPLY_ATTEMPTS

    openai_server.script = ["", "", "Extracted: 6\nJudgement: 1"]
    verdict = make_judge(openai_server, key, max_retries=0).grade(question="q", gold="6", response="\\boxed{6}")
    assert (verdict.correct, verdict.extracted, verdict.error) == (True, "6", None) and len(
        openai_server.requests
    ) == 3
    openai_server.requests.clear()
    openai_server.script = [""] * EMPTY_REPLY_ATTEMPTS
    verdict = make_judge(openai_server, key, max_retries=0).grade(question="q", gold="6", response="\\boxed{6}")
    assert verdict.correct is None and verdict.error == f"empty reply ({EMPTY_REPLY_ATTEMPTS} attempts)"
    assert len(openai_server.requests) == EMPTY_REPLY_ATTEMPTS == 8


def test_a_reply_that_is_not_json_is_a_judge_error_on_the_row_not_the_end_of_the_run(openai_server, key):
    # (j07) a judge that passed the start-up check then replied with something that is not JSON: JSONDecodeError,
    # 81 lines, and the generated completions were lost
    judge = make_judge(openai_server, key, max_retries=0)
    assert judge.unreachable() is None
    openai_server.script = ["garbage"]
    verdict = judge.grade(question="Which angle?", gold="B. 60°", response="\\boxed{B}")
    assert verdict.correct is None and "unreadable reply" in verdict.error, verdict
    # The next call is answered again: the row after it is graded
    assert (
        make_judge(openai_server, key).grade(question="Which angle?", gold="B", response="\\boxed{B}").correct is True
    )
