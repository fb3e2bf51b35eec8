"""`VEPOTrainer`: GRPO whose policy gradient trains only on each response's visual forking tokens.

The wiring between TRL's `GRPOTrainer` hooks and VEPO's selection (`selection_pipeline`), a few lines an override.

- `_generate_and_score_completions`: arms the rollout-time scoring, and once TRL has the advantages stores the batch's
  mask (made with the weights that sampled it) before TRL shuffles and splits the batch.
- `_get_per_token_logps_and_entropies`: TRL's rollout-time policy forward is scored as it runs; in the loss, the
  forward `compute_loss` already ran is handed to GRPO instead of running it twice.
- `compute_loss`: a slice whose mask was not made at rollout gets it at first use (still the rollout policy), then
  GRPO's loss runs with the mask as weights on the policy-gradient term only (L_VEPO for every `loss_type`), through
  `get_high_entropy_mask`, the hook TRL gives token selection.

Every process enters every collective whatever its batch holds (`perturbed_pass`). See docs/ARCHITECTURE.md."""

from __future__ import annotations

import inspect
import logging
import os
import textwrap

import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer
from trl.trainer.utils import get_config_model_id

from .batch import Batch, mark_per_row_pixels, row_images
from .config import VEPOConfig
from .families import check_family_inputs, family_of
from .local_models import resolve_model_name
from .model_card import build_model_card
from .model_hooks import has_active_dropout
from .perturb import annealed_noise_step, get_perturbation
from .perturbed_pass import PerturbedPass
from .run_folder import foreign_card
from .scoring import TOKEN_COUNT_NORMALISED_LOSSES, get_strategy
from .selection_pipeline import COUNT_SCALE_KEY, SELECTION_KEY, SelectionPipeline, SelectionSamplesFile
from .sharding import maybe_align_vision_tower, maybe_unshard_fused_head
from .trainer_inputs import check_text_only, checked_model, named_rewards_resolved, prepared_datasets

# TRL's contract in one place: every patch of TRL 1.16 behaviour the trainer uses (`trl_compat.PATCHES` says what
# each answers and when it goes); the methods below are VEPO's own hooks
from .trl_compat import (
    NoMediaTokensSampled,
    RestoresCheckpointWeights,
    SavesWholeCheckpoints,
    TextRowsTakeEmptyImages,
    UnexpandedVLLMPrompts,
    UnpaddedPromptIds,
)
from .trl_compat.forward import causal_completion, image_safe_forward
from .trl_compat.vllm_prompts import check_vllm, guard_vllm_rollouts, images_only_engine


__all__ = ["COUNT_SCALE_KEY", "SELECTION_KEY", "VEPOTrainer"]

logger = logging.getLogger(__name__)
_TRL_FORWARD_SIGNATURE = inspect.signature(GRPOTrainer._get_per_token_logps_and_entropies)
_TRL_FORWARD_KEYWORDS = frozenset(_TRL_FORWARD_SIGNATURE.parameters)
_PROCESSOR_ONLY_KEYS = ("batch_num_images", "labels")


