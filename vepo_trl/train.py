"""Train a vision-language model with VEPO: the one entry script behind the recipes, the CLI and the notebook.

    accelerate launch --config_file recipes/accelerate_configs/zero2.yaml vepo_trl/train.py \
        --config recipes/Qwen2.5-VL-7B-Instruct/vepo/config_paper.yaml

or `vepo-trl train --config <recipe>.yaml` (same arguments), or `main(script_args, training_args, model_args)` from
Python. Any recipe key can be overridden on the command line (`--selection_ratio 0.3`).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import transformers
from accelerate import PartialState
from transformers import AutoModelForImageTextToText, AutoProcessor, ProgressCallback, set_seed
from trl import ModelConfig, ScriptArguments, TrlParser, get_peft_config, get_quantization_config

from vepo_trl.config import VEPOConfig
from vepo_trl.data import load_vepo_dataset, synthetic_training_dataset
from vepo_trl.data.loaders import IMAGE_FACTOR
from vepo_trl.errors import UsageError
from vepo_trl.local_models import (  # noqa: F401  (TINY_MODEL, LAB_MODEL: re-exported, the names recipes use)
    LAB_DATASET,
    LAB_MODEL,
    SYNTHETIC_DATASET,
    TINY_MODEL,
    check_hub_push,
    check_model_name,
    hub_unreachable,
    image_factor_of,
    not_a_vlm,
    resolve_model_name,
)
from vepo_trl.preflight import (  # noqa: F401  (check_arguments and the data names: re-exported)
    check_arguments,
    check_first_step_fits,
    dataset_name_problem,
    is_known_dataset,
    pixel_bounds,
)
from vepo_trl.rewards import get_reward_funcs
from vepo_trl.run_folder import (
    check_same_data,
    data_fingerprint,
    discard_set_aside,
    hold_folder,
    plan_run,
    run_settings,
    set_aside,
    set_aside_incomplete,
    write_record,
)
from vepo_trl.trainer import VEPOTrainer
from vepo_trl.trainer_inputs import check_train_rows


logger = logging.getLogger(__name__)


@dataclass
class VEPOScriptArguments(ScriptArguments):
    """Data, rewards and model set-up of a VEPO run (the trainer's settings live in `VEPOConfig`)."""

    # Text, never unset: a run needs its training data (TRL's ScriptArguments lets it be None)
    dataset_name: str = field(
        default="paper_mix",
        metadata={
            "help": "Training data: geometry3k, k12, mmk12, paper_mix (Geometry3K train + K12 mini_train, ~4.2K), "
            "synthetic, lab, a Hub id of one of these, or a local JSON / JSONL / CSV / TSV (each also compressed) or "
            "parquet file, save_to_disk folder or image folder with problem (or question / query / prompt, plain text "
            "or TRL's conversational prompt), answer and images columns."
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
    min_pixels: int | None = field(
        default=None,
        metadata={
            "help": "Images are resized to at least this many pixels (unset: the paper's 262,144 for loaded data, "
            "3,136 for synthetic rows; the lab's rows keep the warm start's size and take no bounds)."
        },
    )
    max_pixels: int | None = field(
        default=None,
        metadata={
            "help": "Images are resized to at most this many pixels (unset: the paper's 1,000,000 for loaded data, "
            "50,176 for synthetic rows)."
        },
    )
    strict_data: bool = field(
        default=False,
        metadata={
            "help": "Fail on the first unusable row (no image, unreadable image, empty answer) instead of "
            "dropping it with a count in the log."
        },
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only the first N training rows."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep only the first N evaluation rows."})
    synthetic_rows: int = field(
        default=256, metadata={"help": "Rows generated when dataset_name is synthetic or lab."}
    )
    freeze_vision_tower: bool = field(
        default=True, metadata={"help": "Freeze the vision encoder and its merger, as in the paper."}
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Start fresh in an output_dir that holds an earlier run (another run's settings, or checkpoints "
            "that would otherwise be resumed); its files are replaced when this run finishes, not before."
        },
    )


def _model_image_factor(model_args) -> int | None:
    """The model's image multiple (`local_models.image_factor_of`), the same on a first run and on its resume: a
    built-in tiny model is built first (seconds), a Hub model's processor config is fetched if not cached yet (a few
    KB), so the data are resized alike before and after the model reaches the cache."""
    name, revision = model_args.model_name_or_path, model_args.model_revision
    if name and name.startswith("tiny-"):
        name = resolve_model_name(name)
    factor = image_factor_of(name, revision)
    if factor is None and name and not Path(name).expanduser().exists():
        from huggingface_hub import hf_hub_download

        for filename in ("preprocessor_config.json", "processor_config.json"):
            try:
                hf_hub_download(name, filename, revision=revision)
                break
            except Exception:  # not in this repo, or no network: the default multiple
                continue
        factor = image_factor_of(name, revision)
    return factor


class QuietProgressCallback(ProgressCallback):
    """The progress bar without the per-step metric dicts (they go to `metrics.jsonl` and the model card)."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        pass


def load_dataset_split(
    name: str,
    split: str,
    script_args: VEPOScriptArguments,
    seed: int,
    limit: int | None,
    image_factor: int | None = None,
):
    if name == SYNTHETIC_DATASET:
        # Distinct seeds per split, so evaluation rows are not training rows
        offset = 0 if split == script_args.dataset_train_split else 1
        dataset = synthetic_training_dataset(
            script_args.synthetic_rows, seed=seed + offset, **pixel_bounds(script_args, SYNTHETIC_DATASET)
        )
    elif name == LAB_DATASET:
        from .builtin.lab_tasks import make_rl_dataset
        from .builtin.warm_start import WarmStartConfig

        # The warm start's SFT rows use seed 0 and its held-out rows 10_000 + seed: these are neither
        offset = 1000 if split == script_args.dataset_train_split else 2000
        dataset = make_rl_dataset(
            script_args.synthetic_rows, seed=seed + offset, image_size=WarmStartConfig.for_task("colour").image_size
        ).remove_columns("kind")
    else:
        from vepo_trl.data.loaders import UnusableRowsError

        what = "dataset_name" if split == script_args.dataset_train_split else "eval_dataset_name"
        # A local file loads in seconds: its progress bars would only push an error line away from the prompt
        bars = Path(name).expanduser().exists() and datasets.utils.are_progress_bars_disabled() is False
        if bars:
            datasets.disable_progress_bars()
        try:
            dataset = load_vepo_dataset(
                name,
                split,
                **pixel_bounds(script_args, name),
                # The model's own multiple (patch x merge size), so its processor does not resample the image again
                image_factor=image_factor or IMAGE_FACTOR,
                strict=script_args.strict_data,
                seed=seed,
            )
        except UnusableRowsError as error:
            hint = "--strict_data false drops such rows instead" if error.strict else "no usable row is left"
            raise UsageError(f"{what} {error.describe(hint)}") from None
        except ValueError as error:  # a file that is empty, not JSON, not parquet, without the needed columns
            raise UsageError(f"{what} {name}: {error}") from None
        finally:
            if bars:
                datasets.enable_progress_bars()
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    if len(dataset) == 0:
        raise UsageError(f"The {split!r} split of {name!r} has no usable rows; see the log for what was dropped.")
    return dataset


def freeze_vision_tower(model) -> int:
    """Freeze the vision encoder (and Qwen's patch merger); returns how many parameters were frozen."""
    inner = getattr(model, "model", None)
    # transformers calls it `visual`, `vision_tower` or `vision_model`, by family
    names = ("visual", "vision_tower", "vision_model")
    tower = next((getattr(m, n) for m in (inner, model) for n in names if getattr(m, n, None) is not None), None)
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
) -> VEPOTrainer | None:
    """Load data, model and processor, train with VEPO, save, write the model card and push when asked.

    Returns None, having printed one line and written nothing, when `output_dir` holds this run already finished
    (its model or last checkpoint at `max_steps`): a rerun never trains past the end nor replaces the model.

    Arguments are checked (`check_arguments`) before anything loads. `quiet` shows a progress bar without printing
    each step's metrics (the CLI's choice; they still go to the trainer's log history and the model card).
    """
    if CHECKED.get(id(training_args)) is not training_args:  # the CLI checked these once, with what was typed
        check_arguments(script_args, training_args, model_args)
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s", handlers=[logging.StreamHandler(sys.stdout)]
    )
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    set_seed(training_args.seed)

    # One run per folder: the main process holds it from the folder's first read to the model card
    held = hold_folder(training_args.output_dir) if training_args.process_index == 0 else contextlib.nullcontext()
    with held:
        return _run(script_args, training_args, model_args, quiet=quiet)


def _run(script_args, training_args, model_args, *, quiet: bool) -> VEPOTrainer | None:
    output_dir = Path(training_args.output_dir)
    settings = run_settings(script_args, training_args, model_args)
    plan = plan_run(
        str(output_dir),
        settings,
        resume=training_args.resume_from_checkpoint,
        overwrite=script_args.overwrite_output_dir,
        max_steps=training_args.max_steps,
        num_train_epochs=training_args.num_train_epochs,
    )
    if plan.message and training_args.process_index == 0:
        print(plan.message)
    if plan.finished:
        return None

    # The data before the model: a bad file is reported before minutes of model loading
    image_factor = _model_image_factor(model_args)
    train_dataset = load_dataset_split(
        script_args.dataset_name,
        script_args.dataset_train_split,
        script_args,
        training_args.seed,
        script_args.max_train_samples,
        image_factor,
    )
    check_train_rows(train_dataset, training_args, f"dataset_name {script_args.dataset_name}")
    fingerprint = data_fingerprint(train_dataset)
    check_same_data(output_dir, fingerprint, resuming=plan.checkpoint is not None)
    eval_dataset = None
    if script_args.eval_dataset_name:
        eval_dataset = load_dataset_split(
            script_args.eval_dataset_name,
            script_args.dataset_test_split,
            script_args,
            training_args.seed,
            script_args.max_eval_samples,
            image_factor,
        )

    model_id = resolve_model_name(model_args.model_name_or_path)
    # The longest prompt against the model's context, the first step's memory against the machine's
    check_first_step_fits(model_id, model_args, training_args, train_dataset, image_factor)
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

    if trainer.accelerator.is_main_process:
        # Out of the new run's way, not deleted: the earlier run's checkpoints stay until this one has finished
        set_aside(output_dir, plan.set_aside)
        set_aside_incomplete(plan.incomplete)
        write_record(output_dir, settings, data_fingerprint=fingerprint)
    trainer.accelerator.wait_for_everyone()
    result = trainer.train(resume_from_checkpoint=plan.checkpoint)
    restore = getattr(trainer, "checkpoint_restore", None)
    if restore is not None and trainer.accelerator.is_main_process:
        print(restore.line())
    if not quiet:
        trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    save_whole(trainer, training_args.output_dir)
    if trainer.accelerator.is_main_process:
        discard_set_aside(output_dir)

    card_kwargs = {"dataset_name": script_args.dataset_name, "tags": ["vepo", "grpo", "vision-language"]}
    if trainer.accelerator.is_main_process:
        trainer.create_model_card(**card_kwargs)
    if training_args.push_to_hub:
        trainer.push_to_hub(**card_kwargs)
    return trainer


def save_whole(trainer, output_dir: str) -> None:
    """The run's state and model into `output_dir`; a write that fails part-way (a full disk) leaves no half-written
    weight file behind and ends the run with one line naming the last complete checkpoint."""
    from vepo_trl.local_models import WEIGHT_FILES
    from vepo_trl.trl_compat.checkpoint import is_write_failure, save_failure

    before = {path: path.stat().st_mtime_ns for path in Path(output_dir).glob("*") if path.is_file()}
    try:
        trainer.save_state()
        trainer.save_model(output_dir)
    except Exception as error:
        if not is_write_failure(error):
            raise
        written = [
            path
            for path in Path(output_dir).glob("*")
            if path.is_file()
            and path.name.startswith(tuple(name.split(".")[0] for name in WEIGHT_FILES))
            and before.get(path) != path.stat().st_mtime_ns
        ]
        if trainer.accelerator.is_main_process:
            for path in written:
                path.unlink(missing_ok=True)
        raise save_failure(f"the model into {output_dir}", error, output_dir, bool(written)) from error


# Arguments a command has checked (`commands.train`), so `main` does not check them again: id -> the object
CHECKED: dict[int, VEPOConfig] = {}


class VEPOParser(TrlParser):
    """TRL's parser over the script's, VEPO's and TRL's model dataclasses, without abbreviations (`--max_step 40`
    would hide a flag given twice). Whether each given setting is read is judged by its caller, which knows what was
    typed and what a recipe gave (`preflight.check_arguments`), not by each dataclass as it is built."""

    def __init__(self):
        super().__init__((VEPOScriptArguments, VEPOConfig, ModelConfig), allow_abbrev=False)

    def parse_args_and_config(self, *args, **kwargs):
        from vepo_trl.validation import READS_CHECKED_BY_COMMAND

        token = READS_CHECKED_BY_COMMAND.set(True)
        try:
            return super().parse_args_and_config(*args, **kwargs)
        finally:
            READS_CHECKED_BY_COMMAND.reset(token)


def make_parser() -> TrlParser:
    return VEPOParser()


if __name__ == "__main__":
    # `accelerate launch vepo_trl/train.py ...` is `vepo-trl train ...`: the same checks, outputs and exit
    from vepo_trl.cli import main as cli_main

    cli_main(["train", *sys.argv[1:]])
