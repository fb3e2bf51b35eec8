"""An LLM judge through any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM's server, a local proxy).

The paper graded MathVerse, MathVision, MathVista and We-Math with gpt-4o-mini, through the per-benchmark procedures
in `vepo_trl.eval.paper` (which call `LLMJudge.complete`). `--protocol lenient` uses the one gold-aware prompt
below instead: it reads the question, the reference answer and the whole response, and says whether they match:

    judge = LLMJudge("gpt-4o-mini")  # key from $OPENAI_API_KEY
    verdict = judge.grade(question="...", gold="B. 60°", response="<think>...</think> \\boxed{B}")
    verdict.correct, verdict.extracted, verdict.error

The API key is read from the environment and handed to the client only; it is never logged or written. With a
`cache` (`JudgeCache`: `judge_requests.jsonl` in the results folder), each request's body and its reply are kept,
keyed by the endpoint and the body itself: a rerun, a resumed run or `--rescore` sends only requests it has not sent
before, and a changed judge model, prompt or temperature is another key. A record whose verdict was a judge error
asks again.
Transient failures (timeouts, 429, 5xx) are retried by the client (`max_retries`, exponential back-off), an empty reply
(HTTP 200 with no content) up to 8 times as the release does; what still fails becomes a verdict with `correct=None`
and an `error` naming the failure (a judge error, not a wrong answer), so one bad call never stops a run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


logger = logging.getLogger(__name__)

# The VEPO release asks the judge up to 8 times before it gives up on a row (`eval/utils/model_parser.py`); an empty
# reply is asked again as often
EMPTY_REPLY_ATTEMPTS = 8

__all__ = ["JUDGE_PROMPT", "JudgeCache", "JudgeVerdict", "LLMJudge", "parse_judgement"]

JUDGE_CACHE = "judge_requests.jsonl"


class JudgeCache:
    """Judge replies by request: one JSON line per reply (`key`, `attempt`, `request`, `reply`), appended as it
    arrives, so an interrupted run keeps every reply it was paid for. The key is the SHA-256 of the endpoint and the
    request body (model, messages, temperature, token limit) as canonical JSON; `attempt` counts the times one
    record's grading asked that request (the paper's MathVerse scoring asks again when a reply is no score), so a
    rerun replays the same replies in the same order. Replies are read line by line into `key -> reply` only."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.replies: dict[tuple[str, int], str] = {}
        self._lock = threading.Lock()
        if self.path.is_file():
            with open(self.path, "rb+") as file:
                for line in file:
                    try:
                        entry = json.loads(line)
                        self.replies[entry["key"], entry.get("attempt", 0)] = entry["reply"]
                    except (ValueError, KeyError, TypeError):  # a line cut by a kill: that request is sent again
                        continue
                file.seek(0, os.SEEK_END)
                if file.tell():
                    file.seek(-1, os.SEEK_END)
                    if file.read(1) != b"\n":  # the cut line ends here, so the next reply starts its own
                        file.write(b"\n")

    @staticmethod
    def key(endpoint: str | None, request: dict) -> str:
        body = json.dumps({"endpoint": endpoint, **request}, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(body.encode()).hexdigest()

    def get(self, key: str, attempt: int) -> str | None:
        return self.replies.get((key, attempt))

    def put(self, key: str, attempt: int, request: dict, reply: str) -> None:
        entry = {"key": key, "attempt": attempt, "request": request, "reply": reply}
        line = json.dumps(entry, ensure_ascii=False) + "\n"
        with self._lock:
            self.replies[key, attempt] = reply
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as file:
                file.write(line)


JUDGE_PROMPT = """You are grading an answer to a math or visual reasoning question.

Question:
{question}

Reference answer:
{gold}

Model response:
{response}

First extract the model's final answer (for a multiple-choice question, the option letter; if there is no final \
answer, write NONE). Then decide whether it is equivalent to the reference answer (same value, same option, or the \
option's text). Reply with exactly two lines:
Extracted: <the final answer>
Judgement: <1 if equivalent, else 0>"""

# Chat models like to bold the labels ("**Judgement:** 1"); the asterisks are skipped
_EXTRACTED = re.compile(r"^[\s*]*Extracted[\s*]*:[\s*]*(.*?)[\s*]*$", re.IGNORECASE | re.MULTILINE)
_JUDGEMENT = re.compile(r"^[\s*]*Judge?ment[\s*]*:[\s*]*([01])\b", re.IGNORECASE | re.MULTILINE)


@dataclass
class JudgeVerdict:
    correct: bool | None
    extracted: str | None = None
    error: str | None = None


def parse_judgement(text: str) -> JudgeVerdict:
    """Read the judge's two lines; a reply without a `Judgement: 0|1` line is an error, never a guess."""
    judgement = _JUDGEMENT.search(text or "")
    extracted = _EXTRACTED.search(text or "")
    if judgement is None:
        return JudgeVerdict(None, None, f"unparseable judge reply: {(text or '')[:80]!r}")
    value = extracted.group(1) if extracted else None
    return JudgeVerdict(judgement.group(1) == "1", None if value in (None, "", "NONE") else value)


class LLMJudge:
    """A chat-completions judge; `grade_many` calls it from `workers` threads."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        timeout: float = 60.0,
        max_retries: int = 3,
        workers: int = 8,
        max_tokens: int = 256,
        cache: JudgeCache | None = None,
    ):
        try:
            from openai import OpenAI
        except ImportError:
            raise ValueError("The LLM judge needs the openai client: pip install 'vepo-trl[eval]'.") from None
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise ValueError(
                f"The judge needs an API key in ${api_key_env} (name another variable with --judge_api_key_env; "
                "any non-empty value for a local server that does not check keys)."
            )
        self.model = model
        self.base_url = base_url
        self.workers = workers
        self.max_tokens = max_tokens
        self.cache = cache
        self.sent = 0  # requests that went to the endpoint (the cache answered the others)
        self._local = threading.local()  # per grading thread: the record's asks of each request, a fresh regrade
        self._count = threading.Lock()
        self._client = OpenAI(api_key=api_key, base_url=base_url, timeout=timeout, max_retries=max_retries)

    @contextmanager
    def record(self, fresh: bool = False):
        """One record's grading: the times each request is asked count from 0; `fresh` asks the endpoint again
        whatever the cache holds (a record whose last verdict was a judge error), keeping the new replies."""
        self._local.asked, self._local.fresh = {}, fresh
        try:
            yield
        finally:
            self._local.asked, self._local.fresh = {}, False

    def __repr__(self) -> str:  # the key stays out of any repr that might be logged
        return f"LLMJudge(model={self.model!r}, base_url={self.base_url!r})"

    def complete(self, prompt: str, temperature: float = 0.0, max_tokens: int | None = None) -> str:
        """The judge's stripped reply to one user message; `JudgeCallError` when no reply came (after the client's
        retries). `max_tokens=None` sends no limit, as the VEPO release does."""
        import openai

        from .paper import JudgeCallError

        request = {"model": self.model, "messages": [{"role": "user", "content": prompt}], "temperature": temperature}
        if max_tokens is not None:
            request["max_tokens"] = max_tokens
        key, attempt = None, 0
        if self.cache is not None:
            key = self.cache.key(self.base_url, request)
            asked = getattr(self._local, "asked", None)
            if asked is not None:
                attempt = asked[key] = asked.get(key, -1) + 1
            cached = self.cache.get(key, attempt)
            if cached is not None and not getattr(self._local, "fresh", False):
                return cached
        for _ in range(EMPTY_REPLY_ATTEMPTS):
            try:
                with self._count:
                    self.sent += 1
                reply = self._client.chat.completions.create(**request)
            except openai.APITimeoutError:
                raise JudgeCallError("timeout") from None
            except openai.APIStatusError as err:
                raise JudgeCallError(f"HTTP {err.status_code}") from None
            except openai.APIConnectionError as err:
                raise JudgeCallError(f"connection error: {type(err).__name__}") from None
            except (ValueError, openai.APIResponseValidationError) as err:  # a body that is not the API's JSON
                raise JudgeCallError(f"unreadable reply: {type(err).__name__}") from None
            text = ((reply.choices[0].message.content if reply.choices else "") or "").strip()
            if text:
                if self.cache is not None:
                    self.cache.put(key, attempt, request, text)
                return text
        # An HTTP 200 that says nothing is no verdict: a judge error (the row stays ungraded), never a wrong answer
        raise JudgeCallError(f"empty reply ({EMPTY_REPLY_ATTEMPTS} attempts)")

    def unreachable(self) -> str | None:
        """Why the endpoint does not answer a one-token request with this key and model (one line), or None."""
        from .paper import JudgeCallError

        try:
            self._client.with_options(max_retries=1).chat.completions.create(
                model=self.model, messages=[{"role": "user", "content": "Reply with OK."}], max_tokens=1
            )
        except Exception as err:  # noqa: BLE001 - every failure here means "no judge", said in one line
            import openai

            if isinstance(err, openai.APIStatusError):
                return f"HTTP {err.status_code}"
            if isinstance(err, openai.APITimeoutError):
                return "timeout"
            if isinstance(err, openai.APIConnectionError | JudgeCallError):
                return f"connection error ({type(err).__name__})"
            return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        return None

    def grade(self, *, question: str, gold: str, response: str) -> JudgeVerdict:
        """The lenient, gold-aware judge (`--protocol lenient`): extract, then decide equivalence."""
        from .paper import JudgeCallError

        prompt = JUDGE_PROMPT.format(question=question, gold=gold, response=response)
        try:
            text = self.complete(prompt, max_tokens=self.max_tokens)
        except JudgeCallError as err:
            return JudgeVerdict(None, None, str(err))
        return parse_judgement(text)

    def grade_many(self, items: Sequence[dict]) -> list[JudgeVerdict]:
        """`grade(**item)` for each item, concurrently, in input order."""
        if not items:
            return []
        with ThreadPoolExecutor(max_workers=max(1, min(self.workers, len(items)))) as pool:
            return list(pool.map(lambda item: self.grade(**item), items))
