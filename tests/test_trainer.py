"""VEPOTrainer on the tiny Qwen2.5-VL: equivalence with GRPO, the loss over selected tokens, one perturbed forward per
completion, every strategy end to end, PEFT and frozen towers, and per-response independence of the mask."""

import pytest
import torch
from transformers import AutoModelForImageTextToText
from trl import GRPOConfig, GRPOTrainer

from vepo_trl import VEPOTrainer
from vepo_trl.scoring import SELECTION_STRATEGIES, top_k_mask
from vepo_trl.trainer import COUNT_SCALE_KEY, SELECTION_KEY

from .support import clone_inputs, first_batch, length_reward, make_config, make_trainer, mixed_rows


def trainable_snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


# ---------------------------------------------------------------------------------------------------------------------
# Equivalence with GRPO and the loss over the selected tokens
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"])
def test_full_strategy_loss_equals_grpo(tiny_model_dir, visual_dataset, tmp_path, loss_type):
    vepo = make_trainer(tiny_model_dir, visual_dataset, tmp_path, selection_strategy="full", loss_type=loss_type)
    grpo = make_trainer(tiny_model_dir, visual_dataset, tmp_path, GRPOTrainer, loss_type=loss_type)
    grpo.model.load_state_dict(vepo.model.state_dict())
    grpo.model.train()
    grpo.current_gradient_accumulation_steps = 1
    inputs = first_batch(vepo)
    grpo_inputs = {k: v for k, v in clone_inputs(inputs).items() if k != SELECTION_KEY}
    vepo_loss = vepo.compute_loss(vepo.model, inputs)
    grpo_loss = grpo.compute_loss(grpo.model, grpo_inputs)
    assert torch.equal(vepo_loss, grpo_loss)


def _loss_and_logp_grad(trainer, inputs):
    """The loss and the gradient of the loss with respect to the per-token log-probabilities of the policy."""
    captured = {}
    forward = trainer._forward

    def spy(model, inputs):
        logps, entropies, aux = forward(model, inputs)
        if logps.requires_grad:
            logps.retain_grad()
            captured["logps"] = logps
        return logps, entropies, aux

    trainer._forward = spy
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    trainer._forward = forward
    return loss, captured["logps"].grad


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo"])
def test_gradient_is_zero_off_mask_and_normalised_by_selected_count(
    tiny_model_dir, visual_dataset, tmp_path, loss_type
):
    trainer = make_trainer(tiny_model_dir, visual_dataset, tmp_path, loss_type=loss_type)
    inputs = first_batch(trainer)
    _, grad = _loss_and_logp_grad(trainer, inputs)
    selected = inputs[SELECTION_KEY]
    valid = inputs["completion_mask"].bool()
    assert selected.any() and (selected <= valid).all()
    # Tokens outside the selection get exactly zero policy gradient
    assert torch.count_nonzero(grad[~selected]) == 0
    # First iteration: ratio = 1, inside the clip range, so d loss / d logp_t = -A_b * C_t / denominator, where the
    # denominator is the selected-token count (per response for grpo, per batch for bnpo, per generation batch for dapo)
    advantages = inputs["advantages"].unsqueeze(1).expand_as(grad)
    if loss_type == "grpo":
        expected = -advantages / selected.sum(-1, keepdim=True) / selected.shape[0]
    elif loss_type == "bnpo":
        expected = -advantages / selected.sum()
    else:
        # One process, one micro-batch per generation: the generation batch's selected count is this batch's
        assert inputs[COUNT_SCALE_KEY] == valid.sum() / selected.sum()
        expected = -advantages / selected.sum()
    torch.testing.assert_close(grad[selected], expected[selected], rtol=1e-5, atol=1e-7)


