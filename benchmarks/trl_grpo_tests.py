"""TRL's own GRPO test file, run against `GRPOTrainer` and against `VEPOTrainer`: an outside check that VEPOTrainer is
a drop-in for GRPOTrainer, offline.

The test file is TRL's `tests/test_grpo_trainer.py`, read at run time from a TRL source tree (a plain checkout, or a
git directory and a revision read with `git show`); nothing of it is kept in this repository. It is copied into a
scratch folder with the files it imports from TRL's `tests/` and TRL's `pyproject.toml` (its pytest settings), and
run three times with `--junitxml`:

- `grpo`: unchanged, on the installed TRL's `GRPOTrainer`: what the file itself does on this TRL;
- `full`: this file loaded as a pytest plugin replaces the test module's `GRPOTrainer` and `GRPOConfig` by
  `VEPOTrainer` and a `VEPOConfig` whose `selection_strategy` defaults to `"full"` (plain GRPO's tokens);
- `vepo`: the same, with the paper's strategy (`"vepo"`) on the tests that use a vision-language model and `"full"`
  on the rest (a text-only model has no image to perturb, and VEPOTrainer refuses it).

Offline, the tests' Hub ids are served from a stand-in Hub cache (the real cache layout, `HF_HUB_OFFLINE=1`): each
`trl-internal-testing/tiny-*` model is made by running TRL's own generator script for it
(`scripts/generate_tiny_models/`), unchanged, with its helpers redirected: `push_to_hub` saves into the cache, the
version pin, dtype and config-diff checks (which read the real checkpoints) do nothing. The reference checkpoint a
script starts from (`AutoProcessor/AutoTokenizer/AutoConfig.from_pretrained("Qwen/Qwen2.5-VL-3B-Instruct")`, ...) is
itself a stand-in in the same cache, since the real one cannot be downloaded: for a vision-language model, the
processor, config and generation config of vepo_trl's tiny model of that family (`vepo_trl.builtin.tiny_models`); for
a text model, a tokenizer from `build_tokenizer` with the family's chat template as TRL ships it
(`trl/chat_templates/`). So the sizes, layer types and dtypes are TRL's; the vocabulary, special-token ids and what a
script leaves unset come from the stand-in reference. The `trl-internal-testing/zen*` data sets are made by TRL's
`scripts/generate_zen*_dataset.py` (their `push_to_hub` saved to disk) and `datasets.load_dataset` is routed to them.

    python benchmarks/trl_grpo_tests.py --trl-source /path/to/trl                    # a checkout
    python benchmarks/trl_grpo_tests.py --trl-source /path/to/trl.git --trl-rev v1.0.0 --out runs/trl-grpo
    python benchmarks/trl_grpo_tests.py -k "Qwen2_5_VL or Gemma3" --trainer vepo --out runs/trl-grpo

`--out` keeps the stand-ins (built once, reused) and every run's JUnit file; the report (`report.md`, also printed)
merges the runs in that folder made on the same vepo_trl commit (each run records it; the report names it): per test,
its outcome on each trainer with the one-line reason, the counts, and the tests that pass on GRPOTrainer but not on
VEPOTrainer (a test with no result, its pytest process dead, is among them; a refusal on purpose is excused only by
its expected message). Model ids no stand-in could be built for are listed (their tests
error on every trainer), and so is what the file needs that the installed TRL lacks (names it imports, GRPOConfig
fields it sets). Each pytest run is one process; set OMP_NUM_THREADS to bound its threads.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path


TEST_FILE = "tests/test_grpo_trainer.py"
SUPPORT_FILES = ("tests/conftest.py", "tests/testing_utils.py")  # pytest's fixtures and the file's helpers
GENERATORS = "scripts/generate_tiny_models"
ORG = "trl-internal-testing"
TRAINERS = ("grpo", "full", "vepo")
SUITE_PACKAGE = "trl_tests"  # TRL's tests/ under another name, so it never shadows this repository's tests package

# What the pytest child reads (set by `run_pytest`)
ENV_TRAINER = "TRL_GRPO_TESTS_TRAINER"
ENV_DATASETS = "TRL_GRPO_TESTS_DATASETS"
ENV_VLM_IDS = "TRL_GRPO_TESTS_VLM_IDS"
ENV_TIMEOUT = "TRL_GRPO_TESTS_TIMEOUT"

MODEL_ID = re.compile(rf"{ORG}/tiny-[\w.\-]+")
DATASET_ID = re.compile(rf"{ORG}/zen[\w\-]*")


# ---------------------------------------------------------------------------------------------------------------------
# The TRL source tree
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrlSource:
    """A TRL tree: a plain checkout read from disk (`rev` None), or a git directory read at `rev` with `git show`."""

    root: Path
    rev: str | None = None

    def read(self, path: str) -> bytes:
        if self.rev is None:
            return (self.root / path).read_bytes()
        return self._git("show", f"{self.rev}:{path}")

    def exists(self, path: str) -> bool:
        if self.rev is None:
            return (self.root / path).is_file()
        return bool(self._git("ls-tree", "--name-only", self.rev, path).strip())

    def files(self, folder: str) -> list[str]:
        if self.rev is None:
            return sorted(str(p.relative_to(self.root)) for p in (self.root / folder).rglob("*") if p.is_file())
        return self._git("ls-tree", "-r", "--name-only", self.rev, folder).decode().split()

    def describe(self) -> str:
        version = self.read("VERSION").decode().strip() if self.exists("VERSION") else "?"
        if self.rev is None:
            return f"{self.root} (checkout, VERSION {version})"
        date = self._git("show", "-s", "--format=%cs", self.rev).decode().strip()
        return f"{self.root} at {self.rev[:12]} ({date}, VERSION {version})"

    def _git(self, *args: str) -> bytes:
        return subprocess.run(["git", "-C", str(self.root), *args], check=True, capture_output=True).stdout


def open_source(spec: str | None, rev: str | None) -> TrlSource:
    """`--trl-source`: a checkout holding the test file (read from disk unless a revision is asked for), else a git
    directory (bare or not) read at `rev` (default HEAD), resolved to its commit so the report names it."""
    if not spec:
        raise SystemExit("no TRL source: pass --trl-source DIR (a checkout or a git directory) or set VEPO_TRL_SOURCE")
    root = Path(spec).expanduser().resolve()
    if rev is None and (root / TEST_FILE).is_file():
        return TrlSource(root)
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", f"{rev or 'HEAD'}^{{commit}}"],
                                check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    except (subprocess.CalledProcessError, FileNotFoundError) as error:
        raise SystemExit(
            f"{root} is neither a TRL checkout nor a git directory with {rev or 'HEAD'}: {error}"
        ) from None
    return TrlSource(root, commit)


# ---------------------------------------------------------------------------------------------------------------------
# Pure helpers: what the test file and the generator scripts say
# ---------------------------------------------------------------------------------------------------------------------


def local_imports(text: str) -> set[str]:
    """Modules of TRL's tests/ package a test file imports (`from .testing_utils import`, `from tests.x import`)."""
    names = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.level == 1:
                names.add(node.module.split(".")[0])
            elif node.level == 0 and node.module.startswith("tests."):
                names.add(node.module.split(".")[1])
    return names


