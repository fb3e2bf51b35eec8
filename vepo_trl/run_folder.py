"""A run folder that knows its run: the settings it was made with, resumed or refused explicitly, never half-deleted.

`vepo-trl train`, `vepo-trl demo` and `train.main` write `vepo_run.json` into `output_dir`: the settings that change
what a run learns (VEPO's, the optimiser's, the sampling's, the data's and the model's). A later run into the same
folder is then

- refused, in one line naming each setting that differs and its two values, when the folder holds a run (checkpoints,
  a saved model or a report) made with other settings;
- resumed from the last `checkpoint-*`, announced in one line, when the settings are the same;
- started fresh when asked (`overwrite_output_dir`); the earlier run's checkpoints are set aside in
  `previous_run/` (not deleted) and removed only once the new run has finished.

One run at a time: a run holds a lock on the folder (`hold_folder`) while it trains, and a second run into it is
refused in one line. The model card goes to `README.md` only where that file is absent or a card this library wrote.

How long to train (`max_steps`, `num_train_epochs`) is not part of the record: resuming with a larger `max_steps`
trains a run further. `vepo-trl lab` keeps the same kind of record, `vepo_lab.json`, for its runs (`vepo_trl.lab`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import fcntl
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import UsageError
from .files import check_output
from .utils import count


RUN_FILE = "vepo_run.json"
# Where `overwrite_output_dir` moves the earlier run's checkpoints until the new run has finished
SET_ASIDE = "previous_run"
# Settings of the optimiser, the sampling and the GRPO loss that change what a run learns; VEPOConfig's own fields
# count too, but for the diagnostics that only log (`log_*`, `selection_samples_*`)
TRAINING_FIELDS = (
    "learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay", "max_grad_norm", "optim", "adam_beta1",
    "adam_beta2", "adam_epsilon", "seed", "data_seed", "per_device_train_batch_size", "gradient_accumulation_steps",
    "num_generations", "generation_batch_size", "steps_per_generation", "num_iterations", "max_completion_length",
    "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "generation_kwargs", "beta", "epsilon",
    "epsilon_high", "delta", "loss_type", "scale_rewards", "importance_sampling_level", "mask_truncated_completions",
    "top_entropy_quantile", "reward_weights", "bf16", "fp16", "use_vllm", "vllm_importance_sampling_correction",
)  # fmt: skip
SCRIPT_FIELDS = (
    "dataset_name", "dataset_config", "dataset_train_split", "reward_funcs", "min_pixels", "max_pixels",
    "max_train_samples", "synthetic_rows", "freeze_vision_tower", "strict_data",
)  # fmt: skip
MODEL_FIELDS = (
    "model_name_or_path", "model_revision", "dtype", "use_peft", "lora_r", "lora_alpha", "lora_dropout",
    "lora_target_modules", "load_in_4bit", "load_in_8bit",
)  # fmt: skip
# What in a folder shows that a run left something there (besides checkpoint-* folders)
_RUN_OUTPUTS = ("config.json", "adapter_config.json", "summary.md", "metrics.jsonl", "trainer_state.json")


# "_" first: the Trainer's Hub uploads skip it
LOCK_FILE = "_vepo_run.lock"
CARD_FILE = "README.md"


@contextlib.contextmanager
def hold_folder(folder: str | Path) -> Iterator[None]:
    """Hold `folder` for this run: a second run into it (same machine or a shared file system with flock) is refused in
    one line. The lock goes with the process, so a killed run never leaves the folder locked."""
    folder = Path(folder).expanduser()
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    while True:
        handle = open(path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise UsageError(
                f"output_dir {folder} is in use by another run ({holder}); wait for it to finish or choose another "
                "--output_dir."
            ) from None
        # The file is removed when a run ends: a lock taken on a file just removed is no lock, so take it again
        try:
            if os.path.samestat(os.fstat(handle.fileno()), os.stat(path)):
                break
        except FileNotFoundError:
            pass
        handle.close()
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {os.uname().nodename}")
        handle.flush()
        yield
    finally:
        with contextlib.suppress(OSError):  # a finished run leaves no lock file behind
            path.unlink()
        handle.close()  # releases the lock
        if created:  # a run refused before it wrote anything leaves no empty folder behind
            with contextlib.suppress(OSError):
                folder.rmdir()


def is_our_card(path: str | Path) -> bool:
    """Whether `path` is a model card this library wrote (its front matter carries the `vepo` tag)."""
    try:
        from huggingface_hub import ModelCard

        return "vepo" in (ModelCard.load(path).data.tags or [])
    except Exception:  # not a card at all, or unreadable: not ours
        return False


def foreign_card(folder: str | Path) -> Path | None:
    """The folder's `README.md` when it exists and this library did not write it (a model card must not replace it)."""
    path = Path(folder).expanduser() / CARD_FILE
    return path if path.is_file() and not is_our_card(path) else None


