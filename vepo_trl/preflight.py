"""Checks of a training run against the model it will load, from configs and metadata only (no weight loads): the
LoRA targets against the model's module names, the data's prompts against the model's context, and the first step's
memory against the machine's. Each refusal is one `UsageError` line naming the setting, the figure and the fix.

The model is built on the meta device from its `config.json` (every module, no storage: a second for a 7B model), so
peft's own matching rule runs on the real module names; prompt lengths are counted with the model's own tokenizer.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .errors import UsageError
from .local_models import local_config_file


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