def trl_imports(text: str) -> set[tuple[str, str]]:
    """`(module, name)` of every `from trl... import name` in a file."""
    return {
        (node.module, alias.name)
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "trl"
        for alias in node.names
    }


def config_keywords(text: str, name: str = "GRPOConfig") -> set[str]:
    """Keyword arguments a file passes to `name(...)`."""
    return {
        keyword.arg
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name
        for keyword in node.keywords
        if keyword.arg
    }


def model_ids_in(text: str) -> list[str]:
    return sorted(set(MODEL_ID.findall(text)))


def dataset_ids_in(text: str) -> list[str]:
    return sorted(set(DATASET_ID.findall(text)))


def dataset_script(repo_id: str) -> str:
    """TRL's generator of a zen data set: `trl-internal-testing/zen-image` -> scripts/generate_zen_image_dataset.py."""
    return f"scripts/generate_{repo_id.split('/')[1].replace('-', '_')}_dataset.py"


@dataclass(frozen=True)
class Generator:
    """One of TRL's tiny-model scripts, read without running it."""

    path: str  # in the TRL tree, e.g. scripts/generate_tiny_models/for_causal_lm/qwen2_for_causal_lm_2_5.py
    repo_id: str  # what its push_to_hub names, e.g. trl-internal-testing/tiny-Qwen2ForCausalLM-2.5
    model_class: str
    reference: str | None  # MODEL_ID, the checkpoint its tokenizer, processor and config come from
    revision: str | None  # REVISION, where the script pins one
    vision: bool  # builds a processor (an image-text model), not only a tokenizer

    @property
    def module(self) -> str:
        return self.path.removesuffix(".py").replace("/", ".")


def describe_generator(path: str, text: str) -> Generator | None:
    """What a generator script builds and from what; None for one that does not build a model from a config (the PEFT
    adapters load another tiny model instead). The repo id is formed as `push_to_hub` forms it:
    `{ORG}/{prefix}-{model class}[-{suffix}]`."""
    tree = ast.parse(text)
    constants, model_class, push = {}, None, None
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target, value = node.targets[0].id, node.value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                constants[target] = value.value
            # `model = SomeForCausalLM(config)`: a class built from its config (not `X.from_pretrained`, not a helper)
            if target == "model" and isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
                value = value.func.value if value.func.attr == "to" else value  # `Cls(config).to(dtype=...)`
            if (target == "model" and isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                    and value.func.id[:1].isupper()):  # fmt: skip
                model_class = value.func.id
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
                and node.value.func.id == "push_to_hub"):  # fmt: skip
            push = node.value
    if model_class is None or push is None:
        return None
    arguments = dict(zip(("model", "tokenizer", "generation_config", "prefix", "suffix"), push.args))
    arguments.update({keyword.arg: keyword.value for keyword in push.keywords})
    prefix, suffix = (ast.literal_eval(arguments[k]) if k in arguments else None for k in ("prefix", "suffix"))
    name = f"{prefix}-{model_class}" if prefix else model_class
    return Generator(
        path=path,
        repo_id=f"{ORG}/{name}" + (f"-{suffix}" if suffix else ""),
        model_class=model_class,
        reference=constants.get("MODEL_ID"),
        revision=constants.get("REVISION"),
        vision="AutoProcessor.from_pretrained" in text,
    )


def uses_vision_model(nodeid: str, params: dict, source: str, vlm_ids: set[str]) -> bool:
    """Whether a test trains a vision-language model: by its model parameter when it has one (a test parametrised over
    text and image models is decided per case), else by the ids its code names."""
    named = [value for value in params.values() if isinstance(value, str) and MODEL_ID.fullmatch(value)]
    if named:
        return any(value in vlm_ids for value in named)
    return any(repo_id in source or repo_id in nodeid for repo_id in vlm_ids)


# ---------------------------------------------------------------------------------------------------------------------
# The scratch suite: TRL's test files, copied
# ---------------------------------------------------------------------------------------------------------------------


