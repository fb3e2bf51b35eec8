"""The perturbed pass reads each prompt once (`prompt_cache`): for every family, the signals and the mask equal the
whole-sequence pass's on batches of several prompts (0, 1 or 2 images, prompts of different lengths, left padding,
completions of different lengths), within 1e-10 in float64; rows are grouped by prompt and images, nothing else;
models with linear attention, completions holding an image and sharded weights keep the whole-sequence pass."""

import copy

import pytest
import torch
from datasets import Dataset
from PIL import Image
from transformers.trainer_callback import PrinterCallback
from trl.trainer.utils import unsplit_pixel_values_by_grid

from vepo_trl import VEPOConfig, VEPOTrainer
from vepo_trl.batch import has_image, row_pieces, take_rows
from vepo_trl.builtin.tiny_models import TINY_FAMILIES, build_tiny_config, build_tiny_processor, takes
from vepo_trl.data import synthetic_training_dataset
from vepo_trl.prompt_cache import cache_blocker, completions_hold_images, prompt_groups
from vepo_trl.scoring import TokenSignals
from vepo_trl.selection_pipeline import SELECTION_KEY


SIGNALS = ("jsd", "entropy", "perturbed_entropy")
# Families whose models do not continue from a cache as their whole forward (`prompt_cache.cache_blocker`)
BLOCKED = [
    name for name in TINY_FAMILIES if cache_blocker(build_tiny_config(name, build_tiny_processor(name))) is not None
]
SHARED = [name for name in TINY_FAMILIES if name not in BLOCKED]


def _image(width, height, seed):
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (height, width, 3), generator=generator, dtype=torch.uint8)
    return Image.fromarray(pixels.numpy())


def _mixed_rows(rows=4):
    """Prompts of different lengths with one, two or no image."""
    data = []
    for i in range(rows):
        kind = i % 3
        text = "Which shape is larger, and by how much? " * (1 + i % 2) + f"Case {i}."
        images = [_image(40 + 8 * i, 40, i)] + ([_image(32, 48, 50 + i)] if kind == 1 else [])
        if kind == 2:
            images = []
        content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
        data.append({"prompt": [{"role": "user", "content": content}], "images": images, "answer": "1"})
    return Dataset.from_list(data)


def _dataset(family):
    """The mixed rows where the family takes them (some refuse text-only rows or two images), else one image each at
    two prompt lengths."""
    mixed = _mixed_rows()
    if takes(family, mixed):
        return mixed
    rows = [dict(row) for row in synthetic_training_dataset(4, seed=1)]
    rows[1]["prompt"] = copy.deepcopy(rows[1]["prompt"])
    rows[1]["prompt"][-1]["content"][-1]["text"] += " Explain each step of the reasoning carefully."
    return Dataset.from_list(rows)


def _reward(completions, **kwargs):
    return [float(len(completion[0]["content"]) % 3) for completion in completions]


def test_every_family_is_shared_or_blocked_with_its_reason():
    assert set(SHARED) | set(BLOCKED) == set(TINY_FAMILIES)
    assert BLOCKED == ["qwen3.5", "qwen3.5-moe"]


def _trainer(model, dataset, tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=12, num_generations=3,
                  max_completion_length=10, max_steps=1, report_to="none", save_strategy="no", use_cpu=True,
                  bf16=False, seed=0, disable_tqdm=True, temperature=1.3)  # fmt: skip
    values.update(overrides)
    trainer = VEPOTrainer(model=model, reward_funcs=_reward, args=VEPOConfig(**values), train_dataset=dataset)
    trainer.remove_callback(PrinterCallback)
    return trainer


def _batch(trainer):
    trainer.model.train()
    trainer.state.global_step = 0
    trainer.current_gradient_accumulation_steps = 1
    return trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))


