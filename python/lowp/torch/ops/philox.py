"""Philox4x32-10 in plain torch integer ops: the word stream of docs/numerics.md section 7 (and
include/lowp/rng.h) on any device, for the portable path's stochastic rounding and the random
Hadamard transform's signs.

Word ``j`` of stream ``seed`` is lane ``j % 4`` of Philox4x32-10 applied to the counter
``{lo32(j/4), hi32(j/4), 0, 0}`` with the key ``{lo32(seed), hi32(seed)}``. The 32-bit words
are held in int64 tensors (values in [0, 2^32)): int64 is the widest integer type every torch
device has, and a 32 x 32-bit product is formed from 16-bit halves so that no intermediate
leaves [0, 2^63). The result is the C stream bit for bit (``lowp_philox_fill``).
"""

from __future__ import annotations

import torch

__all__ = ["philox_block", "philox_words", "philox_word", "PhiloxStates", "philox_states"]

_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_LO32 = 0xFFFFFFFF


def _mulhilo(m: int, x: torch.Tensor):
    """(hi32, lo32) of the 64-bit product m * x, m a 32-bit constant, x int64 in [0, 2^32)."""
    xl, xh = x & 0xFFFF, x >> 16
    pl, ph = xl * m, xh * m  # each < 2^48
    lo = (pl + ((ph & 0xFFFF) << 16)) & _LO32
    hi = (ph + (pl >> 16)) >> 16
    return hi, lo


def philox_block(c0, c1, c2, c3, k0: int, k1: int):
    """Philox4x32-10 of counters (c0, c1, c2, c3) (int64 tensors of 32-bit values, broadcast
    together) under the key (k0, k1): the four output lanes."""
    for _ in range(10):
        hi0, lo0 = _mulhilo(_M0, c0)
        hi1, lo1 = _mulhilo(_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + _W0) & _LO32, (k1 + _W1) & _LO32
    return c0, c1, c2, c3


def philox_word(seed: int, offset: int) -> int:
    """Word ``offset`` of stream ``seed`` as a Python int, computed on the host: one word (the
    Hadamard transform's signs) costs no device work (C's lowp_philox_word)."""
    _check_u64("seed", seed)
    _check_u64("offset", offset)
    b = offset >> 2
    c = [b & _LO32, b >> 32, 0, 0]
    k0, k1 = seed & _LO32, seed >> 32
    for _ in range(10):
        p0, p1 = _M0 * c[0], _M1 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & _LO32, (p0 >> 32) ^ c[3] ^ k1, p0 & _LO32]
        k0, k1 = (k0 + _W0) & _LO32, (k1 + _W1) & _LO32
    return c[offset & 3]


def _check_u64(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"philox_words: {name} ({v!r}) must be an int")
    if not 0 <= v < 1 << 64:
        raise ValueError(f"philox_words: {name} ({v}) is not in [0, 2^64)")
    return v


def philox_words(seed: int, offset: int, n: int, device=None) -> torch.Tensor:
    """Words ``offset .. offset + n - 1`` of the Philox stream ``seed``: an int64 tensor [n]
    of values in [0, 2^32) on ``device``."""
    _check_u64("seed", seed)
    _check_u64("offset", offset)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"philox_words: n ({n!r}) must be an int >= 0")
    if offset + n > 1 << 64:
        raise ValueError(f"philox_words: offset + n ({offset + n}) is past the stream's 2^64 "
                         "words")
    if n == 0:
        return torch.zeros(0, dtype=torch.int64, device=device)
    b0, b1 = offset >> 2, (offset + n - 1) >> 2
    # block numbers can reach 2^62: built from a base and a small range, held as two halves
    idx = torch.arange(b1 - b0 + 1, dtype=torch.int64, device=device)
    lo = idx + (b0 & _LO32)
    c1 = (lo >> 32) + (b0 >> 32)
    c0 = lo & _LO32
    z = torch.zeros_like(c0)
    out = philox_block(c0, c1, z, z, seed & _LO32, seed >> 32)
    lanes = torch.stack(out, dim=1).reshape(-1)
    first = offset - (b0 << 2)
    return lanes[first:first + n]


# ---- named stream positions (the RNG tracker's Philox states, include/lowp/rng_tracker.h) ----

SR_STATE, HADAMARD_STATE = "stochastic_rounding", "hadamard"


class PhiloxStates:
    """Named Philox stream positions ``(seed, offset)``: what the FP4 recipes' stochastic
    rounding (state ``"stochastic_rounding"``) and random Hadamard transform (``"hadamard"``)
    draw from. ``take(name, n)`` returns the state's position and advances its offset by the
    ``n`` words the caller uses, as C's ``lowp_rng_tracker`` does. ``reset(seed)`` sets both
    states as lowp's C trainer does for its ``--seed``: seed + 1 and seed + 2, offsets 0."""

    def __init__(self, seed: int = 1234):
        self.reset(seed)

    def reset(self, seed: int) -> None:
        _check_u64("seed", seed)
        self._states = {SR_STATE: [(seed + 1) % (1 << 64), 0],
                        HADAMARD_STATE: [(seed + 2) % (1 << 64), 0]}

    def add(self, name: str, seed: int) -> None:
        """Add (or replace) the state ``name`` at word 0 of stream ``seed``."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"name ({name!r}) must be a non-empty string")
        self._states[name] = [_check_u64("seed", seed), 0]

    def take(self, name: str, n: int):
        """(seed, offset) of state ``name``'s next word; its offset advances by ``n``."""
        st = self._states.get(name)
        if st is None:
            raise ValueError(f"name ({name!r}) is not a Philox state ({', '.join(self._states)})")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n ({n!r}) must be an int >= 0")
        pos = (st[0], st[1])
        st[1] += n
        return pos

    def get_states(self) -> dict:
        """{name: (seed, offset)}, for checkpoints."""
        return {k: (v[0], v[1]) for k, v in self._states.items()}

    def set_states(self, states: dict) -> None:
        """Replace the states by ``states`` ({name: (seed, offset)}, as get_states gave)."""
        if not isinstance(states, dict):
            raise TypeError(f"states must be a dict, not {type(states).__name__}")
        new = {}
        for k, v in states.items():
            seed, off = v
            new[k] = [_check_u64("seed", int(seed)), _check_u64("offset", int(off))]
        self._states = new


_DEFAULT = PhiloxStates()


def philox_states() -> PhiloxStates:
    """The process's Philox states, which lowp.torch's linear layers draw from."""
    return _DEFAULT