def copy_suite(source: TrlSource, dest: Path) -> Path:
    """TRL's test file, conftest and the tests/ modules they import (transitively) into `dest/trl_tests/`, TRL's
    pyproject.toml (its pytest markers and warning filters) beside it, and the generator scripts under `dest/scripts/`.
    Returns the copied test file."""
    package = dest / SUITE_PACKAGE
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    pending, done = [TEST_FILE, *SUPPORT_FILES], set()
    while pending:
        path = pending.pop()
        if path in done or not source.exists(path):
            continue
        done.add(path)
        text = source.read(path)
        (package / Path(path).name).write_bytes(text)
        pending += [f"tests/{name}.py" for name in local_imports(text.decode())]
    (dest / "pyproject.toml").write_bytes(source.read("pyproject.toml"))
    for path in [*source.files(GENERATORS), *(p for p in source.files("scripts") if re.search(r"/generate_zen", p))]:
        (dest / path).parent.mkdir(parents=True, exist_ok=True)
        (dest / path).write_bytes(source.read(path))
    return package / Path(TEST_FILE).name


def generators(tree: Path) -> dict[str, Generator]:
    """Every tiny-model generator script in the copied tree, by the repo id it pushes."""
    found = {}
    for path in sorted((tree / GENERATORS).rglob("*.py")):
        relative = str(path.relative_to(tree))
        if (info := describe_generator(relative, path.read_text())) is not None:
            found[info.repo_id] = info
    return found


# ---------------------------------------------------------------------------------------------------------------------
# The stand-in Hub cache
# ---------------------------------------------------------------------------------------------------------------------


def snapshot(hub: Path, repo_id: str, revision: str | None = None, kind: str = "models") -> Path:
    """The snapshot folder of `repo_id` at `revision` in a Hub cache laid out as huggingface_hub's
    (`models--org--name/refs/<revision>` holding a commit, `snapshots/<commit>/`), the commit derived from the name."""
    revision = revision or "main"
    repo = hub / f"{kind}--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()
    ref = repo / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(commit)
    folder = repo / "snapshots" / commit
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def is_cached(hub: Path, repo_id: str) -> bool:
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    ref = repo / "refs" / "main"
    return ref.is_file() and (repo / "snapshots" / ref.read_text().strip() / "config.json").is_file()


@dataclass(frozen=True)
class TextFlavour:
    """What a text model's reference stands in with: its model type (the config `AutoTokenizer` and
    `AutoConfig.from_pretrained` read), TRL's copy of the family's chat template and the special tokens it writes (so
    each is one token), the named tokens, and what ends a completion."""

    model_type: str
    template: str  # trl/chat_templates/<template>.jinja
    tokens: tuple[str, ...] | None  # None: Qwen's (build_tokenizer's default)
    eos: str
    pad: str
    bos: str | None = None
    stop: tuple[str, ...] = ()  # generation: tokens that end a completion besides eos
    extra: tuple[str, ...] = ()  # special tokens added to `tokens`


# Matched on the reference checkpoint's id, first match wins; anything else gets Qwen2.5's (ChatML)
TEXT_FLAVOURS = (
    ("qwen3", TextFlavour(
        "qwen3", "qwen3", None, "<|im_end|>", "<|endoftext|>", stop=("<|endoftext|>",),
        extra=("<think>", "</think>", "<tool_response>", "</tool_response>"),
    )),
    ("qwen", TextFlavour("qwen2", "qwen2_5", None, "<|im_end|>", "<|endoftext|>", stop=("<|endoftext|>",))),
    ("llama-3", TextFlavour(
        "llama", "llama3_2",
        ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
         "<|eom_id|>", "<|python_tag|>", "<|finetune_right_pad_id|>"),
        "<|eot_id|>", "<|finetune_right_pad_id|>", bos="<|begin_of_text|>", stop=("<|end_of_text|>", "<|eom_id|>"),
    )),
    ("gemma-2", TextFlavour(
        "gemma2", "gemma", ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"), "<eos>", "<pad>",
        bos="<bos>", stop=("<end_of_turn>",),
    )),
    ("aya", TextFlavour(
        "cohere2", "cohere2",
        ("<PAD>", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", "<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>",
         "<|CHATBOT_TOKEN|>", "<|SYSTEM_TOKEN|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>"),
        "<|END_OF_TURN_TOKEN|>", "<PAD>", bos="<BOS_TOKEN>",
    )),
    ("glm-4", TextFlavour(
        "glm4_moe", "glm4moe",
        ("<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<think>",
         "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<arg_key>", "</arg_key>",
         "<arg_value>", "</arg_value>"),
        "<|endoftext|>", "<|endoftext|>", stop=("<|user|>", "<|observation|>"),
    )),
    ("gpt-oss", TextFlavour(
        "gpt_oss", "gptoss",
        ("<|startoftext|>", "<|endoftext|>", "<|start|>", "<|message|>", "<|end|>", "<|return|>", "<|channel|>",
         "<|call|>", "<|constrain|>"),
        "<|return|>", "<|endoftext|>", bos="<|startoftext|>", stop=("<|call|>",),
    )),
    ("nemotron", TextFlavour(
        "nemotron_h", "nemotron_3_nano",
        ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
         "<tool_response>", "</tool_response>"),
        "<|im_end|>", "</s>", bos="<s>",
    )),
    # TRL ships no Mistral text template; LLaVA-NeXT's is Mistral-7B-Instruct's [INST] format (with image parts)
    ("mistral", TextFlavour(
        "mistral", "llava_next", ("<unk>", "<s>", "</s>", "[INST]", "[/INST]"), "</s>", "<unk>", bos="<s>",
    )),
)  # fmt: skip


def text_flavour(reference: str) -> TextFlavour:
    lowered = reference.lower()
    return next((flavour for key, flavour in TEXT_FLAVOURS if key in lowered), TEXT_FLAVOURS[1][1])