def _signals_both_ways(trainer, inputs, batch_size=None):
    """The perturbed pass's signals and the mask, with each prompt read once and with every row's whole sequence, in
    chunks of `batch_size` rows (all by default)."""
    pipeline, perturbed = trainer.selection_pipeline, trainer.perturbed_pass
    model = trainer.model
    with torch.no_grad(), perturbed.capture(model) as captured:
        logps, entropies, _ = pipeline.batch_forward(model, inputs, scoring=True)
    length = inputs["completion_ids"].size(1)
    hidden = torch.cat(captured)[:, -length - 1 : -1]
    valid = inputs["completion_mask"].bool()
    rows = has_image(inputs) & valid.any(-1)
    out = {}
    for shared in (True, False):
        perturbed.share_prompts = shared
        before = perturbed.num_positions
        signals = perturbed.signals_for_rows(
            inputs,
            TokenSignals(entropy=entropies.float(), logp=logps.float()),
            rows,
            lambda i: hidden[i][valid[i]],
            batch_size or inputs["completion_ids"].size(0),
            set(SIGNALS),
        )
        out[shared] = (signals, pipeline.select(inputs, signals, rows), perturbed.num_positions - before)
    return out, rows, valid


@pytest.mark.parametrize("family", SHARED)
def test_shared_prompt_signals_equal_the_whole_sequence_pass(tiny_dirs, tmp_path, family):
    trainer = _trainer(tiny_dirs[family], _dataset(family), tmp_path)
    assert trainer.perturbed_pass.share_prompts
    inputs = _batch(trainer)
    (both, rows, valid) = _signals_both_ways(trainer, inputs)
    (shared, shared_mask, shared_positions), (whole, whole_mask, whole_positions) = both[True], both[False]
    assert int(rows.sum()) >= 6, "the batch should hold several prompts with images"
    scored = valid & rows[:, None]
    for name in SIGNALS:
        difference = (getattr(shared, name) - getattr(whole, name))[scored].abs().max().item()
        assert difference <= 1e-5, f"{name}: {difference:.2e}"
    assert torch.equal(shared_mask, whole_mask)
    # The prompts were read once per group, not once per completion
    assert shared_positions < whole_positions
    # Every row in order is the batch's own tensors, equal to TRL's pieces put back together
    everything = take_rows(inputs, torch.arange(inputs["completion_ids"].size(0)))
    pieces = row_pieces(inputs)
    keys = [key for key in pieces[0] if key not in ("num_images", "num_tiles")]
    if keys and any(row["num_images"] for row in pieces):
        merged = unsplit_pixel_values_by_grid({key: [row[key] for row in pieces] for key in keys})
        for key in keys:
            assert torch.equal(everything[key], merged[key]), key


@pytest.mark.parametrize("family", ["qwen2.5-vl", "llava"])
def test_shared_prompt_pass_is_exact_in_float64(tiny_dirs, tmp_path, family):
    """Positions from the attention mask (M-RoPE: the prompt unpadded) and counted over every column (LLaVA: the
    padded prompt and its mask): the same function as the whole-sequence forward, to float64 rounding."""
    trainer = _trainer(tiny_dirs[family], _dataset(family), tmp_path)
    inputs = _batch(trainer)
    trainer.model.double()
    inputs = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in inputs.items()}
    padded = inputs["prompt_mask"].bool().logical_not().any(-1)
    assert bool(padded.any()) and not bool(padded.all()), "the batch should mix padded and unpadded prompts"
    both, rows, valid = _signals_both_ways(trainer, inputs)
    scored = valid & rows[:, None]
    for name in SIGNALS:
        difference = (getattr(both[True][0], name) - getattr(both[False][0], name))[scored].abs().max().item()
        assert difference <= 1e-10, f"{name}: {difference:.2e}"


def _by_prompt(inputs):
    """The batch's rows ordered by prompt, as TRL's generation batch is before its shuffle (the rollout-time path)."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    order = torch.tensor(
        [row for group in prompt_groups(ids, mask, inputs["completion_ids"].size(1), inputs) for row in group]
    )
    rows = order.numel()
    out = {key: value[order] if isinstance(value, torch.Tensor) and value.dim() and value.size(0) == rows else value
           for key, value in inputs.items()}  # fmt: skip
    out.update(take_rows(inputs, order))
    return out


@pytest.mark.parametrize("batch_size", [1, 2, 5])
@pytest.mark.parametrize("family", ["qwen2.5-vl", "llava"])
def test_small_scoring_chunks_read_each_prompt_once_and_keep_the_signals(tiny_dirs, tmp_path, family, batch_size):
    """Forwards of one, two or five rows: a prompt's completions run in slices, each from its own copy of the cache;
    the signals stay the whole-sequence pass's."""
    trainer = _trainer(tiny_dirs[family], _dataset(family), tmp_path)
    inputs = _by_prompt(_batch(trainer))
    both, rows, valid = _signals_both_ways(trainer, inputs, batch_size)
    scored = valid & rows[:, None]
    for name in SIGNALS:
        difference = (getattr(both[True][0], name) - getattr(both[False][0], name))[scored].abs().max().item()
        assert difference <= 1e-5, f"{name}: {difference:.2e}"
    assert torch.equal(both[True][1], both[False][1])
    assert both[True][2] < both[False][2]


