"""Whole runs as users start them (the real CLI, a recipe, combinations of settings, real files): every setting takes
effect or is refused in one line naming it, before the model loads; what a Python user passes is taken or refused
in one line; data files in the formats `datasets` reads train. Each case here ended in a traceback after the model
loaded, or was accepted and ignored, before (the newcomer audit's f06-f33, y12-y28, c08-c09, api*, e27-e31, v02-v03,
r03)."""

import json
import os
from pathlib import Path

import pytest

import vepo_trl.train as train_module

from ..support import (
    REPO,
    TINY_RECIPE,
    assert_one_error_line,
    run_cli,
    snapshot,
    tiny_cache,  # noqa: F401  (autouse: the session's cache folder)
)


def _not_installed() -> str:
    """A reporting integration transformers knows whose package is not installed here (the four trackers the dev
    extra installs are; a few others never are)."""
    from transformers.integrations import get_available_reporting_integrations
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    available = set(get_available_reporting_integrations())
    return next(
        name for name in ("clearml", "neptune", "swanlab", *sorted(INTEGRATION_TO_CALLBACK)) if name not in available
    )


NOT_INSTALLED = _not_installed()
ACCEPTED_AND_IGNORED = [
    # (f06) LoRA flags without --use_peft trained the whole model
    (["--lora_r", "8", "--lora_target_modules", "q_proj"], "--lora_r 8 is set, and this run never reads it"),
    (["--lora_r", "16"], "read only with --use_peft true"),  # the default value, given: still ignored, still refused
    # (f10) fp16 on the CPU trained in float32 and recorded fp16: true
    (["--fp16", "true"], "--fp16 true needs a GPU"),
    # (f14) save_steps 0 never saved
    (["--save_strategy", "steps", "--save_steps", "0"], "--save_steps 0 with --save_strategy steps"),
    # (f13) evaluation without an evaluation set failed after loading; the reverse was ignored
    (["--eval_strategy", "steps", "--eval_steps", "1"], "none is given: add --eval_dataset_name"),
    (["--eval_dataset_name", "synthetic"], "read only with --eval_strategy steps or epoch"),
    (["--eval_on_start", "true"], "--eval_on_start true evaluates on an evaluation set"),  # TRL: after loading
    # (f24, f25) integrations that are not installed
    (["--report_to", NOT_INSTALLED], f"--report_to {NOT_INSTALLED}: its package is not installed"),
    (["--report_to", "bogus"], "--report_to bogus: not a reporting integration"),
    (["--use_liger_kernel", "true"], "needs the liger-kernel package"),
    # (f27) an accelerate config given as the DeepSpeed config
    (["--deepspeed", str(REPO / "recipes" / "accelerate_configs" / "zero2.yaml")], "not a DeepSpeed JSON config"),
    # (f21) image bounds on data that has its own fixed size
    (
        ["--dataset_name", "lab", "--min_pixels", "1"],
        "other than dataset_name lab (which draws its images at the warm start's own size)",
    ),
    # (a newcomer, this stop) rows to generate, typed with a data file that generates none
    (
        ["--dataset_name", "rows.jsonl", "--synthetic_rows", "64"],
        "--synthetic_rows 64 is set, and this run never reads it (it is read only with dataset_name synthetic or lab",
    ),
    # (y25, y26) a second recipe
    (["--config", TINY_RECIPE], "--config is given twice"),
    ([f"--config={TINY_RECIPE}"], "--config is given twice"),
]