class StandInHub:
    """Builds the stand-ins into a Hub cache, in this process (HF_HUB_OFFLINE and the cache paths set before any
    Hugging Face import), by running TRL's generator scripts from the copied tree."""

    def __init__(self, tree: Path, hub: Path):
        self.tree, self.hub = tree, hub
        self.pushed: dict[str, Path] = {}

    def build(self, repo_ids: list[str], scripts: dict[str, Generator], log) -> dict[str, str | None]:
        """Each id -> None when its stand-in is in the cache, else why there is none."""
        self._redirect_helpers()
        results = {}
        for repo_id in repo_ids:
            if is_cached(self.hub, repo_id):
                results[repo_id] = None
                continue
            info = scripts.get(repo_id)
            if info is None:
                results[repo_id] = "no generator script in the TRL tree pushes this id"
                log(f"  {repo_id}: {results[repo_id]}")
                continue
            start = time.perf_counter()
            try:
                self._build_one(info)
                results[repo_id] = None if repo_id in self.pushed else f"{info.path} pushed no {repo_id}"
            except Exception as error:  # noqa: BLE001 - one id without a stand-in must not stop the others
                results[repo_id] = f"{info.path}: {type(error).__name__}: {str(error).splitlines()[0][:200]}"
            outcome = "ok" if results[repo_id] is None else results[repo_id]
            log(f"  {repo_id}: {outcome} ({time.perf_counter() - start:.1f} s)")
        return results

    def _build_one(self, info: Generator) -> None:
        import runpy

        import torch

        if info.reference:
            self._write_reference(info)
        torch.manual_seed(0)  # the scripts initialise from the global generator: the same stand-in every build
        runpy.run_module(info.module, run_name="__main__")

    def _redirect_helpers(self) -> None:
        """TRL's generator helpers, redirected: push_to_hub saves into the stand-in cache; the version pin, the dtype
        check and the config diff compare with the real Hub checkpoints, which are out of reach, so they do nothing;
        the smoke test is left to the tests themselves."""
        if str(self.tree) not in sys.path:
            sys.path.insert(0, str(self.tree))
        import importlib

        common = importlib.import_module(f"{GENERATORS.replace('/', '.')}._common")
        for name in ("check_transformers_version", "check_dtype_pattern", "print_config_diff", "smoke_test"):
            setattr(common, name, lambda *args, **kwargs: None)
        common.push_to_hub = self._push_to_hub

    def _push_to_hub(self, model, tokenizer, generation_config, prefix=None, suffix=None, create_pr=None):
        name = f"{prefix}-{model.__class__.__name__}" if prefix is not None else model.__class__.__name__
        repo_id = f"{ORG}/{name}" + (f"-{suffix}" if suffix is not None else "")
        folder = snapshot(self.hub, repo_id)
        model.save_pretrained(folder)
        for part in (tokenizer, generation_config):
            if part is not None:
                part.save_pretrained(folder)
        (folder / "README.md").write_text(f"Stand-in of {repo_id}, built offline by {Path(__file__).name}.\n")
        self.pushed[repo_id] = folder

    def _write_reference(self, info: Generator) -> None:
        """The checkpoint a script loads its tokenizer/processor, config and generation config from, as a stand-in
        (rewritten per script: two scripts may read one reference as different config classes)."""
        from transformers import AutoConfig, GenerationConfig

        from vepo_trl.builtin.tiny_models import build_tiny
        from vepo_trl.builtin.tiny_recipes import TINY_RECIPES

        folder = snapshot(self.hub, info.reference, info.revision)
        if info.vision:
            family = next((name for name, recipe in TINY_RECIPES.items() if recipe.model == info.model_class), None)
            if family is None:
                raise ValueError(f"vepo_trl has no tiny recipe for {info.model_class}, so no stand-in processor")
            # Our family's processor (locally trained tokenizer, the family's special tokens and chat template), its
            # config (whose token ids match that tokenizer) and generation config (stop tokens; image placeholders
            # never sampled, which a random model would otherwise do); the script's sizes then override the config
            model, processor = build_tiny(family)
            processor.save_pretrained(folder)
            model.config.save_pretrained(folder)
            model.generation_config.save_pretrained(folder)
            return
        flavour = text_flavour(info.reference)
        tokenizer = self._tokenizer(flavour)
        tokenizer.save_pretrained(folder)
        ids = tokenizer.convert_tokens_to_ids
        named = {"eos_token_id": ids(flavour.eos), "pad_token_id": ids(flavour.pad)}
        if flavour.bos:
            named["bos_token_id"] = ids(flavour.bos)
        # The model type's defaults with this tokenizer's vocabulary and ids: what `AutoConfig.from_pretrained` starts
        # from, and what `AutoTokenizer` reads first
        AutoConfig.for_model(flavour.model_type, vocab_size=len(tokenizer), **named).save_pretrained(folder)
        stop = [named["eos_token_id"], *(ids(token) for token in flavour.stop)]
        GenerationConfig(**{**named, "eos_token_id": stop}).save_pretrained(folder)

    @staticmethod
    def _tokenizer(flavour: TextFlavour):
        from trl import chat_template_utils

        from vepo_trl.builtin.tiny_models import QWEN_SPECIAL_TOKENS, build_tokenizer

        template = Path(chat_template_utils.__file__).parent / "chat_templates" / f"{flavour.template}.jinja"
        return build_tokenizer(
            special_tokens=(flavour.tokens or QWEN_SPECIAL_TOKENS) + flavour.extra,
            bos_token=flavour.bos,
            eos_token=flavour.eos,
            pad_token=flavour.pad,
            chat_template=template.read_text(encoding="utf-8"),
        )