def _plain(value: Any) -> Any:
    """A JSON value that compares equal across a save and a load (enums by value, tuples as lists)."""
    if isinstance(value, enum.Enum):
        return value.value
    return json.loads(json.dumps(value, default=str))


def run_settings(script_args, training_args, model_args) -> dict[str, Any]:
    """The settings of a run that change its results, by name."""
    from .config import VEPOConfig

    vepo_fields = [
        name
        for name in vars(VEPOConfig)["__annotations__"]
        if not name.startswith(("log_", "selection_samples_")) and name != "scoring_tile_size"
    ]
    settings = {}
    for source, names in ((model_args, MODEL_FIELDS), (script_args, SCRIPT_FIELDS), (training_args, TRAINING_FIELDS)):
        for name in names:
            if hasattr(source, name):
                settings[name] = _plain(getattr(source, name))
    for name in vepo_fields:
        settings[name] = _plain(getattr(training_args, name))
    if settings.get("model_name_or_path") and Path(settings["model_name_or_path"]).expanduser().is_dir():
        settings["model_name_or_path"] = str(Path(settings["model_name_or_path"]).expanduser().resolve())
    return settings


# Settings newer than some run folders, with the value those runs had: a folder that does not record one matches it
ADDED_LATER = {"strategy_params": None, "perturbation_params": None}


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`name: A there, B here` for every setting whose value differs (a setting only one side has counts)."""
    missing = object()
    out = []
    for name in dict.fromkeys([*recorded, *current]):
        there, here = recorded.get(name, missing), current.get(name, missing)
        if there is missing and name in ADDED_LATER and here == ADDED_LATER[name]:
            continue  # a folder from before the setting existed ran at its default
        if there != here:
            show = lambda v: "unset" if v is missing else repr(v)  # noqa: E731
            out.append(f"{name} {show(there)} there, {show(here)} here")
    return out


def read_record(folder: Path, name: str = RUN_FILE) -> dict[str, Any] | None:
    path = folder / name
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise UsageError(
            f"{path} is not a readable record of a run ({type(error).__name__}); move it away to start fresh."
        ) from None
    if not isinstance(record, dict) or not isinstance(record.get("settings"), dict):
        raise UsageError(f"{path} is not a record of a run (no 'settings'); move it away to start fresh.")
    return record


def write_json_atomically(path: Path, data: Any) -> None:
    """Write JSON to a temporary file next to `path`, then rename it over `path`: never a half-written file."""
    write_text_atomically(path, json.dumps(data, indent=1) + "\n")


def write_text_atomically(path: Path, text: str) -> None:
    path = Path(path)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    temporary.write_text(text)
    os.replace(temporary, path)


def last_checkpoint(folder: Path) -> str | None:
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(str(folder)) if folder.is_dir() else None


def holds_a_run(folder: Path) -> bool:
    return folder.is_dir() and (
        last_checkpoint(folder) is not None or any((folder / name).exists() for name in _RUN_OUTPUTS)
    )


# The record each command keeps in the folder it writes, and what the folder then holds. A folder belongs to one
# command: `eval` writing its summary.md into a training run's folder would replace the run's report, `train` its
# model card and summary into an evaluation's.
EVAL_MANIFEST = "manifest.json"
LAB_RECORD = "vepo_lab.json"
_FOLDER_KINDS = {
    "train": "a training run (vepo-trl train / demo: a model, checkpoints or vepo_run.json)",
    "eval": f"evaluation results (vepo-trl eval: {EVAL_MANIFEST})",
    "lab": f"a lab (vepo-trl lab: {LAB_RECORD})",
}


def folder_owner(folder: str | Path) -> str | None:
    """The command whose results `folder` holds: "train", "eval", "lab", or None (empty, missing, or none of these)."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        return None
    manifest = folder / EVAL_MANIFEST
    if manifest.is_file():
        try:
            if {"generation", "sources"} & set(json.loads(manifest.read_text())):
                return "eval"
        except (OSError, ValueError, TypeError):
            pass
    if (folder / LAB_RECORD).is_file():
        return "lab"
    model_outputs = ("config.json", "adapter_config.json", "trainer_state.json", "model.safetensors", RUN_FILE)
    if any((folder / name).exists() for name in model_outputs) or last_checkpoint(folder) is not None:
        return "train"
    return None


