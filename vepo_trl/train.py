"""Train a vision-language model with VEPO: the one entry script behind the recipes, the CLI and the notebook.

    accelerate launch --config_file recipes/accelerate_configs/zero2.yaml vepo_trl/train.py \
        --config recipes/Qwen2.5-VL-7B-Instruct/vepo/config_paper.yaml

or `vepo-trl train --config <recipe>.yaml` (same arguments), or `main(script_args, training_args, model_args)` from
Python. Any recipe key can be overridden on the command line (`--selection_ratio 0.3`).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import transformers
from accelerate import PartialState
from transformers import AutoModelForImageTextToText, AutoProcessor, ProgressCallback, set_seed
from transformers.trainer_utils import get_last_checkpoint
from trl import ModelConfig, ScriptArguments, TrlParser, get_peft_config, get_quantization_config

from vepo_trl.config import VEPOConfig
from vepo_trl.data import load_vepo_dataset, synthetic_training_dataset
from vepo_trl.local_models import LAB_MODEL, TINY_MODEL, resolve_model_name
from vepo_trl.rewards import get_reward_funcs
from vepo_trl.run_summary import REPORT_FILES
from vepo_trl.trainer import VEPOTrainer


logger = logging.getLogger(__name__)

# `dataset_name` that generates synthetic visual-reasoning rows instead of loading a data set
SYNTHETIC_DATASET = "synthetic"
# `dataset_name` of the lab's tasks (count the circles, name the square's colour), the warm start's task family
LAB_DATASET = "lab"


@dataclass
class VEPOScriptArguments(ScriptArguments):
    """Data, rewards and model set-up of a VEPO run (the trainer's settings live in `VEPOConfig`)."""

    dataset_name: str | None = field(
        default="paper_mix",
        metadata={
            "help": "Training data: geometry3k, k12, mmk12, paper_mix (Geometry3K train + K12 mini_train, ~4.2K), "
            "synthetic, a Hub id of one of these, or a local JSON/JSONL/parquet file or image folder with "
            "problem/answer/images columns."
        },
    )
    eval_dataset_name: str | None = field(
        default=None,
        metadata={"help": "Evaluation data (same choices), read from `dataset_test_split`. None: no evaluation set."},
    )
    reward_funcs: list[str] = field(
        default_factory=lambda: ["accuracy", "format"],
        metadata={"help": "Reward functions by name; weight them with `reward_weights` (the paper: 0.9 0.1)."},
    )
    min_pixels: int = field(default=262_144, metadata={"help": "Images are resized to at least this many pixels."})
    max_pixels: int = field(default=1_000_000, metadata={"help": "Images are resized to at most this many pixels."})
    strict_data: bool = field(
        default=False,
        metadata={
            "help": "Fail on the first unusable row (no image, unreadable image, empty answer) instead of "
            "dropping it with a count in the log."
        },
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only the first N training rows."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep only the first N evaluation rows."})
    synthetic_rows: int = field(default=256, metadata={"help": "Rows generated when dataset_name is synthetic."})
    freeze_vision_tower: bool = field(
        default=True, metadata={"help": "Freeze the vision encoder and its merger, as in the paper."}
    )


# A Hub repo id: "name" or "owner/name", letters, digits, "-", "_", "."
_HUB_ID = re.compile(r"^(?:[\w.-]+/)?[\w.-]+$")


class UsageError(ValueError):
    """A mistake in the run's arguments, found before any model or data loads (the CLI prints it in one line)."""


def check_model_name(name: str | None) -> None:
    """Fail early on a model that cannot exist: a missing local folder, a folder without `config.json`."""
    if not name:
        raise UsageError("model_name_or_path is not set: give a Hub id, a local model folder or tiny-qwen2.5-vl.")
    if name in (TINY_MODEL, LAB_MODEL):
        return
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UsageError(f"model_name_or_path {name!r} is a folder without config.json: not a saved model.")
        return
    looks_local = name.startswith(("/", "./", "../", "~", ".\\")) or path.exists() or not _HUB_ID.match(name)
    if looks_local:
        raise UsageError(
            f"model_name_or_path {name!r}: no such model folder. Give a local folder saved with save_pretrained, a "
            "Hub id such as Qwen/Qwen2.5-VL-3B-Instruct, or tiny-qwen2.5-vl (the tiny offline model)."
        )


def check_arguments(script_args, training_args, model_args) -> None:
    """Everything that can be checked without loading anything: model, rewards, data names. Raises `UsageError`."""
    check_model_name(model_args.model_name_or_path)
    try:
        get_reward_funcs(script_args.reward_funcs)
    except ValueError as error:
        raise UsageError(f"reward_funcs: {error}") from None
    weights = training_args.reward_weights
    if weights is not None and len(weights) != len(script_args.reward_funcs):
        raise UsageError(
            f"reward_weights has {len(weights)} entries for {len(script_args.reward_funcs)} reward_funcs "
            f"{script_args.reward_funcs}: give one weight per reward."
        )
    for field_name in ("dataset_name", "eval_dataset_name"):
        name = getattr(script_args, field_name)
        if name is None or (field_name == "eval_dataset_name" and not name):
            continue
        if name in (SYNTHETIC_DATASET, LAB_DATASET) or is_known_dataset(name):
            continue
        raise UsageError(f"{field_name} {name!r}: {dataset_name_problem(name)}")


def is_known_dataset(name: str) -> bool:
    from vepo_trl.data.loaders import _NAME_ALIASES, PAPER_MIX_NAME

    key = name.strip().lower()
    return key in _NAME_ALIASES or key == PAPER_MIX_NAME or Path(name).expanduser().exists()


