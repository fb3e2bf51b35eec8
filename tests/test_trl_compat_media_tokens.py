"""No media token is ever sampled (`trl_compat.media_tokens`): a tiny model made to favour its media tokens (a large
bias on their LM-head rows, as a drifting policy can) trains with none in any completion, on every family; TRL's own
trainer samples the ones it does not ban; the trainer's log-probs of the distribution vLLM samples equal a plain
masked softmax; a completion that holds one anyway is kept out of the loss and counted."""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor
from trl import GRPOTrainer
from trl.trainer.utils import add_fused_lm_head

from vepo_trl import VEPOConfig
from vepo_trl.data import synthetic_training_dataset
from vepo_trl.families import banned_token_ids, get_family, trainable_families
from vepo_trl.trl_compat.media_tokens import (
    MEDIA_BIAS,
    MEDIA_ROWS_METRIC,
    merge_generation_kwargs,
    renormalised_without_media,
    scrub_media_rows,
)

from .support import VEPOTrainer, alternating_reward, make_config, record_rollouts


@pytest.fixture(scope="module")
def dataset():
    return synthetic_training_dataset(4, seed=0)


def favouring(model_dir, tokens: list[int], bias: float = 12.0):
    """The tiny model with its LM head given a bias of `bias` on `tokens` (likelier than all the rest together)."""
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    head = model.get_output_embeddings()
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        biased.weight.copy_(head.weight)
        biased.bias.zero_()
        biased.bias[tokens] = bias
    model.config.tie_word_embeddings = False
    model.config.get_text_config().tie_word_embeddings = False
    model.set_output_embeddings(biased)
    return model


def run(trainer_cls, model, processor, dataset, tmp_path, **overrides):
    settings = {"max_completion_length": 8, "max_steps": 1, "per_device_train_batch_size": 4, "num_generations": 2}
    from trl import GRPOConfig

    args = make_config(tmp_path, GRPOConfig if trainer_cls is GRPOTrainer else VEPOConfig, **{**settings, **overrides})
    trainer = trainer_cls(
        model=model, reward_funcs=alternating_reward, args=args, train_dataset=dataset, processing_class=processor
    )
    rollouts = record_rollouts(trainer, clone=True)
    trainer.train()
    return trainer, rollouts


def sampled(rollouts) -> set[int]:
    return {int(t) for out in rollouts for t in out["completion_ids"][out["completion_mask"].bool()]}


def test_merge_keeps_the_users_own_kwargs():
    assert merge_generation_kwargs({"suppress_tokens": [5], "top_k": 3}, [7, 5], "transformers") == {
        "suppress_tokens": [5, 7],
        "top_k": 3,
    }
    merged = merge_generation_kwargs({"logit_bias": {"9": 2.0, "7": 50.0}, "seed": 1}, [7], "vllm")
    assert merged == {"logit_bias": {9: 2.0, 7: MEDIA_BIAS}, "seed": 1}  # ours wins on a media id
    assert merge_generation_kwargs(None, [], "vllm") == {}


def test_scrub_replaces_and_reports_rows():
    scrubbed, held = scrub_media_rows([[1, 2, 3], [4, 9, 9, 5], []], [9], pad=0)
    assert scrubbed == [[1, 2, 3], [4, 0, 0, 5], []] and held == [False, True, False]
    # A tool's response (tool_mask 0) keeps the placeholders of the tool's images: only sampled tokens count
    scrubbed, held = scrub_media_rows([[4, 9, 9, 5], [9, 1]], [9], pad=0, sampled=[[1, 0, 0, 1], [1, 1]])
    assert scrubbed == [[4, 9, 9, 5], [0, 1]] and held == [False, True]


