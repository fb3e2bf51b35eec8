"""Pushes to the Hub through the real `huggingface_hub` client, against a stand-in of the Hub's HTTP API on 127.0.0.1
(`tests/hub_standin`): what arrives in the repo, not what a fake `push_to_hub` recorded.

- `vepo-trl train --push_to_hub` (a real process, `HF_ENDPOINT` at the stand-in): model weights through the LFS
  protocol, processor, card; `hub_strategy` every_save (a commit per save) and checkpoint (`last-checkpoint/`); a PEFT
  adapter; nothing of the run folder's own files (`_vepo_run.lock`) or checkpoints at the repo's top.
- `vepo-trl eval` writes its complete results into the model folder's card as `model-index` metadata, which
  `huggingface_hub`'s `ModelCard` parses into `EvalResult`s, and pushes the card; partial results stay out.
"""

import json
import os
import subprocess
import sys

import pytest

from ..hub_standin.server import HubStandin
from ..support import REPO, TINY_RECIPE


@pytest.fixture
def hub():
    with HubStandin() as standin:
        yield standin


def hub_env(hub, tmp_path):
    env = {key: value for key, value in os.environ.items() if not key.endswith("_OFFLINE")}
    return {
        **env,
        "HF_ENDPOINT": hub.endpoint,
        "HF_HUB_DISABLE_XET": "1",  # the stand-in serves the LFS protocol, not Xet's chunk store
        "HF_HOME": str(tmp_path / "hf-home"),  # no token of the machine's user
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "PYTHONPATH": str(REPO),
    }