@pytest.mark.parametrize(
    ("argv", "needle"), ACCEPTED_AND_IGNORED, ids=lambda v: " ".join(v) if isinstance(v, list) else None
)
def test_a_setting_that_would_be_ignored_is_refused_before_loading(tmp_path, capsys, nothing_loads, argv, needle):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    if "--deepspeed" in argv:
        pytest.importorskip(
            "deepspeed", reason="without deepspeed the file is refused for that first"
        ) if False else None
    code, out, err = run_cli(["train", "--config", TINY_RECIPE, "--output_dir", str(folder), *argv], capsys)
    assert_one_error_line(code, err, None, needle)
    assert snapshot(folder) == {"keep.txt": b"mine"}


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["demo", "--warm_start", "--model_family", "qwen3-vl"], "give one of them"),  # (f33) warm start dropped
        (["demo", "--config", TINY_RECIPE], "vepo-trl train --config FILE"),  # (y28)
        (["demo", "--model_family=bogus"], "--model_family bogus"),  # (f34) the = form
        (["strategies", "--bogus"], "unrecognized arguments: --bogus"),  # (c08)
        (["--version", "--bogus"], "takes no options"),  # (c09)
    ],
)
def test_options_a_command_does_not_take_are_refused(capsys, nothing_loads, argv, needle):
    code, out, err = run_cli(argv, capsys)
    assert_one_error_line(code, err, None, needle)


def test_a_recipes_unquoted_no_is_named_as_yaml(tmp_path, capsys, nothing_loads):
    recipe = tmp_path / "r.yaml"
    lines = [line for line in Path(TINY_RECIPE).read_text().splitlines() if not line.startswith("save_strategy")]
    recipe.write_text("\n".join([*lines, "save_strategy: no"]) + "\n")  # YAML reads it as false (y12)
    code, out, err = run_cli(["train", "--config", str(recipe), "--output_dir", str(tmp_path / "o")], capsys)
    assert_one_error_line(code, err, None, "--save_strategy False", 'quote it, save_strategy: "no"')


def test_lora_targets_are_matched_against_the_model_before_it_loads(tmp_path, capsys, nothing_loads):
    from vepo_trl.local_models import resolve_model_name

    resolve_model_name("tiny-qwen2.5-vl")  # built (its progress bar) before the runs under test
    capsys.readouterr()
    base = ["train", "--config", TINY_RECIPE, "--output_dir", str(tmp_path / "o"), "--use_peft", "true"]
    # (f07) the head VEPO reads: refused after loading, inside a 32-line traceback
    assert_one_error_line(*run_cli([*base, "--lora_target_modules", "lm_head"], capsys)[::2], None, "matches lm_head")
    # (f08) a name that matches nothing: peft's NoMatchingPeftModuleError after loading
    assert_one_error_line(*run_cli([*base, "--lora_target_modules", "no_such_proj"], capsys)[::2], None, "matches no module",
             "q_proj")  # fmt: skip


def test_lora_targets_that_match_pass_the_preflight(tiny_model_dir):
    from trl import ModelConfig

    from vepo_trl.preflight import check_lora_targets

    check_lora_targets(
        tiny_model_dir,
        ModelConfig(model_name_or_path=tiny_model_dir, use_peft=True, lora_target_modules=["q_proj", "v_proj"]),
    )


