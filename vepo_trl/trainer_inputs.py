"""What a Python caller hands `VEPOTrainer`, taken or refused in one line before TRL loads anything: a model id, a
`pathlib.Path` or a model object (anything else refused), our reward names where TRL expects functions (resolved,
not sent to the Hub as a reward model's id), and a text-only model only where it can train (a text strategy, text
prompts, its tokenizer)."""

from __future__ import annotations

import os

import torch


def checked_model(model):
    """A model id or folder (`str`, `pathlib.Path`) or a model object; anything else refused in one line."""
    if isinstance(model, os.PathLike):
        return os.fspath(model)
    if isinstance(model, str) or isinstance(model, torch.nn.Module):
        return model
    raise TypeError(
        f"model must be a Hub id or a local folder (str or pathlib.Path) or a loaded model (a PreTrainedModel), got "
        f"{type(model).__name__}."
    )


def check_text_only(model, strategy: str, train_dataset, processing_class) -> None:
    """A text-only model (no image-text-to-text class in transformers) trains with a text strategy on text prompts;
    refuse in one line, before TRL loads anything, what it cannot do (TRL fails deep inside otherwise)."""
    from pathlib import Path

    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    from .families import supported_families
    from .local_models import not_a_vlm

    if isinstance(model, str):
        text_only = not_a_vlm(model)
    else:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        text_only = (
            f"a text-only {model_type!r} model"
            if model_type and model_type not in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
            else None
        )
    if not text_only:
        return
    from .scoring import get_strategy

    if get_strategy(strategy).needs_perturbed_pass:
        raise ValueError(
            f"selection_strategy={strategy!r} perturbs the model's images, but the model is {text_only}: use "
            f"selection_strategy='entropy' or 'full', or a vision-language model ({', '.join(supported_families())})."
        )
    columns = getattr(train_dataset, "column_names", None) or []
    image_columns = [name for name in ("image", "images") if name in columns]
    if image_columns:
        raise ValueError(
            f"train_dataset has an {image_columns[0]!r} column, and the model is {text_only}, which cannot read "
            "images: train a vision-language model, or drop the column and the image parts of the prompts."
        )
    folder = Path(model) if isinstance(model, str) else None
    has_image_processor = folder is not None and any(
        (folder / name).is_file() for name in ("preprocessor_config.json", "processor_config.json")
    )
    if processing_class is None and has_image_processor:
        raise ValueError(
            f"{model} holds an image processor's config beside {text_only}, so TRL would load a multimodal "
            "processor for a text model: pass processing_class=AutoTokenizer.from_pretrained(...)."
        )


def named_rewards_resolved(reward_funcs):
    """Our reward names (`"accuracy"`, `["accuracy", "format"]`) as the functions: TRL would take a string for a
    Hub reward model's id and try to download it. Other strings (real reward model ids) and callables pass as given."""
    from .rewards import REWARD_FUNCS, get_reward_funcs

    items = [reward_funcs] if isinstance(reward_funcs, str) else reward_funcs
    if not isinstance(items, (list, tuple)):
        return reward_funcs
    if any(isinstance(item, str) and item in REWARD_FUNCS for item in items):
        resolved = [get_reward_funcs(item)[0] if isinstance(item, str) and item in REWARD_FUNCS else item
                    for item in items]  # fmt: skip
        return resolved if isinstance(reward_funcs, (list, tuple)) else resolved[0]
    return reward_funcs
