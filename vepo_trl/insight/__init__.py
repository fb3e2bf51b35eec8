"""See what VEPO trains on: selection records, token pages, the selection analysis and training plots."""

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
    "save_records",
    "token_texts",
]
