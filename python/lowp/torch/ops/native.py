"""The `lowp::` ops' CPU kernels: lowp's native kernels through the C extension.

Registered for the "cpu" dispatch key by `library.py` when the extension is importable (a
checkout without `make build` runs the portable kernels on the CPU too). Each kernel takes the
op's own arguments, already checked, and writes straight into torch tensors: CPU tensors are
passed to the extension as raw memory, (data_ptr, nbytes), without numpy views.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import portable as P
from .layout import (data_shape, empty, grouped_scale_bound, kn_cols, nv_join, nv_split,
                     scale_dtype, trim_scale)

try:  # lowp's numpy API over the C extension (absent in a checkout without `make build`)
    from ... import _arrays
    from ... import _numpy_api as _lp
    from ..._numpy_api import _lowp as _ext
except Exception:  # pragma: no cover - depends on the build
    _lp = _ext = None

__all__ = ["available", "quantize", "dequantize", "scaled_mm", "scaled_grouped_mm",
           "delayed_update", "hadamard16"]

_XFMT = {torch.float32: "f32", torch.bfloat16: "bf16"}


def available() -> bool:
    """True when lowp's C extension is importable."""
    return _ext is not None


def _threads() -> int:
    return _lp.get_threads()


def _buf(t: Optional[Tensor]):
    """A CPU tensor's memory for the extension, or None: a contiguous tensor as raw memory,
    (data_ptr, nbytes), which the caller keeps alive for the call (a numpy view per argument
    cost tens of microseconds, a large share of a small MoE layer's time); any other as a
    zero-copy numpy view of a contiguous copy, which holds the copy. Not Tensor.numpy(), which
    would make the storage non-resizable (see lowp/_arrays.py). A negative or conjugate view
    (torch._neg_view, .conj()) is resolved first: its memory holds the values unnegated."""
    if t is None:
        return None
    if t.is_neg() or t.is_conj():  # a copy, held by the numpy view below
        t = t.resolve_neg().resolve_conj()
    elif t.is_contiguous():
        return (t.data_ptr(), t.numel() * t.element_size())
    return _arrays.to_numpy(t.contiguous(), "lowp.torch", "operand")[0]


def _desc(data: Tensor, scale: Optional[Tensor], fmt: str, scaling: str, rows: int, cols: int,
          offs: Optional[Tensor] = None):
    """The extension's descriptor of one operand [rows, cols], a `QDesc`."""
    if scaling == "none":
        fmt = _XFMT[data.dtype]
        scale = None
    return _ext.QDesc(fmt, scaling, int(rows), int(cols), _buf(data), _buf(scale), _buf(offs))


def _plain(x: Tensor):
    """The descriptor of a plain float32 / bfloat16 source [R, C]."""
    return _ext.QDesc(_XFMT[x.dtype], "none", x.shape[0], x.shape[1], _buf(x))


_GEMM_CFGS: dict = {}


def _gemm_cfg(out_dtype: str, b_kn: bool):
    """The extension's GEMM settings (lowp_gemm_cfg), a `GemmCfg`, built once per (out_dtype,
    threads, b_kn): building one with keywords costs about as much as a small GEMM's descriptors."""
    key = (out_dtype, _threads(), b_kn)
    cfg = _GEMM_CFGS.get(key)
    if cfg is None:
        cfg = _GEMM_CFGS[key] = _ext.GemmCfg(out_dtype=out_dtype, threads=key[1],
                                             b_layout="kn" if b_kn else "nk")
    return cfg


def _src(x: Tensor) -> Tensor:
    """The kernels read float32 or bfloat16 (any other float goes through float32, as the
    portable kernels do), contiguous, with negative views resolved."""
    x = x if x.dtype in _XFMT else x.to(torch.float32)
    return x.resolve_neg().contiguous()


# ---- quantize ----


def _alloc(fmt, scaling, rows, cols, offs=None, stack=()):
    """One copy's codes and scales, shaped by the C layout (with a leading stack dim; NVFP4:
    the scales' bytes, block codes then the tensor scale, layout.py)."""
    _, sb, sr, sc, _ = _ext.layout(fmt, scaling, rows, cols, offs)
    nv = scaling in P.NV_KINDS  # (zeroed: C writes no padding bytes)
    scales = (torch.zeros if nv else torch.empty)(stack + ((sb,) if nv else (sr, sc)),
                                                  dtype=scale_dtype(scaling))
    return torch.empty(stack + data_shape(fmt, rows, cols), dtype=torch.uint8), scales


def _settings(scaling, scale_mode, pow2):
    """(mode, pow2) as the extension takes them from the op's ("" / -1: the defaults)."""
    if scaling in P.E8M0_KINDS:
        return P.default_mode(scaling, scale_mode or None), -1
    return "default", pow2


