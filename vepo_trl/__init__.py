"""VEPO: Vision-Entropy token selection for Policy Optimization, for Hugging Face TRL."""

__version__ = "0.1.0"

from .config import VEPOConfig  # noqa: E402
from .trainer import VEPOTrainer  # noqa: E402


__all__ = ["VEPOConfig", "VEPOTrainer", "__version__"]
