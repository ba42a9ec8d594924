"""Character-level text data for ``python -m lowp.torch.trainer``, the same as the C trainer's
(src/model/data.c): a byte vocabulary (the sorted distinct bytes of the text), a 90/10
train/validation split, and batches that are pure functions of (split, seed, index), their
window starts drawn from Philox words, so that the C and the PyTorch trainers see the very
same batches for the same seed, and a resumed run draws the batches the uninterrupted run
would have drawn.
"""

from __future__ import annotations

import ast
import os
import re

import numpy as np
import torch

from .model import philox_words

__all__ = ["CharData", "default_corpus", "VAL_KEY"]

VAL_KEY = 0x76616C6964617465  # LOWP_DATA_VAL_KEY


def _fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def default_corpus() -> bytes:
    """The C library's built-in corpus: ``lowp.default_corpus()`` when the extension is
    built, else from the source tree this package sits in (the C string literal of
    default_corpus.c)."""
    try:
        import lowp  # noqa: PLC0415
    except ImportError:  # no extension in this checkout
        pass
    else:
        return lowp.default_corpus()
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 4))
    for rel in ("data/default_corpus.txt", "src/data/default_corpus.txt",
                "src/data/default_corpus.c", "src/model/default_corpus.c"):
        path = os.path.join(root, rel)
        if not os.path.exists(path):
            continue
        with open(path, "rb") as f:
            raw = f.read()
        if not rel.endswith(".c"):
            return raw
        src = raw.decode("ascii")
        body = src[src.index("lowp_default_corpus[] ="):]
        body = body[:body.index("lowp_default_corpus_len")]  # the text holds semicolons
        parts = re.findall(r'"((?:[^"\\]|\\.)*)"', body)
        return "".join(ast.literal_eval('"' + p + '"') for p in parts).encode("ascii")
    raise FileNotFoundError("the built-in corpus: neither lowp.default_corpus (no extension) nor "
                            "src/*/default_corpus.c was found; pass --data FILE")


class CharData:
    """Text as byte tokens. ``name``: the file path or "built-in"."""

    def __init__(self, text: bytes, name: str = "text"):
        if not isinstance(text, (bytes, bytearray)):
            raise TypeError(f"text: expected bytes, got {type(text).__name__}")
        if len(text) < 20:
            raise ValueError(f"data: {name} has {len(text)} bytes; at least 20 are needed (90% "
                             "train, 10% validation, two tokens each at the least)")
        raw = np.frombuffer(bytes(text), dtype=np.uint8)
        present = np.zeros(256, dtype=bool)
        present[raw] = True
        self.symbols = np.nonzero(present)[0].astype(np.uint8)  # token -> byte
        self.token = np.full(256, -1, dtype=np.int64)  # byte -> token
        self.token[self.symbols] = np.arange(len(self.symbols))
        self.ids = self.token[raw]
        self.name = name
        self.vocab = len(self.symbols)
        n = len(text)
        self.ntrain = n // 10 * 9 + (n % 10) * 9 // 10
        self.bytes = n
        self.hash = _fnv1a64(bytes(text))

    @classmethod
    def from_file(cls, path: str) -> "CharData":
        with open(path, "rb") as f:
            return cls(f.read(), path)

    @classmethod
    def builtin(cls) -> "CharData":
        return cls(default_corpus(), "built-in")

    def describe(self) -> str:
        return f"{self.name} ({self.bytes} bytes, vocabulary {self.vocab})"

    def encode(self, text: str) -> list[int]:
        out = []
        for i, c in enumerate(text.encode("utf-8")):
            if self.token[c] < 0:
                raise ValueError(f"prompt: byte {i} ({c:#04x}) is not in the vocabulary of "
                                 f"{self.name}")
            out.append(int(self.token[c]))
        return out

    def decode(self, tokens) -> str:
        return bytes(self.symbols[np.asarray(tokens, dtype=np.int64)]).decode("utf-8", "replace")

    def batch(self, split: str, seed: int, index: int, B: int, T: int):
        """Batch ``index`` of the stream (split, seed): tokens, targets int64 [B, T], window b
        starting at Philox words 2 (index B + b) and 2 (index B + b) + 1 of stream ``seed``
        (train) or ``seed ^ VAL_KEY`` (val), as lowp_data_batch."""
        if split == "train":
            base, key = self.ids[:self.ntrain], seed
        elif split == "val":
            base, key = self.ids[self.ntrain:], seed ^ VAL_KEY
        else:
            raise ValueError(f"split: {split!r} is not 'train' or 'val'")
        n = len(base)
        if n < T + 1:
            raise ValueError(f"data: the {split} split of {self.name} has {n} tokens, fewer "
                             f"than T + 1 ({T + 1}): use a shorter sequence or more text")
        w = philox_words(key & 0xFFFFFFFFFFFFFFFF, 2 * index * B, 2 * B).astype(np.uint64)
        r = w[0::2] | (w[1::2] << np.uint64(32))
        starts = (r % np.uint64(n - T)).astype(np.int64)
        win = base[starts[:, None] + np.arange(T + 1)[None, :]]
        win = torch.from_numpy(np.ascontiguousarray(win))
        return win[:, :T].contiguous(), win[:, 1:].contiguous()
