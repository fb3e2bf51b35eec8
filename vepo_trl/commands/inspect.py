"""`vepo-trl inspect`: its options, declared once (`InspectOptions`) and checked by their rules as they are
parsed (before torch or a model is
imported), then `vepo_trl.insight.inspect_command.inspect_main`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..insight.inspect_command import DEFAULT_PAGE
from ..options import option, parser_for
from ..validation import (
    ALWAYS,
    DATA_ROW,
    OUT_FILE,
    OWN_PROMPT,
    RANGES,
    RECORDS_FILE,
    REWARD_NAME,
    RUNS_MODEL,
    TEXT,
    at_least,
    optional,
    path_rule,
    whole,
)
from .insight_options import SETTINGS, ModelOptions, ResponseOptions, SettingsOptions


INSPECT_HELP = """Write one self-contained HTML page showing which tokens of a model's responses VEPO trains on.

Sources (one of):
  --image PATH --question TEXT      a question about an image
  --dataset NAME --index I          a row of a data set (synthetic, geometry3k, a local file, ...)
  --records FILE                    selection records saved by a run or by --save_records (no model needed)

Examples:
  vepo-trl inspect --model tiny-qwen2.5-vl --dataset synthetic --index 3 --output page.html
  vepo-trl inspect --model Qwen/Qwen2.5-VL-7B-Instruct --image fig.png --question "Find x." --num_generations 8
  vepo-trl demo --selection_samples_steps 5 && vepo-trl inspect --records vepo-demo/selection_samples.jsonl
"""


@dataclass
class InspectSource:
    image: str | None = option(None, "Image file of the prompt.", reads=ALWAYS, rule=path_rule("in_file", "an image file that exists"),
                               group="source")  # fmt: skip
    question: str | None = option(None, "The question (an <image> placeholder marks where the image goes).",
                                  reads=OWN_PROMPT, rule=TEXT, group="source")  # fmt: skip
    answer: str | None = option(None, "Reference answer: the page then shows each completion's reward.", reads=ALWAYS, rule=TEXT,
                                group="source")  # fmt: skip
    dataset: str | None = option(None, "Data set name or local file; the row's answer gives the rewards.", reads=ALWAYS, rule=TEXT,
                                 group="source")  # fmt: skip
    split: str = option("train", "", reads=DATA_ROW, rule=TEXT, group="source")
    index: int | None = option(None, "Row of --dataset. Default 0.", group="source",
                               reads=DATA_ROW, rule=whole(at_least(0), "a whole row number >= 0", True))  # fmt: skip
    records: str | None = option(None, "Render saved selection records (JSON Lines) instead of running a model.",
                                 reads=ALWAYS, rule=path_rule("in_file", "a selection-records file (JSON Lines) that exists"),
                                 group="source")  # fmt: skip
    response: list[str] | None = option(None, "Score this response instead of sampling (repeatable).", reads=ALWAYS, rule=TEXT,
                                        group="source", repeatable=True)  # fmt: skip


@dataclass
class InspectOptions(ResponseOptions, SettingsOptions, ModelOptions, InspectSource):
    k: float | None = option(None, "k: fraction of each response kept. Default 0.2.",
                             reads=RUNS_MODEL, rule=optional(RANGES["selection_ratio"]), group=SETTINGS)  # fmt: skip
    reward_funcs: list[str] = option(["accuracy", "format"], "", reads=RUNS_MODEL, rule=REWARD_NAME,
                                     group="rewards")  # fmt: skip
    reward_weights: list[float] = option(
        [0.9, 0.1], "", reads=RUNS_MODEL, rule=RANGES["reward_weights"], group="rewards"
    )
    output: str | None = option(
        None, f"The HTML page to write (default: {DEFAULT_PAGE}, or {DEFAULT_PAGE.replace('.html', '-2.html')}, ... "
        "when an earlier page has that name: a page is replaced only when named).", reads=ALWAYS, rule=OUT_FILE, group="output")  # fmt: skip
    save_records: str | None = option(None, "Also save the selection records (JSON Lines) here; appended to a records file that exists.", reads=ALWAYS, rule=RECORDS_FILE,
                                      group="output")  # fmt: skip
    title: str | None = option(None, "", reads=ALWAYS, rule=TEXT, group="output")


def make_parser() -> argparse.ArgumentParser:
    return parser_for(
        InspectOptions,
        prog="vepo-trl inspect",
        description=INSPECT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def main(argv: list[str]) -> None:
    args = make_parser().parse_args(argv)
    from ..insight.inspect_command import inspect_main

    inspect_main(args)