def build_datasets(tree: Path, root: Path, repo_ids: list[str], log) -> dict[str, str | None]:
    """Each zen data set made by TRL's generator script (its `main` with its own default test size), whose
    `push_to_hub(repo_id, config_name=...)` saves to `root/<repo_id>/<config_name>` instead."""
    import runpy

    import numpy as np
    from datasets import DatasetDict

    results = {}
    for repo_id in repo_ids:
        if (root / repo_id).is_dir():
            results[repo_id] = None
            continue
        script = tree / dataset_script(repo_id)
        if not script.is_file():
            results[repo_id] = f"no {dataset_script(repo_id)} in the TRL tree"
            log(f"  {repo_id}: {results[repo_id]}")
            continue
        original = DatasetDict.push_to_hub

        def save(dataset, target, config_name="default", **kwargs):
            dataset.save_to_disk(str(root / target / config_name))

        DatasetDict.push_to_hub = save
        try:
            namespace = runpy.run_path(str(script), run_name="zen_generator")
            np.random.seed(0)  # the image sets draw their sizes and pixels from numpy's global generator
            namespace["main"](namespace["ScriptArguments"]().test_size, True, repo_id)
            results[repo_id] = None
        except Exception as error:  # noqa: BLE001
            results[repo_id] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        finally:
            DatasetDict.push_to_hub = original
        log(f"  {repo_id}: {results[repo_id] or 'ok'}")
    return results


def installed_trl_gaps(files: list[Path], test_file: Path) -> dict:
    """What the copied files need that the installed TRL lacks: names they import from trl, GRPOConfig fields the test
    file sets. Checked in this process (the build step imports TRL anyway)."""
    import dataclasses
    import importlib

    import trl

    missing = []
    for module_name, name in sorted(set().union(*(trl_imports(path.read_text()) for path in files))):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            missing.append(f"{module_name} (the module)")
            continue
        if not hasattr(module, name):
            missing.append(f"{module_name}.{name}")
    fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    return {
        "trl_version": trl.__version__,
        "missing_imports": missing,
        "unknown_config_fields": sorted(config_keywords(test_file.read_text()) - fields),
    }


# ---------------------------------------------------------------------------------------------------------------------
# The pytest plugin (this file, loaded in the pytest child with `-p trl_grpo_tests`)
# ---------------------------------------------------------------------------------------------------------------------

_STRATEGY = ["full"]  # the selection strategy the swapped-in config defaults to, set per test


class TestTimeout(Exception):  # noqa: N818 - reads as the outcome in the report
    pass


def pytest_configure(config):
    if ENV_TRAINER not in os.environ:
        return  # imported, not loaded as the plugin of a run of this script
    _shim_missing_trl_helpers(Path(str(config.rootpath)) / SUITE_PACKAGE)
    _route_zen_datasets(Path(os.environ[ENV_DATASETS]))


def _shim_missing_trl_helpers(suite: Path) -> None:
    """TRL's testing_utils imports availability checks from `trl.import_utils`; one the installed TRL lacks would make
    the whole file fail to import, so it is added as a plain "is the package installed" check (the report lists it)."""
    import importlib
    import importlib.util

    for path in suite.glob("*.py"):
        for module_name, name in trl_imports(path.read_text()):
            module = importlib.import_module(module_name)
            if not hasattr(module, name) and (match := re.fullmatch(r"is_(\w+)_available", name)):
                package = match.group(1)
                setattr(module, name, lambda package=package: importlib.util.find_spec(package) is not None)


def _route_zen_datasets(root: Path) -> None:
    """`datasets.load_dataset("trl-internal-testing/zen...", config, split=..., streaming=...)` reads the data set
    built from TRL's generator script; any other call goes to the real function."""
    import datasets

    original = datasets.load_dataset

    def load_dataset(path, name=None, *args, split=None, streaming=False, **kwargs):
        folder = root / str(path) / str(name or "default")
        if not str(path).startswith(f"{ORG}/zen") or not folder.is_dir():
            return original(path, name, *args, split=split, streaming=streaming, **kwargs)
        dataset = datasets.load_from_disk(str(folder))  # the DatasetDict the script pushed: train and test
        if split is not None:
            dataset = dataset[split]
        if streaming:
            if isinstance(dataset, datasets.DatasetDict):
                return datasets.IterableDatasetDict({k: v.to_iterable_dataset() for k, v in dataset.items()})
            return dataset.to_iterable_dataset()
        return dataset

    datasets.load_dataset = load_dataset


def pytest_collection_modifyitems(session, config, items):
    """The test module's own names, after it is imported: its `load_dataset` (bound at import) routed like
    `datasets.load_dataset`, and for a VEPO run its `GRPOTrainer` / `GRPOConfig` replaced."""
    trainer = os.environ.get(ENV_TRAINER)
    if trainer is None:
        return
    import datasets

    swap = _vepo_classes() if trainer != "grpo" else None
    for module in {item.module for item in items if getattr(item, "module", None) is not None}:
        if hasattr(module, "load_dataset"):
            module.load_dataset = datasets.load_dataset
        if swap and hasattr(module, "GRPOTrainer"):
            module.GRPOTrainer, module.GRPOConfig = swap


def _vepo_classes():
    """VEPOTrainer itself, and a VEPOConfig whose `selection_strategy` defaults to the strategy of the running test.
    Each test runs as TRL wrote it: one that builds the trainer without `args` gets what a bare VEPOTrainer builds
    (the paper's config), and a refusal of that is excused only by its expected message (`REFUSED_ON_PURPOSE`)."""
    import dataclasses

    from vepo_trl import VEPOConfig, VEPOTrainer

    @dataclasses.dataclass
    class SwappedConfig(VEPOConfig):
        selection_strategy: str = dataclasses.field(default_factory=lambda: _STRATEGY[0])

    # A module attribute under its own name, so that pickle finds it (the Trainer saves its args with torch.save)
    SwappedConfig.__qualname__, SwappedConfig.__module__ = SwappedConfig.__name__, __name__
    globals()[SwappedConfig.__name__] = SwappedConfig
    return VEPOTrainer, SwappedConfig


