"""The option groups `inspect` and `analyze` share (model, VEPO's settings, responses): argparse only."""

from __future__ import annotations

import argparse


def add_model_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument(
        "--model", help="Model folder or Hub id of a supported family (README), or tiny-qwen2.5-vl / tiny-<family>."
    )
    group.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda when available).")
    group.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])


def add_settings_options(parser: argparse.ArgumentParser, *, with_k: bool = True) -> None:
    group = parser.add_argument_group(
        "selection settings (default: the paper's, or the training recipe given with --config)"
    )
    group.add_argument("--config", help="A training recipe (YAML): its selection and perturbation keys are used.")
    group.add_argument("--strategy", help="Selection strategy (vepo-trl strategies lists them). Default vepo.")
    if with_k:
        group.add_argument("--k", type=float, help="k: fraction of each response kept. Default 0.2.")
    group.add_argument("--alpha", type=float, help="alpha: JSD against |dH| in the joint signal. Default 0.7.")
    group.add_argument("--perturbation", help="diffusion, gaussian, mean_image, black_image, patch_blackout.")
    group.add_argument("--noise_step", type=int, help="Diffusion step tau in [0, 999]. Default 500.")
    group.add_argument("--noise_sigma", type=float, help="Std of the gaussian perturbation. Default 2.0.")
    group.add_argument("--patch_probability", type=float, help="patch_blackout's drop probability. Default 0.5.")
    group.add_argument("--perturbation_seed", type=int, help="Seed of the perturbation noise. Default 42.")
    group.add_argument("--step", type=int, default=0, help="Training step the noise seed uses. Default 0.")
    group.add_argument("--temperature", type=float, help="Sampling and scoring temperature. Default 1.0.")


def add_generation_options(parser: argparse.ArgumentParser, num_generations: int) -> None:
    group = parser.add_argument_group("responses")
    group.add_argument("--num_generations", type=int, default=num_generations, help="Completions sampled per prompt.")
    group.add_argument("--max_new_tokens", type=int, default=256)
    group.add_argument("--greedy", action="store_true", help="Decode greedily (one completion) instead of sampling.")
    group.add_argument("--sample_seed", type=int, default=0, help="Seed of the sampling.")
    group.add_argument("--batch_size", type=int, default=8, help="Completions per forward pass.")
    group.add_argument("--min_pixels", type=int, default=None, help="Resize bound of images (default: the paper's).")
    group.add_argument("--max_pixels", type=int, default=None, help="Resize bound of images (default: the paper's).")
