"""`vepo-trl eval` (alias `evaluate`): its options, declared once (`EvalOptions`) and checked by their rules as they
are parsed (before `datasets`, torch or a model is imported), then `vepo_trl.eval.run.run`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from ..eval.names import PAPER_BENCHMARKS, PROTOCOL_HELP, PROTOCOLS
from ..options import DefaultsHelpFormatter, option, parser_for
from ..validation import (
    ALWAYS,
    EVALUATES,
    FLAG,
    GENERATES,
    JUDGED,
    MODEL,
    OUT_FOLDER,
    PUSHES,
    RANGES,
    SAMPLED_EVAL,
    TEXT,
    VLLM_ENGINE,
    above,
    at_least,
    between,
    names,
    number,
    path_rule,
    whole,
)


PAPER_MODELS = ("Qwen2.5-VL-3B-Instruct", "Qwen2.5-VL-7B-Instruct")


@dataclass
class EvalOptions:
    # model
    model: str | None = option(None, "Model folder or Hub id (a PEFT adapter folder works too); required unless "
                               "--rescore.", reads=GENERATES, rule=MODEL, group="model")  # fmt: skip
    adapter: str | None = option(None, "LoRA adapter folder applied on top of --model.", group="model",
                                 reads=GENERATES, rule=path_rule("in_folder", "a LoRA adapter folder that exists"))  # fmt: skip
    base_model: str | None = option(None, "Base model of an adapter (default: its adapter_config).", reads=GENERATES, rule=MODEL,
                                    group="model")  # fmt: skip
    dtype: str = option("auto", "Weights dtype.", reads=GENERATES, rule=names("auto", "bfloat16", "float16", "float32"), group="model",
                        choices=("auto", "bfloat16", "float16", "float32"))  # fmt: skip
    # data
    benchmarks: str = option("all", f"Comma-separated: the paper's {', '.join(PAPER_BENCHMARKS)}, synthetic, or any "
                             "other `vepo-trl strategies` lists (an installed plug-in's too); 'all' = the seven of the "
                             "paper's Table 1.", reads=ALWAYS, rule=TEXT, group="data")  # fmt: skip
    data_dir: str | None = option(None, "Folder with local copies, one sub-folder per benchmark (Hub parquet layout "
                                  "or NoisyRollout's eval_data).", group="data",
                                  reads=EVALUATES, rule=path_rule("in_folder", "a folder of benchmark copies, one sub-folder per "
                                                 "benchmark"))  # fmt: skip
    limit: int | None = option(None, "Evaluate only the first N examples of each benchmark (a partial run: no "
                               "average).", group="data",
                               reads=EVALUATES, rule=whole(at_least(1), "a whole number >= 1, or unset for every row", True))  # fmt: skip
    min_pixels: int = option(262_144, "Images are resized to at least this many pixels.", reads=GENERATES, rule=RANGES["min_pixels"],
                             group="data")  # fmt: skip
    max_pixels: int = option(1_000_000, "Images are resized to at most this many pixels.", reads=GENERATES, rule=RANGES["max_pixels"],
                             group="data")  # fmt: skip
    # generation
    max_new_tokens: int = option(2048, "", reads=GENERATES, rule=whole(at_least(1), "a whole number of tokens >= 1"),
                                 group="generation")  # fmt: skip
    num_samples: int = option(1, "Completions per question. 1 at --temperature 0 is greedy decoding, the release's "
                              "protocol; k > 1 reports avg@k (the mean accuracy over the k samples: VPPO reports "
                              "avg@8 at temperature 1.0) and pass@k (a right sample among the k), from the same "
                              "graded samples.", reads=GENERATES,
                              rule=whole(at_least(1), "a whole number of samples >= 1"), group="generation")  # fmt: skip
    temperature: float = option(0.0, "Sampling temperature; 0 is greedy.", reads=GENERATES,
                                rule=number(at_least(0), "0 (greedy) or above"), group="generation")  # fmt: skip
    top_p: float = option(1.0, "Nucleus sampling's probability mass, in (0, 1].", reads=SAMPLED_EVAL,
                          rule=number(between(0, 1, low_open=True), "in (0, 1]"), group="generation")  # fmt: skip
    seed: int = option(0, "Sample s of every question is drawn with seed + s (both backends).", reads=SAMPLED_EVAL,
                       rule=whole(at_least(0), "a whole number >= 0"), group="generation")  # fmt: skip
    backend: str = option("auto", "auto: vLLM when installed and running as one process, else transformers.",
                          reads=GENERATES, rule=names("auto", "vllm", "transformers"), group="generation",
                          choices=("auto", "vllm", "transformers"))  # fmt: skip
    batch_size: int | None = option(None, "Prompts per generate call (8; vLLM: 256).", group="generation",
                                    reads=GENERATES, rule=whole(at_least(1), "a whole number >= 1", True))  # fmt: skip
    max_model_len: int | None = option(None, "vLLM context length (default: the model's).", group="generation",
                                       reads=VLLM_ENGINE, rule=whole(at_least(1), "a whole number of tokens >= 1, or unset", True))  # fmt: skip
    gpu_memory_utilization: float | None = option(
        None, "vLLM: the share of GPU memory the engine may take, in (0, 1] (default: vLLM's 0.9); lower it when "
        "other processes hold memory.", group="generation",
        reads=VLLM_ENGINE, rule=number(between(0, 1, low_open=True), "in (0, 1], or unset (vLLM's 0.9)", True))  # fmt: skip
    tensor_parallel_size: int | None = option(
        None, "vLLM tensor parallelism (default: the most visible GPUs that divide the model's attention heads, e.g. "
        "4 of 8 for the 7B's 28 heads).", group="generation",
        reads=VLLM_ENGINE, rule=whole(at_least(1), "a whole number of GPUs >= 1, or unset", True))  # fmt: skip
    # grading
    protocol: str = option("paper", "; ".join(f"{name}: {text}" for name, text in PROTOCOL_HELP.items()) + ".",
                           reads=ALWAYS, rule=names(*PROTOCOLS), group="grading", choices=PROTOCOLS)  # fmt: skip
    rescore: str | None = option(None, "Grade the completions stored in DIR again under --protocol (no model, no "
                                 "generation); every protocol's verdicts are kept per record.", group="grading",
                                 metavar="DIR", reads=ALWAYS, rule=path_rule("in_folder", "an eval results folder that exists"))  # fmt: skip
    compare: list[str] | None = option(None, "Two results folders A B: avg@k of A minus B per benchmark, on the "
                                       "rows both hold, with its 0.95 interval (a paired bootstrap; no model, no "
                                       "generation). The difference is under --protocol.", group="grading",
                                       metavar="DIR", reads=ALWAYS,
                                       rule=path_rule("in_folder", "eval results folders that exist"))  # fmt: skip
    judge_model: str = option("gpt-4o-mini", "Judge of MathVerse, MathVision, MathVista, We-Math and MMK12 (the "
                              "paper's: gpt-4o-mini).", reads=JUDGED, rule=TEXT, group="grading")  # fmt: skip
    judge_base_url: str | None = option(None, "OpenAI-compatible endpoint (default: OpenAI's).", group="grading",
                                        reads=JUDGED, rule=path_rule("url", "an http:// or https:// address"))  # fmt: skip
    judge_api_key_env: str = option("OPENAI_API_KEY", "Environment variable holding the key.", reads=JUDGED, rule=TEXT,
                                    group="grading")  # fmt: skip
    judge_timeout: float = option(60.0, "Seconds per judge request.", reads=JUDGED, rule=number(above(0), "above 0 seconds"),
                                  group="grading")  # fmt: skip
    judge_max_retries: int = option(3, "Retries on timeouts, 429 and 5xx.", group="grading",
                                    reads=JUDGED, rule=whole(at_least(0), "a whole number >= 0 (0: no retries)"))  # fmt: skip
    judge_workers: int = option(8, "Concurrent judge requests.", group="grading",
                                reads=JUDGED, rule=whole(at_least(1), "a whole number >= 1 (concurrent judge requests)"))  # fmt: skip
    # output
    output_dir: str | None = option(None, "Results folder (default: eval-<model folder name>).", reads=EVALUATES, rule=OUT_FOLDER,
                                    group="output")  # fmt: skip
    paper_model: str | None = option(None, "Paper rows to show beside the results (default: guessed from the model "
                                     "name).", reads=EVALUATES, rule=names(*PAPER_MODELS), group="output", choices=PAPER_MODELS)  # fmt: skip
    # model card and Hub
    no_model_card: bool = option(False, "Leave the model folder's README.md as it is (by default the complete "
                                 "results are written into it as `model-index` metadata, the Hub's evaluation-results "
                                 "format).", reads=EVALUATES, rule=FLAG, group="model card and Hub")  # fmt: skip
    push_to_hub: bool = option(False, "Push the card with the results to --hub_model_id.", reads=GENERATES, rule=FLAG,
                               group="model card and Hub")  # fmt: skip
    hub_model_id: str | None = option(None, "The Hub repo of the model (owner/name), for --push_to_hub.", reads=PUSHES, rule=TEXT,
                                      group="model card and Hub")  # fmt: skip
    hub_token: str | None = option(None, "Hub token (default: the logged-in one, or HF_TOKEN).", reads=PUSHES, rule=TEXT,
                                   group="model card and Hub")  # fmt: skip


def make_parser() -> argparse.ArgumentParser:
    return parser_for(
        EvalOptions,
        prog="vepo-trl eval",
        description="Evaluation on the paper's seven benchmarks (or a subset), greedy or sampled (avg@k, pass@k), "
        "with 95% intervals, provenance and a Table-1 summary; --compare A B sets two result folders side by side.",
        formatter_class=DefaultsHelpFormatter,
    )


def main(argv: list[str]) -> dict[str, Any]:
    args = make_parser().parse_args(argv)
    from ..eval.run import run

    return run(args)
