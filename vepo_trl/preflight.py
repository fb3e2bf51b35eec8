"""Checks of a training run before anything loads (`check_arguments`): the output folder, the values the dataclasses do
not judge alone, settings the run would ignore, data names and the Hub, the model folder and family; and against the
model it will load, from configs and metadata only (no weight loads): the LoRA targets against the model's module
names, the data's prompts against the model's context, and the first step's memory against the machine's. Each
refusal is one `UsageError` line naming the setting, the figure and the fix. `train.py` loads, trains and saves.

The model is built on the meta device from its `config.json` (every module, no storage: a second for a 7B model), so
peft's own matching rule runs on the real module names; prompt lengths are counted with the model's own tokenizer.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from .errors import UsageError
from .local_models import (
    LAB_DATASET,
    SYNTHETIC_DATASET,
    check_hub_push,
    check_model_name,
    hub_unreachable,
    local_config_file,
    not_a_vlm,
    resolve_model_name,
)
from .rewards import get_reward_funcs
from .run_folder import check_train_folder
from .trainer_inputs import check_packages
from .validation import check_combinations, check_object, rules_for


def _meta_model(config):
    """The model of `config` with every module and no storage (the meta device)."""
    import torch
    from transformers import AutoModelForImageTextToText

    with torch.device("meta"):
        return AutoModelForImageTextToText.from_config(config)


def _load_config(name: str, revision: str | None):
    """(model_type, config) from the `config.json` on this machine, or (None, None) (a Hub id not cached yet, an
    unreadable file: transformers says why when it loads)."""
    from transformers import AutoConfig

    path = local_config_file(name, revision)
    if path is None:
        return None, None
    try:
        model_type = json.loads(path.read_text()).get("model_type")
        return model_type, AutoConfig.from_pretrained(path.parent)
    except Exception:
        return None, None


def check_lora_targets(model_id: str, model_args) -> None:
    """With --use_peft: the adapter's target modules, matched by peft's own rule against the model's module names:
    none matched, the LM head (VEPO reads its weight), or no targets for a model type peft has no default for, each
    refused in one line. `model_id`: the resolved model (a built-in name's folder)."""
    import torch
    from peft import LoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING

    if not model_args.use_peft or not model_id:
        return
    saved = model_args.lora_modules_to_save or []
    if any(module == "lm_head" or str(module).endswith(".lm_head") for module in saved):
        raise UsageError(
            "--lora_modules_to_save lm_head: VEPO reads the LM head's weight for its signals, and peft would wrap it; "
            "leave lm_head out."
        )
    model_type, config = _load_config(model_id, model_args.model_revision)
    if config is None:
        return
    targets = model_args.lora_target_modules
    if targets is None:
        if model_type not in TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING:
            raise UsageError(
                f"--use_peft on a {model_type!r} model needs --lora_target_modules (peft has no default for it): e.g. "
                "--lora_target_modules q_proj k_proj v_proj o_proj, or all-linear."
            )
        return
    if targets in ("all-linear", ["all-linear"]):
        return
    lora = LoraConfig(target_modules=targets, task_type=model_args.lora_task_type)
    model = _meta_model(config)
    matched = [module for module, _ in model.named_modules() if module and check_target_module_exists(lora, module)]
    if not matched:
        leaves = sorted({module.rsplit(".", 1)[-1] for module, child in model.named_modules()
                         if isinstance(child, torch.nn.Linear) and not module.rsplit(".", 1)[-1].isdigit()})  # fmt: skip
        shown = " ".join(map(str, targets)) if isinstance(targets, list) else targets
        raise UsageError(
            f"--lora_target_modules {shown}: matches no module of this {model_type!r} model; its linear layers are "
            f"named {', '.join(leaves[:12])}{', ...' if len(leaves) > 12 else ''} (or pass all-linear)."
        )
    heads = [module for module in matched if module == "lm_head" or module.endswith(".lm_head")]
    if heads:
        raise UsageError(
            f"--lora_target_modules matches {heads[0]}: VEPO reads the LM head's weight for its signals, and a LoRA "
            "adapter would wrap it; leave lm_head out of the targets."
        )


def _prompt_text(prompt) -> tuple[str, int]:
    """(text, image parts) of a conversational prompt (or a plain one)."""
    if isinstance(prompt, str):
        return prompt, 0
    texts, images = [], 0
    for message in prompt or []:
        content = message.get("content") if isinstance(message, dict) else None
        for part in [{"type": "text", "text": content}] if isinstance(content, str) else content or []:
            if isinstance(part, dict) and part.get("type") == "image":
                images += 1
            elif isinstance(part, dict) and part.get("text"):
                texts.append(part["text"])
    return "\n".join(texts), images


def _image_tokens(dataset, image_factor: int | None) -> list[int]:
    """A lower bound of each row's visual tokens: width x height / factor^2 for the Qwen layouts (one token per merged
    patch), 0 for processors that resize on their own terms (their count is fixed and small)."""
    if not image_factor or image_factor <= 1 or "images" not in dataset.column_names:
        return [0] * len(dataset)
    sizes = []
    # The stored bytes, undecoded and in the data set's own order (its index mapping applied), without a progress bar
    for images in dataset.with_format("arrow")[:].column("images").to_pylist():
        tokens = 0
        for image in images or []:
            try:
                import io

                from PIL import Image

                source = (
                    io.BytesIO(image["bytes"]) if isinstance(image, dict) and image.get("bytes") else image["path"]
                )
                with Image.open(source) as opened:
                    width, height = opened.size
                tokens += (width * height) // (image_factor * image_factor)
            except Exception:  # unreadable here: the run says so where it reads it
                continue
        sizes.append(tokens)
    return sizes


def _available_memory(training_args) -> tuple[int, str] | None:
    """(bytes, what) of the memory the first step runs in: one GPU's, or this machine's (its cgroup limit if lower)."""
    import torch

    device = training_args.device
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory, f"GPU {torch.cuda.get_device_name(device)}"
    if device.type != "cpu":
        return None
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    limit = Path("/sys/fs/cgroup/memory.max")
    try:
        text = limit.read_text().strip()
        if text.isdigit():
            total = min(total, int(text))
    except OSError:
        pass
    return total, "this machine's memory"


def check_first_step_fits(model_id: str, model_args, training_args, dataset, image_factor: int | None) -> None:
    """The data's longest prompt against the model's context, and an estimate of the first step's memory against
    the machine's, refused in one line where a run plainly cannot go (TRL 1.16 has no prompt truncation: a 39,000-
    character prompt allocated 29 GB at step 0 and died two minutes later). The estimate is a lower bound: weights,
    gradients and Adam's two moments for the trained parameters, the longest sequence's float32 logits for one
    micro-batch, and the attention scores where the attention is eager (`--attn_implementation eager`)."""
    if len(dataset) == 0 or "prompt" not in dataset.column_names:
        return
    _, config = _load_config(model_id, model_args.model_revision)
    if config is None:
        return
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_id, revision=model_args.model_revision)
    except Exception:  # no tokenizer here: the processor's load says why
        return
    text_config = config.get_text_config()
    prompts = [_prompt_text(prompt) for prompt in dataset["prompt"]]
    counts = tokenizer([text for text, _ in prompts], add_special_tokens=False)["input_ids"]
    visual = _image_tokens(dataset, image_factor)
    lengths = [len(ids) + extra for ids, extra in zip(counts, visual)]
    row = max(range(len(lengths)), key=lengths.__getitem__)
    longest = lengths[row] + training_args.max_completion_length
    context = getattr(text_config, "max_position_embeddings", None)
    if context and longest > context:
        raise UsageError(
            f"dataset_name row {row}'s prompt is at least {lengths[row]:,} tokens, which with max_completion_length "
            f"{training_args.max_completion_length} exceeds the model's context of {context:,} (TRL does not "
            "truncate prompts): shorten or drop such rows, or lower max_completion_length."
        )
    fits = _available_memory(training_args)
    if fits is None:
        return
    available, where = fits
    params = sum(p.numel() for p in _meta_model(config).parameters())
    weight_bytes = {"float32": 4, "bfloat16": 2, "float16": 2}.get(str(model_args.dtype).replace("torch.", ""), 4)
    trained = 0 if model_args.use_peft else params
    batch = training_args.per_device_train_batch_size
    vocab = getattr(text_config, "vocab_size", 0) or 0
    estimate = params * weight_bytes + trained * (weight_bytes + 8) + batch * longest * vocab * 4
    heads = getattr(text_config, "num_attention_heads", 0) or 0
    if model_args.attn_implementation == "eager":  # the scores of every head, held for the backward
        estimate += batch * heads * longest * longest * 4
    if estimate > available:
        raise UsageError(
            f"the first step needs at least {estimate / 2**30:.1f} GiB (an estimate: {params / 1e6:,.1f}M parameters"
            f"{'' if model_args.use_peft else ' trained with Adam'}, {batch} sequences of up to {longest:,} tokens), "
            f"and {where} has {available / 2**30:.1f} GiB: lower per_device_train_batch_size or "
            "max_completion_length, shorten the longest prompts, or train a LoRA adapter (--use_peft true)."
        )


