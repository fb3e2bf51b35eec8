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
from vepo_trl.errors import UsageError, check_output_folder
from vepo_trl.local_models import (  # noqa: F401  (TINY_MODEL, LAB_MODEL: re-exported, the names recipes use)
    LAB_MODEL,
    TINY_MODEL,
    check_hub_push,
    check_model_name,
    hub_unreachable,
    image_factor_of,
    not_a_vlm,
    resolve_model_name,
)
from vepo_trl.preflight import check_first_step_fits, check_lora_targets
from vepo_trl.rewards import get_reward_funcs
from vepo_trl.run_folder import (
    check_folder_owner,
    check_same_data,
    data_fingerprint,
    discard_set_aside,
    foreign_card,
    hold_folder,
    plan_run,
    run_settings,
    set_aside,
    write_record,
)
from vepo_trl.trainer import VEPOTrainer
from vepo_trl.trainer_inputs import check_packages, check_train_rows
from vepo_trl.validation import check_combinations, check_object, rules_for


logger = logging.getLogger(__name__)

# `dataset_name` that generates synthetic visual-reasoning rows instead of loading a data set
SYNTHETIC_DATASET = "synthetic"
# `dataset_name` of the lab's tasks (count the circles, name the square's colour), the warm start's task family
LAB_DATASET = "lab"


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
    synthetic_rows: int = field(default=256, metadata={"help": "Rows generated when dataset_name is synthetic."})
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


def check_output_dir(output_dir: str | None) -> None:
    """An output folder that can be written: not empty, not a file, in a writable place."""
    if output_dir is None or not str(output_dir).strip():
        raise UsageError("output_dir is empty: give the folder the model and its report go to (--output_dir run1).")
    check_output_folder("output_dir", output_dir)
    check_folder_owner("output_dir", output_dir, "train")
    path = Path(output_dir).expanduser()
    readme = foreign_card(path)
    if readme is not None:
        raise UsageError(
            f"output_dir {output_dir} holds a {readme.name} that vepo-trl did not write, and the run's model card "
            "would replace it: choose another --output_dir (or move the file)."
        )


def _check_values(script_args, training_args, model_args) -> None:
    """The script's and the model's values against their rules (`vepo_trl.validation`; VEPOConfig checks its own when
    built), and the constraints that join the three."""
    try:
        check_object(script_args, rules_for(VEPOScriptArguments))
        check_object(model_args, rules_for(ModelConfig))
        check_combinations(
            {
                "reward_weights": training_args.reward_weights,
                "reward_funcs": script_args.reward_funcs,
                **pixel_bounds(script_args, script_args.dataset_name),
            }
        )
    except ValueError as error:
        raise UsageError(str(error)) from None


def pixel_bounds(script_args, dataset_name: str | None) -> dict[str, int]:
    """The image bounds a data set is loaded with: those given, else the data set's own defaults."""
    from vepo_trl.data.loaders import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS

    low, high = (DEFAULT_MIN_PIXELS, DEFAULT_MAX_PIXELS) if dataset_name != SYNTHETIC_DATASET else (56 * 56, 224 * 224)
    return {
        "min_pixels": script_args.min_pixels if script_args.min_pixels is not None else low,
        "max_pixels": script_args.max_pixels if script_args.max_pixels is not None else high,
    }


# TRL's ModelConfig fields that shape a LoRA adapter: they mean something only with use_peft
LORA_FIELDS = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_target_parameters",
               "lora_modules_to_save", "lora_task_type", "use_rslora", "use_dora")  # fmt: skip


def check_nothing_ignored(script_args, training_args, model_args, given=()) -> None:
    """Every setting the run was given takes effect, or is refused here in one line naming it. `given`: the names the
    command line or recipe set (the CLI's; the Python API compares with the defaults instead)."""
    from trl import ModelConfig

    defaults = ModelConfig()
    if not model_args.use_peft:
        set_here = [
            name for name in LORA_FIELDS if name in given or getattr(model_args, name) != getattr(defaults, name)
        ]
        if set_here:
            raise UsageError(
                f"--{set_here[0]} is set but --use_peft is false, so no adapter would be trained and the whole model "
                f"would: add --use_peft true, or drop {', '.join('--' + name for name in set_here)}."
            )
    datasets_read = [script_args.dataset_name, script_args.eval_dataset_name or None]
    if LAB_DATASET in datasets_read:
        bounds = [name for name in ("min_pixels", "max_pixels") if getattr(script_args, name) is not None]
        if bounds:
            raise UsageError(
                f"--{bounds[0]} {getattr(script_args, bounds[0])}: dataset_name lab draws its images at the warm "
                "start's own size, which no bound changes; drop it (bounds apply to loaded and synthetic data)."
            )
    if training_args.fp16 and training_args.device.type == "cpu":
        raise UsageError(
            "--fp16 true needs a GPU, and this run is on the CPU (use_cpu, or none visible), where it would train in "
            "float32: drop --fp16 (--bf16 runs on the CPU)."
        )
    if training_args.torch_compile and training_args.device.type == "cpu":
        raise UsageError(
            "--torch_compile true on the CPU compiles for minutes before the first step, and Ctrl-C cannot stop it "
            "while it does; drop it here (it pays off on a GPU)."
        )
    if _value(training_args.eval_strategy) != "no" and not script_args.eval_dataset_name:
        raise UsageError(
            f"--eval_strategy {_value(training_args.eval_strategy)} evaluates on an evaluation set, and none is "
            "given: add --eval_dataset_name (e.g. geometry3k, or a local file), or drop --eval_strategy."
        )
    if script_args.eval_dataset_name and _value(training_args.eval_strategy) == "no":
        raise UsageError(
            f"--eval_dataset_name {script_args.eval_dataset_name} is never used with eval_strategy 'no': add "
            "--eval_strategy steps --eval_steps N (or epoch), or drop --eval_dataset_name."
        )
    check_packages(training_args)


