"""Helpers the test modules share (in the role of TRL's tests/testing_utils.py): the CLI runner and its one-error-line
assertion, folder snapshots, free ports, config and trainer makers and their first batch, the judge stand-in, the
recipes' parsing. No test module imports another; what two of them need lives here."""

import contextlib
import copy
import json
import os
import shlex
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from PIL import Image
from trl import GRPOConfig, GRPOTrainer

from vepo_trl.builtin.tiny_models import build_tokenizer
from vepo_trl.cli import main as cli_main
from vepo_trl.config import VEPOConfig
from vepo_trl.insight import records_from_signals
from vepo_trl.scoring import TokenSignals, select_tokens
from vepo_trl.train import make_parser
from vepo_trl.trainer import SELECTION_KEY, VEPOTrainer


REPO = Path(__file__).resolve().parent.parent
# A CPU machine has no bf16 GPU: the recipes stay as they run on GPUs and the tests parse them as CPU runs
CPU = ("--use_cpu", "true")


def overridden(argv: list[str], *options: str) -> list[str]:
    """`argv` with `options` (flag value pairs) replacing the same flags' values, or added: every command refuses a
    flag given twice, so a test that changes a base command line's value replaces it."""
    argv = list(argv)
    for flag, value in zip(options[::2], options[1::2]):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    return argv


def assert_one_error_line(code, err, command, *needles):
    """A refusal as every command makes it: exit 2, one line `vepo-trl <command>: error: ...` (`command` None: any
    command) holding each of `needles`, no traceback."""
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert code == 2 and "Traceback" not in err, err
    prefix = f"vepo-trl {command}: error: " if command else "vepo-trl"
    assert len(lines) == 1 and lines[0].startswith(prefix) and ": error: " in lines[0], lines
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def run_cli(argv, capsys):
    """(exit code, stdout, stderr) of one in-process `vepo-trl` call."""
    try:
        cli_main(argv)
        code = 0
    except SystemExit as exit_info:
        code = exit_info.code
    out, err = capsys.readouterr()
    return code, out, err


