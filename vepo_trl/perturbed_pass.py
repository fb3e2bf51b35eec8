"""The perturbed-image pass: one no-grad forward with noisy `pixel_values`, and the per-token signals it gives.

`PerturbedPass.signals_for_rows` takes the clean completion hidden states of some responses, runs their perturbed
forward in chunks and returns the signals of `scoring.token_signals` (JSD, entropies, log-probs) for their valid
tokens. Every process runs the same number of chunks, whatever its share of images: a process with nothing to score
runs a one-image dummy forward and a signal pass over no token, so the parameter gathers of ZeRO-3 / FSDP (language
model, vision tower, LM head) line up across processes.
"""

from __future__ import annotations

import collections
import logging
from typing import Any

import torch
from accelerate.utils import is_peft_model

from .batch import MODEL_INPUT_KEYS, ROW_KEYS, Batch, take_rows
from .families import pixel_layout
from .model_hooks import capture_final_hidden, completion_hidden, scoring_mode
from .perturb import ImageLayout, PixelLayout, perturb_pixel_values
from .prompt_cache import (
    chunk_rows,
    continuation_forwards,
    memory_widths,
    prompt_groups,
    returned_cache,
    row_groups,
    shareable,
    shared_prompt_hidden,
)
from .scoring import TokenSignals, scatter_to_rows, token_signals
from .sharding import dummy_image, full_lm_head
from .utils import media_token_ids


logger = logging.getLogger(__name__)