def _value(option):
    return getattr(option, "value", option)


def _check_hub_dataset(field_name: str, name: str) -> None:
    """A Hub data set that is neither cached nor downloadable (offline): one line now, not a minute of retries."""
    from vepo_trl.data.loaders import _NAME_ALIASES, HUB_DATASETS, PAPER_MIX, PAPER_MIX_NAME

    key = name.strip().lower()
    if Path(name).expanduser().exists():
        return
    names = [part for part, _ in PAPER_MIX] if key == PAPER_MIX_NAME else [_NAME_ALIASES[key]]
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


def check_arguments(script_args, training_args, model_args, given=()) -> None:
    """Everything that can be checked without loading anything: model, rewards, data names and values, settings that
    would be ignored, the output folder, the Hub when a name needs it. Raises `UsageError`. `given`: the option names
    the command line and recipe set (`check_nothing_ignored`)."""
    check_output_dir(training_args.output_dir)
    try:
        get_reward_funcs(script_args.reward_funcs)
    except ValueError as error:
        raise UsageError(f"reward_funcs: {error}") from None
    _check_values(script_args, training_args, model_args)
    check_nothing_ignored(script_args, training_args, model_args, given)
    if training_args.use_vllm:
        from vepo_trl.vllm_prompts import check_vllm_version

        check_vllm_version()
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
    """A strategy that perturbs images needs a model family VEPO has an adapter for: read off the model folder's (or
    the cached Hub repo's) `config.json` before any weight loads."""
    import json
    from types import SimpleNamespace

    from vepo_trl.families import blocker, family_of, supported_families
    from vepo_trl.local_models import local_config_file
    from vepo_trl.scoring import SELECTION_STRATEGIES

    strategy = SELECTION_STRATEGIES.get(training_args.selection_strategy)
    name = model_args.model_name_or_path
    text_only = not_a_vlm(name, model_args.model_revision)
    if text_only:
        raise UsageError(
            f"model_name_or_path {name}: {text_only}; vepo-trl train trains vision-language models on image data. "
            "For a text model, call VEPOTrainer from Python with text prompts and selection_strategy 'entropy' or "
            "'full' (its tokenizer as processing_class)."
        )
    _check_processor_files(name)
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


def _check_processor_files(name: str | None) -> None:
    """A local model or adapter folder must hold its processor (the run loads it from there, after the weights)."""
    path = Path(name).expanduser() if name else None
    if path is None or not path.is_dir():
        return
    if any((path / file).is_file() for file in ("processor_config.json", "preprocessor_config.json")):
        return
    kind = "adapter folder" if (path / "adapter_config.json").is_file() else "model folder"
    raise UsageError(
        f"model_name_or_path {name}: the {kind} has no processor files (processor_config.json or "
        "preprocessor_config.json): save the processor beside it (processor.save_pretrained(folder)), or give the "
        "base model's folder or Hub id (with --use_peft true for a new adapter)."
    )


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
        from .lab.tasks import make_rl_dataset
        from .lab.warm_start import WarmStartConfig

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
    from vepo_trl.checkpoint import is_write_failure, save_failure
    from vepo_trl.local_models import WEIGHT_FILES

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


def make_parser() -> TrlParser:
    return TrlParser((VEPOScriptArguments, VEPOConfig, ModelConfig))


if __name__ == "__main__":
    # `accelerate launch vepo_trl/train.py ...` is `vepo-trl train ...`: the same checks, outputs and exit
    from vepo_trl.cli import main as cli_main

    cli_main(["train", *sys.argv[1:]])