def check_train_folder(output_dir: str | None, resume=None, max_steps: int | None = None) -> None:
    """A training run's output folder and the checkpoint it resumes, checked once (the CLI before TRL is imported,
    else `preflight.check_arguments`; `plan_run` takes them as checked): the folder not empty, one that can be written
    (`check_folder_owner`: its state, then no other command's folder), and no README.md of the user's that the
    model card would replace; `resume` (`resume_from_checkpoint` as given) not empty (TRL would read it as no resume
    and train from scratch), and a path names a complete checkpoint a run saved, not a run's finished folder, and not
    one already at `max_steps` (it would train nothing and report the other run's)."""
    if output_dir is None or not str(output_dir).strip():
        raise UsageError("output_dir is empty: give the folder the model and its report go to (--output_dir run1).")
    check_folder_owner("output_dir", output_dir, "train")
    readme = foreign_card(Path(output_dir).expanduser())
    if readme is not None:
        raise UsageError(
            f"output_dir {output_dir} holds a {readme.name} that vepo-trl did not write, and the run's model card "
            "would replace it: choose another --output_dir (or move the file)."
        )
    if not isinstance(resume, str):  # None (decide from the folder), or true / false from Python
        return
    if not resume.strip():
        raise UsageError(
            "resume_from_checkpoint is empty: give a checkpoint folder, or true (the output_dir's last checkpoint)."
        )
    if resume.strip().lower() in ("true", "last", "yes", "false", "no", "none"):
        return
    path = Path(resume).expanduser()
    if not path.is_dir():
        raise UsageError(f"resume_from_checkpoint {resume}: no such checkpoint folder.")
    if read_record(path) is not None and not path.name.startswith("checkpoint-"):
        raise UsageError(
            f"resume_from_checkpoint {resume}: a run's folder (its finished model and report), not one of its "
            f"checkpoints: name one of its checkpoint-* folders, or train into {resume} itself with its settings."
        )
    problem = checkpoint_problem(path)
    if problem:
        raise UsageError(f"{problem}; name a checkpoint-* folder a run saved.")
    done = finished_state_of(path, max_steps)
    if done is not None:
        raise UsageError(
            f"resume_from_checkpoint {resume} is at step {done}, and max_steps {max_steps} asks for no more: nothing "
            "would train. Give a larger --max_steps, or an earlier checkpoint."
        )


def check_folder_owner(flag: str, folder: str | Path, command: str) -> None:
    """Refuse (one line) an output folder that holds another command's results: this command's files would replace
    or mix with them; before that, the folder's own state (`files.check_output`: a file, a dangling link, too
    long a name, unwritable, a full disk)."""
    check_output(flag, folder)
    owner = folder_owner(folder)
    if owner is not None and owner != command:
        default = " (the default is eval-<model folder name>)" if command == "eval" else ""
        raise UsageError(
            f"{flag} {folder} holds {_FOLDER_KINDS[owner]}, and vepo-trl {command} would write its own files over "
            f"them: choose another --{flag.lstrip('-')}{default}."
        )


# What a checkpoint's weights are saved as: the model (one file or shards), a LoRA adapter, FSDP's or DeepSpeed's own
_WEIGHT_PATTERNS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                    "pytorch_model.bin.index.json", "adapter_model.safetensors", "adapter_model.bin",
                    "pytorch_model_fsdp*", "global_step*")  # fmt: skip


def checkpoint_problem(checkpoint: str | Path) -> str | None:
    """Why `checkpoint` cannot be resumed from (a run killed while saving leaves such a folder), or None."""
    path = Path(checkpoint)
    lacking = []
    if not (path / "trainer_state.json").is_file():
        lacking.append("trainer_state.json")
    if not any(any(path.glob(pattern)) for pattern in _WEIGHT_PATTERNS):
        lacking.append("weights (model.safetensors, an adapter, or FSDP / DeepSpeed state)")
    return f"{path} is not a complete checkpoint: it has no {' and no '.join(lacking)}" if lacking else None


