"""VEPO: Vision-Entropy token selection for Policy Optimization, for Hugging Face TRL."""

__version__ = "0.1.0"

from .utils import lazy_exports


__all__ = ["VEPOConfig", "VEPOTrainer", "__version__"]


# Lazy: `vepo_trl.rewards` or `vepo_trl.scoring` alone should not pay for importing TRL's trainers
__getattr__ = lazy_exports(__name__, {"VEPOConfig": "config", "VEPOTrainer": "trainer"})
