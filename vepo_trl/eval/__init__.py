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

from ..utils import lazy_exports


# Loaded on first use (PEP 562): the command's parser reads `eval.names` without importing datasets or the graders
_EXPORTS = {
    "BENCHMARKS": "benchmarks",
    "PAPER_BENCHMARKS": "benchmarks",
    "Benchmark": "benchmarks",
    "EvalDataError": "benchmarks",
    "Example": "benchmarks",
    "get_benchmark": "benchmarks",
    "register_benchmark": "benchmarks",
    "rule_grade": "grading",
    "PAPER_TABLE1": "table",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