def test_dapo_normaliser_counts_selected_tokens_of_the_generation_batch(tiny_model_dir, visual_dataset, tmp_path):
    trainer = make_trainer(
        tiny_model_dir, visual_dataset, tmp_path, loss_type="dapo", steps_per_generation=2, selection_ratio=0.3
    )
    inputs = first_batch(trainer)
    # Both micro-batches of the generation batch count towards the normaliser: ceil(0.3 * T) per response. TRL's
    # `num_items_in_batch` keeps the valid count (for the KL term); the policy term's weights carry valid / selected.
    total = valid = 0
    for micro_batch in trainer._buffered_inputs:
        lengths = micro_batch["completion_mask"].sum(-1).double()
        total += int(torch.where(lengths > 0, torch.ceil(lengths * 0.3 - 1e-9).clamp(min=1), 0).sum())
        valid += int(lengths.sum())
    assert int(inputs["num_items_in_batch"]) == valid
    assert float(inputs[COUNT_SCALE_KEY]) == pytest.approx(valid / total)


# ---------------------------------------------------------------------------------------------------------------------
# One perturbed forward per completion per generation batch
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_iterations", [1, 2])
@pytest.mark.parametrize("gradient_accumulation_steps", [1, 2])
def test_perturbed_forward_runs_once_per_completion(
    tiny_model_dir, visual_dataset, tmp_path, num_iterations, gradient_accumulation_steps
):
    trainer = make_trainer(
        tiny_model_dir,
        visual_dataset,
        tmp_path,
        num_iterations=num_iterations,
        gradient_accumulation_steps=gradient_accumulation_steps,
        max_steps=2,
    )
    generated = []
    generate = trainer._generate_and_score_completions

    def counting_generate(inputs):
        output = generate(inputs)
        generated.append(output["completion_ids"].size(0))
        return output

    backbone_calls = []
    trainer.perturbed_pass.base_model(trainer.model).base_model.register_forward_hook(
        lambda *_: backbone_calls.append(1)
    )
    trainer._generate_and_score_completions = counting_generate
    trainer.train()
    assert sum(generated) > 0
    # Zero-advantage responses skip the pass (their mask cannot change the loss); every other one runs it once
    assert trainer.num_perturbed_completions + trainer.num_skipped_completions == sum(generated)
    # Loss forwards: one per micro-batch use; plus exactly one perturbed forward per micro-batch of each generation
    micro_batches = trainer.state.global_step * gradient_accumulation_steps
    perturbed_forwards = sum(generated) // trainer.args.per_device_train_batch_size
    old_logp_forwards = (
        len(generated) if gradient_accumulation_steps % (trainer.args.steps_per_generation * num_iterations) else 0
    )
    assert len(backbone_calls) >= micro_batches + perturbed_forwards + old_logp_forwards


def test_mask_computed_once_and_reused(tiny_model_dir, visual_dataset, tmp_path):
    trainer = make_trainer(tiny_model_dir, visual_dataset, tmp_path)
    inputs = first_batch(trainer)
    trainer.compute_loss(trainer.model, inputs).backward()
    mask = inputs[SELECTION_KEY].clone()
    scored = trainer.num_perturbed_completions
    assert scored == int((inputs["advantages"] != 0).sum())
    # A second use of the buffered batch (num_iterations > 1, or after an optimiser step) reuses the mask
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    trainer.compute_loss(trainer.model, inputs).backward()
    assert trainer.num_perturbed_completions == scored
    assert torch.equal(inputs[SELECTION_KEY], mask)


# ---------------------------------------------------------------------------------------------------------------------
# Every strategy trains end to end
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", sorted(SELECTION_STRATEGIES))
def test_every_strategy_trains(tiny_model_dir, visual_dataset, tmp_path, strategy):
    trainer = make_trainer(tiny_model_dir, visual_dataset, tmp_path, selection_strategy=strategy)
    before = trainable_snapshot(trainer.model)
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert logs and all(torch.isfinite(torch.tensor(entry["loss"])) for entry in logs)
    changed = [n for n, p in trainer.model.named_parameters() if p.requires_grad and not torch.equal(before[n], p)]
    # The language model's weights all move; vision-tower weights may get (near-)zero gradient from a tiny model
    language = [n for n in before if "language_model" in n or n.startswith("lm_head")]
    assert set(language) <= set(changed), sorted(set(language) - set(changed))[:5]
    if strategy != "full" and strategy != "random":
        assert "vepo/selected_fraction" in logs[0]
        fraction = logs[0]["vepo/selected_fraction"]
        if strategy == "vepo_bottom":
            assert 0.5 < fraction < 1.0
        else:
            assert 0.0 < fraction <= 0.5
    if SELECTION_STRATEGIES[strategy].needs_perturbed_pass:
        for key in ("vepo/noise_step", "vepo/jsd_mean", "vepo/entropy_gap_abs_mean", "vepo/top_jsd_missed_by_entropy"):
            assert key in logs[0], key
        assert logs[0]["vepo/noise_step"] == 500
        assert logs[0]["vepo/jsd_mean"] > 0


