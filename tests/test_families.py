"""Every supported model family (`vepo_trl.families`) on its tiny model (`vepo_trl.builtin.tiny_models.TINY_FAMILIES`): TRL's
GRPOTrainer trains it, VEPO trains it, `full` is GRPO, the identity perturbation gives no signal, and the perturbed
images differ from the clean ones exactly where each perturbation says. Run them with `pytest -k families`."""

import math
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor, set_seed
from trl import GRPOConfig, GRPOTrainer

from vepo_trl import VEPOConfig, VEPOTrainer
from vepo_trl.builtin.tiny_models import TINY_FAMILIES, build_tiny, build_tiny_processor
from vepo_trl.data import synthetic_training_dataset
from vepo_trl.families import FAMILIES, family_of, get_family, pixel_layout, supported_families, trainable_families
from vepo_trl.perturb import (
    PERTURBATIONS,
    ImageLayout,
    PixelLayout,
    PositionedPatchLayout,
    diffusion_alpha_bar,
    perturb_pixel_values,
)
from vepo_trl.scoring import SELECTION_STRATEGIES
from vepo_trl.trainer import SELECTION_KEY
from vepo_trl.trl_compat.prompt_padding import text_pads, text_returns_tensors

from .support import REPO, alternating_reward, length_reward, make_config


FAMILY_NAMES = [family.name for family in FAMILIES]
# The families TRL's GRPOTrainer trains here: the training tests run on these, the perturbation tests on all
TRAINABLE = trainable_families()
# The families whose processor's text defaults pad; those whose defaults pad or return tensors (`prompt_padding`)
_TEXT_DEFAULTS = {name: build_tiny_processor(name) for name in FAMILY_NAMES}
PADDING_TEXT = [name for name, processor in _TEXT_DEFAULTS.items() if text_pads(processor)]
PADDED_TEXT = [
    name for name, processor in _TEXT_DEFAULTS.items() if text_pads(processor) or text_returns_tensors(processor)
]


@pytest.fixture(scope="module")
def dataset():
    return synthetic_training_dataset(8, seed=0)


def make_args(tmp_path, config_cls=VEPOConfig, **overrides):
    """`support.make_config` at this module's sizes: 8 new tokens, one step."""
    return make_config(tmp_path, config_cls, **{"max_completion_length": 8, "max_steps": 1, **overrides})


