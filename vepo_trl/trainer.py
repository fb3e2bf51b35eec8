"""`VEPOTrainer`: GRPO that trains only on each response's visual forking tokens.

Data flow per generation batch: TRL rolls out and scores completions -> on a batch's first use, the loss forward (the
one GRPO runs anyway) gives the clean distribution P, and one extra no-grad forward with a perturbed image gives Q ->
`scoring.token_signals` / `scoring.select_tokens` turn them into a per-response token mask -> the mask is stored in the
buffered batch, so later iterations and accumulation slices reuse it -> GRPO's own loss aggregates over the selected
tokens (numerator and denominator, every `loss_type`) -> `vepo/` metrics.
"""

from __future__ import annotations

import os
import textwrap
from contextlib import contextmanager
from typing import Any

import torch
from accelerate.utils import is_peft_model
from transformers import ProcessorMixin
from trl import GRPOTrainer
from trl.trainer.utils import get_config_model_id

from .config import VEPOConfig
from .model_card import build_model_card
from .perturb import PixelLayout, annealed_noise_step, perturb_pixel_values
from .scoring import (
    TokenSignals,
    get_strategy,
    row_seeds,
    scatter_to_rows,
    select_tokens,
    selection_miss_counts,
    token_signals,
)


# Key under which a batch's token-selection mask lives in TRL's buffered generation batch
SELECTION_KEY = "vepo_selection_mask"
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
# Loss types normalised by the generation batch's token count (`num_items_in_batch`) rather than per micro-batch
_TOKEN_COUNT_NORMALISED = ("dapo", "cispo", "vespo")


