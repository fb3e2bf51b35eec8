r"""Rule-based rewards for VEPO/GRPO training on Geometry3K and K12.

The paper trains with a weighted sum of two verifiable rewards::

    reward = 0.9 * accuracy + 0.1 * format

* ``format`` is 1.0 when the whole response looks like ``<think>...</think> ... \boxed{...} ...``.
* ``accuracy`` is 1.0 when the content of the last ``\boxed{...}`` equals the ground-truth answer.

Both are plain functions that follow TRL's reward-function calling convention, so they can be handed to
``GRPOTrainer(reward_funcs=...)`` directly, and the paper weights go into ``GRPOConfig(reward_weights=...)``::

    from trl import GRPOConfig

    from vepo_trl.rewards import PAPER_REWARD_FUNCS, PAPER_REWARD_WEIGHTS, get_reward_funcs

    reward_funcs = get_reward_funcs(PAPER_REWARD_FUNCS)
    args = GRPOConfig(..., reward_weights=PAPER_REWARD_WEIGHTS)

TRL logs each reward under its function name (``rewards/accuracy_reward/mean``, ``rewards/format_reward/mean``).
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
import unicodedata
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from math_verify.errors import TimeoutException

from .registry import PluginError, Registry


__all__ = [
    "PAPER_REWARD_FUNCS",
    "PAPER_REWARD_WEIGHTS",
    "REWARD_FUNCS",
    "accuracy_reward",
    "completion_to_text",
    "exact_answer_match",
    "exact_match_reward",
    "extract_boxed_answer",
    "format_reward",
    "get_reward_funcs",
    "grade_answer",
    "register_reward",
]

logger = logging.getLogger(__name__)

# Seconds math-verify may spend parsing one string / comparing one (gold, prediction) pair. Legitimate answers take
# well under a second; the limit only exists to cut off pathological expressions. math-verify needs whole seconds
# because it relies on ``signal.alarm``.
PARSE_TIMEOUT_S = 3
VERIFY_TIMEOUT_S = 3

# Boxed answers longer than this are not handed to the symbolic grader (they can still match by exact string).
# Real Geometry3K/K12 answers are a few dozen characters; long boxes are usually a whole derivation.
MAX_SYMBOLIC_ANSWER_CHARS = 300


# --------------------------------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------------------------------

REWARD_FUNCS: Registry[Callable[..., list[float | None]]] = Registry("reward function")


def register_reward(name: str) -> Callable[[Callable[..., list[float | None]]], Callable[..., list[float | None]]]:
    """Register a reward function under ``name`` (a decorator, exported as ``vepo_trl.register_reward``).

    The contract is TRL's (``GRPOTrainer``'s ``reward_funcs``): ``fn(prompts, completions, **columns)`` returns one
    float (or ``None``: no reward from this function) per completion; each data set column (``solution``, ...) comes
    as a keyword argument holding a list. Registering the same name twice raises ``ValueError``, so that a typo cannot
    silently replace a reward.
    """

    def decorator(func: Callable[..., list[float | None]]) -> Callable[..., list[float | None]]:
        REWARD_FUNCS.add(name, func, module=getattr(func, "__module__", None))
        return func

    return decorator


def get_reward_funcs(names: Sequence[str] | str) -> list[Callable[..., list[float | None]]]:
    """Look up reward functions by registry name, in the given order.

    Raises:
        ValueError: if any name is not registered; the message lists the valid names.
    """
    # A bare string would otherwise be iterated character by character.
    if isinstance(names, str):
        names = [names]
    unknown = [name for name in names if name not in REWARD_FUNCS]
    for name in unknown:
        if line := REWARD_FUNCS.broken_line(name):  # a plug-in of that name that failed to load says so
            raise PluginError(line)
    if unknown:
        raise ValueError(f"Unknown reward function(s) {unknown}. Valid names are: {sorted(REWARD_FUNCS)}.")
    return [REWARD_FUNCS[name] for name in names]


# --------------------------------------------------------------------------------------------------------------------
# Completion text
# --------------------------------------------------------------------------------------------------------------------


def content_to_text(content: Any) -> str:
    """Text of a message ``content``: a string, or a list of parts such as ``{"type": "text", "text": ...}``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        content = [content]
    if isinstance(content, Sequence):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                # Image/video parts carry no "text" key and are skipped.
                texts.append(part["text"])
        return "".join(texts)
    return ""


