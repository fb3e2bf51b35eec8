"""The LLM judge against a real HTTP server on 127.0.0.1 speaking OpenAI's chat-completions JSON, through the
official `openai` client: a verdict, a 5xx then success (retried), a timeout, an unparseable reply, and the key
reaching the server but never the outputs."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from vepo_trl.eval.judge import LLMJudge, parse_judgement


SECRET = "sk-test-" + "k" * 32


class FakeOpenAI:
    """Answers /v1/chat/completions; `script` holds what to do for each request in turn ("500", "sleep", a reply),
    then `respond(prompt)` (when set) or `default`."""

    def __init__(self):
        self.requests: list[dict] = []
        self.script: list[str] = []
        self.default = "Extracted: B\nJudgement: 1"
        self.respond = None  # a function of the prompt that scripts the reply (after `script` runs out)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep the test output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                action = server.script.pop(0) if server.script else server.default
                if action == "500":
                    return self._send(500, {"error": {"message": "overloaded", "type": "server_error"}})
                if action == "sleep":
                    time.sleep(1.5)
                    action = server.default
                if action == "garbage":  # an HTTP 200 whose body is not JSON (a proxy's error page)
                    return self._send_raw(200, b"<html>upstream error</html>")
                prompt = body["messages"][0]["content"]
                if server.respond is not None and action == server.default:
                    action = server.respond(prompt)
                    if action == "500":
                        return self._send(500, {"error": {"message": "overloaded", "type": "server_error"}})
                if action == "echo":  # right when the response boxes the reference letter
                    gold = prompt.split("Reference answer:\n", 1)[1].split("\n", 1)[0][0]
                    response = prompt.split("Model response:\n", 1)[1]
                    action = f"Extracted: {gold}\nJudgement: {int(f'boxed{{{gold}}}' in response)}"
                self._send(200, {
                    "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": action}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                })  # fmt: skip

            def _send(self, status, payload):
                self._send_raw(status, json.dumps(payload).encode())

            def _send_raw(self, status, data):
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    fake = FakeOpenAI()
    yield fake
    fake.close()


@pytest.fixture
def key(monkeypatch):
    monkeypatch.setenv("VEPO_TEST_JUDGE_KEY", SECRET)
    return "VEPO_TEST_JUDGE_KEY"


def make_judge(server, key, **kwargs):
    return LLMJudge("gpt-4o-mini", base_url=server.base_url, api_key_env=key, **kwargs)


def test_verdict_and_request(server, key):
    verdict = make_judge(server, key).grade(question="Which angle?", gold="B. 60°", response="\\boxed{B}")
    assert (verdict.correct, verdict.extracted, verdict.error) == (True, "B", None)
    (request,) = server.requests
    assert request["path"] == "/v1/chat/completions" and request["auth"] == f"Bearer {SECRET}"
    body = request["body"]
    assert body["model"] == "gpt-4o-mini" and body["temperature"] == 0.0
    assert "Reference answer:\nB. 60°" in body["messages"][0]["content"]


def test_5xx_is_retried_then_succeeds(server, key):
    server.script = ["500", "Extracted: 7\nJudgement: 0"]
    verdict = make_judge(server, key, max_retries=2).grade(question="q", gold="6", response="\\boxed{7}")
    assert (verdict.correct, verdict.extracted, verdict.error) == (False, "7", None)
    assert len(server.requests) == 2


def test_5xx_without_retries_is_an_error_verdict(server, key):
    server.script = ["500"]
    verdict = make_judge(server, key, max_retries=0).grade(question="q", gold="6", response="r")
    assert (verdict.correct, verdict.error) == (None, "HTTP 500")


def test_timeout_is_an_error_verdict(server, key):
    server.script = ["sleep"]
    start = time.perf_counter()
    verdict = make_judge(server, key, timeout=0.3, max_retries=0).grade(question="q", gold="6", response="r")
    assert (verdict.correct, verdict.error) == (None, "timeout")
    assert time.perf_counter() - start < 1.4  # gave up before the server answered


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


def test_an_empty_reply_is_asked_again_then_is_a_judge_error_not_a_wrong_answer(server, key):
    """An HTTP 200 with empty content used to be graded (wrong) after one request; the release asks up to 8 times."""
    from vepo_trl.eval.judge import EMPTY_REPLY_ATTEMPTS

    server.script = ["", "", "Extracted: 6\nJudgement: 1"]
    verdict = make_judge(server, key, max_retries=0).grade(question="q", gold="6", response="\\boxed{6}")
    assert (verdict.correct, verdict.extracted, verdict.error) == (True, "6", None) and len(server.requests) == 3
    server.requests.clear()
    server.script = [""] * EMPTY_REPLY_ATTEMPTS
    verdict = make_judge(server, key, max_retries=0).grade(question="q", gold="6", response="\\boxed{6}")
    assert verdict.correct is None and verdict.error == f"empty reply ({EMPTY_REPLY_ATTEMPTS} attempts)"
    assert len(server.requests) == EMPTY_REPLY_ATTEMPTS == 8


def test_a_reply_that_is_not_json_is_a_judge_error_on_the_row_not_the_end_of_the_run(server, key):
    # (j07) a judge that passed the start-up check then replied with something that is not JSON: JSONDecodeError,
    # 81 lines, and the generated completions were lost
    judge = make_judge(server, key, max_retries=0)
    assert judge.check_reachable() is None
    server.script = ["garbage"]
    verdict = judge.grade(question="Which angle?", gold="B. 60°", response="\\boxed{B}")
    assert verdict.correct is None and "unreadable reply" in verdict.error, verdict
    # The next call is answered again: the row after it is graded
    assert make_judge(server, key).grade(question="Which angle?", gold="B", response="\\boxed{B}").correct is True
