"""Sharded weights (FSDP1, FSDP2, DeepSpeed ZeRO-3): read the whole LM head, and run the same parameter gathers on
every process whatever its micro-batch holds.

Under sharding a module's parameters are gathered by collectives when it runs. Two things VEPO needs then break:

- the signals read the LM head's weight directly, outside a forward. FSDP2 (DTensor) and ZeRO-3 are gathered inside
  `scoring.token_signals`; FSDP1 keeps the weight as a flat 1-D slice of the local shard outside a forward, so
  `full_lm_head` gathers its FSDP unit around the read (a collective: every process enters it, with or without rows);
- a vision-language model runs its vision tower only when the micro-batch has an image. A process whose micro-batch is
  text-only would enter fewer gathers than one whose has: a hang, or gathers paired with the wrong tensors.
  `VisionTowerAlignment` makes every process run the vision tower in a forward where any process runs it (one scalar
  all-reduce per forward tells): where the model would not (no `pixel_values`), it runs it on a small dummy image
  just before the language model, at the point in the forward
  where an image forward runs it, and adds `0 x` its output to the language model's input embeddings so the backward
  reaches the tower's parameters too, last, as for an image (their gradient reductions line up in number and order,
  and their gradient is exactly zero).

DeepSpeed ZeRO-2 does not shard weights, but reduces gradients by bucket as they are produced: with a trainable
vision tower a text-only process must run the tower too (its gradient exactly zero), so the alignment is installed
there as well (`gradients_reduce_by_bucket`). Nothing here runs otherwise.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import torch


logger = logging.getLogger(__name__)


# Attribute names of the vision tower and the language model inside transformers' multimodal models
_VISION_NAMES = ("visual", "vision_tower", "vision_model")
_LANGUAGE_NAMES = ("language_model", "text_model")


def weights_are_sharded(trainer) -> bool:
    """Whether the trainer's model will run with sharded parameters (FSDP1, FSDP2 or ZeRO-3)."""
    if getattr(trainer, "is_fsdp_enabled", False):
        return True
    plugin = getattr(trainer.accelerator.state, "deepspeed_plugin", None)
    return bool(getattr(trainer, "is_deepspeed_enabled", False) and plugin is not None and plugin.zero_stage == 3)


def _fsdp1_owner(model: torch.nn.Module, module: torch.nn.Module):
    """The innermost FSDP1 unit holding `module`'s parameters, or `None` when `model` is not wrapped by FSDP1."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    if not isinstance(model, FullyShardedDataParallel):  # FSDP1 always wraps the root: nothing to walk otherwise
        return None
    units, target = {}, None
    for name, child in model.named_modules():
        if isinstance(child, FullyShardedDataParallel):
            units[name] = child
        if child is module:
            target = name
    if not units or target is None:
        return None
    # The unit whose path is the longest prefix of the module's (the root unit's path is "")
    owners = [name for name in units if name == "" or target == name or target.startswith(name + ".")]
    return units[max(owners, key=len)] if owners else None


@contextmanager
def full_lm_head(model: torch.nn.Module, head: torch.nn.Module):
    """Within the block `head.weight` (and bias) hold the whole parameter under FSDP1: its unit is gathered, without
    write-back. A collective under FSDP1: every process must enter it. Elsewhere it does nothing (FSDP2 and ZeRO-3
    are gathered by `scoring.token_signals` itself)."""
    owner = _fsdp1_owner(model, head)
    if owner is None:
        yield
        return
    from torch.distributed.fsdp import FullyShardedDataParallel

    with FullyShardedDataParallel.summon_full_params(owner, recurse=False, writeback=False):
        yield


def dummy_image():
    """The small mid-grey image of every stand-in vision forward (a process with nothing to score, a process without
    an image beside one with): the processor resizes it to its own bounds."""
    from PIL import Image

    return Image.new("RGB", (56, 56), (127, 127, 127))


def _named_child(module: torch.nn.Module, names) -> torch.nn.Module | None:
    for name in names:
        child = getattr(module, name, None)
        if isinstance(child, torch.nn.Module):
            return child
    return None


def _tensors(output) -> list[torch.Tensor]:
    """Every tensor in a module's output (a tensor, a tuple or list, a ModelOutput)."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        return [t for item in output for t in _tensors(item)]
    return []


