"""Restore a Trainer checkpoint's weights under the model's own names.

transformers 5 saves a model in its checkpoint format: `save_pretrained` reverts the key conversion `from_pretrained`
applies (a `model.visual.blocks.0...` is saved as `visual.blocks.0...`, `model.language_model.layers...`
as `model.layers...`). The Trainer's resume (`Trainer._load_from_checkpoint`, `_load_best_model`) reads that file
back with a plain `model.load_state_dict(state_dict, strict=False)`, so on every such family all weights but the
few whose names the conversion leaves alone are reported as missing keys and keep their values: a resumed run
continues from the base weights while announcing the checkpoint. `VEPOTrainer` calls `restore_weights` when the
Trainer's own load left keys missing (so the workaround does nothing once transformers loads them itself).

The name map comes from transformers' own inverse (`revert_weight_conversion`, what `save_pretrained` applies): each
saved tensor is matched to the model tensor it was made from. A tensor that a converter rebuilds from several saved
ones (an MoE's fused experts, saved one expert and projection at a time) has no one-to-one name: the same inverse,
applied to the tensor's element positions, says where each saved tensor's entries go. A checkpoint that still leaves
a tensor unrestored is refused in one line.

The data order is TRL's to restore, and TRL 1.16 does not: its `RepeatSampler` draws each epoch's order from one
generator that advances with every pass and has no `set_epoch`, so a run resumed in epoch k >= 1 draws epoch 0's order
again (and the Trainer then skips the wrong rows of it). `epoch_aware` gives the sampler a `set_epoch` that draws the
orders of the epochs the resumed run did not see; in a run that was not resumed it draws nothing.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field

import torch
from safetensors import safe_open

from ..errors import RunFault, UsageError


__all__ = [
    "CheckpointRestoreError",
    "RestoreReport",
    "RestoresCheckpointWeights",
    "SavesWholeCheckpoints",
    "epoch_aware",
    "restore_weights",
    "saved_names",
    "save_failure",
]

logger = logging.getLogger(__name__)

SAFE_WEIGHTS = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"


class CheckpointRestoreError(UsageError):
    """A checkpoint whose weights cannot all be restored: resuming would train on from other weights (one line)."""


@dataclass
class RestoreReport:
    folder: str
    restored: int  # model tensors set from the checkpoint
    total: int  # model tensors (parameters and persistent buffers, tied ones once)
    loaded_by_trainer: int  # those the Trainer's own load had found under the saved names
    missing: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"Restored {self.restored} of {self.total} weight tensors from {self.folder} (the Trainer's own load "
            f"found {self.loaded_by_trainer} under the saved names; the rest were restored through transformers' key "
            "conversion)"
        )


def _identity(tensor: torch.Tensor) -> tuple:
    return (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)


def _tied_groups(state: dict[str, torch.Tensor]) -> dict[tuple, list[str]]:
    """The model's names of each of its tensors (several when tied), keyed by the tensor's storage and layout."""
    groups: dict[tuple, list[str]] = {}
    for name, tensor in state.items():
        groups.setdefault(_identity(tensor), []).append(name)
    return groups


def saved_names(model: torch.nn.Module, state: dict[str, torch.Tensor] | None = None) -> dict[str, list[str]]:
    """Saved checkpoint name -> the model's names of that tensor (several when tied), from transformers' inverse.
    `state`: the model's `state_dict()`, when the caller holds it already."""
    from transformers.core_model_loading import revert_weight_conversion

    state = model.state_dict() if state is None else state
    by_tensor = _tied_groups(state)
    reverted = revert_weight_conversion(model, dict(state)) if hasattr(model, "config") else state
    names = {}
    for saved, tensor in reverted.items():
        model_names = by_tensor.get(_identity(tensor))
        if model_names:
            names[saved] = model_names
    return names


def _checkpoint_files(folder: str) -> list[str]:
    """The checkpoint's safetensors file or shards."""
    index = os.path.join(folder, SAFE_INDEX)
    if os.path.isfile(index):
        with open(index) as handle:
            return [os.path.join(folder, file) for file in sorted(set(json.load(handle)["weight_map"].values()))]
    if os.path.isfile(os.path.join(folder, SAFE_WEIGHTS)):
        return [os.path.join(folder, SAFE_WEIGHTS)]
    raise CheckpointRestoreError(f"{folder} holds no {SAFE_WEIGHTS} (or its index) to restore the weights from")


