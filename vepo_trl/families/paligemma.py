"""PaliGemma: images `(n_images, C, H, W)` + `token_type_ids`, a prefix LM (image and prompt bidirectional)."""

from ..builtin.tiny_recipes.base import Derived, TinyRecipe, Tok
from .base import HALF_STD, Family, InputLimits, RealProcessor, tiles_layout


FAMILY = Family(
    "paligemma",
    order=120,
    model_types=("paligemma",),
    model_classes=("PaliGemmaForConditionalGeneration",),
    pixel_values="images `(n_images, C, H, W)` + `token_type_ids`",
    make_layout=tiles_layout(),
    reference=("google/paligemma2-3b-pt-224", HALF_STD),
    prefix_lm=True,
    trl_limitation=(
        "TRL 1.16's GRPOTrainer fails on prompts of different lengths (the processor builds `labels` with "
        "np.array over unpadded ids) and scores completions as part of the bidirectional prefix (it extends "
        "`token_type_ids` with zeros): VEPOTrainer tokenises padded then unpadded and marks the completion "
        "causal, as `generate` samples it. Refused at start-up: a text-only prompt (the processor refuses it), no chat "
        "template (its checkpoints ship none: set one), vLLM (its prompt and prefix there are unverified)"
    ),
    limits=InputLimits(
        "PaliGemma",
        fewest_images=(1, "its processor refuses text-only prompts. Drop text-only rows for this family."),
        chat_template=(
            "its checkpoints ship no chat template and TRL renders conversational prompts with one: set "
            "processor.chat_template to one that writes each image as <image>, then the text, and pass "
            "processing_class=processor."
        ),
        vllm=(
            "vLLM's prompt for it (bos and newline added around the images) and its bidirectional prefix are not "
            "verified against the trainer's; generate with transformers."
        ),
    ),
    media_tokens=("<image>",),
    # SigLIP at 56 px, 4x4 patches of 14 = 16 image tokens (the real PaliGemma: 224 px, 256 tokens), mean = std = 0.5
)


# ---------------------------------------------------------------------------------------------------------------------
# The tiny model (`vepo_trl.builtin.tiny_models` builds it; `tiny-paligemma`)
# ---------------------------------------------------------------------------------------------------------------------

# PaliGemma has no chat turns: its image tokens, then the prompt (the processor adds `<bos>` after the images and the
# closing newline), as its processor expects; the template renders a conversation's images and text in that form
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['content'] is not string %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<image>{% endif %}{% endfor %}{% endif %}{% endfor %}"
    "{% for message in messages %}{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{% endfor %}"
)


_HIDDEN = Derived(lambda build: build.config.hidden_size)


TINY_RECIPE = TinyRecipe(
    model="PaliGemmaForConditionalGeneration",
    config="PaliGemmaConfig",
    processor="PaliGemmaProcessor",
    tokens=("<pad>", "<eos>", "<bos>", "<unk>", "<image>"),
    bos="<bos>",
    eos="<eos>",
    pad="<pad>",
    named_tokens={"image_token": "<image>"},
    chat_template=CHAT_TEMPLATE,
    image_processor=("SiglipImageProcessor", {"size": {"height": 56, "width": 56}}),
    image_processor_attrs={"image_seq_length": 16},
    text={
        "model_type": "gemma",
        "head_dim": Derived(lambda build: build.head_dim),
        "pad_token_id": Tok("<pad>"),
        "eos_token_id": Tok("<eos>"),
        "bos_token_id": Tok("<bos>"),
    },
    vision={
        "model_type": "siglip_vision_model",
        "vision_use_head": False,
        "image_size": 56,
        "patch_size": 14,
        "projection_dim": _HIDDEN,
    },
    top={
        "image_token_index": Tok("<image>"),
        "projection_dim": _HIDDEN,
        "hidden_size": _HIDDEN,
        "vocab_size": Derived(lambda build: build.vocab),
        "tie_word_embeddings": False,
    },
    stop=("<eos>",),
)


# ---------------------------------------------------------------------------------------------------------------------
# The reference checkpoint as its processor and config see it, each value with its source
# (tests/test_perturb_real_processors.py, tests/test_builtin_tiny_recipes.py)
# ---------------------------------------------------------------------------------------------------------------------

# google/paligemma2-3b-pt-224 preprocessor_config.json (as google/paligemma-3b-pt-224's): SiglipImageProcessor,
# size 224x224, mean/std 0.5, resample 3 (card, not read here). config.json vision (SigLIP) image_size 224,
# patch_size 14
REFERENCE_PROCESSOR = RealProcessor(
    "google/paligemma2-3b-pt-224",
    "SiglipImageProcessor",
    dict(size={"height": 224, "width": 224}, image_mean=list(HALF_STD), image_std=list(HALF_STD), resample=3),
    "PaliGemmaConfig",
    {"vision_config": {"model_type": "siglip_vision_model", "image_size": 224, "patch_size": 14}},
)


# google/paligemma2-3b-pt-224 config.json (read: huggingface.co/mateoguaman/paligemma2_toy/blob/main/config.json,
# "_name_or_path": "google/paligemma2-3b-pt-224", its text part; github huggingface/transformers
# src/transformers/models/paligemma/convert_paligemma2_weights_to_hf.py (variant 2b-224: gemma-2-2b-it's text
# config with gelu_pytorch_tanh, SigLIP vision gelu_pytorch_tanh, vision_use_head False)). Gemma 2 text: logit
# soft-capping 50 / 30, hybrid cache. projection_dim = the text width (a size)
REFERENCE_CONFIG = {
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
