"""Small helpers shared by the scoring and perturbation modules."""

import hashlib


def stable_seed(*parts) -> int:
    """A 63-bit seed from `parts`' text: the same in every process and run (unlike `hash`, which is salted)."""
    text = ":".join(str(part) for part in parts)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1
