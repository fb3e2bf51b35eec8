"""The names `vepo-trl eval`'s options take, importable without `datasets` or the graders (its parser reads them
before anything heavy loads): the grading protocols with their help, and the paper's seven benchmarks."""

PROTOCOLS = ("paper", "lenient", "rule")
PROTOCOL_HELP = {
    "paper": "the VEPO release's per-benchmark procedures (mathruler, exact yes/no, judge extraction then exact match, "
    "the MathVerse scoring prompt, We-Math letter extraction; MMK12 by MM-EUREKA's judge)",
    "lenient": "one gold-aware equivalence judge on the judged benchmarks (accepts 1.20 for 1.2, option text for the "
    "letter), rule elsewhere",
    "rule": "no judge: last \\boxed{} with math-verify, option letter or text, yes/no",
}
# The columns of the paper's Table 1, in its order (the benchmarks themselves, and any other registered one, are in
# `benchmarks.BENCHMARKS`: `vepo-trl strategies` lists them)
PAPER_BENCHMARKS = ("geometry3k", "mmk12", "hallusionbench", "mathvista", "wemath", "mathverse", "mathvision")
