"""`LowpQTensor`: lowp.torch's one quantized operand type.

What every part of `lowp.torch.ops` passes around: what `quantize` returns, what the autograd
matmul keeps for its backward, and what the GEMMs (native and portable) consume. Like torchao's
`MXTensor`, it holds the element codes in `qdata` and the block scales in `scale`, with the
attributes that say how to read them:

- `format`: "e4m3", "e5m2", "e2m1" (two codes per byte, element 2i in the low nibble); for an
  unquantized operand (`scaling` "none") the dtype name of `qdata` ("bf16" or "f32");
- `scaling`: "tensor", "row", "mx32", "block128", "block128x128", "block32x32", "nv16",
  "nv16x16" or "none";
- `tensor_scale`: NVFP4's second level (kinds "nv16", "nv16x16"): the binary32 decode scale
  D of the whole tensor as a float32 tensor of shape [1], beside the E4M3 block scale codes
  in `scale` (docs/numerics.md 4b), as the portable kernels hold an NVFP4 operand; where a
  `LowpQTensor` holds the ops' own tensors (the autograd linear's operands), `scale` is the
  ops' one uint8 tensor of both levels (ops/layout.py) and `tensor_scale` is None; None for
  every other kind;
- `rows`, `cols`: the logical shape [rows, cols] (the contracted axis last);
- `offs`: group ends along `cols` as host ints, for a copy quantized along the tokens in
  groups (the portable path's grouped copies), else None;
- `grouped`: the copy was quantized along the tokens with offsets (its scales restart at each
  group and are padded to the static bound `lowp::quantize` returns).

A stack of G operands (the experts of a grouped GEMM) is one `LowpQTensor` whose `qdata` and
`scale` have a leading G dimension; `rows`/`cols` still describe one expert.

It is a plain Python object, not a tensor subclass: it never reaches user code or the
dispatcher (the `lowp::` ops take its `qdata` and `scale` as ordinary tensors, and autograd
saves those tensors), so torch.compile traces through it as through any Python object.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

__all__ = ["LowpQTensor"]


class LowpQTensor:
    """A quantized (or plain) GEMM operand [rows, cols]: codes, scales and how to read them."""

    __slots__ = ("qdata", "scale", "format", "scaling", "rows", "cols", "offs", "grouped",
                 "tensor_scale")

    def __init__(self, qdata: torch.Tensor, scale: Optional[torch.Tensor], format: str,
                 scaling: str, rows: int, cols: int, offs: Optional[Sequence[int]] = None,
                 grouped: bool = False, tensor_scale: Optional[torch.Tensor] = None):
        self.qdata, self.scale, self.format, self.scaling = qdata, scale, format, scaling
        self.rows, self.cols, self.offs = rows, cols, offs
        self.grouped = grouped or offs is not None
        self.tensor_scale = tensor_scale

    @property
    def shape(self):
        return (self.rows, self.cols)

    @property
    def quantized(self) -> bool:
        return self.scaling != "none"

    def __repr__(self):
        lead = f"{self.qdata.shape[0]} x " if self.qdata.dim() == 3 else ""
        grp = ", grouped" if self.grouped else ""
        return (f"LowpQTensor({lead}[{self.rows}, {self.cols}] {self.format} {self.scaling}"
                f"{grp}, device={self.qdata.device})")