def test_each_family_declares_media_tokens_its_tokenizer_holds(tiny_dirs):
    """Every declared token is one of the family's tokenizer (its tiny one mirrors the checkpoint's), and the config's
    own placeholder ids are among the banned ones."""
    for name in trainable_families():
        family = get_family(name)
        processor = AutoProcessor.from_pretrained(tiny_dirs[name])
        vocab = processor.tokenizer.get_vocab()
        missing = [token for token in family.media_tokens if token not in vocab]
        assert family.media_tokens and not missing, (name, missing)
        model = AutoModelForImageTextToText.from_pretrained(tiny_dirs[name])
        ids = banned_token_ids(model.config, processor)
        assert {vocab[t] for t in family.media_tokens} <= set(ids)
        image_id = getattr(model.config, "image_token_id", getattr(model.config, "image_token_index", None))
        assert image_id in ids


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_renormalised_log_probs_and_entropies_are_the_masked_softmax(tiny_model_dir, temperature):
    """The fused head's log-probs and entropies, renormalised without the media tokens, equal a plain softmax over the
    full logits with those columns removed (a model drifted toward them: their mass about half the distribution). From
    the fp32 log-probs alone, so the error grows as 1e-7 / (1 - P) where the media mass P nears 1."""
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    model = favouring(tiny_model_dir, [])
    ids = banned_token_ids(model.config, processor)
    with torch.no_grad():
        model.get_output_embeddings().bias[ids] = torch.linspace(4.0, 6.0, len(ids))
    input_ids = torch.randint(0, 200, (2, 12), generator=torch.Generator().manual_seed(0))
    input_ids[0, 7] = ids[0]  # a label that is itself a media token stays finite
    attention = torch.ones_like(input_ids)
    labels = input_ids.clone()
    labels[:, :4] = -100
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1].float() / temperature
    keep = torch.ones(logits.size(-1), dtype=torch.bool)
    keep[ids] = False
    masked = logits.masked_fill(~keep, float("-inf")).log_softmax(-1)
    target = labels[:, 1:]
    valid = (target != -100) & keep[target.clamp(min=0)]
    expected_logp = masked.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    probs = masked.exp()
    expected_entropy = -(probs * masked.masked_fill(~keep, 0.0)).sum(-1)
    full_media = logits.log_softmax(-1)[..., ids].exp().sum(-1)
    assert full_media.mean() > 0.4  # the drift the correction undoes

    add_fused_lm_head(model, temperature=temperature, outputs=("log_probs", "entropy"))
    assert renormalised_without_media(model, ids, temperature)
    assert not renormalised_without_media(model, ids, temperature)  # once
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=attention, labels=labels, fused_lm_head=True)
    assert torch.isfinite(out.log_probs).all() and torch.isfinite(out.entropy).all()  # a media label included
    torch.testing.assert_close(out.log_probs[valid], expected_logp[valid], atol=1e-5, rtol=1e-5)
    rows = target != -100
    # (the kernel's fp32 entropy error is divided by 1 - P, here down to 0.08: 1e-4 relative)
    torch.testing.assert_close(out.entropy[rows], expected_entropy[rows], atol=0, rtol=1e-4)
    # Generation (no fused head) is untouched
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=input_ids, attention_mask=attention).logits[:, :-1] / temperature,
                                   logits)  # fmt: skip


def test_trls_own_trainer_samples_media_tokens_and_ours_never_trains_on_one(tiny_model_dir, dataset, tmp_path):
    """Favouring `<|vision_start|>` (and the other media tokens but the image pad, which TRL 1.16 bans): GRPOTrainer
    samples them and trains on them as text; VEPOTrainer's completions hold none. When TRL bans them all, the first
    assertion fails: the merge below then only repeats TRL's own ban."""
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    ids = banned_token_ids(AutoModelForImageTextToText.from_pretrained(tiny_model_dir).config, processor)
    image_pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    drift = [i for i in ids if i != image_pad]
    _, theirs = run(GRPOTrainer, favouring(tiny_model_dir, drift), processor, dataset, tmp_path / "grpo")
    assert sampled(theirs) & set(drift)
    trainer, ours = run(VEPOTrainer, favouring(tiny_model_dir, ids), processor, dataset, tmp_path / "vepo")
    assert trainer.state.global_step == 1 and not sampled(ours) & set(ids)
    assert trainer.state.log_history[0][MEDIA_ROWS_METRIC] == 0


@pytest.mark.parametrize("family", trainable_families())
def test_a_model_favouring_its_media_tokens_trains_without_sampling_one(tiny_dirs, dataset, tmp_path, family):
    processor = AutoProcessor.from_pretrained(tiny_dirs[family])
    ids = banned_token_ids(AutoModelForImageTextToText.from_pretrained(tiny_dirs[family]).config, processor)
    trainer, rollouts = run(VEPOTrainer, favouring(tiny_dirs[family], ids), processor, dataset, tmp_path)
    assert trainer.state.global_step == 1
    assert not sampled(rollouts) & set(ids)
    assert set(ids) <= set(trainer.generation_config.suppress_tokens)