def test_vppo_without_diagnostics_logs_no_gap(tiny_model_dir, visual_dataset, tmp_path):
    # vppo reads only the sampled tokens' log-probabilities: without diagnostics no entropy of Q is computed
    trainer = make_trainer(
        tiny_model_dir, visual_dataset, tmp_path, selection_strategy="vppo", log_selection_diagnostics=False
    )
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert logs and 0.0 < logs[0]["vepo/selected_fraction"] <= 0.5
    assert "vepo/entropy_gap_abs_mean" not in logs[0] and "vepo/jsd_mean" not in logs[0]
    assert trainer.num_perturbed_completions > 0


# ---------------------------------------------------------------------------------------------------------------------
# PEFT, frozen vision tower
# ---------------------------------------------------------------------------------------------------------------------


def test_lora_trains_only_the_adapter(tiny_model_dir, visual_dataset, tmp_path):
    from peft import LoraConfig

    args = make_config(tmp_path)
    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = VEPOTrainer(
        model=tiny_model_dir,
        reward_funcs=length_reward,
        args=args,
        train_dataset=visual_dataset,
        peft_config=peft_config,
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    lora_b = [n for n in before if "lora_B" in n and "language_model" in n]
    assert lora_b and all(not torch.equal(before[n], after[n]) for n in lora_b)
    frozen = [n for n, p in after.items() if "lora_" not in n]
    assert all(torch.equal(before[n], after[n]) for n in frozen)
    assert trainer.num_perturbed_completions > 0


def test_lora_on_lm_head_is_rejected(tiny_model_dir, visual_dataset, tmp_path):
    from peft import LoraConfig

    peft_config = LoraConfig(r=4, target_modules=["q_proj", "lm_head"], task_type="CAUSAL_LM")
    with pytest.raises(ValueError, match="lm_head"):
        VEPOTrainer(
            model=tiny_model_dir,
            reward_funcs=length_reward,
            args=make_config(tmp_path),
            train_dataset=visual_dataset,
            peft_config=peft_config,
        )


def test_frozen_vision_tower(tiny_model_dir, visual_dataset, tmp_path):
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    model.model.visual.requires_grad_(False)
    trainer = make_trainer(model, visual_dataset, tmp_path, gradient_checkpointing=True)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    visual = [n for n in before if ".visual." in n]
    assert visual and all(torch.equal(before[n], after[n]) for n in visual)
    language = [n for n in before if "language_model" in n]
    assert all(not torch.equal(before[n], after[n]) for n in language)


# ---------------------------------------------------------------------------------------------------------------------
# The mask of a response depends on nothing but that response
# ---------------------------------------------------------------------------------------------------------------------


def _single_row(inputs, row):
    """Row `row` of a batch on its own: its prompt without left padding, its completion without right padding."""
    prompt_mask = inputs["prompt_mask"][row].bool()
    completion_length = int(inputs["completion_mask"][row].sum())
    counts = inputs["image_grid_thw"].prod(-1).tolist()
    starts = [sum(counts[:i]) for i in range(len(counts))]
    image = row  # one image per prompt in these data
    single = {
        "prompt_ids": inputs["prompt_ids"][row][prompt_mask].unsqueeze(0),
        "prompt_mask": inputs["prompt_mask"][row][prompt_mask].unsqueeze(0),
        "completion_ids": inputs["completion_ids"][row, :completion_length].unsqueeze(0),
        "completion_mask": inputs["completion_mask"][row, :completion_length].unsqueeze(0),
        "advantages": inputs["advantages"][row : row + 1],
        "num_items_in_batch": inputs["num_items_in_batch"],
        "pixel_values": inputs["pixel_values"][starts[image] : starts[image] + counts[image]],
        "image_grid_thw": inputs["image_grid_thw"][image : image + 1],
        "num_images": [1],
    }
    if "mm_token_type_ids" in inputs:
        prompt_part = inputs["mm_token_type_ids"][row, : inputs["prompt_ids"].size(1)][prompt_mask]
        single["mm_token_type_ids"] = torch.cat([prompt_part, torch.zeros(completion_length, dtype=torch.long)])[None]
    return single, completion_length


def _pad_completions(inputs, extra):
    """The batch with `extra` more right-padding columns on the completions (masked out)."""
    padded = dict(inputs)
    batch = inputs["completion_ids"].size(0)
    pad = torch.zeros(batch, extra, dtype=torch.long)
    padded["completion_ids"] = torch.cat([inputs["completion_ids"], pad], dim=1)
    padded["completion_mask"] = torch.cat([inputs["completion_mask"], pad], dim=1)
    if "mm_token_type_ids" in inputs:
        padded["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"], pad], dim=1)
    return padded


