"""`vepo-trl inspect`: its options, checked by the option table as they are parsed (before torch or a model is
imported), then `vepo_trl.insight.inspect_command.inspect_main`."""

from __future__ import annotations

import argparse

from ..insight.inspect_command import DEFAULT_PAGE
from ..options import OneLineParser
from .insight_options import add_generation_options, add_model_options, add_settings_options


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


def make_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="vepo-trl inspect", description=INSPECT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_argument_group("source")
    source.add_argument("--image", help="Image file of the prompt.")
    source.add_argument("--question", help="The question (an <image> placeholder marks where the image goes).")
    source.add_argument("--answer", help="Reference answer: the page then shows each completion's reward.")
    source.add_argument("--dataset", help="Data set name or local file; the row's answer gives the rewards.")
    source.add_argument("--split", default="train")
    source.add_argument("--index", type=int, default=None, help="Row of --dataset. Default 0.")
    source.add_argument("--records", help="Render saved selection records (JSON Lines) instead of running a model.")
    source.add_argument("--response", action="append", help="Score this response instead of sampling (repeatable).")
    add_model_options(parser)
    add_settings_options(parser)
    add_generation_options(parser, num_generations=4)
    rewards = parser.add_argument_group("rewards")
    rewards.add_argument("--reward_funcs", nargs="+", default=["accuracy", "format"])
    rewards.add_argument("--reward_weights", nargs="+", type=float, default=[0.9, 0.1])
    output = parser.add_argument_group("output")
    output.add_argument(
        "--output",
        default=None,
        help=f"The HTML page to write (default: {DEFAULT_PAGE}, or {DEFAULT_PAGE.replace('.html', '-2.html')}, ... "
        "when an earlier page has that name: a page is replaced only when named).",
    )
    output.add_argument("--save_records", help="Also save the selection records (JSON Lines) here.")
    output.add_argument("--title", default=None)
    return parser


def main(argv: list[str]) -> None:
    args = make_parser().parse_args(argv)
    from ..insight.inspect_command import inspect_main

    inspect_main(args)