def _step(checkpoint: str) -> str:
    return checkpoint.rsplit("-", 1)[-1]


@dataclasses.dataclass
class RunPlan:
    """What a run does with its output folder: the checkpoint it resumes (or None) and the line that says so."""

    checkpoint: str | None = None
    message: str | None = None
    set_aside: list[str] = dataclasses.field(default_factory=list)
    # Checkpoints a killed save left incomplete, newer than the one resumed: moved to `incomplete_checkpoints/` first
    incomplete: list[str] = dataclasses.field(default_factory=list)
    # The folder's run already reached the length asked for: nothing to train or write (`message` says so)
    finished: bool = False


def _trainer_state(path: Path) -> dict[str, Any] | None:
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and isinstance(state.get("global_step"), int) else None


def _reached(state: dict[str, Any], max_steps: int | None, num_train_epochs: float | None) -> bool:
    """Whether a run at `state` (a `trainer_state.json`) has trained what `max_steps` / `num_train_epochs` ask for."""
    if max_steps is not None and max_steps > 0:
        return state["global_step"] >= max_steps
    # An epoch-long run: its own step count, as long as no more epochs are asked for than it was given
    planned, epochs = state.get("max_steps"), state.get("num_train_epochs")
    if not isinstance(planned, int) or planned <= 0 or epochs is None or num_train_epochs is None:
        return False
    return epochs >= num_train_epochs and state["global_step"] >= planned


def finished_state_of(checkpoint: Path, max_steps: int | None) -> int | None:
    """The step of a checkpoint that has already trained `max_steps` (resuming it would train nothing), or None."""
    try:
        step = json.loads((checkpoint / "trainer_state.json").read_text()).get("global_step")
    except (OSError, ValueError):
        return None
    return step if isinstance(step, int) and max_steps and max_steps > 0 and step >= max_steps else None


def finished_state(folder: Path, max_steps: int | None, num_train_epochs: float | None) -> tuple[str, int] | None:
    """(where, step) when `folder`'s run has already trained as far as asked: its saved model's `trainer_state.json`
    (written once the run finished) or its last checkpoint's. None when there is more to train, or nothing."""
    found = []
    if (folder / "trainer_state.json").is_file() and any(
        any(folder.glob(pattern)) for pattern in _WEIGHT_PATTERNS[:6]
    ):
        found.append((f"its saved model ({folder / 'trainer_state.json'})", folder / "trainer_state.json"))
    last = last_checkpoint(folder)
    if last is not None and checkpoint_problem(last) is None:
        found.append((Path(last).name, Path(last) / "trainer_state.json"))
    for where, path in found:
        state = _trainer_state(path)
        if state is not None and _reached(state, max_steps, num_train_epochs):
            return where, state["global_step"]
    return None


