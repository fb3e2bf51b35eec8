"""Each family's reference checkpoint's `config.json` as recorded from public copies, less its sizes (the
`REFERENCE_CONFIG` each family module declares beside its adapter, in `vepo_trl.families`): what a tiny
test model (`vepo_trl.builtin.tiny_models.build_tiny_config(family, build_tiny_processor(family))`) must match on
every field but its widths, depths, vocabulary and token ids, image size and token budgets. Keyed by the family
module's name (underscores); the checkpoints are `tests/reference_processors.py`'s
`REAL_PROCESSORS[name].checkpoint`. Each entry cites its source in a comment above it and in its "source" ("read":
a public copy of the file, named; "as X": another entry's or a sibling checkpoint's file, and then derived from it;
"card": the model card; "class defaults": the transformers class, whose docstring names the checkpoint).

An entry's "config" holds the file's own keys as the file spells them (transformers 4.x: `rope_theta` and
`rope_scaling` flat, `type: "mrope"`; transformers 5.24+ folds them into `rope_parameters` when it loads the file,
so compare through the family's config class, not key by key). "implied" holds values the file leaves out and the
transformers class supplies when it loads it (class defaults), recorded where a tiny model could set them
otherwise. "family" holds values read for sibling checkpoints only, kept apart. "unsourced" names fields of the
file that no public copy read here showed. Keys for which `is_size_key` holds are sizes and are left out; keys in
`SCALED_KEYS` scale with a size (compare their proportions); a `Pattern` stands for a per-layer list whose length
is a depth."""

from __future__ import annotations

from vepo_trl.families import FAMILY_MODULES
from vepo_trl.families.base import Pattern


__all__ = ["REFERENCE_CONFIGS", "SCALED_KEYS", "SIZE_KEYS", "Pattern", "is_size_key"]


# Keys classed as sizes (widths, depths, vocabulary and token ids, image geometry, token budgets): left out of
# "config", skipped by a comparison. Any key ending in "_token_id", "_token_index" or "_token_ids" is a size too
# (see `is_size_key`).
SIZE_KEYS = frozenset(
    {
        # widths
        "hidden_size",
        "intermediate_size",
        "embed_dim",
        "mlp_ratio",  # Qwen2-VL vision: intermediate / hidden
        "out_hidden_size",
        "projection_dim",
        "head_dim",
        "global_head_dim",
        "query_pre_attn_scalar",  # Gemma: head_dim (hidden / heads at 27B)
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "hidden_size_per_layer_input",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "resampler_head_dim",
        "vision_output_dim",
        # depths and head counts
        "num_hidden_layers",
        "depth",
        "num_attention_heads",
        "num_heads",
        "num_key_value_heads",
        "num_global_key_value_heads",
        "linear_num_key_heads",
        "linear_num_value_heads",
        "num_experts",
        "num_local_experts",
        "num_experts_per_tok",
        "num_kv_shared_layers",
        "resampler_depth",
        "resampler_n_heads",
        "max_window_layers",  # a layer count
        "fullatt_block_indexes",  # layer indexes: Qwen2.5-VL's is every 8th block's last, [7, 15, 23, 31]
        "deepstack_visual_indexes",  # layer indexes
        "mlp_only_layers",  # layer indexes
        # vocabulary and token ids
        "vocab_size",
        "vocab_size_per_layer_input",
        "pad_token_id",
        "bos_token_id",
        "eos_token_id",
        "image_token_id",
        "image_token_index",
        "video_token_id",
        "video_token_index",
        "vision_start_token_id",
        "vision_end_token_id",
        "vision_token_id",
        "image_start_token_id",
        "image_end_token_id",
        "video_start_token_id",
        "video_end_token_id",
        "boi_token_index",
        "eoi_token_index",
        "boi_token_id",
        "eoi_token_id",
        "boa_token_id",
        "eoa_token_id",
        "eoa_token_index",
        "audio_token_id",
        "ignore_index",
        # image geometry
        "image_size",
        "patch_size",
        "spatial_patch_size",
        "num_positions",
        "num_position_embeddings",
        "position_embedding_size",
        "window_size",  # Qwen2.5-VL vision window, in pixels
        "image_grid_pinpoints",
        # token budgets and lengths
        "max_position_embeddings",
        "sliding_window",  # tokens (null / set matters: recorded in the comments)
        "mm_tokens_per_image",
        "num_image_tokens",
        "image_seq_length",
        "image_seq_len",
        "resampler_n_latents",
        "scale_factor",  # SmolVLM pixel shuffle: tokens per tile
        "default_output_length",  # Gemma 4 vision: soft tokens per image
    }
)

# Keys whose values scale with a size (head_dim): compare proportions, not values
SCALED_KEYS = frozenset({"mrope_section"})


def is_size_key(key: str) -> bool:
    """Whether `key` is a size: in `SIZE_KEYS`, or a token id / index."""
    return key in SIZE_KEYS or key.endswith(("_token_id", "_token_index", "_token_ids"))


# By the family's module name (underscores), as the tests name them
REFERENCE_CONFIGS: dict[str, dict] = {
    module.__name__.rsplit(".", 1)[1]: module.REFERENCE_CONFIG
    for module in FAMILY_MODULES.values()
    if hasattr(module, "REFERENCE_CONFIG")
}