def test_mask_independent_of_batch_and_padding(tiny_model_dir, visual_dataset, tmp_path):
    # Four different prompts (two completions each): different lengths, so the batch left-pads its prompts
    trainer = make_trainer(
        tiny_model_dir,
        visual_dataset,
        tmp_path,
        per_device_train_batch_size=8,
        num_generations=2,
        score_zero_advantage_rows=True,  # every response gets VEPO's own mask, not the zero-advantage stand-in
    )
    inputs = first_batch(trainer)
    trainer.model.eval()  # no dropout: the same response must see the same distributions
    assert inputs["prompt_mask"].float().mean() < 1, "the batch should left-pad some prompts"
    padded = _pad_completions(inputs, extra=5)
    batch_mask = _select_alone(trainer, padded)
    assert not batch_mask[:, -5:].any()
    for row in range(inputs["completion_ids"].size(0)):
        single, length = _single_row(inputs, row)
        alone = _select_alone(trainer, single)
        assert alone[0].sum() == torch.ceil(torch.tensor(0.2 * length) - 1e-9).clamp(min=1)
        assert torch.equal(alone[0], batch_mask[row, :length]), f"row {row}"


def _select_alone(trainer, inputs):
    """The trainer's selection for `inputs`, from a fresh loss forward, as on a batch's first use."""
    with torch.no_grad(), trainer.perturbed_pass.capture(trainer.model) as captured:
        forward = trainer._forward(trainer.model, inputs)
    return trainer.selection_pipeline.select_at_first_use(trainer.model, inputs, forward, captured)


# ---------------------------------------------------------------------------------------------------------------------
# Text-only rows, rows without a valid token
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mixed_dataset(visual_dataset):
    return mixed_rows(visual_dataset)


def test_batch_mixing_text_only_and_image_rows(tiny_model_dir, mixed_dataset, tmp_path):
    # Two completions per prompt, four prompts per batch: both kinds of row share every batch
    trainer = make_trainer(
        tiny_model_dir,
        mixed_dataset,
        tmp_path,
        per_device_train_batch_size=8,
        num_generations=2,
        shuffle_dataset=False,
    )
    inputs = first_batch(trainer)
    has_image = torch.tensor([n > 0 for n in inputs["num_images"]])
    assert has_image.any() and not has_image.all()
    trainer.compute_loss(trainer.model, inputs).backward()
    selected, valid = inputs[SELECTION_KEY], inputs["completion_mask"].bool()
    # Every response keeps ceil(k * T) tokens; text-only rows are ranked by their entropy alone
    lengths = valid.sum(-1).double()
    assert torch.equal(selected.sum(-1), torch.ceil(lengths * 0.2 - 1e-9).clamp(min=1).long())
    forward = trainer._forward(trainer.model, inputs)
    text_rows = ~has_image
    expected = top_k_mask(forward[1].detach()[text_rows], valid[text_rows], 0.2)
    assert torch.equal(selected[text_rows], expected)
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert 0.0 < logs[0]["vepo/image_rows_fraction"] < 1.0 and logs[0]["vepo/jsd_mean"] > 0


