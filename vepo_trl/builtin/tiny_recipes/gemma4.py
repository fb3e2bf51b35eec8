"""The tiny gemma4 model as data (its runtime adapter is `vepo_trl.families.gemma4`)."""

from .base import Derived, TinyRecipe, Tok


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


FAMILY = "gemma4"
RECIPE = TinyRecipe(
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
