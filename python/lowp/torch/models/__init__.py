"""Models for training with lowp's recipes in PyTorch."""

from .moe import MoEConfig, MoETransformer

__all__ = ["MoEConfig", "MoETransformer"]
