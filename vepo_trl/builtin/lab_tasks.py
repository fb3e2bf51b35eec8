r"""Visual tasks for the laptop lab: answers decided by the image, responses with interchangeable wording.

Three kinds of question, each sample a pure function of a seed:

* ``count``: "How many circles are in the image?" -- 1 to 4 filled circles of one colour on white; the answer is the
  number of circles.
* ``colour``: "What colour is the square?" -- one filled square in one of five colours, plus grey circles as
  distractors; the answer is the square's colour.
* ``squares``: "What colours are the three squares, from left to right?" -- one square in each third of the image;
  the answer is the ordered list ``c1, c2, c3``, and the response names each colour after two sentences of
  interchangeable wording, so several image-decided tokens sit among many image-independent ones.

A lab task (:data:`TASKS`, chosen with ``vepo-trl lab --task``) is a mix of kinds with its SFT label noise, reward and
response length: ``colour`` is the lab's first task (one square), ``squares`` the default since it does not saturate.

The supervised responses follow the paper's format, ``<think>...</think> ... \boxed{...}``, and are built so that two
kinds of token exist (the mechanism VEPO is about):

* linguistic choices: each response picks its opener, its noun and its closing phrase uniformly from a few
  interchangeable variants (``I see`` / ``I count`` / ``There are`` ...). After SFT these positions keep a high entropy
  (about ln(number of variants)) whatever the image shows: top-k entropy selects them, but the image does not move
  them.
* visual decisions: the counted number and the colour word inside ``<think>`` are fixed by the image. After SFT they
  have a lower entropy and a large JSD between the clean and the noisy image: VEPO's score prefers them.

The answer in ``\boxed{}`` then repeats the number or colour from the reasoning (a low-entropy copy).

Room for RL: the SFT labels are noisy in a systematic way, like annotators who call purple "blue"
(:data:`SFT_CONFUSIONS`: a purple square is labelled "blue" and a yellow one "green" in 60% of the SFT rows). A model
fit to those labels answers "blue" for purple greedily, though "purple" keeps about 40% of the probability. The RL
reward checks the true colour, so RL can fix exactly those image-decided tokens: that is the lab's test of whether a
selection rule gives them the gradient.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from PIL import Image, ImageDraw

from ..registry import Registry


if TYPE_CHECKING:
    from datasets import Dataset


__all__ = [
    "COLOURS",
    "DEFAULT_TASK",
    "LAB_TASKS",
    "TASKS",
    "LabSample",
    "LabTask",
    "get_task",
    "register_lab_task",
    "answer_token_positions",
    "lab_corpus",
    "make_lab_sample",
    "make_rl_dataset",
    "make_sft_dataset",
    "render_response",
]

# Saturated and far apart in RGB: an unambiguous flat fill
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 230),
    "yellow": (235, 200, 20),
    "purple": (150, 60, 190),
}
DISTRACTOR = (150, 150, 150)
BACKGROUND = (255, 255, 255)
MAX_COUNT = 4
LAB_TASKS = ("count", "colour", "squares")  # the kinds of question
# The first lab's mix: a ~1M-parameter model with 9 visual tokens learns colours in a minute of SFT but stays at
# chance on counting (measured), so counting would only add noise to the comparison
DEFAULT_KINDS = ("colour",)

QUESTIONS = {
    "count": "How many circles are in the image?",
    "colour": "What colour is the square?",
    "squares": "What colours are the three squares, from left to right?",
}
NUM_SQUARES = 3
SHADE_JITTER = 40  # the squares task: each RGB channel of a square off its colour by up to this much
# Interchangeable wording: the image never decides these
COUNT_OPENERS = ("I see", "I count", "There are", "I can spot", "Looking closely, I find")
COUNT_NOUNS = ("circles", "dots", "round shapes")
COLOUR_SUBJECTS = ("The square", "The box", "This shape")
COLOUR_VERBS = ("is", "looks", "appears to be")
CLOSERS = ("The answer is", "So the answer is", "Final answer:")
# The squares task's wording: an opening sentence, a reading order and a verb per square (5 x 4 x 4^3 x 3 variants)
SQUARES_OPENERS = (
    "Let me look at the image.",
    "I will read the squares one by one.",
    "There are three squares here.",
    "The image shows three squares.",
    "Let me check each square.",
)
SQUARES_ORDERS = ("From the left,", "Going left to right,", "Reading across,", "In order,")
SQUARES_VERBS = ("is", "looks", "appears to be", "seems")
# SFT label noise: colour -> (label given instead, probability)
SFT_CONFUSIONS: dict[str, tuple[str, float]] = {"purple": ("blue", 0.6), "yellow": ("green", 0.6)}


@dataclass(frozen=True)
class LabTask:
    """What `vepo-trl lab --task NAME` trains on: kinds of question, SFT label noise, grading, response length."""

    name: str
    kinds: tuple[str, ...]
    description: str
    # SFT label noise: colour -> (label given instead, probability); the RL reward checks the true colour
    confusions: dict[str, tuple[str, float]]
    # Registry name of the accuracy reward (`vepo_trl.rewards`); weighted 0.9 with format 0.1 as in the paper
    accuracy_reward: str
    max_completion_length: int
    # Kinds whose responses the lab's tokenizer learns its merges from
    corpus_kinds: tuple[str, ...]
    # The task's warm start: `WarmStartConfig` fields that differ from its defaults (`WarmStartConfig.for_task`)
    warm_start: dict = field(default_factory=dict)


TASKS: Registry[LabTask] = Registry("lab task")


def register_lab_task(task: LabTask) -> LabTask:
    """Add `task` to the lab's tasks (`vepo-trl lab --task NAME`; exported as `vepo_trl.register_lab_task`). Its
    `kinds` are the lab's question kinds (`LAB_TASKS`); its `accuracy_reward` a registered reward. A name registered
    twice is an error."""
    unknown = sorted(set(task.kinds) - set(LAB_TASKS))
    if unknown:
        raise ValueError(f"Lab task {task.name!r}: unknown kinds {unknown}; the lab draws {list(LAB_TASKS)}.")
    import sys

    return TASKS.add(task.name, task, module=sys._getframe(1).f_globals.get("__name__"))


for _task in (
    LabTask(
        name="colour",
        kinds=("colour",),
        description="one square, 'What colour is the square?'; ~20-token responses, one image-decided token "
        "(the first lab task: full GRPO saturates it)",
        confusions=SFT_CONFUSIONS,
        accuracy_reward="accuracy",
        max_completion_length=28,
        corpus_kinds=("count", "colour"),
        warm_start=dict(vocab_size=400, sft_rows=2048, sft_steps=300),
    ),
    LabTask(
        name="squares",
        kinds=("squares",),
        description="three squares, their colours from left to right; ~45-token responses, three image-decided "
        "tokens among many interchangeable wording tokens, graded as an ordered list",
        confusions=SFT_CONFUSIONS,
        accuracy_reward="exact_match",
        max_completion_length=56,
        corpus_kinds=("squares",),
        # 512: the corpus's words become single tokens; three squares take 900 SFT steps to be read (300: all blue)
        warm_start=dict(vocab_size=512, sft_rows=4096, sft_steps=900),
    ),
):
    register_lab_task(_task)

DEFAULT_TASK = "squares"


def get_task(name: str) -> LabTask:
    if name not in TASKS:
        raise ValueError(f"unknown lab task {name!r}; choose one of {sorted(TASKS)}")
    return TASKS[name]


NUMBER_WORDS = {str(n): str(n) for n in range(1, MAX_COUNT + 1)}


@dataclass(frozen=True)
class LabSample:
    image: Image.Image
    kind: str
    question: str
    answer: str
    # Where the drawn objects are: (x0, y0, x1, y1) boxes, for tests that check the pixels
    boxes: tuple[tuple[int, int, int, int], ...]
    colour: tuple[int, int, int]


def _place(rng: random.Random, size: int, radius: int, taken: list, tries: int = 200):
    """A centre at least 2 px clear of every box in `taken` and of the border, or None."""
    for _ in range(tries):
        x = rng.randint(radius + 1, size - radius - 2)
        y = rng.randint(radius + 1, size - radius - 2)
        box = (x - radius, y - radius, x + radius, y + radius)
        if all(box[2] + 2 < b[0] or b[2] + 2 < box[0] or box[3] + 2 < b[1] or b[3] + 2 < box[1] for b in taken):
            return box
    return None


def make_lab_sample(kind: str, seed: int, image_size: int = 84) -> LabSample:
    """One task instance, a pure function of `(kind, seed, image_size)`."""
    if kind not in LAB_TASKS:
        raise ValueError(f"unknown lab task {kind!r}; choose one of {LAB_TASKS}")
    rng = random.Random(f"{kind}-{seed}")
    image = Image.new("RGB", (image_size, image_size), BACKGROUND)
    draw = ImageDraw.Draw(image)
    radius = max(4, image_size // 10)
    boxes: list[tuple[int, int, int, int]] = []
    if kind == "count":
        colour = COLOURS[rng.choice(sorted(COLOURS))]
        target = rng.randint(1, MAX_COUNT)
        while len(boxes) < target:
            box = _place(rng, image_size, radius, boxes)
            if box is None:  # crowded: start over with the same count
                boxes.clear()
                continue
            boxes.append(box)
            draw.ellipse(box, fill=colour)
        return LabSample(image, kind, QUESTIONS[kind], str(target), tuple(boxes), colour)
    if kind == "squares":
        return _squares_sample(rng, image, draw, image_size)
    name = rng.choice(sorted(COLOURS))
    colour = COLOURS[name]
    half = radius + 2
    square = _place(rng, image_size, half, boxes)
    boxes.append(square)
    draw.rectangle(square, fill=colour)
    for _ in range(rng.randint(0, 3)):
        box = _place(rng, image_size, radius, boxes)
        if box is not None:
            boxes.append(box)
            draw.ellipse(box, fill=DISTRACTOR)
    return LabSample(image, kind, QUESTIONS[kind], name, (square,), colour)


def _squares_sample(rng: random.Random, image, draw, image_size: int) -> LabSample:
    """One square per third of the image (a third is one column of the model's merged 28 px tokens at 84 px), near
    the middle row with some jitter; colours drawn independently (repeats allowed)."""
    third = image_size / NUM_SQUARES
    half = max(3, round(third * 0.4))
    jitter = max(0, int(third / 2) - half - 2)
    names = [rng.choice(sorted(COLOURS)) for _ in range(NUM_SQUARES)]
    boxes, fills = [], []
    for i, name in enumerate(names):
        cx = round(third * (i + 0.5)) + rng.randint(-jitter, jitter)
        cy = image_size // 2 + rng.randint(-image_size // 6, image_size // 6)
        box = (cx - half, cy - half, cx + half, cy + half)
        # Each square a shade of its colour: reading it is learnt, not looked up, so RL has perception to improve
        shade = tuple(min(255, max(0, c + rng.randint(-SHADE_JITTER, SHADE_JITTER))) for c in COLOURS[name])
        draw.rectangle(box, fill=shade)
        boxes.append(box)
        fills.append(shade)
    return LabSample(image, "squares", QUESTIONS["squares"], ", ".join(names), tuple(boxes), fills[0])


def render_response(kind: str, answer: str, rng: random.Random) -> str:
    """An SFT target with random wording: `<think>{opener} {answer} {noun}.</think> {closer} \\boxed{answer}` for a
    count, `<think>{subject} {verb} {answer}.</think> {closer} \\boxed{answer}` for a colour, and for three squares
    (`answer` = "c1, c2, c3") `<think>{opener} {order} the first square {verb} c1, the second {verb} c2 and the third
    {verb} c3.</think> {closer} \\boxed{c1, c2, c3}`."""
    if kind == "squares":
        c1, c2, c3 = (part.strip() for part in answer.split(","))
        v1, v2, v3 = (rng.choice(SQUARES_VERBS) for _ in range(3))
        thought = (
            f"{rng.choice(SQUARES_OPENERS)} {rng.choice(SQUARES_ORDERS)} the first square {v1} {c1}, "
            f"the second {v2} {c2} and the third {v3} {c3}."
        )
        return f"<think>{thought}</think> {rng.choice(CLOSERS)} \\boxed{{{c1}, {c2}, {c3}}}"
    if kind == "count":
        thought = f"{rng.choice(COUNT_OPENERS)} {answer} {rng.choice(COUNT_NOUNS)}."
    else:
        thought = f"{rng.choice(COLOUR_SUBJECTS)} {rng.choice(COLOUR_VERBS)} {answer}."
    return f"<think>{thought}</think> {rng.choice(CLOSERS)} \\boxed{{{answer}}}"


def _prompt(question: str, system_prompt: bool = False) -> list[dict]:
    """The user turn (image, question), after the paper's system prompt when `system_prompt` (the chat template's
    default system line otherwise: a shorter prompt, so CPU runs are faster)."""
    user = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}
    if not system_prompt:
        return [user]
    from ..data.loaders import SYSTEM_PROMPT  # the training data's (loaders import torch: not at start-up)

    return [{"role": "system", "content": [{"type": "text", "text": SYSTEM_PROMPT}]}, user]


def _kinds(num_rows: int, seed: int, kinds) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    return [(kinds[i % len(kinds)], rng.randrange(1 << 30)) for i in range(num_rows)]


def make_sft_dataset(
    num_rows: int,
    seed: int = 0,
    image_size: int = 84,
    kinds=DEFAULT_KINDS,
    system_prompt: bool = False,
    confusions: dict[str, tuple[str, float]] | None = None,
) -> Dataset:
    """Prompt-completion rows for TRL's SFTTrainer: `prompt` (user turn with an image), `completion`, `images`.

    `confusions` (default :data:`SFT_CONFUSIONS`; `{}` for clean labels) relabels some colours; `answer` keeps the
    true one."""
    confusions = SFT_CONFUSIONS if confusions is None else confusions
    rng = random.Random(f"responses-{seed}")
    rows = {"prompt": [], "completion": [], "images": [], "answer": [], "kind": []}
    for kind, sample_seed in _kinds(num_rows, seed, kinds):
        sample = make_lab_sample(kind, sample_seed, image_size)
        rows["prompt"].append(_prompt(sample.question, system_prompt))
        label = _noisy_label(sample.answer, confusions, rng)
        completion = render_response(kind, label, rng)
        rows["completion"].append([{"role": "assistant", "content": [{"type": "text", "text": completion}]}])
        rows["images"].append([sample.image])
        rows["answer"].append(sample.answer)
        rows["kind"].append(kind)
    from datasets import Dataset

    return Dataset.from_dict(rows)


def _noisy_label(answer: str, confusions: dict[str, tuple[str, float]], rng: random.Random) -> str:
    """The SFT label: each colour of `answer` ("red" or "red, purple, blue") relabelled as `confusions` says."""
    parts = []
    for part in answer.split(", "):
        if part in confusions and rng.random() < confusions[part][1]:
            part = confusions[part][0]
        parts.append(part)
    return ", ".join(parts)


def make_rl_dataset(
    num_rows: int, seed: int = 1, image_size: int = 84, kinds=DEFAULT_KINDS, system_prompt: bool = False
) -> Dataset:
    """GRPO rows in vepo_trl's conversational format: `prompt`, `images`, `answer` (plus `kind`)."""
    rows = {"prompt": [], "images": [], "answer": [], "kind": []}
    for kind, sample_seed in _kinds(num_rows, seed, kinds):
        sample = make_lab_sample(kind, sample_seed, image_size)
        rows["prompt"].append(_prompt(sample.question, system_prompt))
        rows["images"].append([sample.image])
        rows["answer"].append(sample.answer)
        rows["kind"].append(kind)
    from datasets import Dataset

    return Dataset.from_dict(rows)


