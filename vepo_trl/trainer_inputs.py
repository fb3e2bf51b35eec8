"""What a Python caller hands `VEPOTrainer`, taken or refused in one line before TRL loads anything: a model id, a
`pathlib.Path` or a model object (anything else refused), our reward names where TRL expects functions (resolved,
not sent to the Hub as a reward model's id), and a text-only model only where it can train (a text strategy, text
prompts, its tokenizer)."""

from __future__ import annotations

import os

import torch

from .errors import UsageError


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


def prepared_datasets(args, pos_args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """`VEPOTrainer(...)`'s settings' packages checked (`check_packages`), and its data sets as the CLI would train them: TRL's plain-text prompt form with images converted
    to the conversational one (`load_vepo_dataset`'s conversion of the same rows; TRL refuses it for multimodal
    training at the first step), and a training set too small for one step refused (`check_train_rows`)."""
    check_packages(args)  # reporting and kernel packages the settings need, as the CLI checks them
    pos_args, kwargs = list(pos_args), dict(kwargs)
    for index, key in enumerate(("train_dataset", "eval_dataset")):
        if index < len(pos_args):
            pos_args[index] = conversational_dataset(pos_args[index], key)
        elif key in kwargs:
            kwargs[key] = conversational_dataset(kwargs[key], key)
    train = pos_args[0] if pos_args else kwargs.get("train_dataset")
    check_train_rows(train, args, "train_dataset")
    return tuple(pos_args), kwargs


def conversational_dataset(dataset, name: str):
    """A `datasets.Dataset` of plain-text prompts (a "prompt" string column) with an "images" / "image" column, as
    `load_vepo_dataset` converts the same rows (system prompt, image parts, images resized); anything else as is."""
    import datasets

    if isinstance(dataset, dict):
        return {key: conversational_dataset(value, f"{name}[{key!r}]") for key, value in dataset.items()}
    if not isinstance(dataset, datasets.Dataset) or len(dataset) == 0:
        return dataset
    columns = dataset.column_names
    feature = dataset.features.get("prompt")
    plain = isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")
    if not plain or not {"images", "image"} & set(columns):
        return dataset
    import logging

    from .data.loaders import convert_dataset

    logging.getLogger(__name__).info("%s: plain-text prompts with images, converted to conversational prompts", name)
    return convert_dataset(dataset, source=name)


def check_train_rows(dataset, args, name: str) -> None:
    """Fewer rows than one generation's prompts train 0 steps (TRL's sampler drops an incomplete batch) and save the
    untouched model as the run's: refused in one line, as an empty set is. A stream's length is not known here."""

    if dataset is None or not hasattr(dataset, "__len__"):
        return
    rows = len(dataset)
    if rows == 0:
        raise UsageError(f"{name} is empty: VEPOTrainer would train 0 steps. Check the data set's split.")
    needed = args.generation_batch_size // args.num_generations
    if rows < needed:
        raise UsageError(
            f"{name} has {rows} row{'' if rows == 1 else 's'}, and one generation takes {needed} prompts "
            f"(generation_batch_size {args.generation_batch_size} / num_generations {args.num_generations}), so no "
            "step would train: add rows, or lower per_device_train_batch_size (or steps_per_generation)."
        )


def check_packages(training_args) -> None:
    """Reporting and kernel integrations that are not installed: one line now, not an ImportError after the model
    loaded. Run by the CLI before anything loads and by `VEPOTrainer` itself, so Python callers get the same line."""
    from transformers.integrations import get_available_reporting_integrations
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    available = set(get_available_reporting_integrations())
    for name in training_args.report_to or []:
        if name in ("none", "all"):
            continue
        if name not in INTEGRATION_TO_CALLBACK:
            raise UsageError(
                f"--report_to {name}: not a reporting integration; one of none, all, "
                f"{', '.join(sorted(INTEGRATION_TO_CALLBACK))}."
            )
        if name not in available:
            raise UsageError(
                f"--report_to {name}: its package is not installed (pip install {name}), or pass --report_to none."
            )
    # wandb's own login, as its callback would do it at the first step (after the model loaded): without a key, and
    # without a terminal to ask for one, it raises there
    reporting = available if "all" in (training_args.report_to or []) else set(training_args.report_to or [])
    main_process = os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) == "0"  # the one that logs
    if (
        "wandb" in reporting
        and main_process
        and os.environ.get("WANDB_MODE", "").lower() not in ("offline", "disabled", "dryrun")
    ):
        import wandb

        try:
            wandb.login(relogin=False)
        except Exception as error:  # noqa: BLE001 - wandb's UsageError / AuthenticationError: said in one line
            raise UsageError(
                f"--report_to wandb: {' '.join(str(error).split())} (or WANDB_MODE=offline to log here, or "
                "--report_to none)."
            ) from None
    # The optimizer's package, by transformers' own lookup (it needs no model until it builds one): its ImportError
    # came after the model loaded
    from transformers import Trainer

    try:
        Trainer.get_optimizer_cls_and_kwargs(training_args)
    except (ImportError, ValueError, NotImplementedError) as error:  # NotImplemented: layer-wise GaLore under DDP
        if not isinstance(error, ValueError) or "install" in str(error):
            raise UsageError(
                f"--optim {getattr(training_args.optim, 'value', training_args.optim)}: {error}"
            ) from None
    if getattr(training_args, "use_liger_kernel", False):
        from trl.import_utils import is_liger_kernel_available

        if not is_liger_kernel_available():
            raise UsageError(
                "--use_liger_kernel true needs the liger-kernel package (pip install liger-kernel), which is not "
                "installed: install it or drop the flag."
            )
