"""`vepo-trl eval` (alias `evaluate`): its options, checked by the option table as they are parsed (before `datasets`,
torch or a model is imported), then `vepo_trl.eval.run.run`."""

from __future__ import annotations

import argparse
from typing import Any

from ..eval.names import BENCHMARK_NAMES, PROTOCOL_HELP, PROTOCOLS
from ..options import OneLineParser


def make_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="vepo-trl eval",
        description="Greedy evaluation on the paper's seven benchmarks (or a subset), with a Table-1 summary.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    model = parser.add_argument_group("model")
    model.add_argument("--model", default=None,
                       help="Model folder or Hub id (a PEFT adapter folder works too); required unless --rescore.")  # fmt: skip
    model.add_argument("--adapter", default=None, help="LoRA adapter folder applied on top of --model.")
    model.add_argument("--base_model", default=None, help="Base model of an adapter (default: its adapter_config).")
    model.add_argument(
        "--dtype", default="auto", choices=("auto", "bfloat16", "float16", "float32"), help="Weights dtype."
    )
    data = parser.add_argument_group("data")
    data.add_argument(
        "--benchmarks",
        default="all",
        help=f"Comma-separated: {', '.join(BENCHMARK_NAMES)}; 'all' = the seven of the paper's Table 1.",
    )
    data.add_argument(
        "--data_dir",
        default=None,
        help="Folder with local copies, one sub-folder per benchmark (Hub parquet layout or NoisyRollout's eval_data).",
    )
    data.add_argument("--limit", type=int, default=None,
                      help="Evaluate only the first N examples of each benchmark (a partial run: no average).")  # fmt: skip
    data.add_argument(
        "--min_pixels", type=int, default=262_144, help="Images are resized to at least this many pixels."
    )
    data.add_argument(
        "--max_pixels", type=int, default=1_000_000, help="Images are resized to at most this many pixels."
    )
    gen = parser.add_argument_group("generation")
    gen.add_argument("--max_new_tokens", type=int, default=2048)
    gen.add_argument("--backend", choices=("auto", "vllm", "transformers"), default="auto",
                     help="auto: vLLM when installed and running as one process, else transformers.")  # fmt: skip
    gen.add_argument("--batch_size", type=int, default=None, help="Prompts per generate call (8; vLLM: 256).")
    gen.add_argument("--max_model_len", type=int, default=None, help="vLLM context length (default: the model's).")
    gen.add_argument("--gpu_memory_utilization", type=float, default=None,
                     help="vLLM: the share of GPU memory the engine may take, in (0, 1] (default: vLLM's 0.9); lower "
                          "it when other processes hold memory.")  # fmt: skip
    gen.add_argument("--tensor_parallel_size", type=int, default=None,
                     help="vLLM tensor parallelism (default: the most visible GPUs that divide the model's attention "
                          "heads, e.g. 4 of 8 for the 7B's 28 heads).")  # fmt: skip
    grading = parser.add_argument_group("grading")
    grading.add_argument("--protocol", choices=PROTOCOLS, default="paper",
                         help="; ".join(f"{name}: {text}" for name, text in PROTOCOL_HELP.items()) + ".")  # fmt: skip
    grading.add_argument("--rescore", default=None, metavar="DIR",
                         help="Grade the completions stored in DIR again under --protocol (no model, no generation); "
                              "every protocol's verdicts are kept per record.")  # fmt: skip
    grading.add_argument("--judge_model", default="gpt-4o-mini",
                         help="Judge of MathVerse, MathVision, MathVista, We-Math and MMK12 (the paper's: gpt-4o-mini).")  # fmt: skip
    grading.add_argument("--judge_base_url", default=None, help="OpenAI-compatible endpoint (default: OpenAI's).")
    grading.add_argument("--judge_api_key_env", default="OPENAI_API_KEY", help="Environment variable holding the key.")
    grading.add_argument("--judge_timeout", type=float, default=60.0, help="Seconds per judge request.")
    grading.add_argument("--judge_max_retries", type=int, default=3, help="Retries on timeouts, 429 and 5xx.")
    grading.add_argument("--judge_workers", type=int, default=8, help="Concurrent judge requests.")
    out = parser.add_argument_group("output")
    out.add_argument("--output_dir", default=None, help="Results folder (default: eval-<model folder name>).")
    out.add_argument("--paper_model", default=None, choices=("Qwen2.5-VL-3B-Instruct", "Qwen2.5-VL-7B-Instruct"),
                     help="Paper rows to show beside the results (default: guessed from the model name).")  # fmt: skip
    hub = parser.add_argument_group("model card and Hub")
    hub.add_argument("--no_model_card", action="store_true",
                     help="Leave the model folder's README.md as it is (by default the complete results are written "
                          "into it as `model-index` metadata, the Hub's evaluation-results format).")  # fmt: skip
    hub.add_argument("--push_to_hub", action="store_true", help="Push the card with the results to --hub_model_id.")
    hub.add_argument("--hub_model_id", default=None, help="The Hub repo of the model (owner/name), for --push_to_hub.")
    hub.add_argument("--hub_token", default=None, help="Hub token (default: the logged-in one, or HF_TOKEN).")
    return parser


def main(argv: list[str]) -> dict[str, Any]:
    args = make_parser().parse_args(argv)
    from ..eval.run import run

    return run(args)