def test_a_completion_holding_a_media_token_is_kept_out_of_the_loss(tiny_model_dir, dataset, tmp_path, monkeypatch):
    """A rollout path that lets one through (here: the first completion of each rollout gets an image pad, as a
    user's rollout_func could): the step runs (no image-token mismatch), the row's loss mask is zero, counted."""
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    image_pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    args = make_config(
        tmp_path, max_completion_length=8, max_steps=1, per_device_train_batch_size=4, num_generations=2
    )
    trainer = VEPOTrainer(
        model=model, reward_funcs=alternating_reward, args=args, train_dataset=dataset, processing_class=processor
    )
    single_turn = trainer._generate_single_turn

    def leaking(*a, **k):
        completion_ids, logprobs = single_turn(*a, **k)
        completion_ids[0] = [image_pad, image_pad] + list(completion_ids[0])[2:]
        return completion_ids, logprobs

    monkeypatch.setattr(trainer, "_generate_single_turn", leaking)
    rollouts = record_rollouts(trainer, clone=True)
    trainer.train()
    (output,) = rollouts
    assert trainer.state.global_step == 1
    assert trainer.state.log_history[0][MEDIA_ROWS_METRIC] == 1
    assert image_pad not in output["completion_ids"].tolist()[0]
    loss_mask = output["completion_mask"] * output["tool_mask"]
    assert loss_mask[0].sum() == 0 and loss_mask[1:].sum() > 0


def test_inspect_and_eval_generation_never_sample_one(tiny_model_dir, dataset):
    """`inspect` / `analyze` sample rollouts (`insight.signals.sample_completions`) and `eval`'s transformers back end
    decodes greedily, each on a model whose likeliest tokens are its media tokens: none in any completion (they
    suppressed the config's image and video ids alone: `<|vision_start|>` was sampled)."""
    from vepo_trl.eval.generate import TransformersGenerator
    from vepo_trl.insight.signals import encode_prompt, sample_completions

    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    model = favouring(tiny_model_dir, [])
    ids = banned_token_ids(model.config, processor)
    with torch.no_grad():
        model.get_output_embeddings().bias[ids] = 12.0
    row = dataset[0]
    prompt = encode_prompt(processor, row["prompt"], row["images"])
    completions = sample_completions(model, processor, prompt, 4, max_new_tokens=8, seed=0)
    assert completions and not {t for ids_ in completions for t in ids_} & set(ids)
    generator = TransformersGenerator(model, processor, max_new_tokens=8)
    text = processor.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
    captured = []
    generate = model.generate

    def recording(*args, **kwargs):
        output = generate(*args, **kwargs)
        captured.append(output[:, kwargs["input_ids"].shape[1] :])
        return output

    model.generate = recording
    generator.generate([text], [list(row["images"])])
    assert captured[0].numel() and not set(captured[0].flatten().tolist()) & set(ids)


MEDIA_RANKS = Path(__file__).resolve().parent / "distributed" / "media_ranks.py"


def _media_ranks(output, model_dir, mode, processes="2", rank=None):
    import os
    import subprocess
    import sys

    from .support import REPO, free_port

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    if mode == "none":
        command = [sys.executable, str(MEDIA_RANKS), str(output), model_dir, mode]
        env["VEPO_RANK"] = str(rank)
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", processes, "--master_port",
                   str(free_port()), str(MEDIA_RANKS), str(output), model_dir, mode]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fsdp1", "fsdp2"])
def test_renormalisation_under_sharded_weights_equals_the_unsharded_model(tmp_path, tiny_model_dir, mode):
    """Two processes, the model sharded by FSDP1 / FSDP2, each scoring its own image prompt, forward and backward: the renormalised log-probs and entropies equal the unsharded model's on the same batch."""
    import json

    reference = []
    for rank in (0, 1):
        _media_ranks(tmp_path, tiny_model_dir, "none", rank=rank)
        reference.append(json.loads((tmp_path / f"report-{rank}.json").read_text()))
    _media_ranks(tmp_path, tiny_model_dir, mode)
    for sharded, single in zip(json.loads((tmp_path / "report.json").read_text()), reference, strict=True):
        assert sharded["rank"] == single["rank"]
        torch.testing.assert_close(torch.tensor(sharded["log_probs"]), torch.tensor(single["log_probs"]), atol=1e-5,
                                   rtol=1e-5)  # fmt: skip
        torch.testing.assert_close(torch.tensor(sharded["entropies"]), torch.tensor(single["entropies"]), atol=1e-5,
                                   rtol=1e-5)  # fmt: skip


def test_a_users_own_generation_kwargs_are_merged_not_replaced(tiny_model_dir, dataset, tmp_path):
    """`generation_kwargs` with the user's own `suppress_tokens` and sampling settings: both kept, the ban added."""
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    args = make_config(tmp_path, generation_kwargs={"suppress_tokens": [5], "top_k": 3})
    trainer = VEPOTrainer(
        model=tiny_model_dir, reward_funcs=alternating_reward, args=args, train_dataset=dataset,
        processing_class=processor,
    )  # fmt: skip
    banned = banned_token_ids(trainer.model.config, processor)
    assert set(trainer.generation_config.suppress_tokens) == {5, *banned}
    assert trainer.generation_config.top_k == 3 and trainer.generation_kwargs["top_k"] == 3