def trainable(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def moved(before, model):
    return any(not torch.equal(before[n], p.detach()) for n, p in model.named_parameters() if n in before)


# ---------------------------------------------------------------------------------------------------------------------
# The registry
# ---------------------------------------------------------------------------------------------------------------------


def test_families_every_family_has_a_tiny_model_and_its_classes():
    assert set(TINY_FAMILIES) == set(FAMILY_NAMES)
    for family in FAMILIES:
        model, processor = build_tiny(family.name)
        assert type(model).__name__ in family.model_classes
        assert family_of(model) is family
        assert family.tiny_model == f"tiny-{family.name}"
        layout = pixel_layout(model, processor.image_processor)
        expected = (
            PixelLayout
            if "image_grid_thw" in family.pixel_values
            else PositionedPatchLayout
            if "image_position_ids" in family.pixel_values
            else ImageLayout
        )
        assert isinstance(layout, expected)
        # The model's own patch size: Qwen3-VL 16, the others as their vision config says
        patch = model.config.vision_config.patch_size
        assert layout.patch_size == (patch[0] if isinstance(patch, (list, tuple)) else patch)
        # The tiny processor normalises as the family's reference checkpoint does
        if family.reference is not None:
            torch.testing.assert_close(
                torch.tensor(layout.image_std), torch.tensor(family.reference[1]), atol=1e-6, rtol=0
            )


def test_families_unsupported_model_is_refused_in_one_line():
    from transformers import BlipConfig, Lfm2VlConfig

    with pytest.raises(ValueError) as error:
        pixel_layout(BlipConfig(), None, "vepo")
    message = str(error.value)
    assert "\n" not in message and "'blip'" in message
    assert all(name in message for name in supported_families())
    with pytest.raises(ValueError, match="Supported families"):
        get_family("blip")
    # A model type TRL trains but VEPO cannot perturb yet: the refusal names what blocks it
    with pytest.raises(ValueError) as error:
        pixel_layout(Lfm2VlConfig(), None, "vepo")
    assert "\n" not in str(error.value) and "'lfm2_vl'" in str(error.value) and "spatial_shapes" in str(error.value)


# ---------------------------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", TRAINABLE)
def test_families_grpo_trainer_trains_one_step(tiny_dirs, dataset, tmp_path, family):
    trainer = GRPOTrainer(
        model=tiny_dirs[family],
        reward_funcs=alternating_reward,
        args=make_args(tmp_path, GRPOConfig),
        train_dataset=dataset,
    )
    before = trainable(trainer.model)
    trainer.train()
    assert moved(before, trainer.model)


# Every kind of strategy (with the paper's perturbation) and every perturbation (with the paper's strategy): what a
# family changes is the perturbed pass, which depends on the perturbation and on which signals and count a strategy
# reads; strategies alike in those differ only in family-free math (tests/test_scoring.py), and every strategy's full
# cross product with the perturbations runs on Qwen2.5-VL (tests/test_trainer.py). One strategy of each kind here
_KINDS = {}
for _name, _strategy in SELECTION_STRATEGIES.items():
    _KINDS.setdefault((_strategy.signals, _strategy.needs_perturbed_pass, _strategy.count), _name)
STEPS = sorted({(name, "diffusion") for name in _KINDS.values()} | {("vepo", name) for name in PERTURBATIONS})


@pytest.mark.parametrize("family", TRAINABLE)
@pytest.mark.parametrize(("strategy", "perturbation"), STEPS)
def test_families_vepo_trains_one_step(tiny_dirs, dataset, tmp_path, family, strategy, perturbation):
    trainer = VEPOTrainer(
        model=tiny_dirs[family],
        reward_funcs=alternating_reward,
        args=make_args(tmp_path, selection_strategy=strategy, perturbation=perturbation),
        train_dataset=dataset,
    )
    before = trainable(trainer.model)
    trainer.train()
    assert moved(before, trainer.model)
    logs = [entry for entry in trainer.state.log_history if "vepo/selected_fraction" in entry]
    assert logs
    fraction = logs[0]["vepo/selected_fraction"]
    assert fraction == 1.0 if strategy == "full" else 0 < fraction < 1
    if SELECTION_STRATEGIES[strategy].needs_perturbed_pass:
        # The perturbed forward ran, and the family's perturbed images moved the model's distributions
        assert trainer.num_perturbed_completions > 0
        assert logs[0]["vepo/jsd_mean"] > 1e-6
    else:
        assert trainer.num_perturbed_completions == 0


@pytest.mark.parametrize("family", TRAINABLE)
def test_families_rollout_time_scoring_equals_first_use(tiny_dirs, dataset, tmp_path, family):
    """The mask made on TRL's rollout-time forward (steps_per_generation > accumulation) is the one the first-use
    path makes for the same slice with the same weights and step."""
    from .support import first_batch, mask_with_weights

    if family == "llava-onevision":
        # TRL's own trainer fails on this family's rollout-time forward: shown with the parent (when TRL fixes it,
        # this fails: drop the limitation and VEPOTrainer's workaround, which then steps aside by itself)
        grpo = GRPOTrainer(
            model=tiny_dirs[family],
            reward_funcs=length_reward,
            args=make_args(tmp_path, GRPOConfig, steps_per_generation=2),
            train_dataset=dataset,
        )
        with pytest.raises(TypeError, match="batch_num_images"):
            grpo.train()
    # VEPOTrainer drops the keyword TRL's forward does not take (the model reads the layout from `image_sizes`)
    trainer = VEPOTrainer(
        model=tiny_dirs[family],
        reward_funcs=length_reward,
        args=make_args(tmp_path, steps_per_generation=2, score_zero_advantage_rows=True),
        train_dataset=dataset,
    )
    inputs = first_batch(trainer)
    assert trainer.selection_pipeline.trl_scores_at_rollout() and SELECTION_KEY in inputs
    assert trainer.num_perturbed_completions == 8  # the whole generation batch, scored at rollout
    assert torch.equal(inputs[SELECTION_KEY], mask_with_weights(trainer, inputs))


@pytest.mark.parametrize("family", TRAINABLE)
def test_families_idle_process_dummy_forward(tiny_dirs, dataset, tmp_path, family):
    """A process with nothing to score runs one small image through the model, made by the family's processor."""
    trainer = VEPOTrainer(
        model=tiny_dirs[family], reward_funcs=length_reward, args=make_args(tmp_path), train_dataset=dataset
    )
    calls = []
    vision = next(
        getattr(trainer.model.model, name)
        for name in ("visual", "vision_tower", "vision_model")
        if hasattr(trainer.model.model, name)
    )
    handle = vision.register_forward_hook(lambda *args: calls.append(1))
    trainer.perturbed_pass.dummy_forward(trainer.model)
    handle.remove()
    assert calls and "pixel_values" in trainer.perturbed_pass._dummy_inputs


def unequal_prompts(n=8):
    """Prompts of different lengths in one batch: each row's question padded with its own number of words."""
    rows = synthetic_training_dataset(n, seed=0).to_list()
    for i, row in enumerate(rows):
        part = next(p for p in row["prompt"][-1]["content"] if p["type"] == "text")
        part["text"] += " Think." * i
    return Dataset.from_list(rows, features=synthetic_training_dataset(n, seed=0).features)


@pytest.mark.parametrize(
    ("family", "error"), [("mistral3", "Unable to create tensor"), ("paligemma", "inhomogeneous shape")]
)
def test_families_unequal_prompts_fail_in_trls_own_trainer(tiny_dirs, tmp_path, family, error):
    """TRL 1.16's GRPOTrainer cannot tokenise Mistral 3 (PixtralProcessor returns tensors by default) or PaliGemma
    (its processor builds `labels` with np.array) prompts of different lengths. When TRL fixes it, this test fails:
    `prompt_padding` then steps aside on its own."""
    trainer = GRPOTrainer(
        model=tiny_dirs[family],
        reward_funcs=length_reward,
        args=make_args(tmp_path, GRPOConfig, per_device_train_batch_size=8, num_generations=2),
        train_dataset=unequal_prompts(),
    )
    with pytest.raises(ValueError, match=error):
        trainer.train()


@pytest.mark.parametrize("family", PADDING_TEXT)
def test_families_trls_own_trainer_trains_on_a_padding_processors_padding(tiny_dirs, tmp_path, family):
    """A processor whose text defaults pad (Gemma 4) pads TRL 1.16's "unpadded" prompt tokenisation: GRPOTrainer
    takes each shorter prompt's padding for prompt tokens (all attended to: two processes then train otherwise than
    one). When TRL fixes it, this test fails: `prompt_padding` then steps aside on its own."""
    trainer = GRPOTrainer(
        model=tiny_dirs[family],
        reward_funcs=length_reward,
        args=make_args(tmp_path, GRPOConfig, per_device_train_batch_size=8, num_generations=2),
        train_dataset=unequal_prompts(),
    )
    data = unequal_prompts()
    prompts = [row["prompt"] for row in data]
    for prompt, image in zip(prompts, data["images"]):
        prompt[-1]["content"][0]["image"] = image[0]
    ids, _, _ = trainer._tokenize_prompts(prompts)
    pad = trainer.processing_class.tokenizer.pad_token_id
    assert len({len(row) for row in ids}) == 1 and sum(pad in row for row in ids) == len(ids) - 1


@pytest.mark.parametrize("family", PADDED_TEXT)
def test_families_unequal_prompts_train_with_each_prompt_as_tokenised_alone(tiny_dirs, tmp_path, family):
    """VEPOTrainer pads then unpads the prompts of a processor whose text defaults return tensors (Mistral 3) or pad
    (Gemma 4): each prompt's ids equal that prompt tokenised alone, no padding among them, the images are the
    processor's, and `full` trains exactly as GRPOTrainer does with the same tokenisation."""
    from vepo_trl.trl_compat.prompt_padding import UnpaddedPromptIds, needs_padding

    data = unequal_prompts()
    args = make_args(tmp_path, per_device_train_batch_size=8, num_generations=2, selection_strategy="full")
    vepo = VEPOTrainer(model=tiny_dirs[family], reward_funcs=length_reward, args=args, train_dataset=data)
    assert needs_padding(vepo.processing_class)
    prompts = [row["prompt"] for row in data]
    for prompt, image in zip(prompts, data["images"]):
        prompt[-1]["content"][0]["image"] = image[0]
    ids, images, fields = vepo._tokenize_prompts(prompts)
    assert len({len(row) for row in ids}) > 1 and isinstance(ids[0], list)
    assert vepo.processing_class.apply_chat_template.__func__ is type(vepo.processing_class).apply_chat_template
    for prompt, row in zip(prompts, ids):
        alone = vepo.processing_class.apply_chat_template(
            [prompt], add_generation_prompt=True, tokenize=True, return_dict=True
        )
        assert torch.as_tensor(alone["input_ids"][0]).tolist() == row
        assert vepo.processing_class.tokenizer.pad_token_id not in row
    assert fields["pixel_values"].shape[0] == len(prompts)

    class PaddedGRPO(UnpaddedPromptIds, GRPOTrainer):
        pass

    # The same rollouts: GRPOTrainer given the media tokens VEPOTrainer bans (TRL bans the image token alone)
    banned = {"suppress_tokens": list(vepo._media_ids)}
    grpo = PaddedGRPO(
        model=tiny_dirs[family],
        reward_funcs=length_reward,
        args=make_args(
            tmp_path, GRPOConfig, per_device_train_batch_size=8, num_generations=2, generation_kwargs=banned
        ),
        train_dataset=data,
    )
    grpo.model.load_state_dict(vepo.model.state_dict())
    for trainer in (vepo, grpo):
        set_seed(0)  # the same rollouts
        trainer.train()
    assert vepo.state.log_history[0]["reward"] == grpo.state.log_history[0]["reward"]
    for (name, p), q in zip(vepo.model.named_parameters(), grpo.model.parameters()):
        assert torch.equal(p, q), name


def test_families_prompt_padding_leaves_other_processors_alone():
    from vepo_trl.trl_compat.prompt_padding import needs_padding

    for family in FAMILY_NAMES:
        processor = build_tiny(family)[1]
        assert needs_padding(processor) == (family in ("mistral3", "paligemma", "gemma4")), family


def test_families_paligemma_trains_on_unequal_prompts(tiny_dirs, tmp_path):
    trainer = VEPOTrainer(
        model=tiny_dirs["paligemma"],
        reward_funcs=length_reward,
        args=make_args(tmp_path, per_device_train_batch_size=8, num_generations=2),
        train_dataset=unequal_prompts(),
    )
    before = trainable(trainer.model)
    trainer.train()
    assert moved(before, trainer.model)


def _completion_logps(trainer, forward, inputs):
    ids, mask = (
        torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
        torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1),
    )
    keys = ("pixel_values", "num_images", "token_type_ids")
    with torch.no_grad():
        return forward(trainer.model, ids, mask, inputs["completion_ids"].size(1), **{k: inputs[k] for k in keys})[0]


