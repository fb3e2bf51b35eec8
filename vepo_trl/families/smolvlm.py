"""SmolVLM (and Idefics3, its architecture): tiles `(B, n_tiles, C, H, W)` + `pixel_attention_mask`, zero tiles are
padding."""

from ..builtin.tiny_recipes.base import TinyRecipe, Tok
from .base import HALF_STD, Family, RealProcessor, tiles_layout


FAMILY = Family(
    "smolvlm",
    order=80,
    model_types=("smolvlm", "idefics3"),
    model_classes=("SmolVLMForConditionalGeneration", "Idefics3ForConditionalGeneration"),
    pixel_values="tiles `(B, n_tiles, C, H, W)` + `pixel_attention_mask`, zero tiles are padding",
    make_layout=tiles_layout(zero_tile_is_padding=True),
    reference=("HuggingFaceTB/SmolVLM2-2.2B-Instruct", HALF_STD),
    media_tokens=(
        "<image>",
        "<fake_token_around_image>",
        "<global-img>",
        *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)),
    ),
    # Images resized to at most 64 px and split into 32x32 tiles plus the downscaled whole image, 8x8 patches, pixel
    # shuffle 2: 4 tokens per tile (the real SmolVLM2: 512 px tiles, patch 16, 64 tokens). Its processor spells
    # numbers with `num2words` (a dependency of the processor, not of VEPO)
)


# ---------------------------------------------------------------------------------------------------------------------
# The tiny model (`vepo_trl.builtin.tiny_models` builds it; `tiny-smolvlm`)
# ---------------------------------------------------------------------------------------------------------------------

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<end_of_utterance>",
    "<fake_token_around_image>",
    "<image>",
    "<global-img>",
    *(f"<row_{row}_col_{col}>" for row in range(1, 7) for col in range(1, 7)),
)


TINY_RECIPE = TinyRecipe(
    model="SmolVLMForConditionalGeneration",
    config="SmolVLMConfig",
    processor="SmolVLMProcessor",
    tokens=SPECIAL_TOKENS,
    bos="<|im_start|>",
    eos="<end_of_utterance>",
    pad="<|endoftext|>",
    chat_template="trl:smolvlm_chat_template",
    image_processor=(
        "SmolVLMImageProcessor",
        {"size": {"longest_edge": 64}, "max_image_size": {"longest_edge": 32}, "do_image_splitting": True},
    ),
    parts={"video_processor": ("SmolVLMVideoProcessor", {})},
    processor_args={"image_seq_len": 4},
    text={
        "model_type": "llama",
        "pad_token_id": Tok("<|endoftext|>"),
        "eos_token_id": Tok("<end_of_utterance>"),
        "bos_token_id": Tok("<|im_start|>"),
    },
    vision={"image_size": 32, "patch_size": 8},
    top={"scale_factor": 2, "image_token_id": Tok("<image>"), "pad_token_id": Tok("<|endoftext|>")},
    stop=("<end_of_utterance>",),
)


# ---------------------------------------------------------------------------------------------------------------------
# The reference checkpoint as its processor and config see it, each value with its source
# (tests/test_perturb_real_processors.py, tests/test_builtin_tiny_recipes.py)
# ---------------------------------------------------------------------------------------------------------------------

# HuggingFaceTB/SmolVLM2-2.2B-Instruct preprocessor_config.json: SmolVLMImageProcessor, size longest_edge 1536
# (the whole image, 4 x 384), max_image_size longest_edge 384 (the tiles), do_image_splitting true, mean/std 0.5,
# resample 1 (Lanczos) (card; a public reader's fixture of SmolVLM's files has this 1536 / 384 pair with vision
# image_size 384, patch 14; the class defaults are 4 x 364 / 364; the 256M / 500M checkpoints use 512 px tiles of
# 16 px patches instead). config.json vision image_size 384, patch_size 14
REFERENCE_PROCESSOR = RealProcessor(
    "HuggingFaceTB/SmolVLM2-2.2B-Instruct",
    "SmolVLMImageProcessor",
    dict(
        size={"longest_edge": 1536},
        max_image_size={"longest_edge": 384},
        do_image_splitting=True,
        image_mean=list(HALF_STD),
        image_std=list(HALF_STD),
        resample=1,
    ),
    "SmolVLMConfig",
    {"vision_config": {"image_size": 384, "patch_size": 14}, "scale_factor": 3},
    per_prompt=True,
    real="pixel_mask",
    tiles=True,
)


# HuggingFaceTB/SmolVLM2-2.2B-Instruct config.json (read, in part: the file on the Hub,
# huggingface.co/HuggingFaceTB/SmolVLM2-2.2B-Instruct/blob/refs%2Fpr%2F21/config.json, as far as its
# perceiver_config: architectures, model_type, scale_factor 3 (a size), the Llama text model). Its text rope /
# eps and vision fields were cut from the copy read: SmolVLMConfig's class defaults (docstring: this checkpoint)
# give vision gelu_pytorch_tanh, layer_norm_eps 1e-6 ("implied")
REFERENCE_CONFIG = {
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
