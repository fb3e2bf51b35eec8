"""See what VEPO trains on: selection records, the token page, the selection analysis and training plots.

- `records`: `SelectionRecord`, `records_from_signals` (from a VEPO step's tensors), `save_records` / `load_records`.
- `signals`: the trainer's signals for given completions of one prompt (`completion_signals`), outside training.
- `page`: one self-contained HTML page of records (`write_page`).
- `analysis`: the paper's selection analysis (`SelectionAnalysis`, `overlap_counts`); `plots`: training curves.
- `runs`: a model run outside training: a recipe's settings (`signal_settings`), data rows (`load_rows`), the model
  (`load_model`), sampled responses (`sample_completions`) and their rewards (`score_rewards`).

`vepo-trl inspect`, `analyze` and `plot` (`vepo_trl.commands`) are built on these exports alone.

`analysis` and `plots` import matplotlib when they draw; nothing here imports TRL's trainers.
"""

from ..utils import lazy_exports


# Loaded on first use (PEP 562): `inspect`, `analyze` and `plot` parse their options before torch is imported
_EXPORTS = {
    "SelectionAnalysis": "analysis",
    "overlap_counts": "analysis",
    "FIGURES": "plots",
    "load_run": "plots",
    "plot_runs": "plots",
    "SignalSettings": "signals",
    "build_messages": "signals",
    "completion_signals": "signals",
    "encode_prompt": "signals",
    "encode_responses": "signals",
    "SYNTHETIC_DATASET": "runs",
    "SYNTHETIC_ROWS": "runs",
    "dataset_bounds": "runs",
    "load_model": "runs",
    "load_rows": "runs",
    "pixel_bounds": "runs",
    "read_recipe": "runs",
    "sample_completions": "runs",
    "score_rewards": "runs",
    "signal_settings": "runs",
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
