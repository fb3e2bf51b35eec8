"""Weight syncs to vLLM under the checkpoint's names (`vepo_trl.trl_compat.vllm_sync`): TRL 1.16's own sync
(`VLLMGeneration._iter_named_params`, the engine left out) names the weights as transformers 5 holds them in memory,
which for nine families are not the names of the folder vLLM loaded; with the patch every name is the folder's (the
keys of its safetensors files), for every family, plain and under PEFT, but fused MoE experts, which keep TRL's name;
a TRL that already sends the folder's names is left alone."""

from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from safetensors.torch import load_file
from transformers import AutoModelForImageTextToText
from trl.distributed import DistributedBackend
from trl.generation.vllm_generation import VLLMGeneration

from vepo_trl.builtin.tiny_models import TINY_FAMILIES
from vepo_trl.trl_compat.vllm_sync import checkpoint_names, sync_under_checkpoint_names


# transformers 5 keeps these families' weights under other names than their checkpoints (its conversion_mapping:
# LLaVA's `vision_tower.vision_model.*` is `model.vision_tower.*` in memory, Qwen2-VL's `visual.*` is `model.visual.*`)
RENAMED_IN_MEMORY = {
    "qwen2-vl", "qwen2.5-vl", "gemma3", "llava", "llava-next", "llava-onevision", "paligemma", "internvl", "mistral3",
}  # fmt: skip
# Qwen3.5-MoE's experts are one fused tensor in memory and one per expert on disk: a single tensor cannot go under the
# per-expert names, so those keep TRL's name (vLLM's loader takes the fused form)
FUSED_IN_MEMORY = {"qwen3.5-moe": 4}


def keys_on_disk(folder) -> set[str]:
    return {key for file in Path(folder).glob("*.safetensors") for key in load_file(file)}


def trl_sync_names(model, patched: bool) -> list[str]:
    """The names TRL 1.16's sync streams the weights under (colocate and server alike), the engine left out."""
    generation = VLLMGeneration.__new__(VLLMGeneration)  # __init__ would start the engine
    generation.model, generation.accelerator = model, Accelerator(cpu=True)
    generation._dist = DistributedBackend(generation.accelerator)
    if patched:
        sync_under_checkpoint_names(generation, model)
    return [name for name, _ in generation._iter_named_params()]


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_trls_sync_names_are_not_the_checkpoints_and_ours_are(tiny_dirs, family):
    folder = tiny_dirs[family]
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    disk = keys_on_disk(folder)
    trl_names, ours = trl_sync_names(model, patched=False), trl_sync_names(model, patched=True)
    assert len(ours) == len(trl_names) == len(list(model.parameters()))
    # upstream: TRL names the weights as they are in memory, not as the folder vLLM loaded holds them
    assert (not set(trl_names) <= disk) == (family in RENAMED_IN_MEMORY or family in FUSED_IN_MEMORY)
    # ours: the folder's names, but for fused tensors, which keep TRL's
    assert len(set(ours) - disk) == FUSED_IN_MEMORY.get(family, 0)
    assert set(ours) - disk <= set(trl_names)
    assert bool(checkpoint_names(model)) == (family in RENAMED_IN_MEMORY)


def test_under_peft_the_merged_weights_go_under_the_checkpoints_names(tiny_dirs):
    """TRL's PEFT path merges the adapter and strips PEFT's prefixes; the names left are the base model's in memory."""
    from peft import LoraConfig, get_peft_model

    folder = tiny_dirs["llava"]
    model = get_peft_model(
        AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32),
        LoraConfig(r=2, target_modules=["q_proj", "v_proj"]),
    )
    assert set(trl_sync_names(model, patched=True)) == keys_on_disk(folder)
    assert not set(trl_sync_names(model, patched=False)) & keys_on_disk(folder)


def test_inert_once_trl_sends_the_checkpoints_names(tiny_dirs):
    """A TRL whose own naming already gives the folder's names: the patch passes them through unchanged (renaming a
    name on disk again would break it: LLaVA's reversed renames are not idempotent)."""
    folder = tiny_dirs["llava"]
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    disk = keys_on_disk(folder)
    # the folder's names in the order of the parameters: its safetensors keys, matched by the tensors' values
    state = {key: tensor for file in Path(folder).glob("*.safetensors") for key, tensor in load_file(file).items()}
    on_disk = {}
    for name, param in model.named_parameters():
        keys = [k for k, t in state.items() if t.shape == param.shape and torch.equal(t, param.detach())]
        if len(keys) == 1:
            on_disk[name] = keys[0]
    assert len(on_disk) > len(disk) // 2  # most tensors are unique (norms and zero biases are not)

    class FixedTRL:
        def _fix_param_name_to_vllm(self, name, extra_prefixes=None):
            return on_disk.get(name, name)

    generation = FixedTRL()
    assert sync_under_checkpoint_names(generation, model)
    for name, key in on_disk.items():
        assert generation._fix_param_name_to_vllm(name) == key


def test_a_quantizers_loading_step_renames_nothing(tiny_dirs):
    """A pre-quantized checkpoint (bitsandbytes 4-bit) adds a load-time step with no reverse (`Bnb4bitDeserialize`
    raises NotImplementedError on `reverse_op`): the names are the model's renames alone, and nothing raises."""
    from transformers.core_model_loading import ConversionOps, WeightConverter

    class Deserialize(ConversionOps):  # as transformers.integrations.bitsandbytes.Bnb4bitDeserialize: no reverse_op
        def convert(self, input_dict, source_patterns, target_patterns, **kwargs):
            return input_dict

    model = AutoModelForImageTextToText.from_pretrained(tiny_dirs["llava"], dtype=torch.float32)
    expected = checkpoint_names(model)
    model._weight_conversions = [
        *model._weight_conversions,
        WeightConverter(["weight.absmax", "weight.quant_map"], "weight", operations=[Deserialize()]),
    ]
    with pytest.raises(NotImplementedError):
        model._weight_conversions[-1].reverse_transform()
    assert checkpoint_names(model) == expected and len(expected) == 64


def test_a_trl_without_the_naming_hook_is_left_as_it_is(tiny_dirs):
    model = AutoModelForImageTextToText.from_pretrained(tiny_dirs["llava"], dtype=torch.float32)
    assert not sync_under_checkpoint_names(object(), model)