def pytest_runtest_setup(item):
    """Per test: the strategy the swapped-in config defaults to (kept as the test's `selection_strategy` JUnit
    property), and the timer."""
    trainer = os.environ.get(ENV_TRAINER)
    if trainer is None:
        return
    if trainer == "vepo":
        import inspect

        params = getattr(getattr(item, "callspec", None), "params", {})
        try:
            source = inspect.getsource(item.function)
        except (OSError, TypeError):
            source = ""
        vlm = uses_vision_model(item.nodeid, params, source, set(json.loads(os.environ[ENV_VLM_IDS])))
        _STRATEGY[0] = "vepo" if vlm else "full"
    else:
        _STRATEGY[0] = "full"
    if trainer != "grpo":
        item.user_properties.append(("selection_strategy", _STRATEGY[0]))
    _start_timer(float(os.environ.get(ENV_TIMEOUT) or 0))


def _start_timer(seconds: float) -> None:
    """A test (its fixtures and call) over `--timeout-per-test` seconds fails with `TestTimeout`: SIGALRM in the main
    thread, where pytest runs the test, so no extra package is needed. This plugin's setup hook runs before pytest's
    own (which sets the fixtures up); its teardown hook stops the timer."""
    if seconds <= 0:
        return

    def expire(signum, frame):
        raise TestTimeout(f"the test ran past {seconds:.0f} s")

    signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)


def pytest_runtest_teardown(item):
    if ENV_TRAINER in os.environ:
        signal.setitimer(signal.ITIMER_REAL, 0)


# ---------------------------------------------------------------------------------------------------------------------
# Running pytest and reading its JUnit files
# ---------------------------------------------------------------------------------------------------------------------


def run_label(expression: str | None) -> str:
    """A file-name label for one `-k` selection, so runs with different selections keep their own JUnit files."""
    if not expression:
        return "all"
    slug = re.sub(r"[^A-Za-z0-9]+", "-", expression).strip("-")[:40]
    return f"{slug}-{hashlib.sha1(expression.encode()).hexdigest()[:6]}"


def this_commit() -> str:
    """The vepo_trl commit the runs test (`+dirty` with uncommitted changes), or "unknown" outside a git checkout."""
    repo = Path(__file__).resolve().parent.parent

    def git(*args):
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)

    head = git("rev-parse", "HEAD")
    if head.returncode != 0:
        return "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    return head.stdout.strip() + ("+dirty" if dirty else "")