def test_a_text_only_model_is_refused_by_train_and_eval_before_loading(tmp_path, capsys, nothing_loads):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from vepo_trl.local_models import resolve_model_name

    folder = tmp_path / "textlm"
    Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=2)).save_pretrained(folder)  # fmt: skip
    tiny = Path(resolve_model_name("tiny-qwen2.5-vl"))
    for name in ("processor_config.json", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((tiny / name).read_bytes())
    capsys.readouterr()
    # (f42) "Model type should be one of ..." over 31 lines; (e27) the same from eval
    code, out, err = run_cli(["train", "--config", TINY_RECIPE, "--model_name_or_path", str(folder),
                              "--selection_strategy", "entropy", "--output_dir", str(tmp_path / "o")], capsys)  # fmt: skip
    assert_one_error_line(code, err, None, "a text-only 'qwen2' model", "VEPOTrainer from Python")
    code, out, err = run_cli(["eval", "--model", str(folder), "--benchmarks", "synthetic", "--limit", "1",
                              "--output_dir", str(tmp_path / "e")], capsys)  # fmt: skip
    assert_one_error_line(code, err, None, "a text-only 'qwen2' model")


def test_eval_inputs_are_checked_before_loading(tmp_path, capsys, tiny_model_dir):
    checkpoint = tmp_path / "checkpoint-6"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text((Path(tiny_model_dir) / "config.json").read_text())
    bench = ["--benchmarks", "synthetic", "--limit", "1", "--output_dir", str(tmp_path / "e")]
    # (c06) a checkpoint folder without weights: OSError, 32 lines
    assert_one_error_line(
        *run_cli(["eval", "--model", str(checkpoint), *bench], capsys)[::2], None, "holds no weights"
    )
    # (e28) a full model as the adapter: peft's ValueError, 57 lines
    assert_one_error_line(*run_cli(["eval", "--model", tiny_model_dir, "--adapter", tiny_model_dir, *bench], capsys)[::2], None,
             "not a PEFT adapter")  # fmt: skip
    # (e31) vLLM not installed: ModuleNotFoundError, 23 lines
    from vepo_trl.eval.generate import vllm_available

    if not vllm_available():
        assert_one_error_line(*run_cli(["eval", "--model", tiny_model_dir, "--backend", "vllm", *bench], capsys)[::2], None,
                 "needs vLLM, which is not installed")  # fmt: skip


def test_environment_and_folders(tmp_path, capsys, monkeypatch, nothing_loads):
    # (r03) a dangling link as the output folder: FileExistsError, 22 lines
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    code, out, err = run_cli(["train", "--config", TINY_RECIPE, "--output_dir", str(tmp_path / "dangling")], capsys)
    assert_one_error_line(code, err, None, "a link to", "which does not exist")
    # (v02) a quoted ~ in VEPO_TRL_CACHE made a folder named `~` in the working folder
    from vepo_trl.utils import cache_root

    monkeypatch.setenv("VEPO_TRL_CACHE", "~/vepo-cache-test")
    assert cache_root() == Path.home() / "vepo-cache-test"


def test_a_damaged_cached_model_names_the_folder_to_delete(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VEPO_TRL_CACHE", str(tmp_path / "cache"))
    from vepo_trl.local_models import resolve_model_name

    built = Path(resolve_model_name("tiny-qwen2.5-vl"))
    weights = built / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # (v03) a truncated copy: SafetensorError, 42 lines
    capsys.readouterr()
    code, out, err = run_cli(["demo", "--max_steps", "1", "--output_dir", str(tmp_path / "o")], capsys)
    assert_one_error_line(code, err, None, "is damaged", f"delete the folder {built}")


def test_an_unwritable_cache_is_named(tmp_path, monkeypatch):
    from vepo_trl.errors import UsageError
    from vepo_trl.local_models import resolve_model_name

    (tmp_path / "home").write_text("a file where the home folder should be")  # (v06) as root, a mode is no obstacle
    monkeypatch.delenv("VEPO_TRL_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with pytest.raises(UsageError, match="Set VEPO_TRL_CACHE to a folder you can write"):
        resolve_model_name("tiny-qwen2.5-vl")


# ---------------------------------------------------------------------------------------------------------------------
# The Python API
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [({"selection_ratio": "0.2"}, "a str, must be a number"), ({"reward_weights": "1"}, "'1' is a str")],
)
def test_a_wrong_type_is_named_as_the_problem(kwargs, needle):
    from vepo_trl import VEPOConfig

    with pytest.raises(ValueError, match=needle):  # (api01, api03) was "must be in (0, 1]" for 0.2
        VEPOConfig(output_dir="unused", use_cpu=True, bf16=False, report_to="none", **kwargs)


def api_trainer(model, data, tmp_path, reward_funcs="accuracy", **config):
    from vepo_trl import VEPOConfig, VEPOTrainer

    args = VEPOConfig(output_dir=str(tmp_path / "api"), use_cpu=True, bf16=False, report_to="none",
                      per_device_train_batch_size=4, num_generations=4, max_completion_length=8, max_steps=1,
                      **config)  # fmt: skip
    return VEPOTrainer(model=model, reward_funcs=reward_funcs, args=args, train_dataset=data)


def test_the_api_takes_what_a_python_user_passes(tiny_model_dir, visual_dataset, tmp_path):
    from vepo_trl.data import load_vepo_dataset
    from vepo_trl.rewards import REWARD_FUNCS

    # (api09) a reward name where functions go: TRL took it for a Hub reward model and tried to download it
    trainer = api_trainer(Path(tiny_model_dir), visual_dataset, tmp_path, reward_funcs="accuracy")
    assert trainer.reward_funcs == [REWARD_FUNCS["accuracy"]]
    # (api15) a pathlib.Path to a data file
    rows = tmp_path / "rows.jsonl"
    from PIL import Image

    Image.new("RGB", (56, 56), "red").save(tmp_path / "a.png")
    rows.write_text(json.dumps({"problem": "Colour?", "images": ["a.png"], "answer": "red"}) + "\n")
    assert len(load_vepo_dataset(rows, min_pixels=3136, max_pixels=50176)) == 1
    with pytest.raises(TypeError, match="model must be a Hub id or a local folder"):
        api_trainer(42, visual_dataset, tmp_path)


def test_prompts_with_image_parts_and_no_images_are_named(tiny_model_dir, visual_dataset, tmp_path):
    # (api05) "Number of images provided (0) does not match" at the first step, 64 lines
    with pytest.raises(ValueError, match="row 0's prompt has 1 image part.*no 'images'"):
        api_trainer(tiny_model_dir, visual_dataset.remove_columns("images"), tmp_path, selection_strategy="entropy")
    # A select()ed data set is read in its own order (its index mapping applied)
    api_trainer(tiny_model_dir, visual_dataset.select([5, 2, 7, 1]), tmp_path, selection_strategy="entropy")


def test_a_text_only_model_in_the_api_is_refused_in_one_line(tmp_path, visual_dataset):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))  # fmt: skip
    # (api06) AttributeError 'Qwen2Config' has no attribute 'image_token_id'; (api07) KeyError 'image', 59 lines
    with pytest.raises(ValueError, match="perturbs the model's images, but the model is a text-only 'qwen2'"):
        api_trainer(model, visual_dataset, tmp_path)
    with pytest.raises(ValueError, match="'images' column, and the model is a text-only 'qwen2'"):
        api_trainer(model, visual_dataset, tmp_path, selection_strategy="entropy")


