"""VEPO's token selection for one generation batch: clean states in, perturbed forward, signals, mask, weights out.

The mask is made once per batch, with the weights that sampled it (the rollout policy), on one of two paths:

- rollout time: when TRL runs its no-grad `old_per_token_logps` forward, `rollout_forward` runs it chunk by chunk,
  keeps each image response's clean completion states (on the CPU) and entropies; `finish_rollout`, once TRL has the
  advantages, runs the perturbed forwards and stores the mask in the batch before TRL shuffles and splits it;
- first use: otherwise every slice of the batch is first used before any optimiser step, and `select_at_first_use`
  makes the mask from the loss forward (which GRPO runs anyway) and one perturbed forward.

The math is in `scoring` (signals, strategies, weights), the perturbed forward in `perturbed_pass`, the metrics in
`selection_metrics`; this module holds the order of the steps and the state between them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import TrainerCallback

from .batch import Batch, rows_with_image
from .batch import take_rows as _take_rows
from .model_hooks import completion_hidden, scoring_mode
from .perturbed_pass import PerturbedPass
from .scoring import (
    CONSTANT_NORMALISED_LOSSES,
    TOKEN_COUNT_NORMALISED_LOSSES,
    TokenSignals,
    policy_token_weights,
    row_seeds,
    select_tokens,
)
from .selection_metrics import selection_metrics


# Key under which a batch's token-selection mask lives in TRL's buffered generation batch
SELECTION_KEY = "vepo_selection_mask"
# valid / selected token count of the generation batch, for loss types normalised by it (0-d, survives TRL's split)
COUNT_SCALE_KEY = "vepo_count_scale"


@dataclass
class RolloutScoring:
    """What the scoring takes from TRL's rollout-time forward (`old_per_token_logps`)."""

    done: bool = False
    signals: list[TokenSignals] = field(default_factory=list)  # per chunk: clean entropy / log-prob, `(b, T)` each
    # Per image row with a valid token: its completion tokens' clean hidden states `(n_valid, d)`, kept on the CPU
    # until the advantages exist (then zero-advantage rows can skip their perturbed forward)
    clean: dict[int, torch.Tensor] = field(default_factory=dict)
    batch_size: int = 1
    # Over `rollout_cache_gb`, each chunk is scored right after its forward instead; `streamed`: the rows it scored
    stream: bool = False
    streamed: list[bool] = field(default_factory=list)
    cache_bytes: int = 0  # the largest process's clean states, in bytes, had they all been kept


def largest_cache_bytes(accelerator, image_tokens: torch.Tensor, hidden: torch.Tensor) -> int:
    """Bytes of clean completion states the largest process would keep for a rollout: `image_tokens` valid tokens of
    image responses here, states like `hidden`. One gather, made by every process once per rollout, so a choice made
    from it is the same everywhere."""
    local = image_tokens.to(torch.float64) * hidden.size(-1) * hidden.element_size()
    return int(accelerator.gather(local.reshape(1).to(hidden.device)).max())


def count_scale(inputs, loss_type: str, selection, ratio: float, max_completion_length: int):
    """The factor that turns a loss type's normaliser into L_VEPO's selected-token count: the generation batch's
    valid / selected count (stored with the batch) for token-count-normalised losses, `T_max / k(T_max)` for Dr.
    GRPO's constant, `None` for the per-sequence ones."""
    if loss_type in TOKEN_COUNT_NORMALISED_LOSSES:
        return inputs.get(COUNT_SCALE_KEY)
    if loss_type in CONSTANT_NORMALISED_LOSSES:
        # Dr. GRPO's constant T_max becomes the selected count of a T_max-token response
        t_max = max_completion_length
        # cpu: one count, read back as a float
        count = selection.selected_count(torch.tensor([t_max]), ratio)
        expected = float(count) if count is not None else ratio * t_max
        return t_max / max(expected, 1.0)
    return None


