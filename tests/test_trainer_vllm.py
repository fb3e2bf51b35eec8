"""TRL's `use_vllm=True` paths, colocate and server mode, importance-sampling correction on and off, end to end on the
CPU against the vLLM stand-in (tests/vllm_standin): VEPO trains, each mask made at rollout time equals the mask of the
same batch scored at first use with the rollout weights, and the stand-in sampled with the weights TRL pushed."""

import copy
import math

import pytest
import torch

from vepo_trl.trainer import SELECTION_KEY

from . import vllm_standin
from .support import clone_inputs, make_trainer, mask_with_weights, mixed_rows


@pytest.fixture(scope="module")
def vllm_server(tiny_model_dir):
    """The stand-in installed as vLLM for this module, and its server (for server mode) on 127.0.0.1."""
    with vllm_standin.installed(), vllm_standin.server(tiny_model_dir) as server:
        yield server


def _record_rollouts_and_uses(trainer):
    """Spies: each rollout's output and the weights (and step) it was sampled with; each loss slice's inputs."""
    rollouts, uses = [], []
    generate = trainer._generate_and_score_completions
    compute_loss = trainer.compute_loss

    def recording_generate(inputs):
        weights = (copy.deepcopy(trainer.model.state_dict()), trainer.state.global_step)
        output = generate(inputs)
        rollouts.append((weights, {k: v.clone() if torch.is_tensor(v) else v for k, v in output.items()}))
        return output

    def recording_compute_loss(model, inputs, *args, **kwargs):
        uses.append((len(rollouts) - 1, clone_inputs(inputs)))
        return compute_loss(model, inputs, *args, **kwargs)

    trainer._generate_and_score_completions = recording_generate
    trainer.compute_loss = recording_compute_loss
    return rollouts, uses


@pytest.mark.parametrize("correction", [True, False], ids=["is_correction", "no_correction"])
@pytest.mark.parametrize("mode", ["colocate", "server"])
def test_vepo_trains_on_vllm(vllm_server, tiny_model_dir, visual_dataset, tmp_path, mode, correction):
    settings = {
        "use_vllm": True,
        "vllm_mode": mode,
        "vllm_importance_sampling_correction": correction,
        # TRL runs its rollout-time policy forward for the correction alone; without it, two optimiser steps per
        # generation make it run: VEPO scores at rollout in all four cases
        "steps_per_generation": 1 if correction else 2,
        "max_steps": 2,
        "learning_rate": 0.5,  # every step moves the tiny model: a mask or a sample from stale weights would show
        "score_zero_advantage_rows": True,  # the first-use reference below scores every response too
    }
    if mode == "server":
        settings.update(vllm_server_base_url=vllm_server.url, vllm_group_port=vllm_standin.free_port())
    else:
        settings["vllm_enable_sleep_mode"] = correction  # TRL's sleep / wake-up calls, in one of the two runs
    trainer = make_trainer(tiny_model_dir, visual_dataset, tmp_path, **settings)
    if mode == "server":
        engine, syncs_before = vllm_server.engine, len(vllm_server.weight_updates)
        calls_before = len(vllm_server.calls)
    else:
        import vllm

        llm = vllm.LLM.instances[-1]
        engine, syncs_before = llm.engine, 0
        assert llm.kwargs["model"] == tiny_model_dir and llm.kwargs["logprobs_mode"] == "processed_logprobs"
    rollouts, uses = _record_rollouts_and_uses(trainer)
    trainer.train()

    assert trainer.state.global_step == 2
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)
    assert len(rollouts) == (2 if correction else 1) and len(uses) == 2

    # The stand-in sampled with the weights TRL pushed before each rollout, each under the checkpoint folder's name
    # (trl_compat.vllm_sync): its log-probs are the policy's
    names = set(engine.checkpoint_names)
    assert len(names) == len(list(trainer.model.parameters()))
    if mode == "server":
        syncs = vllm_server.weight_updates[syncs_before:]
        assert [set(sync) for sync in syncs] == [names] * len(rollouts)
    else:
        assert len(engine.weight_loads) == len(rollouts) * len(names)  # colocate loads one tensor per call
        assert {name for load in engine.weight_loads for name in load} == names
    if not engine.stale:  # (sleep level 2 discarded them after the last rollout)
        last_weights = rollouts[-1][0][0]
        for name, param in engine.model.named_parameters():
            assert torch.equal(param, last_weights[name]), name
    for (_, step), output in rollouts:
        mask = output["completion_mask"].bool()
        assert SELECTION_KEY in output, f"rollout at step {step}: VEPO did not score TRL's rollout-time forward"
        gap = (output["old_per_token_logps"] - output["sampling_per_token_logps"])[mask]
        assert gap.abs().max() < 1e-4, f"rollout at step {step}: the stand-in sampled with other weights"
        if correction:
            ratio = output["importance_sampling_ratio"]
            torch.testing.assert_close(ratio, torch.ones_like(ratio), rtol=0, atol=1e-4)
        else:
            assert "importance_sampling_ratio" not in output

    # Each slice's mask, made at rollout time, is the mask the first-use path gives that slice with the rollout weights
    for rollout, inputs in uses:
        expected = mask_with_weights(trainer, inputs, *rollouts[rollout][0])
        assert torch.equal(inputs[SELECTION_KEY], expected)

    if mode == "colocate" and correction:  # sleep mode: level 2 drops the weights; TRL pushes them again each time
        # After each sync the prefix cache, then the encoder cache (trl#7198: TRL resets only the first)
        rollout_calls = [("wake_up", ("weights",)), ("reset_prefix_cache", None), ("reset_encoder_cache", None)]
        rollout_calls += [("wake_up", ("kv_cache",))]
        rollout_calls += [("generate", 4), ("sleep", 2)]
        assert llm.calls == [("sleep", 2)] + rollout_calls * len(rollouts)
    if mode == "server":
        # After each sync, the prefix cache and then the encoder cache are reset (trl#7198: TRL resets only the first)
        calls = vllm_server.calls[calls_before:]
        resets = [
            call for call in calls if call in ("/finish_weight_update", "/reset_prefix_cache", "/reset_encoder_cache")
        ]
        assert resets == ["/finish_weight_update", "/reset_prefix_cache", "/reset_encoder_cache"] * len(rollouts)
        assert vllm_server.calls.count("/init_weight_transfer_engine") >= 1
        assert "/inference/v1/generate" in vllm_server.calls  # image prompts: token ids with the images' features


