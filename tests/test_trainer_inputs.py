"""What a Python user hands `VEPOTrainer` is taken as the CLI takes it, or refused in one line before the model loads:
the newcomer audit's d14 (one step's worth of rows), L27 and a05 (a data set's extra columns reach the rewards), a06
(TRL's plain-text prompt form in memory), p01 (a package the settings need) and p02 (a streamed data set)."""

import json
from pathlib import Path

import datasets
import pytest
from PIL import Image

from vepo_trl import VEPOConfig, VEPOTrainer
from vepo_trl.data import load_vepo_dataset
from vepo_trl.errors import UsageError

from .support import (
    TINY_RECIPE,
    make_config,
    run_cli,
    tiny_cache,  # noqa: F401  (autouse: the session's cache folder)
)


def api_config(tmp_path, **kwargs) -> VEPOConfig:
    """`support.make_config` as a Python user would write it here: one step, 8 new tokens, the entropy strategy."""
    settings = dict(max_steps=1, max_completion_length=8, selection_strategy="entropy", dataloader_num_workers=0)
    return make_config(tmp_path, **{**settings, **kwargs})


def rows_file(folder: Path, rows: int, **extra) -> Path:
    Image.new("RGB", (56, 56), "red").save(folder / "red.png")
    path = folder / "rows.jsonl"
    path.write_text("".join(json.dumps({"problem": "<image>What colour is the square?", "answer": "red",
                                        "images": ["red.png"], **extra, "difficulty": i}) + "\n"
                            for i in range(rows)))  # fmt: skip
    return path


def test_fewer_rows_than_one_step_are_refused_by_the_cli_and_the_api(tmp_path, capsys, tiny_model_dir):
    """d14: one row where a step takes 2 prompts trained 0 steps and saved the untouched model as the run's."""
    path = rows_file(tmp_path, 1)
    code, out, err = run_cli(["train", "--config", TINY_RECIPE, "--dataset_name", str(path), "--output_dir",
                              str(tmp_path / "cli")], capsys)  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"dataset_name {path} has 1 row, and one generation takes 2 prompts" in err
    assert not (tmp_path / "cli" / "model.safetensors").exists()
    data = load_vepo_dataset(path, min_pixels=3136, max_pixels=50176)
    with pytest.raises(UsageError, match="train_dataset has 1 row, and one generation takes 2 prompts"):
        VEPOTrainer(model=tiny_model_dir, reward_funcs="accuracy", args=api_config(tmp_path, per_device_train_batch_size=8),
                    train_dataset=data)  # fmt: skip
    with pytest.raises(UsageError, match="train_dataset is empty"):
        VEPOTrainer(
            model=tiny_model_dir, reward_funcs="accuracy", args=api_config(tmp_path), train_dataset=data.select([])
        )


def test_one_step_of_rows_is_enough(tmp_path, tiny_model_dir):
    data = load_vepo_dataset(rows_file(tmp_path, 2), min_pixels=3136, max_pixels=50176)
    with pytest.raises(UsageError, match="has 2 rows, and one generation takes 4 prompts"):
        VEPOTrainer(model=tiny_model_dir, reward_funcs="accuracy", args=api_config(tmp_path, per_device_train_batch_size=16),
                    train_dataset=data)  # fmt: skip
    VEPOTrainer(model=tiny_model_dir, reward_funcs="accuracy", args=api_config(tmp_path), train_dataset=data)


def test_extra_columns_are_kept_and_a_users_source_is_not_replaced(tmp_path):
    """L27: `difficulty` was dropped and the user's `source` replaced by the file name, without a word."""
    data = load_vepo_dataset(rows_file(tmp_path, 3, source="mine"), min_pixels=3136, max_pixels=50176)
    assert data["difficulty"] == [0, 1, 2] and data["source"] == ["mine"] * 3
    assert {"prompt", "images", "answer", "id"} <= set(data.column_names)
    # Without a source column of its own, a row's source is still where it came from
    plain = load_vepo_dataset(rows_file(tmp_path, 2), min_pixels=3136, max_pixels=50176)
    assert plain["source"] == ["rows", "rows"]


def test_plain_text_prompts_in_memory_train_and_extra_columns_reach_the_rewards(tmp_path, tiny_model_dir):
    """a06: TRL's plain-text prompt form with images, in memory, ended in "Multimodal training requires conversational
    prompts" at the first step (the CLI took the same data). a05: a reward reading a data set's extra column got
    None after our loader. Both through one real training step."""
    seen = []

    def difficulty_reward(completions, difficulty=None, **kwargs):
        seen.extend(difficulty)
        return [0.0] * len(completions)

    red = Image.new("RGB", (56, 56), "red")
    data = datasets.Dataset.from_dict({"prompt": ["What colour is the square?"] * 8, "images": [[red]] * 8,
                                       "answer": ["red"] * 8, "difficulty": list(range(8))})  # fmt: skip
    trainer = VEPOTrainer(model=tiny_model_dir, reward_funcs=[difficulty_reward], args=api_config(tmp_path),
                          train_dataset=data)  # fmt: skip
    assert isinstance(trainer.train_dataset[0]["prompt"], list)  # conversational, as load_vepo_dataset makes it
    trainer.train()
    assert trainer.state.global_step == 1
    assert seen and all(isinstance(value, int) for value in seen) and set(seen) <= set(range(8))


def test_a_streamed_data_set_trains(tmp_path, tiny_model_dir, visual_dataset):
    """p02, a regression: the image-parts check took len() of an IterableDataset at __init__ (TypeError), where
    GRPOTrainer trains the same stream."""
    stream = visual_dataset.to_iterable_dataset()
    trainer = VEPOTrainer(
        model=tiny_model_dir, reward_funcs="accuracy", args=api_config(tmp_path), train_dataset=stream
    )
    trainer.train()
    assert trainer.state.global_step == 1


def test_a_stream_whose_first_rows_are_broken_is_still_named(tmp_path, tiny_model_dir, visual_dataset):
    stream = visual_dataset.remove_columns("images").to_iterable_dataset()
    with pytest.raises(ValueError, match="row 0's prompt has 1 image part.*no 'images'"):
        VEPOTrainer(model=tiny_model_dir, reward_funcs="accuracy", args=api_config(tmp_path), train_dataset=stream)


def test_a_package_the_settings_need_is_checked_by_the_api_as_by_the_cli(tmp_path, tiny_model_dir, visual_dataset):
    """p01: use_liger_kernel without liger-kernel was an ImportError at train(), after the model loaded."""
    import importlib.util

    if importlib.util.find_spec("liger_kernel") is not None:
        pytest.skip("liger-kernel is installed here")
    with pytest.raises(UsageError, match="--use_liger_kernel true needs the liger-kernel package"):
        VEPOTrainer(model=tiny_model_dir, reward_funcs="accuracy", args=api_config(tmp_path, use_liger_kernel=True),
                    train_dataset=visual_dataset)  # fmt: skip
