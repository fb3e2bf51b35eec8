"""Evaluation like the paper: the seven benchmarks of Table 1, rule and LLM-judge grading, a Table-1 summary.

- `benchmarks`: one registered adapter per benchmark (data, prompt, gold mapping, sub-categories)
- `grading`: the three grading protocols (`paper`, `lenient`, `rule`) and the rule grader
- `paper`: the VEPO release's per-benchmark grading, its judge prompts verbatim (the `paper` protocol)
- `judge`: an LLM judge through any OpenAI-compatible endpoint (the `lenient` protocol's prompt)
- `generate`: greedy generation with vLLM or transformers
- `table`: the summary and the paper's Table 1
- `rows`: greedy evaluation of rows in the training format, scored with the reward functions (the notebook's check)
- `run`: the `vepo-trl eval` command
"""

from .benchmarks import (
    BENCHMARKS,
    PAPER_BENCHMARKS,
    Benchmark,
    EvalDataError,
    Example,
    get_benchmark,
    register_benchmark,
)
from .grading import rule_grade
from .table import PAPER_TABLE1


__all__ = [
    "BENCHMARKS",
    "PAPER_BENCHMARKS",
    "PAPER_TABLE1",
    "Benchmark",
    "EvalDataError",
    "Example",
    "get_benchmark",
    "register_benchmark",
    "rule_grade",
]