class VEPOTrainer(
    NoMediaTokensSampled,
    SavesWholeCheckpoints,
    RestoresCheckpointWeights,
    UnexpandedVLLMPrompts,
    UnpaddedPromptIds,
    TextRowsTakeEmptyImages,
    GRPOTrainer,
):
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

    def __init__(self, model, reward_funcs=None, args: VEPOConfig | None = None, *pos_args, **kwargs):
        model, reward_funcs = checked_model(model), named_rewards_resolved(reward_funcs)
        if args is None:
            model_name = model if isinstance(model, str) else get_config_model_id(model.config)
            args = VEPOConfig(f"{str(model_name).split('/')[-1]}-VEPO")
        if not isinstance(args, VEPOConfig):
            raise TypeError(
                f"VEPOTrainer needs a VEPOConfig (got {type(args).__name__}); build one with the same fields, e.g. "
                "VEPOConfig(**grpo_config.to_dict()), and set the VEPO fields on it."
            )
        if args.use_vllm:
            check_vllm(model, args.vllm_mode)  # before the model and vLLM load
        pos_args, kwargs = prepared_datasets(args, pos_args, kwargs)  # packages, data as the CLI takes them
        train_dataset = kwargs.get("train_dataset", pos_args[0] if pos_args else None)
        if isinstance(model, str):
            model = resolve_model_name(model)  # `tiny-qwen2.5-vl`: the offline tiny model, built and cached once
        check_text_only(model, args.selection_strategy, train_dataset, kwargs.get("processing_class"))
        # Read by the `top_entropy_quantile` property while GRPOTrainer.__init__ runs
        self._token_weights = None
        with images_only_engine(args):
            super().__init__(model, reward_funcs, args, *pos_args, **kwargs)
        guard_vllm_rollouts(self)  # stale image features after a sync (trl#7198), a dtype vLLM picked
        self.selection = get_strategy(args.selection_strategy)
        check_family_inputs(
            getattr(self.model, "config", None),
            self.processing_class,
            {"train_dataset": self.train_dataset, "eval_dataset": self.eval_dataset},
            chat_template=self.chat_template,
            use_vllm=args.use_vllm,
        )
        family = family_of(getattr(self.model, "config", None))
        self._prefix_lm, self._pending_forward = family is not None and family.prefix_lm, None
        # Refuses a model whose images or LM head the pass cannot read
        self.perturbed_pass = PerturbedPass(
            self, args.selection_strategy if self.selection.needs_perturbed_pass else None
        )
        self.ban_media_tokens(self.perturbed_pass.base_model)  # on every generation path (trl_compat.media_tokens)
        self.selection_pipeline = SelectionPipeline(
            self,
            self.selection,
            # GRPO's own forward (not this class's override, which hands over to the pipeline), safe for chunks
            # without an image
            image_safe_forward(super()._get_per_token_logps_and_entropies),
            self.perturbed_pass,
            dropout=has_active_dropout(self.model),
            noise_step_metric="noise_step" in inspect.signature(get_perturbation(args.perturbation)).parameters,
        )
        self.add_callback(SelectionSamplesFile())
        # Under FSDP / ZeRO-3, every process runs the vision tower in every forward where one does (policy and
        # reference model): text-only micro-batches would otherwise skip its parameter gathers
        models = [m for m in (self.model, getattr(self, "ref_model", None)) if m is not None]
        self.vision_alignment = [maybe_align_vision_tower(self, self.perturbed_pass.base_model(m)) for m in models]
        # FSDP2: the LM head's gradient through FSDP's reduce-scatter, not TRL's fused head's DTensor gather
        self.head_unshard = maybe_unshard_fused_head(self, self.model)

    @property
    def num_perturbed_completions(self) -> int:
        """Completions run through the perturbed forward so far (benchmarks and tests read it)."""
        return self.perturbed_pass.num_completions

    @property
    def num_skipped_completions(self) -> int:
        """Completions whose perturbed forward was skipped: zero advantage, mask irrelevant to the loss."""
        return self.selection_pipeline.num_skipped_completions

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

    # ------------------------------------------------------------------------------------------------------------
    # GRPO hooks
    # ------------------------------------------------------------------------------------------------------------

    def _generate_and_score_completions(self, inputs):
        # TRL gathers the images for its completions table only on processes that have some; processes that disagree
        # would wait on each other forever. When they disagree, every process gathers here instead.
        own_image_logging = False
        if self.log_multimodal and self.accelerator.num_processes > 1:
            flag = torch.tensor([float(row_images(inputs) is not None)], device=self.accelerator.device)
            with_images = int(self.accelerator.reduce(flag, reduction="sum").item())
            own_image_logging = 0 < with_images < self.accelerator.num_processes
        self.selection_pipeline.begin_rollout()
        if own_image_logging:
            self.log_multimodal = False
        try:
            output = super()._generate_and_score_completions(inputs)
        except BaseException:
            self.selection_pipeline.rollout = None
            raise
        finally:
            if own_image_logging:
                self.log_multimodal = True
        if own_image_logging:
            self._logs["images"].extend(gather_object(row_images(inputs) or [[] for _ in inputs]))
        # TRL splits and shuffles the batch next: per-response pixels must be cut by response, not by its guess
        output = mark_per_row_pixels(output, output["prompt_ids"].size(0))
        if self._prefix_lm and output.get("token_type_ids") is not None:
            output["token_type_ids"] = causal_completion(output["token_type_ids"], output["completion_ids"].size(1))
        return self.selection_pipeline.finish_rollout(output)

    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        # Processor outputs TRL 1.16's forward takes no keyword for reach it with the image inputs, and its rollout-time
        # forwards (a reference model, vLLM importance sampling, old log-probs) raise TypeError: `batch_num_images`
        # (the model reads the layout off `image_sizes`), a prefix LM's prompt-only `labels` (TRL builds its own).
        # Each is kept once TRL takes it.
        for key in _PROCESSOR_ONLY_KEYS:
            if key in kwargs and key not in _TRL_FORWARD_KEYWORDS:
                kwargs.pop(key)
        # A prefix LM: TRL's rollout-time forwards get the completion in the bidirectional prefix (`causal_completion`)
        if self._prefix_lm and kwargs.get("token_type_ids") is not None:
            length = _TRL_FORWARD_SIGNATURE.bind(self, model, *args, **kwargs).arguments["logits_to_keep"]
            kwargs["token_type_ids"] = causal_completion(kwargs["token_type_ids"], length)
        # `compute_loss` already ran the loss forward (to select tokens from it); hand that result to GRPO's loss
        # instead of running the forward again
        if self._pending_forward is not None:
            forward, self._pending_forward = self._pending_forward, None
            return forward
        # TRL's first no-grad forward of a rollout with the policy is `old_per_token_logps` (a reference forward, with
        # a PEFT policy's adapters off, comes after it): score the batch on it
        if self.selection_pipeline.takes_forward(model):
            return self.selection_pipeline.rollout_forward(model, *args, **kwargs)
        return self.selection_pipeline.trl_forward(model, *args, **kwargs)

    def _forward(self, model, inputs):
        """GRPO's loss forward, with the arguments `GRPOTrainer._compute_loss` uses: (log-probs, entropies, aux)."""
        return self.selection_pipeline.batch_forward(model, inputs, aux=self.aux_loss_enabled)

    # `GRPOTrainer._compute_loss` multiplies the policy-gradient term (only it) by `get_high_entropy_mask(...)` when
    # `top_entropy_quantile < 1`: the hook TRL gives token selection. VEPO's weights go through it.
    @property
    def top_entropy_quantile(self) -> float:
        return 0.0 if self.__dict__.get("_token_weights") is not None else self.__dict__["_top_entropy_quantile"]

    @top_entropy_quantile.setter
    def top_entropy_quantile(self, value: float) -> None:
        self.__dict__["_top_entropy_quantile"] = value

    def get_high_entropy_mask(self, entropies, mask, threshold):
        weights = self.__dict__.get("_token_weights")  # TRL's tests call it on a Mock(spec=...): no __init__ ran
        if weights is not None:
            return weights.to(entropies.dtype)
        return super().get_high_entropy_mask(entropies, mask, threshold)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        pipeline = self.selection_pipeline
        mode = "train" if self.model.training else "eval"
        first_use = pipeline.active() and SELECTION_KEY not in inputs
        # Under dropout (in training) the clean side needs its own dropout-free forward; otherwise the loss forward's
        capture = first_use and self.selection.needs_perturbed_pass and not (pipeline.dropout and self.model.training)
        with self.perturbed_pass.capture(model, capture) as captured:
            forward = self._forward(model, inputs)
        batch = Batch(inputs)  # one view of the slice: its mask, weights and bonus read the same derived values
        if first_use:  # stored in the buffered batch itself: later iterations and accumulation slices reuse the mask
            inputs[SELECTION_KEY] = pipeline.select_at_first_use(model, batch, forward, captured)
        weights = pipeline.token_weights(batch)
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
            loss = self._add_entropy_bonus(loss, forward[1], batch, mode)
        return loss

    def _add_entropy_bonus(self, loss, entropies, inputs, mode: str):
        """The loss minus `entropy_coef` x the mean entropy over `entropy_scope`'s tokens, logging TRL's
        `policy_loss` (the loss before the bonus, without the accumulation scaling) as its bonus block does."""
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        unscaled = 1.0 if self.loss_type in TOKEN_COUNT_NORMALISED_LOSSES else accumulation
        policy_loss = loss.detach() * unscaled
        self._metrics[mode]["policy_loss"].append(self.accelerator.gather(policy_loss).nanmean().item())
        valid = Batch.of(inputs).loss_mask
        scope = valid if self.args.entropy_scope == "all" else valid & inputs[SELECTION_KEY].bool()
        scope = scope.to(entropies.dtype)
        entropy = (entropies * scope).sum() / scope.sum().clamp(min=1.0) / accumulation
        if mode == "train" and self.accelerator.sync_gradients:
            self._metrics[mode]["entropy_coef"].append(self.entropy_coef)
        return loss - self.entropy_coef * entropy

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """Write VEPO's model card (method, settings, data, `vepo/` metrics, citations) to `output_dir/README.md`."""
        if not self.is_world_process_zero():
            return
        card = build_model_card(self, model_name=model_name, dataset_name=dataset_name, tags=tags)
        path = os.path.join(self.args.output_dir, "README.md")
        if foreign_card(self.args.output_dir) is not None:  # the user's own README.md: never written over
            path = os.path.join(self.args.output_dir, "MODEL_CARD.md")
            logger.warning(
                "%s/README.md is not a model card vepo_trl wrote: the card went to %s", self.args.output_dir, path
            )
        card.save(path)
