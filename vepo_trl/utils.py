"""Small helpers shared across the package (light: no torch or TRL import)."""

import hashlib
import os
from pathlib import Path


def cache_root() -> Path:
    """Where vepo_trl keeps what it builds once (tiny models, the lab's warm start, the field rules):
    `$VEPO_TRL_CACHE`, else `~/.cache/vepo_trl`."""
    return Path(os.environ.get("VEPO_TRL_CACHE") or Path.home() / ".cache" / "vepo_trl")


def stable_seed(*parts) -> int:
    """A 63-bit seed from `parts`' text: the same in every process and run (unlike `hash`, which is salted)."""
    text = ":".join(str(part) for part in parts)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1