class VisionTowerAlignment:
    """Hooks that make every forward of a vision-language model run its vision tower once (see the module doc).

    `multimodal_model` is the model holding the vision tower and the language model (`model.model` of a `...ForConditionalGeneration`);
    `dummy_inputs` the processor's image inputs for one small image (`pixel_values`, `image_grid_thw`, ...), passed
    to its `get_image_features`."""

    def __init__(self, multimodal_model: torch.nn.Module, dummy_inputs: dict[str, torch.Tensor]):
        self.model = multimodal_model
        self.vision = _named_child(multimodal_model, _VISION_NAMES)
        self.language = _named_child(multimodal_model, _LANGUAGE_NAMES)
        if self.vision is None or self.language is None or not hasattr(multimodal_model, "get_image_features"):
            raise ValueError(
                f"{type(multimodal_model).__name__} has no vision tower and language model VEPO can align under "
                "sharding; run it without FSDP / ZeRO-3, or with a supported family (README)."
            )
        self.dummy_inputs = dummy_inputs
        self.dummy_forwards = 0  # forwards whose vision tower ran on the dummy image (tests read it)
        self._ran = self._needed = False
        # Prepended: ahead of hooks a sharding wrapper registered first (a reference model TRL prepared before VEPO's
        # __init__ ran), so the dummy's modules are recorded in the same order as a real image's
        self._handles = [
            multimodal_model.register_forward_pre_hook(self._start, with_kwargs=True, prepend=True),
            self.vision.register_forward_pre_hook(self._mark, prepend=True),
            self.language.register_forward_pre_hook(self._align, with_kwargs=True, prepend=True),
        ]
        self._generation_model = None

    @classmethod
    def for_model(cls, model: torch.nn.Module, processing_class) -> VisionTowerAlignment:
        """Hooks on a transformers vision-language model (`...ForConditionalGeneration`), with the dummy image made by
        its own processor."""
        inner = model.get_decoder() if not hasattr(model, "model") else model.model
        encoded = processing_class.image_processor(images=[dummy_image()], return_tensors="pt")
        alignment = cls(inner, {key: value for key, value in encoded.items() if isinstance(value, torch.Tensor)})
        alignment._wrap_generation(model)
        return alignment

    @staticmethod
    def _anyone(mine: bool, like: torch.Tensor | None) -> bool:
        """Whether any process has an image here: one scalar all-reduce (MAX), made by every process."""
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return mine
        if torch.distributed.get_world_size() == 1:
            return mine
        if like is not None:
            device = like.device
        else:  # NCCL needs the flag on the process's accelerator
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
        flag = torch.tensor([float(mine)], device=device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())

    def _wrap_generation(self, model: torch.nn.Module) -> None:
        """transformers (5.24+) encodes the images of a `generate` call before its first forward
        (`_prepare_multimodal_encoder_kwargs_for_generation`), outside the hooks above: there too, a process without an
        image runs the tower on the dummy where another process encodes one (no gradient: generation)."""
        original = getattr(model, "_prepare_multimodal_encoder_kwargs_for_generation", None)
        if original is None:
            return

        def prepare(model_kwargs):
            mine = model_kwargs.get("pixel_values") is not None
            like = next((t for t in model_kwargs.values() if isinstance(t, torch.Tensor)), None)
            needed = self._anyone(mine, like)
            out = original(model_kwargs)
            if needed and not mine:
                self._dummy_zero(like.device if like is not None else None)
            return out

        model._prepare_multimodal_encoder_kwargs_for_generation = prepare
        self._generation_model = model

    def _start(self, module, args, kwargs):
        """Whether any process runs its vision tower in this forward: one scalar all-reduce, which every process makes
        in every forward. Decode steps (no process has an image) then run no dummy at all. A generation's prefill,
        whose images transformers encoded beforehand (`mm_encoder_outputs`), runs the tower nowhere: nothing here."""
        self._ran = False
        mine = kwargs.get("pixel_values") is not None
        like = next((t for t in (*kwargs.values(), *args) if isinstance(t, torch.Tensor)), None)
        self._needed = self._anyone(mine, like)

    def _mark(self, module, args):
        self._ran = True

    def _dummy_zero(self, device) -> torch.Tensor:
        """Run the vision tower on the dummy image; `0 x` the sum of its features (a graph link, exactly zero)."""
        inputs = {key: value.to(device) for key, value in self.dummy_inputs.items()}
        dtype = next((p.dtype for p in self.vision.parameters() if p.is_floating_point()), None)
        if dtype is not None and "pixel_values" in inputs:
            inputs["pixel_values"] = inputs["pixel_values"].to(dtype)
        features = self.model.get_image_features(**inputs)
        # Only what an image forward feeds the language model (transformers 5: `pooler_output`): under ZeRO-3 each
        # output that receives a gradient enters the tower's backward hook once more, and the processes' recorded
        # module orders must agree
        pooled = getattr(features, "pooler_output", None)
        if pooled is not None:
            # Deepstack features feed the language model too (a `deepstack_features` output): their mergers need a gradient
            features = [pooled, getattr(features, "deepstack_features", None)]
        self._ran = True
        self.dummy_forwards += 1
        return sum(t.float().sum() for t in _tensors(features) if t.is_floating_point()) * 0.0

    def _align(self, module, args, kwargs):
        # Before the language model, where an image forward runs the tower; the zero joins the language model's
        # input embeddings, so in the backward the tower comes last, as it does for an image
        if self._ran or not self._needed:
            return None
        embeds = kwargs.get("inputs_embeds")
        if embeds is None:
            raise RuntimeError(
                f"{type(module).__name__} was called without `inputs_embeds`: VEPO cannot align its vision tower under "
                "sharding. Run without FSDP / ZeRO-3."
            )
        kwargs["inputs_embeds"] = embeds + self._dummy_zero(embeds.device).to(embeds.dtype)
        return args, kwargs

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        if self._generation_model is not None:
            del self._generation_model._prepare_multimodal_encoder_kwargs_for_generation


