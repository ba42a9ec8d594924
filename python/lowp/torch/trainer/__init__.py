"""lowp.torch.trainer: the PyTorch training application (the twin of `lowp train`), kept apart
from the library: it uses only lowp's and lowp.torch's public API.

    python -m lowp.torch.trainer --recipe all_mxfp8 --config small --data input.txt
    python -m lowp.torch.trainer.bench --config medium --threads 2

This ``__init__`` only re-exports. Its modules: ``model`` (the MoE transformer), ``data`` (the
character corpus and its batches), ``loop`` (the training loop), ``checkpoint`` (the
checkpoint file), ``report`` (the compare report), ``bench`` (throughput) and ``__main__``
(the command).
"""

from .data import CharData
from .cli import main
from .config import TrainConfig
from .loop import Trainer
from .model import MoEConfig, MoETransformer

__all__ = ["CharData", "MoEConfig", "MoETransformer", "TrainConfig", "Trainer", "main"]