class VEPOTrainer(GRPOTrainer):
    """GRPO with VEPO's vision-entropy token selection ([`VEPOConfig`] holds the VEPO settings).

    Drop-in for [`~trl.GRPOTrainer`]: same arguments, same data format (conversational prompts with an `image` or
    `images` column), same generation back ends (transformers or vLLM). The selection strategy, not the loss, changes:
    `selection_strategy="full"` gives exactly GRPO's loss.
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
        super().__init__(model, reward_funcs, args, *pos_args, **kwargs)
        self.selection = get_strategy(args.selection_strategy)
        self._pending_forward = None
        # Completions run through the perturbed forward so far (benchmarks and tests read it)
        self.num_perturbed_completions = 0
        self._pixel_layout = None
        if self.selection.needs_perturbed_pass:
            self._check_vision_support()
            self._pixel_layout = PixelLayout.from_image_processor(self.processing_class.image_processor)
        self._check_lm_head()

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
        from the very forward the loss uses. Detached: the loss graph is untouched.
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

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        # `compute_loss` already ran the loss forward (to select tokens from it); hand that result to GRPO's loss
        # instead of running the forward again
        if self._pending_forward is not None:
            forward, self._pending_forward = self._pending_forward, None
            return forward
        return super()._get_per_token_logps_and_entropies(*args, **kwargs)

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

    @torch.no_grad()
    def _perturbed_forward(self, model, inputs: dict[str, Any]) -> torch.Tensor:
        """The counterfactual pass: same prompt and completion, perturbed image. Returns the completion positions'
        final hidden states `(B, T, d)`; the signals come from them and the LM head, in tiles."""
        pixel_values = perturb_pixel_values(
            self.args.perturbation,
            inputs["pixel_values"],
            inputs["image_grid_thw"],
            self._pixel_layout,
            seed=self.args.perturbation_seed,
            step=self.state.global_step,
            noise_step=self.current_noise_step(),
            sigma=self.args.noise_sigma,
            patch_probability=self.args.patch_probability,
        )
        model_inputs = {key: inputs[key] for key in _MODEL_INPUT_KEYS if inputs.get(key) is not None}
        model_inputs["pixel_values"] = pixel_values
        model_inputs["input_ids"], model_inputs["attention_mask"] = self._sequence(inputs)
        with self._capture_final_hidden(model) as captured, self.accelerator.autocast():
            # The head runs on one position only: the signals need hidden states, not (B, T, V) logits
            model(**model_inputs, logits_to_keep=1, use_cache=False)
        self.num_perturbed_completions += inputs["completion_ids"].size(0)
        return self._completion_hidden(captured, inputs)

    @staticmethod
    def _completion_hidden(captured: list[torch.Tensor], inputs: dict[str, Any]) -> torch.Tensor:
        # The hidden state at position i predicts token i + 1, so completion token j comes from the position before it
        hidden = torch.cat(captured, dim=0)
        length = inputs["completion_ids"].size(1)
        return hidden[:, -length - 1 : -1]

    # ------------------------------------------------------------------------------------------------------------
    # Selection
    # ------------------------------------------------------------------------------------------------------------

    def _loss_mask(self, inputs: dict[str, Any]) -> torch.Tensor:
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        return mask.bool()

    def _has_image(self, inputs: dict[str, Any]) -> torch.Tensor:
        batch_size = inputs["completion_ids"].size(0)
        device = inputs["completion_ids"].device
        num_images = inputs.get("num_images")
        if inputs.get("pixel_values") is None or num_images is None:
            return torch.zeros(batch_size, dtype=torch.bool, device=device)
        return torch.tensor([n > 0 for n in num_images], dtype=torch.bool, device=device)

    def _row_seeds(self, inputs: dict[str, Any], mask: torch.Tensor) -> torch.Tensor:
        token_ids, _ = self._sequence(inputs)
        # The loss mask, not the attention mask: tokens a tool wrote do not make two responses different
        token_mask = torch.cat([inputs["prompt_mask"].bool(), mask], dim=1)
        return row_seeds(token_ids, token_mask, self.args.perturbation_seed, self.state.global_step)

    def _select(self, model, inputs: dict[str, Any], forward, clean_hidden: torch.Tensor | None) -> torch.Tensor:
        """The selection mask for a batch's first use, from the loss forward's outputs (and its completion hidden
        states `(B, T, d)` when the strategy needs the perturbed pass) and one perturbed forward. Logs `vepo/`."""
        logps, entropies, _ = forward
        mask = self._loss_mask(inputs)
        has_image = self._has_image(inputs) & mask.any(-1)
        signals = TokenSignals(entropy=entropies.detach().float(), logp=logps.detach().float())
        run_perturbed = self.selection.needs_perturbed_pass and bool(has_image.any())
        if run_perturbed:
            wanted = set(self.selection.signals)
            if self.args.log_selection_diagnostics:
                wanted |= {"jsd", "entropy", "perturbed_entropy"}
            perturbed_hidden = self._perturbed_forward(model, inputs)
            rows_mask = mask & has_image[:, None]
            signals = self._hidden_signals(model, inputs, signals, clean_hidden, perturbed_hidden, rows_mask, wanted)
        selected = select_tokens(
            self.selection,
            signals,
            mask,
            ratio=self.args.selection_ratio,
            alpha=self.args.selection_alpha,
            has_image=has_image if self.selection.needs_perturbed_pass else None,
        )
        self._log_selection(inputs, signals, mask, has_image, selected, run_perturbed)
        return selected

    def _hidden_signals(self, model, inputs, signals, clean_hidden, perturbed_hidden, rows_mask, names):
        """Signals of the responses with an image, from the clean (captured during the loss forward) and perturbed
        hidden states, tiled. Clean and perturbed entropies then share one numeric path, so their gap carries no
        difference between the trainer's fused head and the fp32 tiles."""
        head = self._lm_head(model)
        text_config = self._base_model(model).config.get_text_config()
        logit_scale = getattr(text_config, "logit_scale", None)
        computed = token_signals(
            clean_hidden[rows_mask],
            perturbed_hidden[rows_mask],
            head.weight,
            head.bias,
            targets=inputs["completion_ids"][rows_mask],
            signals=names,
            temperature=self.temperature,
            logit_scale=1.0 if logit_scale is None else float(logit_scale),
            final_logit_softcapping=getattr(text_config, "final_logit_softcapping", None),
            tile_size=self.args.scoring_tile_size,
        )
        for name in names:
            values = scatter_to_rows(getattr(computed, name), rows_mask)
            current = getattr(signals, name)
            # Rows without an image keep what the loss forward gave (their entropy ranks them)
            setattr(signals, name, values if current is None else torch.where(rows_mask, values, current))
        return signals

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

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        mask = self._loss_mask(output)
        if not self.selection.needs_signals:
            # `full` and `random` need nothing from the model: draw the mask with the rollout
            output[SELECTION_KEY] = select_tokens(
                self.selection,
                TokenSignals(),
                mask,
                ratio=self.args.selection_ratio,
                alpha=self.args.selection_alpha,
                seeds=self._row_seeds(output, mask) if self.selection.count == "random" else None,
            )
        if self.loss_type in _TOKEN_COUNT_NORMALISED:
            # These losses divide by the generation batch's token count; VEPO's loss divides by the selected count
            # (paper eq. 9). Top-k strategies keep a count known from the lengths, before any forward pass.
            if SELECTION_KEY in output:
                local = output[SELECTION_KEY].sum()
            else:
                local = self.selection.selected_count(mask.sum(-1), self.args.selection_ratio).sum()
            output["num_items_in_batch"] = self.accelerator.gather(local.to(mask.device)).sum()
        return output

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        first_use = SELECTION_KEY not in inputs
        capture = first_use and self.selection.needs_perturbed_pass
        with self._capture_final_hidden(model, capture) as captured:
            forward = self._forward(model, inputs)
        if first_use:
            clean_hidden = self._completion_hidden(captured, inputs) if capture else None
            # Stored in the buffered batch itself: later iterations and accumulation slices reuse the mask
            inputs[SELECTION_KEY] = self._select(model, inputs, forward, clean_hidden)
        selection = inputs[SELECTION_KEY].to(inputs["completion_mask"].dtype)
        tool_mask = inputs.get("tool_mask")
        # GRPO multiplies `tool_mask` into its loss mask, numerator and denominator alike: exactly L_VEPO
        loss_inputs = {**inputs, "tool_mask": selection if tool_mask is None else tool_mask * selection}
        self._pending_forward = forward
        try:
            return super().compute_loss(model, loss_inputs, return_outputs, num_items_in_batch)
        finally:
            self._pending_forward = None

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """Write VEPO's model card (method, settings, data, `vepo/` metrics, citations) to `output_dir/README.md`."""
        if not self.is_world_process_zero():
            return
        card = build_model_card(self, model_name=model_name, dataset_name=dataset_name, tags=tags)
        card.save(os.path.join(self.args.output_dir, "README.md"))

    # ------------------------------------------------------------------------------------------------------------
    # Metrics
    # ------------------------------------------------------------------------------------------------------------

    def _log_selection(self, inputs, signals, mask, has_image, selected, ran_perturbed) -> None:
        mode = "train" if self.model.training else "eval"
        visual = mask & has_image.unsqueeze(-1) if ran_perturbed else torch.zeros_like(mask)
        zero = torch.zeros((), device=mask.device)

        def masked_sum(values, where):
            return (values * where).sum() if values is not None else zero

        jsd_total, entropy_misses, selection_misses = 0, 0, 0
        if ran_perturbed and signals.jsd is not None and bool(visual.any()):
            jsd_total, entropy_misses, selection_misses = selection_miss_counts(
                signals, visual, selected & visual, self.args.selection_ratio
            )
        # vppo without diagnostics computes no perturbed entropy: then there is no gap to report
        has_gap = ran_perturbed and signals.entropy is not None and signals.perturbed_entropy is not None
        gap = signals.entropy_gap.abs() if has_gap else None
        # One reduction of fixed shape on every process, whatever each one's batch holds
        stats = torch.stack(
            [
                mask.sum().float(),
                (selected & mask).sum().float(),
                masked_sum(signals.entropy, mask),
                masked_sum(signals.entropy, selected & mask),
                visual.sum().float(),
                masked_sum(signals.jsd, visual),
                masked_sum(gap, visual),
                torch.tensor(float(jsd_total), device=mask.device),
                torch.tensor(float(entropy_misses), device=mask.device),
                torch.tensor(float(selection_misses), device=mask.device),
                has_image.sum().float(),
                torch.tensor(float(has_image.numel()), device=mask.device),
            ]
        )
        (valid, kept, h_all, h_kept, n_visual, jsd, gap_sum, top_jsd, ent_miss, sel_miss, n_img, n_rows) = (
            self.accelerator.reduce(stats, reduction="sum").tolist()
        )
        metrics = self._metrics[mode]
        metrics["vepo/selected_fraction"].append(kept / max(valid, 1.0))
        metrics["vepo/entropy_all_mean"].append(h_all / max(valid, 1.0))
        metrics["vepo/entropy_selected_mean"].append(h_kept / max(kept, 1.0))
        metrics["vepo/image_rows_fraction"].append(n_img / max(n_rows, 1.0))
        if self.selection.needs_perturbed_pass:
            metrics["vepo/noise_step"].append(float(self.current_noise_step()))
        if n_visual > 0:
            if signals.jsd is not None:
                metrics["vepo/jsd_mean"].append(jsd / n_visual)
            if gap is not None:
                metrics["vepo/entropy_gap_abs_mean"].append(gap_sum / n_visual)
        if top_jsd > 0:
            metrics["vepo/top_jsd_missed_by_entropy"].append(ent_miss / top_jsd)
            metrics["vepo/top_jsd_missed_by_selection"].append(sel_miss / top_jsd)