def gradients_reduce_by_bucket(trainer, model: torch.nn.Module) -> bool:
    """DeepSpeed ZeRO-1 / ZeRO-2 with a trainable part on the image path (the vision tower, or the projector that
    stays trainable with a frozen tower: a `multi_modal_projector`, a patch merger): gradients are reduced in
    buckets of the parameters that got one, so a process whose micro-batch has no image fills other buckets than one
    whose has, and the reductions mismatch (gloo: a size error; NCCL: a likely hang)."""
    plugin = getattr(trainer.accelerator.state, "deepspeed_plugin", None)
    if not (getattr(trainer, "is_deepspeed_enabled", False) and plugin is not None and plugin.zero_stage in (1, 2)):
        return False
    inner = getattr(model, "model", model)
    language = _named_child(inner, _LANGUAGE_NAMES)
    image_path = [child for child in inner.children() if child is not language]
    return any(p.requires_grad for child in image_path for p in child.parameters())


def maybe_align_vision_tower(trainer, model: torch.nn.Module) -> VisionTowerAlignment | None:
    """`VisionTowerAlignment` on `model` when the trainer shards weights (or reduces a trainable tower's gradients by
    bucket, ZeRO-2) and the model has a vision tower; else nothing (no hook, no cost)."""
    if not hasattr(trainer.processing_class, "image_processor"):
        return None
    if not (weights_are_sharded(trainer) or gradients_reduce_by_bucket(trainer, model)):
        return None
    try:
        return VisionTowerAlignment.for_model(model, trainer.processing_class)
    except ValueError as error:
        # A layout we cannot align: batches whose processes all have images (or none) still run
        logger.warning("%s Processes whose micro-batches disagree about images may hang.", error)
        return None


