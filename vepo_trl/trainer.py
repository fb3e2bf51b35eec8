"""`VEPOTrainer`: GRPO whose policy gradient trains only on each response's visual forking tokens.

Data flow per generation batch. The mask is made once, with the weights that sampled the batch (the rollout policy):

- When TRL runs its no-grad forward at rollout time (`old_per_token_logps`: `steps_per_generation` larger than the
  gradient accumulation, `num_iterations > 1` with misaligned steps, or vLLM's importance-sampling correction), the
  clean hidden states and entropies come from that very forward, chunk by chunk, and each chunk's perturbed-image
  forward runs right after it. The mask is stored in the batch before TRL shuffles and splits it.
- Otherwise every slice of the batch is first used before any optimiser step, so the loss forward (which GRPO runs
  anyway) gives the clean distribution and one perturbed forward runs at that first use. Responses whose advantage is
  exactly zero are skipped there when their mask cannot change the loss (see `_mask_can_matter`).

Both scoring passes run with dropout off. `scoring.token_signals` / `scoring.select_tokens` turn the two forwards into
a per-response mask; `scoring.policy_token_weights` turns the mask into weights on the policy-gradient term only, so
that every TRL `loss_type` divides by the selected count (L_VEPO), while the KL term, the logged `entropy` / `kl` and
(by default) the entropy bonus keep all valid tokens. Every process enters every collective whatever its batch holds:
a process with nothing to score runs a one-image dummy forward and an empty signal pass.
"""

from __future__ import annotations

import inspect
import os
import textwrap
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate.utils import gather_object, is_peft_model
from transformers import ProcessorMixin
from trl import GRPOTrainer
from trl.trainer.utils import get_config_model_id

from .config import VEPOConfig
from .local_models import resolve_model_name
from .model_card import build_model_card
from .perturb import PixelLayout, annealed_noise_step, get_perturbation, perturb_pixel_values
from .scoring import (
    CONSTANT_NORMALISED_LOSSES,
    TOKEN_COUNT_NORMALISED_LOSSES,
    TokenSignals,
    get_strategy,
    minmax_normalize,
    policy_token_weights,
    row_seeds,
    scatter_to_rows,
    select_tokens,
    selection_miss_counts,
    token_signals,
    vepo_score,
)


# Key under which a batch's token-selection mask lives in TRL's buffered generation batch
SELECTION_KEY = "vepo_selection_mask"
# valid / selected token count of the generation batch, for loss types normalised by it (0-d, survives TRL's split)
COUNT_SCALE_KEY = "vepo_count_scale"
# Multimodal inputs GRPO forwards to the model (names of `GRPOTrainer._get_per_token_logps_and_entropies`' kwargs)
_MULTIMODAL_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)
# Of those, the ones that are model inputs (the others tell GRPO how to split a batch)
_MODEL_INPUT_KEYS = tuple(key for key in _MULTIMODAL_KEYS if key not in ("num_images", "num_tiles"))
# Per-row token-type inputs, sliced with the rows
_ROW_KEYS = ("token_type_ids", "mm_token_type_ids")


@dataclass
class _RolloutScoring:
    """What the scoring takes from TRL's rollout-time forward (`old_per_token_logps`)."""

    done: bool = False
    signals: list[TokenSignals] = field(default_factory=list)  # per chunk: clean entropy / log-prob, `(b, T)` each
    # Per image row with a valid token: its completion tokens' clean hidden states `(n_valid, d)`, kept on the CPU
    # until the advantages exist (then zero-advantage rows can skip their perturbed forward)
    clean: dict[int, torch.Tensor] = field(default_factory=dict)
    batch_size: int = 1


def _take_rows(inputs: dict[str, Any], rows: torch.Tensor) -> dict[str, Any]:
    """Qwen2-VL-style multimodal inputs (`pixel_values` rows per image grid, `image_grid_thw`, `num_images`, per-row
    token types) restricted to `rows` `(n,)` (indices into the batch), in that order."""
    out: dict[str, Any] = {}
    rows_list = rows.tolist()
    num_images = inputs.get("num_images")
    pixel_values, grid = inputs.get("pixel_values"), inputs.get("image_grid_thw")
    if num_images is not None:
        out["num_images"] = [num_images[r] for r in rows_list]
    if pixel_values is not None and grid is not None and num_images is not None:
        image_start = [0]
        for n in num_images:
            image_start.append(image_start[-1] + n)
        pixel_start = [0]
        for n in grid.prod(-1).tolist():
            pixel_start.append(pixel_start[-1] + n)
        images = [i for r in rows_list for i in range(image_start[r], image_start[r + 1])]
        # Rows without an image take no pixel inputs at all, as in a text-only batch
        out["pixel_values"] = out["image_grid_thw"] = None
        if images:
            out["pixel_values"] = torch.cat([pixel_values[pixel_start[i] : pixel_start[i + 1]] for i in images])
            out["image_grid_thw"] = grid[torch.tensor(images, dtype=torch.long, device=grid.device)]
    for key in _ROW_KEYS:
        if inputs.get(key) is not None:
            out[key] = inputs[key][rows.to(inputs[key].device)]
    return out


def _has_active_dropout(model: torch.nn.Module) -> bool:
    """Whether a forward in training mode is random: any dropout module with p > 0 (LoRA's `lora_dropout` included) or
    an attention dropout in the config."""
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0:
            return True
    config = getattr(model, "config", None)
    text_config = config.get_text_config() if config is not None and hasattr(config, "get_text_config") else config
    return any(float(getattr(c, "attention_dropout", 0.0) or 0.0) > 0 for c in (config, text_config) if c is not None)


