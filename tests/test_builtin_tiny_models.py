"""The tiny Qwen2.5-VL testbed: real classes, saved and reloaded like a Hub id, deterministic, and trainable by TRL."""

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor, Qwen2_5_VLForConditionalGeneration
from trl import GRPOConfig, GRPOTrainer

from vepo_trl.builtin.tiny_models import QWEN_SPECIAL_TOKENS, build_tiny_qwen2_5_vl, save_tiny_qwen2_5_vl
from vepo_trl.data import make_synthetic_row


def _state(model):
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def test_same_seed_same_weights_and_tokenizer():
    model_a, processor_a = build_tiny_qwen2_5_vl(seed=3)
    model_b, processor_b = build_tiny_qwen2_5_vl(seed=3)
    state_a, state_b = _state(model_a), _state(model_b)
    assert state_a.keys() == state_b.keys()
    assert all(torch.equal(state_a[name], state_b[name]) for name in state_a)
    assert processor_a.tokenizer.get_vocab() == processor_b.tokenizer.get_vocab()
    # Another seed gives other weights; the tokenizer does not depend on the seed
    model_c, _ = build_tiny_qwen2_5_vl(seed=4)
    assert not torch.equal(state_a["lm_head.weight"], model_c.state_dict()["lm_head.weight"])


def test_build_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_qwen2_5_vl(seed=0)
    assert torch.equal(torch.rand(3), expected)


def test_real_classes_and_special_tokens():
    model, processor = build_tiny_qwen2_5_vl()
    assert isinstance(model, Qwen2_5_VLForConditionalGeneration)
    assert type(processor).__name__ == "Qwen2_5_VLProcessor"
    assert type(processor.image_processor).__name__ == "Qwen2VLImageProcessor"
    tokenizer = processor.tokenizer
    ids = [tokenizer.convert_tokens_to_ids(token) for token in QWEN_SPECIAL_TOKENS]
    # Special tokens sit right after the BPE vocabulary, in Qwen's order, each one token
    assert ids == list(range(ids[0], ids[0] + len(QWEN_SPECIAL_TOKENS)))
    for token in ("<|im_start|>", "<|image_pad|>", "<|vision_start|>"):
        assert tokenizer(token, add_special_tokens=False)["input_ids"] == [tokenizer.convert_tokens_to_ids(token)]
    config = model.config
    assert config.image_token_id == tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert config.vision_start_token_id == tokenizer.convert_tokens_to_ids("<|vision_start|>")
    assert model.get_output_embeddings().weight.shape[0] == len(tokenizer)
    generation = model.generation_config
    assert generation.eos_token_id == [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id]
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.eos_token == "<|im_end|>"
    # Small enough for a GRPO step well under a second on two cores
    assert sum(p.numel() for p in model.parameters()) < 500_000


def test_chat_template_has_qwen_structure():
    _, processor = build_tiny_qwen2_5_vl()
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "3"}]},
    ]
    text = processor.apply_chat_template(messages, tokenize=False)
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>How many?<|im_end|>\n"
        "<|im_start|>assistant\n3<|im_end|>\n"
    )
    with_system = [{"role": "system", "content": "Be brief."}, messages[0]]
    prompt = processor.apply_chat_template(with_system, tokenize=False, add_generation_prompt=True)
    assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert prompt.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize(("size", "mode"), [((112, 112), "RGB"), ((97, 61), "RGBA"), ((320, 240), "L")])
def test_processor_expands_one_pad_token_per_merged_patch(size, mode):
    _, processor = build_tiny_qwen2_5_vl()
    row = make_synthetic_row("count_shapes", seed=5, image_size=size, image_mode=mode)
    before, _, after = row["problem"].partition("<image>")
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": before}, {"type": "image"}, {"type": "text", "text": after}],
        }
    ]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(images=row["images"], text=[text], return_tensors="pt")
    grid = inputs["image_grid_thw"][0]
    pad_id = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    merge = processor.image_processor.merge_size
    assert int((inputs["input_ids"] == pad_id).sum()) == int(grid.prod()) // merge**2
    assert inputs["pixel_values"].shape == (int(grid.prod()), 3 * 2 * 14 * 14)
    # The tiny processor's bounds: 4..64 merged visual tokens per image
    assert 4 <= int(grid.prod()) // merge**2 <= 64


def test_save_and_load_round_trip(tmp_path):
    path = save_tiny_qwen2_5_vl(tmp_path / "tiny", seed=1)
    model, processor = build_tiny_qwen2_5_vl(seed=1)
    loaded = AutoModelForImageTextToText.from_pretrained(path)
    loaded_processor = AutoProcessor.from_pretrained(path)
    assert type(loaded) is type(model)
    state, loaded_state = _state(model), _state(loaded)
    assert all(torch.equal(state[name], loaded_state[name]) for name in state)
    text = "<|im_start|>user\nWhat does the program print? 12 + 7<|im_end|>\n"
    assert loaded_processor.tokenizer(text)["input_ids"] == processor.tokenizer(text)["input_ids"]
    assert loaded_processor.chat_template == processor.chat_template
    assert loaded_processor.image_processor.size == processor.image_processor.size
    assert loaded.generation_config.eos_token_id == model.generation_config.eos_token_id
    # The reloaded model computes the same logits
    row = make_synthetic_row("read_number", seed=2)
    inputs = processor(
        images=row["images"], text=["<|vision_start|><|image_pad|><|vision_end|>Number?"], return_tensors="pt"
    )
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits, loaded(**inputs).logits)


def test_grpo_trainer_runs_on_tiny_model(tiny_model_dir, visual_dataset, tmp_path):
    def length_reward(completions, **kwargs):
        return [float(len(completion[0]["content"]) % 5) for completion in completions]

    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=16,
        max_steps=3,
        learning_rate=1e-2,  # a few steps on a random tiny model: large enough that every weight moves
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
    )
    trainer = GRPOTrainer(model=tiny_model_dir, reward_funcs=length_reward, args=args, train_dataset=visual_dataset)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 3 and all(torch.isfinite(torch.tensor(logged)))
    language = [n for n in before if "language_model" in n or n.startswith("lm_head")]
    unchanged = [n for n in language if torch.equal(before[n], dict(trainer.model.named_parameters())[n])]
    assert language and not unchanged, unchanged[:5]
