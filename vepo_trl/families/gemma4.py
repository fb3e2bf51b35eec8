"""Gemma 4: padded patch rows `(n_images, max_patches, 3*16*16)` addressed by `image_position_ids` (-1 for padding);
its image processor does not normalise."""

from ..builtin.tiny_recipes.base import Derived, TinyRecipe, Tok
from .base import Family, Pattern, RealProcessor, positioned_layout


def vllm_blocker(config) -> str | None:
    """vLLM's Gemma 4 plans its memory from `vision_config.default_output_length`, the image-token budget a Gemma 4
    checkpoint's config.json sets (280); transformers 5.24's Gemma4VisionConfig has no such field of its own, so a
    config without it cannot start an engine. Checked against the installed vLLM's source, not its version."""
    import importlib.util
    from pathlib import Path

    if getattr(config.vision_config, "default_output_length", None) is not None:
        return None
    spec = importlib.util.find_spec("vllm.model_executor.models.gemma4_mm")
    if spec is None or spec.origin is None or "default_output_length" not in Path(spec.origin).read_text():
        return None
    return (
        "vLLM's Gemma 4 reads vision_config.default_output_length (the image-token budget Gemma 4 checkpoints set "
        "in config.json, e.g. 280), which this config lacks: add it to its vision_config"
    )


FAMILY = Family(
    "gemma4",
    order=170,
    model_types=("gemma4",),
    model_classes=("Gemma4ForConditionalGeneration",),
    pixel_values="patch rows `(n_images, max_patches, 3*16*16)` zero-padded + `image_position_ids`",
    make_layout=positioned_layout,
    vllm_blocker=vllm_blocker,
    # Gemma4ImageProcessor does not normalise: the pixels in [0, 1] reach the model as they are
    reference=("google/gemma-4-e2b-it", (1.0, 1.0, 1.0)),
    media_tokens=("<|image|>", "<|image>", "<image|>", "<|video|>", "<|audio|>", "<|audio>", "<audio|>"),
    # 4-px patches pooled 3 x 3, at most 70 soft tokens (the smallest budget it takes): an image is resized to about
    # 100 px and padded to 630 patch rows (the real: 16-px patches, 280 soft tokens, 2,520 rows)
)


# ---------------------------------------------------------------------------------------------------------------------
# The tiny model (`vepo_trl.builtin.tiny_models` builds it; `tiny-gemma4`)
# ---------------------------------------------------------------------------------------------------------------------

SPECIAL_TOKENS = (
    "<pad>",
    "<eos>",
    "<bos>",
    "<|turn>",
    "<turn|>",
    "<|image>",
    "<image|>",
    "<|image|>",
    "<|video|>",
    "<|audio|>",
    "<|audio>",
    "<audio|>",
    "<|channel>",
    "<channel|>",
    "<|think|>",
)


_VOCAB = Derived(lambda build: build.vocab)


TINY_RECIPE = TinyRecipe(
    model="Gemma4ForConditionalGeneration",
    config="Gemma4Config",
    processor="Gemma4Processor",
    tokens=SPECIAL_TOKENS,
    bos="<bos>",
    eos="<turn|>",
    pad="<pad>",
    # Gemma4Processor reads the audio tokens too, audio or not (transformers 5.24)
    named_tokens={
        "boi_token": "<|image>",
        "eoi_token": "<image|>",
        "image_token": "<|image|>",
        "audio_token": "<|audio|>",
        "boa_token": "<|audio>",
        "eoa_token": "<audio|>",
    },
    chat_template="trl:gemma4_chat_template",
    image_processor=("Gemma4ImageProcessor", {"patch_size": 4, "max_soft_tokens": 70, "pooling_kernel_size": 3}),
    parts={
        "feature_extractor": ("Gemma4AudioFeatureExtractor", {}),
        "video_processor": ("Gemma4VideoProcessor", {}),
    },
    processor_args={"image_seq_length": 70},
    text={
        "head_dim": Derived(lambda build: build.head_dim),
        "sliding_window": 64,
        "vocab_size_per_layer_input": _VOCAB,
        "hidden_size_per_layer_input": 8,
        "final_logit_softcapping": 30.0,
        "use_double_wide_mlp": True,
        "pad_token_id": Tok("<pad>"),
        "eos_token_id": Tok("<turn|>"),
        "bos_token_id": Tok("<bos>"),
    },
    vision={
        "num_key_value_heads": 2,
        "head_dim": 16,
        "patch_size": 4,
        "pooling_kernel_size": 3,
        "position_embedding_size": 256,
        # Not a field of transformers' class; the checkpoints' config.json sets it (the image processor's
        # max_soft_tokens), and vLLM reads it
        "default_output_length": 70,
    },
    top={
        "audio_config": None,
        "boi_token_id": Tok("<|image>"),
        "eoi_token_id": Tok("<image|>"),
        "image_token_id": Tok("<|image|>"),
        "video_token_id": Tok("<|video|>"),
        "boa_token_id": Tok("<|audio>"),
        "eoa_token_index": Tok("<audio|>"),
        "audio_token_id": Tok("<|audio|>"),
    },
    stop=("<turn|>", "<eos>"),
)


# ---------------------------------------------------------------------------------------------------------------------
# The reference checkpoint as its processor and config see it, each value with its source
# (tests/test_perturb_real_processors.py, tests/test_builtin_tiny_recipes.py)
# ---------------------------------------------------------------------------------------------------------------------

# google/gemma-4-e2b-it (the checkpoint transformers' Gemma 4 docstrings name): Gemma4ImageProcessor's class
# defaults in transformers (not read from the Hub): patch_size 16, max_soft_tokens 280, pooling 3, no
# normalisation; Gemma4VisionConfig's patch_size 16 and pooling_kernel_size 3 (class defaults)
REFERENCE_PROCESSOR = RealProcessor(
    "google/gemma-4-e2b-it",
    "Gemma4ImageProcessor",
    dict(
        patch_size=16,
        max_soft_tokens=280,
        pooling_kernel_size=3,
        do_normalize=False,
        image_mean=[0.0, 0.0, 0.0],
        image_std=[1.0, 1.0, 1.0],
    ),
    "Gemma4Config",
    {"vision_config": {"patch_size": 16, "pooling_kernel_size": 3}},
    real="positions",
)


# google/gemma-4-e2b-it config.json (read, in part: public fixtures transcribing gemma-4-E2B's config agree on
# the text fields below (a Swift test's e2bConfigJSON, a Rust test's E2B config, a Python fixture with its 35
# layer_types): 4 sliding + 1 full attention layers (35 = 7 x 5; transformers forces the last one full), final
# logit soft-capping 30, double-wide MLP on the KV-shared layers, proportional RoPE on a quarter of the
# full-attention head, tied embeddings; an ollama blob of its MLX export begins as the file: architectures,
# model_type gemma4, initializer_range 0.02, text attention_bias false. The Hub copy "Copy config.json from
# google/gemma-4-E2B-it" (EvilScript/taboo-cloud-gemma-4-E2B-it) was cut before its text_config). Activations and
# the vision tower not read: Gemma4Config's class defaults (docstring: this checkpoint) in "implied"
REFERENCE_CONFIG = {
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
