"""Each family's tiny model is its reference checkpoint in miniature: the tiny config equals the checkpoint's
`config.json` (recorded with its source as the family module's REFERENCE_CONFIG) on every field but the sizes (widths, depths,
vocabulary and token ids, image size, token budgets), compared through the family's config class as transformers
loads the file. The few fields a tiny model cannot or should not copy are listed in `DEVIATIONS`, each with its
reason; a listed field that no longer differs fails too, so the list stays true."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers

from vepo_trl.builtin.tiny_models import TINY_FAMILIES, build_tiny_config, build_tiny_processor

from .reference_configs import REFERENCE_CONFIGS, SCALED_KEYS, Pattern, is_size_key
from .reference_processors import REAL_PROCESSORS


# Bookkeeping a config.json carries that says nothing about the model
HOUSEKEEPING = {
    "_name_or_path",
    "dtype",
    "torch_dtype",
    "transformers_version",
    "id2label",
    "label2id",
    "return_dict",
    "output_attentions",
    "output_hidden_states",
    "problem_type",
    "chunk_size_feed_forward",
    "is_encoder_decoder",
    "architectures",  # a sub-config's is metadata; the top-level one is checked apart (test below)
}

_TINY_WIDTHS = "a tiny model's random weights need it"
_MROPE = (
    "M-RoPE sections must sum to head_dim / 2 (8 frequencies at the tiny head_dim 16): the checkpoint's proportions "
    "do not divide 8"
)
# (family or "*", dotted path in `config.to_dict()`) -> why the tiny model differs there
DEVIATIONS: dict[tuple[str, str], str] = {
    # TinyModelConfig.initializer_range: at the checkpoints' 0.02 a two-layer random model's next-token
    # distributions are nearly uniform, and entropies and JSDs carry no signal a test can see
    ("*", "initializer_range"): _TINY_WIDTHS,
    ("*", "text_config.initializer_range"): _TINY_WIDTHS,
    ("*", "vision_config.initializer_range"): _TINY_WIDTHS,
    ("qwen3_vl", "text_config.rope_parameters.mrope_section"): _MROPE,
    ("qwen3_vl_moe", "text_config.rope_parameters.mrope_section"): _MROPE,
    ("glm4v", "text_config.rope_parameters.mrope_section"): _MROPE,
    # Two layers hold both kinds only at 1:1 (the checkpoints' 3:1 gives two linear-attention layers)
    ("qwen3_5", "text_config.layer_types"): "at depth 2, 1:1 keeps one layer of each kind",
    ("qwen3_5_moe", "text_config.layer_types"): "at depth 2, 1:1 keeps one layer of each kind",
    # PaliGemma 2's language model is Gemma 2 (logit soft-capping, a hybrid sliding-window cache); the tiny one keeps
    # PaliGemma 1's Gemma: the prefix-LM attention and the processor, which VEPO's paths depend on, are the same
    ("paligemma", "text_config.model_type"): "Gemma 1 text model (PaliGemma 1's); see above",
    # InternVL3's rope (1e6, dynamic x2) is read from sibling checkpoints only; at it the tiny model's two-process
    # FSDP2 run and its one-process run part by 0.017 in tests/test_sharding.py (not yet explained), so it keeps 1e4
    ("internvl", "text_config.rope_parameters.rope_theta"): "sibling-sourced; breaks the FSDP2 equality test",
    ("internvl", "text_config.rope_parameters.rope_type"): "sibling-sourced; breaks the FSDP2 equality test",
    # The file sets no text-level key (the class default is true); the model ties by the top-level key, false as
    # in the file
    ("qwen3_vl_moe", "text_config.tie_word_embeddings"): "the top-level key decides, equal to the file's",
}


def _merge(base: dict, update: dict) -> dict:
    merged = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _patterns(record: dict, prefix: str = "") -> dict[str, Pattern]:
    """Pop the per-layer patterns out of `record` (their length is a depth): dotted path -> `Pattern`."""
    found = {}
    for key in list(record):
        path = f"{prefix}{key}"
        if isinstance(record[key], Pattern):
            found[path] = record.pop(key)
        elif isinstance(record[key], dict):
            found |= _patterns(record[key], path + ".")
    return found


def _leaves(config: dict, prefix: str = ""):
    for key, value in config.items():
        if key in HOUSEKEEPING:
            continue
        if isinstance(value, dict) and value and key not in ("id2label", "label2id"):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", key, value


def _at(config: dict, path: str):
    for part in path.split("."):
        if not isinstance(config, dict) or part not in config:
            return KeyError
        config = config[part]
    return config


def _same(tiny, reference, key: str) -> bool:
    if key in SCALED_KEYS and isinstance(tiny, list) and isinstance(reference, list):
        return [x / sum(tiny) for x in tiny] == [x / sum(reference) for x in reference]
    if isinstance(tiny, (int, float)) and isinstance(reference, (int, float)) and not isinstance(tiny, bool):
        return float(tiny) == float(reference)
    return tiny == reference


def _dashed(family: str) -> str:
    return {"qwen2_5_vl": "qwen2.5-vl", "qwen3_5": "qwen3.5", "qwen3_5_moe": "qwen3.5-moe"}.get(
        family, family.replace("_", "-")
    )


def differences(family: str) -> dict[str, tuple]:
    """Dotted path -> (tiny value, reference value) for every non-size field where the tiny config differs from the
    reference checkpoint's, both as the family's config class holds them. Keys the class does not declare are
    skipped: transformers keeps them on the config and no model reads them."""
    record = REFERENCE_CONFIGS[family]
    config_class = getattr(transformers, REAL_PROCESSORS[_dashed(family)].config)
    values = _merge(_merge(record.get("implied", {}), record.get("family", {})), record["config"])
    patterns = _patterns(values)
    reference = config_class(**values).to_dict()
    declared = config_class().to_dict()
    tiny = build_tiny_config(_dashed(family), build_tiny_processor(_dashed(family))).to_dict()
    unsourced = [entry.replace("rope_theta", "rope_parameters.rope_theta") for entry in record.get("unsourced", [])]
    found = {}
    for path, key, value in _leaves(reference):
        if is_size_key(key) or key == "layer_types" or path.endswith("rope_parameters.type"):
            continue
        if any(path == entry or path.startswith(entry + ".") for entry in unsourced):
            continue  # no public copy of the file showed it: the class default stands in, not a reference
        mine = _at(tiny, path)
        if mine is KeyError and _at(declared, path) is KeyError:
            continue
        if not _same(mine, value, key):
            found[path] = (mine, value)
    for path, pattern in patterns.items():
        mine = _at(tiny, path)
        if mine is KeyError or mine != pattern.expand(len(mine)):
            found[path] = (mine, pattern)
    return found


def _allowed(family: str, path: str) -> bool:
    return (family, path) in DEVIATIONS or ("*", path) in DEVIATIONS


FAMILIES = sorted(REFERENCE_CONFIGS)


def test_every_tiny_family_has_a_reference_config():
    assert sorted(_dashed(family) for family in FAMILIES) == sorted(TINY_FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_config_is_the_checkpoint_in_miniature(family):
    found = differences(family)
    unexplained = {path: pair for path, pair in found.items() if not _allowed(family, path)}
    assert unexplained == {}
    stale = [path for (name, path) in DEVIATIONS if name == family and path not in found]
    assert stale == []


def test_the_checkpoints_choices_named_in_the_issue():
    """Gemma 3 without SigLIP's pooling head (TRL's own test finds its weights never train otherwise), the LLaVA
    family on the second-to-last CLIP layer, as the checkpoints."""
    gemma = build_tiny_config("gemma3", build_tiny_processor("gemma3"))
    assert gemma.vision_config.vision_use_head is False
    for family in ("llava", "llava-next"):
        assert build_tiny_config(family, build_tiny_processor(family)).vision_feature_layer == -2


def test_the_comparison_sees_a_difference():
    record = REFERENCE_CONFIGS["llava"]["config"]
    assert record["vision_feature_layer"] == -2
    assert _same([24, 20, 20], [6, 5, 5], "mrope_section") and not _same([2, 3, 3], [6, 5, 5], "mrope_section")


@pytest.mark.parametrize("family", ["llava", "llava-next", "llava-onevision"])
def test_llava_folders_keep_the_hub_checkpoints_key_names(family, tmp_path):
    """Saved as the Hub checkpoints name their weights (`vision_tower.vision_model.*`, `language_model.model.*`: what
    vLLM loads), and read back by transformers unchanged. transformers 5 restores the names it renames at load only
    for a model it loaded; the recipe's `finish` gives a built one the same mapping."""
    from safetensors import safe_open
    from transformers import AutoModelForImageTextToText

    from vepo_trl.builtin.tiny_models import build_tiny

    model, processor = build_tiny(family)
    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as weights:
        keys = list(weights.keys())
    assert any(key.startswith("vision_tower.vision_model.") for key in keys)
    assert any(key.startswith("language_model.model.") for key in keys)
    assert not any(key.startswith("vision_tower.embeddings") for key in keys)
    loaded = AutoModelForImageTextToText.from_pretrained(tmp_path)
    mine = model.state_dict()
    assert {name: tensor.shape for name, tensor in loaded.state_dict().items()} == {
        name: tensor.shape for name, tensor in mine.items()
    }
    assert all(torch.equal(tensor, mine[name]) for name, tensor in loaded.state_dict().items())