def plan_run(
    output_dir: str,
    settings: dict[str, Any],
    *,
    resume: str | bool | None,
    overwrite: bool,
    max_steps: int | None = None,
    num_train_epochs: float | None = None,
) -> RunPlan:
    """Decide, before anything loads, whether a run into `output_dir` starts fresh, resumes, is refused, or has
    nothing left to do (`finished`: the folder's run already trained `max_steps` / `num_train_epochs`).

    `resume` is `resume_from_checkpoint`: None (decide from the folder), a checkpoint path, or true/"true"/"last"
    (the folder's last checkpoint). Raises `UsageError` for a folder of another run and for an impossible resume.
    """
    folder = Path(output_dir).expanduser()  # the folder and a named checkpoint were checked (`check_train_folder`)
    if isinstance(resume, str) and resume.strip().lower() in ("true", "last", "yes"):
        resume = True
    elif isinstance(resume, str) and resume.strip().lower() in ("false", "no", "none", ""):
        resume = None
    if overwrite:
        if resume:
            raise UsageError(
                "resume_from_checkpoint resumes the run in output_dir and overwrite_output_dir starts a fresh one: "
                "give one of them."
            )
        if not holds_a_run(folder):
            return RunPlan()
        checkpoints = sorted(str(path) for path in folder.glob("checkpoint-*") if path.is_dir())
        note = f" (its checkpoints wait in {folder / SET_ASIDE} until this run has finished)" if checkpoints else ""
        return RunPlan(
            message=f"{folder}/ holds an earlier run: overwrite_output_dir, so this run starts fresh and replaces "
            f"its model and report when it finishes{note}.",
            set_aside=checkpoints,
        )
    record = read_record(folder) if folder.is_dir() else None
    last = last_checkpoint(folder)
    if record is not None and holds_a_run(folder):
        diff = differences(record["settings"], settings)
        if diff:
            raise UsageError(
                f"output_dir {folder} holds a run made with other settings ({'; '.join(diff)}): rerun with its "
                "settings to resume or extend it, pass --overwrite_output_dir true to replace it, or choose another "
                "--output_dir."
            )
    if resume is not None and resume is not True:  # an explicit checkpoint: the user's choice of where to go on from
        pass
    elif record is not None and (done := finished_state(folder, max_steps, num_train_epochs)) is not None:
        # Resuming would train past the end (transformers steps once more) and replace the model: nothing to do
        where, step = done
        length = f"max_steps {max_steps}" if max_steps and max_steps > 0 else f"num_train_epochs {num_train_epochs}"
        unsaved = (
            f" Its model was not saved into {folder}/ (the run stopped while saving it): {where}'s weights are the "
            "model."
            if not where.startswith("its saved model")
            else ""
        )
        return RunPlan(
            message=f"{folder}/ holds this run finished: {where} is at step {step}, and {length} asks for no more. "
            "Nothing was trained or written (a larger --max_steps trains it further, --overwrite_output_dir true "
            f"trains it again from the start).{unsaved}",
            finished=True,
        )
    if resume is True:
        if last is None:
            raise UsageError(f"resume_from_checkpoint: {folder} holds no checkpoint-* folder to resume from.")
        last, incomplete = last_complete_checkpoint(folder)
        if last is None:
            raise UsageError(
                f"resume_from_checkpoint: {folder} holds no complete checkpoint ({_incomplete_note(incomplete)})."
            )
        note = f"{_incomplete_note(incomplete)}; " if incomplete else ""
        return RunPlan(last, f"{note}Resuming from {last} (step {_step(last)}), as asked.", incomplete=incomplete)
    if resume:
        return RunPlan(str(resume), f"Resuming from {resume}, as asked.")  # checked (`check_train_folder`)
    if last is not None:
        if record is None:
            raise UsageError(
                f"output_dir {folder} holds checkpoints ({Path(last).name}) of a run without a record of its settings "
                f"({RUN_FILE}): pass --resume_from_checkpoint true to resume it, --overwrite_output_dir true to start "
                "fresh, or choose another --output_dir."
            )
        # A requeued job reruns the same command after a kill at any moment: a checkpoint its save left incomplete is
        # set aside (renamed, never deleted) and the run resumes from the last complete one
        last, incomplete = last_complete_checkpoint(folder)
        note = f"{_incomplete_note(incomplete)}; " if incomplete else ""
        if last is None:
            return RunPlan(
                message=f"{note}{folder}/ holds no complete checkpoint: this run starts from the beginning.",
                incomplete=incomplete,
            )
        return RunPlan(
            last,
            f"{note}Resuming from {last} (step {_step(last)}): {folder}/ holds checkpoints of a run with the same "
            "settings (--overwrite_output_dir true starts fresh instead).",
            incomplete=incomplete,
        )
    if holds_a_run(folder):
        state = _trainer_state(folder / "trainer_state.json") if record is not None else None
        if state is not None and state["global_step"] > 0:
            # A finished run without checkpoints: a longer run cannot continue it, only start over and replace it
            raise UsageError(
                f"output_dir {folder} holds a finished run of {count(state['global_step'], 'step')} and no checkpoint-* to "
                "continue it from (save_strategy steps saves them): pass --overwrite_output_dir true to train again "
                "from the start and replace it, or choose another --output_dir."
            )
        return RunPlan(
            message=f"{folder}/ holds an earlier run: its model and report are replaced when this run finishes."
        )
    return RunPlan()


# Where checkpoints a killed save left incomplete are kept: a subfolder, out of sight of transformers' checkpoint
# rotation and resume (which read every `*checkpoint-N` name in the run's folder itself)
INCOMPLETE = "incomplete_checkpoints"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def last_complete_checkpoint(folder: Path) -> tuple[str | None, list[str]]:
    """The newest complete `checkpoint-N` of `folder` (None if none), and the incomplete ones newer than it."""
    checkpoints = [p for p in folder.glob("checkpoint-*") if p.is_dir() and _CHECKPOINT.match(p.name)]
    incomplete = []
    for path in sorted(checkpoints, key=lambda p: int(_CHECKPOINT.match(p.name).group(1)), reverse=True):
        if checkpoint_problem(path) is None:
            return str(path), incomplete
        incomplete.append(str(path))
    return None, incomplete


