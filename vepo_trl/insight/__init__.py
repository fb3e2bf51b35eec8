"""See what VEPO trains on: selection records, the token page, the selection analysis and training plots.

- `records`: `SelectionRecord`, `records_from_signals` (from a VEPO step's tensors), `save_records` / `load_records`.
- `signals`: the trainer's signals for given completions of one prompt (`completion_signals`), outside training.
- `page`: one self-contained HTML page of records (`write_page`).
- `analysis`: the paper's selection analysis (`SelectionAnalysis`, `overlap_counts`); `plots`: training curves.
- `inspect_command`, `analyze_command`, `plot_command`: `vepo-trl inspect`, `analyze` and `plot`; `commands`: what
  they share (arguments, checks, loading).

`analysis` and `plots` import matplotlib when they draw; nothing here imports TRL's trainers.
"""

from .page import render_page, write_page
from .records import (
    SelectionRecord,
    image_to_data_uri,
    load_records,
    marked_completion,
    prompt_text,
    records_from_signals,
    save_records,
    token_texts,
)


__all__ = [
    "SelectionRecord",
    "image_to_data_uri",
    "load_records",
    "marked_completion",
    "prompt_text",
    "records_from_signals",
    "render_page",
    "save_records",
    "token_texts",
    "write_page",
]