def pixel_bounds(script_args, dataset_name: str | None) -> dict[str, int]:
    """The image bounds a data set is loaded with: those given, else the data set's own defaults."""
    from .data.loaders import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS

    low, high = (DEFAULT_MIN_PIXELS, DEFAULT_MAX_PIXELS) if dataset_name != SYNTHETIC_DATASET else (56 * 56, 224 * 224)
    return {
        "min_pixels": script_args.min_pixels if script_args.min_pixels is not None else low,
        "max_pixels": script_args.max_pixels if script_args.max_pixels is not None else high,
    }


def _check_hub_dataset(field_name: str, name: str) -> None:
    """A Hub data set that is neither cached nor downloadable (offline): one line now, not a minute of retries."""
    from .data.loaders import HUB_DATASETS, NAME_ALIASES, PAPER_MIX, PAPER_MIX_NAME

    key = name.strip().lower()
    if Path(name).expanduser().exists():
        return
    names = [part for part, _ in PAPER_MIX] if key == PAPER_MIX_NAME else [NAME_ALIASES[key]]
    missing = [HUB_DATASETS[n].repo_id for n in names if not _hub_dataset_cached(HUB_DATASETS[n].repo_id)]
    reason = hub_unreachable() if missing else None
    if reason:
        raise UsageError(
            f"{field_name} {name!r} needs {', '.join(missing)} from the Hub, which is not in the local cache, and "
            f"{reason}: download it where there is a network (`hf download --repo-type dataset {missing[0]}`) and "
            "copy the cache here, or give a local .jsonl/.parquet file or folder."
        )