def test_one_token_completions(tiny_dirs, tmp_path):
    """T = 1: the prompt's last position predicts the only token; no completion forward runs."""
    trainer = _trainer(tiny_dirs["qwen2.5-vl"], _dataset("qwen2.5-vl"), tmp_path, max_completion_length=1)
    inputs = _batch(trainer)
    assert inputs["completion_ids"].size(1) == 1
    both, rows, valid = _signals_both_ways(trainer, inputs)
    scored = valid & rows[:, None]
    for name in SIGNALS:
        difference = (getattr(both[True][0], name) - getattr(both[False][0], name))[scored].abs().max().item()
        assert difference <= 1e-5, f"{name}: {difference:.2e}"


def test_completions_holding_an_image_keep_the_whole_sequence_pass(tiny_dirs, tmp_path):
    """A tool's image in a completion (TRL 1.16 puts its placeholders and pixels there): the prompt forward would see
    pixels for placeholders it does not hold, so the chunk runs whole sequences."""
    trainer = _trainer(tiny_dirs["qwen2.5-vl"], _dataset("qwen2.5-vl"), tmp_path)
    passes = trainer.perturbed_pass
    image_token = trainer.processing_class.image_token_id
    assert image_token in passes.image_token_ids
    inputs = _batch(trainer)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    length = inputs["completion_ids"].size(1)
    assert not completions_hold_images(ids, length, inputs, passes.image_token_ids)
    with_tool = ids.clone()
    with_tool[0, -2] = image_token
    assert completions_hold_images(with_tool, length, inputs, passes.image_token_ids)
    # Token types that mark vision tokens in the completion say the same without the id
    types = torch.zeros_like(ids)
    types[1, -1] = 1
    assert completions_hold_images(ids, length, {**inputs, "mm_token_type_ids": types}, [])


