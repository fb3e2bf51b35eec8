"""The perturbed pass reads each prompt once (`prompt_cache`): for every family, the signals and the mask equal the
whole-sequence pass's on batches of several prompts (0, 1 or 2 images, prompts of different lengths, left padding,
completions of different lengths), within 1e-5 in float32 and 1e-10 in float64; rows are grouped by prompt and images,
nothing else; every process runs the same forwards per chunk; completions holding an image, and chunks whose caches
would outweigh their whole forward, keep the whole-sequence pass."""

import copy

import pytest
import torch
from datasets import Dataset
from PIL import Image
from transformers.trainer_callback import PrinterCallback
from trl.trainer.utils import unsplit_pixel_values_by_grid

from vepo_trl import VEPOConfig, VEPOTrainer
from vepo_trl.batch import has_image, row_pieces, take_rows
from vepo_trl.builtin.tiny_models import TINY_FAMILIES, takes
from vepo_trl.data import synthetic_training_dataset
from vepo_trl.prompt_cache import completions_hold_images, prompt_groups
from vepo_trl.scoring import TokenSignals
from vepo_trl.selection_pipeline import SELECTION_KEY


SIGNALS = ("jsd", "entropy", "perturbed_entropy")
# Every family reads each prompt once (linear attention too: its padded prompt runs the whole pass's recurrence chunks)
SHARED = list(TINY_FAMILIES)


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


def _clean_side(trainer, inputs):
    """The clean forward's log-probs, entropies and completion states, the valid tokens and the rows to score (an
    image and a valid token)."""
    with torch.no_grad(), trainer.perturbed_pass.capture(trainer.model) as captured:
        logps, entropies, _ = trainer.selection_pipeline.batch_forward(trainer.model, inputs, scoring=True)
    length = inputs["completion_ids"].size(1)
    hidden = torch.cat(captured)[:, -length - 1 : -1]
    valid = inputs["completion_mask"].bool()
    return logps, entropies, hidden, valid, has_image(inputs) & valid.any(-1)


def _signals_both_ways(trainer, inputs, batch_size=None, monkeypatch=None):
    """The perturbed pass's signals and the mask, with each prompt read once and with every row's whole sequence, in
    chunks of `batch_size` rows (all by default). With `monkeypatch`, the prompts are read once whatever the memory
    bound (`prompt_cache.continuation_rows`: the tiny Gemma 4's cache outweighs its whole forward 5.5 times)."""
    pipeline, perturbed = trainer.selection_pipeline, trainer.perturbed_pass
    if monkeypatch is not None:
        monkeypatch.setattr("vepo_trl.prompt_cache.continuation_rows", lambda widths, *, rows, **shape: rows)
    logps, entropies, hidden, valid, rows = _clean_side(trainer, inputs)
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
def test_shared_prompt_signals_equal_the_whole_sequence_pass(tiny_dirs, tmp_path, monkeypatch, family):
    trainer = _trainer(tiny_dirs[family], _dataset(family), tmp_path)
    assert trainer.perturbed_pass.share_prompts
    inputs = _batch(trainer)
    (both, rows, valid) = _signals_both_ways(trainer, inputs, monkeypatch=monkeypatch)
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


