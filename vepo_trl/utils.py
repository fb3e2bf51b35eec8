"""Small helpers shared across the package (light: no torch or TRL import)."""

import contextlib
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path


def cache_root() -> Path:
    """Where vepo_trl keeps what it builds once (tiny models, the lab's warm start, the field rules):
    `$VEPO_TRL_CACHE`, else `~/.cache/vepo_trl`."""
    # `~` expanded as --output_dir expands it (a quoted '~/vc' would otherwise make a folder named `~`)
    return Path(os.environ.get("VEPO_TRL_CACHE") or Path.home() / ".cache" / "vepo_trl").expanduser()


def stable_seed(*parts) -> int:
    """A 63-bit seed from `parts`' text: the same in every process and run (unlike `hash`, which is salted)."""
    text = ":".join(str(part) for part in parts)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def media_token_ids(config) -> list[int]:
    """The image and video placeholder ids a model's config declares (`image_token_id`, `video_token_id`; LLaVA's
    `image_token_index` is the same attribute by transformers' alias). Generation suppresses them (a sampled
    placeholder would match no features: trained models never emit one, tiny ones can); a completion holding one
    carries an image."""
    ids = [getattr(config, name, None) for name in ("image_token_id", "video_token_id")]
    return [i for i in ids if i is not None]


@contextlib.contextmanager
def instance_override(obj, name: str, replacement) -> Iterator[None]:
    """While the block runs, `obj.<name>` is `replacement` (an instance attribute over the class's method); after it,
    the class's method again, or the instance attribute that was there before."""
    original = getattr(obj, name)
    setattr(obj, name, replacement)
    try:
        yield
    finally:
        delattr(obj, name)  # the class's method again
        if getattr(obj, name) != original:  # an instance attribute was there before us
            setattr(obj, name, original)


def lazy_exports(package: str, exports: dict[str, str]):
    """A package's `__getattr__` (PEP 562) loading each name of `exports` (name -> submodule) on first use, so
    importing the package, or one light module of it, pays for none of the heavy ones."""
    import importlib

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{exports[name]}"), name)

    return __getattr__


def count(number, noun: str) -> str:
    """`1 step`, `2 steps`: a count with its noun in the right number (what a user reads in a summary line)."""
    return f"{number:,} {noun}" if number == 1 else f"{number:,} {noun}s"
