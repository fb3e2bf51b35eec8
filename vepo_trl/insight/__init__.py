"""See what VEPO trains on: selection records, the token page, the selection analysis and training plots.

- `records`: `SelectionRecord`, `records_from_signals` (from a VEPO step's tensors), `save_records` / `load_records`.
- `signals`: the trainer's signals for given completions of one prompt (`completion_signals`), outside training.
- `page`: one self-contained HTML page of records (`write_page`).
- `analysis`: the paper's selection analysis (`SelectionAnalysis`, `overlap_counts`); `plots`: training curves.
- `inspect_command`, `analyze_command`, `plot_command`: `vepo-trl inspect`, `analyze` and `plot`; `commands`: what
  they share (arguments, checks, loading).

`analysis` and `plots` import matplotlib when they draw; nothing here imports TRL's trainers.
"""

from ..utils import lazy_exports


# Loaded on first use (PEP 562): `inspect`, `analyze` and `plot` parse their options before torch is imported
_EXPORTS = {
    "render_page": "page",
    "write_page": "page",
    "SelectionRecord": "records",
    "image_to_data_uri": "records",
    "load_records": "records",
    "marked_completion": "records",
    "prompt_text": "records",
    "records_from_signals": "records",
    "save_records": "records",
    "token_texts": "records",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