def test_families_paligemma_completion_is_scored_causally_where_trl_scores_it_bidirectionally(tiny_dirs, tmp_path):
    """PaliGemma is a prefix LM: `token_type_ids` 0 attend bidirectionally. TRL 1.16 extends them with zeros over the
    completion, so a completion token's log-prob depends on the tokens after it (shown on GRPOTrainer's own forward);
    VEPOTrainer marks the completion causal, as `generate` sampled it: changing the last token changes only its own
    log-prob, and each log-prob equals the forward of the sequence cut after that token. When TRL fixes it, the first
    half fails."""
    trainer = VEPOTrainer(
        model=tiny_dirs["paligemma"],
        reward_funcs=length_reward,
        args=make_args(tmp_path, per_device_train_batch_size=4, num_generations=4, max_completion_length=6),
        train_dataset=synthetic_training_dataset(4, seed=0),
    )
    inputs = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    length = inputs["completion_ids"].size(1)
    prompt_length = inputs["prompt_ids"].size(1)
    assert bool((inputs["token_type_ids"][:, prompt_length:] == 1).all())
    changed = {**inputs, "completion_ids": inputs["completion_ids"].clone()}
    changed["completion_ids"][:, -1] = (changed["completion_ids"][:, -1] + 1) % 50
    changed["completion_mask"] = torch.ones_like(changed["completion_mask"])
    inputs = {**inputs, "completion_mask": torch.ones_like(inputs["completion_mask"])}
    grpo_forward = GRPOTrainer._get_per_token_logps_and_entropies.__get__(trainer)
    # TRL's own token types: zeros over the completion
    trl_types = {"token_type_ids": torch.cat([inputs["token_type_ids"][:, :prompt_length],
                                              torch.zeros_like(inputs["completion_ids"])], 1)}  # fmt: skip
    upstream = _completion_logps(trainer, grpo_forward, {**inputs, **trl_types})
    upstream_changed = _completion_logps(trainer, grpo_forward, {**changed, **trl_types})
    assert (upstream[:, :-1] - upstream_changed[:, :-1]).abs().max() > 1e-4
    ours = _completion_logps(trainer, grpo_forward, inputs)
    ours_changed = _completion_logps(trainer, grpo_forward, changed)
    torch.testing.assert_close(ours[:, :-1], ours_changed[:, :-1], atol=1e-5, rtol=0)
    for cut in range(1, length):
        cut_inputs = {
            **inputs,
            "completion_ids": inputs["completion_ids"][:, :cut],
            "completion_mask": inputs["completion_mask"][:, :cut],
            "token_type_ids": inputs["token_type_ids"][:, : prompt_length + cut],
        }
        torch.testing.assert_close(_completion_logps(trainer, grpo_forward, cut_inputs), ours[:, :cut], atol=1e-5,
                                   rtol=1e-5)  # fmt: skip


@pytest.mark.parametrize("family", TRAINABLE)
def test_families_identity_perturbation_gives_no_signal(tiny_dirs, dataset, tmp_path, family):
    trainer = VEPOTrainer(
        model=tiny_dirs[family],
        reward_funcs=alternating_reward,
        args=make_args(tmp_path, perturbation="gaussian", noise_sigma=0.0),  # the identity
        train_dataset=dataset,
    )
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "vepo/jsd_mean" in entry]
    assert logs and trainer.num_perturbed_completions > 0
    assert logs[0]["vepo/jsd_mean"] < 1e-6
    assert logs[0]["vepo/entropy_gap_abs_mean"] < 1e-5