def completion_to_text(completion: Any) -> str:
    """Return the generated text of one completion, whatever form TRL passes it in.

    Handles a plain string (standard datasets), a list of messages such as
    ``[{"role": "assistant", "content": "..."}]`` (conversational datasets), a single message dict, and message
    contents given as a list of typed parts. When a completion holds several messages (e.g. tool calls), the texts of
    all assistant messages are joined with newlines; tool outputs are not the model's own words and are left out.
    Anything unrecognised yields ``""`` so that a reward never crashes on it.
    """
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return content_to_text(completion.get("content"))
    if isinstance(completion, Sequence):
        texts = [
            content_to_text(message.get("content"))
            for message in completion
            if isinstance(message, dict) and message.get("role", "assistant") == "assistant"
        ]
        return "\n".join(text for text in texts if text)
    return ""


# --------------------------------------------------------------------------------------------------------------------
# Format reward
# --------------------------------------------------------------------------------------------------------------------

# Exactly the pattern of the authors' framework (EasyR1, examples/reward_function/math.py), used with fullmatch.
_FORMAT_PATTERN = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)
# vepo_trl removes whitespace around "<", ">" and "/" before scoring (so "< think >" and leading blank lines pass).
# The authors' release (commit 4247308) does not: a completion starting with a newline scores 0 there, 1 here.
_TAG_WHITESPACE = re.compile(r"\s*(<|>|/)\s*")


def _format_score(text: str) -> float:
    # The tag-whitespace substitution already removes whitespace before the opening "<think>", and trailing
    # whitespace is absorbed by the final ``.*``; the extra strip keeps that true if the substitution is ever dropped.
    text = _TAG_WHITESPACE.sub(r"\1", text).strip()
    return 1.0 if _FORMAT_PATTERN.fullmatch(text) else 0.0


@register_reward("format")
def format_reward(completions: Sequence[Any], **kwargs: Any) -> list[float]:
    r"""1.0 if the whole completion is ``<think>...</think>...\boxed{...}...`` (newlines allowed), else 0.0.

    Args:
        completions: Completions as strings or message lists (see :func:`completion_to_text`).
        **kwargs: Ignored; accepted so that TRL can pass its usual keyword arguments.
    """
    return [_format_score(completion_to_text(completion)) for completion in completions]


# --------------------------------------------------------------------------------------------------------------------
# Boxed answer extraction
# --------------------------------------------------------------------------------------------------------------------

# "\boxed {x}" is valid LaTeX, and "\fbox{x}" renders the same box, so both count.
_BOXED_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")


def extract_boxed_answer(text: str) -> str | None:
    r"""Return the content of the last ``\boxed{...}`` (or ``\fbox{...}``) in ``text``, with nested braces kept.

    ``\boxed{\frac{1}{2}}`` yields ``\frac{1}{2}``; escaped braces (``\{``, ``\}``) do not count towards nesting.
    Returns ``None`` when there is no box or when the last box is never closed: a truncated final answer is not an
    answer, and falling back to an earlier box would reward an answer the model went on to revise.
    """
    if not isinstance(text, str) or not text:
        return None
    openings = list(_BOXED_OPEN.finditer(text))
    if not openings:
        return None
    start = openings[-1].end()
    depth = 1
    i = start
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2  # skip the escaped character, e.g. "\{" or "\}"
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start:i].strip()
        i += 1
    return None


# --------------------------------------------------------------------------------------------------------------------
# Answer normalisation
# --------------------------------------------------------------------------------------------------------------------