def _hub_dataset_cached(repo_id: str) -> bool:
    import datasets.config
    from huggingface_hub import constants

    hub = Path(constants.HF_HUB_CACHE) / f"datasets--{repo_id.replace('/', '--')}"
    prepared = Path(datasets.config.HF_DATASETS_CACHE) / repo_id.replace("/", "___")
    return hub.is_dir() or prepared.is_dir()


def check_arguments(script_args, training_args, model_args, given=None, typed=None, *, folder_checked=False) -> None:
    """Everything that can be checked without loading anything: model, rewards, data names and values, settings that
    would be ignored, the output folder, the Hub when a name needs it. Raises `UsageError`. `given`: the option names
    the command line and recipe set, `typed` the command line's alone (None: a Python
    caller's, the fields set to other than their defaults). `folder_checked`: the CLI checked the output folder as it
    parsed (`run_folder.check_train_folder`), so it is not checked again."""
    from .config import given_fields, settings_reads
    from .validation import check_read

    if not folder_checked:
        check_train_folder(training_args.output_dir, training_args.resume_from_checkpoint, training_args.max_steps)
    try:
        get_reward_funcs(script_args.reward_funcs)
    except ValueError as error:
        raise UsageError(f"reward_funcs: {error}") from None
    # The script's and the model's values against their rules (VEPOConfig checked its own as it was built), then the
    # rules that join settings, over all three and the built run's facts (`validation.COMBINATIONS`)
    values = {}
    for args in (model_args, training_args, script_args):  # the script's eval_dataset_name etc. win, as they are read
        values.update({f.name: getattr(args, f.name) for f in dataclasses.fields(args)})
    values.update(pixel_bounds(script_args, script_args.dataset_name), device_type=training_args.device.type)
    try:
        check_object(script_args, rules_for(type(script_args)))
        check_object(model_args, rules_for(type(model_args)))
        check_combinations(values)
    except ValueError as error:
        raise UsageError(str(error)) from None
    # Every setting the run was given takes effect, or is refused in one line naming it and what would make it read:
    # `given` the names the command line or recipe set (the Python API compares with the defaults instead)
    if given is None:  # the config's own as it was given (`VEPOConfig._given`: before its __post_init__ filled in)
        given = {name for args in (script_args, model_args) for name in given_fields(args)}
        given |= getattr(training_args, "_given", None) or set(given_fields(training_args))
    check_read(settings_reads(), values, given, typed)
    check_packages(training_args)
    if training_args.use_vllm:
        from .trl_compat.vllm_prompts import check_vllm

        check_vllm()  # the version (the colocated engine is checked against the model's config as the trainer starts)
    for field_name in ("dataset_name", "eval_dataset_name"):
        name = getattr(script_args, field_name)
        if field_name == "dataset_name" and not (isinstance(name, str) and name.strip()):
            raise UsageError(f"dataset_name {name!r}: give the training data ({dataset_name_problem(str(name))}).")
        if name is None or (field_name == "eval_dataset_name" and not name):
            continue
        if name in (SYNTHETIC_DATASET, LAB_DATASET):
            continue
        if not is_known_dataset(name):
            raise UsageError(f"{field_name} {name!r}: {dataset_name_problem(name)}")
        _check_hub_dataset(field_name, name)
    if training_args.push_to_hub:
        check_hub_push(training_args.hub_token)
    # Last: the one check that may touch the network (a Hub id not in the cache)
    check_model_name(model_args.model_name_or_path)
    _check_model_family(model_args, training_args)
    if model_args.use_peft and model_args.model_name_or_path:
        name = model_args.model_name_or_path
        check_lora_targets(resolve_model_name(name) if name.startswith("tiny-") else name, model_args)