@pytest.mark.parametrize("family", TRAINABLE)
def test_families_full_strategy_equals_grpo(tiny_dirs, dataset, tmp_path, family):
    vepo = VEPOTrainer(
        model=tiny_dirs[family],
        reward_funcs=length_reward,
        args=make_args(tmp_path, selection_strategy="full"),
        train_dataset=dataset,
    )
    grpo = GRPOTrainer(
        model=tiny_dirs[family],
        reward_funcs=length_reward,
        args=make_args(tmp_path, GRPOConfig),
        train_dataset=dataset,
    )
    grpo.model.load_state_dict(vepo.model.state_dict())
    for trainer in (vepo, grpo):
        trainer.model.train()
        trainer.state.global_step = 0
        trainer.current_gradient_accumulation_steps = 1
    inputs = vepo._prepare_inputs(next(iter(vepo.get_train_dataloader())))
    assert inputs["pixel_values"] is not None
    grpo_inputs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items() if k != SELECTION_KEY}
    vepo_loss = vepo.compute_loss(vepo.model, inputs)
    grpo_loss = grpo.compute_loss(grpo.model, grpo_inputs)
    assert torch.equal(vepo_loss.detach(), grpo_loss.detach())
    vepo_loss.backward()
    grpo_loss.backward()
    for (name, p), q in zip(vepo.model.named_parameters(), grpo.model.parameters()):
        if p.grad is not None:
            assert torch.equal(p.grad, q.grad), name


# ---------------------------------------------------------------------------------------------------------------------
# What each perturbation does to each family's pixel_values
# ---------------------------------------------------------------------------------------------------------------------

_PROCESSORS = {}


def processed(family, images):
    """The family's processor on `images` (one prompt with all of them): its `pixel_values`, grid and layout."""
    if family not in _PROCESSORS:
        model, processor = build_tiny(family)
        _PROCESSORS[family] = (processor, pixel_layout(model, processor.image_processor))
    processor, layout = _PROCESSORS[family]
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": "How many?"}]
    text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    encoded = processor(images=images, text=[text], return_tensors="pt")
    # Mistral3 pads a batch's images to the largest: `image_sizes` tells the layout which pixels are the image's
    # (Idefics2: `pixel_attention_mask` marks them)
    grid = encoded.get("image_grid_thw")
    sizes = {"image_sizes": encoded.get("image_sizes")}
    if getattr(layout, "crop_to_pixel_mask", False):
        sizes["pixel_attention_mask"] = encoded["pixel_attention_mask"]
    if isinstance(layout, PositionedPatchLayout):  # Gemma 4: where each patch row lies, -1 for padding
        sizes["image_position_ids"] = encoded["image_position_ids"]
    return encoded["pixel_values"], grid, layout, sizes


def positioned_units(values, layout, sizes):
    """Padded patch rows (Gemma 4) cut like `image_pixels`: the images' own rows in [0, 1] space `(rows, P * P, C)`,
    and the padding rows as they are."""
    real = (sizes["image_position_ids"] >= 0).all(-1)
    rows = values[real].float().reshape(-1, layout.patch_size**2, layout.channels)
    unit = rows * torch.tensor(layout.image_std) + torch.tensor(layout.image_mean)
    return unit, values[~real]


def random_image(width, height, seed):
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (height, width, 3), generator=generator, dtype=torch.uint8)
    return Image.fromarray(pixels.numpy())


def images_of_two_sizes():
    return [random_image(70, 50, 0), random_image(40, 90, 1)]


def image_pixels(values, clean, layout, sizes):
    """`values` cut like the clean `pixel_values` of an image layout: each image tile's own pixels `(C, h, w)` (all of
    the tile, or its top-left `image_sizes` part for Mistral3), and every other value (padding tiles, padded pixels)."""
    tiles, clean_tiles = values.reshape(-1, *values.shape[-3:]), clean.reshape(-1, *clean.shape[-3:])
    image_sizes = sizes.get("image_sizes") if layout.crop_to_image_sizes else None
    if layout.crop_to_pixel_mask:  # Idefics2: each tile's real (h, w) from its pixel mask
        masks = sizes["pixel_attention_mask"].reshape(-1, *values.shape[-2:]).bool()
        image_sizes = torch.tensor([[int(m.any(1).sum()), int(m.any(0).sum())] for m in masks])
    own, rest = [], []
    if layout.grid_pinpoints and sizes.get("image_sizes") is not None:
        # Any-res crops: the image's pixels are each crop's box inside its letterbox (`perturb.anyres_boxes`), shaped
        # (C, 1, n) so that per-channel statistics still broadcast
        from vepo_trl.perturb import letterbox_boxes

        boxes = letterbox_boxes(clean, layout, sizes["image_sizes"])
        for tile, box in zip(tiles, boxes):
            inside = torch.zeros(tile.shape[-2:], dtype=torch.bool)
            if box is not None:
                inside[box[0] : box[1], box[2] : box[3]] = True
                own.append(tile[:, inside].unsqueeze(1))
            rest.append(tile[:, ~inside])
        return own, torch.cat(rest, 1)
    for index, (tile, clean_tile) in enumerate(zip(tiles, clean_tiles)):
        h, w = image_sizes[index].tolist() if image_sizes is not None else tile.shape[-2:]
        inside = torch.zeros(tile.shape[-2:], dtype=torch.bool)
        inside[:h, :w] = True
        if clean_tile[:, :h, :w].any():
            own.append(tile[:, :h, :w])
            rest.append(tile[:, ~inside])
        else:
            rest.append(tile.flatten(1))
    return own, torch.cat(rest, 1)


