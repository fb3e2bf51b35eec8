"""VEPO at the paper's real widths on the CPU: a Qwen2.5-VL-7B-shaped (or 3B-shaped) model with the real config
(hidden size, heads, MLP, the full 152,064 / 151,936-token vocabulary, the vision tower's width), only a couple of
layers, random weights, the recipe's image bounds and a 448 px image, trained one LoRA step by `VEPOTrainer` through
TRL's whole path (generation, rewards, the loss forward, VEPO's perturbed forward and signals, backward, optimiser).

The signal pass of that very step is checked against a full-logits reference at the real vocabulary (float64, every
`(N, V)` tensor held: `scoring.reference_token_signals`), and each phase's time and peak resident memory are printed.

    python benchmarks/real_width_check.py --model 7b      # about 2-4 minutes on 2 cores, ~10 GB of memory
    python benchmarks/real_width_check.py --model 3b
    python benchmarks/real_width_check.py --device cuda   # on a GPU: bf16 mixed precision, against the same float64

On CUDA the step runs in bf16 (as the recipes do), so the errors printed are those of the bf16 signal pass; the phases
then also report the peak GPU memory. The last line is one JSON object with the errors, times and peaks.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
import warnings
from contextlib import contextmanager


os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

import psutil  # noqa: E402
import torch  # noqa: E402
from PIL import Image, ImageDraw  # noqa: E402


# The released config.json values of the two paper models (text and vision), layers cut to `--layers` / `--vision_depth`
REAL_CONFIGS = {
    "7b": {
        "text": dict(hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4,
                     vocab_size=152064, tie_word_embeddings=False),
        "vision_out": 3584,
    },
    "3b": {
        "text": dict(hidden_size=2048, intermediate_size=11008, num_attention_heads=16, num_key_value_heads=2,
                     vocab_size=151936, tie_word_embeddings=True),
        "vision_out": 2048,
    },
}  # fmt: skip
VISION = dict(hidden_size=1280, intermediate_size=3420, num_heads=16, patch_size=14, spatial_merge_size=2,
              temporal_patch_size=2, window_size=112)  # fmt: skip
RECIPE_PIXELS = dict(min_pixels=262144, max_pixels=1000000)  # recipes/Qwen2.5-VL-*/vepo/config_paper.yaml


class PhaseMeter:
    """Wall time and peak resident memory (sampled every 20 ms) per named phase."""

    def __init__(self, device: torch.device | None = None):
        self.cuda = device is not None and device.type == "cuda"
        self.process = psutil.Process()
        self.phases: dict[str, dict[str, float]] = {}
        self._peak = 0
        self._stop = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self):
        while not self._stop.is_set():
            self._peak = max(self._peak, self.process.memory_info().rss)
            time.sleep(0.02)

    @contextmanager
    def phase(self, name: str):
        self._peak = self.process.memory_info().rss
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.cuda:
                torch.cuda.synchronize()
            entry = self.phases.setdefault(name, {"seconds": 0.0, "peak_gb": 0.0, "calls": 0})
            if self.cuda:
                peak = torch.cuda.max_memory_allocated() / 1e9
                entry["peak_gpu_gb"] = max(entry.get("peak_gpu_gb", 0.0), peak)
            entry["seconds"] += time.perf_counter() - start
            entry["peak_gb"] = max(entry["peak_gb"], max(self._peak, self.process.memory_info().rss) / 1e9)
            entry["calls"] += 1

    def wrap(self, owner, attribute: str, name: str):
        original = getattr(owner, attribute)

        def timed(*args, **kwargs):
            with self.phase(name):
                return original(*args, **kwargs)

        setattr(owner, attribute, timed)
        return original


def build(model_size: str, layers: int, vision_depth: int):
    from transformers import (
        GenerationConfig,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
    )

    from vepo_trl.builtin.tiny_models import QWEN2_5_VL_CHAT_TEMPLATE, QWEN_SPECIAL_TOKENS, build_tokenizer

    real = REAL_CONFIGS[model_size]
    tokenizer = build_tokenizer(600)  # token ids < 600 index the real-size embedding and head
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in QWEN_SPECIAL_TOKENS}
    config = Qwen2_5_VLConfig(
        text_config={
            **real["text"],
            "num_hidden_layers": layers,
            "max_position_embeddings": 128000,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
        },
        vision_config={
            **VISION,
            "depth": vision_depth,
            "out_hidden_size": real["vision_out"],
            "fullatt_block_indexes": [vision_depth - 1],
        },  # fmt: skip
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=real["text"]["tie_word_embeddings"],
    )
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(config)
    model.generation_config = GenerationConfig(
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|im_end|>"]],
        pad_token_id=ids["<|endoftext|>"],
        do_sample=True,
        temperature=1.0,
    )
    processor = Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(**RECIPE_PIXELS),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(),
        chat_template=QWEN2_5_VL_CHAT_TEMPLATE,
    )
    return model, processor, ids


def dataset(image_size: int, rows: int = 2):
    from datasets import Dataset

    images = []
    for i in range(rows):
        image = Image.new("RGB", (image_size, image_size), (240, 240, 240))
        ImageDraw.Draw(image).ellipse((60 + 20 * i, 80, 300, 320), fill=(200, 40, 40))
        images.append(image)
    prompts = [
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many circles?"}]}]
    ] * rows
    return Dataset.from_dict({"prompt": prompts, "image": images})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(REAL_CONFIGS), default="7b")
    parser.add_argument("--layers", type=int, default=2, help="Language-model decoder layers (the real: 28 / 36).")
    parser.add_argument("--vision_depth", type=int, default=2, help="Vision blocks (the real: 32).")
    parser.add_argument("--image_size", type=int, default=448)
    parser.add_argument("--completion_length", type=int, default=32)
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="cpu",
                        help="cpu: fp32 (the default); cuda: bf16 mixed precision; auto: cuda when there is one")  # fmt: skip
    args = parser.parse_args()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("real_width_check.py: --device cuda, but torch sees no CUDA device")
    device = torch.device(args.device)
    torch.set_num_threads(os.cpu_count() or 1)

    from peft import LoraConfig

    import vepo_trl.perturbed_pass as perturbed_pass_module
    from vepo_trl import VEPOConfig, VEPOTrainer
    from vepo_trl.scoring import reference_token_signals

    meter = PhaseMeter(device)
    with meter.phase("build model"):
        model, processor, ids = build(args.model, args.layers, args.vision_depth)
    vocab = model.config.get_text_config().vocab_size
    recorded = []
    original_signals = perturbed_pass_module.token_signals

    def recording_signals(clean, perturbed, weight, bias=None, **kwargs):
        with meter.phase("VEPO signals (tiled)"):
            out = original_signals(clean, perturbed, weight, bias, **kwargs)
        recorded.append((clean.detach().clone(), perturbed.detach().clone(), weight.detach(), kwargs, out))
        return out

    perturbed_pass_module.token_signals = recording_signals
    with tempfile.TemporaryDirectory() as tmp:
        config = VEPOConfig(
            output_dir=os.path.join(tmp, "out"),
            per_device_train_batch_size=2,
            num_generations=2,
            max_completion_length=args.completion_length,
            max_steps=1,
            learning_rate=1e-4,
            report_to="none",
            save_strategy="no",
            use_cpu=device.type == "cpu",
            bf16=device.type == "cuda",
            disable_tqdm=True,
            score_zero_advantage_rows=True,  # score both completions even if the rewards tie
            # Only the tokenizer's 600 ids decode: the rest of the real vocabulary stays in the head, never sampled
            generation_kwargs={"suppress_tokens": list(range(600, vocab))},
        )
        trainer = VEPOTrainer(
            model=model,
            reward_funcs=lambda completions, **_: [float(len(c[0]["content"]) % 3) for c in completions],
            args=config,
            train_dataset=dataset(args.image_size),
            processing_class=processor,
            peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
        )
        meter.wrap(trainer, "_generate", "rollout (generation)")
        meter.wrap(trainer.perturbed_pass, "perturbed_hidden", "perturbed forward")
        meter.wrap(trainer, "_forward", "loss forward")
        meter.wrap(trainer, "training_step", "training step (all)")
        trainer.train()
    perturbed_pass_module.token_signals = original_signals

    errors = {"entropy": 0.0, "jsd": 0.0, "perturbed_entropy": 0.0}
    tokens = 0
    with meter.phase("full-logits reference (float64)"):
        for clean, perturbed, weight, kwargs, out in recorded:
            if clean.numel() == 0:
                continue
            tokens += clean.shape[0]
            temperature = kwargs.get("temperature", 1.0)
            reference = reference_token_signals(
                clean.double() @ weight.double().T, perturbed.double() @ weight.double().T, temperature=temperature
            )
            for name in errors:
                ours = getattr(out, name)
                if ours is not None:
                    errors[name] = max(errors[name], float((ours - getattr(reference, name)).abs().max()))
    text = model.config.get_text_config()
    summary = {
        "model": f"Qwen2.5-VL-{args.model.upper()}-shaped",
        "hidden_size": text.hidden_size,
        "vocab_size": vocab,
        "layers": args.layers,
        "vision_depth": args.vision_depth,
        "image_tokens": int(trainer._buffered_inputs[0]["image_grid_thw"].prod(-1).sum() // 4)
        if trainer._buffered_inputs
        else None,
        "tokens_checked": tokens,
        "max_abs_error": errors,
        "phases": {name: {k: round(v, 3) for k, v in entry.items()} for name, entry in meter.phases.items()},
        "threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "precision": "bf16" if device.type == "cuda" else "fp32",
    }
    print(f"\n{summary['model']}: width {text.hidden_size}, vocabulary {vocab}, {args.layers} layers, "
          f"{args.vision_depth} vision blocks, {args.image_size} px image ({summary['image_tokens']} image tokens in a micro-batch of 2 prompts)")  # fmt: skip
    print(f"signals of the training step against the full-logits reference over {tokens} tokens:")
    for name, value in errors.items():
        print(f"  max |error| {name:<18} {value:.2e}")
    gpu = device.type == "cuda"
    print(f"{'phase':<36} {'seconds':>8} {'calls':>6} {'peak RSS GB':>12}" + (f" {'peak GPU GB':>12}" if gpu else ""))
    for name, entry in meter.phases.items():
        print(f"{name:<36} {entry['seconds']:>8.2f} {entry['calls']:>6} {entry['peak_gb']:>12.2f}"
              + (f" {entry.get('peak_gpu_gb', 0.0):>12.2f}" if gpu else ""))  # fmt: skip
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