class SelectionPipeline:
    """The selection for a `VEPOTrainer` `host`. `trl_forward` is GRPO's own log-prob forward bound to the host
    (`GRPOTrainer._get_per_token_logps_and_entropies`), the only forward of TRL's the pipeline calls."""

    def __init__(self, host, selection, trl_forward, perturbed: PerturbedPass, *, dropout: bool, noise_step_metric):
        self.host = host
        self.selection = selection
        self.trl_forward = trl_forward
        self.perturbed = perturbed
        self.dropout = dropout  # the policy's training-mode forward is random: the clean side needs its own pass
        self.noise_step_metric = noise_step_metric
        self.rollout: RolloutScoring | None = None
        # Completions whose perturbed forward was skipped: zero advantage, mask irrelevant to the loss
        self.num_skipped_completions = 0
        self._samples_written_at: int | None = None

    @property
    def args(self):
        return self.host.args

    def active(self) -> bool:
        return self.host.model.training or self.args.eval_selection

    def wanted_signals(self) -> set[str]:
        wanted = set(self.selection.signals)
        if self.args.log_selection_diagnostics:
            wanted |= {"jsd", "entropy", "perturbed_entropy"}
        return wanted

    # -- TRL's log-prob forward ----------------------------------------------------------------------------------

    def logprob_forward(self, model, input_ids, attention_mask, logits_to_keep, multimodal, *, scoring, **kwargs):
        """GRPO's log-prob forward with entropies; `scoring`: as in inference (dropout off, no checkpointing)."""
        call = dict(compute_entropy=True, **kwargs, **multimodal)
        if not scoring:
            return self.trl_forward(model, input_ids, attention_mask, logits_to_keep, **call)
        with scoring_mode(model):
            return self.trl_forward(model, input_ids, attention_mask, logits_to_keep, **call)

    def batch_forward(self, model, inputs: dict[str, Any], *, scoring: bool = False, aux: bool = False):
        """The forward of a batch dict, with the arguments `GRPOTrainer._compute_loss` uses: (log-probs, entropies,
        aux)."""
        batch = Batch.of(inputs)
        return self.logprob_forward(
            model, *batch.sequence, batch.completion_length, batch.multimodal, scoring=scoring, compute_aux_loss=aux
        )

    # -- rollout time --------------------------------------------------------------------------------------------

    def trl_scores_at_rollout(self) -> bool:
        """Whether GRPOTrainer runs its no-grad `old_per_token_logps` forward at rollout (its own condition). Only
        then is the policy's first rollout forward that one (otherwise it may be a PEFT reference forward)."""
        host = self.host
        generate_every = self.args.steps_per_generation * host.num_iterations
        return bool(
            self.args.gradient_accumulation_steps % generate_every != 0
            or (host.use_vllm and host.vllm_importance_sampling_correction)
        )

    def begin_rollout(self) -> None:
        active = self.active() and self.selection.needs_signals and self.trl_scores_at_rollout()
        self.rollout = RolloutScoring() if active else None

    def takes_forward(self, model) -> bool:
        """Whether this forward is TRL's rollout-time policy forward, to be scored: the first one of the rollout."""
        return self.rollout is not None and not self.rollout.done and model is self.host.model

    def rollout_forward(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
        compute_aux_loss=False, **multimodal,
    ):  # fmt: skip
        """TRL's rollout-time forward (dropout off), chunk by chunk as TRL runs it, keeping each chunk's clean
        completion states of image responses (on the CPU) and entropies. Returns what TRL asked for."""
        rollout = self.rollout
        rollout.done = True
        if not self.selection.needs_perturbed_pass:
            # Entropy-only strategies read the entropies of TRL's own forward (its slicing knows every VLM layout)
            logps, entropies, aux_loss = self.logprob_forward(
                model, input_ids, attention_mask, logits_to_keep, multimodal, scoring=True,
                batch_size=batch_size, compute_aux_loss=compute_aux_loss,
            )  # fmt: skip
            rollout.signals.append(TokenSignals(entropy=entropies.float(), logp=logps.float()))
            return logps, entropies if compute_entropy else None, aux_loss
        batch_size = batch_size or input_ids.size(0)
        rollout.batch_size = batch_size
        with_image = rows_with_image(multimodal.get("num_images"), multimodal.get("pixel_values"), input_ids)
        completion_valid = attention_mask[:, -logits_to_keep:].bool()
        image_rows = with_image & completion_valid.any(-1)
        logps, entropies, aux_losses = [], [], []
        for start in range(0, input_ids.size(0), batch_size):
            end = min(start + batch_size, input_ids.size(0))
            chunk_inputs = {**multimodal, **_take_rows(multimodal, torch.arange(start, end, device=input_ids.device))}
            with self.perturbed.capture(model) as captured:
                chunk_logps, chunk_entropies, aux = self.logprob_forward(
                    model, input_ids[start:end], attention_mask[start:end], logits_to_keep, chunk_inputs,
                    scoring=True, compute_aux_loss=compute_aux_loss,
                )  # fmt: skip
            logps.append(chunk_logps)
            entropies.append(chunk_entropies)
            aux_losses.append(aux)
            signals = TokenSignals(entropy=chunk_entropies.float(), logp=chunk_logps.float())
            hidden = completion_hidden(captured, logits_to_keep)
            del captured
            valid = completion_valid[start:end]
            if start == 0:
                rollout.cache_bytes = largest_cache_bytes(
                    self.host.accelerator, completion_valid[image_rows].sum(), hidden
                )
                rollout.stream = rollout.cache_bytes > self.args.rollout_cache_gb * 1e9
            if rollout.stream:
                # Scored now, from this chunk's states: memory stays one chunk's, whatever the batch
                chunk = {
                    **chunk_inputs,
                    "prompt_ids": input_ids[start:end, :-logits_to_keep],
                    "prompt_mask": attention_mask[start:end, :-logits_to_keep],
                    "completion_ids": input_ids[start:end, -logits_to_keep:],
                    "completion_mask": attention_mask[start:end, -logits_to_keep:],
                }
                signals = self.perturbed.signals_for_rows(
                    chunk, signals, image_rows[start:end], lambda i, hidden=hidden, valid=valid: hidden[i][valid[i]],
                    batch_size, self.wanted_signals(),
                )  # fmt: skip
                rollout.streamed.extend(image_rows[start:end].tolist())
            else:
                rows = image_rows[start:end].nonzero().squeeze(-1)
                if rows.numel():
                    # Only the valid tokens' states, off the accelerator (a generation batch's worth would not fit),
                    # in one blocking copy per chunk
                    states = hidden[rows][valid[rows]].cpu().split(valid[rows].sum(-1).tolist())
                    for offset, state in zip(rows.tolist(), states):
                        rollout.clean[start + offset] = state
            rollout.signals.append(signals)
        aux_loss = torch.stack(aux_losses).mean() if compute_aux_loss else None
        return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, aux_loss

    def finish_rollout(self, output: dict[str, Any]) -> dict[str, Any]:
        """The mask of a freshly generated batch, where it can be made now (stored under `SELECTION_KEY`), and the
        count scale of token-count-normalised losses (`COUNT_SCALE_KEY`)."""
        rollout, self.rollout = self.rollout, None
        if not self.active():
            return output
        batch = Batch(output)
        mask = batch.loss_mask
        no_rows = torch.zeros_like(mask[:, 0])
        if rollout is not None and rollout.done:
            # Scored with the weights that sampled the batch: clean side from TRL's rollout-time forward, perturbed
            # forwards now (the advantages tell which responses can skip theirs), before any optimiser step
            signals = TokenSignals(
                **{
                    name: torch.cat([getattr(c, name) for c in rollout.signals])
                    for name in rollout.signals[0].computed()
                }
            )
            scored = no_rows
            if rollout.stream:
                # Every image response was scored at its chunk (the advantages did not exist yet: no skip)
                scored = torch.tensor(rollout.streamed, dtype=torch.bool, device=mask.device)
            elif self.selection.needs_perturbed_pass:
                scored = self.rows_to_score(batch)
                # A response TRL's forward saw no valid token of (all masked) has no stored state: nothing to score
                scored &= torch.tensor(
                    [i in rollout.clean for i in range(scored.numel())], dtype=torch.bool, device=scored.device
                )
                signals = self.perturbed.signals_for_rows(
                    batch, signals, scored, rollout.clean.__getitem__, rollout.batch_size, self.wanted_signals()
                )
            output[SELECTION_KEY] = self.select(batch, signals, scored)
            self.log(batch, signals, output[SELECTION_KEY], scored)
            if self.selection.needs_perturbed_pass:
                mode = "train" if self.host.model.training else "eval"
                # The largest process's rollout cache, kept or (streamed) avoided
                self.host._metrics[mode]["vepo/rollout_cache_gb"].append(rollout.cache_bytes / 1e9)
                self.host._metrics[mode]["vepo/rollout_scored_per_chunk"].append(float(rollout.stream))
        elif not self.selection.needs_signals:
            # `full` and `random` need nothing from the model: draw the mask with the rollout
            output[SELECTION_KEY] = self.select(batch, TokenSignals(), no_rows)
            self.log(batch, TokenSignals(), output[SELECTION_KEY], no_rows)
        if self.host.loss_type in TOKEN_COUNT_NORMALISED_LOSSES:
            # These losses divide by the generation batch's valid-token count; L_VEPO's policy term divides by the
            # selected count. Top-k strategies keep a count known from the lengths, before any forward pass.
            if SELECTION_KEY in output:
                selected = output[SELECTION_KEY].sum()
            else:
                selected = self.selection.selected_count(mask.sum(-1), self.args.selection_ratio).sum()
            counts = torch.stack([mask.sum(), selected]).to(device=mask.device, dtype=torch.float64)
            valid_total, selected_total = self.host.accelerator.reduce(counts, reduction="sum").tolist()
            output[COUNT_SCALE_KEY] = torch.tensor(valid_total / max(selected_total, 1.0), device=mask.device)
        return output

    # -- first use -----------------------------------------------------------------------------------------------

    def select_at_first_use(self, model, inputs, forward, captured) -> torch.Tensor:
        """The mask of a slice whose batch TRL did not score at rollout: its first use is still the rollout policy."""
        logps, entropies, _ = forward
        inputs = Batch.of(inputs)
        mask = inputs.loss_mask
        length = inputs.completion_length
        if self.dropout and self.host.model.training:
            # The loss forward is random under dropout: the clean side comes from a dropout-free forward of the whole
            # micro-batch (text-only responses are ranked by its entropies too)
            with torch.no_grad(), self.perturbed.capture(self.host.model) as captured:
                logps, entropies, _ = self.batch_forward(self.host.model, inputs, scoring=True)
        signals = TokenSignals(entropy=entropies.detach().float(), logp=logps.detach().float())
        scored = torch.zeros(mask.size(0), dtype=torch.bool, device=mask.device)
        if self.selection.needs_perturbed_pass:
            scored = self.rows_to_score(inputs)
            hidden = completion_hidden(captured, length)
            valid = inputs.valid
            signals = self.perturbed.signals_for_rows(
                inputs, signals, scored, lambda i: hidden[i][valid[i]], mask.size(0), self.wanted_signals()
            )
        selected = self.select(inputs, signals, scored)
        self.log(inputs, signals, selected, scored)
        return selected

    # -- selection and weights -----------------------------------------------------------------------------------

    def mask_can_matter(self) -> bool:
        """Whether a zero-advantage response's mask can change the loss. Its policy-gradient term is zero for every
        loss type (each scales the advantage), its selected COUNT is known from its length (so the normalisers of
        bnpo / dapo / cispo / vespo stay exact), and the KL term does not read the mask. Only an entropy bonus over
        the selected tokens reads which tokens they are."""
        return self.host.entropy_coef != 0.0 and self.args.entropy_scope == "selected"

    def rows_to_score(self, inputs) -> torch.Tensor:
        """`(B,)` responses that need their own perturbed forward: an image, a valid token, and (unless the loss can
        read their mask, or asked) a non-zero advantage. Counts the skipped ones."""
        inputs = Batch.of(inputs)
        rows = inputs.has_image & inputs.valid.any(-1)
        if not (self.args.score_zero_advantage_rows or self.mask_can_matter()):
            skipped = rows & (inputs["advantages"] == 0)
            self.num_skipped_completions += int(skipped.sum())
            rows = rows & ~skipped
        return rows

    def select(self, inputs, signals: TokenSignals, scored: torch.Tensor) -> torch.Tensor:
        """The `(B, T)` mask from the signals. `scored` `(B,)`: responses that went through the perturbed pass; the
        others are ranked by entropy with the strategy's token count (text-only prompts, zero-advantage rows)."""
        inputs = Batch.of(inputs)
        mask = inputs.loss_mask
        seeds = None
        if self.selection.count == "random":
            token_ids, _ = inputs.sequence
            # The loss mask, not the attention mask: tokens a tool wrote do not make two responses different
            token_mask = torch.cat([inputs["prompt_mask"].bool(), mask], dim=1)
            seeds = row_seeds(token_ids, token_mask, self.args.perturbation_seed, self.host.state.global_step)
        return select_tokens(
            self.selection,
            signals,
            mask,
            ratio=self.args.selection_ratio,
            alpha=self.args.selection_alpha,
            has_image=scored if self.selection.needs_perturbed_pass else None,
            seeds=seeds, params=self.args.strategy_params,
        )  # fmt: skip

    def token_weights(self, inputs) -> torch.Tensor | None:
        """Weights on the policy-gradient term of each token (L_VEPO), or `None` where GRPO's loss is unchanged."""
        if SELECTION_KEY not in inputs or (self.selection.count == "all" and self.args.selection_mode == "mask"):
            return None
        return policy_token_weights(
            inputs[SELECTION_KEY],
            Batch.of(inputs).loss_mask,
            self.host.loss_type,
            mode=self.args.selection_mode,
            bonus=self.args.selection_weight,
            count_scale=count_scale(
                inputs, self.host.loss_type, self.selection, self.args.selection_ratio, self.host.max_completion_length
            ),
        )

    # -- metrics and samples -------------------------------------------------------------------------------------

    def log(self, inputs, signals: TokenSignals, selected: torch.Tensor, scored: torch.Tensor) -> None:
        """`vepo/` metrics of a freshly made mask (one reduction on every process), and the samples due."""
        host = self.host
        mode = "train" if host.model.training else "eval"
        inputs = Batch.of(inputs)
        metrics = selection_metrics(
            signals,
            inputs.loss_mask,
            selected,
            scored,
            inputs.has_image,
            ratio=self.args.selection_ratio,
            alpha=self.args.selection_alpha,
            perturbed_pass=self.selection.needs_perturbed_pass,
            reduce=lambda values: host.accelerator.reduce(values, reduction="sum"),
        )
        if self.selection.needs_perturbed_pass and self.noise_step_metric:
            metrics["vepo/noise_step"] = float(host.current_noise_step())
        for name, value in metrics.items():
            host._metrics[mode][name].append(value)
        every, step = self.args.selection_samples_steps, host.state.global_step
        last = self._samples_written_at
        # Masks are made at rollouts, which need not fall on multiples of `every`: write at the first one due
        due = every and (last is None or step - last >= every) and signals.entropy is not None
        if due and host.model.training and host.accelerator.is_main_process:
            self._samples_written_at = step
            write_selection_samples(host, inputs, signals, selected.bool() & inputs.loss_mask, scored)