def lab_corpus(kinds=("count", "colour")) -> list[str]:
    """Text a lab tokenizer learns its merges from: the prompts and every response variant of `kinds`, repeated.
    (The default is the first lab's corpus, count and colour, kept as it was so its warm start rebuilds the same.)"""
    from ..data.loaders import SYSTEM_PROMPT

    texts = [SYSTEM_PROMPT, "You are a helpful assistant.", *(QUESTIONS[kind] for kind in kinds)]
    rng = random.Random(0)
    for _ in range(40):
        if "count" in kinds:
            texts.extend(render_response("count", answer, rng) for answer in NUMBER_WORDS)
        if "colour" in kinds:
            texts.extend(render_response("colour", answer, rng) for answer in COLOURS)
        if "squares" in kinds:
            names = sorted(COLOURS)
            texts.extend(
                render_response("squares", ", ".join(rng.choice(names) for _ in range(NUM_SQUARES)), rng)
                for _ in COLOURS
            )
    return texts


def answer_token_positions(tokens: list[str], answer: str) -> list[int]:
    """Indices of the tokens that spell `answer` (each occurrence: in the reasoning and in the box)."""
    positions = []
    text = ""
    starts = []
    for token in tokens:
        starts.append(len(text))
        text += token
    target = answer.strip()
    begin = text.find(target)
    while begin >= 0:
        end = begin + len(target)
        positions.extend(i for i, s in enumerate(starts) if s < end and s + len(tokens[i]) > begin)
        begin = text.find(target, end)
    return sorted(set(positions))
