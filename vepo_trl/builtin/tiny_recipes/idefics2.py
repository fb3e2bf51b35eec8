"""The tiny idefics2 model as data (its runtime adapter is `vepo_trl.families.idefics2`)."""

from .base import Derived, TinyRecipe, Tok


SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<fake_token_around_image>", "<image>", "<end_of_utterance>")


# Its chat template ("User:" / "Assistant:" turns, `<end_of_utterance>` closing each), images before the text
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'].capitalize() }}"
    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


FAMILY = "idefics2"
RECIPE = TinyRecipe(
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