def test_batch_of_text_only_rows_skips_the_perturbed_pass(tiny_model_dir, mixed_dataset, tmp_path):
    text_only = mixed_dataset.select(range(0, 8, 2))
    trainer = make_trainer(tiny_model_dir, text_only, tmp_path)
    trainer.train()
    assert trainer.num_perturbed_completions == 0
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert logs[0]["vepo/image_rows_fraction"] == 0.0 and 0.0 < logs[0]["vepo/selected_fraction"] <= 0.5


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_truncated_completions_have_no_valid_token(tiny_model_dir, visual_dataset, tmp_path, loss_type):
    # A random model rarely stops within 4 tokens: nearly every completion is truncated and masked out entirely
    trainer = make_trainer(
        tiny_model_dir,
        visual_dataset,
        tmp_path,
        max_completion_length=4,
        mask_truncated_completions=True,
        loss_type=loss_type,
    )
    inputs = first_batch(trainer)
    empty = inputs["completion_mask"].sum(-1) == 0
    assert empty.any()
    loss = trainer.compute_loss(trainer.model, inputs)
    assert torch.isfinite(loss)
    assert not inputs[SELECTION_KEY][empty].any()
    trainer.train()
    assert all(torch.isfinite(torch.tensor(e["loss"])) for e in trainer.state.log_history if "loss" in e)


# ---------------------------------------------------------------------------------------------------------------------
# Bad set-ups fail early and clearly
# ---------------------------------------------------------------------------------------------------------------------


def test_grpo_config_is_rejected(tiny_model_dir, visual_dataset, tmp_path):
    with pytest.raises(TypeError, match="VEPOConfig"):
        VEPOTrainer(
            model=tiny_model_dir,
            reward_funcs=length_reward,
            args=GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none"),
            train_dataset=visual_dataset,
        )


def test_text_only_model_needs_a_text_strategy(tmp_path, monkeypatch):
    from datasets import Dataset
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from vepo_trl.builtin.tiny_models import build_tokenizer

    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(tmp_path / "text")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    Qwen2ForCausalLM(config).save_pretrained(tmp_path / "text")
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "1 + 1 ="}]}] * 4)
    with pytest.raises(ValueError, match="text-only"):
        make_trainer(str(tmp_path / "text"), dataset, tmp_path)
    # A bare call (no args) builds the default VEPOConfig, the paper's selection, as GRPOTrainer builds GRPOConfig's
    # defaults: refused in one line naming the text strategies, before anything is written (docs/python.md)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="use selection_strategy='entropy' or 'full'") as refusal:
        VEPOTrainer(str(tmp_path / "text"), length_reward, train_dataset=dataset)
    assert "\n" not in str(refusal.value) and not (tmp_path / "text-VEPO").exists()
    # A text strategy is fine on the same model
    trainer = make_trainer(str(tmp_path / "text"), dataset, tmp_path, selection_strategy="entropy", max_steps=1)
    trainer.train()
    assert AutoTokenizer.from_pretrained(tmp_path / "text") is not None


def test_the_constructor_takes_what_grpo_trainers_takes():
    """A drop-in: the parameters GRPOTrainer names come in the same order with the same defaults (TRL 1.16 made
    `reward_funcs` optional, an environment can own the reward; TRL's own test_no_reward_source_raises calls it so)."""
    import inspect

    from trl import GRPOTrainer

    ours = list(inspect.signature(VEPOTrainer.__init__).parameters.values())
    theirs = list(inspect.signature(GRPOTrainer.__init__).parameters.values())
    assert [(p.name, p.default) for p in ours[:3]] == [(p.name, p.default) for p in theirs[:3]]
