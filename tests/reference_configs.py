"""Each family's reference checkpoint's `config.json` as recorded from public copies, less its sizes: what a tiny
test model (`vepo_trl.builtin.tiny_models.build_tiny_config(family, build_tiny_processor(family))`) must match on
every field but its widths, depths, vocabulary and token ids, image size and token budgets. Keyed by the module
names of `vepo_trl.builtin.tiny_recipes` (underscores); the checkpoints are `tests/reference_processors.py`'s
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
is a depth. Test data, not the package's."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pattern:
    """A per-layer list whose length is a depth: `period` repeated from layer 0, cut to the depth; `last`, when set,
    replaces the last layer's entry (transformers forces full attention there for Gemma 4)."""

    period: tuple
    last: object = None

    def expand(self, depth: int) -> list:
        values = [self.period[i % len(self.period)] for i in range(depth)]
        if self.last is not None and values:
            values[-1] = self.last
        return values


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


REFERENCE_CONFIGS: dict[str, dict] = {}


# Qwen/Qwen2-VL-7B-Instruct config.json (read: fine-tunes of it on the Hub whose config.json keep its non-size
# fields, OS-Copilot/OS-Atlas-Pro-7B and HongxinLi/UIPro-7B_Stage2_Web; the official file itself not read; its
# Qwen2 text fields are those of Qwen2.5-VL-7B-Instruct's file below too; both fine-tunes are of Qwen2-VL-7B). Flat text fields (transformers 4.45
# layout): transformers 5 moves them into text_config and rope_theta + rope_scaling into
# text_config.rope_parameters ({"rope_type": "default", "mrope_section": ..., "rope_theta": ...}). The vision_config
# carries only model_type "qwen2_vl" (5.x: "qwen2_vl_vision"), in_chans 3 and spatial_patch_size 14: its activation
# is Qwen2VLVisionConfig's default quick_gelu (class defaults; Qwen2-VL-7B's module print shows QuickGELUActivation)
REFERENCE_CONFIGS["qwen2_vl"] = {
    "checkpoint": "Qwen/Qwen2-VL-7B-Instruct",
    "source": "read: huggingface.co/OS-Copilot/OS-Atlas-Pro-7B/blob/main/config.json and "
    "huggingface.co/HongxinLi/UIPro-7B_Stage2_Web/blob/main/config.json (fine-tunes keeping its non-size fields); "
    "vision activation: class defaults",
    "config": {
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "model_type": "qwen2_vl",
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "use_cache": True,
        "vision_config": {"model_type": "qwen2_vl", "in_chans": 3},
    },
    "implied": {"vision_config": {"hidden_act": "quick_gelu", "spatial_merge_size": 2, "temporal_patch_size": 2}},
    "unsourced": [],
}


# Qwen/Qwen2.5-VL-7B-Instruct config.json (read: QWEN2_5_VL_7B_CONFIG in github NVIDIA/TensorRT-LLM
# tests/unittest/_torch/modeling/test_modeling_qwen2_5vl.py, the file with its depths cut for the test; a public
# README quoting the file with keys of its own added agrees, with fullatt_block_indexes [7, 15, 23, 31]). Flat text fields as Qwen2-VL's
# (transformers 5: text_config, rope_parameters). Vision: silu (a SwiGLU MLP), RMSNorm, window attention
REFERENCE_CONFIGS["qwen2_5_vl"] = {
    "checkpoint": "Qwen/Qwen2.5-VL-7B-Instruct",
    "source": "read: github NVIDIA/TensorRT-LLM tests/unittest/_torch/modeling/test_modeling_qwen2_5vl.py "
    "(QWEN2_5_VL_7B_CONFIG)",
    "config": {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": "qwen2_5_vl",
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "use_cache": True,
        "vision_config": {
            "hidden_act": "silu",
            "in_chans": 3,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "tokens_per_second": 2,
        },
    },
    "unsourced": [],
}


