"""A fingerprint of every family's tiny model: weights, model config, tokenizer vocabulary and chat template, hashed
per family. Run it on two checkouts (before and after a refactor of the families or the tiny builder) and compare the
lines: equal lines mean bit-for-bit equal builds.

    python benchmarks/tiny_builds.py            # about a minute on 2 cores
    python benchmarks/tiny_builds.py qwen2.5-vl # one family
"""

from __future__ import annotations

import hashlib
import json
import sys

import torch

from vepo_trl.builtin.tiny_models import build_tiny
from vepo_trl.families import FAMILIES


def fingerprint(family: str) -> str:
    model, processor = build_tiny(family)
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().to(torch.float32).contiguous().numpy().tobytes())
    digest.update(json.dumps(model.config.to_dict(), sort_keys=True, default=str).encode())
    tokenizer = getattr(processor, "tokenizer", processor)
    digest.update(json.dumps(tokenizer.get_vocab(), sort_keys=True).encode())
    digest.update(str(getattr(processor, "chat_template", "")).encode())
    return digest.hexdigest()[:16]


def main() -> None:
    for family in sys.argv[1:] or [family.name for family in FAMILIES]:
        print(f"{family:<18} {fingerprint(family)}")


if __name__ == "__main__":
    main()
