"""Each family's reference checkpoint as its processor and config see it (no weights), for
tests/test_perturb_real_processors.py: the `REFERENCE_PROCESSOR` each family module declares beside its adapter
(`vepo_trl.families.base.RealProcessor`: the image-processor class and the kwargs that rebuild its
`preprocessor_config.json`, what the family's processor adds on every call, the config class and the kwargs that give
it the checkpoint's vision geometry), each citing its source in a comment above it in that module."""

from vepo_trl.families import FAMILY_MODULES
from vepo_trl.families.base import RealProcessor


__all__ = ["REAL_PROCESSORS", "RealProcessor"]

REAL_PROCESSORS: dict[str, RealProcessor] = {
    name: module.REFERENCE_PROCESSOR
    for name, module in FAMILY_MODULES.items()
    if hasattr(module, "REFERENCE_PROCESSOR")
}
