"""The random Hadamard transform of the FP4 recipes' weight-gradient operands (docs/numerics.md
section 4b), in plain torch ops: any device, ``torch.compile``-able, bit for bit the C
function ``lowp_hadamard16``.

Usage::

    y = lowp.torch.hadamard(x, seed=7, offset=0)   # x [..., K]: each 16-block of the last dim

Each contiguous 16-element block ``x[0..15]`` of the last dimension becomes
``H16 · diag(s) · x / 4`` (``H16[i][j] = (-1)^popcount(i & j)``, Sylvester's order), computed
exactly as the spec says, so every device gives the same bits: the sign flips ``t_i = s_i x_i``,
four butterfly stages (h = 1, 2, 4, 8: ``(t_i, t_{i+h}) = (t_i + t_{i+h}, t_i - t_{i+h})`` for
``i & h == 0``, each one binary32 addition), then one binary32 multiply by 0.25. The signs are
the bits of Philox word ``offset`` of stream ``seed`` (section 7): ``s_i = -1`` where bit ``i``
is set, one sign vector for the whole call. A partial last block (``K % 16 != 0``) is left as
it is. The transform is orthogonal on each block, so the product of two operands transformed
with the same signs along their common dimension is unchanged up to rounding. BF16 (or any
float) input is widened to binary32 first; the result is binary32. NaN and Inf propagate as
IEEE additions do (a block holding a NaN becomes all NaN).
"""

from __future__ import annotations

import torch

from .ops.philox import philox_word

__all__ = ["hadamard", "hadamard_signs"]

BLOCK = 16


def hadamard_signs(seed: int, offset: int, device=None) -> torch.Tensor:
    """The 16 signs (binary32 +-1) of (seed, offset): bit i of Philox word ``offset`` of stream
    ``seed`` set gives -1 for element i of every block."""
    w = philox_word(seed, offset)  # on the host: one word, no device work
    return torch.tensor([-1.0 if (w >> i) & 1 else 1.0 for i in range(BLOCK)],
                        dtype=torch.float32, device=device)


def _butterflies(t: torch.Tensor) -> torch.Tensor:
    """The four stages over the last dim (16) of t, each pair (i, i + h) with i & h == 0."""
    lead = t.shape[:-1]
    for h in (1, 2, 4, 8):
        u = t.reshape(*lead, BLOCK // (2 * h), 2, h)
        a, b = u[..., 0, :], u[..., 1, :]
        t = torch.stack((a + b, a - b), dim=-2).reshape(*lead, BLOCK)
    return t


def _check_offs(offs, K: int):
    if isinstance(offs, torch.Tensor):
        offs = offs.tolist()
    if not isinstance(offs, (list, tuple)):
        raise TypeError(f"hadamard: offs must be a sequence of ints or a 1-D tensor, not "
                        f"{type(offs).__name__}")
    prev = 0
    for g, o in enumerate(offs):
        if isinstance(o, bool) or not isinstance(o, int) or not prev <= o <= K:
            raise ValueError(f"hadamard: offs[{g}] ({o!r}) is not an int in [{prev}, {K}] "
                             "(cumulative group ends along the last dimension)")
        prev = o
    return [int(o) for o in offs]


def hadamard(x: torch.Tensor, seed: int = 0, offset: int = 0, offs=None) -> torch.Tensor:
    """The random Hadamard transform of ``x`` [..., K] along its last dimension (see the
    module docstring): binary32, the shape of ``x``, on ``x``'s device. ``offs`` (cumulative
    group ends along K, as ``grouped_mm`` takes them): the blocks restart at each group's
    first column; a group's short last block and the columns past ``offs[-1]`` are left as
    they are (C's ``lowp_hadamard_cfg.group_offs``)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"hadamard: x must be a torch.Tensor, not {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"hadamard: x must be a floating-point tensor, not {x.dtype}")
    if x.dim() < 1:
        raise ValueError("hadamard: x must have at least 1 dimension")
    for name, v in (("seed", seed), ("offset", offset)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"hadamard: {name} ({v!r}) must be an int")
        if not 0 <= v < 1 << 64:
            raise ValueError(f"hadamard: {name} ({v}) is not in [0, 2^64)")
    x32 = x.to(torch.float32)
    K = x32.shape[-1]
    starts, begin = [], 0
    for end in ([K] if offs is None else _check_offs(offs, K)):
        starts.extend(range(begin, end - BLOCK + 1, BLOCK))  # a group's full blocks
        begin = end
    if not starts:
        return x32.clone()
    # every full block at once: gathered [..., nb, 16], transformed, written back in place of
    # the originals; the other columns (short blocks, past the groups) stay as they are
    idx = (torch.tensor(starts, dtype=torch.int64, device=x32.device)[:, None] +
           torch.arange(BLOCK, dtype=torch.int64, device=x32.device))
    t = x32[..., idx] * hadamard_signs(seed, offset, x32.device)
    out = x32.clone()
    out[..., idx] = _butterflies(t) * 0.25
    return out