@pytest.mark.parametrize(
    "mode,rows", [("colocate", "mixed"), ("server", "mixed"), ("server", "text_only")], ids=lambda value: value
)
def test_text_only_rows_on_vllm(vllm_server, tiny_model_dir, visual_dataset, tmp_path, mode, rows):
    """Text-only prompts beside image prompts (server: the text rows' features are None), or alone (server: TRL
    sends token ids to /v1/completions): VEPO scores at rollout and trains."""
    dataset = mixed_rows(visual_dataset)
    dataset = dataset if rows == "mixed" else dataset.select(range(0, 8, 2))
    settings = {"vllm_server_base_url": vllm_server.url, "vllm_group_port": vllm_standin.free_port()}
    trainer = make_trainer(
        tiny_model_dir,
        dataset,
        tmp_path,
        use_vllm=True,
        vllm_mode=mode,
        vllm_importance_sampling_correction=True,
        per_device_train_batch_size=8 if rows == "mixed" else 4,
        num_generations=2,
        shuffle_dataset=False,
        max_steps=1,
        **(settings if mode == "server" else {}),
    )
    calls_before = len(vllm_server.calls)
    rollouts, _ = _record_rollouts_and_uses(trainer)
    trainer.train()
    ((_, output),) = rollouts
    with_image = torch.tensor([n > 0 for n in output["num_images"]]) if "num_images" in output else None
    if rows == "mixed":
        assert with_image.any() and not with_image.all()
    else:
        assert with_image is None or not with_image.any()
    assert SELECTION_KEY in output
    ratio = output["importance_sampling_ratio"]
    torch.testing.assert_close(ratio, torch.ones_like(ratio), rtol=0, atol=1e-4)
    if mode == "server":
        route = "/inference/v1/generate" if rows == "mixed" else "/v1/completions"
        assert route in vllm_server.calls[calls_before:]


def test_stand_in_refuses_what_vllm_would(vllm_server, tiny_model_dir):
    """The stand-in fails loudly where a real engine would misbehave: a weight name it does not have, generating
    after sleep(level=2) without the weights pushed again."""
    import vllm

    llm = vllm.LLM(model=tiny_model_dir, enable_sleep_mode=True)
    with pytest.raises(KeyError, match="no parameter named"):
        llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights([("lm_head.bias", torch.zeros(1))])
    llm.sleep(level=2)
    llm.wake_up(tags=["kv_cache", "weights"])
    with pytest.raises(RuntimeError, match="discarded weights"):
        llm.generate([{"prompt_token_ids": [1, 2, 3]}], vllm.SamplingParams(max_tokens=2))