def _checkpoint_tensors(folder: str, wanted):
    """(name, tensor) of the tensors in a checkpoint's safetensors file or shards for which `wanted(name)`: the others
    (an MoE's per-expert pieces, placed later by `_restore_rebuilt`) are not read here."""
    for file in _checkpoint_files(folder):
        with safe_open(file, framework="pt", device="cpu") as handle:
            for name in handle.keys():
                if wanted(name):
                    yield name, handle.get_tensor(name)


def _restore_rebuilt(model, name: str, tensor: torch.Tensor, folder: str) -> bool:
    """Set a model tensor that transformers builds from several saved tensors: transformers' inverse, applied to the
    tensor's element positions, gives each saved tensor's positions in it. True when every position was set."""
    from transformers.core_model_loading import revert_weight_conversion

    # Assembled beside the checkpoint's tensors, which are read on the CPU; copied onto the tensor's device at the end
    index = torch.int32 if tensor.numel() < 2**31 else torch.int64
    positions = torch.arange(tensor.numel(), dtype=index, device="cpu")
    pieces = revert_weight_conversion(model, {name: positions.view(tensor.shape)})
    if set(pieces) == {name}:  # saved as it is: nothing rebuilds it
        return False
    values = torch.empty(tensor.numel(), dtype=tensor.dtype, device="cpu")
    covered = torch.zeros(tensor.numel(), dtype=torch.bool, device="cpu")
    for file in _checkpoint_files(folder):
        with safe_open(file, framework="pt", device="cpu") as handle:
            for saved in pieces.keys() & set(handle.keys()):
                piece = handle.get_tensor(saved)
                if tuple(piece.shape) != tuple(pieces[saved].shape):
                    raise CheckpointRestoreError(
                        f"{folder}: {saved} has shape {tuple(piece.shape)}, the part of the model's {name} it "
                        f"makes {tuple(pieces[saved].shape)}: the checkpoint is of another model"
                    )
                where = pieces[saved].reshape(-1).long()
                values[where] = piece.reshape(-1).to(tensor.dtype)
                covered[where] = True
    if not bool(covered.all()):
        return False
    with torch.no_grad():
        tensor.copy_(values.view(tensor.shape))
    return True


def restore_weights(model: torch.nn.Module, folder: str, missing_after_trainer: list[str]) -> RestoreReport:
    """Set every tensor of `model` from the checkpoint in `folder`, matching saved names to the model's.

    Raises `CheckpointRestoreError` (one line) when a model tensor has no counterpart in the checkpoint."""
    state = model.state_dict()
    names = saved_names(model, state)
    restored: set[str] = set()

    def targets(saved: str) -> list[str]:
        return names.get(saved) or ([saved] if saved in state else [])

    with torch.no_grad():
        for saved, tensor in _checkpoint_tensors(folder, targets):
            for target in targets(saved):
                if tuple(state[target].shape) != tuple(tensor.shape):
                    raise CheckpointRestoreError(
                        f"{folder}: {saved} has shape {tuple(tensor.shape)}, the model's {target} "
                        f"{tuple(state[target].shape)}: the checkpoint is of another model"
                    )
                state[target].copy_(tensor)  # the state dict's tensors share the parameters' storage
                restored.add(target)
    groups = _tied_groups(state)  # tied names are one tensor: restored once, counted once
    missing = sorted(group[0] for group in groups.values() if not restored.intersection(group))
    missing = [
        name
        for name in missing
        if not (hasattr(model, "config") and _restore_rebuilt(model, name, state[name], folder))
    ]
    left_by_trainer = set(missing_after_trainer)
    total = len(groups)
    report = RestoreReport(
        folder=folder,
        restored=total - len(missing),
        total=total,
        loaded_by_trainer=sum(not left_by_trainer.intersection(group) for group in groups.values()),
        missing=missing,
    )
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise CheckpointRestoreError(
            f"Cannot resume from {folder}: {len(missing)} of {total} weight tensors have no counterpart in its "
            f"weights ({shown}); it was saved from another model or by another transformers version"
        )
    return report


class _EpochAware:
    """A TRL `RepeatSampler` that counts its passes and takes `set_epoch` (accelerate's data loader calls it before
    each epoch): the orders of the epochs before `epoch` it has not drawn (a resumed run's) are drawn as its passes
    would have drawn them; in a run that drew them itself it draws nothing."""

    def __init__(self, sampler):
        self.sampler = sampler
        self.passes = 0

    def __iter__(self):
        self.passes += 1
        return iter(self.sampler)

    def __len__(self):
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        while self.passes < epoch:
            # cpu: the draw the sampler's own (CPU) generator makes in its pass, only to advance it
            torch.randperm(self.sampler.num_samples, generator=self.sampler.generator)
            self.passes += 1

    def __getattr__(self, name):  # the rest is the sampler's (num_samples, shuffle, seed, generator, ...)
        return getattr(self.sampler, name)


