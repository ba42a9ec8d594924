"""The training run's settings and the recipes the trainer knows: ``TrainConfig`` (the C
trainer's lowp_trainer_cfg defaults and range rules) and ``RECIPES``."""

from __future__ import annotations

import dataclasses
import math

import lowp.torch as lt

__all__ = ["RECIPES", "LOWP_RECIPES", "TrainConfig"]

#: The recipes lowp.torch.apply_recipe knows.
LOWP_RECIPES = tuple(lt.RECIPES)
#: Every --recipe: lowp's, and fp32 (plain float32 matmuls) and torchao_mxfp8 (torchao's own).
RECIPES = LOWP_RECIPES + ("fp32", "torchao_mxfp8")


@dataclasses.dataclass
class TrainConfig:
    """The run's settings (lowp_trainer_cfg's defaults)."""

    steps: int = 200
    batch: int = 8
    seq_len: int = 0  # 0: the model's
    accum: int = 1
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup: int = 20
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    clip: float = 1.0
    eval_every: int = 50
    eval_batches: int = 8
    seed: int = 1234
    eval_seed: int = 0
    threads: int = 0
    activation_checkpoint: bool = False

    def check(self) -> None:
        for f in ("steps", "batch", "accum", "eval_batches"):
            if getattr(self, f) < 1:
                raise ValueError(f"--{f.replace('_', '-')} must be at least 1")
        for f in ("seq_len", "warmup", "eval_every", "threads"):
            if getattr(self, f) < 0:
                raise ValueError(f"--{f.replace('_', '-')} must be >= 0")
        for f in ("lr", "min_lr", "weight_decay", "clip"):
            v = getattr(self, f)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"--{f.replace('_', '-')} ({v}) must be finite and >= 0")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ValueError("--beta1 and --beta2 must be in [0, 1)")
        if not (self.eps > 0 and math.isfinite(self.eps)):
            raise ValueError(f"eps ({self.eps}) must be finite and > 0")
        for f in ("seed", "eval_seed"):
            if not 0 <= getattr(self, f) < 2 ** 64:
                raise ValueError(f"--{f.replace('_', '-')} ({getattr(self, f)}) must be an "
                                 "unsigned 64-bit integer")