class FusedHeadUnshard:
    """FSDP2 with a vision-language model: the LM head's gradient must go through FSDP's reduce-scatter.

    accelerate (1.15) shards the output embedding as its own group, with the final norm when `_find_final_norm`
    finds one among the base model's direct children. A vision-language model keeps its final norm inside the
    language model, so the head is a group alone, unsharded only when the head's own forward runs. TRL's fused LM
    head (every training forward) never calls it: it reads `lm_head.weight` and, where that is still a sharded
    DTensor, gathers it with `full_tensor()`, whose backward puts each process's own, unreduced gradient slice
    straight into the sharded gradient. The head then trains on each process's own data (vLLM rollouts: every
    micro-batch; transformers rollouts: every micro-batch after a gradient-accumulation window's first, whose head
    the rollout's decode steps left unsharded).

    A pre-hook on the backbone (inside the root's forward, after FSDP's root set-up) runs the head's forward on an
    empty input where that group is still sharded: FSDP unshards it the regular way (kept unsharded until the
    backward, `reshard_after_forward=False`), the fused head reads a plain tensor, and the backward reduce-scatters
    its gradient like every other parameter's. It does nothing once accelerate groups the head with a module that
    runs inside the backbone's forward, or when the head is already unsharded.
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.backbone = getattr(model, getattr(model, "base_model_prefix", ""), None)
        self.unshards = 0  # forwards where the head was unsharded here (tests read it)
        self._handle = self.backbone.register_forward_pre_hook(self._unshard, with_kwargs=True)

    def _unshard(self, module, args, kwargs):
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.tensor import DTensor

        head = self.model.get_output_embeddings()
        if not (isinstance(head, FSDPModule) and isinstance(head.weight, DTensor)):
            return None
        if len(head._get_fsdp_state()._modules) > 1:  # grouped with a module the backbone runs: unsharded there
            return None
        weight = head.weight
        # On the compute device: the backbone's inputs are there (with CPU offload the sharded weight is not)
        like = next((t for t in (*kwargs.values(), *args) if isinstance(t, torch.Tensor)), None)
        device = like.device if like is not None else weight.device
        head(torch.empty(0, weight.shape[-1], dtype=weight.dtype, device=device))
        self.unshards += 1
        return None

    def remove(self) -> None:
        self._handle.remove()


def maybe_unshard_fused_head(trainer, model: torch.nn.Module) -> FusedHeadUnshard | None:
    """`FusedHeadUnshard` on `model` under FSDP2 (see its doc); else nothing."""
    plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    if not getattr(trainer, "is_fsdp_enabled", False) or getattr(plugin, "fsdp_version", 1) != 2:
        return None
    backbone = getattr(model, getattr(model, "base_model_prefix", ""), None)
    if not isinstance(backbone, torch.nn.Module) or model.get_output_embeddings() is None:
        return None
    return FusedHeadUnshard(model)


def fsdp_facts(args) -> dict[str, str]:
    """How this run shards with FSDP (`validation.FACTS`: the version and the checkpoints' state-dict type), from
    the config's FSDP settings or `accelerate launch`'s environment; empty without FSDP."""
    import os

    plugin = getattr(args, "fsdp_plugin_args", None) or {}
    if plugin:
        version, state_dict = str(plugin.get("fsdp_version", 1)), str(plugin.get("state_dict_type", ""))
    elif os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true"):  # `accelerate launch` with an FSDP config
        version = os.environ.get("FSDP_VERSION", "1")
        state_dict = os.environ.get(
            "FSDP_STATE_DICT_TYPE", "FULL_STATE_DICT" if version == "1" else "SHARDED_STATE_DICT"
        )
    else:
        return {}
    return {"fsdp_version": version, "fsdp_state_dict_type": state_dict}