_SUPERSCRIPT_DIGITS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹", "0123456789")
_SUPERSCRIPT_RUN = re.compile(r"[⁰¹²³⁴⁵⁶⁷⁸⁹]+")
# Unicode symbols that models (and some K12 answers) write instead of LaTeX; math-verify only knows the LaTeX forms.
_UNICODE_TO_LATEX = {
    "°": "^\\circ",
    "×": "\\times ",
    "÷": "\\div ",
    "·": "\\cdot ",
    "−": "-",
    "≤": "\\le ",
    "≥": "\\ge ",
    "≠": "\\ne ",
    "∞": "\\infty ",
    "⁄": "/",
}
_SQRT_ARG = re.compile(r"√\s*(\{[^{}]*\}|\([^()]*\)|[0-9.]+|[A-Za-z])")
_TEXT_COMMAND = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mathit|mbox|operatorname)\s*\{([^{}]*)\}")
_SPACING_COMMAND = re.compile(r"\\[,;:!> ]|\\q?quad\b")
# "\left(" and "\right)" only size the bracket; the lookahead keeps "\leftarrow" intact.
_SIZING_COMMAND = re.compile(r"\\(?:left|right)(?![A-Za-z])")


def _superscript_to_latex(match: re.Match[str]) -> str:
    return "^{" + match.group(0).translate(_SUPERSCRIPT_DIGITS) + "}"


def _sqrt_to_latex(match: re.Match[str]) -> str:
    argument = match.group(1)
    if argument[0] in "{(":
        argument = argument[1:-1]
    return "\\sqrt{" + argument + "}"


def _normalize_unicode(text: str) -> str:
    """Map unicode math (full-width digits, superscripts, √, °, ×, ...) to ASCII/LaTeX."""
    # Superscripts first: NFKC would turn "x²" into "x2".
    text = _SUPERSCRIPT_RUN.sub(_superscript_to_latex, text)
    # NFKC folds full-width characters ("３", "（Ｂ）") and compatibility forms ("½" -> "1⁄2") to plain ones.
    text = unicodedata.normalize("NFKC", text)
    for symbol, latex in _UNICODE_TO_LATEX.items():
        text = text.replace(symbol, latex)
    text = _SQRT_ARG.sub(_sqrt_to_latex, text)
    return text.replace("√", "\\sqrt")


def _clean_answer(text: str) -> str:
    r"""Light normalisation shared by all comparisons: unicode, ``$``, ``\text{}``, spacing, trailing period."""
    text = _normalize_unicode(text)
    # A ground truth may itself be written as "\boxed{...}".
    boxed = extract_boxed_answer(text)
    if boxed is not None:
        text = boxed
    text = text.replace("$", "")
    # Unwrap repeatedly: "\text{\textbf{B}}" needs two passes because the pattern only takes brace-free contents.
    previous = None
    while previous != text:
        previous = text
        text = _TEXT_COMMAND.sub(r"\1", text)
    text = _SPACING_COMMAND.sub(" ", text)
    text = _SIZING_COMMAND.sub("", text).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = text.strip()
    if text.endswith(".") and not text.endswith(".."):
        text = text[:-1].rstrip()
    return text


def _canonical(text: str) -> str:
    """Whitespace-free form of a cleaned answer, for the exact string comparison."""
    return re.sub(r"\s+", "", text)


# A ground truth that is a single option letter: "B", "(B)", "B.", "[B]". Upper case only, since a lower-case "e" or
# "a" is far more likely to be Euler's number or a variable than an option.
_CHOICE_GOLD = re.compile(r"[(\[]?([A-E])[)\]]?\.?")
# A predicted option: the letter, optionally bracketed and after "option"/"choice"/"answer", followed by the end or a
# separator ("B", "(B) 45^\circ", "B. 45", "Answer: B").
_CHOICE_PRED = re.compile(
    r"(?P<prefix>(?:option|choice|answer)\s*[:：]?\s*)?(?P<open>[(\[])?(?P<letter>[A-Ea-e])(?P<close>[)\]])?"
    r"(?=$|[\s.:：,;)\]])",
    re.IGNORECASE,
)
# "B, C", "B and C", "B/C": several options named, never a single-letter answer.
_SEVERAL_CHOICES = re.compile(r"\s*(?:,|/|&|and\b|or\b)\s*[(\[]?[A-E](?![A-Za-z])", re.IGNORECASE)


def _extract_choice(text: str) -> str | None:
    """Option letter named by a cleaned prediction, upper-cased, or None when it names none or several."""
    match = _CHOICE_PRED.match(text)
    if match is None:
        return None
    letter = match.group("letter")
    rest = text[match.end() :]
    bare = not (match.group("prefix") or match.group("open") or match.group("close"))
    if letter.islower() and bare and rest.strip(" .:："):
        # "a triangle" is prose; a lower-case option needs to stand alone ("b") or be marked ("(b) 45").
        return None
    if bare and rest.lstrip()[:1] in set("=<>+-*/^"):
        # "A = 3" is a statement about a point or variable named A, not option A.
        return None
    if _SEVERAL_CHOICES.match(rest):
        return None
    return letter.upper()


