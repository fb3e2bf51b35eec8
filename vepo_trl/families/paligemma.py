"""PaliGemma: images `(n_images, C, H, W)` + `token_type_ids`, a prefix LM (image and prompt bidirectional)."""

from .base import HALF_STD, Derived, Family, RealProcessor, TinyRecipe, Tok, image_count_row, tiles_layout


# PaliGemma has no chat turns: its image tokens, then the prompt (the processor adds `<bos>` after the images and the
# closing newline), as its processor expects; the template renders a conversation's images and text in that form
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['content'] is not string %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<image>{% endif %}{% endfor %}{% endif %}{% endfor %}"
    "{% for message in messages %}{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{% endfor %}"
)


def check_inputs(processor, datasets, *, chat_template=None, use_vllm=False) -> None:
    tokenizer = getattr(processor, "tokenizer", None)
    if (
        chat_template is None
        and not getattr(processor, "chat_template", None)
        and not getattr(tokenizer, "chat_template", None)
    ):
        raise ValueError(
            "PaliGemma checkpoints ship no chat template and TRL renders conversational prompts with one: set "
            "processor.chat_template to one that writes each image as <image>, then the text, and pass "
            "processing_class=processor."
        )
    if use_vllm:
        raise ValueError(
            "PaliGemma with use_vllm: vLLM's prompt for it (bos and newline added around the images) and its "
            "bidirectional prefix are not verified against the trainer's; generate with transformers."
        )
    for name, dataset in datasets:
        fewest = image_count_row(dataset, min)
        if fewest is not None and fewest[1] == 0:
            raise ValueError(
                f"PaliGemma needs an image in every prompt ({name} row {fewest[0]} has none): its processor refuses "
                "text-only prompts. Drop text-only rows for this family."
            )


_HIDDEN = Derived(lambda build: build.config.hidden_size)

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
    check_inputs=check_inputs,
    # SigLIP at 56 px, 4x4 patches of 14 = 16 image tokens (the real PaliGemma: 224 px, 256 tokens), mean = std = 0.5
    tiny=TinyRecipe(
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
        vision={"model_type": "siglip_vision_model", "image_size": 56, "patch_size": 14, "projection_dim": _HIDDEN},
        top={
            "image_token_index": Tok("<image>"),
            "projection_dim": _HIDDEN,
            "hidden_size": _HIDDEN,
            "vocab_size": Derived(lambda build: build.vocab),
            "tie_word_embeddings": False,
        },
        stop=("<eos>",),
        suppress=("<image>",),
    ),
)


# google/paligemma2-3b-pt-224 preprocessor_config.json (as google/paligemma-3b-pt-224's): SiglipImageProcessor,
# size 224x224, mean/std 0.5, resample 3 (card, not read here). config.json vision (SigLIP) image_size 224,
# patch_size 14
REAL_PROCESSOR = RealProcessor(
    "google/paligemma2-3b-pt-224",
    "SiglipImageProcessor",
    dict(size={"height": 224, "width": 224}, image_mean=list(HALF_STD), image_std=list(HALF_STD), resample=3),
    "PaliGemmaConfig",
    {"vision_config": {"model_type": "siglip_vision_model", "image_size": 224, "patch_size": 14}},
)