def run_pytest(trainer: str, test_file: Path, out: Path, expression: str | None, timeout: float, vlm_ids: list[str],
               log) -> Path:  # fmt: skip
    label = run_label(expression)
    junit, transcript = out / f"junit-{trainer}-{label}.xml", out / "logs" / f"pytest-{trainer}-{label}.log"
    junit.unlink(missing_ok=True)  # a run that dies leaves no file: its tests then count as missing, not as passed
    (out / f"junit-{trainer}-{label}.json").write_text(
        json.dumps({"commit": this_commit(), "trainer": trainer, "expression": expression})
    )
    transcript.parent.mkdir(parents=True, exist_ok=True)
    suite = test_file.parent.parent
    command = [
        sys.executable, "-m", "pytest", str(test_file),
        "-c", str(suite / "pyproject.toml"), "--rootdir", str(suite),  # TRL's pytest settings, not this repo's
        "-p", Path(__file__).stem, "-p", "no:cacheprovider",
        f"--junitxml={junit}", "-o", "junit_logging=no", "-rN", "-q",
    ]  # fmt: skip
    if expression:
        command += ["-k", expression]
    env = offline_env(out) | {
        ENV_TRAINER: trainer,
        ENV_DATASETS: str(out / "datasets"),
        ENV_VLM_IDS: json.dumps(vlm_ids),
        ENV_TIMEOUT: str(timeout),
        "PYTHONPATH": os.pathsep.join(p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH")) if p),
    }
    work = out / "work"  # relative output folders the tests' trainers make (a bare trainer's "<model>-GRPO") go here
    work.mkdir(exist_ok=True)
    log(f"[{trainer}] {' '.join(command[1:])}")
    start = time.perf_counter()
    with transcript.open("w") as handle:
        code = subprocess.run(command, cwd=work, env=env, stdout=handle, stderr=subprocess.STDOUT).returncode
    tail = transcript.read_text(errors="replace").strip().splitlines()[-1:] or [""]
    log(f"[{trainer}] exit {code} in {time.perf_counter() - start:.0f} s: {tail[0]}  (transcript: {transcript})")
    return junit


def offline_env(out: Path) -> dict[str, str]:
    home = out / "hf_home"
    return dict(os.environ) | {
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(home / "hub"),
        "HF_DATASETS_CACHE": str(home / "datasets"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "WANDB_MODE": "disabled",
    }


@dataclass(frozen=True)
class Outcome:
    status: str  # passed, failed, error, skipped, xfailed
    reason: str = ""
    strategy: str = ""  # the VEPO selection strategy the test ran with
    detail: str = ""  # the failure's whole message (a refusal's expected message is searched in it)


def one_line(text: str | None, width: int = 160) -> str:
    line = next((line.strip() for line in (text or "").splitlines() if line.strip()), "")
    return line if len(line) <= width else line[: width - 1] + "…"


def read_junit(path: Path) -> dict[str, Outcome]:
    """Test id (`Class::test[param]`) -> outcome, from one JUnit file."""
    results = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        if not case.get("name"):
            continue  # the record an interrupted run (Ctrl-C) leaves
        classname = case.get("classname", "").split(".")[-1]
        test_id = f"{classname}::{case.get('name')}" if classname else case.get("name")
        properties = {p.get("name"): p.get("value") for p in case.iter("property")}
        status, reason, detail = "passed", "", ""
        for tag in ("failure", "error", "skipped"):
            element = case.find(tag)
            if element is not None:
                status = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                if tag == "skipped" and element.get("type") == "pytest.xfail":
                    status = "xfailed"
                detail = element.get("message") or element.text or ""
                reason = one_line(detail)
                break
        results[test_id] = Outcome(status, reason, properties.get("selection_strategy", ""), detail)
    return results


class Results(dict):
    """Trainer -> test id -> outcome; `ran`: the trainers a run was made for (its record written), a run whose pytest
    died before writing its JUnit file included."""

    ran: set


def merged_results(out: Path, commit: str | None = None) -> Results:
    """Trainer -> test id -> outcome over the runs in `out` made on `commit` (each run records its commit; runs of
    other commits are left out), in the order they ran. A run whose pytest died wrote no JUnit file: the tests the
    GRPOTrainer run of the same selection has are then missing (`lost_tests` counts them as lost)."""
    merged = Results({trainer: {} for trainer in TRAINERS})
    merged.ran = set()
    runs = []
    for record_path in out.glob("junit-*.json"):
        record = json.loads(record_path.read_text())
        if commit is not None and record.get("commit") != commit:
            continue
        runs.append((record_path.stat().st_mtime, record["trainer"], record_path.with_suffix(".xml")))
    for _, trainer, junit in sorted(runs):
        merged.ran.add(trainer)
        if trainer in merged and junit.is_file():
            merged[trainer].update(read_junit(junit))
    return merged


@dataclass(frozen=True)
class Refusal:
    """A test VEPOTrainer fails on purpose: excused only when its failure's one-line reason matches `expected`."""

    expected: str  # a regular expression, searched in the failure's reason
    why: str


# Tests that pass on GRPOTrainer where VEPOTrainer refuses on purpose, each with its expected message and the reason
# the refusal is right
REFUSED_ON_PURPOSE = {
    "TestGRPOTrainer::test_liger_kernel_with_peft_lm_head_raises": Refusal(
        r"--use_liger_kernel true needs the liger-kernel package",
        "`use_liger_kernel=True` without liger-kernel installed: VEPOTrainer says so in one line before any model "
        "loads (check_packages); GRPOTrainer reaches its own PEFT check first, which the test matches",
    ),
    "TestGRPOTrainer::test_init_minimal": Refusal(
        r"perturbs the model's images, but the model is",
        "a bare VEPOTrainer (no `args`) builds the paper's config, selection_strategy vepo, which a text-only model "
        "cannot run: refused in one line naming the strategy to use (docs: a bare VEPOTrainer call)",
    ),
}
MISSING = Outcome("missing", "no result: its pytest process died before the test reported, or it was not collected")


def excused(test: str, outcome: Outcome) -> bool:
    """A loss VEPOTrainer means: the test is listed and failed with its expected message."""
    refusal = REFUSED_ON_PURPOSE.get(test)
    return (
        refusal is not None
        and outcome.status in ("failed", "error")
        and re.search(refusal.expected, outcome.detail or outcome.reason) is not None
    )


def lost_tests(results: dict[str, dict[str, Outcome]]) -> list[tuple[str, str, Outcome]]:
    """(test, trainer, outcome) for each test that passes on GRPOTrainer and not on a VEPOTrainer run that was made
    (a test with no result in such a run is lost as `missing`)."""
    ran = getattr(results, "ran", None)
    lost = []
    for test in sorted(results["grpo"]):
        if results["grpo"][test].status != "passed":
            continue
        for trainer in ("full", "vepo"):
            if (trainer not in ran) if ran is not None else not results[trainer]:
                continue  # that trainer was not run
            outcome = results[trainer].get(test, MISSING)
            if outcome.status != "passed":
                lost.append((test, trainer, outcome))
    return lost


def cell(outcome: Outcome | None, show_strategy: bool = False) -> str:
    if outcome is None:
        return "not run"
    text = outcome.status
    if show_strategy and outcome.strategy == "vepo":
        text += " (vepo)"
    if outcome.reason and outcome.status != "passed":
        text += f": {outcome.reason}"
    return text.replace("|", "\\|")


def markdown_report(results: dict[str, dict[str, Outcome]], meta: dict) -> str:
    """The table (a row per test, a column per trainer), the counts and the tests VEPOTrainer loses."""
    tests = sorted(set().union(*(r.keys() for r in results.values())))
    lines = [
        "# TRL's GRPO tests on GRPOTrainer and VEPOTrainer",
        "",
        f"vepo_trl commit {meta.get('commit', '?')}; TRL source: {meta.get('source', '?')}; installed TRL "
        f"{meta.get('gaps', {}).get('trl_version', '?')}. "
        "`full`: VEPOTrainer with selection_strategy full; `vepo`: the paper's strategy where the test trains a "
        "vision-language model (marked `(vepo)`), full elsewhere.",
        "",
        "| test | grpo | full | vepo |",
        "| --- | --- | --- | --- |",
    ]
    for test in tests:
        row = [cell(results["grpo"].get(test)), cell(results["full"].get(test)),
               cell(results["vepo"].get(test), show_strategy=True)]  # fmt: skip
        lines.append(f"| `{test}` | " + " | ".join(row) + " |")

    def count(trainer, status="passed"):
        return sum(1 for o in results[trainer].values() if o.status == status)

    ran = {t: sum(1 for o in results[t].values() if o.status not in ("skipped",)) for t in TRAINERS}
    lines += [
        "",
        "## Counts",
        "",
        f"- tests in the report: {len(tests)}; run (not skipped): grpo {ran['grpo']}, full {ran['full']}, "
        f"vepo {ran['vepo']}",
        f"- pass on GRPOTrainer: {count('grpo')}",
        f"- pass on VEPOTrainer: full {count('full')}, vepo {count('vepo')} "
        f"(of which with the vepo strategy: "
        f"{sum(1 for o in results['vepo'].values() if o.status == 'passed' and o.strategy == 'vepo')})",
        f"- ran the paper's selection (the vepo column's vision-language tests): "
        f"{sum(1 for o in results['vepo'].values() if o.strategy == 'vepo' and o.status != 'skipped')} of "
        f"{sum(1 for o in results['vepo'].values() if o.status != 'skipped')} run in that column",
        f"- fail or error on GRPOTrainer itself: {count('grpo', 'failed') + count('grpo', 'error')}",
        f"- not run (left out of every run in this folder): grpo {len(tests) - len(results['grpo'])}, "
        f"full {len(tests) - len(results['full'])}, vepo {len(tests) - len(results['vepo'])}",
        "",
        "## Pass on GRPOTrainer, not on VEPOTrainer",
        "",
    ]
    lost = lost_tests(results)
    unexplained = [(test, trainer, outcome) for test, trainer, outcome in lost if not excused(test, outcome)]
    lines += [
        f"- `{test}` on {trainer}: {cell(outcome, show_strategy=True)}" for test, trainer, outcome in unexplained
    ]
    lines += ["- none"] if not unexplained else []
    refused = sorted({test for test, _, outcome in lost if excused(test, outcome)})
    lines += ["", "## Refused by VEPOTrainer on purpose (with the expected message)", ""]
    lines += [f"- `{test}`: {REFUSED_ON_PURPOSE[test].why}" for test in refused] or ["- none"]
    stand_ins = meta.get("stand_ins", {})
    missing = {repo_id: why for repo_id, why in stand_ins.items() if why}
    lines += ["", "## Model ids with no stand-in", ""]
    lines += [f"- `{repo_id}`: {why}" for repo_id, why in sorted(missing.items())] or ["- none"]
    gaps = meta.get("gaps", {})
    lines += ["", "## What the test file needs that the installed TRL lacks", ""]
    lines += [f"- imported from trl, absent (shimmed as a package check): `{name}`"
              for name in gaps.get("missing_imports", [])]  # fmt: skip
    lines += [f"- GRPOConfig field the file sets, absent: `{name}`" for name in gaps.get("unknown_config_fields", [])]
    if not (gaps.get("missing_imports") or gaps.get("unknown_config_fields")):
        lines.append("- nothing found")
    # A test failing on GRPOTrainer says this TRL differs from the file's, or that a stand-in is not the real thing
    # (a test that hard-codes the real tokenizer's token ids cannot pass on a stand-in tokenizer)
    failing = [test for test in tests if results["grpo"].get(test, Outcome("")).status in ("failed", "error")]
    lines += ["", "## Fails on GRPOTrainer itself (the installed TRL, or a stand-in)", ""]
    lines += [f"- `{test}`: {cell(results['grpo'][test])}" for test in failing] or ["- none"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--trl-source",
        default=os.environ.get("VEPO_TRL_SOURCE"),
        help="a TRL checkout, or a git directory (bare or not) read with `git show` (default: $VEPO_TRL_SOURCE)",
    )
    parser.add_argument("--trl-rev", help="the revision to read from a git directory (default: HEAD)")
    parser.add_argument(
        "--trainer",
        choices=[*TRAINERS, "all"],
        default="all",
        help="grpo: GRPOTrainer unchanged; full / vepo: VEPOTrainer (see above); all: the three",
    )
    parser.add_argument("-k", dest="expression", help="pytest's -k, passed through (a selection of the tests)")
    parser.add_argument(
        "--out",
        type=Path,
        help="folder for the stand-ins, JUnit files and report (default: a new temporary folder); reused and merged "
        "when given again",
    )
    parser.add_argument(
        "--timeout-per-test",
        type=float,
        default=600.0,
        help="seconds before a test fails with TestTimeout (0: none; default 600)",
    )
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    source = open_source(args.trl_source, args.trl_rev)
    out = (args.out or Path(tempfile.mkdtemp(prefix="trl-grpo-tests-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)

    def log(message: str) -> None:
        print(message, flush=True)

    log(f"TRL source: {source.describe()}\nscratch: {out}")
    tree = out / "trl"
    test_file = copy_suite(source, tree)
    text = test_file.read_text()
    model_ids, dataset_ids = model_ids_in(text), dataset_ids_in(text)
    scripts = generators(tree)
    vlm_ids = sorted(repo_id for repo_id in model_ids if repo_id in scripts and scripts[repo_id].vision)

    # The stand-ins are built here, so the Hugging Face libraries must see the offline cache from their first import
    os.environ.update(offline_env(out))
    log(f"stand-in models ({len(model_ids)} ids in {TEST_FILE}):")
    stand_ins = StandInHub(tree, out / "hf_home" / "hub").build(model_ids, scripts, log)
    log(f"zen data sets ({', '.join(dataset_ids)}):")
    data = build_datasets(tree, out / "datasets", dataset_ids, log)
    gaps = installed_trl_gaps(sorted((tree / SUITE_PACKAGE).glob("*.py")), test_file)
    commit = this_commit()
    meta = {"source": source.describe(), "commit": commit, "stand_ins": stand_ins, "datasets": data, "gaps": gaps,
            "vlm_ids": vlm_ids}  # fmt: skip
    (out / "stand_ins.json").write_text(json.dumps(meta, indent=2))

    trainers = TRAINERS if args.trainer == "all" else (args.trainer,)
    for trainer in trainers:
        run_pytest(trainer, test_file, out, args.expression, args.timeout_per_test, vlm_ids, log)

    results = merged_results(out, commit)
    report = markdown_report(results, meta)
    (out / "report.md").write_text(report)
    print(report)
    log(f"report: {out / 'report.md'}")
    # Exit 1 when VEPOTrainer fails (or has no result for) a test GRPOTrainer passes, for no reason stated here
    return int(any(not excused(test, outcome) for test, _, outcome in lost_tests(results)))


if __name__ == "__main__":
    sys.exit(main())