@pytest.mark.parametrize("batch_size", [2, 5])
@pytest.mark.parametrize("family", ["qwen2.5-vl", "llava"])
def test_small_scoring_chunks_read_each_prompt_once_and_keep_the_signals(tiny_dirs, tmp_path, family, batch_size):
    """Chunks of two or five rows: a chunk's prompts run in one forward, its completions from their prompts' caches;
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


def test_a_chunk_whose_caches_outweigh_its_whole_forward_runs_whole_sequences(tiny_dirs, tmp_path):
    """One row per forward: the prompt's cache and a row's continuation hold more than a one-row whole forward's
    bound (`prompt_cache.continuation_rows`), so the rows run whole, with the same signals."""
    trainer = _trainer(tiny_dirs["qwen2.5-vl"], _dataset("qwen2.5-vl"), tmp_path)
    inputs = _by_prompt(_batch(trainer))
    both, rows, valid = _signals_both_ways(trainer, inputs, 1)
    assert both[True][2] == both[False][2]
    assert torch.equal(both[True][1], both[False][1])


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
# Linear attention: transformers' cache selects no linear-attention state by row
# ---------------------------------------------------------------------------------------------------------------------


def test_upstream_linear_attention_caches_select_no_rows_and_the_pass_selects_their_states(tiny_dirs, tmp_path):
    """transformers (5.25) gives a linear-attention cache layer no `batch_select_indices` (Qwen3.5's Gated DeltaNet:
    `Cache.batch_select_indices` fails on it), and a hybrid layer's inherited one selects its keys and values only.
    The pass selects their conv and recurrent states by row itself (`prompt_cache._gathered`) and switches that off
    once a linear-attention class defines the method. When the first assertion fails, upstream is fixed."""
    from vepo_trl.prompt_cache import _gathered, _selects_no_linear_states

    trainer = _trainer(tiny_dirs["qwen3.5"], _dataset("qwen3.5"), tmp_path)
    processor = trainer.processing_class
    encoded = processor(text=["Hello there", "Hi"], return_tensors="pt", padding=True)
    with torch.no_grad():
        cache = trainer.model(**encoded, use_cache=True).past_key_values
    with pytest.raises(AttributeError, match="batch_select_indices"):
        copy.deepcopy(cache).batch_select_indices(torch.tensor([1, 1, 0]))
    linear = [layer for layer in cache.layers if _selects_no_linear_states(layer)]
    assert linear, "the tiny Qwen3.5 has linear-attention layers"
    before = {id(layer): dict(layer.recurrent_states) for layer in linear}
    picked = _gathered(cache, torch.tensor([1, 1, 0]), last=False)
    for layer, original in zip((layer for layer in picked.layers if _selects_no_linear_states(layer)), linear):
        for key, state in layer.recurrent_states.items():
            if state is not None:
                assert torch.equal(state, before[id(original)][key][[1, 1, 0]])
                assert original.recurrent_states[key] is before[id(original)][key]  # the prompt's cache kept


# Sharded weights: the same forwards on every process
# ---------------------------------------------------------------------------------------------------------------------


def test_sharded_weights_read_each_prompt_once_too(tiny_model_dir, visual_dataset, tmp_path):
    from vepo_trl.perturbed_pass import PerturbedPass

    trainer = _trainer(tiny_model_dir, visual_dataset, tmp_path, per_device_train_batch_size=4, num_generations=2)
    sharded = copy.copy(trainer)
    sharded.is_fsdp_enabled = True
    assert PerturbedPass(sharded, trainer.args.selection_strategy).share_prompts


@pytest.mark.parametrize("other", ["none", "more", "whole"])
def test_every_process_runs_the_forwards_of_the_one_that_needs_most(tiny_dirs, tmp_path, monkeypatch, other):
    """Two processes seen from one: the other's counts (chunks, chunks shared, continuations per chunk, whether it
    cannot share) come back from the gather. This process runs as many chunks, and per chunk one prefill and as many
    continuations as the other needs (dummies where it has none), or one whole forward per chunk when the other
    cannot share; a process with no rows runs the dummies alone. The signals stay the whole pass's."""
    trainer = _trainer(tiny_dirs["qwen2.5-vl"], _dataset("qwen2.5-vl"), tmp_path)
    inputs = _by_prompt(_batch(trainer))
    passes = trainer.perturbed_pass
    theirs = {"none": [0, 0, 0, 0], "more": [9, 5, 4, 0], "whole": [6, 0, 0, 1]}[other]
    gathered = []

    def gather(tensor):
        gathered.append(tensor.tolist())
        return torch.cat([tensor, torch.tensor([theirs])])

    monkeypatch.setattr(trainer.accelerator, "gather", gather)
    logps, entropies, hidden, valid, rows = _clean_side(trainer, inputs)
    out = {}
    for shared in (True, False):
        passes.share_prompts = shared
        passes.chunk_forwards.clear()
        gathered.clear()
        out[shared] = passes.signals_for_rows(inputs, TokenSignals(entropy=entropies.float(), logp=logps.float()),
                                              rows, lambda i: hidden[i][valid[i]], 5, set(SIGNALS))  # fmt: skip
        forwards = list(passes.chunk_forwards)
        if shared:
            mine = gathered[0][0]
            if other == "whole":
                assert forwards == [1] * max(mine[0], 6)
            else:
                chunks, slices = max(mine[1], theirs[1]), max(mine[2], theirs[2])
                assert mine[3] == 0 and slices >= 1
                assert forwards == [1 + slices] * chunks
    scored = valid & rows[:, None]
    for name in SIGNALS:
        difference = (getattr(out[True], name) - getattr(out[False], name))[scored].abs().max().item()
        assert difference <= 1e-5, f"{name}: {difference:.2e}"
    # With no rows of its own, the process runs the other's forwards as dummies
    passes.share_prompts = True
    passes.chunk_forwards.clear()
    theirs = [3, 2, 3, 0]
    passes.signals_for_rows(inputs, TokenSignals(entropy=torch.zeros_like(valid, dtype=torch.float)),
                            torch.zeros_like(rows), lambda i: None, 5, set(SIGNALS))  # fmt: skip
    assert list(passes.chunk_forwards) == [4, 4]