_YES_NO = {"yes", "no"}
_YES_NO_PRED = re.compile(r"(yes|no)(?:$|[\s.,;:!])", re.I)


def _extract_yes_no(text: str) -> str | None:
    match = _YES_NO_PRED.match(text)
    return match.group(1).lower() if match else None


# Some answers make sympy build astronomically large objects: 9^{9^{9^9}} or 99999999999^{99999999} are integers with
# billions of digits, and (x+1)^{2023} is expanded into a 2024-term polynomial. Behind a timeout (main thread) that
# wastes seconds; without one (other threads) it hangs, and because big-integer arithmetic holds the GIL no thread-based
# watchdog could stop it. Such answers are not plausible Geometry3K/K12 answers, so they only get the exact-text check.
_POWER_TOWER = re.compile(r"\^\s*\{[^{}]*\^|\^\s*\([^()]*\^|\*\*")
_HUGE_EXPONENT = re.compile(r"\^\s*\{?\s*[-+]?\d{6,}|\d{7,}\s*!")
# Factorials and binomials explode just as badly: 99999!! (a factorial of a 456,570-digit number), (10^{7})! (a
# factorial of whatever the brackets hold), \binom{2000000}{1000000}. A plausible answer has a small factorial of a
# plain number (5!, 10!) or a small binomial.
_HUGE_FACTORIAL = re.compile(r"!\s*!|\d{5,}\s*!|[)}\]]\s*!|binom[^A-Za-z]{0,60}?(?:\d{4,}|\^)")
_POWER_OF_GROUP = re.compile(r"[)}\]]\s*\^\s*\{?\s*\d{3,}")
_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")


def _is_too_expensive(text: str) -> bool:
    if len(text) > MAX_SYMBOLIC_ANSWER_CHARS or _POWER_TOWER.search(text) or _HUGE_EXPONENT.search(text):
        return True
    if _HUGE_FACTORIAL.search(text):
        return True
    # A large power of a bracketed expression is only slow when it contains a variable (polynomial expansion).
    return bool(_POWER_OF_GROUP.search(text)) and re.search(r"[A-Za-z]", _LATEX_COMMAND.sub("", text)) is not None


# --------------------------------------------------------------------------------------------------------------------
# Symbolic grading with math-verify
# --------------------------------------------------------------------------------------------------------------------

# Wrapping an answer in "\boxed{...}" makes math-verify read it as LaTeX: a bare "2\sqrt{3}" would otherwise be read as
# the plain number 2, and "1,2" as the decimal 1.2.
_EXTRACTION_CONFIG = (LatexExtractionConfig(), ExprExtractionConfig())