def _sr_kw(sr) -> dict:
    """QuantCfg's stochastic-rounding keywords of sr = (SR?, seed, offset) (none for RNE)."""
    return {"sr": True, "seed": sr[1], "offset": sr[2]} if sr[0] else {}


def _quantize_grouped(x, fmt, scaling, mode, pow2, eps, offs, sr=(False, 0, 0)):
    R, C = x.shape
    o32 = offs.to(torch.int32).contiguous()
    ob = _buf(o32)
    cd, cs = _alloc(fmt, scaling, C, R, ob)
    cfg = _ext.QuantCfg(scale_mode=mode, pow2=pow2, eps=float(eps), threads=_threads(),
                        **_sr_kw(sr))
    _ext.quantize_grouped(_plain(x), _ext.QDesc(fmt, scaling, C, R, _buf(cd), _buf(cs), ob), cfg)
    d = None
    if scaling in P.NV_KINDS:  # the op pads the blocks to the static bound, then D
        cs, d = nv_split(cs, *P.scale_shape(scaling, C, R, o32.tolist()))
    sc_out = torch.zeros((C, grouped_scale_bound(scaling, R, o32.numel())), dtype=cs.dtype)
    sc_out[:, : cs.shape[1]] = cs
    return empty(x.device), empty(x.device), cd, sc_out if d is None else nv_join(sc_out, d)


def _quantize_into(x, fmt, scaling, mode, pow2, eps, axis, s, out, sr=(False, 0, 0)):
    """Quantize 2-D x into out = (row codes, row scales, col codes, col scales), None where an
    axis is not wanted; sr: (stochastic rounding?, seed, offset)."""
    R, C = x.shape
    rd, rs, cd, cs = out
    row = None if rd is None else _ext.QDesc(fmt, scaling, R, C, _buf(rd), _buf(rs))
    col = None if cd is None else _ext.QDesc(fmt, scaling, C, R, _buf(cd), _buf(cs))
    cfg = _ext.QuantCfg(scale_mode=mode, pow2=pow2, eps=float(eps), scale=s, threads=_threads(),
                        **_sr_kw(sr))
    _ext.quantize(_plain(x), row, col, cfg)


def quantize(x: Tensor, format: str, scaling: str, scale_mode: str, pow2: int, eps: float,
             axis: str, offs: Optional[Tensor] = None, scale: Optional[Tensor] = None,
             rounding: str = "rne", seed: int = 0, offset: int = 0):
    """lowp::quantize on lowp's kernels. x [R, C], or [G, R, C] (G matrices, stacked copies;
    with SR, matrix g's copies start at word offset + g * R * C)."""
    x = _src(x)
    mode, p2 = _settings(scaling, scale_mode, pow2)
    sr = (rounding == "sr", int(seed), int(offset))
    if offs is not None:
        return _quantize_grouped(x, format, scaling, mode, p2, eps, offs, sr)
    s = None if scale is None else float(scale.reshape(()).item())
    R, C = x.shape[-2:]
    stack = tuple(x.shape[:-2])
    row = _alloc(format, scaling, R, C, stack=stack) if axis in ("row", "both") else (None, None)
    col = _alloc(format, scaling, C, R, stack=stack) if axis in ("col", "both") else (None, None)
    out = row + col
    if not stack:
        _quantize_into(x, format, scaling, mode, p2, eps, axis, s, out, sr)
    for g in range(stack[0] if stack else 0):
        _quantize_into(x[g], format, scaling, mode, p2, eps, axis, s,
                       tuple(None if t is None else t[g] for t in out),
                       (sr[0], sr[1], sr[2] + g * R * C))
    return tuple(empty(x.device) if t is None else t for t in out)


# ---- dequantize ----


def dequantize(data: Tensor, scale: Tensor, format: str, scaling: str, rows: int, cols: int,
               offs: Optional[Tensor] = None) -> Tensor:
    """float32 [rows, cols] values of a quantized copy (a grouped columnwise copy: [features,
    tokens] with offs along the tokens)."""
    o32 = None
    if offs is not None:
        scale = trim_scale(scale, scaling, rows, cols, offs.tolist())
        o32 = offs.to(torch.int32).contiguous()
    out = torch.empty((rows, cols), dtype=torch.float32)
    _ext.dequantize(_desc(data, scale, format, scaling, rows, cols, o32), _buf(out))
    return out


# ---- GEMMs ----


