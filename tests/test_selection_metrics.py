"""The selection pipeline's parts that need no trainer: the batch metrics on hand-made signals, and the per-row split
of multimodal inputs against a plain re-implementation of the Qwen2-VL layout."""

import math

import pytest
import torch

from vepo_trl import batch as batch_module
from vepo_trl.batch import MODEL_INPUT_KEYS, MULTIMODAL_KEYS, Batch, take_rows
from vepo_trl.scoring import TokenSignals
from vepo_trl.selection_metrics import selection_metrics


def hand_made_batch():
    # Two responses of three positions. Row 0 has an image and went through the perturbed pass; row 1 has an image
    # but was skipped (zero advantage) and its third position is padding.
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    selected = torch.tensor([[0, 0, 1], [0, 1, 0]], dtype=torch.bool)
    scored = torch.tensor([True, False])
    has_image = torch.tensor([True, True])
    signals = TokenSignals(
        entropy=torch.tensor([[3.0, 2.0, 1.0], [4.0, 5.0, 6.0]]),
        perturbed_entropy=torch.tensor([[3.5, 1.0, 1.0], [4.0, 5.0, 6.0]]),  # gap row 0: +0.5, -1.0, 0.0
        jsd=torch.tensor([[0.1, 0.2, 0.3], [0.0, 0.0, 0.0]]),
    )
    return signals, mask, selected, scored, has_image


def test_selection_metrics_by_hand():
    metrics = selection_metrics(*hand_made_batch(), ratio=0.2, alpha=0.5, perturbed_pass=True)
    # ratio 0.2 of 3 tokens: one token per response (ceil 0.6)
    score = [1 - math.sqrt(0.5), 1.0 * 0.5, 0.0]  # g * h_hat per visual token, alpha 0.5 (see below)
    expected = {
        "vepo/selected_fraction": 2 / 5,  # 2 selected of 5 valid
        "vepo/selected_fraction_std": 1 / 12,  # shares 1/3 and 1/2
        "vepo/image_rows_fraction": 1.0,
        "vepo/entropy_all_mean": (3 + 2 + 1 + 4 + 5) / 5,
        "vepo/entropy_selected_mean": 1.0,  # only the scored row's selection is the strategy's own: token 2
        "vepo/perturbed_rows_skipped_fraction": 0.5,  # 1 of 2 image rows with valid tokens skipped
        "vepo/jsd_mean": 0.2,
        "vepo/entropy_gap_abs_mean": 0.5,
        "vepo/entropy_gap_positive_fraction": 1 / 3,
        "vepo/score_mean": sum(score) / 3,
        "vepo/score_std": math.sqrt(sum(s * s for s in score) / 3 - (sum(score) / 3) ** 2),
        "vepo/jsd_selected_mean": 0.3,
        "vepo/entropy_gap_abs_selected_mean": 0.0,
        "vepo/top_jsd_missed_by_entropy": 1.0,  # top JSD is token 2, top entropy token 0
        "vepo/top_jsd_missed_by_selection": 0.0,
    }
    # The score: j_hat = (0, .5, 1), |dH|_hat = (.5, 1, 0), h_hat = (1, .5, 0); g = 1 - (1-j)^.5 (1-dh)^.5
    assert metrics.keys() == expected.keys()
    for name, value in expected.items():
        assert metrics[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name  # float32 sums


def test_selection_metrics_reduce_once_and_ratios_after_the_sum():
    calls = []

    def two_identical_processes(values):
        calls.append(values.shape)
        return values * 2

    one = selection_metrics(*hand_made_batch(), ratio=0.2, alpha=0.5, perturbed_pass=True)
    two = selection_metrics(
        *hand_made_batch(), ratio=0.2, alpha=0.5, perturbed_pass=True, reduce=two_identical_processes
    )
    assert len(calls) == 1 and len(calls[0]) == 1  # one collective, a 1-D tensor
    assert two == pytest.approx(one)


def test_selection_metrics_leave_out_what_has_nothing_to_average():
    signals, mask, selected, scored, has_image = hand_made_batch()
    empty = torch.zeros_like(mask)
    metrics = selection_metrics(
        TokenSignals(), empty, selected, torch.zeros_like(scored), has_image, ratio=0.2, alpha=0.5, perturbed_pass=True
    )
    # No valid token: no fractions or means, only the share of rows with an image
    assert metrics == {"vepo/image_rows_fraction": 1.0}


def reference_take_rows(inputs, rows):
    """The Qwen2-VL layout by hand: `pixel_values` rows per image grid (t * h * w), images in row order."""
    out = {"num_images": [inputs["num_images"][r] for r in rows]}
    image_start = [0]
    for n in inputs["num_images"]:
        image_start.append(image_start[-1] + n)
    pixel_start = [0]
    for n in inputs["image_grid_thw"].prod(-1).tolist():
        pixel_start.append(pixel_start[-1] + n)
    images = [i for r in rows for i in range(image_start[r], image_start[r + 1])]
    if not images:
        out["pixel_values"] = out["image_grid_thw"] = None
    else:
        out["pixel_values"] = torch.cat([inputs["pixel_values"][pixel_start[i] : pixel_start[i + 1]] for i in images])
        out["image_grid_thw"] = inputs["image_grid_thw"][images]
    return out


@pytest.mark.parametrize("rows", [[0], [1], [2, 0], [3, 1, 2], [1, 1], [0, 1, 2, 3]])
def test_take_rows_matches_the_qwen_layout(rows):
    generator = torch.Generator().manual_seed(0)
    num_images = [1, 0, 2, 1]  # the second prompt is text-only
    grids = torch.tensor([[1, 2, 2], [1, 4, 2], [1, 2, 6], [1, 2, 2]])
    inputs = {
        "num_images": num_images,
        "image_grid_thw": grids,
        "pixel_values": torch.randn(int(grids.prod(-1).sum()), 12, generator=generator),
    }
    got = take_rows(inputs, torch.tensor(rows))
    want = reference_take_rows(inputs, rows)
    assert got["num_images"] == want["num_images"]
    for key in ("pixel_values", "image_grid_thw"):
        if want[key] is None:
            assert got[key] is None
        else:
            assert torch.equal(got[key], want[key]), key


def qwen_batch() -> dict:
    grids = torch.tensor([[1, 2, 2], [1, 4, 2], [1, 2, 6], [1, 2, 2]])
    return {
        "prompt_ids": torch.arange(12).reshape(4, 3),
        "prompt_mask": torch.ones(4, 3, dtype=torch.long),
        "completion_ids": torch.arange(20).reshape(4, 5),
        "completion_mask": torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]]),
        "tool_mask": torch.tensor([[1, 0, 1, 1, 1]] * 4),
        "num_images": [1, 0, 2, 1],
        "image_grid_thw": grids,
        "pixel_values": torch.randn(int(grids.prod(-1).sum()), 12, generator=torch.Generator().manual_seed(0)),
    }


