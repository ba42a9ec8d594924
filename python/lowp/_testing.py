"""Private thin wrappers over liblowp's training layer, for the tests of lowp.torch (CPU only).

- ``delayed_record(history, amax, format)`` and ``delayed_update(history, scale, format,
  margin=0.0, algo="max") -> (scale, scale_inv)``: docs/numerics.md section 5 exactly as
  ``lowp_delayed_record``/``lowp_delayed_update`` (the float32 history array is updated in
  place).
- ``extra_state_pack(histories, scales, formats=("e4m3", "e4m3", "e5m2"), margin=0.0,
  algo="max") -> bytes`` and ``extra_state_unpack(blob, history_len, formats=..., margin=0.0,
  algo="max") -> (histories [3, L] float32, scales [3] float32)``: the versioned blob of
  ``include/lowp/checkpoint.h`` (roles input, weight, grad_output).
- ``train_linear(preset, x, w, dy, bias=None, offs=None, keep_quantized=None, wgrad_hp=None,
  fp32_plain=False) -> (y, dx, dw, dbias)``: one forward and backward of the C training
  layer's linear (w [N, K]) or grouped linear (w [G, N, K] with offs) for a linear-layer
  preset (bf16, fp8_delayed, fp8_current, fp8_rowwise, mxfp8, block128, block_fp8,
  block_fp8_fp4) or a built-in recipe name, on float32 inputs; dbias is None without bias.
  Delayed scaling starts from a fresh state (scale 1).

Arrays may be numpy or torch CPU tensors; results follow the input (torch in, torch out).
"""

import numpy as np

from . import _arrays as A
from ._numpy_api import _lowp, get_threads


def _f32(x, fn, arg, writable=False):
    a, kind, tor = A.to_numpy(x, fn, arg)
    if kind != A.F32:
        raise TypeError(f"{fn}: {arg} must be float32, got {x.dtype}")
    return a, tor


def delayed_record(history, amax, format):
    h, _ = _f32(history, "delayed_record", "history")
    _lowp.delayed_record(h, float(amax), format)


def delayed_update(history, scale, format, margin=0.0, algo="max"):
    h, _ = _f32(history, "delayed_update", "history")
    return _lowp.delayed_update(h, float(scale), format, float(margin), algo)


_FORMATS = ("e4m3", "e4m3", "e5m2")


def extra_state_pack(histories, scales, formats=_FORMATS, margin=0.0, algo="max"):
    h, _ = _f32(histories, "extra_state_pack", "histories")
    s, _ = _f32(scales, "extra_state_pack", "scales")
    if h.ndim != 2 or h.shape[0] != 3 or s.shape != (3,):
        raise ValueError(f"extra_state_pack: histories must be [3, L] and scales [3], got "
                         f"{h.shape} and {s.shape}")
    return _lowp.extra_state_pack(h.shape[1], float(margin), algo, tuple(formats), h, s)


def extra_state_unpack(blob, history_len, formats=_FORMATS, margin=0.0, algo="max"):
    h = np.zeros((3, int(history_len)), np.float32)
    s = np.ones(3, np.float32)
    _lowp.extra_state_unpack(bytes(blob), int(history_len), float(margin), algo, tuple(formats),
                             h, s)
    return h, s


def train_linear(preset, x, w, dy, bias=None, offs=None, keep_quantized=None, wgrad_hp=None,
                 fp32_plain=False):
    fn = "train_linear"
    xa, tor = _f32(x, fn, "x")
    wa, _ = _f32(w, fn, "w")
    dya, _ = _f32(dy, fn, "dy")
    if xa.ndim != 2 or wa.ndim not in (2, 3) or dya.ndim != 2:
        raise ValueError(f"{fn}: x [M, K], w [N, K] or [G, N, K] and dy [M, N] expected")
    M, K = xa.shape
    G = wa.shape[0] if wa.ndim == 3 else 0
    N = wa.shape[-2]
    if wa.shape[-1] != K or dya.shape != (M, N):
        raise ValueError(f"{fn}: shapes x {xa.shape}, w {wa.shape}, dy {dya.shape} disagree")
    ba = None if bias is None else _f32(bias, fn, "bias")[0]
    oa = None
    if offs is not None:
        oa, _ = A.int32_input(offs, fn, "offs")
        if G == 0 or len(oa) != G:
            raise ValueError(f"{fn}: offs needs w [G, N, K] with G = len(offs)")
    elif G:
        raise ValueError(f"{fn}: a 3-D w needs offs")
    y = A.empty((M, N), np.float32, tor, zero=True)
    dx = A.empty((M, K), np.float32, tor, zero=True)
    dw = A.empty(wa.shape, np.float32, tor, zero=True)
    db = None if ba is None else A.empty((N,), np.float32, tor, zero=True)
    tri = (lambda v: -1 if v is None else int(bool(v)))
    _lowp.train_linear(preset, xa, M, K, wa, G, N, dya, ba, oa, y, dx, dw, db,
                       tri(keep_quantized), tri(wgrad_hp), int(bool(fp32_plain)), get_threads())
    out = (lambda a: None if a is None else A.out_array(a, tor))
    return out(y), out(dx), out(dw), out(db)