class _DropTimeoutDisabledWarning(logging.Filter):
    """Hide math-verify's "Timeout is disabled" warning, which we trigger on purpose off the main thread."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


_warning_filter_lock = threading.Lock()
_warning_filter_installed = False


def _timeouts() -> tuple[int | None, int | None]:
    """Parse/verify timeouts usable from the calling thread.

    math-verify implements its timeouts with ``signal.alarm``, which Python only allows in the main thread: from any
    other thread, ``parse`` and ``verify`` raise ``ValueError`` instead of grading (it is re-raised, not swallowed).
    Off the main thread, and off POSIX where math-verify would start a process per call, the timeouts are therefore
    disabled; :func:`_is_too_expensive` keeps the known hang cases away from the grader instead.
    """
    global _warning_filter_installed
    if os.name == "posix" and threading.current_thread() is threading.main_thread():
        return PARSE_TIMEOUT_S, VERIFY_TIMEOUT_S
    with _warning_filter_lock:
        if not _warning_filter_installed:
            for name in ("math_verify.parser", "math_verify.grader"):
                logging.getLogger(name).addFilter(_DropTimeoutDisabledWarning())
            _warning_filter_installed = True
    return None, None


@lru_cache(maxsize=4096)
def _parse_cached(answer: str, parsing_timeout: int | None) -> tuple[Any, ...]:
    # Each prompt's ground truth is graded against every one of its G generations; parsing it once is enough.
    # Sympy objects are immutable, so sharing them across calls (and threads) is safe.
    return tuple(parse("\\boxed{" + answer + "}", list(_EXTRACTION_CONFIG), parsing_timeout=parsing_timeout))


def _symbolic_equal(prediction: str, gold: str) -> bool:
    """math-verify equivalence of two cleaned answers; any error or timeout counts as "not equal"."""
    parsing_timeout, verify_timeout = _timeouts()
    try:
        gold_parsed = _parse_cached(gold, parsing_timeout)
        if not gold_parsed:
            return False
        pred_parsed = parse("\\boxed{" + prediction + "}", list(_EXTRACTION_CONFIG), parsing_timeout=parsing_timeout)
        if not pred_parsed:
            return False
        return bool(verify(list(gold_parsed), pred_parsed, timeout_seconds=verify_timeout))
    # TimeoutException derives from BaseException, so ``except Exception`` alone would let it escape.
    except (Exception, TimeoutException):
        logger.debug("math-verify failed on prediction %r vs gold %r", prediction, gold, exc_info=True)
        return False


def grade_answer(prediction: str | None, ground_truth: Any) -> bool:
    r"""Whether an extracted answer (e.g. the content of ``\boxed{}``) matches the ground truth.

    Checks, in order:

    1. multiple choice: a ground truth that is a single letter A-E (``"B"``, ``"(B)"``, ``"B."``) only accepts a
       prediction naming that letter (``"B"``, ``"(b)"``, ``"B. 45"``, ``"\text{B}"``), case-insensitively;
    2. yes/no: a ground truth of ``yes``/``no`` is compared case-insensitively;
    3. exact text after normalisation (unicode, ``$``, ``\text{}``, whitespace, trailing period);
    4. mathematical equivalence with math-verify (``0.5 == \frac{1}{2}``, ``\sqrt{12} == 2\sqrt{3}``,
       ``45^\circ == 45``, ``x=3 == 3``), under a timeout where one is possible.

    A list/tuple ground truth is accepted when any of its entries matches. Never raises.
    """
    if isinstance(ground_truth, (list, tuple)):
        return any(grade_answer(prediction, gold) for gold in ground_truth)
    if prediction is None or ground_truth is None:
        return False
    try:
        gold = _clean_answer(str(ground_truth))
        pred = _clean_answer(str(prediction))
        if not gold or not pred:
            return False

        choice = _CHOICE_GOLD.fullmatch(gold)
        if choice is not None:
            # An option letter has no numeric meaning, so there is nothing for math-verify to add.
            return _extract_choice(pred) == choice.group(1)

        if gold.lower() in _YES_NO:
            return _extract_yes_no(pred) == gold.lower()

        if _canonical(pred) == _canonical(gold):
            return True

        if _is_too_expensive(pred) or _is_too_expensive(gold):
            return False
        return _symbolic_equal(pred, gold)
    except Exception:
        # Rewards run inside the training loop; a grading bug must cost one sample's reward, not the run.
        logger.warning("Could not grade prediction %r against %r", prediction, ground_truth, exc_info=True)
        return False


# --------------------------------------------------------------------------------------------------------------------
# Accuracy reward
# --------------------------------------------------------------------------------------------------------------------

# Keyword arguments TRL adds on top of the dataset columns; left out of the missing-column error, which lists columns.
_TRL_KWARGS = {"prompts", "completion_ids", "trainer_state", "log_extra", "log_metric", "environments"}


def _is_missing(value: Any) -> bool:
    # NaN is how pandas-backed datasets spell an empty cell.
    if isinstance(value, float) and math.isnan(value):
        return True
    return value is None or (isinstance(value, str) and not value.strip())


@register_reward("accuracy")
def accuracy_reward(
    completions: Sequence[Any],
    answer: Sequence[Any] | None = None,
    log_extra: Callable[[str, list], None] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    r"""1.0 if the last ``\boxed{}`` of a completion matches its ground-truth answer, else 0.0.

    Args:
        completions: Completions as strings or message lists (see :func:`completion_to_text`).
        answer: Ground-truth answers, one per completion (the dataset's ``answer`` column). A ``solution`` column
            is accepted instead, for datasets following TRL/open-r1 naming.
        log_extra: Provided by TRL to add columns to the logged completions table; the extracted boxed answers are
            logged there so that grading mistakes are easy to spot.
        **kwargs: Other dataset columns and trainer arguments, ignored.

    Returns:
        One reward per completion; ``None`` (skipped by TRL) where the ground truth itself is missing or empty.

    Raises:
        ValueError: if neither an ``answer`` nor a ``solution`` column is given, or its length differs from
            ``completions``.
    """
    if answer is None:
        answer = kwargs.get("solution")
    if answer is None:
        columns = sorted(key for key in kwargs if key not in _TRL_KWARGS)
        raise ValueError(
            "accuracy_reward needs the ground-truth answers in a dataset column named 'answer' (or 'solution'); "
            f"the columns passed were {columns}."
        )
    if len(answer) != len(completions):
        raise ValueError(f"Got {len(completions)} completions but {len(answer)} ground-truth answers.")

    rewards: list[float | None] = []
    extracted: list[str | None] = []
    for completion, gold in zip(completions, answer):
        prediction = extract_boxed_answer(completion_to_text(completion))
        extracted.append(prediction)
        if _is_missing(gold) or (isinstance(gold, (list, tuple)) and all(_is_missing(g) for g in gold)):
            logger.warning("Empty ground-truth answer; the accuracy reward of this sample is skipped.")
            rewards.append(None)
            continue
        rewards.append(1.0 if grade_answer(prediction, gold) else 0.0)

    if callable(log_extra):
        log_extra("boxed_answer", extracted)
    return rewards


@register_reward("answer_mentioned")
def answer_mentioned_reward(completions: Sequence[Any], answer: Sequence[Any] | None = None, **kwargs: Any):
    """1.0 if the reference answer appears anywhere in the completion as a whole word, else 0.0.

    A dense shaping signal for models that do not box answers yet (the CPU demo's random model); not in the paper.
    """
    if answer is None:
        raise ValueError("answer_mentioned_reward needs the ground-truth answers in a dataset column named 'answer'.")
    rewards: list[float | None] = []
    for completion, gold in zip(completions, answer):
        if _is_missing(gold):
            rewards.append(None)
            continue
        pattern = rf"(?<![0-9A-Za-z]){re.escape(str(gold).strip())}(?![0-9A-Za-z])"
        rewards.append(1.0 if re.search(pattern, completion_to_text(completion)) else 0.0)
    return rewards


def exact_answer_match(prediction: str | None, gold: Any) -> bool:
    """The boxed answer equals the ground truth as text: case, spacing and a trailing period aside.

    For answers whose order matters ("purple, red, blue"): math-verify reads a comma list as a set, so
    :func:`grade_answer` accepts any reordering (and "blue, blue, red" for "blue, red, red")."""
    if prediction is None or _is_missing(gold):
        return False
    return _canonical(_clean_answer(str(prediction))).lower() == _canonical(_clean_answer(str(gold))).lower()


@register_reward("exact_match")
def exact_match_reward(completions: Sequence[Any], answer: Sequence[Any] | None = None, **kwargs: Any):
    r"""1.0 if the last ``\boxed{}`` equals the answer as text (:func:`exact_answer_match`), else 0.0; ``None`` where
    the answer is missing. The accuracy reward for ordered answers (the lab's three squares), where
    :func:`accuracy_reward`'s math-verify step would accept a permutation."""
    if answer is None:
        raise ValueError("exact_match_reward needs the ground-truth answers in a dataset column named 'answer'.")
    if len(answer) != len(completions):
        raise ValueError(f"Got {len(completions)} completions but {len(answer)} ground-truth answers.")
    return [
        None if _is_missing(gold) else float(exact_answer_match(extract_boxed_answer(completion_to_text(c)), gold))
        for c, gold in zip(completions, answer)
    ]


# Reward functions and weights of the paper: 0.9 * accuracy + 0.1 * format (GRPOConfig(reward_weights=...)).
PAPER_REWARD_FUNCS = ["accuracy", "format"]
PAPER_REWARD_WEIGHTS = [0.9, 0.1]
