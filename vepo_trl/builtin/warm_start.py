"""The lab's warm start: a small Qwen2.5-VL supervised-fine-tuned (TRL's `SFTTrainer`) on the lab tasks.

A randomly initialised model learns nothing useful from RL in minutes; a model that already answers in the paper's
format, and gets some of the visual questions right, can. `warm_start_path()` builds one (about 1.5 minutes on two CPU
cores, seeded) and caches it under `$VEPO_TRL_CACHE` (default `~/.cache/vepo_trl`) in a folder named after a hash of
its `WarmStartConfig`, so every command that needs it builds it once.

SFT stops early on purpose (`sft_steps`): the lab needs a model that is right on some held-out questions and wrong
on others, so RL has room to improve it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessor, Qwen2VLVideoProcessor

from ..families import banned_token_ids
from ..utils import cache_root, count
from .lab_tasks import DEFAULT_TASK, get_task, lab_corpus, make_rl_dataset, make_sft_dataset
from .tiny_models import QWEN2_5_VL_CHAT_TEMPLATE, TinyModelConfig, build_model, build_tokenizer


__all__ = ["WarmStartConfig", "build_lab_processor", "build_warm_start", "evaluate_accuracy", "warm_start_path"]

MARKER = "lab_warm_start.json"


@dataclass(frozen=True)
class WarmStartConfig:
    """Everything that decides the warm start; its hash names the cache folder."""

    # The lab task (`vepo_trl.builtin.lab_tasks.TASKS`): its questions, SFT label noise and tokenizer corpus
    task: str = DEFAULT_TASK
    # Model: about 0.9M parameters
    vocab_size: int = 512
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 3
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vision_hidden_size: int = 64
    vision_depth: int = 2
    vision_num_heads: int = 2
    # At the text model's 0.02 the random vision tower's outputs barely differ between images (about 1/4 of their
    # spread comes from the image), and SFT learns to ignore them; a wider init keeps the images apart from step 0
    vision_initializer_range: float = 0.2
    # Images: 84 x 84 px, 6 x 6 patches of 14 px merged 2 x 2 into 9 visual tokens
    image_size: int = 84
    # SFT
    sft_rows: int = 4096
    sft_steps: int = 900
    sft_batch_size: int = 16
    sft_learning_rate: float = 2e-3
    eval_rows: int = 120
    seed: int = 0

    @classmethod
    def for_task(cls, task: str, **overrides) -> WarmStartConfig:
        """The warm start of lab task `task` (its vocabulary size), with `overrides`."""
        return cls(**{"task": task, **get_task(task).warm_start, **overrides})

    def key(self) -> str:
        text = json.dumps(dataclasses.asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:10]


def build_lab_processor(config: WarmStartConfig | None = None) -> Qwen2_5_VLProcessor:
    config = config or WarmStartConfig()
    pixels = config.image_size * config.image_size
    return Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(min_pixels=pixels, max_pixels=pixels),
        # Byte-level BPE learned on the lab's prompts and responses, Qwen's specials on top
        tokenizer=build_tokenizer(config.vocab_size, lab_corpus(get_task(config.task).corpus_kinds)),
        video_processor=Qwen2VLVideoProcessor(),
        chat_template=QWEN2_5_VL_CHAT_TEMPLATE,
    )


@torch.no_grad()
def evaluate_accuracy(model, processor, dataset, *, batch_size: int = 40, max_new_tokens: int = 32) -> dict:
    """Held-out greedy accuracy (last `\\boxed{}` equal to the answer as text, `exact_answer_match`) overall and per
    task kind; `correct` lists each row's outcome, for tests paired across models on the same rows."""
    from trl.data_utils import prepare_multimodal_messages

    from ..rewards import exact_answer_match, extract_boxed_answer

    was_training = model.training
    model.eval()
    tokenizer = processor.tokenizer
    tokenizer.padding_side = "left"
    correct: dict[str, list[bool]] = {}
    outcomes: list[bool] = []  # row order
    completions = []
    for start in range(0, len(dataset), batch_size):
        rows = dataset[start : start + batch_size]
        texts, images = [], []
        for prompt, imgs in zip(rows["prompt"], rows["images"]):
            messages = prepare_multimodal_messages([dict(m) for m in prompt], images=list(imgs))
            texts.append(processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
            images.append(list(imgs))
        inputs = processor(text=texts, images=images, return_tensors="pt", padding=True)
        output = model.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            suppress_tokens=banned_token_ids(model.config, processor),
        )
        decoded = tokenizer.batch_decode(output[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        for text, answer, kind in zip(decoded, rows["answer"], rows["kind"]):
            predicted = extract_boxed_answer(text)
            outcomes.append(exact_answer_match(predicted, answer))
            correct.setdefault(kind, []).append(outcomes[-1])
            completions.append(text)
    if was_training:
        model.train()
    return {
        "accuracy": sum(outcomes) / max(len(outcomes), 1),
        "per_kind": {kind: sum(v) / len(v) for kind, v in sorted(correct.items())},
        "n": len(outcomes),
        "correct": outcomes,
        "examples": completions[:6],
    }


def heldout_dataset(config: WarmStartConfig, num_rows: int | None = None):
    """Held-out rows (a seed no training split uses)."""
    task = get_task(config.task)
    return make_rl_dataset(
        num_rows or config.eval_rows, seed=10_000 + config.seed, image_size=config.image_size, kinds=task.kinds
    )


def build_warm_start(output_dir: str | os.PathLike, config: WarmStartConfig | None = None, log=print) -> dict:
    """Build the model, SFT it on the lab tasks, save model + processor to `output_dir`, return its report."""
    from trl import SFTConfig, SFTTrainer

    config = config or WarmStartConfig()
    start = time.perf_counter()
    processor = build_lab_processor(config)
    tiny = TinyModelConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        vision_hidden_size=config.vision_hidden_size,
        vision_depth=config.vision_depth,
        vision_num_heads=config.vision_num_heads,
        initializer_range=0.02,  # a model to train, not a random one with peaked outputs
        min_pixels=config.image_size**2,
        max_pixels=config.image_size**2,
        seed=config.seed,
    )
    model = build_model(processor, tiny)
    # The vision tower from a build with a wider init (same seed), the language model from the 0.02 one
    wide = build_model(processor, dataclasses.replace(tiny, initializer_range=config.vision_initializer_range))
    model.model.visual.load_state_dict(wide.model.visual.state_dict())
    del wide
    task = get_task(config.task)
    train = make_sft_dataset(
        config.sft_rows, seed=config.seed, image_size=config.image_size, kinds=task.kinds, confusions=task.confusions
    )
    output_dir = Path(output_dir)
    args = SFTConfig(
        output_dir=str(output_dir / "sft"),
        max_steps=config.sft_steps,
        per_device_train_batch_size=config.sft_batch_size,
        learning_rate=config.sft_learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, config.sft_steps // 20),
        weight_decay=0.0,
        logging_steps=max(1, config.sft_steps // 10),
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=config.seed,
        max_length=None,
        disable_tqdm=True,
        dataloader_num_workers=0,
        activation_checkpointing=False,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=train, processing_class=processor)
    # disable_tqdm makes transformers print every log as a raw dict; the lab prints its own line per run
    from transformers import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    model = trainer.model
    model.generation_config.do_sample = True
    model.generation_config.temperature = 1.0
    model.save_pretrained(output_dir)
    processor.save_pretrained(output_dir)
    shutil.rmtree(output_dir / "sft", ignore_errors=True)
    sft_seconds = time.perf_counter() - start
    # 32 tokens as the first lab measured it, more for a task whose responses are longer
    tokens = max(32, task.max_completion_length)
    result = evaluate_accuracy(model, processor, heldout_dataset(config), max_new_tokens=tokens)
    report = {
        "config": dataclasses.asdict(config),
        "key": config.key(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "sft_loss_first_last": [losses[0], losses[-1]] if losses else None,
        "sft_seconds": round(sft_seconds, 1),
        "build_seconds": round(time.perf_counter() - start, 1),
        "heldout_accuracy": result["accuracy"],
        "heldout_per_kind": result["per_kind"],
        "heldout_rows": result["n"],
        "heldout_examples": result["examples"],
    }
    log(
        f"warm start: {report['parameters']:,} parameters, SFT {count(config.sft_steps, 'step')} in {sft_seconds:.0f} s, "
        f"held-out greedy accuracy {result['accuracy']:.1%} {result['per_kind']}"
    )
    return report


def warm_start_path(
    config: WarmStartConfig | None = None, cache_dir: str | os.PathLike | None = None, log=print
) -> Path:
    """The cached warm start for `config`, built on first use (process-safe: build in a private folder, rename)."""
    from accelerate import PartialState

    config = config or WarmStartConfig()
    root = Path(cache_dir) if cache_dir else cache_root()
    path = root / f"lab-warm-start-{config.key()}"
    with PartialState().main_process_first():
        if (path / MARKER).exists():
            return path
        log(f"Building the lab's warm start (SFT of a small Qwen2.5-VL, about 1.5 minutes on 2 cores) into {path} ...")
        staging = root / f".{path.name}.{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        torch_threads = torch.get_num_threads()
        report = build_warm_start(staging, config, log=log)
        torch.set_num_threads(torch_threads)
        (staging / MARKER).write_text(json.dumps(report, indent=1))
        try:
            os.rename(staging, path)
        except OSError:
            if not (path / MARKER).exists():
                raise
            shutil.rmtree(staging, ignore_errors=True)
    return path


def warm_start_report(path: str | os.PathLike) -> dict:
    return json.loads((Path(path) / MARKER).read_text())
