"""Idefics2: tiles `(B, n_tiles, C, H, W)` + `pixel_attention_mask`; zero tiles and unmasked pixels are padding."""

from ..builtin.tiny_recipes.base import Derived, TinyRecipe, Tok
from .base import HALF_STD, Family, RealProcessor, tiles_layout


FAMILY = Family(
    "idefics2",
    order=130,
    model_types=("idefics2",),
    model_classes=("Idefics2ForConditionalGeneration",),
    pixel_values="tiles `(B, n_tiles, C, H, W)` + `pixel_attention_mask`, zero tiles and unmasked pixels are padding",
    make_layout=tiles_layout(zero_tile_is_padding=True, crop_to_pixel_mask=True),
    reference=("HuggingFaceM4/idefics2-8b", HALF_STD),
    media_tokens=("<image>", "<fake_token_around_image>"),
    # Images resized between 28 and 56 px and split into 4 crops plus the whole image, 14 px patches, a perceiver
    # resampler to 4 latents per crop (the real idefics2-8b: 378..980 px, patch 14, 64 latents), mean = std = 0.5
)


# ---------------------------------------------------------------------------------------------------------------------
# The tiny model (`vepo_trl.builtin.tiny_models` builds it; `tiny-idefics2`)
# ---------------------------------------------------------------------------------------------------------------------

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<fake_token_around_image>", "<image>", "<end_of_utterance>")


# Its chat template ("User:" / "Assistant:" turns, `<end_of_utterance>` closing each), images before the text
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'].capitalize() }}"
    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


TINY_RECIPE = TinyRecipe(
    model="Idefics2ForConditionalGeneration",
    config="Idefics2Config",
    processor="Idefics2Processor",
    tokens=SPECIAL_TOKENS,
    bos="<s>",
    eos="<end_of_utterance>",
    pad="<unk>",
    chat_template=CHAT_TEMPLATE,
    image_processor=(
        "Idefics2ImageProcessor",
        {"size": {"shortest_edge": 28, "longest_edge": 56}, "do_image_splitting": True},
    ),
    processor_args={"image_seq_len": 4},
    text={
        "model_type": "mistral",
        "rms_norm_eps": 1e-5,
        "head_dim": Derived(lambda build: build.head_dim),
        "sliding_window": None,
        "pad_token_id": Tok("<unk>"),
        "eos_token_id": Tok("<end_of_utterance>"),
        "bos_token_id": Tok("<s>"),
    },
    vision={"image_size": 56, "patch_size": 14},
    top={
        "perceiver_config": {
            "hidden_size": Derived(lambda build: build.config.hidden_size),
            "resampler_n_latents": 4,
            "resampler_depth": 1,
            "resampler_n_heads": 2,
            "resampler_head_dim": 16,
            "num_key_value_heads": 1,
        },
        "image_token_id": Tok("<image>"),
        "tie_word_embeddings": False,
    },
    stop=("<end_of_utterance>",),
)


# ---------------------------------------------------------------------------------------------------------------------
# The reference checkpoint as its processor and config see it, each value with its source
# (tests/test_perturb_real_processors.py, tests/test_builtin_tiny_recipes.py)
# ---------------------------------------------------------------------------------------------------------------------

# HuggingFaceM4/idefics2-8b preprocessor_config.json: Idefics2ImageProcessor, shortest_edge 378, longest_edge 980,
# mean/std 0.5, do_image_splitting false (card; all of them Idefics2ImageProcessor's class defaults too). Not
# splitting, it has no identical tiles to check. config.json vision image_size 980, patch_size 14
REFERENCE_PROCESSOR = RealProcessor(
    "HuggingFaceM4/idefics2-8b",
    "Idefics2ImageProcessor",
    dict(
        size={"shortest_edge": 378, "longest_edge": 980},
        image_mean=list(HALF_STD),
        image_std=list(HALF_STD),
        do_image_splitting=False,
    ),
    "Idefics2Config",
    {"vision_config": {"image_size": 980, "patch_size": 14}},
    per_prompt=True,
    real="pixel_mask",
    partial_patches=True,
)


# HuggingFaceM4/idefics2-8b config.json (read, in part: fine-tunes' config.json naming it, e.g.
# huggingface.co/jihadzakki/idefics2-8b-medvqa, show architectures, model_type and the perceiver's silu; the rest
# was cut from the copies read). The rest: Idefics2Config's class defaults, whose docstring names this checkpoint
# (Mistral-7B text: rms_norm_eps 1e-5, rope_theta 1e4, sliding_window 4096; SigLIP vision gelu_pytorch_tanh)
REFERENCE_CONFIG = {
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