def dataset_name_problem(name: str) -> str:
    from vepo_trl.data.loaders import _accepted_names

    return f"no such data set or file; accepted: {_accepted_names()}, synthetic, or lab"


class QuietProgressCallback(ProgressCallback):
    """The progress bar without the per-step metric dicts (they go to `metrics.jsonl` and the model card)."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        pass


def clear_previous_report(output_dir: str) -> list[str]:
    """Remove an earlier run's report files from `output_dir`; returns the names removed."""
    removed = []
    for name in REPORT_FILES:
        path = Path(output_dir) / name
        if path.is_file():
            path.unlink()
            removed.append(name)
    return removed


def load_dataset_split(name: str, split: str, script_args: VEPOScriptArguments, seed: int, limit: int | None):
    if name == SYNTHETIC_DATASET:
        # Distinct seeds per split, so evaluation rows are not training rows
        offset = 0 if split == script_args.dataset_train_split else 1
        dataset = synthetic_training_dataset(script_args.synthetic_rows, seed=seed + offset)
    elif name == LAB_DATASET:
        from .lab.tasks import make_rl_dataset
        from .lab.warm_start import WarmStartConfig

        # The warm start's SFT rows use seed 0 and its held-out rows 10_000 + seed: these are neither
        offset = 1000 if split == script_args.dataset_train_split else 2000
        dataset = make_rl_dataset(
            script_args.synthetic_rows, seed=seed + offset, image_size=WarmStartConfig().image_size
        ).remove_columns("kind")
    else:
        dataset = load_vepo_dataset(
            name,
            split,
            min_pixels=script_args.min_pixels,
            max_pixels=script_args.max_pixels,
            strict=script_args.strict_data,
            seed=seed,
        )
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    if len(dataset) == 0:
        raise ValueError(f"The {split!r} split of {name!r} has no usable rows; see the log for what was dropped.")
    return dataset


def freeze_vision_tower(model) -> int:
    """Freeze the vision encoder (and its patch merger); returns how many parameters were frozen."""
    tower = getattr(getattr(model, "model", None), "visual", None) or getattr(model, "visual", None)
    if tower is None:
        raise ValueError(
            f"{type(model).__name__} has no vision tower (`model.visual`) to freeze; set freeze_vision_tower false."
        )
    tower.requires_grad_(False)
    return sum(p.numel() for p in tower.parameters())


def load_model(model_id: str, model_args: ModelConfig, training_args: VEPOConfig, freeze_vision: bool):
    kwargs = {
        "revision": model_args.model_revision,
        "trust_remote_code": training_args.trust_remote_code,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
    }
    quantization_config = get_quantization_config(model_args)
    if quantization_config is not None:
        kwargs["quantization_config"] = quantization_config
        kwargs["device_map"] = {"": PartialState().local_process_index}
    model = AutoModelForImageTextToText.from_pretrained(model_id, **kwargs)
    if freeze_vision:
        logger.info("Froze %d vision-tower parameters", freeze_vision_tower(model))
    return model


def main(
    script_args: VEPOScriptArguments, training_args: VEPOConfig, model_args: ModelConfig, *, quiet: bool = False
) -> VEPOTrainer:
    """Load data, model and processor, train with VEPO, save, write the model card and push when asked.

    Arguments are checked (`check_arguments`) before anything loads. `quiet` shows a progress bar without printing
    each step's metrics (the CLI's choice; they still go to the trainer's log history and the model card).
    """
    check_arguments(script_args, training_args, model_args)
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s", handlers=[logging.StreamHandler(sys.stdout)]
    )
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    set_seed(training_args.seed)

    model_id = resolve_model_name(model_args.model_name_or_path)
    train_dataset = load_dataset_split(
        script_args.dataset_name,
        script_args.dataset_train_split,
        script_args,
        training_args.seed,
        script_args.max_train_samples,
    )
    eval_dataset = None
    if script_args.eval_dataset_name:
        eval_dataset = load_dataset_split(
            script_args.eval_dataset_name,
            script_args.dataset_test_split,
            script_args,
            training_args.seed,
            script_args.max_eval_samples,
        )

    model = load_model(model_id, model_args, training_args, script_args.freeze_vision_tower)
    processor = AutoProcessor.from_pretrained(
        model_id, revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code
    )
    trainer = VEPOTrainer(
        model=model,
        reward_funcs=get_reward_funcs(script_args.reward_funcs),
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=processor,
        peft_config=get_peft_config(model_args),
    )
    if quiet and not training_args.disable_tqdm:
        trainer.remove_callback(ProgressCallback)
        trainer.add_callback(QuietProgressCallback)

    checkpoint = training_args.resume_from_checkpoint
    if checkpoint is None and os.path.isdir(training_args.output_dir):
        checkpoint = get_last_checkpoint(training_args.output_dir)
    if checkpoint is not None:
        logger.info("Resuming from %s", checkpoint)
    result = trainer.train(resume_from_checkpoint=checkpoint)
    if not quiet:
        trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()
    trainer.save_model(training_args.output_dir)

    card_kwargs = {"dataset_name": script_args.dataset_name, "tags": ["vepo", "grpo", "vision-language"]}
    if trainer.accelerator.is_main_process:
        trainer.create_model_card(**card_kwargs)
    if training_args.push_to_hub:
        trainer.push_to_hub(**card_kwargs)
    return trainer


def make_parser() -> TrlParser:
    return TrlParser((VEPOScriptArguments, VEPOConfig, ModelConfig))


if __name__ == "__main__":
    main(*make_parser().parse_args_and_config())
