"""Generation for evaluation, greedy or sampled: vLLM when installed (tensor parallel), else transformers.

Both take prompts already rendered with the processor's chat template and the prepared PIL images of each prompt,
and return the decoded completions in input order. Sampled (`temperature > 0`), each prompt's `seeds` entry makes its
draw reproducible: vLLM seeds each request with its own (any batching gives the same answers); transformers samples a
batch from one generator, seeded from its prompts' seeds (the same answers for the same batches). The transformers path runs in one process per device under
`accelerate launch`; `vepo_trl.eval.run` shards the examples and gathers the completions.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

import torch

from ..families import banned_token_ids
from .stats import stable_seed


logger = logging.getLogger(__name__)

__all__ = ["TransformersGenerator", "VLLMGenerator", "load_model_and_processor", "resolve_adapter", "vllm_available"]


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def resolve_adapter(model: str, adapter: str | None, base_model: str | None) -> tuple[str, str | None]:
    """`(base model, adapter or None)`. A `--model` folder holding a PEFT adapter is the adapter; its base is
    `--base_model` or the adapter config's `base_model_name_or_path`."""
    config = Path(model) / "adapter_config.json"
    if adapter is None and config.is_file():
        adapter = model
        model = base_model or json.loads(config.read_text()).get("base_model_name_or_path")
        if not model:
            raise ValueError(f"{config} names no base model; pass --base_model.")
    elif base_model is not None:
        model = base_model if adapter is not None else model
    return model, adapter


def load_model_and_processor(model_id: str, adapter: str | None = None, *, dtype: str = "auto", device=None):
    """The model (with the LoRA adapter merged in) and its processor (the adapter folder's, when it has one)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForImageTextToText.from_pretrained(model_id, dtype=dtype)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    model = model.to(device).eval()
    processor_source = adapter if adapter and (Path(adapter) / "preprocessor_config.json").is_file() else model_id
    if adapter and (Path(adapter) / "processor_config.json").is_file():
        processor_source = adapter
    processor = AutoProcessor.from_pretrained(processor_source)
    return model, processor


class TransformersGenerator:
    """Batched `model.generate` with left padding: greedy, or sampled at `temperature` / `top_p`."""

    name = "transformers"

    def __init__(self, model, processor, *, max_new_tokens: int = 2048, batch_size: int = 8, temperature: float = 0.0,
                 top_p: float = 1.0):  # fmt: skip
        self.model, self.processor = model, processor
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size
        self.temperature, self.top_p = temperature, top_p
        self.processor.tokenizer.padding_side = "left"

    def _decoding(self) -> dict:
        if self.temperature > 0:
            return {"do_sample": True, "temperature": self.temperature, "top_p": self.top_p, "top_k": None}
        return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}

    @torch.no_grad()
    def generate(self, texts: list[str], images: list[list], seeds: list[int] | None = None) -> list[str]:
        completions: list[str] = []
        for start in range(0, len(texts), self.batch_size):
            batch_texts = texts[start : start + self.batch_size]
            batch_images = images[start : start + self.batch_size]
            batch_seeds = None if seeds is None else seeds[start : start + self.batch_size]
            kwargs = {"images": [list(i) for i in batch_images]} if any(batch_images) else {}
            if kwargs and not all(batch_images):
                # The processor takes one image list per prompt; text-only prompts in a mixed batch go alone
                completions += [c for k, (t, i) in enumerate(zip(batch_texts, batch_images))
                                for c in self.generate([t], [i], None if batch_seeds is None else [batch_seeds[k]])]  # fmt: skip
                continue
            if batch_seeds is not None and self.temperature > 0:
                torch.manual_seed(stable_seed(*batch_seeds))  # one seed from the batch's
            inputs = self.processor(text=batch_texts, padding=True, return_tensors="pt", **kwargs).to(
                self.model.device
            )
            output = self.model.generate(
                **inputs,
                max_new_tokens=self.max_new_tokens,
                **self._decoding(),
                suppress_tokens=banned_token_ids(self.model.config, self.processor) or None,
            )
            completions += self.processor.batch_decode(
                output[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True
            )
        return completions


class VLLMGenerator:
    """vLLM offline inference, greedy or sampled, tensor parallel over `tensor_parallel_size` GPUs
    (`vepo_trl.eval.run` picks the most visible GPUs that divide the attention heads); a LoRA adapter is served as
    such."""

    name = "vllm"

    def __init__(self, model_id: str, adapter: str | None, *, max_new_tokens: int = 2048, max_images: int = 4,
                 dtype: str = "auto", max_model_len: int | None = None,
                 tensor_parallel_size: int = 1, gpu_memory_utilization: float | None = None,
                 temperature: float = 0.0, top_p: float = 1.0):  # fmt: skip
        from transformers import AutoConfig, AutoProcessor
        from vllm import LLM, SamplingParams

        from ..trl_compat.media_tokens import merge_generation_kwargs

        kwargs = {"max_model_len": max_model_len} if max_model_len else {}
        if gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if adapter is not None:
            from peft import PeftConfig

            kwargs.update(enable_lora=True, max_lora_rank=max(PeftConfig.from_pretrained(adapter).r, 8))
        try:
            self.llm = LLM(
                model=model_id,
                tensor_parallel_size=tensor_parallel_size,
                # No video: vLLM <= 0.31 otherwise profiles a dummy one through a video-capable processor at start-up,
                # which transformers >= 5.18 refuses (see vllm_prompts.images_only_engine)
                limit_mm_per_prompt={"image": max_images, "video": 0},
                dtype=dtype,
                seed=0,
                **kwargs,
            )
        except Exception as error:
            # vLLM refuses to start when its memory share is more than is free (other processes hold memory)
            if "memory utilization" not in str(error):
                raise
            from ..errors import UsageError, one_line

            share = gpu_memory_utilization if gpu_memory_utilization is not None else "vLLM's default"
            raise UsageError(
                f"vLLM could not start: {one_line(str(error))[:300]} (--gpu_memory_utilization is {share}: give a "
                "lower share, or free the memory other processes hold)"
            ) from None
        self.lora = None
        if adapter is not None:
            from vllm.lora.request import LoRARequest

            self.lora = LoRARequest("adapter", 1, adapter)
        self.processor = AutoProcessor.from_pretrained(adapter if adapter and _has_processor(adapter) else model_id)
        # The model's media tokens banned, as the transformers backend suppresses them (vLLM ignores the
        # checkpoint's suppress_tokens): a sampled placeholder would otherwise end a greedy answer in garbage
        banned = banned_token_ids(AutoConfig.from_pretrained(model_id), self.processor)
        sampling = {"temperature": temperature, "top_p": top_p} if temperature > 0 else {"temperature": 0.0}
        self.params = SamplingParams(
            max_tokens=max_new_tokens, **sampling, **merge_generation_kwargs(None, banned, "vllm")
        )

    def generate(self, texts: list[str], images: list[list], seeds: list[int] | None = None) -> list[str]:
        params = self.params
        if seeds is not None and params.temperature > 0:
            params = []
            for seed in seeds:  # each request its own seed
                params.append(self.params.clone())
                params[-1].seed = seed
        inputs = [
            {"prompt": text, "multi_modal_data": {"image": list(imgs)}} if imgs else {"prompt": text}
            for text, imgs in zip(texts, images)
        ]
        outputs = self.llm.generate(inputs, params, lora_request=self.lora, use_tqdm=False)
        return [output.outputs[0].text for output in outputs]


def _has_processor(path: str) -> bool:
    return any((Path(path) / name).is_file() for name in ("processor_config.json", "preprocessor_config.json"))