# Qwen/Qwen3-VL-8B-Instruct config.json (read: QWEN3_VL_8B_CONFIG in github NVIDIA/TensorRT-LLM
# tests/unittest/_torch/modeling/test_modeling_qwen3vl.py, the file with its depth cut for the test). Interleaved
# M-RoPE [24, 20, 20] of head_dim 128; transformers 5 folds rope_theta into text_config.rope_parameters
REFERENCE_CONFIGS["qwen3_vl"] = {
    "checkpoint": "Qwen/Qwen3-VL-8B-Instruct",
    "source": "read: github NVIDIA/TensorRT-LLM tests/unittest/_torch/modeling/test_modeling_qwen3vl.py "
    "(QWEN3_VL_8B_CONFIG)",
    "config": {
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "tie_word_embeddings": False,
        "text_config": {
            "model_type": "qwen3_vl_text",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "hidden_act": "silu",
            "initializer_range": 0.02,
            "rms_norm_eps": 1e-06,
            "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
            "rope_theta": 5000000,
            "tie_word_embeddings": False,
            "use_cache": True,
        },
        "vision_config": {
            "model_type": "qwen3_vl",
            "hidden_act": "gelu_pytorch_tanh",
            "in_channels": 3,
            "initializer_range": 0.02,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
    },
    "unsourced": [],
}


# Qwen/Qwen3-VL-30B-A3B-Instruct config.json (read: QWEN3_VL_30B_A3B_CONFIG in github NVIDIA/TensorRT-LLM
# tests/unittest/_torch/modeling/test_modeling_qwen3vl_moe.py, the file with its depth cut for the test): as
# qwen3_vl, plus the MoE text fields (norm_topk_prob true: transformers 5.24's Qwen3VLMoeTextConfig declares none)
REFERENCE_CONFIGS["qwen3_vl_moe"] = {
    "checkpoint": "Qwen/Qwen3-VL-30B-A3B-Instruct",
    "source": "read: github NVIDIA/TensorRT-LLM tests/unittest/_torch/modeling/test_modeling_qwen3vl_moe.py "
    "(QWEN3_VL_30B_A3B_CONFIG)",
    "config": {
        "architectures": ["Qwen3VLMoeForConditionalGeneration"],
        "model_type": "qwen3_vl_moe",
        "tie_word_embeddings": False,
        "text_config": {
            "model_type": "qwen3_vl_moe_text",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "decoder_sparse_step": 1,
            "hidden_act": "silu",
            "initializer_range": 0.02,
            "norm_topk_prob": True,
            "rms_norm_eps": 1e-06,
            "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
            "rope_theta": 5000000,
            "use_cache": True,
        },
        "vision_config": {
            "model_type": "qwen3_vl_moe",
            "hidden_act": "gelu_pytorch_tanh",
            "in_channels": 3,
            "initializer_range": 0.02,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
    },
    "unsourced": [],
}


# Qwen/Qwen3.5-9B config.json (read, in part: Hub fine-tunes whose config.json name it, khtsly/Mini-Coder
# ("model_name": "Qwen/Qwen3.5-9B") and NexVeridian/OmniCoder-9B-5bit, show the outer and text fields below up to
# layer_types; their rope fields were cut from the copies read). Gated DeltaNet x3 then full attention (the
# layer_types of 32 layers, full_attention_interval 4). The rope fields ("as Qwen3.5-27B": public fixtures
# transcribing Qwen3.5 dense configs agree on rope_theta 1e7, partial_rotary_factor 0.25, interleaved M-RoPE
# [11, 11, 10] of head_dim 256; not read for the 9B) are recorded apart, under "family"; tie_word_embeddings and
# the vision_config not read
REFERENCE_CONFIGS["qwen3_5"] = {
    "checkpoint": "Qwen/Qwen3.5-9B",
    "source": "read (in part): huggingface.co/khtsly/Mini-Coder/blob/main/config.json and "
    "huggingface.co/NexVeridian/OmniCoder-9B-5bit/blob/main/config.json; rope: as Qwen3.5-27B (public fixtures)",
    "config": {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": {
            "attention_bias": False,
            "attention_dropout": 0.0,
            "attn_output_gate": True,
            "full_attention_interval": 4,
            "hidden_act": "silu",
            "initializer_range": 0.02,
            "layer_types": Pattern(("linear_attention", "linear_attention", "linear_attention", "full_attention")),
            "linear_conv_kernel_dim": 4,
        },
    },
    "family": {
        "text_config": {
            "rms_norm_eps": 1e-06,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000000.0,
                "partial_rotary_factor": 0.25,
                "mrope_interleaved": True,
                "mrope_section": [11, 11, 10],
            },
        }
    },
    "unsourced": ["tie_word_embeddings", "text_config.rms_norm_eps", "text_config.rope_parameters", "vision_config"],
}