def test_a_model_that_keeps_no_cache_falls_back_to_the_whole_sequence_pass(tiny_dirs, tmp_path, caplog):
    trainer = _trainer(tiny_dirs["qwen2.5-vl"], _dataset("qwen2.5-vl"), tmp_path)
    inputs = _batch(trainer)
    forward = trainer.model.forward

    def without_cache(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.past_key_values = None
        return out

    trainer.model.forward = without_cache
    with caplog.at_level("WARNING", logger="vepo_trl.perturbed_pass"):
        both, rows, valid = _signals_both_ways(trainer, inputs)
    assert "no cache" in caplog.text
    scored = valid & rows[:, None]
    assert torch.equal(both[True][0].jsd[scored], both[False][0].jsd[scored])


def test_the_training_step_uses_the_shared_pass_and_keeps_its_mask(tiny_dirs, tmp_path):
    """Rollout-time scoring (steps_per_generation 2): the mask a step stores is the same with the prompt read once."""
    dataset = _dataset("qwen2.5-vl")
    masks = {}
    for shared in (True, False):
        trainer = _trainer(tiny_dirs["qwen2.5-vl"], dataset, tmp_path, per_device_train_batch_size=6,
                           steps_per_generation=2)  # fmt: skip
        trainer.perturbed_pass.share_prompts = shared
        assert trainer.selection_pipeline.trl_scores_at_rollout()
        inputs = _batch(trainer)
        masks[shared] = (inputs[SELECTION_KEY], trainer.perturbed_pass.num_positions)
    assert torch.equal(masks[True][0], masks[False][0])
    assert 0 < masks[True][1] < masks[False][1]


# ---------------------------------------------------------------------------------------------------------------------
# Grouping
# ---------------------------------------------------------------------------------------------------------------------


def test_prompt_groups_by_prompt_tokens_mask_and_images():
    ids = torch.tensor([[0, 5, 6, 1, 2], [0, 5, 6, 3, 4], [5, 5, 6, 1, 2], [0, 5, 6, 1, 1], [0, 5, 6, 9, 9]])
    mask = torch.tensor([[0, 1, 1, 1, 1], [0, 1, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 0], [0, 1, 1, 1, 1]])
    pixels = torch.stack([torch.full((2, 3), float(v)) for v in (1, 1, 1, 1, 2)])  # one row of patches per response
    inputs = {"pixel_values": pixels.reshape(10, 3), "image_grid_thw": torch.tensor([[1, 1, 2]] * 5),
              "num_images": [1] * 5}  # fmt: skip
    # Rows 0, 1, 3: one prompt (completions differ); row 2: other prompt tokens; row 4: the same prompt, other pixels
    assert prompt_groups(ids, mask, 2, inputs) == [[0, 1, 3], [2], [4]]
    # Token types over the prompt part
    types = torch.zeros(5, 5, dtype=torch.long)
    types[1, 1] = 1
    assert prompt_groups(ids, mask, 2, {**inputs, "token_type_ids": types}) == [[0, 3], [1], [2], [4]]
    # A prompt mask with a gap (not left padding): every row alone, the whole-sequence pass
    gap = mask.clone()
    gap[0, :3] = torch.tensor([1, 0, 1])
    assert prompt_groups(ids, gap, 2, inputs) == [[0], [1], [2], [3], [4]]


def test_chunks_keep_a_prompts_completions_together_within_the_budget():
    """Six responses, three per prompt, batch_size 2: whole-sequence chunks of two rows; shared, a chunk takes the rest
    of its prompt's consecutive rows (its forwards still run two rows at most), so each prompt is read once."""
    from vepo_trl.perturbed_pass import PerturbedPass

    prompts = torch.tensor([[1, 2, 3, 4, 5, 6]] * 3 + [[1, 2, 3, 4, 5, 7]] * 3)
    inputs = {"prompt_ids": prompts, "prompt_mask": torch.ones_like(prompts),
              "completion_ids": torch.arange(12).view(6, 2),
              "completion_mask": torch.ones(6, 2, dtype=torch.long)}  # fmt: skip
    passes = object.__new__(PerturbedPass)
    index = torch.arange(6)
    passes.share_prompts = False
    assert [chunk.tolist() for chunk in passes.chunks(inputs, index, 2)] == [[0, 1], [2, 3], [4, 5]]
    passes.share_prompts = True
    assert [chunk.tolist() for chunk in passes.chunks(inputs, index, 2)] == [[0, 1, 2], [3, 4, 5]]
    # Responses skipped (zero advantage) leave the others in order; one row per forward keeps a prompt's rows together
    assert [chunk.tolist() for chunk in passes.chunks(inputs, torch.tensor([0, 2, 3, 5]), 2)] == [[0, 2], [3, 5]]
    assert [chunk.tolist() for chunk in passes.chunks(inputs, index, 1)] == [[0, 1, 2], [3, 4, 5]]
    # Small prompts pack into one chunk up to batch_size; a prompt's rows that are not consecutive start over
    scattered = torch.tensor([0, 3, 1, 4, 2, 5])
    assert [chunk.tolist() for chunk in passes.chunks(inputs, scattered, 2)] == [[0, 3], [1, 4], [2, 5]]


# ---------------------------------------------------------------------------------------------------------------------
# Models whose continuation from a cache is not their whole forward
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", BLOCKED)
def test_linear_attention_models_keep_the_whole_sequence_pass(tiny_dirs, tmp_path, family):
    """Gated DeltaNet (Qwen3.5) continues from a cache over other chunk boundaries of its float32 recurrence: above
    the 1e-5 bar here, so its rows keep one forward each, and the reason is the config's, not a list of names."""
    trainer = _trainer(tiny_dirs[family], _dataset(family), tmp_path)
    assert not trainer.perturbed_pass.share_prompts
    assert "linear-attention" in cache_blocker(trainer.model.config)


# ---------------------------------------------------------------------------------------------------------------------
# Sharded weights keep one forward per chunk
# ---------------------------------------------------------------------------------------------------------------------


def test_sharded_weights_keep_the_whole_sequence_pass(tiny_model_dir, visual_dataset, tmp_path):
    from vepo_trl.perturbed_pass import PerturbedPass

    trainer = _trainer(tiny_model_dir, visual_dataset, tmp_path, per_device_train_batch_size=4, num_generations=2)
    assert trainer.perturbed_pass.share_prompts
    sharded = copy.copy(trainer)
    sharded.is_fsdp_enabled = True
    assert not PerturbedPass(sharded, trainer.args.selection_strategy).share_prompts