def train_and_push(hub, tmp_path, *flags, steps=2):
    output = tmp_path / "run"
    command = [
        sys.executable, "-m", "vepo_trl", "train", "--config", TINY_RECIPE, "--output_dir", str(output),
        "--max_steps", str(steps), "--logging_steps", "1", "--push_to_hub", "true", "--hub_model_id", "tester/tiny-vepo",
        "--hub_token", hub.token, *flags,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=hub_env(hub, tmp_path), timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return output


def assert_same_files(hub, output, names):
    files = hub.files("tester/tiny-vepo")
    for name in names:
        assert files[name] == (output / name).read_bytes(), name


@pytest.mark.slow
def test_training_pushes_model_processor_and_card_at_every_save(hub, tmp_path):
    output = train_and_push(
        hub, tmp_path, "--save_strategy", "steps", "--save_steps", "1", "--hub_strategy", "every_save"
    )
    files = hub.files("tester/tiny-vepo")
    assert_same_files(hub, output, ["model.safetensors", "config.json", "processor_config.json", "tokenizer.json"])
    assert "model.safetensors" in hub.lfs_paths("tester/tiny-vepo")  # weights through the LFS protocol
    card = files["README.md"].decode()
    assert "- vepo" in card and "tester/tiny-vepo" in card and hub.token not in card
    # The run folder's own files and the checkpoints stay local
    assert not any(name.startswith(("_", "checkpoint-")) for name in files), sorted(files)
    summaries = [commit["summary"] for commit in hub.commits("tester/tiny-vepo")]
    # The repo's first commit, one per save (steps 1 and 2), and the end of training
    assert len(summaries) >= 4 and summaries[-1] == "End of training", summaries


@pytest.mark.slow
def test_checkpoint_strategy_pushes_the_last_checkpoint_to_resume_from(hub, tmp_path):
    train_and_push(hub, tmp_path, "--save_strategy", "steps", "--save_steps", "1", "--hub_strategy", "checkpoint")
    files = hub.files("tester/tiny-vepo")
    state = json.loads(files["last-checkpoint/trainer_state.json"])
    assert state["global_step"] == 2
    assert {"last-checkpoint/model.safetensors", "last-checkpoint/optimizer.pt"} <= set(files)
    assert "model.safetensors" in files and "README.md" in files


@pytest.mark.slow
def test_a_peft_adapter_is_pushed_without_the_base_weights(hub, tmp_path):
    output = train_and_push(
        hub, tmp_path, "--use_peft", "true", "--lora_r", "4", "--lora_target_modules", "q_proj", "v_proj"
    )
    files = hub.files("tester/tiny-vepo")
    assert_same_files(hub, output, ["adapter_model.safetensors", "adapter_config.json"])
    assert "model.safetensors" not in files
    assert json.loads(files["adapter_config.json"])["r"] == 4


@pytest.fixture
def online_client(monkeypatch):
    """The in-process client online (the suite sets HF_HUB_OFFLINE, which huggingface_hub reads at import) and on
    the LFS protocol."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


def test_a_push_without_a_token_is_refused_by_the_standin(hub, online_client):
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    with pytest.raises(HfHubHTTPError):
        HfApi(endpoint=hub.endpoint, token="hf_wrong").create_repo("tester/x")
    assert hub.repos == {}


def test_eval_writes_model_index_and_pushes_the_card(
    hub, tiny_model_dir, tmp_path, monkeypatch, capsys, standins_as_full_splits, online_client
):
    import shutil

    from huggingface_hub import ModelCard

    from vepo_trl.cli import main as cli_main
    from vepo_trl.eval.standins import write_standins

    from ..support import FAST

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model, ignore=shutil.ignore_patterns("README.md"))
    data = write_standins(tmp_path / "standins")
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)
    from vepo_trl.local_models import hub_unreachable

    hub_unreachable.cache_clear()
    from huggingface_hub import HfApi

    HfApi(endpoint=hub.endpoint, token=hub.token).create_repo("tester/tiny-vepo")  # the model was pushed before
    argv = ["eval", "--model", str(model), "--data_dir", str(data), "--benchmarks", "geometry3k,hallusionbench",
            "--protocol", "rule", "--output_dir", str(tmp_path / "results"), "--push_to_hub",
            "--hub_model_id", "tester/tiny-vepo", "--hub_token", hub.token, *FAST]  # fmt: skip
    try:
        cli_main(argv)
    finally:
        hub_unreachable.cache_clear()
    summary = json.loads((tmp_path / "results" / "summary.json").read_text())
    card = ModelCard((model / "README.md").read_text())
    results = {r.dataset_name: r for r in card.data.eval_results}
    assert set(results) == {"Geo3K", "HalluBench"}  # the titles of the paper's Table 1
    for name, result in (("geometry3k", results["Geo3K"]), ("hallusionbench", results["HalluBench"])):
        assert result.metric_value == summary["benchmarks"][name]["accuracy"]
        assert result.metric_type == "accuracy" and result.metric_name == "accuracy (rule protocol)"
        bench = summary["benchmarks"][name]
        assert result.metric_args == {
            "evaluated_with": "vepo-trl eval", "protocol": "rule", "ci95": bench["ci95"],
            "prompt_template_sha256": bench["provenance"]["prompt_template_sha256"],
            "decoding": "decoding=greedy, max_new_tokens=8, backend=transformers, dtype=auto",
            "data_sha256": bench["provenance"]["data_sha256"],
            "versions": ", ".join(f"{k} {v}" for k, v in bench["provenance"]["generation_versions"].items() if v),
        }  # fmt: skip
        assert result.metric_config == "rule" and result.dataset_type
    # What arrived on the (stand-in) Hub is that card
    assert hub.files("tester/tiny-vepo")["README.md"] == (model / "README.md").read_bytes()
    assert "model-index" in (model / "README.md").read_text()


def test_partial_results_stay_out_of_the_card(tiny_model_dir, tmp_path, capsys):
    import shutil

    from vepo_trl.cli import main as cli_main
    from vepo_trl.eval.standins import write_standins

    from ..support import FAST

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model, ignore=shutil.ignore_patterns("README.md"))
    data = write_standins(tmp_path / "standins")
    # The stand-ins are a few rows, not the paper's splits: partial, so nothing may be written as a score
    argv = ["eval", "--model", str(model), "--data_dir", str(data), "--benchmarks", "geometry3k", "--protocol", "rule",
            "--output_dir", str(tmp_path / "results"), *FAST]  # fmt: skip
    cli_main(argv)
    assert not (model / "README.md").exists()
    assert "no complete benchmark result" in capsys.readouterr().out


def test_results_written_into_a_trl_card_keep_everything_else(tmp_path):
    """A card as TRL writes it (`model_name:` among its metadata, a body of prose): writing results twice keeps every
    metadata line in its place, `model_name` included (huggingface_hub folds it into `model-index` and drops the
    line), the body byte for byte, and one result per data set and metric."""
    from huggingface_hub import ModelCard

    from vepo_trl.eval.card import write_model_index

    body = "\n# Model Card for vepo-7b\n\nTrained with [TRL](https://github.com/huggingface/trl).\n"
    header = ["base_model: Qwen/Qwen2.5-VL-7B-Instruct", "library_name: transformers", "model_name: vepo-7b",
              "tags:", "- trl", "- vepo", "licence: license"]  # fmt: skip
    (tmp_path / "README.md").write_text("---\n" + "\n".join(header) + "\n---\n" + body)
    summary = {"grading": {"protocol": "rule"}, "benchmarks": {"geometry3k": {"complete": True, "accuracy": 0.5}}}
    for _ in range(2):
        write_model_index(tmp_path, summary, "another-name")
    text = (tmp_path / "README.md").read_text()
    lines = text.split("---\n")[1].splitlines()
    assert lines[: len(header)] == header and lines[len(header)] == "model-index:"
    assert "- name: vepo-7b" in lines  # the card's own name, not the argument
    assert text.endswith("---\n" + body)
    card = ModelCard(text)
    assert card.data.model_name == "vepo-7b" and len(card.data.eval_results) == 1