def snapshot(folder):
    """Every file (its bytes) and folder (None) below `folder`: equal before and after means nothing was written."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))
    }


class FakeOpenAI:
    """Answers /v1/chat/completions; `script` holds what to do for each request in turn ("500", "sleep", a reply),
    then `respond(prompt)` (when set) or `default`."""

    def __init__(self):
        self.requests: list[dict] = []
        self.script: list[str] = []
        self.default = "Extracted: B\nJudgement: 1"
        self.respond = None  # a function of the prompt that scripts the reply (after `script` runs out)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep the test output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                action = server.script.pop(0) if server.script else server.default
                if action == "500":
                    return self._send(500, {"error": {"message": "overloaded", "type": "server_error"}})
                if action == "sleep":
                    time.sleep(1.5)
                    action = server.default
                if action == "garbage":  # an HTTP 200 whose body is not JSON (a proxy's error page)
                    return self._send_raw(200, b"<html>upstream error</html>")
                prompt = body["messages"][0]["content"]
                if server.respond is not None and action == server.default:
                    action = server.respond(prompt)
                    if action == "500":
                        return self._send(500, {"error": {"message": "overloaded", "type": "server_error"}})
                if action == "echo":  # right when the response boxes the reference letter
                    gold = prompt.split("Reference answer:\n", 1)[1].split("\n", 1)[0][0]
                    response = prompt.split("Model response:\n", 1)[1]
                    action = f"Extracted: {gold}\nJudgement: {int(f'boxed{{{gold}}}' in response)}"
                self._send(200, {
                    "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": action}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                })  # fmt: skip

            def _send(self, status, payload):
                self._send_raw(status, json.dumps(payload).encode())

            def _send_raw(self, status, data):
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


SECRET = "sk-test-" + "k" * 32


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


# Small images and few tokens: the tiny random model only has to run the pipeline
FAST = ["--max_new_tokens", "8", "--min_pixels", "3136", "--max_pixels", "50176", "--batch_size", "4"]


def mixed_rows(visual_dataset):
    """Half the rows keep their image; the other half ask a text-only question."""
    from datasets import Dataset

    rows = [visual_dataset[i] for i in range(8)]
    for row in rows[::2]:
        row["images"] = []
        row["prompt"] = [row["prompt"][0], {"role": "user", "content": [{"type": "text", "text": "What is 2 + 3?"}]}]
        row["answer"] = "5"
    return Dataset.from_list(rows, features=visual_dataset.features)


def clone_inputs(inputs):
    return {k: v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v) for k, v in inputs.items()}


def first_batch(trainer):
    """One buffered training micro-batch, generated by the trainer itself (rollout, rewards, advantages)."""
    trainer.model.train()
    trainer.state.global_step = 0
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps  # set by `train()`
    batch = next(iter(trainer.get_train_dataloader()))
    return trainer._prepare_inputs(batch)


def make_trainer(model, dataset, tmp_path, trainer_cls=VEPOTrainer, **overrides):
    args = make_config(tmp_path, GRPOConfig if trainer_cls is GRPOTrainer else VEPOConfig, **overrides)
    return trainer_cls(model=model, reward_funcs=length_reward, args=args, train_dataset=dataset)


def make_config(tmp_path, config_cls=VEPOConfig, **overrides):
    settings = {
        "output_dir": str(tmp_path / "out"),
        "per_device_train_batch_size": 4,
        "num_generations": 4,
        "max_completion_length": 16,
        "max_steps": 2,
        "learning_rate": 1e-2,  # tiny model, few steps: large enough that every trained weight moves
        "logging_steps": 1,
        "report_to": "none",
        "save_strategy": "no",
        "use_cpu": True,
        "bf16": False,  # the same precision for VEPOConfig and GRPOConfig (whose unset bf16 would be True)
        "seed": 0,
    }
    settings.update(overrides)
    if config_cls is GRPOConfig:
        # The same settings without VEPO's fields
        settings = {k: v for k, v in settings.items() if k in GRPOConfig.__dataclass_fields__}
    return config_cls(**settings)


def length_reward(completions, **kwargs):
    # Deterministic and usually varied within a group, so advantages are non-zero without a model that can answer
    return [float(len(completion[0]["content"]) % 5) for completion in completions]


def alternating_reward(completions, **kwargs):
    """1, 0, 1, 0, ... in batch order: TRL lays a prompt's generations side by side, so every group of two or more
    holds both values and every advantage is non-zero, whatever a random model samples (a model that writes
    completions of one length gives `length_reward`'s groups no spread)."""
    return [float(index % 2 == 0) for index in range(len(completions))]


def mask_with_weights(trainer, inputs, state_dict=None, step=None):
    """The mask the first-use path computes for `inputs` with the given weights and step (which seeds the noise);
    default: the current ones."""
    current, current_step = None, trainer.state.global_step
    if step is not None:
        trainer.state.global_step = step
    if state_dict is not None:
        current = copy.deepcopy(trainer.model.state_dict())
        trainer.model.load_state_dict(state_dict)
    batch = {k: v for k, v in clone_inputs(inputs).items() if k != SELECTION_KEY}
    with torch.no_grad(), trainer.perturbed_pass.capture(trainer.model) as captured:
        forward = trainer._forward(trainer.model, batch)
    mask = trainer.selection_pipeline.select_at_first_use(trainer.model, batch, forward, captured)
    if current is not None:
        trainer.model.load_state_dict(current)
    trainer.state.global_step = current_step
    return mask


def trainer_prompts(output):
    """The trainer's processor-expanded prompt ids, one list per completion (left padding removed)."""
    return [ids[mask.bool()].tolist() for ids, mask in zip(output["prompt_ids"], output["prompt_mask"])]


def image(width, height, seed):
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (height, width, 3), generator=generator, dtype=torch.uint8)
    return Image.fromarray(pixels.numpy())