class PerturbedPass:
    """The perturbed forward and the signals, for a trainer `host` (a `VEPOTrainer`): it reads the host's current
    `model` (wrapped by accelerate after `train()` starts), `accelerator`, `args`, `processing_class`, `state`,
    `temperature`, `num_generations` and `current_noise_step()`."""

    def __init__(self, host, strategy: str | None):
        """`strategy`: the selection strategy, where it perturbs the model's images (None: no perturbed pass). A
        model whose images or LM head the pass cannot read is refused here, at start-up, in one line."""
        from transformers import ProcessorMixin

        self.host = host
        self.pixel_layout: PixelLayout | ImageLayout | None = None
        processor = host.processing_class
        if strategy is not None:
            if not isinstance(processor, ProcessorMixin) or not hasattr(processor, "image_processor"):
                raise ValueError(
                    f"selection_strategy={strategy!r} compares the model with a clean and a perturbed image, but the "
                    f"processing class ({type(processor).__name__}) has no image processor: the model looks "
                    "text-only. Use a vision-language model and its processor, or selection_strategy='entropy' / "
                    "'full'."
                )
            self.pixel_layout = pixel_layout(host.model, processor.image_processor, strategy)
        self._base_models: dict[int, torch.nn.Module] = {}
        self._dummy_inputs: dict[str, torch.Tensor] | None = None
        self._widths: tuple[int, int] | None = None
        # Completions, and token positions, run through the perturbed forward so far (benchmarks and tests read them)
        self.num_completions = 0
        self.num_positions = 0
        # Model forwards per scoring chunk, dummies included (equal on every process: tests compare them)
        self.chunk_forwards: collections.deque[int] = collections.deque(maxlen=10_000)
        self.num_forwards = 0
        # Rows that share a prompt read it once, on one process or many, weights sharded or not (off for good where the
        # model returns no cache)
        self.share_prompts = True
        config = getattr(self.base_model(host.model), "config", None)
        # A completion holding these (a tool's image) keeps the whole-sequence pass
        self.image_token_ids = media_token_ids(config) if config is not None else []
        # The signals read the LM head's weight directly: not through a PEFT adapter's wrapper
        head = self.lm_head(host.model)
        if is_peft_model(host.model) and not isinstance(head, torch.nn.Linear):
            raise ValueError(
                "VEPO reads the LM head's weight to compute JSD between the clean and perturbed distributions, but "
                f"the head is wrapped by a PEFT adapter ({type(head).__name__}). Remove `lm_head` from the adapter's "
                "target_modules."
            )

    # -- model parts ---------------------------------------------------------------------------------------------

    def base_model(self, model) -> torch.nn.Module:
        """The transformers model under the accelerate / DeepSpeed / FSDP / PEFT wrappers."""
        # Unwrapping walks the wrappers, milliseconds a call; the wrapped object is fixed
        if id(model) not in self._base_models:
            unwrapped = self.host.accelerator.unwrap_model(model)
            self._base_models[id(model)] = unwrapped.get_base_model() if is_peft_model(unwrapped) else unwrapped
        return self._base_models[id(model)]

    def lm_head(self, model) -> torch.nn.Module:
        return self.base_model(model).get_output_embeddings()

    def capture(self, model, enabled: bool = True):
        """`model_hooks.capture_final_hidden` on the model's backbone (the module TRL's fused LM head reads)."""
        return capture_final_hidden(self.base_model(model).base_model, enabled)

    def text_config(self):
        return self.base_model(self.host.model).config.get_text_config()

    def tile_size(self, device: torch.device) -> int:
        """Tokens per tile of the signal pass: the config's, else 64 on a CPU, else the largest power of two in
        [64, 1024] whose five `(tile, V)` fp32 tensors take at most a tenth of the free accelerator memory."""
        if self.host.args.scoring_tile_size is not None:
            return self.host.args.scoring_tile_size
        if device.type != "cuda":
            return 64
        free, _ = torch.cuda.mem_get_info(device)
        vocab = self.text_config().vocab_size  # from the config: a ZeRO-3 partitioned head reports shape (0,)
        tile = 64
        while tile < 1024 and 5 * (2 * tile) * vocab * 4 <= free / 10:
            tile *= 2
        return tile

    # -- forwards ------------------------------------------------------------------------------------------------

    def forward(self, model, **inputs):
        """`model(**inputs)`, counted."""
        self.num_forwards += 1
        return model(**inputs)

    def dummy_inputs(self) -> dict[str, torch.Tensor]:
        """A one-image, few-token prompt, built once and kept on the device."""
        if self._dummy_inputs is None:
            processor = self.host.processing_class
            messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "."}]}]
            text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            encoded = processor(images=[dummy_image()], text=[text], return_tensors="pt")
            device = self.host.accelerator.device
            # A prefix LM's processor adds prompt-only `labels`: the dummy needs no loss
            self._dummy_inputs = {
                k: v.to(device) for k, v in encoded.items() if isinstance(v, torch.Tensor) and k != "labels"
            }
        return self._dummy_inputs

    def dummy_forward(self, model, use_cache: bool = False):
        """A one-image, few-token forward for a process with nothing to score: it enters the same collectives (ZeRO-3 /
        FSDP parameter gathers of the language model AND the vision tower) as a real one."""
        with scoring_mode(model), self.host.accelerator.autocast():
            return self.forward(model, **self.dummy_inputs(), logits_to_keep=1, use_cache=use_cache)

    def dummy_text_forward(self, model) -> None:
        """A one-token text forward (the dummy prompt's last token, no image): the collectives of a continuation
        forward, which runs the language model without the vision tower."""
        inputs = self.dummy_inputs()
        text = {key: inputs[key][:, -1:] for key in ("input_ids", "attention_mask", *ROW_KEYS) if key in inputs}
        with scoring_mode(model), self.host.accelerator.autocast():
            self.forward(model, **text, logits_to_keep=1, use_cache=False)

    def perturb(self, row_inputs: dict[str, Any]) -> torch.Tensor:
        """The perturbed `pixel_values` of some rows' image inputs (`take_rows` layout), seeded per image."""
        host, args = self.host, self.host.args
        return perturb_pixel_values(
            args.perturbation,
            row_inputs["pixel_values"],
            row_inputs.get("image_grid_thw"),
            self.pixel_layout,
            seed=args.perturbation_seed,
            step=host.state.global_step,
            image_sizes=row_inputs.get("image_sizes"),
            tile_groups=row_inputs.get("num_tiles"),
            pixel_attention_mask=row_inputs.get("pixel_attention_mask"),
            image_position_ids=row_inputs.get("image_position_ids"),
            noise_step=host.current_noise_step(),
            sigma=args.noise_sigma,
            patch_probability=args.patch_probability,
            num_generations=host.num_generations,
            **(args.perturbation_params or {}),
        )

    def widths(self) -> tuple[int, int]:
        """`prompt_cache.memory_widths` of the model, read once."""
        if self._widths is None:
            self._widths = memory_widths(
                self.base_model(self.host.model).get_decoder(), self.text_config().hidden_size
            )
        return self._widths

    @torch.no_grad()
    def perturbed_hidden(self, model, input_ids, attention_mask, length, multimodal, slices=None) -> torch.Tensor:
        """Completion hidden states `(n, T, d)` of rows `(n, P + T)` (image inputs `multimodal`, `take_rows` layout)
        under the no-grad forward (dropout off) with their images perturbed. The head runs on one position only: the
        signals need hidden states, not logits.

        With `slices` (an int), each distinct prompt (`prompt_cache.prompt_groups`: rows with one prompt and the same
        images share its perturbed image, seeded by content) is perturbed once and read once, in one prefill and
        `slices` continuation forwards (`prompt_cache.shared_prompt_hidden`); the caller has checked the rows
        (`prompt_cache.shareable`). Without, every row's images are perturbed and the rows' whole sequences run in one
        forward. A model that keeps no cache runs whole sequences from then on (one forward)."""
        if slices is not None and self.share_prompts and length > 0:
            groups = prompt_groups(input_ids, attention_mask, length, multimodal)
            leaders = take_rows(multimodal, torch.tensor([group[0] for group in groups], device=input_ids.device))
            leaders["pixel_values"] = self.perturb(leaders)
            with scoring_mode(model), self.host.accelerator.autocast():
                hidden = shared_prompt_hidden(
                    lambda **inputs: self.forward(model, **inputs), self.base_model(model),
                    lambda: self.capture(model), input_ids, attention_mask, length, multimodal, groups, leaders,
                    slices, lambda: self.dummy_text_forward(model),
                )  # fmt: skip
            if hidden is not None:
                self.num_positions += len(groups) * (input_ids.size(1) - length) + input_ids.size(0) * length
                return hidden
            logger.warning(
                "The model returned no cache from its prompt forward: the perturbed pass runs every completion's "
                "whole sequence from now on."
            )
            self.share_prompts = False
        rows = torch.arange(input_ids.size(0), device=input_ids.device)
        row_inputs = take_rows(multimodal, rows)  # every row in order: the tensors themselves
        model_inputs = {key: row_inputs[key] for key in MODEL_INPUT_KEYS if row_inputs.get(key) is not None}
        model_inputs["pixel_values"] = self.perturb(row_inputs)
        with self.capture(model) as captured, scoring_mode(model), self.host.accelerator.autocast():
            self.forward(model, input_ids=input_ids, attention_mask=attention_mask, **model_inputs, logits_to_keep=1,
                         use_cache=False)  # fmt: skip
        self.num_positions += input_ids.numel()
        return completion_hidden(captured, length)

    # -- signals -------------------------------------------------------------------------------------------------

    @torch.no_grad()
    def score_rows(
        self, inputs, index: torch.Tensor, clean_tokens: torch.Tensor, wanted: set[str], slices: int | None = None
    ) -> TokenSignals:
        """Signals of the responses `index` `(n,)` of a batch, over their valid completion tokens (flattened, row by
        row, `(N,)` each), from their clean hidden states `clean_tokens` `(N, d)` and their perturbed pass
        (`perturbed_hidden`: prompts read once in `1 + slices` forwards, or whole sequences in one). With no row, the
        same number of dummy forwards and a signal pass over no token keep the collectives aligned."""
        host, model = self.host, self.host.model
        inputs = Batch.of(inputs)
        input_ids, attention_mask = inputs.sequence
        length = inputs.completion_length
        valid = inputs.valid
        before = self.num_forwards
        if index.numel() == 0:
            shared = slices is not None and self.share_prompts
            # The dummy prefill keeps a cache too: a model that returns none switches every process to whole sequences
            out = self.dummy_forward(model, use_cache=shared)
            if shared and returned_cache(out) is None:
                self.share_prompts = shared = False
                self.dummy_forward(model)
            for _ in range(slices if shared else 0):
                self.dummy_text_forward(model)
            perturbed = clean_tokens.new_zeros(0, self.text_config().hidden_size)
            targets = input_ids.new_zeros(0)
        else:
            row_inputs = inputs.take(index)
            ids, mask = input_ids[index], attention_mask[index]
            perturbed = self.perturbed_hidden(model, ids, mask, length, row_inputs, slices)[valid[index]]
            targets = inputs["completion_ids"][index][valid[index]]
            self.num_completions += int(index.numel())
        self.chunk_forwards.append(self.num_forwards - before)
        head = self.lm_head(model)
        text_config = self.text_config()
        logit_scale = getattr(text_config, "logit_scale", None)
        # FSDP1 keeps the head as a flat shard outside a forward: gather its unit (every process, rows or not)
        with full_lm_head(model, head):
            return token_signals(
                clean_tokens.to(perturbed.device, perturbed.dtype),
                perturbed,
                head.weight,
                head.bias,
                targets=targets,
                signals=wanted,
                temperature=host.temperature,
                logit_scale=1.0 if logit_scale is None else float(logit_scale),
                final_logit_softcapping=getattr(text_config, "final_logit_softcapping", None),
                tile_size=self.tile_size(input_ids.device),
            )

    def chunks(self, inputs, index: torch.Tensor, batch_size: int, group_of=None) -> list[torch.Tensor]:
        """The responses `index` `(n,)` in chunks of `batch_size` (`prompt_cache.chunk_rows`: with prompts shared, a
        prompt's consecutive completions meet in one chunk)."""
        if self.share_prompts and index.numel():
            group_of = group_of or row_groups(Batch.of(inputs))
        chunks = chunk_rows(index.tolist(), batch_size, group_of if self.share_prompts else None)
        return [torch.tensor(chunk, dtype=index.dtype, device=index.device) for chunk in chunks]

    def shared_plan(self, inputs, index: torch.Tensor, batch_size: int) -> tuple[list[torch.Tensor], int | None]:
        """This process's chunks with prompts read once (`chunks`) and the most continuation forwards any of them
        needs (`prompt_cache.continuation_forwards`); None for the forwards where its rows cannot continue from a
        cache (`shareable`), a chunk does not fit the memory of `batch_size` whole rows, or the model does not share."""
        if not self.share_prompts or index.numel() == 0:
            return [], None if not self.share_prompts else 0
        input_ids, attention_mask = inputs.sequence
        length = inputs.completion_length
        per_token = {key: inputs[key][index] for key in ROW_KEYS if inputs.get(key) is not None}
        if length == 0 or not shareable(input_ids[index], attention_mask[index], length, per_token,
                                        self.image_token_ids):  # fmt: skip
            return [], None
        group_of = row_groups(inputs)
        chunked = self.chunks(inputs, index, batch_size, group_of)
        forwards = [continuation_forwards(self.widths(), rows=len(chunk), prompts=len({group_of[int(r)] for r in chunk}),
                                          prompt_length=input_ids.size(1) - length, length=length,
                                          budget_rows=batch_size) for chunk in chunked]  # fmt: skip
        return (chunked, max(forwards)) if None not in forwards else ([], None)

    def signals_for_rows(
        self, inputs: dict[str, Any], signals: TokenSignals, rows: torch.Tensor, clean_of_row, batch_size: int, wanted
    ) -> TokenSignals:
        """Score the responses `rows` `(B,)` in chunks, `clean_of_row(i)` giving response i's clean token states
        `(n_valid, d)`. Writes the signals into `signals` (`(B, T)` fields) for those responses.

        Every process runs as many chunks as the process with the most, and per chunk the same forwards: with prompts
        read once where every process can (`shared_plan`), one prefill and as many continuations as the process that
        needs the most; else one whole-sequence forward of at most `batch_size` rows. A process with no rows runs
        dummies, so the parameter gathers of ZeRO-3 / FSDP line up. One gather of four counts per call decides it."""
        inputs = Batch.of(inputs)  # each chunk reads the same sequence, masks and image pieces: made once
        index = rows.nonzero().squeeze(-1)
        whole = [index[start : start + batch_size] for start in range(0, index.numel(), batch_size)]
        shared, slices = self.shared_plan(inputs, index, batch_size)
        mine = [len(whole), len(shared), slices or 0, int(slices is None)]
        counts = self.host.accelerator.gather(torch.tensor([mine], device=rows.device)).view(-1, 4).max(0).values
        if int(counts[3]):
            chunked, count, slices = whole, int(counts[0]), None
        else:
            chunked, count, slices = shared, int(counts[1]), int(counts[2])
        chunked += [index[:0]] * (max(1, count) - len(chunked))
        valid = inputs.valid
        token_rows = torch.zeros_like(valid)
        token_rows[index] = valid[index]
        pieces: list[TokenSignals] = []
        hidden_size = self.text_config().hidden_size
        for chunk_index in chunked:
            clean = [clean_of_row(int(i)) for i in chunk_index]
            clean = torch.cat(clean) if clean else torch.zeros(0, hidden_size, device=rows.device)
            pieces.append(self.score_rows(inputs, chunk_index, clean.to(rows.device), wanted, slices))
        for name in pieces[0].computed():
            values = scatter_to_rows(torch.cat([getattr(piece, name) for piece in pieces]), token_rows)
            current = getattr(signals, name)
            # The other responses keep what the forward gave (their entropy ranks them); the scored ones' clean entropy
            # is recomputed on the same fp32 path as the perturbed one, so their gap carries no fused-head difference
            setattr(signals, name, values if current is None else torch.where(token_rows, values, current))
        return signals