# ---------------------------------------------------------------------------------------------------------------------
# Memory: the caches never outweigh the whole pass
# ---------------------------------------------------------------------------------------------------------------------


def _widths(checkpoint, **sizes):
    """`memory_widths` of a checkpoint's language model, built on the meta device from its reference config (sizes
    given where the reference leaves them out)."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    from vepo_trl.prompt_cache import memory_widths

    from .reference_configs import REFERENCE_CONFIGS

    reference = next(entry for entry in REFERENCE_CONFIGS.values() if entry["checkpoint"] == checkpoint)["config"]
    reference = {key: value for key, value in reference.items() if key != "architectures"}
    config = AutoConfig.for_model(reference.pop("model_type"), **reference)
    text_config = config.get_text_config()
    for key, value in sizes.items():
        setattr(text_config, key, value)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    return memory_widths(model.get_decoder(), text_config.hidden_size)


def test_memory_bound_at_seven_billion_parameter_shapes():
    """The real classes on the meta device: LLaVA-1.5-7B (multi-head attention, 32 layers of 4,096 keys and values)
    holds 262,144 cache elements a token against at least 30,208 for its whole forward (2 x 4,096 + 2 x 11,008), so
    no chunk shares; Qwen2.5-VL-7B (28 layers, 4 key-value heads of 128) holds 28,672 against 45,056 and shares a
    chunk of 8 completions of one 1,300-token prompt in one continuation forward."""
    from vepo_trl.prompt_cache import continuation_rows

    llava = _widths("llava-hf/llava-1.5-7b-hf")  # its text config is LlamaConfig's defaults: Llama-2-7B's sizes
    # Qwen2.5-VL-7B-Instruct config.json's sizes (the reference keeps its other fields)
    qwen = _widths("Qwen/Qwen2.5-VL-7B-Instruct", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                   num_attention_heads=28, num_key_value_heads=4)  # fmt: skip
    assert llava == (262_144, 30_208) and qwen == (28_672, 45_056)
    shape = dict(budget_rows=8, rows=8, prompt_length=1_300, length=256)
    assert continuation_rows(llava, prompts=1, **shape) == 0
    assert continuation_rows(qwen, prompts=1, **shape) == 8
    # Hand-computed at 1,024-token completions: (8 x 2,324 x 45,056 - 1,300 x 28,672) // (2,324 x 28,672 + 1,024 x
    # 45,056) = 7 rows per continuation
    assert continuation_rows(qwen, prompts=1, **{**shape, "length": 1_024}) == 7
    # Every prompt distinct: its caches alone would pass the whole forward's bound
    assert continuation_rows(qwen, prompts=8, **{**shape, "prompt_length": 2_000, "length": 64}) == 0
    shared = 0
    for widths in (llava, qwen):
        for prompts, prompt_length, length in [(1, 1_300, 256), (2, 600, 1_024), (4, 300, 128), (8, 100, 512)]:
            rows = continuation_rows(widths, budget_rows=8, rows=8, prompts=prompts, prompt_length=prompt_length,
                                     length=length)  # fmt: skip
            if rows == 0:  # whole sequences
                continue
            cache, activations = widths
            whole = 8 * (prompt_length + length) * activations
            assert prompts * prompt_length * (cache + activations) <= whole  # the prefill
            held = prompts * prompt_length * cache + rows * ((prompt_length + length) * cache + length * activations)
            assert held <= whole  # a continuation forward
            shared += widths == qwen
    assert shared == 4


def test_memory_widths_see_through_lora_layers():
    """A LoRA adapter on the key and value projections wraps each `nn.Linear` (`base_layer`): the cache's width is
    the same as the bare model's (it read 0 before, and the bound never refused)."""
    from peft import LoraConfig, get_peft_model

    from vepo_trl.builtin.tiny_models import build_tiny
    from vepo_trl.prompt_cache import memory_widths

    model, _ = build_tiny("llava")
    hidden = model.config.get_text_config().hidden_size
    bare = memory_widths(model.get_decoder(), hidden)
    wrapped = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "k_proj", "v_proj", "up_proj"]))
    assert memory_widths(wrapped.get_base_model().get_decoder(), hidden) == bare and bare[0] > 0