# ---------------------------------------------------------------------------------------------------------------------
# Data files a user already has
# ---------------------------------------------------------------------------------------------------------------------


def write_rows(folder: Path, kind: str) -> Path:
    import csv
    import gzip

    from PIL import Image

    folder.mkdir(exist_ok=True)
    Image.new("RGB", (56, 56), (200, 30, 30)).save(folder / "a.png")
    question = "What colour is the square?"
    if kind == "trl.jsonl":  # TRL's own conversational format
        row = {"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}],
               "images": ["a.png"], "answer": "red"}  # fmt: skip
    else:
        row = {"prompt": question, "images": ["a.png"], "answer": "red"}
    text = "".join(json.dumps(row) + "\n" for _ in range(8))
    path = folder / kind
    if kind in ("rows.parquet", "saved", "imagefolder"):  # TRL's `prompt` column, as plain text, in each layout
        import datasets

        image = {"bytes": (folder / "a.png").read_bytes(), "path": None}
        table = datasets.Dataset.from_list([{**row, "images": [image]}] * 8)
        if kind == "rows.parquet":
            table.to_parquet(str(path))
        elif kind == "saved":
            table.save_to_disk(str(path))
        else:
            path.mkdir()
            (path / "a.png").write_bytes(image["bytes"])
            (path / "metadata.csv").write_text("file_name,prompt,answer\n" + f"a.png,{question},red\n" * 8)
        return path
    if kind.endswith(".gz"):
        with gzip.open(path, "wt") as handle:
            handle.write(text)
    elif kind.endswith((".csv", ".tsv")):
        with open(path, "w", newline="") as handle:
            writer = csv.writer(handle, delimiter="\t" if kind.endswith(".tsv") else ",")
            writer.writerow(["question", "image", "answer"])
            writer.writerows([[question, "a.png", "red"]] * 8)
    else:
        path.write_text(text)
    return path


