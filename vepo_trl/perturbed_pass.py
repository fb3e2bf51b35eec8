"""The perturbed-image pass: one no-grad forward with noisy `pixel_values`, and the per-token signals it gives.

`PerturbedPass.signals_for_rows` takes the clean completion hidden states of some responses, runs their perturbed
forward in chunks and returns the signals of `scoring.token_signals` (JSD, entropies, log-probs) for their valid
tokens. Every process runs the same number of chunks, whatever its share of images: a process with nothing to score
runs a one-image dummy forward and a signal pass over no token, so the parameter gathers of ZeRO-3 / FSDP (language
model, vision tower, LM head) line up across processes.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from accelerate.utils import is_peft_model

from .batch import MODEL_INPUT_KEYS, Batch, take_rows
from .families import pixel_layout
from .model_hooks import capture_final_hidden, completion_hidden, scoring_mode
from .perturb import ImageLayout, PixelLayout, perturb_pixel_values
from .prompt_cache import (
    cache_blocker,
    completions_hold_images,
    prompt_groups,
    shared_prompt_hidden,
)
from .scoring import TokenSignals, scatter_to_rows, token_signals
from .sharding import dummy_image, full_lm_head, weights_are_sharded
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
        # Completions, and token positions, run through the perturbed forward so far (benchmarks and tests read them)
        self.num_completions = 0
        self.num_positions = 0
        # Rows that share a prompt read it once. Not where weights are sharded (ZeRO-3, FSDP): a process's number of
        # forwards would then follow its prompts, and every forward gathers parameters with the other processes. Not
        # where the model's continuation from a cache is not its whole forward (`prompt_cache.cache_blocker`)
        config = getattr(self.base_model(host.model), "config", None)
        self.share_prompts = not weights_are_sharded(host) and (config is None or cache_blocker(config) is None)
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

    def dummy_forward(self, model) -> None:
        """A one-image, few-token forward for a process with nothing to score: it enters the same collectives (ZeRO-3 /
        FSDP parameter gathers of the language model AND the vision tower) as a real one. Built once, kept on the
        device."""
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
        with scoring_mode(model), self.host.accelerator.autocast():
            model(**self._dummy_inputs, logits_to_keep=1, use_cache=False)

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
        )

    @torch.no_grad()
    def perturbed_hidden(self, model, input_ids, attention_mask, length, multimodal, max_rows=None) -> torch.Tensor:
        """Completion hidden states `(n, T, d)` of rows `(n, P + T)` (image inputs `multimodal`, `take_rows` layout)
        under the no-grad forward (dropout off) with their images perturbed, at most `max_rows` rows (all by default)
        per forward. The head runs on one position only: the signals need hidden states, not logits.

        Rows that share a prompt and its images (`prompt_cache.prompt_groups`) share its perturbed image too (seeded by
        content): with `share_prompts`, where some prompt has two rows here and no completion holds an image, each
        prompt's images are perturbed once and it is read once (`prompt_cache.shared_prompt_hidden`); otherwise every
        row's images are perturbed and its whole sequence runs."""
        rows = input_ids.size(0)
        max_rows = max_rows or rows
        if (
            self.share_prompts
            and length > 0
            and not completions_hold_images(input_ids, length, multimodal, self.image_token_ids)
        ):
            groups = prompt_groups(input_ids, attention_mask, length, multimodal)
            if len(groups) < rows:
                leaders = take_rows(multimodal, torch.tensor([group[0] for group in groups], device=input_ids.device))
                leaders["pixel_values"] = self.perturb(leaders)
                with scoring_mode(model), self.host.accelerator.autocast():
                    hidden, positions = shared_prompt_hidden(
                        model, self.base_model(model), lambda: self.capture(model), input_ids, attention_mask,
                        length, multimodal, groups, leaders, max_rows,
                    )  # fmt: skip
                self.num_positions += positions
                if hidden is not None:
                    return hidden
                logger.warning(
                    "The model returned no cache from its prompt forward: the perturbed pass runs every completion's "
                    "whole sequence from now on."
                )
                self.share_prompts = False
        pieces = []
        for start in range(0, rows, max_rows):
            part = torch.arange(start, min(start + max_rows, rows), device=input_ids.device)
            part_inputs = take_rows(multimodal, part)  # every row in order: the tensors themselves
            model_inputs = {key: part_inputs[key] for key in MODEL_INPUT_KEYS if part_inputs.get(key) is not None}
            model_inputs["pixel_values"] = self.perturb(part_inputs)
            with self.capture(model) as captured, scoring_mode(model), self.host.accelerator.autocast():
                model(
                    input_ids=input_ids[part],
                    attention_mask=attention_mask[part],
                    **model_inputs,
                    logits_to_keep=1,
                    use_cache=False,
                )
            pieces.append(completion_hidden(captured, length))
            self.num_positions += input_ids[part].numel()
        return torch.cat(pieces)

    # -- signals -------------------------------------------------------------------------------------------------

    @torch.no_grad()
    def score_rows(
        self, inputs, index: torch.Tensor, clean_tokens: torch.Tensor, wanted: set[str], max_rows: int | None = None
    ) -> TokenSignals:
        """Signals of the responses `index` `(n,)` of a batch, over their valid completion tokens (flattened, row by
        row, `(N,)` each), from their clean hidden states `clean_tokens` `(N, d)` and their perturbed pass (at most
        `max_rows` rows per forward). With no row, a dummy forward and a signal pass over no token keep the collectives
        aligned."""
        host, model = self.host, self.host.model
        inputs = Batch.of(inputs)
        input_ids, attention_mask = inputs.sequence
        length = inputs.completion_length
        valid = inputs.valid
        if index.numel() == 0:
            self.dummy_forward(model)
            perturbed = clean_tokens.new_zeros(0, self.text_config().hidden_size)
            targets = input_ids.new_zeros(0)
        else:
            row_inputs = inputs.take(index)
            ids, mask = input_ids[index], attention_mask[index]
            perturbed = self.perturbed_hidden(model, ids, mask, length, row_inputs, max_rows)[valid[index]]
            targets = inputs["completion_ids"][index][valid[index]]
            self.num_completions += int(index.numel())
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

    def chunks(self, inputs: dict[str, Any], index: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
        """The responses `index` `(n,)` in consecutive chunks of `batch_size`. With prompts shared, a chunk takes the
        rest of a prompt's responses beyond `batch_size` (its forwards still run at most `batch_size` rows each), so
        a prompt's consecutive completions meet in one chunk and its prompt is read once."""
        rows = index.tolist()
        if not (self.share_prompts and rows):
            return [index[start : start + batch_size] for start in range(0, len(rows), batch_size)]
        inputs = Batch.of(inputs)
        input_ids, attention_mask = inputs.sequence
        length = inputs.completion_length
        group_of = {row: number for number, group in enumerate(
            prompt_groups(input_ids, attention_mask, length, inputs)) for row in group}  # fmt: skip
        chunks: list[list[int]] = []
        for row in rows:
            current = chunks[-1] if chunks else None
            if current is None or (len(current) >= batch_size and group_of[row] != group_of[current[-1]]):
                chunks.append([row])
            else:
                current.append(row)
        return [torch.tensor(chunk, dtype=index.dtype, device=index.device) for chunk in chunks]

    def signals_for_rows(
        self, inputs: dict[str, Any], signals: TokenSignals, rows: torch.Tensor, clean_of_row, batch_size: int, wanted
    ) -> TokenSignals:
        """Score the responses `rows` `(B,)` in chunks (`chunks`: of `batch_size` rows, a prompt's consecutive rows
        kept together when prompts are shared), `clean_of_row(i)` giving response i's clean token states
        `(n_valid, d)`; every process runs as many chunks as the process with the most. Writes the signals into
        `signals` (`(B, T)` fields) for those responses."""
        inputs = Batch.of(inputs)  # each chunk reads the same sequence, masks and image pieces: made once
        index = rows.nonzero().squeeze(-1)
        chunked = self.chunks(inputs, index, batch_size)
        # The same number of scoring passes on every process, whatever each one's share of images and advantages
        count = int(self.host.accelerator.gather(torch.tensor([max(1, len(chunked))], device=rows.device)).max())
        chunked += [index[:0]] * (count - len(chunked))
        valid = inputs.valid
        token_rows = torch.zeros_like(valid)
        token_rows[index] = valid[index]
        pieces: list[TokenSignals] = []
        hidden_size = self.text_config().hidden_size
        for chunk_index in chunked:
            clean = [clean_of_row(int(i)) for i in chunk_index]
            clean = torch.cat(clean) if clean else torch.zeros(0, hidden_size, device=rows.device)
            pieces.append(self.score_rows(inputs, chunk_index, clean.to(rows.device), wanted, batch_size))
        for name in pieces[0].computed():
            values = scatter_to_rows(torch.cat([getattr(piece, name) for piece in pieces]), token_rows)
            current = getattr(signals, name)
            # The other responses keep what the forward gave (their entropy ranks them); the scored ones' clean entropy
            # is recomputed on the same fp32 path as the perturbed one, so their gap carries no fused-head difference
            setattr(signals, name, values if current is None else torch.where(token_rows, values, current))
        return signals
