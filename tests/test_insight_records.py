"""Selection records: built from hand-made tensors (each value checked against the paper's formulas by hand), saved
and loaded, and decoded piece by piece."""

import json

import pytest
import torch
from PIL import Image

from vepo_trl.builtin.tiny_models import build_tokenizer
from vepo_trl.insight import (
    SelectionRecord,
    load_records,
    marked_completion,
    prompt_text,
    records_from_signals,
    save_records,
    token_texts,
)
from vepo_trl.scoring import TokenSignals


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def hand_built(tokenizer):
    """Two responses: row 0 has 4 valid tokens, row 1 has 2 (then padding)."""
    ids = tokenizer("The answer is 3", add_special_tokens=False)["input_ids"][:4]
    assert len(ids) == 4
    pad = tokenizer.pad_token_id
    completion_ids = torch.tensor([ids, ids[:2] + [pad, pad]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    signals = TokenSignals(
        # row 0: entropy ranks tokens 2 > 0 > 3 > 1; row 1: token 1 > token 0
        entropy=torch.tensor([[2.0, 1.0, 3.0, 1.5], [0.5, 0.7, 9.0, 9.0]]),
        perturbed_entropy=torch.tensor([[2.0, 2.0, 3.0, 1.5], [0.9, 0.7, 0.0, 0.0]]),
        # row 0: JSD ranks tokens 1 > 3 > 0 > 2
        jsd=torch.tensor([[0.10, 0.60, 0.00, 0.30], [0.20, 0.10, 0.0, 0.0]]),
    )
    selected = torch.tensor([[0, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    return completion_ids, mask, signals, selected, ids


def test_records_from_signals_by_hand(tokenizer):
    completion_ids, mask, signals, selected, ids = hand_built(tokenizer)
    image = Image.new("RGB", (64, 48), (200, 30, 30))
    prompt = [
        {"role": "system", "content": [{"type": "text", "text": "Think first."}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many circles?"}]},
    ]
    records = records_from_signals(
        completion_ids,
        tokenizer,
        signals,
        mask,
        selected,
        ratio=0.5,
        alpha=0.7,
        rewards=torch.tensor([1.0, float("nan")]),
        advantages=[0.5, -0.5],
        has_image=torch.tensor([True, False]),
        prompts=[prompt, "plain text prompt"],
        images=[[image], None],
        groups=[0, 0],
        step=7,
        meta={"model": "tiny"},
    )
    first, second = records
    # Only valid tokens are kept, in order
    assert first.token_ids == ids and second.token_ids == ids[:2]
    assert first.selected == [False, True, True, False] and second.selected == [True, False]
    # Top ceil(0.5 * 4) = 2 by entropy: tokens 2 and 0; row 1 keeps ceil(0.5 * 2) = 1: token 1
    assert first.entropy_top_k == [True, False, True, False]
    assert second.entropy_top_k == [False, True]
    # Top-2 JSD of row 0: tokens 1 and 3
    assert first.jsd_top_k == [False, True, False, True]
    # |dH| = |H' - H|
    assert first.entropy_gap == pytest.approx([0.0, 1.0, 0.0, 0.0])
    # Score of token 1: j_hat = 1 (max JSD), so g = 1 - 0^0.7 * ... = 1; h_hat = (1 - 1) / (3 - 1) = 0 -> c = 0
    # Token 0: j_hat = 0.1 / 0.6, dh_hat = 0, h_hat = (2 - 1) / 2 = 0.5 -> c = (1 - (1 - 1/6)^0.7) * 0.5
    assert first.score[1] == pytest.approx(0.0, abs=1e-6)
    assert first.score[0] == pytest.approx((1 - (5 / 6) ** 0.7) * 0.5, rel=1e-4)
    # Token 2: JSD 0 and |dH| 0 -> g = 0 whatever its entropy
    assert first.score[2] == pytest.approx(0.0, abs=1e-6)
    # Row 1 has no image: no visual signals, a NaN reward is "unknown"
    assert second.jsd is None and second.score is None and second.perturbed_entropy is None
    assert second.reward is None and first.reward == 1.0 and first.advantage == 0.5
    assert first.prompt == "How many circles?" and second.prompt == "plain text prompt"
    assert first.image.startswith("data:image/png;base64,") and second.image is None
    assert first.step == 7 and first.group == 0 and first.meta == {"model": "tiny"}
    assert (first.strategy, first.k, first.alpha) == ("vepo", 0.5, 0.7)
    assert "".join(first.tokens) == tokenizer.decode(ids)


def test_rows_picks_completions_and_inputs_are_untouched(tokenizer):
    completion_ids, mask, signals, selected, _ = hand_built(tokenizer)
    before = signals.entropy.clone()
    records = records_from_signals(completion_ids, tokenizer, signals, mask, selected, ratio=0.5, alpha=0.7, rows=[1])
    assert len(records) == 1 and records[0].num_tokens == 2
    assert torch.equal(signals.entropy, before)


def test_entropy_only_signals_give_records_without_visual_fields(tokenizer):
    completion_ids, mask, signals, selected, _ = hand_built(tokenizer)
    records = records_from_signals(
        completion_ids, tokenizer, TokenSignals(entropy=signals.entropy), mask, selected, ratio=0.5, alpha=0.7,
        strategy="entropy",
    )  # fmt: skip
    assert all(r.jsd is None and r.jsd_top_k is None for r in records)


def test_shape_mismatch_is_an_error(tokenizer):
    completion_ids, mask, signals, selected, _ = hand_built(tokenizer)
    with pytest.raises(ValueError, match="selected has shape"):
        records_from_signals(completion_ids, tokenizer, signals, mask, selected[:, :3], ratio=0.5, alpha=0.7)


def test_save_load_round_trip_and_append(tokenizer, tmp_path):
    completion_ids, mask, signals, selected, _ = hand_built(tokenizer)
    records = records_from_signals(completion_ids, tokenizer, signals, mask, selected, ratio=0.5, alpha=0.7, step=1)
    path = save_records(tmp_path / "run" / "records.jsonl", records)
    save_records(path, records[:1], append=True)
    loaded = load_records(path)
    assert len(loaded) == 3
    assert loaded[0] == records[0] and loaded[1] == records[1] and loaded[2] == records[0]
    # One JSON object a line
    assert all(json.loads(line)["strategy"] == "vepo" for line in path.read_text().splitlines())


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "no records"),
        ("{not json\n", "line 1: not valid JSON"),
        ('{"tokens": ["a"]}\n', "missing field"),
        ("[1, 2]", "expected a JSON object"),
        (
            '{"tokens": ["a", "b"], "token_ids": [1], "entropy": [0.1, 0.2], "selected": [true, false], '
            '"entropy_top_k": [true, false], "strategy": "vepo", "k": 0.2, "alpha": 0.7}\n',
            "token_ids has 1 entries but there are 2 tokens",
        ),
    ],
)
def test_load_records_rejects_what_is_not_a_record(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_records(path)


def test_token_texts_join_to_the_decoding(tokenizer):
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        # Random ids from the whole vocabulary: partial UTF-8 bytes and special tokens included
        ids = torch.randint(0, len(tokenizer), (30,), generator=generator).tolist()
        pieces = token_texts(tokenizer, ids)
        assert len(pieces) == len(ids)
        assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def test_token_texts_give_a_split_character_to_the_token_that_completes_it(tokenizer):
    # "é" is two bytes; the tiny byte-level vocabulary has no merge for it, so it takes two tokens
    ids = tokenizer("é!", add_special_tokens=False)["input_ids"]
    pieces = token_texts(tokenizer, ids)
    assert "".join(pieces) == "é!"
    assert "\ufffd" not in "".join(pieces) and "é" in pieces


def test_marked_completion():
    record = SelectionRecord(
        tokens=["The", " answer", " is", " 3"],
        token_ids=[1, 2, 3, 4],
        entropy=[0.0] * 4,
        selected=[False, True, True, False],
        entropy_top_k=[False] * 4,
        strategy="vepo",
        k=0.5,
        alpha=0.7,
    )
    assert marked_completion(record) == "The[[ answer is]] 3"
    record.selected = [True, False, False, True]
    assert marked_completion(record, "<", ">") == "<The> answer is< 3>"


def test_prompt_text_of_strings_and_conversations():
    assert prompt_text("hello") == "hello"
    assert prompt_text([{"role": "user", "content": "Find x."}]) == "Find x."


def test_the_records_file_check_knows_a_records_fields():
    """`files.RECORD_KEYS` (the light check a command's --save_records goes through) are the record's own fields."""
    import dataclasses

    from vepo_trl.files import RECORD_KEYS
    from vepo_trl.insight.records import SelectionRecord

    required = [
        f.name
        for f in dataclasses.fields(SelectionRecord)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    assert list(RECORD_KEYS) == required