@pytest.mark.parametrize(
    "kind",
    [
        "trl.jsonl",
        "plain_prompt.jsonl",
        "rows.jsonl.gz",
        "rows.csv",
        "rows.tsv",
        "rows.parquet",
        "saved",
        "imagefolder",
    ],
)
def test_data_files_users_already_have_load_with_the_image_where_it_stood(tmp_path, kind):
    from vepo_trl.data import load_vepo_dataset

    data = load_vepo_dataset(write_rows(tmp_path / "data", kind), min_pixels=3136, max_pixels=50176)
    assert len(data) == 8 and data[0]["answer"] == "red" and data[0]["images"][0].size == (56, 56)
    user = data[0]["prompt"][-1]["content"]
    assert [part["type"] for part in user] == ["image", "text"] and user[1]["text"] == "What colour is the square?"


def test_trls_own_format_trains_through_the_cli(tmp_path, capsys):
    path = write_rows(tmp_path / "data", "trl.jsonl")
    code, out, err = run_cli(["train", "--config", TINY_RECIPE, "--dataset_name", str(path), "--max_steps", "1",
                              "--output_dir", str(tmp_path / "run")], capsys)  # fmt: skip
    assert code == 0, err
    assert json.loads((tmp_path / "run" / "trainer_state.json").read_text())["global_step"] == 1
    assert os.path.isfile(tmp_path / "run" / "model.safetensors")


# ---------------------------------------------------------------------------------------------------------------------
# Faults during the run
# ---------------------------------------------------------------------------------------------------------------------


def test_a_disk_that_fills_while_saving_removes_the_partial_checkpoint_and_resume_goes_on(tmp_path, capsys,
                                                                                          monkeypatch):  # fmt: skip
    import torch

    folder = tmp_path / "run"
    argv = ["demo", "--output_dir", str(folder), "--max_steps", "2", "--save_strategy", "steps", "--save_steps", "1",
            "--synthetic_rows", "8"]  # fmt: skip
    real_save = torch.save

    def fills_up(obj, f, *args, **kwargs):
        # The optimizer of checkpoint-2: torch's writer fails part-way, as it does on a full disk (r04)
        if str(f).endswith("optimizer.pt") and "checkpoint-2" in str(f):
            Path(f).write_bytes(b"PK\x03\x04 half")
            raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 4416 vs 4310")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", fills_up)
    code, out, err = run_cli(argv, capsys)
    lines = err.strip().splitlines()
    assert code == 1 and "Traceback" not in err, err
    assert lines[-1].startswith("vepo-trl demo: error: saving ") and "unexpected pos" in lines[-1], lines
    assert "checkpoint-1 is the last complete checkpoint" in lines[-1] and "partial files were removed" in lines[-1]
    assert not (folder / "checkpoint-2").exists() and (folder / "checkpoint-1" / "trainer_state.json").is_file()
    # Space freed: the same command resumes from the last complete checkpoint and finishes
    monkeypatch.setattr(torch, "save", real_save)
    code, out, err = run_cli(argv, capsys)
    assert code == 0 and "Resuming from" in out and "checkpoint-1" in out, err
    assert json.loads((folder / "trainer_state.json").read_text())["global_step"] == 2


def test_an_unusable_folder_name_is_one_line(tmp_path, capsys, nothing_loads):
    code, out, err = run_cli(["train", "--config", TINY_RECIPE, "--output_dir", str(tmp_path / ("x" * 300))], capsys)
    assert_one_error_line(code, err, None, "not a usable folder name")


def test_torch_compile_on_the_cpu_is_refused(tmp_path, capsys, nothing_loads):
    # (f23) at step 0 after 3 minutes, and Ctrl-C did not stop it within 10 s
    code, out, err = run_cli(["train", "--config", TINY_RECIPE, "--output_dir", str(tmp_path / "o"),
                              "--torch_compile", "true"], capsys)  # fmt: skip
    assert_one_error_line(code, err, None, "--torch_compile true")


