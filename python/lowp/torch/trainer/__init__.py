"""lowp.torch.trainer: the PyTorch training application (the twin of `lowp train`), kept apart
from the library: it uses only lowp's and lowp.torch's public API.

    python -m lowp.torch.trainer --recipe all_mxfp8 --config small --data input.txt
    python -m lowp.torch.trainer.bench --config medium --threads 2

This ``__init__`` only re-exports. Its modules: ``model`` (the MoE transformer), ``data`` (the
character corpus and its batches), ``config`` (the run's settings, the recipe names), ``loop``
(the training loop), ``checkpoint`` (the checkpoint file and its checks), ``report`` (the
compare report), ``bench`` (throughput), ``cli`` and ``__main__`` (the command).
"""

from .cli import main
from .data import CharData
from .config import TrainConfig
from .loop import Trainer
from .model import MoEConfig, MoETransformer

__all__ = ["CharData", "MoEConfig", "MoETransformer", "TrainConfig", "Trainer", "main"]