def real_tiles(pixel_values):
    """`(N, C, H, W)` tiles of an image layout and which of them are images (padding tiles are all zero)."""
    tiles = pixel_values.reshape(-1, *pixel_values.shape[-3:])
    return tiles, (tiles != 0).flatten(1).any(-1)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_families_black_image_equals_the_processor_on_a_black_image(family):
    """Black in normalised space is the family's own: the processor run on black images of the same sizes."""
    pixel_values, grid, layout, sizes = processed(family, images_of_two_sizes())
    black_pixels, black_grid, _, _ = processed(
        family, [Image.new("RGB", image.size) for image in images_of_two_sizes()]
    )
    assert black_grid is None or torch.equal(grid, black_grid)
    for name, params in (("black_image", {}), ("patch_blackout", {"patch_probability": 1.0})):
        out = perturb_pixel_values(name, pixel_values, grid, layout, seed=3, **params, **sizes)
        torch.testing.assert_close(out, black_pixels, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_families_patch_blackout_blacks_out_exactly_the_models_patches(family):
    pixel_values, grid, layout, sizes = processed(family, images_of_two_sizes())
    out = perturb_pixel_values(
        "patch_blackout", pixel_values, grid, layout, seed=3, step=1, patch_probability=0.5, **sizes
    )
    black = perturb_pixel_values("black_image", pixel_values, grid, layout, **sizes)
    if isinstance(layout, PositionedPatchLayout):
        # A real row is one of the model's 16-px patches: clean or entirely black; padding rows stay
        real = (sizes["image_position_ids"] >= 0).all(-1)
        kept, dropped = (out == pixel_values).all(-1), (out == black).all(-1)
        assert bool(kept[~real].all()) and bool((kept | dropped)[real].all())
        assert 0.3 < dropped[real].float().mean() < 0.7
        return
    if isinstance(layout, PixelLayout):
        # A row is one of the model's patches: each row is the clean one or entirely black
        kept = (out == pixel_values).all(-1)
        dropped = (out == black).all(-1)
        assert bool((kept | dropped).all()) and 0.3 < dropped.float().mean() < 0.7
        return
    tiles, real = real_tiles(pixel_values)
    out_tiles, black_tiles = real_tiles(out)[0], real_tiles(black)[0]
    p = layout.patch_size
    fractions = []
    masks = sizes.get("pixel_attention_mask")
    masks = masks.reshape(-1, *tiles.shape[-2:]).bool() if masks is not None else [None] * len(tiles)
    for tile, perturbed, black_tile, is_real, mask in zip(tiles, out_tiles, black_tiles, real, masks):
        if not is_real:
            assert torch.equal(perturbed, tile)  # padding stays padding
            continue
        height, width = tile.shape[-2:]
        changed = (perturbed != tile).any(0)
        if mask is not None:
            # Idefics2: pixels outside the image's mask stay; its patches are the ones covering the image
            h, w = int(mask.any(1).sum()), int(mask.any(0).sum())
            assert not changed[h:].any() and not changed[:, w:].any()
            height, width = min(height, -(-h // p) * p), min(width, -(-w // p) * p)
            tile, perturbed, black_tile = (t[:, :height, :width] for t in (tile, perturbed, black_tile))
            changed = changed[:height, :width]
        assert torch.equal(perturbed[:, changed], black_tile[:, changed])

        # Changed pixels form whole p x p squares of the model's patch grid, and pixels past it never change (a
        # square across an any-res crop's letterbox changes only its image part: the letterbox is black already)
        def per_square(mask, height=height, width=width):
            squares = mask[: height // p * p, : width // p * p].reshape(height // p, p, width // p, p)
            return squares.float().mean((1, 3))

        per_patch = per_square(changed)
        all_black = per_square((perturbed == black_tile).all(0)) == 1
        assert bool(((per_patch == 0) | ((per_patch > 0) & all_black)).all())
        per_patch = (per_patch > 0).float()
        assert not changed[height // p * p :].any() and not changed[:, width // p * p :].any()
        fractions.append(per_patch.mean())
    assert 0.3 < torch.stack(fractions).mean() < 0.7


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_families_diffusion_noise_is_the_same_in_image_space(family):
    """`diffusion` at step tau: `(I' - sqrt(abar) I) / sqrt(1 - abar)` is standard normal noise per pixel of the image
    the vision tower sees (where the clamp did not bite), on every family."""
    pixel_values, grid, layout, sizes = processed(family, images_of_two_sizes())
    noise_step = 300
    out = perturb_pixel_values("diffusion", pixel_values, grid, layout, seed=1, step=2, noise_step=noise_step, **sizes)
    abar = diffusion_alpha_bar(noise_step)
    if isinstance(layout, PixelLayout):
        clean, noisy = layout.to_unit(pixel_values), layout.to_unit(out)
        # Both temporal copies of a still frame carry the same noise
        half = clean.shape[-1] // 2
        torch.testing.assert_close(noisy[..., :half], noisy[..., half:], atol=1e-5, rtol=0)
    elif isinstance(layout, PositionedPatchLayout):
        (clean, clean_rest), (noisy, noisy_rest) = (positioned_units(v, layout, sizes) for v in (pixel_values, out))
        assert torch.equal(noisy_rest, clean_rest)  # padding rows untouched
    else:
        clean_own, clean_rest = image_pixels(pixel_values, pixel_values, layout, sizes)
        noisy_own, noisy_rest = image_pixels(out, pixel_values, layout, sizes)
        assert torch.equal(noisy_rest, clean_rest)  # padding untouched
        clean = torch.cat([layout.to_unit(t).flatten() for t in clean_own])
        noisy = torch.cat([layout.to_unit(t).flatten() for t in noisy_own])
    assert noisy.min() >= -1e-5 and noisy.max() <= 1 + 1e-5
    noise = (noisy - math.sqrt(abar) * clean) / math.sqrt(1 - abar)
    inside = (noisy > 1e-4) & (noisy < 1 - 1e-4)
    # Clamping truncates the tails: compare with the same truncation of a standard normal draw of the same size
    reference = (math.sqrt(abar) * clean + math.sqrt(1 - abar) * torch.randn(clean.shape)).clamp(0, 1)
    ref_noise = (reference - math.sqrt(abar) * clean) / math.sqrt(1 - abar)
    ref_inside = (reference > 1e-4) & (reference < 1 - 1e-4)
    assert abs(noise[inside].std() - ref_noise[ref_inside].std()) < 0.05
    assert abs(noise[inside].mean() - ref_noise[ref_inside].mean()) < 0.05


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_families_mean_image_and_gaussian(family):
    pixel_values, grid, layout, sizes = processed(family, images_of_two_sizes())
    mean = perturb_pixel_values("mean_image", pixel_values, grid, layout, **sizes)
    noisy = perturb_pixel_values("gaussian", pixel_values, grid, layout, seed=4, sigma=2.0, **sizes)
    if isinstance(layout, PixelLayout):
        assert torch.equal(mean, torch.zeros_like(pixel_values))
        assert abs((noisy - pixel_values).std() - 2.0) < 0.05
        return
    if isinstance(layout, PositionedPatchLayout):
        real = (sizes["image_position_ids"] >= 0).all(-1)
        assert torch.equal(mean[real], torch.zeros_like(pixel_values[real]))  # mean 0: Gemma 4 does not normalise
        assert torch.equal(mean[~real], pixel_values[~real]) and torch.equal(noisy[~real], pixel_values[~real])
        assert abs((noisy - pixel_values)[real].std() - 2.0) < 0.05
        return
    clean_own, clean_rest = image_pixels(pixel_values, pixel_values, layout, sizes)
    mean_own, mean_rest = image_pixels(mean, pixel_values, layout, sizes)
    noisy_own, noisy_rest = image_pixels(noisy, pixel_values, layout, sizes)
    assert torch.equal(mean_rest, clean_rest) and torch.equal(noisy_rest, clean_rest)
    differences = torch.cat([(n - c).flatten() for n, c in zip(noisy_own, clean_own)])
    assert abs(differences.std() - 2.0) < 0.05
    for tile in mean_own:
        flat = tile.flatten()
        if layout.zero_tile_is_padding:
            # All 0 but one value, the smallest normal float: the model still counts the tile as an image
            assert flat[0] == torch.finfo(flat.dtype).tiny and not flat[1:].any()
        else:
            assert not flat.any()


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_families_each_image_perturbed_alone_as_in_a_batch(family):
    """A prompt's perturbed image depends on nothing else in the batch (one image vs the same image beside another)."""
    first, second = images_of_two_sizes()
    both, grid_both, layout, sizes_both = processed(family, [first, second])
    alone, grid_alone, _, sizes_alone = processed(family, [first])
    for name in ("diffusion", "patch_blackout", "gaussian"):
        out_both = perturb_pixel_values(name, both, grid_both, layout, seed=5, step=1, **sizes_both)
        out_alone = perturb_pixel_values(name, alone, grid_alone, layout, seed=5, step=1, **sizes_alone)
        if isinstance(layout, (PixelLayout, PositionedPatchLayout)):  # rows, or one padded row set per image
            torch.testing.assert_close(out_both[: alone.shape[0]], out_alone, atol=0, rtol=0)
        else:
            own_alone = image_pixels(out_alone, alone, layout, sizes_alone)[0]
            own_both = image_pixels(out_both, both, layout, sizes_both)[0]
            # The first image's tiles come first in both batches
            for tile_alone, tile_both in zip(own_alone, own_both):
                assert torch.equal(tile_both, tile_alone)


def test_families_tiny_models_load_from_their_folders(tiny_dirs):
    for family in ("qwen3-vl", "gemma3"):
        model = AutoModelForImageTextToText.from_pretrained(tiny_dirs[family])
        processor = AutoProcessor.from_pretrained(tiny_dirs[family])
        assert family_of(model) is get_family(family)
        assert isinstance(pixel_layout(model, processor.image_processor), (PixelLayout, ImageLayout))


def _prompt(processor, images):
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": "How many?"}]
    return processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_families_rows_with_0_1_2_images_scored_alone_as_batched(family):
    """Responses whose prompts hold 1, 2, 0 and 2 images of different sizes: the pixel inputs `take_rows` cuts out of
    the batch (TRL's own split) give each one the same clean and perturbed forward as its prompt processed alone."""
    from vepo_trl.batch import take_rows

    model, processor = build_tiny(family)
    model.eval()
    layout = pixel_layout(model, processor.image_processor)
    rows = [
        [random_image(70, 50, 0)],
        [random_image(40, 90, 1), random_image(60, 60, 2)],
        [],
        [random_image(90, 40, 3), random_image(50, 70, 4)],
    ]
    if family == "paligemma":  # its processor refuses a text-only prompt (refused at start-up)
        rows[2] = [random_image(30, 30, 5)]
    texts = [_prompt(processor, images) for images in rows]
    batch = dict(processor(images=rows, text=texts, return_tensors="pt", padding=True))
    batch["num_images"] = [len(images) for images in rows]
    if batch["pixel_values"].ndim == 4 and batch["pixel_values"].size(0) != sum(batch["num_images"]):
        # Tile-indexed pixel_values (InternVL): TRL counts each prompt's tiles with the image processor, as here
        flat = [image for images in rows for image in images]
        tiles = processor.image_processor(images=flat, crop_to_patches=True, return_tensors="pt")["num_patches"]
        batch["num_tiles"] = [int(group.sum()) for group in torch.split(torch.as_tensor(tiles), batch["num_images"])]
    pixel_keys = ("pixel_values", "image_grid_thw", "pixel_attention_mask", "image_sizes", "image_position_ids")
    with torch.no_grad():
        for index, images in enumerate(rows):
            alone = dict(processor(images=[images] if images else None, text=[texts[index]], return_tensors="pt"))
            taken = take_rows(batch, torch.tensor([index]))
            text_inputs = {k: v for k, v in alone.items() if k not in (*pixel_keys, "labels")}
            for name in (None, "diffusion", "patch_blackout"):
                logits = []
                for source in (alone, taken):
                    pixels = {k: source[k] for k in pixel_keys if source.get(k) is not None}
                    if name is not None and pixels:
                        pixels["pixel_values"] = perturb_pixel_values(
                            name,
                            pixels["pixel_values"],
                            pixels.get("image_grid_thw"),
                            layout,
                            seed=2,
                            step=1,
                            image_sizes=pixels.get("image_sizes"),
                            pixel_attention_mask=pixels.get("pixel_attention_mask"),
                            image_position_ids=pixels.get("image_position_ids"),
                        )
                    logits.append(model(**text_inputs, **pixels).logits[0, -3:])
                torch.testing.assert_close(logits[1], logits[0], atol=1e-5, rtol=1e-5)


def test_families_demo_runs_on_a_family(tmp_path, monkeypatch):
    from vepo_trl.cli import main

    monkeypatch.setenv("VEPO_TRL_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "demo"
    main(["demo", "--model_family", "gemma3", "--max_steps", "2", "--logging_steps", "1", "--output_dir", str(out)])
    assert (out / "config.json").is_file() and (out / "metrics.jsonl").is_file()
    assert "gemma3" in (out / "config.json").read_text()
    assert (tmp_path / "cache" / "tiny-gemma3-seed0").is_dir()


@pytest.mark.parametrize(
    ("family", "expected"), [("llava-1.5", "one of qwen2-vl, "), ("no-such", "one of qwen2-vl, ")]
)
def test_families_demo_refuses_a_family_in_one_line(capsys, family, expected):
    from vepo_trl.cli import main

    with pytest.raises(SystemExit) as error:
        main(["demo", "--model_family", family])
    assert error.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"--model_family {family}: " in err and expected in err


# ---------------------------------------------------------------------------------------------------------------------
# Recipes for other families: the 7B paper recipe with the model changed, and only what the header explains
# ---------------------------------------------------------------------------------------------------------------------

RECIPES = Path(__file__).resolve().parent.parent / "recipes"
FAMILY_RECIPES = {
    "Qwen3-VL-4B-Instruct": (
        "Qwen/Qwen3-VL-4B-Instruct",
        "qwen3-vl",
        {"min_pixels": 342_016, "max_pixels": 1_305_600},
    ),
    "Qwen3-VL-8B-Instruct": (
        "Qwen/Qwen3-VL-8B-Instruct",
        "qwen3-vl",
        {"min_pixels": 342_016, "max_pixels": 1_305_600},
    ),
    "gemma-3-4b-it": ("google/gemma-3-4b-it", "gemma3", {"attn_implementation": "sdpa"}),
}


def _recipe_fields(path):
    from vepo_trl.train import make_parser

    fields = {}
    for args in make_parser().parse_args_and_config(["--config", str(path), "--use_cpu", "true"]):
        fields.update(vars(args))
    return fields


@pytest.mark.parametrize("model", list(FAMILY_RECIPES))
def test_families_recipe_is_the_paper_recipe_scaled(model):
    hub_id, family, changes = FAMILY_RECIPES[model]
    assert family in trainable_families()
    paper = _recipe_fields(RECIPES / "Qwen2.5-VL-7B-Instruct" / "vepo" / "config_paper.yaml")
    recipe = _recipe_fields(RECIPES / model / "vepo" / "config_paper.yaml")
    expected = {
        **paper,
        **changes,
        "model_name_or_path": hub_id,
        "output_dir": f"data/{model}-VEPO",
    }
    derived = {"run_name", "distributed_state"}  # from output_dir and the machine
    assert {k: v for k, v in recipe.items() if k not in derived and v != expected.get(k)} == {}
    # Qwen3-VL: the paper's 334..1,275 visual tokens per image, at 32x32 pixels per token
    if family == "qwen3-vl":
        assert (recipe["min_pixels"] // 32**2, recipe["max_pixels"] // 32**2) == (334, 1275)
        assert (paper["min_pixels"] // 28**2, paper["max_pixels"] // 28**2) == (334, 1275)


def registry_page(name: str) -> str:
    """A docs page as the site shows it: its registry tables filled in by the build's hook (docs/_hooks)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("registry_tables", REPO / "docs" / "_hooks" / "registry_tables.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    return hook.fill((REPO / "docs" / name).read_text())


def test_families_readme_table_is_the_registry():
    from vepo_trl.families import supported_models_table

    readme = registry_page("models.md")
    marker = "<!-- table: vepo_trl.families.supported_models_table -->\n"
    start = readme.index(marker) + len(marker)
    table = readme[start : readme.index("\n\n", start) + 1]
    assert table == supported_models_table()
    for family in FAMILIES:
        for recipe in family.recipes:
            assert (RECIPES / recipe).is_dir()


@pytest.mark.parametrize("family", ["internvl", "smolvlm", "llava-next"])
def test_families_identical_tiles_of_one_image_get_their_own_noise(family):
    """A diagram on a white page: its background tiles are identical, and seeding a tile from its content alone gave
    them identical noise (InternVL's 9 real tiles carried 5 noise fields). Each tile now gets its own."""
    from PIL import ImageDraw

    page = Image.new("RGB", (896, 896), (255, 255, 255))
    ImageDraw.Draw(page).rectangle((40, 40, 200, 160), outline=(0, 0, 0), width=6)
    pixel_values, grid, layout, sizes = processed(family, [page])
    tiles = pixel_values.reshape(-1, *pixel_values.shape[-3:])
    groups = [tiles.shape[0]] if pixel_values.ndim == 4 else None  # InternVL: the response's tiles (TRL's num_tiles)
    out = perturb_pixel_values("diffusion", pixel_values, grid, layout, seed=0, step=3, tile_groups=groups, **sizes)
    noise = (out - pixel_values).reshape(tiles.shape)
    real = [i for i in range(tiles.shape[0]) if tiles[i].any()]
    inputs = {tiles[i].numpy().tobytes() for i in real}
    assert len(inputs) < len(real)  # the page does have identical tiles
    assert len({noise[i].numpy().tobytes() for i in real}) == len(real)
    # Still a function of the image alone: the same call gives the same noise
    again = perturb_pixel_values("diffusion", pixel_values, grid, layout, seed=0, step=3, tile_groups=groups, **sizes)
    assert torch.equal(again, out)


def test_gaussian_strength_table_is_the_registry_and_the_noise_it_describes():
    """`gaussian` keeps the release's definition (noise on normalised pixels): its [0, 1]-space std is sigma x the
    family's normalisation std, measured here through the perturbation on each reference std."""
    from vepo_trl.families import FAMILIES, gaussian_strength_table
    from vepo_trl.perturb import ImageLayout

    readme = registry_page("models.md")
    marker = "<!-- table: vepo_trl.families.gaussian_strength_table -->\n"
    start = readme.index(marker) + len(marker)
    assert readme[start : readme.index("\n\n", start) + 1] == gaussian_strength_table()
    for family in FAMILIES:
        if family.reference is None:
            continue
        std = family.reference[1]
        layout = ImageLayout(image_mean=(0.5, 0.5, 0.5), image_std=std)
        tile = torch.full((3, 64, 64), 0.1)  # an all-zero tile would be padding
        noisy = perturb_pixel_values("gaussian", tile[None], None, layout, seed=1, sigma=2.0)[0]
        unit_std = (layout.to_unit(noisy) - layout.to_unit(tile)).flatten(1).std(1)
        torch.testing.assert_close(unit_std, 2.0 * torch.tensor(std), rtol=0.05, atol=0)


def test_llava_onevision_trains_with_a_reference_model_where_trls_trainer_cannot(tiny_dirs, dataset, tmp_path):
    """beta > 0 runs a reference forward through TRL's log-prob forward, which raises on the processor's
    `batch_num_images` in GRPOTrainer; VEPOTrainer drops the keyword and trains (`full` and `vepo`)."""
    model = tiny_dirs["llava-onevision"]
    grpo = GRPOTrainer(
        model=model, reward_funcs=length_reward, args=make_args(tmp_path, GRPOConfig, beta=0.1), train_dataset=dataset
    )
    with pytest.raises(TypeError, match="batch_num_images"):
        grpo.train()
    for strategy in ("full", "vepo"):
        trainer = VEPOTrainer(
            model=model,
            reward_funcs=length_reward,
            args=make_args(tmp_path / strategy, beta=0.1, selection_strategy=strategy),
            train_dataset=dataset,
        )
        trainer.train()
        logs = [entry for entry in trainer.state.log_history if "loss" in entry]
        assert trainer.state.global_step == 1 and "kl" in logs[0] and math.isfinite(logs[0]["loss"])


def test_inputs_trl_cannot_split_are_refused_at_start_up(tiny_dirs, dataset, tmp_path):
    """Gemma 3 with pan-and-scan and LLaVA-OneVision prompts with two images crash inside TRL 1.16 (the parent is
    shown failing on the latter); VEPOTrainer refuses both in one line before training."""
    from datasets import Dataset
    from transformers import AutoProcessor

    rows = [dict(dataset[i]) for i in range(len(dataset))]
    for row in rows:
        row["images"] = row["images"] * 2
        question = [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Same?"}]
        row["prompt"] = [row["prompt"][0], {"role": "user", "content": question}]
    two_images = Dataset.from_list(rows, features=dataset.features)
    model = tiny_dirs["llava-onevision"]
    grpo = GRPOTrainer(model=model, reward_funcs=length_reward, args=make_args(tmp_path, GRPOConfig),
                       train_dataset=two_images)  # fmt: skip
    with pytest.raises(RuntimeError, match="split_with_sizes"):  # deep in the model's crop split
        grpo.train()
    with pytest.raises(ValueError, match=r"LLaVA-OneVision with 2 images in one prompt \(train_dataset row 0\)"):
        VEPOTrainer(model=model, reward_funcs=length_reward, args=make_args(tmp_path), train_dataset=two_images)
    processor = AutoProcessor.from_pretrained(tiny_dirs["gemma3"])
    processor.images_kwargs = {**processor.images_kwargs, "do_pan_and_scan": True}
    with pytest.raises(ValueError, match="do_pan_and_scan on"):
        VEPOTrainer(model=tiny_dirs["gemma3"], reward_funcs=length_reward, args=make_args(tmp_path),
                    train_dataset=dataset, processing_class=processor)  # fmt: skip


def test_paligemma_inputs_it_cannot_take_are_refused_at_start_up(tiny_dirs, tmp_path):
    """PaliGemma without a chat template (its checkpoints ship none), with vLLM, or with a text-only row in the
    eval data or in TRL's `image` column form: one line before training."""
    from vepo_trl.families import check_family_inputs

    model = AutoModelForImageTextToText.from_pretrained(tiny_dirs["paligemma"])
    processor = AutoProcessor.from_pretrained(tiny_dirs["paligemma"])
    check_family_inputs(
        model.config, processor, {"train_dataset": synthetic_training_dataset(2), "eval_dataset": None}
    )
    with pytest.raises(ValueError, match="use_vllm"):
        check_family_inputs(model.config, processor, use_vllm=True)
    text_only = Dataset.from_list([{"prompt": "a", "image": None}, {"prompt": "b", "image": None}])
    with pytest.raises(ValueError, match=r"eval_dataset\['a'\] row 0 has none"):
        check_family_inputs(model.config, processor, {"train_dataset": None, "eval_dataset": {"a": text_only}})
    processor.chat_template = processor.tokenizer.chat_template = None
    with pytest.raises(ValueError, match="no chat template") as error:
        VEPOTrainer(model=tiny_dirs["paligemma"], reward_funcs=length_reward, processing_class=processor,
                    args=make_args(tmp_path), train_dataset=synthetic_training_dataset(4, seed=0))  # fmt: skip
    assert "\n" not in str(error.value)


def test_gemma3_pan_and_scan_fails_in_trls_own_trainer(tiny_dirs, tmp_path):
    """Upstream failure behind the start-up refusal: with pan-and-scan on, Gemma 3's processor adds crops per image,
    and TRL 1.16's GRPOTrainer splits `pixel_values` by image count. When this stops failing, TRL handles the crops
    and the refusal in `families.check_family_inputs` can go."""
    processor = AutoProcessor.from_pretrained(tiny_dirs["gemma3"])
    # The processor's own image defaults decide (Gemma3Processor.images_kwargs; the image processor's attribute is
    # overridden by them): pan-and-scan on, the minimum crop at the tiny model's scale (56 px images)
    processor.images_kwargs = {**processor.images_kwargs, "do_pan_and_scan": True, "pan_and_scan_min_crop_size": 28}
    rows = synthetic_training_dataset(4, seed=0).to_list()
    for row in rows:
        row["images"] = [Image.new("RGB", (448, 112), (200, 30, 30))]  # wide: 4:1 activates pan-and-scan
    wide = Dataset.from_list(rows, features=synthetic_training_dataset(4, seed=0).features)
    text = processor.apply_chat_template(wide[0]["prompt"], add_generation_prompt=True)
    crops = processor(text=[text], images=[wide[0]["images"]], return_tensors="pt")["pixel_values"]
    assert crops.shape[0] > 1  # the image and its crops
    grpo = GRPOTrainer(model=tiny_dirs["gemma3"], reward_funcs=length_reward, processing_class=processor,
                       args=make_args(tmp_path, GRPOConfig), train_dataset=wide)  # fmt: skip
    # TRL takes more pixel_values than images for InternVL's tiles and counts them with `crop_to_patches`
    with pytest.raises(TypeError, match="crop_to_patches"):
        grpo.train()
