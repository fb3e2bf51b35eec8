"""`vepo-trl analyze`: its options, declared once (`AnalyzeOptions`) and checked by their rules as they are
parsed (before torch or a model is
imported), then `vepo_trl.insight.analyze_command.analyze_main`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..options import option, parser_for
from ..validation import ALWAYS, RECORDS_FILE, TEXT, Rule, at_least, path_rule, whole
from .insight_options import ModelOptions, ResponseOptions, SettingsOptions


ANALYZE_HELP = """The paper's selection analysis (section 2.2, Fig. 2, Fig. 5c) over a data set and a model.

For each prompt, sample --num_generations responses, compute H, JSD and |dH| per token with the clean and perturbed
image, and count per response: how many top-k JSD tokens (and top-k |dH| tokens) top-k entropy also keeps, and how
many top-k JSD tokens the selection (VEPO) misses, for each k. Writes analysis.json, analysis.md (the table),
recall.png and entropy_vs_jsd.png (the joint distribution, Fig. 2a) under --output_dir.

Example:
  vepo-trl analyze --model tiny-qwen2.5-vl --dataset synthetic --limit 16 --output_dir vepo-analysis
"""


@dataclass
class AnalyzeData:
    dataset: str | None = option(None, "Data set name or local file (synthetic generates rows).", reads=ALWAYS, rule=TEXT,
                                 group="data", required=True)  # fmt: skip
    split: str = option("train", "", reads=ALWAYS, rule=TEXT, group="data")
    limit: int = option(32, "Prompts to analyse (the first N rows). Default 32.", group="data",
                        reads=ALWAYS, rule=whole(at_least(1), "a whole number >= 1"))  # fmt: skip


@dataclass
class AnalyzeOptions(ResponseOptions, SettingsOptions, ModelOptions, AnalyzeData):
    ratios: list[float] = option([0.1, 0.2, 0.4, 0.8], "The k values. Default 0.1 0.2 0.4 0.8.",
                                 reads=ALWAYS, rule=Rule("numbers", "fractions in (0, 1]", lambda v: 0 < v <= 1))  # fmt: skip
    output_dir: str = option(
        "vepo-analysis", "", reads=ALWAYS, rule=path_rule("out_folder", "a folder that can be written", False)
    )
    save_records: str | None = option(None, "Also save every response's selection records (JSON Lines) here; appended to a records file that exists.",
                                      reads=ALWAYS, rule=RECORDS_FILE)  # fmt: skip


def make_parser() -> argparse.ArgumentParser:
    return parser_for(
        AnalyzeOptions,
        prog="vepo-trl analyze",
        description=ANALYZE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def main(argv: list[str]) -> None:
    args = make_parser().parse_args(argv)
    from ..insight.analyze_command import analyze_main

    analyze_main(args)
