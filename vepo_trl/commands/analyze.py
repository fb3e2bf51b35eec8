"""`vepo-trl analyze`: its options, checked by the option table as they are parsed (before torch or a model is
imported), then `vepo_trl.insight.analyze_command.analyze_main`."""

from __future__ import annotations

import argparse

from ..options import OneLineParser
from .insight_options import add_generation_options, add_model_options, add_settings_options


ANALYZE_HELP = """The paper's selection analysis (section 2.2, Fig. 2, Fig. 5c) over a data set and a model.

For each prompt, sample --num_generations responses, compute H, JSD and |dH| per token with the clean and perturbed
image, and count per response: how many top-k JSD tokens (and top-k |dH| tokens) top-k entropy also keeps, and how
many top-k JSD tokens the selection (VEPO) misses, for each k. Writes analysis.json, analysis.md (the table),
recall.png and entropy_vs_jsd.png (the joint distribution, Fig. 2a) under --output_dir.

Example:
  vepo-trl analyze --model tiny-qwen2.5-vl --dataset synthetic --limit 16 --output_dir vepo-analysis
"""


def make_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="vepo-trl analyze", description=ANALYZE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    data = parser.add_argument_group("data")
    data.add_argument("--dataset", required=True, help="Data set name or local file (synthetic generates rows).")
    data.add_argument("--split", default="train")
    data.add_argument("--limit", type=int, default=32, help="Prompts to analyse (the first N rows). Default 32.")
    add_model_options(parser)
    add_settings_options(parser, with_k=False)
    parser.add_argument(
        "--ratios", nargs="+", type=float, default=[0.1, 0.2, 0.4, 0.8], help="The k values. Default 0.1 0.2 0.4 0.8."
    )
    add_generation_options(parser, num_generations=4)
    parser.add_argument("--output_dir", default="vepo-analysis")
    parser.add_argument("--save_records", help="Also save every response's selection records (JSON Lines) here.")
    return parser


def main(argv: list[str]) -> None:
    args = make_parser().parse_args(argv)
    from ..insight.analyze_command import analyze_main

    analyze_main(args)