def test_the_batch_view_reads_the_dict_and_derives_each_value_once(monkeypatch):
    inputs = qwen_batch()
    batch = Batch(inputs)
    assert Batch.of(batch) is batch and Batch(batch).inputs is inputs
    # By hand: completion mask times tool mask; rows with an image (1, 0, 2, 1 images); prompt then completion
    assert batch.loss_mask.tolist() == [[True, False, True, False, False], [True, False, True, True, True],
                                        [True, False, False, False, False], [False] * 5]  # fmt: skip
    assert batch.valid.sum().item() == 9
    assert batch.has_image.tolist() == [True, False, True, True]
    assert torch.equal(batch.sequence[0][1], torch.tensor([3, 4, 5, 5, 6, 7, 8, 9]))
    assert (batch.rows, batch.completion_length) == (4, 5)
    # Each derived value is computed once, however many steps read it: one cut of the image inputs by response
    calls = []
    real = batch_module.row_pieces
    monkeypatch.setattr(batch_module, "row_pieces", lambda inputs: calls.append(1) or real(inputs))
    for rows in ([0], [2, 0], [3, 1, 2]):
        got = batch.take(torch.tensor(rows))
        want = reference_take_rows(inputs, rows)
        assert got["num_images"] == want["num_images"] and torch.equal(got["pixel_values"], want["pixel_values"])
    assert len(calls) == 1
    assert batch.loss_mask is batch.loss_mask and batch.sequence is batch.sequence
    # Writes go to TRL's dict, which TRL keeps shuffling and splitting
    inputs["vepo_selection_mask"] = batch.loss_mask
    assert "vepo_selection_mask" in batch and batch.get("missing") is None and len(batch) == len(inputs)


def test_multimodal_keys_come_from_trl():
    # TRL's own keyword names, the split keys not passed to the model
    assert {"pixel_values", "image_grid_thw", "num_images"} <= set(MULTIMODAL_KEYS)
    assert "num_images" not in MODEL_INPUT_KEYS and "pixel_values" in MODEL_INPUT_KEYS
    assert not {"model", "input_ids", "attention_mask", "logits_to_keep", "batch_size"} & set(MULTIMODAL_KEYS)