def test_a_recipe_with_yaml_anchors_trains_and_an_unknown_key_is_named(tmp_path, capsys, nothing_loads):
    head = "x-base: &base\n  selection_ratio: 0.3\n  max_steps: 1\n<<: *base\n"
    recipe = tmp_path / "anchors.yaml"
    recipe.write_text(head + Path(TINY_RECIPE).read_text().replace("max_steps: 60", ""))
    # (y01) refused as an unknown argument --base; an x- key holds the anchor and is skipped
    with pytest.raises(AssertionError, match="loaded"):  # got through every check, to the data
        run_cli(["train", "--config", str(recipe), "--output_dir", str(tmp_path / "o")], capsys)
    recipe.write_text(head.replace("x-base", "base") + Path(TINY_RECIPE).read_text().replace("max_steps: 60", ""))
    code, out, err = run_cli(["train", "--config", str(recipe), "--output_dir", str(tmp_path / "o")], capsys)
    assert_one_error_line(code, err, None, "'base' is not an option", "name it x-base")


def long_prompt_data(folder: Path, characters: int) -> Path:
    from PIL import Image

    folder.mkdir(exist_ok=True)
    Image.new("RGB", (56, 56), "red").save(folder / "a.png")
    rows = [{"problem": "<image>How many? " + "many words " * (characters // 11), "images": ["a.png"], "answer": "3"},
            {"problem": "<image>How many?", "images": ["a.png"], "answer": "3"}]  # fmt: skip
    (folder / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows * 4))
    return folder / "rows.jsonl"


def test_a_prompt_longer_than_the_context_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    # (d31) a 39,000-character prompt allocated 29 GB at step 0 and died two minutes later (TRL does not truncate)
    from vepo_trl.local_models import resolve_model_name

    monkeypatch.setattr(train_module, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    data = long_prompt_data(tmp_path / "data", 39_000)
    resolve_model_name("tiny-qwen2.5-vl")
    capsys.readouterr()
    code, out, err = run_cli(["train", "--config", TINY_RECIPE, "--dataset_name", str(data),
                              "--output_dir", str(tmp_path / "o")], capsys)  # fmt: skip
    assert_one_error_line(code, err, None, "row 0's prompt is at least", "exceeds the model's context of 4,096")


def test_a_first_step_that_plainly_cannot_fit_is_refused(tmp_path, capsys, monkeypatch):
    import vepo_trl.preflight as preflight

    monkeypatch.setattr(train_module, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    monkeypatch.setattr(preflight, "_available_memory", lambda args: (64 * 2**20, "a 64 MiB machine"))
    data = long_prompt_data(tmp_path / "data", 2_000)
    code, out, err = run_cli(["train", "--config", TINY_RECIPE, "--dataset_name", str(data),
                              "--output_dir", str(tmp_path / "o"), "--attn_implementation", "eager"], capsys)  # fmt: skip
    assert_one_error_line(code, err, None, "the first step needs at least", "a 64 MiB machine has 0.1 GiB")
    # The same data fits the real machine: through every check, to the model
    monkeypatch.undo()
    monkeypatch.setenv("VEPO_TRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(train_module, "load_model", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    code, out, err = run_cli(["train", "--config", TINY_RECIPE, "--dataset_name", str(data),
                              "--output_dir", str(tmp_path / "o2")], capsys)  # fmt: skip
    assert code == 130 and "interrupted" in err, err


def test_the_summary_names_the_tiny_model_not_its_cache_path(tmp_path, capsys):
    code, out, err = run_cli(["demo", "--model_family", "qwen3-vl", "--max_steps", "1", "--synthetic_rows", "8",
                              "--output_dir", str(tmp_path / "o")], capsys)  # fmt: skip
    summary = (tmp_path / "o" / "summary.md").read_text()
    assert code == 0 and "the tiny random qwen3-vl model `tiny-qwen3-vl`" in summary, summary[:300]
    assert "vepo-cache" not in summary.splitlines()[2]


def test_inspect_never_replaces_an_earlier_page_it_was_not_asked_to(tmp_path, capsys, monkeypatch):
    from vepo_trl.commands.inspect import _unused_page_name

    monkeypatch.chdir(tmp_path)
    assert str(_unused_page_name()) == "vepo-inspect.html"
    (tmp_path / "vepo-inspect.html").write_text("an earlier page")
    (tmp_path / "vepo-inspect-2.html").write_text("another")
    assert str(_unused_page_name()) == "vepo-inspect-3.html"


def test_a_one_seed_lab_table_says_it_has_no_interval():
    from vepo_trl.lab.results import _interval

    assert _interval(float("nan"), float("nan")) == "n/a (one seed)" and _interval(0.5, 0.75) == "[50.0, 75.0]"


def test_a_non_ascii_output_folder_under_an_ascii_locale(tmp_path):
    import subprocess
    import sys

    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "VEPO_TRL_CACHE": str(tmp_path / "cache")}
    env.pop("PYTHONUTF8", None)
    folder = tmp_path / "rün-ö"
    result = subprocess.run([sys.executable, "-m", "vepo_trl", "demo", "--max_steps", "1", "--synthetic_rows", "8",
                             "--output_dir", str(folder)], capture_output=True, text=True, env=env, timeout=600)  # fmt: skip
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert (folder / "model.safetensors").is_file() and (folder / "summary.md").is_file()


def test_the_first_run_on_a_fresh_cache_still_fails_in_one_line(tmp_path, capsys, monkeypatch):
    # bad_inputs' first case built the tiny model and printed its "Writing model shards" bar: 3 stderr lines
    monkeypatch.setenv("VEPO_TRL_CACHE", str(tmp_path / "fresh-cache"))
    (tmp_path / "rows.jsonl").write_text(json.dumps({"problem": "<image>x", "answer": "3", "images": ["gone.png"]}))
    code, out, err = run_cli(["train", "--config", TINY_RECIPE, "--dataset_name", str(tmp_path / "rows.jsonl"),
                              "--output_dir", str(tmp_path / "o")], capsys)  # fmt: skip
    assert_one_error_line(code, err, None, "unreadable image")


def test_a_run_killed_while_saving_is_requeued_by_the_same_command(tmp_path, capsys):
    """SIGKILL in the middle of writing checkpoint-2 (the OOM killer, a lost node): the same command rerun, as a
    scheduler's requeue does, sets the half-written checkpoint aside (renamed, not deleted) in one line, resumes from
    checkpoint-1 and ends on the weights of the uninterrupted run."""
    import subprocess
    import sys

    from safetensors.torch import load_file

    def argv(folder):
        return ["demo", "--output_dir", str(folder), "--max_steps", "2", "--save_strategy", "steps", "--save_steps",
                "1", "--synthetic_rows", "8"]  # fmt: skip

    killed = tmp_path / "killed"
    script = (
        "import os, signal, sys, torch\n"
        "real = torch.save\n"
        "def save(obj, f, *a, **k):\n"
        "    if str(f).endswith('optimizer.pt') and 'checkpoint-2' in str(f):\n"
        "        open(f, 'wb').write(b'PK half')\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return real(obj, f, *a, **k)\n"
        "torch.save = save\n"
        "from vepo_trl.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", script, *argv(killed)], capture_output=True, text=True, env=env)
    assert result.returncode == -9, result.stderr[-2000:]
    assert (killed / "checkpoint-2").is_dir() and not (killed / "checkpoint-2" / "trainer_state.json").exists()

    code, out, err = run_cli(argv(killed), capsys)
    assert code == 0, err
    [line] = [line for line in out.splitlines() if "incomplete" in line]
    assert "checkpoint-2 is incomplete (a save cut short) and set aside" in line and "Resuming from" in line
    assert (killed / "incomplete_checkpoints" / "checkpoint-2" / "optimizer.pt").is_file()  # kept for a look
    assert json.loads((killed / "trainer_state.json").read_text())["global_step"] == 2

    whole = tmp_path / "whole"
    code, out, err = run_cli(argv(whole), capsys)
    assert code == 0, err
    resumed, uninterrupted = load_file(killed / "model.safetensors"), load_file(whole / "model.safetensors")
    assert resumed.keys() == uninterrupted.keys()
    assert all((resumed[k] == uninterrupted[k]).all() for k in resumed)