def _incomplete_note(paths: list[str]) -> str:
    names = ", ".join(Path(p).name for p in paths)
    verb = "is" if len(paths) == 1 else "are"
    return f"{names} {verb} incomplete (a save cut short) and set aside in {INCOMPLETE}/"


def set_aside_incomplete(paths: list[str]) -> list[str]:
    """Move each incomplete checkpoint into its run folder's `incomplete_checkpoints/` (`checkpoint-N.2`, ... when
    that step was cut short before): out of the resumed run's way (it saves that step again) and of transformers'
    rotation, kept for a look. Returns the new paths."""
    moved = []
    for path in map(Path, paths):
        if not path.is_dir():  # another process of the run moved it first
            continue
        target_dir = path.parent / INCOMPLETE
        target_dir.mkdir(exist_ok=True)
        target, n = target_dir / path.name, 1
        while target.exists():
            n += 1
            target = target_dir / f"{path.name}.{n}"
        os.replace(path, target)
        moved.append(str(target))
    return moved


def set_aside(folder: Path, paths: list[str]) -> None:
    """Move an earlier run's checkpoints into `folder/previous_run/`, out of the new run's way (not deleted)."""
    target = folder / SET_ASIDE
    for path in paths:
        target.mkdir(exist_ok=True)
        destination = target / Path(path).name
        if destination.exists():
            shutil.rmtree(destination)  # an older set-aside copy: the folder's own copy is the newer one
        os.replace(path, destination)


def discard_set_aside(folder: Path) -> None:
    """Once the new run has finished: the earlier run's checkpoints are no longer needed."""
    shutil.rmtree(Path(folder) / SET_ASIDE, ignore_errors=True)


def data_fingerprint(dataset) -> str:
    """sha256 of the rows a run trains on: the data set's Arrow content in order (images included), streamed through
    Arrow's IPC writer so that slices, chunks and index mappings hash as the rows they stand for."""
    import hashlib

    import pyarrow as pa

    digest = hashlib.sha256()

    class _Sink:
        closed = False

        def write(self, data):
            digest.update(data)
            return len(data)

        def flush(self):
            pass

    if getattr(dataset, "_indices", None) is not None:
        dataset = dataset.flatten_indices(keep_in_memory=True)
    table = dataset.data.table if hasattr(dataset.data, "table") else dataset.data
    table = table.replace_schema_metadata(None)  # datasets keeps its own (per-object) fingerprint there
    with pa.ipc.new_stream(pa.PythonFile(_Sink(), mode="w"), table.schema) as writer:
        # Fixed 1,024-row batches, each one chunk: the hash follows the rows, not how Arrow happens to chunk them
        for start in range(0, table.num_rows, 1024):
            writer.write_table(table.slice(start, 1024).combine_chunks())
    return digest.hexdigest()[:16]


def check_same_data(folder: Path, fingerprint: str, resuming: bool) -> None:
    """A resumed run trains on the data its checkpoints were trained on: refused in one line otherwise."""
    record = read_record(folder) if resuming and folder.is_dir() else None
    recorded = (record or {}).get("data_fingerprint")
    if recorded and recorded != fingerprint:
        raise UsageError(
            f"output_dir {folder} holds a run trained on other data (data fingerprint {recorded} there, {fingerprint} "
            "here: the data set or its files changed): resume with its data, pass --overwrite_output_dir true to "
            "start fresh, or choose another --output_dir."
        )


def write_record(
    folder: Path, settings: dict[str, Any], name: str = RUN_FILE, data_fingerprint: str | None = None
) -> None:
    from importlib.metadata import PackageNotFoundError, version

    try:  # the installed distribution's version, as the model card states it (no import of the package facade)
        installed = version("vepo-trl")
    except PackageNotFoundError:
        installed = "unknown"
    folder.mkdir(parents=True, exist_ok=True)
    record = {"vepo_trl": installed, "settings": settings}
    if data_fingerprint is not None:
        record["data_fingerprint"] = data_fingerprint
    write_json_atomically(folder / name, record)
