r"""Visual tasks for the laptop lab: answers decided by the image, responses with interchangeable wording.

Two task kinds, each a pure function of a seed:

* ``count``: "How many circles are in the image?" -- 1 to 4 filled circles of one colour on white; the answer is the
  number of circles.
* ``colour``: "What colour is the square?" -- one filled square in one of five colours, plus grey circles as
  distractors; the answer is the square's colour.

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
from dataclasses import dataclass

from datasets import Dataset
from PIL import Image, ImageDraw

from ..data.loaders import SYSTEM_PROMPT


__all__ = [
    "COLOURS",
    "LAB_TASKS",
    "LabSample",
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
LAB_TASKS = ("count", "colour")
# What the lab trains and evaluates by default: a ~1M-parameter model with 9 visual tokens learns colours in a
# minute of SFT but stays at chance on counting (measured), so counting would only add noise to the comparison
DEFAULT_KINDS = ("colour",)

QUESTIONS = {
    "count": "How many circles are in the image?",
    "colour": "What colour is the square?",
}
# Interchangeable wording: the image never decides these
COUNT_OPENERS = ("I see", "I count", "There are", "I can spot", "Looking closely, I find")
COUNT_NOUNS = ("circles", "dots", "round shapes")
COLOUR_SUBJECTS = ("The square", "The box", "This shape")
COLOUR_VERBS = ("is", "looks", "appears to be")
CLOSERS = ("The answer is", "So the answer is", "Final answer:")
# SFT label noise: colour -> (label given instead, probability)
SFT_CONFUSIONS: dict[str, tuple[str, float]] = {"purple": ("blue", 0.6), "yellow": ("green", 0.6)}
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


def render_response(kind: str, answer: str, rng: random.Random) -> str:
    """An SFT target with random wording: `<think>{opener} {answer} {noun}.</think> {closer} \\boxed{answer}` for a
    count, `<think>{subject} {verb} {answer}.</think> {closer} \\boxed{answer}` for a colour."""
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
        label = sample.answer
        if label in confusions and rng.random() < confusions[label][1]:
            label = confusions[label][0]
        completion = render_response(kind, label, rng)
        rows["completion"].append([{"role": "assistant", "content": [{"type": "text", "text": completion}]}])
        rows["images"].append([sample.image])
        rows["answer"].append(sample.answer)
        rows["kind"].append(kind)
    return Dataset.from_dict(rows)


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
    return Dataset.from_dict(rows)


def lab_corpus() -> list[str]:
    """Text a lab tokenizer learns its merges from: the prompts and every response variant, repeated."""
    texts = [SYSTEM_PROMPT, "You are a helpful assistant.", *QUESTIONS.values()]
    rng = random.Random(0)
    for _ in range(40):
        for answer in [*NUMBER_WORDS, *COLOURS]:
            kind = "count" if answer.isdigit() else "colour"
            texts.append(render_response(kind, answer, rng))
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
