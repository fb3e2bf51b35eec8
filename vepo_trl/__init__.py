"""VEPO: Vision-Entropy token selection for Policy Optimization, for Hugging Face TRL."""

__version__ = "0.1.0"
