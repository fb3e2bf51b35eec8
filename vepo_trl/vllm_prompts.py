"""Image prompts for vLLM in colocate mode: one placeholder per image, as vLLM expects them.

TRL 1.16 tokenises a prompt with the processor, so each image already stands as its N feature tokens (Qwen2.5-VL: N
`<|image_pad|>`), and hands those ids to `LLM.generate` together with the raw image. vLLM runs its own prompt update on
token prompts (Qwen2-VL's `PromptReplacement`: each `<|image_pad|>` of an image becomes that image's N tokens), so the
pre-expanded prompt is expanded a second time: 6 pads become 11, and the rollout is sampled from a corrupted prompt
while the trainer scores the clean one (huggingface/trl#6294 and #6401, open; the fix proposed in #6718 renders an
unexpanded copy with the tokenizer alone for vLLM). `VEPOTrainer` does the same without patching TRL: the trainer
keeps the processor-expanded ids, vLLM gets the chat template's text tokenised by the tokenizer alone.

Server mode is left as TRL does it: there TRL computes the image features itself and places them on the runs of image
tokens of the expanded ids, and the server applies no prompt update to such a request.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .utils import instance_override


__all__ = ["UnexpandedVLLMPrompts", "check_vllm_version", "trl_vllm_range", "unexpanded_prompt_ids", "vllm_gets"]


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


def check_vllm_version() -> None:
    """With `use_vllm`: refuse, in one line, a vLLM outside the installed TRL's range (vLLM 0.33 changed the server's
    log-prob entries and TRL 1.16's parser fails on every image rollout in server mode)."""
    from importlib.metadata import PackageNotFoundError, version

    from .errors import UsageError

    try:
        installed = version("vllm")
    except PackageNotFoundError:
        raise UsageError('use_vllm needs vLLM: pip install -e ".[vllm]" (the range TRL supports)') from None
    supported = trl_vllm_range()
    if supported is not None and not supported.contains(installed, prereleases=True):
        raise UsageError(
            f"use_vllm: vLLM {installed} is installed, but the installed TRL supports vllm{supported}; "
            'pip install -e ".[vllm]" installs a supported version'
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
    # The token vLLM expands per image: the image token (Qwen2-VL family, Idefics3 / SmolVLM) or the begin-of-image
    # token (Gemma 3, whose processor expands it into the image's soft tokens)
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
