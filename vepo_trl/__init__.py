"""VEPO: Vision-Entropy token selection for Policy Optimization, for Hugging Face TRL."""

__version__ = "0.1.0"

__all__ = ["VEPOConfig", "VEPOTrainer", "__version__"]


def __getattr__(name):
    # Lazy: `vepo_trl.rewards` or `vepo_trl.scoring` alone should not pay for importing TRL's trainers
    if name == "VEPOConfig":
        from .config import VEPOConfig

        return VEPOConfig
    if name == "VEPOTrainer":
        from .trainer import VEPOTrainer

        return VEPOTrainer
    raise AttributeError(f"module 'vepo_trl' has no attribute {name!r}")