def scaled_mm(a: Tensor, a_scale: Tensor, a_format: str, a_scaling: str, b: Tensor,
              b_scale: Tensor, b_format: str, b_scaling: str, k: int, out_dtype: str = "f32",
              b_kn: bool = False, n: int = -1) -> Tensor:
    M, N = a.shape[0], kn_cols(b, b_format, n) if b_kn else b.shape[0]
    out = torch.empty((M, N), dtype=torch.bfloat16 if out_dtype == "bf16" else torch.float32)
    bd = (_desc(b, b_scale, b_format, b_scaling, k, N) if b_kn
          else _desc(b, b_scale, b_format, b_scaling, N, k))
    _ext.gemm(_desc(a, a_scale, a_format, a_scaling, M, k), bd, _buf(out),
              _gemm_cfg(out_dtype, b_kn))
    return out


def _split_m(a, a_scale, a_format, a_scaling, b, b_scale, b_format, b_scaling, offs, k, odt,
             out_dtype, b_kn, n=-1):
    T, N = a.shape[0], kn_cols(b, b_format, n) if b_kn else b.shape[1]
    G = b.shape[0]
    # lowp writes every row of every group and leaves the rows past offs[-1]: only those are
    # zeroed (a zero-filled output cost 5% of a medium MoE step).
    out = torch.empty((T, N), dtype=odt)
    out[(int(offs[-1]) if G else 0):].zero_()
    o32 = offs.to(torch.int32).contiguous()
    bd = (_desc(b, b_scale, b_format, b_scaling, k, N) if b_kn
          else _desc(b, b_scale, b_format, b_scaling, N, k))
    _ext.grouped_gemm(_desc(a, a_scale, a_format, a_scaling, T, k), bd, _buf(o32), _buf(out),
                      _gemm_cfg(out_dtype, b_kn))
    return out


def _split_k(a, a_scale, a_format, a_scaling, b, b_scale, b_format, b_scaling, offs, k, odt,
             out_dtype):
    N, K, G = a.shape[0], b.shape[0], offs.shape[0]
    ol = offs.tolist()
    ga = ol if a_scaling in P.TOKEN_BLOCK_KINDS else None
    gb = ol if b_scaling in P.TOKEN_BLOCK_KINDS else None
    sa = trim_scale(a_scale, a_scaling, N, k, ga) if a_scaling != "none" else None
    sb = trim_scale(b_scale, b_scaling, K, k, gb) if b_scaling != "none" else None
    # the raw call: tensor/row copies carry no groups, which lowp.grouped_gemm wants
    out = torch.empty((G, N, K), dtype=odt)  # lowp writes every group (empty ones: 0)
    o32 = offs.to(torch.int32).contiguous()
    _ext.grouped_gemm_wgrad(_desc(a, sa, a_format, a_scaling, N, k, o32 if ga else None),
                            _desc(b, sb, b_format, b_scaling, K, k, o32 if gb else None),
                            _buf(o32), _buf(out), _gemm_cfg(out_dtype, False))
    return out


def scaled_grouped_mm(a: Tensor, a_scale: Tensor, a_format: str, a_scaling: str, b: Tensor,
                      b_scale: Tensor, b_format: str, b_scaling: str, offs: Tensor, k: int,
                      wgrad: bool, out_dtype: str = "f32", b_kn: bool = False,
                      n: int = -1) -> Tensor:
    odt = torch.bfloat16 if out_dtype == "bf16" else torch.float32
    if wgrad:
        return _split_k(a, a_scale, a_format, a_scaling, b, b_scale, b_format, b_scaling, offs,
                        k, odt, out_dtype)
    return _split_m(a, a_scale, a_format, a_scaling, b, b_scale, b_format, b_scaling, offs, k,
                    odt, out_dtype, b_kn, n)


# ---- delayed scaling ----

def delayed_update(history: Tensor, scales: Tensor, formats, margin: float, algo: str) -> None:
    """lowp::delayed_update on the C library's lowp_delayed_update, role by role (the history
    updated in place)."""
    for r, fmt in enumerate(formats):
        row = history[r]
        s, _ = _ext.delayed_update((row.data_ptr(), row.numel() * 4), float(scales[r]), fmt,
                                   float(margin), algo)
        scales[r] = s


# ---- the random Hadamard transform ----


def hadamard16(x: Tensor, seed: int, offset: int, offs: Optional[Tensor] = None) -> Tensor:
    """lowp::hadamard16 on C's lowp_hadamard16: float32 [R, C], x's rows transformed."""
    x = _src(x)
    if offs is not None and offs.numel() == 0:  # no group: nothing transformed (as portable)
        return x.to(torch.float32, copy=True)
    out = torch.empty(x.shape, dtype=torch.float32)
    o = None if offs is None else offs.to(torch.int32).contiguous()
    _ext.hadamard16(_buf(x), _XFMT[x.dtype], _buf(out), x.shape[0], x.shape[1], int(seed),
                    int(offset), _buf(o), _threads())
    return out