@contextmanager
def _eval_mode(model: torch.nn.Module):
    """Dropout off (and every other train-only randomness) for a scoring forward; each module's flag is restored."""
    flags = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in flags:
            module.training = training


class VEPOTrainer(GRPOTrainer):
    """GRPO with VEPO's vision-entropy token selection ([`VEPOConfig`] holds the VEPO settings).

    Drop-in for [`~trl.GRPOTrainer`]: same arguments, same data format (conversational prompts with an `image` or
    `images` column), same generation back ends (transformers or vLLM). The selection changes which tokens the policy
    gradient trains on, nothing else: `selection_strategy="full"` gives exactly GRPO's loss.
    """

    _tag_names = ["trl", "grpo", "vepo"]
    _name = "VEPO"
    _paper = {
        "title": "Entropy Is Not Enough: Unlocking Effective Reinforcement Learning for Visual Reasoning via "
        "Vision-Anchored Token Selection",
        "id": None,
        # docstyle-ignore
        "citation": textwrap.dedent("""\
            @misc{jin2026vepo,
                title        = {{Entropy Is Not Enough: Unlocking Effective Reinforcement Learning for Visual Reasoning via Vision-Anchored Token Selection}},
                author       = {Senjie Jin and Peixin Wang and Boyang Liu and Xiaoran Fan and Shuo Li and Zhiheng Xi and Jiazheng Zhang and Yuhao Zhou and Tao Gui and Qi Zhang and Xuanjing Huang},
                year         = 2026,
                url          = {https://github.com/Leonnnnnn929/VEPO},
            }"""),
    }

    def __init__(self, model, reward_funcs, args: VEPOConfig | None = None, *pos_args, **kwargs):
        if args is None:
            model_name = model if isinstance(model, str) else get_config_model_id(model.config)
            args = VEPOConfig(f"{str(model_name).split('/')[-1]}-VEPO")
        if not isinstance(args, VEPOConfig):
            raise TypeError(
                f"VEPOTrainer needs a VEPOConfig (got {type(args).__name__}); build one with the same fields, e.g. "
                "VEPOConfig(**grpo_config.to_dict()), and set the VEPO fields on it."
            )
        train_dataset = kwargs.get("train_dataset", pos_args[0] if pos_args else None)
        if train_dataset is not None and hasattr(train_dataset, "__len__") and len(train_dataset) == 0:
            raise ValueError("train_dataset is empty: VEPOTrainer would train 0 steps. Check the data set's split.")
        if isinstance(model, str):
            model = resolve_model_name(model)  # `tiny-qwen2.5-vl`: the offline tiny model, built and cached once
        # Read by the `top_entropy_quantile` property while GRPOTrainer.__init__ runs
        self._token_weights = None
        super().__init__(model, reward_funcs, args, *pos_args, **kwargs)
        self.selection = get_strategy(args.selection_strategy)
        self._pending_forward = None
        self._rollout: _RolloutScoring | None = None
        self._dummy_inputs = None
        # Completions run through the perturbed forward so far (benchmarks and tests read it)
        self.num_perturbed_completions = 0
        # Completions whose perturbed forward was skipped: zero advantage, mask irrelevant to the loss
        self.num_skipped_completions = 0
        self._pixel_layout = None
        if self.selection.needs_perturbed_pass:
            self._check_vision_support()
            self._pixel_layout = PixelLayout.from_image_processor(self.processing_class.image_processor)
        self._check_lm_head()
        self._dropout = _has_active_dropout(self.model)
        perturbation_params = inspect.signature(get_perturbation(args.perturbation)).parameters
        self._uses_noise_step = "noise_step" in perturbation_params

    # ------------------------------------------------------------------------------------------------------------
    # Set-up checks
    # ------------------------------------------------------------------------------------------------------------

    def _check_vision_support(self) -> None:
        strategy = self.args.selection_strategy
        if not isinstance(self.processing_class, ProcessorMixin) or not hasattr(
            self.processing_class, "image_processor"
        ):
            raise ValueError(
                f"selection_strategy={strategy!r} compares the model with a clean and a perturbed image, but the "
                f"processing class ({type(self.processing_class).__name__}) has no image processor: the model looks "
                "text-only. Use a vision-language model and its processor, or selection_strategy='entropy' / 'full'."
            )
        image_processor = self.processing_class.image_processor
        if not all(hasattr(image_processor, name) for name in ("patch_size", "temporal_patch_size", "merge_size")):
            raise ValueError(
                f"selection_strategy={strategy!r} perturbs Qwen2-VL-style `pixel_values` (14x14 patches with "
                f"`image_grid_thw`), but the image processor is a {type(image_processor).__name__}. Use a Qwen2-VL or "
                "Qwen2.5-VL model, or selection_strategy='entropy' / 'full'."
            )

    def _check_lm_head(self) -> None:
        head = self._lm_head(self.model)
        if is_peft_model(self.model) and not isinstance(head, torch.nn.Linear):
            raise ValueError(
                "VEPO reads the LM head's weight to compute JSD between the clean and perturbed distributions, but "
                f"the head is wrapped by a PEFT adapter ({type(head).__name__}). Remove `lm_head` from the adapter's "
                "target_modules."
            )

    # ------------------------------------------------------------------------------------------------------------
    # Model parts
    # ------------------------------------------------------------------------------------------------------------

    def _base_model(self, model):
        # Unwrapping walks the accelerate / DeepSpeed / FSDP wrappers, milliseconds a call; the wrapped object is fixed
        cache = self.__dict__.setdefault("_base_model_cache", {})
        if id(model) not in cache:
            unwrapped = self.accelerator.unwrap_model(model)
            cache[id(model)] = unwrapped.get_base_model() if is_peft_model(unwrapped) else unwrapped
        return cache[id(model)]

    def _lm_head(self, model) -> torch.nn.Module:
        return self._base_model(model).get_output_embeddings()

    @contextmanager
    def _capture_final_hidden(self, model, enabled: bool = True):
        """Collect the backbone's last hidden states (after the final norm) during the forwards run in this block.

        TRL's fused LM head reads the same tensor from the same module (`base_model`), so the clean distribution comes
        from the very forward the loss (or TRL's rollout-time pass) uses. Detached: the loss graph is untouched.
        """
        captured: list[torch.Tensor] = []
        if not enabled:
            yield captured
            return

        def hook(module, args, output):
            hidden = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]
            captured.append(hidden.detach())

        handle = self._base_model(model).base_model.register_forward_hook(hook)
        try:
            yield captured
        finally:
            handle.remove()

    def _tile_size(self, device: torch.device) -> int:
        if self.args.scoring_tile_size is not None:
            return self.args.scoring_tile_size
        if device.type != "cuda":
            return 64
        # Largest power of two in [64, 1024] whose five (tile, V) fp32 tensors take at most a tenth of free memory
        free, _ = torch.cuda.mem_get_info(device)
        # From the config: a ZeRO-3 partitioned head reports shape (0,)
        vocab = self._base_model(self.model).config.get_text_config().vocab_size
        tile = 64
        while tile < 1024 and 5 * (2 * tile) * vocab * 4 <= free / 10:
            tile *= 2
        return tile

    # ------------------------------------------------------------------------------------------------------------
    # Forward passes
    # ------------------------------------------------------------------------------------------------------------

    @staticmethod
    def _sequence(inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompt and completion as one sequence: `input_ids` and `attention_mask`, `(B, P + T)` each."""
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        return input_ids, torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)

    def _forward(self, model, inputs: dict[str, Any]):
        """GRPO's loss forward, with the arguments `GRPOTrainer._compute_loss` uses: (log-probs, entropies, aux)."""
        return super()._get_per_token_logps_and_entropies(
            model,
            *self._sequence(inputs),
            inputs["completion_ids"].size(1),
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            **{key: inputs.get(key) for key in _MULTIMODAL_KEYS},
        )

    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        # `compute_loss` already ran the loss forward (to select tokens from it); hand that result to GRPO's loss
        # instead of running the forward again
        if self._pending_forward is not None:
            forward, self._pending_forward = self._pending_forward, None
            return forward
        rollout = self._rollout
        # TRL's first no-grad forward of a rollout with the policy is `old_per_token_logps` (a reference forward, with
        # a PEFT policy's adapters off, comes after it): score the batch on it
        if rollout is not None and not rollout.done and model is self.model:
            rollout.done = True
            return self._forward_and_score(model, *args, **kwargs)
        return super()._get_per_token_logps_and_entropies(model, *args, **kwargs)

    def _forward_and_score(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **multimodal,
    ):
        """TRL's rollout-time forward (dropout off), chunk by chunk as TRL runs it, with each chunk's signals computed
        right after it (clean hidden states from this forward, one perturbed forward): one chunk's hidden states at a
        time. Returns what TRL asked for; the signals go to `self._rollout`."""
        if not self.selection.needs_perturbed_pass:
            # Entropy-only strategies read the entropies of TRL's own forward (its slicing knows every VLM layout)
            with self._scoring_mode(model):
                logps, entropies, aux_loss = super()._get_per_token_logps_and_entropies(
                    model,
                    input_ids,
                    attention_mask,
                    logits_to_keep,
                    batch_size,
                    compute_entropy=True,
                    compute_aux_loss=compute_aux_loss,
                    **multimodal,
                )
            self._rollout.signals.append(TokenSignals(entropy=entropies.float(), logp=logps.float()))
            return logps, entropies if compute_entropy else None, aux_loss
        batch_size = batch_size or input_ids.size(0)
        self._rollout.batch_size = batch_size
        has_image = self._rows_with_image(multimodal.get("num_images"), multimodal.get("pixel_values"), input_ids)
        completion_valid = attention_mask[:, -logits_to_keep:].bool()
        logps, entropies, aux_losses = [], [], []
        for start in range(0, input_ids.size(0), batch_size):
            end = min(start + batch_size, input_ids.size(0))
            chunk_inputs = _take_rows(multimodal, torch.arange(start, end, device=input_ids.device))
            chunk_kwargs = {**{key: multimodal.get(key) for key in _MULTIMODAL_KEYS}, **chunk_inputs}
            with self._scoring_mode(model), self._capture_final_hidden(model) as captured:
                chunk_logps, chunk_entropies, aux = super()._get_per_token_logps_and_entropies(
                    model,
                    input_ids[start:end],
                    attention_mask[start:end],
                    logits_to_keep,
                    compute_entropy=True,
                    compute_aux_loss=compute_aux_loss,
                    **chunk_kwargs,
                )
            logps.append(chunk_logps)
            entropies.append(chunk_entropies)
            aux_losses.append(aux)
            self._rollout.signals.append(TokenSignals(entropy=chunk_entropies.float(), logp=chunk_logps.float()))
            hidden = self._completion_hidden(captured, logits_to_keep)
            del captured
            valid = completion_valid[start:end]
            rows = (has_image[start:end] & valid.any(-1)).nonzero().squeeze(-1)
            if rows.numel():
                # Only the valid tokens' states, off the accelerator (a generation batch's worth would not fit), in
                # one blocking copy per chunk
                states = hidden[rows][valid[rows]].cpu().split(valid[rows].sum(-1).tolist())
                for offset, state in zip(rows.tolist(), states):
                    self._rollout.clean[start + offset] = state
        aux_loss = torch.stack(aux_losses).mean() if compute_aux_loss else None
        return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, aux_loss

    def _scoring_mode(self, model):
        """A scoring forward runs as in inference: dropout off, and no activation checkpointing (its no-grad pass has
        no backward to save memory for). Every module's training flag is restored after."""
        return _eval_mode(model)

    def current_noise_step(self) -> int:
        if not self.args.noise_annealing:
            return self.args.noise_step
        return annealed_noise_step(
            self.state.global_step,
            max(self.state.max_steps, 1),
            noise_step=self.args.noise_step,
            coefficient=self.args.noise_annealing_coefficient,
            midpoint=self.args.noise_annealing_midpoint,
        )

    @staticmethod
    def _completion_hidden(captured: list[torch.Tensor], length: int) -> torch.Tensor:
        # The hidden state at position i predicts token i + 1, so completion token j comes from the position before it
        hidden = torch.cat(captured, dim=0)
        return hidden[:, -length - 1 : -1]

    def _dummy_forward(self, model) -> None:
        """A one-image, few-token forward for a process with nothing to score: it enters the same collectives (ZeRO-3 /
        FSDP parameter gathers of the language model AND the vision tower) as a real one. Built once, kept on the
        device."""
        if self._dummy_inputs is None:
            from PIL import Image

            image = Image.new("RGB", (56, 56), (127, 127, 127))
            messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "."}]}]
            text = self.processing_class.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            encoded = self.processing_class(images=[image], text=[text], return_tensors="pt")
            device = self.accelerator.device
            self._dummy_inputs = {k: v.to(device) for k, v in encoded.items() if isinstance(v, torch.Tensor)}
        with self._scoring_mode(model), self.accelerator.autocast():
            model(**self._dummy_inputs, logits_to_keep=1, use_cache=False)

    @torch.no_grad()
    def _perturbed_hidden(self, model, input_ids, attention_mask, length, multimodal, pixel_values):
        """Completion hidden states `(n, T, d)` of the no-grad forward (dropout off) with the perturbed `pixel_values`
        in place of the inputs'. The head runs on one position only: the signals need hidden states, not logits."""
        model_inputs = {key: multimodal[key] for key in _MODEL_INPUT_KEYS if multimodal.get(key) is not None}
        model_inputs["pixel_values"] = pixel_values
        with self._capture_final_hidden(model) as captured, self._scoring_mode(model), self.accelerator.autocast():
            model(
                input_ids=input_ids, attention_mask=attention_mask, **model_inputs, logits_to_keep=1, use_cache=False
            )
        return self._completion_hidden(captured, length)

    @torch.no_grad()
    def _score_rows(self, inputs, index: torch.Tensor, clean_tokens: torch.Tensor) -> TokenSignals:
        """Signals of the responses `index` `(n,)` of a batch, over their valid completion tokens (flattened, row by
        row, `(N,)` each), from their clean hidden states `clean_tokens` `(N, d)` and one perturbed forward.

        Every process calls this the same number of times, with or without rows: with none, a one-image dummy forward
        stands in for the perturbed one and the signal pass runs over no token, so parameter gathers (ZeRO-3, FSDP)
        and the LM-head gather line up across processes."""
        model = self.model
        input_ids, attention_mask = self._sequence(inputs)
        length = inputs["completion_ids"].size(1)
        valid = inputs["completion_mask"].bool()
        if index.numel() == 0:
            self._dummy_forward(model)
            hidden_size = self._base_model(model).config.get_text_config().hidden_size
            perturbed = clean_tokens.new_zeros(0, hidden_size)
            targets = input_ids.new_zeros(0)
        else:
            row_inputs = _take_rows(inputs, index)
            perturbed_pixels = perturb_pixel_values(
                self.args.perturbation,
                row_inputs["pixel_values"],
                row_inputs["image_grid_thw"],
                self._pixel_layout,
                seed=self.args.perturbation_seed,
                step=self.state.global_step,
                noise_step=self.current_noise_step(),
                sigma=self.args.noise_sigma,
                patch_probability=self.args.patch_probability,
                num_generations=self.num_generations,
            )
            ids, mask = input_ids[index], attention_mask[index]
            perturbed_hidden = self._perturbed_hidden(model, ids, mask, length, row_inputs, perturbed_pixels)
            perturbed = perturbed_hidden[valid[index]]
            targets = inputs["completion_ids"][index][valid[index]]
            self.num_perturbed_completions += int(index.numel())
        wanted = set(self.selection.signals)
        if self.args.log_selection_diagnostics:
            wanted |= {"jsd", "entropy", "perturbed_entropy"}
        head = self._lm_head(model)
        text_config = self._base_model(model).config.get_text_config()
        logit_scale = getattr(text_config, "logit_scale", None)
        return token_signals(
            clean_tokens.to(perturbed.device, perturbed.dtype),
            perturbed,
            head.weight,
            head.bias,
            targets=targets,
            signals=wanted,
            temperature=self.temperature,
            logit_scale=1.0 if logit_scale is None else float(logit_scale),
            final_logit_softcapping=getattr(text_config, "final_logit_softcapping", None),
            tile_size=self._tile_size(input_ids.device),
        )

    def _rows_to_score(self, inputs) -> torch.Tensor:
        """`(B,)` responses that need their own perturbed forward: an image, a valid token, and (unless the loss can
        read their mask, or asked) a non-zero advantage. Counts the skipped ones."""
        rows = self._has_image(inputs) & inputs["completion_mask"].bool().any(-1)
        if not (self.args.score_zero_advantage_rows or self._mask_can_matter()):
            skipped = rows & (inputs["advantages"] == 0)
            self.num_skipped_completions += int(skipped.sum())
            rows = rows & ~skipped
        return rows

    def _signals_for_rows(self, inputs, signals: TokenSignals, rows: torch.Tensor, clean_of_row, batch_size: int):
        """Score the responses `rows` `(B,)` in chunks of `batch_size`, `clean_of_row(i)` giving response i's clean
        token states; every process runs as many chunks as the process with the most (the others run dummies).
        Writes the signals into `signals` (`(B, T)` fields) for those responses."""
        index = rows.nonzero().squeeze(-1)
        chunks = max(1, -(-int(index.numel()) // batch_size))
        # The same number of scoring passes on every process, whatever each one's share of images and advantages
        chunks = int(self.accelerator.gather(torch.tensor([chunks], device=rows.device)).max())
        valid = inputs["completion_mask"].bool()
        token_rows = torch.zeros_like(valid)
        token_rows[index] = valid[index]
        pieces: list[TokenSignals] = []
        hidden_size = self._base_model(self.model).config.get_text_config().hidden_size
        for chunk in range(chunks):
            chunk_index = index[chunk * batch_size : (chunk + 1) * batch_size]
            clean = [clean_of_row(int(i)) for i in chunk_index]
            clean = torch.cat(clean) if clean else torch.zeros(0, hidden_size, device=rows.device)
            pieces.append(self._score_rows(inputs, chunk_index, clean.to(rows.device)))
        for name in pieces[0].computed():
            values = scatter_to_rows(torch.cat([getattr(piece, name) for piece in pieces]), token_rows)
            current = getattr(signals, name)
            # The other responses keep what the forward gave (their entropy ranks them); the scored ones' clean entropy
            # is recomputed on the same fp32 path as the perturbed one, so their gap carries no fused-head difference
            setattr(signals, name, values if current is None else torch.where(token_rows, values, current))
        return signals

    # ------------------------------------------------------------------------------------------------------------
    # Selection
    # ------------------------------------------------------------------------------------------------------------

    @staticmethod
    def _loss_mask(inputs: dict[str, Any]) -> torch.Tensor:
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        return mask.bool()

    @staticmethod
    def _rows_with_image(num_images, pixel_values, like: torch.Tensor) -> torch.Tensor:
        """`(B,)` bool: responses whose prompt has an image, on `like`'s device."""
        if pixel_values is None or num_images is None:
            return torch.zeros(like.size(0), dtype=torch.bool, device=like.device)
        return torch.tensor([n > 0 for n in num_images], dtype=torch.bool, device=like.device)

    def _has_image(self, inputs: dict[str, Any]) -> torch.Tensor:
        return self._rows_with_image(inputs.get("num_images"), inputs.get("pixel_values"), inputs["completion_ids"])

    def _row_seeds(self, inputs: dict[str, Any], mask: torch.Tensor) -> torch.Tensor:
        token_ids, _ = self._sequence(inputs)
        # The loss mask, not the attention mask: tokens a tool wrote do not make two responses different
        token_mask = torch.cat([inputs["prompt_mask"].bool(), mask], dim=1)
        return row_seeds(token_ids, token_mask, self.args.perturbation_seed, self.state.global_step)

    def _mask_can_matter(self) -> bool:
        """Whether a zero-advantage response's mask can change the loss. Its policy-gradient term is zero for every
        loss type (each scales the advantage), its selected COUNT is known from its length (so the normalisers of
        bnpo / dapo / cispo / vespo stay exact), and the KL term does not read the mask. Only an entropy bonus over
        the selected tokens reads which tokens they are."""
        return self.entropy_coef != 0.0 and self.args.entropy_scope == "selected"

    def _selection_active(self) -> bool:
        return self.model.training or self.args.eval_selection

    def _select(self, inputs, signals: TokenSignals, scored: torch.Tensor) -> torch.Tensor:
        """The `(B, T)` mask from the signals. `scored` `(B,)`: responses that went through the perturbed pass; the
        others are ranked by entropy with the strategy's token count (text-only prompts, zero-advantage rows)."""
        mask = self._loss_mask(inputs)
        return select_tokens(
            self.selection,
            signals,
            mask,
            ratio=self.args.selection_ratio,
            alpha=self.args.selection_alpha,
            has_image=scored if self.selection.needs_perturbed_pass else None,
            seeds=self._row_seeds(inputs, mask) if self.selection.count == "random" else None,
        )

    def _select_at_first_use(self, model, inputs, forward, captured) -> torch.Tensor:
        """The mask of a slice whose batch TRL did not score at rollout: its first use is still the rollout policy."""
        logps, entropies, _ = forward
        mask = self._loss_mask(inputs)
        length = inputs["completion_ids"].size(1)
        if self._dropout and self.model.training:
            # The loss forward is random under dropout: the clean side comes from a dropout-free forward of the whole
            # micro-batch (text-only responses are ranked by its entropies too)
            with self._capture_final_hidden(self.model) as captured:
                logps, entropies, _ = self._dropout_free_forward(inputs)
        signals = TokenSignals(entropy=entropies.detach().float(), logp=logps.detach().float())
        scored = torch.zeros(mask.size(0), dtype=torch.bool, device=mask.device)
        if self.selection.needs_perturbed_pass:
            scored = self._rows_to_score(inputs)
            hidden = self._completion_hidden(captured, length)
            valid = inputs["completion_mask"].bool()
            signals = self._signals_for_rows(
                inputs, signals, scored, lambda i: hidden[i][valid[i]], inputs["completion_ids"].size(0)
            )
        selected = self._select(inputs, signals, scored)
        self._log_selection(inputs, signals, selected, scored)
        return selected

    @torch.no_grad()
    def _dropout_free_forward(self, inputs):
        with self._scoring_mode(self.model):
            return super()._get_per_token_logps_and_entropies(
                self.model,
                *self._sequence(inputs),
                inputs["completion_ids"].size(1),
                compute_entropy=True,
                **{key: inputs.get(key) for key in _MULTIMODAL_KEYS},
            )

    # ------------------------------------------------------------------------------------------------------------
    # GRPO hooks
    # ------------------------------------------------------------------------------------------------------------

    def _generate(self, prompts):
        *rest, images, tool_images = super()._generate(prompts)
        # TRL 1.16 marks the text-only rows of a mixed batch with None, which the processor then rejects; an empty
        # image list says the same and works. Generation (vLLM included) already ran, so only scoring sees the change.
        if images is not None:
            images = [row if row is not None else [] for row in images]
        return (*rest, images, tool_images)

    @staticmethod
    def _row_images(inputs) -> list[list] | None:
        """Each row's images as TRL reads them from the data (`images` list or `image`), `None` when TRL sees none."""
        if "images" in inputs[0]:
            images = [example.get("images") or [] for example in inputs]
        elif "image" in inputs[0]:
            images = [[example["image"]] if example.get("image") is not None else [] for example in inputs]
        else:
            return None
        return None if all(row == [] for row in images) else images

    def _generate_and_score_completions(self, inputs):
        # TRL gathers the images for its completions table only on processes that have some; processes that disagree
        # would wait on each other forever. When they disagree, every process gathers here instead.
        own_image_logging = False
        if self.log_multimodal and self.accelerator.num_processes > 1:
            images = self._row_images(inputs)
            flag = torch.tensor([float(images is not None)], device=self.accelerator.device)
            with_images = int(self.accelerator.reduce(flag, reduction="sum").item())
            own_image_logging = 0 < with_images < self.accelerator.num_processes
        active = self._selection_active() and self.selection.needs_signals and self._trl_scores_at_rollout()
        self._rollout = _RolloutScoring() if active else None
        if own_image_logging:
            self.log_multimodal = False
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            rollout, self._rollout = self._rollout, None
            if own_image_logging:
                self.log_multimodal = True
        if own_image_logging:
            images = self._row_images(inputs) or [[] for _ in inputs]
            self._logs["images"].extend(gather_object(images))
        if not self._selection_active():
            return output
        mask = self._loss_mask(output)
        if rollout is not None and rollout.done:
            # Scored with the weights that sampled the batch: clean side from TRL's rollout-time forward, perturbed
            # forwards now (the advantages tell which responses can skip theirs), before any optimiser step
            signals = TokenSignals(
                **{
                    name: torch.cat([getattr(chunk, name) for chunk in rollout.signals])
                    for name in rollout.signals[0].computed()
                }
            )
            scored = torch.zeros_like(mask[:, 0])
            if self.selection.needs_perturbed_pass:
                scored = self._rows_to_score(output)
                # A response TRL's forward saw no valid token of (all masked) has no stored state: nothing to score
                scored &= torch.tensor(
                    [i in rollout.clean for i in range(scored.numel())], dtype=torch.bool, device=scored.device
                )
                signals = self._signals_for_rows(
                    output, signals, scored, rollout.clean.__getitem__, rollout.batch_size
                )
            output[SELECTION_KEY] = self._select(output, signals, scored)
            self._log_selection(output, signals, output[SELECTION_KEY], scored)
        elif not self.selection.needs_signals:
            # `full` and `random` need nothing from the model: draw the mask with the rollout
            output[SELECTION_KEY] = self._select(output, TokenSignals(), torch.zeros_like(mask[:, 0]))
            self._log_selection(output, TokenSignals(), output[SELECTION_KEY], torch.zeros_like(mask[:, 0]))
        if self.loss_type in TOKEN_COUNT_NORMALISED_LOSSES:
            # These losses divide by the generation batch's valid-token count; L_VEPO's policy term divides by the
            # selected count. Top-k strategies keep a count known from the lengths, before any forward pass.
            if SELECTION_KEY in output:
                selected = output[SELECTION_KEY].sum()
            else:
                selected = self.selection.selected_count(mask.sum(-1), self.args.selection_ratio).sum()
            counts = torch.stack([mask.sum(), selected]).to(device=mask.device, dtype=torch.float64)
            valid_total, selected_total = self.accelerator.reduce(counts, reduction="sum").tolist()
            output[COUNT_SCALE_KEY] = torch.tensor(valid_total / max(selected_total, 1.0), device=mask.device)
        return output

    def _trl_scores_at_rollout(self) -> bool:
        """Whether GRPOTrainer runs its no-grad `old_per_token_logps` forward at rollout (its own condition). Only
        then is the policy's first rollout forward that one (otherwise it may be a PEFT reference forward)."""
        generate_every = self.args.steps_per_generation * self.num_iterations
        return bool(
            self.args.gradient_accumulation_steps % generate_every != 0
            or (self.use_vllm and self.vllm_importance_sampling_correction)
        )

    def _count_scale(self, inputs) -> float | torch.Tensor | None:
        if self.loss_type in TOKEN_COUNT_NORMALISED_LOSSES:
            return inputs.get(COUNT_SCALE_KEY)
        if self.loss_type in CONSTANT_NORMALISED_LOSSES:
            # Dr. GRPO's constant T_max becomes the selected count of a T_max-token response
            t_max = self.max_completion_length
            # cpu: one count, read back as a float
            count = self.selection.selected_count(torch.tensor([t_max]), self.args.selection_ratio)
            expected = float(count) if count is not None else self.args.selection_ratio * t_max
            return t_max / max(expected, 1.0)
        return None

    # `GRPOTrainer._compute_loss` multiplies the policy-gradient term (only it) by `get_high_entropy_mask(...)` when
    # `top_entropy_quantile < 1`: the hook TRL gives token selection. VEPO's weights go through it.
    @property
    def top_entropy_quantile(self) -> float:
        return 0.0 if self.__dict__.get("_token_weights") is not None else self.__dict__["_top_entropy_quantile"]

    @top_entropy_quantile.setter
    def top_entropy_quantile(self, value: float) -> None:
        self.__dict__["_top_entropy_quantile"] = value

    def get_high_entropy_mask(self, entropies, mask, threshold):
        if self._token_weights is not None:
            return self._token_weights.to(entropies.dtype)
        return super().get_high_entropy_mask(entropies, mask, threshold)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        mode = "train" if self.model.training else "eval"
        first_use = self._selection_active() and SELECTION_KEY not in inputs
        # Under dropout (in training) the clean side needs its own dropout-free forward; otherwise the loss forward's
        capture = first_use and self.selection.needs_perturbed_pass and not (self._dropout and self.model.training)
        with self._capture_final_hidden(model, capture) as captured:
            forward = self._forward(model, inputs)
        if first_use:
            # Stored in the buffered batch itself: later iterations and accumulation slices reuse the mask
            inputs[SELECTION_KEY] = self._select_at_first_use(model, inputs, forward, captured)
        valid = self._loss_mask(inputs)
        weights = None
        if SELECTION_KEY in inputs and not (self.selection.count == "all" and self.args.selection_mode == "mask"):
            weights = policy_token_weights(
                inputs[SELECTION_KEY],
                valid,
                self.loss_type,
                mode=self.args.selection_mode,
                bonus=self.args.selection_weight,
                count_scale=self._count_scale(inputs),
            )
        # TRL's entropy bonus would average over its masked tokens; with weights in place VEPO adds its own
        own_bonus = weights is not None and self._entropy_bonus_enabled
        self._pending_forward, self._token_weights = forward, weights
        bonus_enabled = self._entropy_bonus_enabled
        if own_bonus:
            self._entropy_bonus_enabled = False
        try:
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        finally:
            self._pending_forward, self._token_weights = None, None
            self._entropy_bonus_enabled = bonus_enabled
        if own_bonus:
            # TRL logs `policy_loss` (the loss before the bonus, without the accumulation scaling) in its bonus block
            accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
            unscaled = 1.0 if self.loss_type in TOKEN_COUNT_NORMALISED_LOSSES else accumulation
            policy_loss = loss.detach() * unscaled
            self._metrics[mode]["policy_loss"].append(self.accelerator.gather(policy_loss).nanmean().item())
            scope = valid if self.args.entropy_scope == "all" else valid & inputs[SELECTION_KEY].bool()
            scope = scope.to(forward[1].dtype)
            entropy = (forward[1] * scope).sum() / scope.sum().clamp(min=1.0) / accumulation
            loss = loss - self.entropy_coef * entropy
            if mode == "train" and self.accelerator.sync_gradients:
                self._metrics[mode]["entropy_coef"].append(self.entropy_coef)
        return loss

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """Write VEPO's model card (method, settings, data, `vepo/` metrics, citations) to `output_dir/README.md`."""
        if not self.is_world_process_zero():
            return
        card = build_model_card(self, model_name=model_name, dataset_name=dataset_name, tags=tags)
        card.save(os.path.join(self.args.output_dir, "README.md"))

    # ------------------------------------------------------------------------------------------------------------
    # Metrics
    # ------------------------------------------------------------------------------------------------------------

    def _log_selection(self, inputs, signals: TokenSignals, selected: torch.Tensor, scored: torch.Tensor) -> None:
        """`vepo/` metrics of a freshly made mask. One reduction of fixed shape on every process, whatever its batch."""
        mode = "train" if self.model.training else "eval"
        mask = self._loss_mask(inputs)
        selected = selected.bool() & mask
        has_image = self._has_image(inputs)
        visual = mask & scored.unsqueeze(-1)
        device = mask.device
        zero = torch.zeros((), device=device)

        def masked_sum(values, where):
            return (values.float() * where).sum() if values is not None else zero

        # VEPO's score c = g * h of every scored token (the release logs its mean and spread)
        score = None
        if signals.jsd is not None and signals.entropy is not None and signals.perturbed_entropy is not None:
            score = vepo_score(
                minmax_normalize(signals.jsd, visual),
                minmax_normalize(signals.entropy_gap.abs(), visual),
                minmax_normalize(signals.entropy, visual),
                self.args.selection_alpha,
            )
        jsd_total = entropy_misses = selection_misses = 0
        if signals.jsd is not None and signals.entropy is not None and bool(visual.any()):
            jsd_total, entropy_misses, selection_misses = selection_miss_counts(
                signals, visual, selected & visual, self.args.selection_ratio
            )
        gap = signals.entropy_gap if signals.entropy is not None and signals.perturbed_entropy is not None else None
        # Per-response selected share, for its spread across responses
        lengths = mask.sum(-1)
        share = selected.sum(-1).float() / lengths.clamp(min=1)
        has_tokens = lengths > 0
        image_rows = has_image & mask.any(-1)
        # Responses whose mask is the strategy's own (not an entropy stand-in for a skipped or text-only response)
        own = (scored if self.selection.needs_perturbed_pass else mask.any(-1)).unsqueeze(-1)
        stats = torch.stack(
            [
                mask.sum().float(),
                selected.sum().float(),
                masked_sum(signals.entropy, mask),
                masked_sum(signals.entropy, selected & own),
                (selected & own).sum().float(),
                visual.sum().float(),
                masked_sum(signals.jsd, visual),
                masked_sum(gap.abs() if gap is not None else None, visual),
                masked_sum(signals.jsd, selected & visual),
                masked_sum(gap.abs() if gap is not None else None, selected & visual),
                masked_sum((gap > 0) if gap is not None else None, visual),
                (selected & visual).sum().float(),
                torch.tensor(float(jsd_total), device=device),
                torch.tensor(float(entropy_misses), device=device),
                torch.tensor(float(selection_misses), device=device),
                has_image.sum().float(),
                torch.tensor(float(has_image.numel()), device=device),
                image_rows.sum().float(),
                scored.sum().float(),
                (share * has_tokens).sum(),
                (share.square() * has_tokens).sum(),
                has_tokens.sum().float(),
                masked_sum(score, visual),
                masked_sum(score.square() if score is not None else None, visual),
            ]
        )
        (
            valid, kept, h_all, h_kept, n_kept_own, n_visual, jsd, gap_sum, jsd_kept, gap_kept, gap_positive,
            n_kept_visual, top_jsd, ent_miss, sel_miss, n_img, n_rows, n_img_valid, n_scored, share_sum, share_sq,
            n_responses, score_sum, score_sq,
        ) = self.accelerator.reduce(stats, reduction="sum").tolist()  # fmt: skip
        metrics = self._metrics[mode]
        if valid > 0:  # nothing to report of a batch whose completions are all masked
            metrics["vepo/selected_fraction"].append(kept / valid)
        if n_responses > 0:
            mean_share = share_sum / n_responses
            metrics["vepo/selected_fraction_std"].append(max(share_sq / n_responses - mean_share**2, 0.0) ** 0.5)
        metrics["vepo/image_rows_fraction"].append(n_img / max(n_rows, 1.0))
        if signals.entropy is not None and valid > 0:
            metrics["vepo/entropy_all_mean"].append(h_all / valid)
            if n_kept_own > 0:
                metrics["vepo/entropy_selected_mean"].append(h_kept / n_kept_own)
        if self.selection.needs_perturbed_pass:
            if self._uses_noise_step:
                metrics["vepo/noise_step"].append(float(self.current_noise_step()))
            if n_img_valid > 0:
                # The perturbed passes saved by skipping zero-advantage responses (compare `frac_reward_zero_std`)
                metrics["vepo/perturbed_rows_skipped_fraction"].append(1.0 - n_scored / n_img_valid)
        if n_visual > 0:
            if signals.jsd is not None:
                metrics["vepo/jsd_mean"].append(jsd / n_visual)
            if gap is not None:
                metrics["vepo/entropy_gap_abs_mean"].append(gap_sum / n_visual)
                metrics["vepo/entropy_gap_positive_fraction"].append(gap_positive / n_visual)
            if score is not None:
                score_mean = score_sum / n_visual
                metrics["vepo/score_mean"].append(score_mean)
                metrics["vepo/score_std"].append(max(score_sq / n_visual - score_mean**2, 0.0) ** 0.5)
            if n_kept_visual > 0:
                if signals.jsd is not None:
                    metrics["vepo/jsd_selected_mean"].append(jsd_kept / n_kept_visual)
                if gap is not None:
                    metrics["vepo/entropy_gap_abs_selected_mean"].append(gap_kept / n_kept_visual)
        if top_jsd > 0:
            metrics["vepo/top_jsd_missed_by_entropy"].append(ent_miss / top_jsd)
            metrics["vepo/top_jsd_missed_by_selection"].append(sel_miss / top_jsd)
        self._write_selection_samples(inputs, signals, selected, scored)

    def _write_selection_samples(self, inputs, signals: TokenSignals, selected, scored) -> None:
        """A few of the main process's completions with their signals and selection, every `selection_samples_steps`
        steps, for `vepo-trl inspect --records`. Local to the main process: no collective."""
        every = self.args.selection_samples_steps
        step = self.state.global_step
        if not every or not self.model.training or not self.accelerator.is_main_process:
            return
        last = getattr(self, "_samples_written_at", None)
        # Masks are made at rollouts, which need not fall on multiples of `every`: write at the first one due
        if (last is not None and step - last < every) or signals.entropy is None:
            return
        self._samples_written_at = step
        from .insight.records import records_from_signals, save_records

        prompts = self.processing_class.batch_decode(
            [ids[mask.bool()] for ids, mask in zip(inputs["prompt_ids"], inputs["prompt_mask"])],
            skip_special_tokens=True,
        )
        records = records_from_signals(
            inputs["completion_ids"],
            self.processing_class,
            signals,
            self._loss_mask(inputs),
            selected,
            ratio=self.args.selection_ratio,
            alpha=self.args.selection_alpha,
            strategy=self.args.selection_strategy,
            advantages=inputs["advantages"],
            has_image=scored if signals.jsd is not None else None,
            prompts=prompts,
            step=step,
            rows=range(min(self.args.selection_samples_count, len(prompts))),
            meta={"perturbation": self.args.perturbation, "noise_step": self.current_noise_step()},
        )
        save_records(os.path.join(self.args.output_dir, "selection_samples.jsonl"), records, append=True)