# Qwen/Qwen3.5-35B-A3B config.json (not read: a public fixture shaped as its text config, an mlx-lm
# GatedDeltaNet reference (hidden 2048, 40 layers, 256 experts, 8 active), gives the text fields below; its
# layer_types pattern and model types are also Qwen3_5MoeConfig's class defaults, whose docstring names this
# checkpoint). M-RoPE sections, tie_word_embeddings and the vision_config not read
REFERENCE_CONFIGS["qwen3_5_moe"] = {
    "checkpoint": "Qwen/Qwen3.5-35B-A3B",
    "source": "a public fixture shaped as its text config (an mlx-lm GatedDeltaNet reference); class defaults",
    "config": {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": {
            "model_type": "qwen3_5_moe_text",
            "full_attention_interval": 4,
            "layer_types": Pattern(("linear_attention", "linear_attention", "linear_attention", "full_attention")),
            "linear_conv_kernel_dim": 4,
            "norm_topk_prob": True,
            "rms_norm_eps": 1e-06,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25},
        },
    },
    "unsourced": [
        "text_config.rope_parameters.mrope_section",
        "text_config.rope_parameters.mrope_interleaved",
        "tie_word_embeddings",
        "vision_config",
    ],
}


# google/gemma-3-4b-it config.json (read: two public fixtures quoting the file agree, one "The shape of
# google/gemma-3-4b-it's config.json" (vision omitted), one with its vision_config; a third adds
# text_config.final_logit_softcapping 30.0, which the others and transformers' conversion script (variant
# gemma3_4b) lack: left out). The file names few keys; transformers' Gemma3TextConfig defaults (docstring:
# gemma-3-4b-it) and the conversion script's gemma3_4b variant give the rest ("implied"). Transformers 5 folds
# rope_theta 1e6 with rope_scaling (linear, factor 8) into rope_parameters["full_attention"] and
# rope_local_base_freq 1e4 into rope_parameters["sliding_attention"]; sliding_window_pattern 6 becomes layer_types
# (5 sliding, 1 full). vision_use_head false (checked: also the conversion script's _VISION_CONFIG)
REFERENCE_CONFIGS["gemma3"] = {
    "checkpoint": "google/gemma-3-4b-it",
    "source": "read: public fixtures quoting the file; github huggingface/transformers "
    "src/transformers/models/gemma3/convert_gemma3_weights.py (variant gemma3_4b, _VISION_CONFIG); class defaults",
    "config": {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "initializer_range": 0.02,
        "text_config": {
            "model_type": "gemma3_text",
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        },
        "vision_config": {"model_type": "siglip_vision_model", "vision_use_head": False},
    },
    "implied": {
        "tie_word_embeddings": True,
        "text_config": {
            "hidden_activation": "gelu_pytorch_tanh",
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0,
            "attn_logit_softcapping": None,
            "attention_bias": False,
            "layer_types": Pattern(("sliding_attention",) * 5 + ("full_attention",)),
        },
        "vision_config": {"hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-06},
    },
    "unsourced": ["text_config.final_logit_softcapping (copies disagree: absent / 30.0)"],
}


# google/gemma-4-e2b-it config.json (read, in part: public fixtures transcribing gemma-4-E2B's config agree on
# the text fields below (a Swift test's e2bConfigJSON, a Rust test's E2B config, a Python fixture with its 35
# layer_types): 4 sliding + 1 full attention layers (35 = 7 x 5; transformers forces the last one full), final
# logit soft-capping 30, double-wide MLP on the KV-shared layers, proportional RoPE on a quarter of the
# full-attention head, tied embeddings; an ollama blob of its MLX export begins as the file: architectures,
# model_type gemma4, initializer_range 0.02, text attention_bias false. The Hub copy "Copy config.json from
# google/gemma-4-E2B-it" (EvilScript/taboo-cloud-gemma-4-E2B-it) was cut before its text_config). Activations and
# the vision tower not read: Gemma4Config's class defaults (docstring: this checkpoint) in "implied"
REFERENCE_CONFIGS["gemma4"] = {
    "checkpoint": "google/gemma-4-e2b-it",
    "source": "read (in part): public fixtures transcribing gemma-4-E2B's config.json; class defaults",
    "config": {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "text_config": {
            "model_type": "gemma4_text",
            "attention_bias": False,
            "attention_k_eq_v": False,
            "enable_moe_block": False,
            "final_logit_softcapping": 30.0,
            "layer_types": Pattern(("sliding_attention",) * 4 + ("full_attention",), last="full_attention"),
            "rms_norm_eps": 1e-06,
            "rope_parameters": {
                "full_attention": {
                    "partial_rotary_factor": 0.25,
                    "rope_theta": 1000000.0,
                    "rope_type": "proportional",
                },
                "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
            },
            "tie_word_embeddings": True,
            "use_double_wide_mlp": True,
        },
    },
    "implied": {
        "text_config": {"hidden_activation": "gelu_pytorch_tanh"},
        "vision_config": {"model_type": "gemma4_vision", "hidden_activation": "gelu_pytorch_tanh"},
    },
    "unsourced": ["text_config.hidden_activation (class defaults only)", "vision_config", "audio_config"],
}


# zai-org/GLM-4.1V-9B-Thinking config.json (read: GLM-4.1V fine-tunes' config.json keeping its fields,
# huggingface.co/minglanga/GeoSolver (text) and huggingface.co/luli2949/glyph_dim4 (vision; its text rope_theta
# 500000 is Glyph's own and not taken); the official file not read). Half of each head rotates
# (partial_rotary_factor 0.5), M-RoPE [8, 12, 12] of head_dim 128. attention_bias true (the text q/k/v biases):
# transformers 5.24's Glm4vTextConfig has no such field (its attention always has them)
REFERENCE_CONFIGS["glm4v"] = {
    "checkpoint": "zai-org/GLM-4.1V-9B-Thinking",
    "source": "read: huggingface.co/minglanga/GeoSolver/blob/main/config.json (text), "
    "huggingface.co/luli2949/glyph_dim4/blob/main/config.json (vision)",
    "config": {
        "architectures": ["Glm4vForConditionalGeneration"],
        "model_type": "glm4v",
        "tie_word_embeddings": False,
        "text_config": {
            "model_type": "glm4v_text",
            "attention_bias": True,
            "attention_dropout": 0.0,
            "hidden_act": "silu",
            "initializer_range": 0.02,
            "partial_rotary_factor": 0.5,
            "rms_norm_eps": 1e-05,
            "rope_scaling": {"mrope_section": [8, 12, 12], "rope_type": "default"},
            "rope_theta": 10000.0,
        },
        "vision_config": {"attention_bias": False, "attention_dropout": 0.0, "hidden_act": "silu"},
    },
    "implied": {"vision_config": {"rms_norm_eps": 1e-05, "spatial_merge_size": 2, "temporal_patch_size": 2}},
    "unsourced": ["vision_config.rms_norm_eps, spatial_merge_size, temporal_patch_size (class defaults only)"],
}


# HuggingFaceM4/idefics2-8b config.json (read, in part: fine-tunes' config.json naming it, e.g.
# huggingface.co/jihadzakki/idefics2-8b-medvqa, show architectures, model_type and the perceiver's silu; the rest
# was cut from the copies read). The rest: Idefics2Config's class defaults, whose docstring names this checkpoint
# (Mistral-7B text: rms_norm_eps 1e-5, rope_theta 1e4, sliding_window 4096; SigLIP vision gelu_pytorch_tanh)
REFERENCE_CONFIGS["idefics2"] = {
    "checkpoint": "HuggingFaceM4/idefics2-8b",
    "source": "read (in part): huggingface.co/jihadzakki/idefics2-8b-medvqa/blob/main/config.json; class defaults",
    "config": {
        "architectures": ["Idefics2ForConditionalGeneration"],
        "model_type": "idefics2",
        "perceiver_config": {"hidden_act": "silu"},
    },
    "implied": {
        "tie_word_embeddings": False,
        "text_config": {"model_type": "mistral", "hidden_act": "silu", "rms_norm_eps": 1e-05, "rope_theta": 10000.0},
        "perceiver_config": {"rms_norm_eps": 1e-06},
        "vision_config": {"hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-06},
    },
    "unsourced": ["text_config (read only through the class defaults)", "vision_config (likewise)"],
}


# OpenGVLab/InternVL3-8B-hf config.json (as its siblings: huggingface.co/OpenGVLab/InternVL3-38B-hf config.json
# (refs/pr/2) and InternVL3-1B-hf's (huggingface.co/hf-internal-testing/tiny-processor-internvl) read, same
# converter; github/gitcode Ascend MindSpeed-MM examples/internvl3/model_8B.json gives the 8B's own Qwen2.5 text
# recipe, which agrees: rope_theta 1e6, dynamic rope scaling factor 2, eps 1e-6, select_layer -1, downsample 0.5).
# Not read for the 8B: its vision tower's fields (InternViT-300M; the 38B's is InternViT-6B)
REFERENCE_CONFIGS["internvl"] = {
    "checkpoint": "OpenGVLab/InternVL3-8B-hf",
    "source": "as huggingface.co/OpenGVLab/InternVL3-38B-hf/blob/refs%2Fpr%2F2/config.json and "
    "hf-internal-testing/tiny-processor-internvl; gitcode Ascend/MindSpeed-MM examples/internvl3/model_8B.json",
    "config": {
        "architectures": ["InternVLForConditionalGeneration"],
        "model_type": "internvl",
        "downsample_ratio": 0.5,
        "projector_hidden_act": "gelu",
        "text_config": {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "attention_dropout": 0.0,
            "hidden_act": "silu",
            "initializer_range": 0.02,
            "rms_norm_eps": 1e-06,
            "rope_scaling": {"factor": 2.0, "rope_type": "dynamic", "type": "dynamic"},
            "rope_theta": 1000000.0,
            "use_sliding_window": False,
            "use_cache": True,
        },
        "vision_config": {"architectures": ["InternVisionModel"], "hidden_act": "gelu"},
    },
    "implied": {"vision_feature_layer": -1, "vision_feature_select_strategy": "default"},
    "unsourced": ["tie_word_embeddings", "vision_config (InternViT-300M: attention_bias, norm_type, eps)"],
}


# llava-hf/llava-1.5-7b-hf config.json (read: a public training log printing it as loaded from the Hub cache,
# models--llava-hf--llava-1.5-7b-hf; public test fixtures quoting it agree). Sparse text and vision configs: the
# rest are LlamaConfig's and CLIPVisionConfig's defaults ("implied": quick_gelu, layer_norm_eps 1e-5).
# vision_feature_layer -2, vision_feature_select_strategy "default" (checked)
REFERENCE_CONFIGS["llava"] = {
    "checkpoint": "llava-hf/llava-1.5-7b-hf",
    "source": "read: a public log printing the file loaded from the Hub cache (models--llava-hf--llava-1.5-7b-hf); "
    "public fixtures quoting it agree",
    "config": {
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "projector_hidden_act": "gelu",
        "tie_word_embeddings": False,
        "vision_feature_layer": -2,
        "vision_feature_select_strategy": "default",
        "text_config": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "rms_norm_eps": 1e-05},
        "vision_config": {"model_type": "clip_vision_model"},
    },
    "implied": {
        "multimodal_projector_bias": True,
        "text_config": {"hidden_act": "silu", "rope_theta": 10000.0, "attention_bias": False},
        "vision_config": {"hidden_act": "quick_gelu", "layer_norm_eps": 1e-05},
    },
    "unsourced": [],
}


# llava-hf/llava-v1.6-mistral-7b-hf config.json (read: LLAVA_NEXT_7B_CONFIG in github NVIDIA/TensorRT-LLM
# tests/unittest/_torch/modeling/test_modeling_llava_next.py, the file with its vision depth cut for the test).
# vision_feature_layer -2, "default" (checked); Mistral-7B-Instruct-v0.2 text: rope_theta 1e6, no sliding window
REFERENCE_CONFIGS["llava_next"] = {
    "checkpoint": "llava-hf/llava-v1.6-mistral-7b-hf",
    "source": "read: github NVIDIA/TensorRT-LLM tests/unittest/_torch/modeling/test_modeling_llava_next.py "
    "(LLAVA_NEXT_7B_CONFIG)",
    "config": {
        "architectures": ["LlavaNextForConditionalGeneration"],
        "model_type": "llava_next",
        "projector_hidden_act": "gelu",
        "use_image_newline_parameter": True,
        "vision_feature_layer": -2,
        "vision_feature_select_strategy": "default",
        "text_config": {
            "architectures": ["MistralForCausalLM"],
            "model_type": "mistral",
            "rms_norm_eps": 1e-05,
            "rope_theta": 1000000.0,
        },
        "vision_config": {"model_type": "clip_vision_model"},
    },
    "implied": {
        "tie_word_embeddings": False,
        "multimodal_projector_bias": True,
        "text_config": {"hidden_act": "silu"},
        "vision_config": {"hidden_act": "quick_gelu", "layer_norm_eps": 1e-05},
    },
    "unsourced": [],
}


# llava-hf/llava-onevision-qwen2-7b-ov-hf config.json (read: the file's diff in its Hub commit bd59bb6 "Upload
# LlavaOnevisionForConditionalGeneration" (projector, text, tie, newline, aspect ratio; hidden_act
# gelu_pytorch_tanh and layer_norm_eps dropped from vision_config as SigLIP's defaults) and
# huggingface.co/mgoin/llava-onevision-qwen2-7b-ov-hf-bnb-full-4bit; github huggingface/transformers
# src/transformers/models/llava_onevision/convert_llava_onevision_weights_to_hf.py: SigLIP vision_use_head False,
# Qwen/Qwen2-7B-Instruct's text config, LlavaOnevisionConfig's vision_feature_layer -1 / "full" (class defaults;
# the sibling llava-hf/llava-interleave-qwen-7b-hf's file has -1 / "full"). Qwen2-7B-Instruct's rms_norm_eps 1e-6,
# tie false (read: its config.json as copied on the Hub, unsloth/Qwen2-7B-Instruct)
REFERENCE_CONFIGS["llava_onevision"] = {
    "checkpoint": "llava-hf/llava-onevision-qwen2-7b-ov-hf",
    "source": "read: huggingface.co/llava-hf/llava-onevision-qwen2-7b-ov-hf/commit/bd59bb6 (config.json diff); "
    "github huggingface/transformers .../llava_onevision/convert_llava_onevision_weights_to_hf.py; class defaults",
    "config": {
        "architectures": ["LlavaOnevisionForConditionalGeneration"],
        "model_type": "llava_onevision",
        "projector_hidden_act": "gelu",
        "tie_word_embeddings": False,
        "use_image_newline_parameter": True,
        "vision_aspect_ratio": "anyres_max_9",
        "text_config": {"model_type": "qwen2", "rope_theta": 1000000.0},
        "vision_config": {"model_type": "siglip_vision_model", "vision_use_head": False},
    },
    "implied": {
        "vision_feature_layer": -1,
        "vision_feature_select_strategy": "full",
        "multimodal_projector_bias": True,
        "text_config": {"hidden_act": "silu", "rms_norm_eps": 1e-06, "use_sliding_window": False},
        "vision_config": {"hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-06},
    },
    "unsourced": [],
}


# mistralai/Mistral-Small-3.1-24B-Instruct-2503 config.json (read: the mistral_small_3_1_24b_config fixture in
# github NVIDIA/TensorRT-LLM tests/unittest/_torch/modeling/test_modeling_mistral.py, the file with its text depth
# cut for the test). Pixtral vision: silu (gated MLP), rope_theta 1e4; text rope_theta 1e9, no sliding window;
# projector without bias, 2x2 patch merge, last vision layer
REFERENCE_CONFIGS["mistral3"] = {
    "checkpoint": "mistralai/Mistral-Small-3.1-24B-Instruct-2503",
    "source": "read: github NVIDIA/TensorRT-LLM tests/unittest/_torch/modeling/test_modeling_mistral.py "
    "(mistral_small_3_1_24b_config)",
    "config": {
        "architectures": ["Mistral3ForConditionalGeneration"],
        "model_type": "mistral3",
        "multimodal_projector_bias": False,
        "projector_hidden_act": "gelu",
        "spatial_merge_size": 2,
        "vision_feature_layer": -1,
        "text_config": {
            "model_type": "mistral",
            "attention_dropout": 0.0,
            "hidden_act": "silu",
            "initializer_range": 0.02,
            "rms_norm_eps": 1e-05,
            "rope_theta": 1000000000.0,
            "use_cache": True,
        },
        "vision_config": {
            "model_type": "pixtral",
            "attention_dropout": 0.0,
            "hidden_act": "silu",
            "initializer_range": 0.02,
            "num_channels": 3,
            "rope_theta": 10000.0,
        },
    },
    "unsourced": ["tie_word_embeddings"],
}


# google/paligemma2-3b-pt-224 config.json (read: huggingface.co/mateoguaman/paligemma2_toy/blob/main/config.json,
# "_name_or_path": "google/paligemma2-3b-pt-224", its text part; github huggingface/transformers
# src/transformers/models/paligemma/convert_paligemma2_weights_to_hf.py (variant 2b-224: gemma-2-2b-it's text
# config with gelu_pytorch_tanh, SigLIP vision gelu_pytorch_tanh, vision_use_head False)). Gemma 2 text: logit
# soft-capping 50 / 30, hybrid cache. projection_dim = the text width (a size)
REFERENCE_CONFIGS["paligemma"] = {
    "checkpoint": "google/paligemma2-3b-pt-224",
    "source": "read: huggingface.co/mateoguaman/paligemma2_toy/blob/main/config.json (text); github "
    "huggingface/transformers src/transformers/models/paligemma/convert_paligemma2_weights_to_hf.py (vision)",
    "config": {
        "architectures": ["PaliGemmaForConditionalGeneration"],
        "model_type": "paligemma",
        "text_config": {
            "architectures": ["Gemma2ForCausalLM"],
            "model_type": "gemma2",
            "attn_logit_softcapping": 50.0,
            "cache_implementation": "hybrid",
            "final_logit_softcapping": 30.0,
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_activation": "gelu_pytorch_tanh",
        },
        "vision_config": {
            "model_type": "siglip_vision_model",
            "hidden_act": "gelu_pytorch_tanh",
            "vision_use_head": False,
        },
    },
    "unsourced": ["tie_word_embeddings", "text_config.rms_norm_eps", "text_config.rope_theta"],
}


# HuggingFaceTB/SmolVLM2-2.2B-Instruct config.json (read, in part: the file on the Hub,
# huggingface.co/HuggingFaceTB/SmolVLM2-2.2B-Instruct/blob/refs%2Fpr%2F21/config.json, as far as its
# perceiver_config: architectures, model_type, scale_factor 3 (a size), the Llama text model). Its text rope /
# eps and vision fields were cut from the copy read: SmolVLMConfig's class defaults (docstring: this checkpoint)
# give vision gelu_pytorch_tanh, layer_norm_eps 1e-6 ("implied")
REFERENCE_CONFIGS["smolvlm"] = {
    "checkpoint": "HuggingFaceTB/SmolVLM2-2.2B-Instruct",
    "source": "read (in part): huggingface.co/HuggingFaceTB/SmolVLM2-2.2B-Instruct/blob/refs%2Fpr%2F21/config.json; "
    "class defaults",
    "config": {
        "architectures": ["SmolVLMForConditionalGeneration"],
        "model_type": "smolvlm",
        "text_config": {"architectures": ["VLlama3ForCausalLM"], "model_type": "llama"},
    },
    "implied": {"vision_config": {"hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-06}},
    "unsourced": [
        "text_config.rms_norm_eps",
        "text_config.rope_theta",
        "tie_word_embeddings",
        "vision_config (beyond the class defaults)",
    ],
}