def free_port() -> int:
    # A port of our own: another launch on this machine (a parallel job, a leftover rank) may hold the default one
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_records(num=3, length=24, seed=0):
    """`num` completions of one prompt with random signals, selected by VEPO at k = 0.25, the way a run builds them."""
    tokenizer = build_tokenizer()
    generator = torch.Generator().manual_seed(seed)
    text = "<think> Count the shapes in the image. There are 3 red circles. </think> The answer is \\boxed{3}."
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:length]
    completion_ids = torch.tensor([ids] * num)
    mask = torch.ones_like(completion_ids, dtype=torch.bool)
    mask[1, length - 5 :] = False  # a shorter response
    entropy = torch.rand(num, length, generator=generator) * 4
    signals = TokenSignals(
        entropy=entropy,
        perturbed_entropy=entropy + torch.randn(num, length, generator=generator) * 0.5,
        jsd=torch.rand(num, length, generator=generator) * 0.69,
    )
    selected = select_tokens("vepo", signals, mask, ratio=0.25, alpha=0.7)
    image = Image.new("RGB", (96, 64), (255, 255, 255))
    image.paste((220, 40, 40), (10, 10, 40, 40))
    return records_from_signals(
        completion_ids, tokenizer, signals, mask, selected, ratio=0.25, alpha=0.7,
        rewards=[1.0, 0.0, 0.5], prompts=["How many red squares? <b>bold</b> & co"] * num, images=[image] * num,
        groups=[0] * num, meta={"model": "tiny", "perturbation": "diffusion"},
    )  # fmt: skip


def accelerate_argv(command: list[str], node: int = 0) -> list[str] | None:
    """`accelerate launch ...` of a command a launcher printed under DRY_RUN (srun's `bash -c` unwrapped as machine
    `node` runs it), or `None` for a command that starts no accelerate launch."""
    if "-c" in command:
        command = shlex.split(command[command.index("-c") + 1].replace("$SLURM_NODEID", str(node)))
    return command[command.index("accelerate") :] if "accelerate" in command else None


@contextlib.contextmanager
def world_size(processes: int):
    """Parse as each of `processes` launched processes would: GRPOConfig checks the batch against the world size."""
    from transformers import TrainingArguments

    original = TrainingArguments.world_size
    TrainingArguments.world_size = property(lambda self: processes)
    try:
        yield
    finally:
        TrainingArguments.world_size = original


def parse_argv(argv):
    # A fresh parser each time: a config file becomes the parser's defaults
    return make_parser().parse_args_and_config([*argv, *CPU])


COMPLETIONS_PER_ROLLOUT = 512 * 12  # 512 prompts x 12 samples per rollout batch


COMPLETIONS_PER_STEP = 128 * 12  # 128 prompts x 12 samples per optimiser step


RECIPES = REPO / "recipes"
# The demo's recipe, which every command-line test starts from
TINY_RECIPE = str(RECIPES / "tiny" / "config_vepo.yaml")


def record_rollouts(trainer, clone: bool = False) -> list[dict]:
    """Every generation batch `trainer` makes from now on (copies of its tensors with `clone`), in order."""
    outputs = []
    generate = trainer._generate_and_score_completions

    def recording(inputs):
        output = generate(inputs)
        outputs.append({k: v.clone() if torch.is_tensor(v) else v for k, v in output.items()} if clone else output)
        return output

    trainer._generate_and_score_completions = recording
    return outputs


def run_folder(tmp_path_factory) -> Path:
    """A folder every process of this test run shares: pytest-xdist gives each worker its own base folder inside the
    run's, so what is built there (tiny models, the lab's warm start, the field rules) is built once per run, not once
    per worker. vepo_trl's builders are process-safe (each builds in a private folder and renames it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def run_cache(tmp_path_factory) -> Path:
    """The run's `VEPO_TRL_CACHE` (in `run_folder`)."""
    return run_folder(tmp_path_factory) / "vepo-cache"


@pytest.fixture(autouse=True)
def tiny_cache(tmp_path_factory, monkeypatch):
    """`VEPO_TRL_CACHE` in the run's test folder (autouse where a module imports it): the tiny model is built once per
    run there, never into the user's cache."""
    monkeypatch.setenv("VEPO_TRL_CACHE", str(run_cache(tmp_path_factory)))


def documentation_pages() -> list[Path]:
    """The README, then every page of the documentation site in its navigation's order (mkdocs.yml): the order a
    newcomer reads them in."""
    import yaml

    def pages(entries):
        for entry in entries:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            if isinstance(value, list):
                yield from pages(value)
            else:
                yield value

    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    # changelog.md is CHANGELOG.md, put in by the site's hook (docs/_hooks/changelog.py)
    where = {"changelog.md": REPO / "CHANGELOG.md"}
    return [REPO / "README.md", *(where.get(page, REPO / "docs" / page) for page in pages(nav))]


def documentation() -> str:
    """The README and the documentation pages as one text, in reading order."""
    return "\n\n".join(path.read_text() for path in documentation_pages())