def epoch_aware(sampler):
    """`sampler` with a `set_epoch` that keeps a resumed run's data order the uninterrupted run's (see the module
    docstring); the sampler itself where it already has one (TRL fixed), does not shuffle or is not TRL's."""
    from trl.trainer.utils import RepeatSampler

    if not isinstance(sampler, RepeatSampler) or hasattr(sampler, "set_epoch") or not sampler.shuffle:
        return sampler
    return _EpochAware(sampler)


class RestoresCheckpointWeights:
    """Trainer mixin (ahead of `transformers.Trainer` in the bases): where the Trainer's own checkpoint load leaves
    weights missing, `restore_weights` sets them and `checkpoint_restore` reports the count. Nothing missing (a
    transformers that loads its saved names itself, FSDP, DeepSpeed, LoRA adapters): it only passes the result on.
    Its training sampler takes `set_epoch` (`epoch_aware`), so a run resumed past its first epoch reads the same rows
    in the same order as the run that went on."""

    checkpoint_restore: RestoreReport | None = None

    def _get_train_sampler(self, *args, **kwargs):
        return epoch_aware(super()._get_train_sampler(*args, **kwargs))

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        self._checkpoint_being_loaded = (resume_from_checkpoint, model if model is not None else self.model)
        try:
            super()._load_from_checkpoint(resume_from_checkpoint, model)
        finally:
            self._checkpoint_being_loaded = None

    def _load_best_model(self):
        self._checkpoint_being_loaded = (self.state.best_model_checkpoint, self.model)
        try:
            super()._load_best_model()
        finally:
            self._checkpoint_being_loaded = None

    def _issue_warnings_after_load(self, load_result):
        loading = getattr(self, "_checkpoint_being_loaded", None)
        if loading is None or not load_result.missing_keys:
            return super()._issue_warnings_after_load(load_result)
        folder, model = loading
        self.checkpoint_restore = restore_weights(model, folder, list(load_result.missing_keys))
        logger.info(self.checkpoint_restore.line())


# What torch, safetensors and the OS say when a write fails part-way (a full disk, a quota, an I/O error)
_WRITE_FAILURES = ("unexpected pos", "PytorchStreamWriter", "file write failed", "No space left", "StorageFull",
                   "Disk quota", "IoError", "Input/output error")  # fmt: skip


def is_write_failure(error: BaseException) -> bool:
    return isinstance(error, OSError) or any(text in str(error) for text in _WRITE_FAILURES)


def save_failure(what: str, error: BaseException, run_dir: str, removed: bool) -> RunFault:
    """The one line a failed save ends the run with: what failed and why, what was removed, the last complete
    checkpoint, and how to go on."""
    import shutil

    from transformers.trainer_utils import get_last_checkpoint

    last = get_last_checkpoint(run_dir) if os.path.isdir(run_dir) else None
    try:
        free = f" ({shutil.disk_usage(run_dir).free / 2**20:,.0f} MB free there now)"
    except OSError:
        free = ""
    kept = f"{last} is the last complete checkpoint" if last else "no complete checkpoint is left"
    cause = " ".join(str(error).split())[:160]
    return RunFault(
        f"saving {what} failed ({type(error).__name__}: {cause}){free}; "
        f"{'the partial files were removed, and ' if removed else ''}{kept}: free some space and rerun the same "
        "command to go on from it."
    )


class SavesWholeCheckpoints:
    """Trainer mixin: a checkpoint whose save fails part-way (a disk that fills up, a quota, a write error) is removed,
    not left half-written, and the run ends with one `RunFault` line naming the last complete checkpoint (torch's
    own error was a 67-line traceback that left the partial folder for the next resume to trip over)."""

    def _save_checkpoint(self, model, trial):
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        run_dir = self._get_output_dir(trial=trial)
        folder = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        existed = os.path.exists(folder)
        try:
            return super()._save_checkpoint(model, trial)
        except Exception as error:
            if not is_write_failure(error):
                raise
            removed = self.args.should_save and not existed
            if removed:
                import shutil

                shutil.rmtree(folder, ignore_errors=True)
            raise save_failure(folder, error, run_dir, removed) from error