def write_selection_samples(host, inputs, signals: TokenSignals, selected, scored) -> None:
    """Append a few of this process's completions, with their signals and selection, to the run's
    `selection_samples.jsonl` (for `vepo-trl inspect --records`). Local to the process: no collective."""
    from .insight.records import records_from_signals, save_records

    args = host.args
    prompts = host.processing_class.batch_decode(
        [ids[mask.bool()] for ids, mask in zip(inputs["prompt_ids"], inputs["prompt_mask"])],
        skip_special_tokens=True,
    )
    records = records_from_signals(
        inputs["completion_ids"],
        host.processing_class,
        signals,
        Batch.of(inputs).loss_mask,
        selected,
        ratio=args.selection_ratio,
        alpha=args.selection_alpha,
        strategy=args.selection_strategy,
        advantages=inputs["advantages"],
        has_image=scored if signals.jsd is not None else None,
        prompts=prompts,
        step=host.state.global_step,
        rows=range(min(args.selection_samples_count, len(prompts))),
        meta={"perturbation": args.perturbation, "noise_step": host.current_noise_step()},
    )
    save_records(os.path.join(args.output_dir, SAMPLES_IN_PROGRESS), records, append=True)


# A run's samples go to the in-progress file and replace `selection_samples.jsonl` when training ends: the file holds
# one run's records, an earlier run's until a new one has finished, and a killed run's never
SAMPLES_FILE = "selection_samples.jsonl"
SAMPLES_IN_PROGRESS = SAMPLES_FILE + ".partial"


class SelectionSamplesFile(TrainerCallback):
    """Keeps `selection_samples.jsonl` to one run: at the start of training the in-progress file keeps only what a
    resumed run already wrote before its checkpoint's step (a fresh run, nothing); at the end it replaces the file."""

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        partial = os.path.join(args.output_dir, SAMPLES_IN_PROGRESS)
        if os.path.exists(partial):
            from .insight.records import load_records, save_records

            kept = [record for record in load_records(partial) if (record.step or 0) < state.global_step]
            save_records(partial + ".tmp", kept)
            os.replace(partial + ".tmp", partial)

    def on_train_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        partial, final = (os.path.join(args.output_dir, name) for name in (SAMPLES_IN_PROGRESS, SAMPLES_FILE))
        if os.path.exists(partial):
            os.replace(partial, final)
        elif os.path.exists(final):
            os.remove(final)  # an earlier run's samples beside this run's model