def _check_model_family(model_args, training_args) -> None:
    """The model's family and files, before any weight loads: a vision-language model, a local folder with its
    processor, and for a strategy that perturbs images a family VEPO has an adapter for (read off the model folder's,
    or the cached Hub repo's, `config.json`)."""
    import json
    from types import SimpleNamespace

    from .families import blocker, family_of, supported_families
    from .local_models import local_config_file
    from .scoring import SELECTION_STRATEGIES

    strategy = SELECTION_STRATEGIES.get(training_args.selection_strategy)
    name = model_args.model_name_or_path
    text_only = not_a_vlm(name, model_args.model_revision)
    if text_only:
        raise UsageError(
            f"model_name_or_path {name}: {text_only}; vepo-trl train trains vision-language models on image data. "
            "For a text model, call VEPOTrainer from Python with text prompts and selection_strategy 'entropy' or "
            "'full' (its tokenizer as processing_class)."
        )
    # A local model or adapter folder must hold its processor (the run loads it from there, after the weights)
    folder = Path(name).expanduser() if name else None
    if folder is not None and folder.is_dir():
        if not any((folder / file).is_file() for file in ("processor_config.json", "preprocessor_config.json")):
            kind = "adapter folder" if (folder / "adapter_config.json").is_file() else "model folder"
            raise UsageError(
                f"model_name_or_path {name}: the {kind} has no processor files (processor_config.json or "
                "preprocessor_config.json): save the processor beside it (processor.save_pretrained(folder)), or "
                "give the base model's folder or Hub id (with --use_peft true for a new adapter)."
            )
    if strategy is None or not strategy.needs_perturbed_pass or not name:
        return
    path = local_config_file(name, model_args.model_revision)  # None for a built-in name: it resolves later
    if path is None:
        return
    try:
        model_type = json.loads(path.read_text()).get("model_type")
    except (OSError, ValueError):
        return  # unreadable: transformers says why when it loads
    if model_type and family_of(SimpleNamespace(model_type=model_type)) is None:
        raise UsageError(
            f"model_name_or_path {name}: a {model_type!r} model, for which VEPO has no perturbation adapter"
            f"{blocker(model_type)}, and "
            f"selection_strategy {training_args.selection_strategy!r} perturbs the model's images. Supported families: "
            f"{', '.join(supported_families())}; or --selection_strategy entropy / full."
        )


def is_known_dataset(name: str) -> bool:
    from .data.loaders import NAME_ALIASES, PAPER_MIX_NAME

    key = name.strip().lower()
    return key in NAME_ALIASES or key == PAPER_MIX_NAME or Path(name).expanduser().exists()


def dataset_name_problem(name: str) -> str:
    from .data.loaders import accepted_names

    return f"no such data set or file; accepted: {accepted_names()}, synthetic, or lab"
