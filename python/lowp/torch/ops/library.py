"""The `lowp::` torch operators: their schemas, argument checks, fake kernels, and the kernel
each device runs, chosen by torch's dispatcher.

Four operators in the `lowp` namespace, defined with `torch.library.Library` and given fake
(meta) kernels so that FakeTensor tracing, `torch.compile` and `opcheck` see ordinary ops:

  lowp::quantize(x, format, scaling, scale_mode, pow2, eps, axis, offs, scale, rounding,
                 seed, offset)
        -> (data, scale, data_col, scale_col)     (empty tensors for a copy not asked for)
        rounding "sr": stochastic rounding of the elements, element i of a copy (row-major in
        the copy's own [rows, cols]) taking Philox word offset + i of stream seed
        x [R, C], or [G, R, C]: G matrices quantized one by one into stacked copies
  lowp::dequantize(data, scale, format, scaling, rows, cols, offs) -> float32 [rows, cols]
  lowp::scaled_mm(a, a_scale, a_format, a_scaling, b, b_scale, b_format, b_scaling, k)
        -> float32 A . B^T (b_kn=True: A . B, b given as stored [k, N]; n: N of packed
           E2M1 codes given so, -1: twice their stored columns)
  lowp::scaled_grouped_mm(a, ..., b, ..., offs, k, wgrad) -> split-M [T, N] or split-K [G, N, K]

Kernels, per dispatch key:
- "CPU": lowp's native kernels (`native.py`, the C extension), when the extension imports;
- "CompositeExplicitAutograd" (every other device: CUDA, XPU, an NPU's PrivateUse1, MPS...,
  and the CPU without the extension): the portable kernels below, plain torch ops over
  `portable.py`, which give the same bytes;
- a device with vendor kernels (`lowp.torch.device_kernels.register_kernel`) gets, for its own
  key, a trampoline that asks that table (`_ROUTER`) and falls back to the portable kernel;
  the CPU kernel asks it too, and falls back to the native one.
Every kernel checks its arguments first, with the checks its fake kernel runs plus those of
values (offs). `stats()` counts which kernels ran ("native", "portable", "device").

`kernel_preference(KernelPreference.PORTABLE)` (a `TorchDispatchMode`, the torch way to
override the dispatcher's choice) runs the portable kernels on any device, the CPU included:
tests compare the two paths with it, and a config's `kernel_preference` field uses it for one
matmul.

The ops are registered with `torch.library.Library` rather than `custom_op`: the dispatcher
then calls the Python kernel directly (about 6 us a call on the CPU, against about 20 us
through `custom_op`'s Python layers, measured with a 4-argument op), which mattered for the
small expert GEMMs of a MoE layer.

A grouped columnwise copy (quantized along tokens with `offs`) has a data-dependent number of
scale blocks; the op returns its scales zero-padded to a static bound, [K, ceil(T/bs) + G]
(columns past the real blocks are 0), so its fake kernel has a static shape.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from typing import List, Optional

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from ..config import KernelPreference
from . import native
from . import portable as P
from .layout import (OUT_DTYPES, data_shape, empty, grouped_scale_bound, kn_check, kn_cols,
                     nv_join, nv_split, op_scale_shape, scale_dtype, trim_scale)
from .qtensor import LowpQTensor
from ..hadamard import hadamard

__all__ = [
    "KernelPreference",
    "kernel_preference",
    "check_preference",
    "has_native_kernel",
    "native_available",
    "stats",
    "reset_stats",
]

_PLAIN_DTYPES = (torch.float32, torch.bfloat16)

# ---- counters ----

_STATS: Counter = Counter()


def native_available() -> bool:
    """True when lowp's C extension is importable (CPU tensors then run natively)."""
    return native.available()


def stats() -> dict:
    """Counters of the kernels that ran: {"native": n, "portable": n, "device": n,
    "<op>.native": n, ..., "device.<kernel name>": n}."""
    out = {"native": 0, "portable": 0, "device": 0}
    out.update(_STATS)
    return out


def reset_stats() -> None:
    _STATS.clear()


def _count(op: str, path: str) -> None:
    _STATS[path] += 1
    _STATS[f"{op}.{path}"] += 1


# ---- argument checks (the ops' implementations and fake kernels alike) ----
# The extension checks only that each buffer holds enough bytes: a `k` smaller than the
# operands', float32 values read as codes or fewer groups than experts would pass it. Every
# shape here is static, so the fake kernels run the same checks and torch.compile / opcheck
# see the errors eager mode gives.

_QFORMATS = tuple(P.FORMATS)  # the element formats of the C tables
_AXES = ("row", "col", "both")


def _check_name(fn: str, arg: str, value, allowed) -> None:
    if not isinstance(value, str) or value not in allowed:
        names = ", ".join(a or "'' (the default)" for a in allowed)
        raise ValueError(f"{fn}: {arg} ({value!r}) is not one of {names}")


def _names(arg: str):
    """The op's argument names of operand arg: (codes, scales, format, scaling)."""
    if not arg:
        return "data", "scale", "format", "scaling"
    return arg, f"{arg}_scale", f"{arg}_format", f"{arg}_scaling"


def _check_operand(fn: str, arg: str, data: Tensor, scale: Tensor, fmt: str, scaling: str,
                   rows: int, cols: int, stack=(), groups: Optional[int] = None) -> None:
    """One operand [rows, cols] (or a stack of them): fmt codes (uint8) and their scales, or,
    scaling "none", plain float32/bfloat16 values. `groups`: the copy was quantized along its
    columns (the tokens) in that many groups, its scales padded to the static bound the
    quantize op returns."""
    dn, sn, fname, kname = _names(arg)
    _check_name(fn, kname, scaling, P.SCALINGS + ("none",))
    stack = tuple(stack)
    if scaling == "none":
        if data.dtype not in _PLAIN_DTYPES:
            raise ValueError(f"{fn}: {dn} ({kname} none) must be float32 or bfloat16, not "
                             f"{data.dtype}")
        want = stack + (rows, cols)
    else:
        _check_name(fn, fname, fmt, _QFORMATS)
        if data.dtype != torch.uint8:
            raise ValueError(f"{fn}: {dn} holds {fmt} codes and must be torch.uint8, not "
                             f"{data.dtype}")
        want = stack + data_shape(fmt, rows, cols)
    if tuple(data.shape) != want:
        what = f"{fmt} codes" if scaling != "none" else "values"
        n = f"{stack[0]} x " if stack else ""
        raise ValueError(f"{fn}: {dn} has shape {tuple(data.shape)}, but {n}[rows, cols] = "
                         f"[{rows}, {cols}] {what} are stored as {want}")
    if scaling == "none":
        return
    want = stack + op_scale_shape(scaling, rows, cols, groups)
    if scale.dtype != scale_dtype(scaling) or tuple(scale.shape) != want:
        raise ValueError(f"{fn}: {sn} ({scale.dtype}, shape {tuple(scale.shape)}) does not "
                         f"match {dn}: {scaling} scales of [{rows}, {cols}] are "
                         f"{scale_dtype(scaling)} of shape {want}")


def _check_k(fn: str, k, a: Tensor, a_format: str, a_scaling: str) -> None:
    """k, the contracted length, against a's stored columns."""
    if isinstance(k, bool) or not isinstance(k, (int, torch.SymInt)) or k < 0:
        raise ValueError(f"{fn}: k ({k!r}) must be an int >= 0")
    if a.dim() != 2:
        raise ValueError(f"{fn}: a must be 2-D, got shape {tuple(a.shape)}")
    cols = data_shape(a_format, 1, k)[1] if a_scaling != "none" else k
    if a.shape[1] != cols:
        raise ValueError(f"{fn}: k ({k}) does not match a of shape {tuple(a.shape)} (a holds "
                         f"{a.shape[1]} stored columns, k makes {cols})")


def _check_offs_groups(fn: str, offs: Tensor, groups: int, what: str) -> None:
    if offs.dim() != 1 or offs.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{fn}: offs must be a 1-D int32 tensor, got {offs.dtype} of shape "
                         f"{tuple(offs.shape)}")
    if offs.shape[0] != groups:
        raise ValueError(f"{fn}: offs holds {offs.shape[0]} groups but {what} has {groups}")


def _check_out_dtype(fn: str, out_dtype) -> None:
    _check_name(fn, "out_dtype", out_dtype, tuple(OUT_DTYPES))


def _check_quantize_args(x, format, scaling, scale_mode, pow2, eps, axis, offs=None,
                         scale=None, rounding="rne", seed=0, offset=0, *, eager=False) -> None:
    fn = "lowp::quantize"
    _check_rounding(fn, rounding, seed, offset, format, scaling)
    if not x.is_floating_point():
        raise TypeError(f"{fn}: x must be a floating-point tensor, got {x.dtype}")
    if x.dim() not in (2, 3) or (x.dim() == 3 and offs is not None):
        raise ValueError(f"{fn}: x must be 2-D (or 3-D, stacked matrices, without offs), got "
                         f"shape {tuple(x.shape)}")
    if scale is not None and (scaling != "tensor" or scale.numel() != 1):
        raise ValueError(f"{fn}: scale (a delayed scale) is one value for tensor scaling, got "
                         f"shape {tuple(scale.shape)} with scaling {scaling!r}")
    _check_name(fn, "format", format, _QFORMATS)
    _check_name(fn, "scaling", scaling, P.SCALINGS)
    _check_name(fn, "scale_mode", scale_mode, ("",) + P.SCALE_MODES)
    if scale_mode and scaling not in P.E8M0_KINDS:
        raise ValueError(f"{fn}: scale_mode ({scale_mode!r}) applies to mx32 and block32x32, "
                         f"not {scaling} (pass \"\")")
    if isinstance(pow2, bool) or pow2 not in (-1, 0, 1):
        raise ValueError(f"{fn}: pow2 ({pow2!r}) must be -1 (the default), 0 or 1")
    if pow2 >= 0 and scaling in P.E8M0_KINDS + P.NV_KINDS:
        raise ValueError(f"{fn}: pow2 ({pow2}) applies to the binary32 scalings, not {scaling} "
                         "(pass -1)")
    if scaling in P.NV_KINDS and (format != "e2m1" or eps != 0):
        raise ValueError(f"{fn}: scaling {scaling} (NVFP4) takes format e2m1 and eps 0, got "
                         f"format {format!r} and eps {eps}")
    _check_name(fn, "axis", axis, _AXES)
    if not (eps >= 0 and eps < float("inf")):
        raise ValueError(f"{fn}: eps ({eps}) must be finite and >= 0")
    if offs is not None and offs.dim() != 1:
        raise ValueError(f"{fn}: offs must be 1-D, got shape {tuple(offs.shape)}")
    if offs is not None and scaling not in P.TOKEN_BLOCK_KINDS:
        raise ValueError(f"{fn}: offs (grouped copies) needs scaling "
                         f"{' or '.join(P.TOKEN_BLOCK_KINDS)}, not {scaling}")
    if offs is not None and eager:
        _check_offs_values(fn, offs.tolist(), x.shape[0])
    if scale is not None and eager and not 0 < float(scale.reshape(())) < float("inf"):
        raise ValueError(f"{fn}: scale ({float(scale.reshape(()))}) must be finite and > 0")


def _check_rounding(fn: str, rounding, seed, offset, format, scaling) -> None:
    """SR's arguments: rounding "rne" or "sr" (SR for the E2M1 elements of mx32, nv16 and
    nv16x16, as C's lowp_quantize takes it), the stream position seed, offset in [0, 2^63) (the
    op's SymInts are int64)."""
    _check_name(fn, "rounding", rounding, P.ROUNDINGS)
    if rounding == "sr" and (format != "e2m1" or scaling not in ("mx32",) + P.NV_KINDS):
        raise ValueError(f"{fn}: rounding 'sr' is for e2m1 elements of mx32, nv16 or nv16x16, "
                         f"not {format} {scaling}")
    for name, v in (("seed", seed), ("offset", offset)):
        if isinstance(v, bool) or not isinstance(v, (int, torch.SymInt)) or v < 0:
            raise ValueError(f"{fn}: {name} ({v!r}) must be an int in [0, 2^63)")


def _check_dequantize_args(data, scale, format, scaling, rows, cols, offs=None, *,
                           eager=False) -> None:
    fn = "lowp::dequantize"
    for name, v in (("rows", rows), ("cols", cols)):
        if isinstance(v, bool) or not isinstance(v, (int, torch.SymInt)) or v < 0:
            raise ValueError(f"{fn}: {name} ({v!r}) must be an int >= 0")
    _check_name(fn, "scaling", scaling, P.SCALINGS)
    groups = None
    if offs is not None:
        if scaling not in P.TOKEN_BLOCK_KINDS:
            raise ValueError(f"{fn}: offs is for grouped copies ({', '.join(P.TOKEN_BLOCK_KINDS)}"
                             f"), not {scaling}")
        if offs.dim() != 1:
            raise ValueError(f"{fn}: offs must be 1-D, got shape {tuple(offs.shape)}")
        groups = offs.shape[0]
    _check_operand(fn, "", data, scale, format, scaling, rows, cols, groups=groups)
    if offs is not None and eager:
        _check_offs_values(fn, offs.tolist(), cols)


def _check_scaled_mm_args(a, a_scale, a_format, a_scaling, b, b_scale, b_format, b_scaling, k,
                          out_dtype="f32", b_kn=False, n=-1, *, eager=False) -> None:
    fn = "lowp::scaled_mm"
    _check_out_dtype(fn, out_dtype)
    _check_n(fn, n, b_kn)
    _check_k(fn, k, a, a_format, a_scaling)
    _check_operand(fn, "a", a, a_scale, a_format, a_scaling, a.shape[0], k)
    if b.dim() != 2:
        raise ValueError(f"{fn}: b must be 2-D, got shape {tuple(b.shape)}")
    if b_kn:
        kn_check(b_scaling, fn)
        _check_operand(fn, "b", b, b_scale, b_format, b_scaling, k, kn_cols(b, b_format, n))
    else:
        _check_operand(fn, "b", b, b_scale, b_format, b_scaling, b.shape[0], k)


def _check_grouped_args(a, a_scale, a_format, a_scaling, b, b_scale, b_format, b_scaling, offs,
                        k, wgrad, out_dtype="f32", b_kn=False, n=-1, *, eager=False) -> None:
    fn = "lowp::scaled_grouped_mm"
    _check_n(fn, n, b_kn)
    if b_kn and wgrad:
        raise ValueError(f"{fn}: b_kn is for split-M (wgrad=False)")
    _check_out_dtype(fn, out_dtype)
    if eager and offs.dim() == 1:
        _check_offs_values(fn, offs.tolist(), k if wgrad else a.shape[0])
    _check_k(fn, k, a, a_format, a_scaling)
    if not wgrad:  # split-M: a [T, k], b [G, N, k] (b_kn [G, k, N])
        if b.dim() != 3:
            raise ValueError(f"{fn}: b must be 3-D [G, N, k], got shape {tuple(b.shape)}")
        G = b.shape[0]
        _check_offs_groups(fn, offs, G, "b (b.shape[0])")
        _check_operand(fn, "a", a, a_scale, a_format, a_scaling, a.shape[0], k)
        if b_kn:
            kn_check(b_scaling, fn)
        rows, cols = (k, kn_cols(b, b_format, n)) if b_kn else (b.shape[1], k)
        _check_operand(fn, "b", b, b_scale, b_format, b_scaling, rows, cols, stack=(G,))
        return
    # split-K: a = dY^T [N, T], b = X^T [K, T], quantized along the tokens (k = T)
    _check_offs_groups(fn, offs, offs.shape[0] if offs.dim() == 1 else -1, "offs")
    if b.dim() != 2:
        raise ValueError(f"{fn}: b must be 2-D [K, k] for wgrad, got shape {tuple(b.shape)}")
    G = offs.shape[0]
    for arg, t, sc, f, kind in (("a", a, a_scale, a_format, a_scaling),
                                ("b", b, b_scale, b_format, b_scaling)):
        grp = G if kind in P.TOKEN_BLOCK_KINDS else None
        _check_operand(fn, arg, t, sc, f, kind, t.shape[0], k, groups=grp)


def _check_n(fn: str, n, b_kn: bool) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, torch.SymInt)) or n < -1:
        raise ValueError(f"{fn}: n ({n!r}) must be an int >= -1")
    if n >= 0 and not b_kn:
        raise ValueError(f"{fn}: n ({n}) is N of a b read as stored [k, N] (b_kn=True)")


def _check_offs_values(fn: str, ol: List[int], tokens: int, bound: str = "") -> None:
    """Cumulative group ends in [0, tokens], non-decreasing (eager only: data-dependent).
    `fn` prefixes the message when given; `bound` names where `tokens` comes from."""
    prev = 0
    for g, o in enumerate(ol):
        if o < prev or o > tokens:
            top = f"{bound} ({tokens})" if bound else str(tokens)
            raise ValueError(f"{fn + ': ' if fn else ''}offs[{g}] ({o}) is not in [{prev}, "
                             f"{top}] (offsets are cumulative group ends)")
        prev = o



# ---- the portable kernels (the default for every device) ----


def _portable_quantize(x: Tensor, format: str, scaling: str, scale_mode: str, pow2: int,
                       eps: float, axis: str, offs: Optional[Tensor] = None,
                       scale: Optional[Tensor] = None, rounding: str = "rne", seed: int = 0,
                       offset: int = 0):
    mode = P.default_mode(scaling, scale_mode or None)
    p2 = None if pow2 < 0 else bool(pow2)
    dev = x.device
    if offs is not None:
        R, C = x.shape
        sc_out = torch.zeros((C, grouped_scale_bound(scaling, R, offs.numel())),
                             dtype=scale_dtype(scaling), device=dev)
        q = P.quantize_grouped(x, offs.tolist(), format, scaling, mode, eps, p2, rounding, seed,
                               offset)
        sc_out[:, : q.scale.shape[1]] = q.scale
        if scaling in P.NV_KINDS:
            sc_out = nv_join(sc_out, q.tensor_scale)
        return empty(dev), empty(dev), q.qdata, sc_out
    if x.dim() == 3:  # stacked copies: one matrix at a time, each taking its own words
        n = x.shape[1] * x.shape[2]
        parts = [_portable_quantize(m, format, scaling, scale_mode, pow2, eps, axis, None, scale,
                                    rounding, seed, offset + g * n) for g, m in enumerate(x)]
        return tuple(torch.stack(p) if p[0].numel() or p[0].dim() > 1 else empty(dev)
                     for p in zip(*parts))
    row, col = P.quantize(x, format, scaling, mode, axis, eps, p2, scale, rounding, seed, offset)
    return (row.qdata if row else empty(dev), _op_scale(row) if row else empty(dev),
            col.qdata if col else empty(dev), _op_scale(col) if col else empty(dev))


def _op_scale(q: LowpQTensor) -> Tensor:
    """q's scales as the ops carry them (NVFP4: block codes and D in one tensor, layout.py)."""
    return nv_join(q.scale, q.tensor_scale) if q.scaling in P.NV_KINDS else q.scale


def _portable_dequantize(data: Tensor, scale: Tensor, format: str, scaling: str, rows: int,
                         cols: int, offs: Optional[Tensor] = None) -> Tensor:
    ol = offs.tolist() if offs is not None else None
    sc = trim_scale(scale, scaling, rows, cols, ol)
    return P.dequantize(_operand(data, sc, format, scaling, rows, cols, ol))


def _operand(t, sc, fmt, scaling, rows, cols, offs=None) -> LowpQTensor:
    """The portable path's operand of one copy's op tensors (NVFP4 scales split in two)."""
    if scaling in P.NV_KINDS:
        blocks, d = nv_split(sc, *P.scale_shape(scaling, rows, cols, offs))
        return LowpQTensor(t, blocks, fmt, scaling, rows, cols, offs, tensor_scale=d)
    return LowpQTensor(t, sc if scaling != "none" else None, fmt, scaling, rows, cols, offs)


def _kn_operand(b: Tensor, b_scale: Tensor, b_format: str, b_scaling: str, k: int,
                N: int) -> LowpQTensor:
    """The portable path's [N, k] operand of a copy b given as stored, [k, N]: its codes and
    its tile grid of scales transposed, the bytes of the columnwise copy."""
    sc = d = None
    if b_scaling in P.NV_KINDS:
        b_scale, d = nv_split(b_scale, *P.scale_shape(b_scaling, k, N))
    if b_scaling != "none":
        sc = b_scale.t().contiguous() if b_scaling in P.TILE_KINDS else b_scale
    if b_format == "e2m1":  # codes packed along N: unpack, transpose, pack along k
        codes = P.unpack(LowpQTensor(b, None, b_format, b_scaling, k, N)).t().contiguous()
        return LowpQTensor(P.pack_e2m1(codes), sc, b_format, b_scaling, N, k, tensor_scale=d)
    return LowpQTensor(b.t().contiguous(), sc, b_format, b_scaling, N, k, tensor_scale=d)


def _portable_scaled_mm(a: Tensor, a_scale: Tensor, a_format: str, a_scaling: str, b: Tensor,
                        b_scale: Tensor, b_format: str, b_scaling: str, k: int,
                        out_dtype: str = "f32", b_kn: bool = False, n: int = -1) -> Tensor:
    M, N = a.shape[0], kn_cols(b, b_format, n) if b_kn else b.shape[0]
    qa = _operand(a, a_scale, a_format, a_scaling, M, k)
    qb = (_kn_operand(b, b_scale, b_format, b_scaling, k, N) if b_kn else
          _operand(b, b_scale, b_format, b_scaling, N, k))
    return P.gemm(qa, qb).to(OUT_DTYPES[out_dtype])


def _portable_split_m(a, a_scale, a_format, a_scaling, b, b_scale, b_format, b_scaling, ol, k,
                      b_kn, n=-1):
    T, N = a.shape[0], kn_cols(b, b_format, n) if b_kn else b.shape[1]
    qa = _operand(a, a_scale, a_format, a_scaling, T, k)
    if b_kn:
        qb = [_kn_operand(b[g], b_scale[g] if b_scaling != "none" else b_scale, b_format,
                          b_scaling, k, N) for g in range(len(ol))]
    else:
        qb = [_operand(b[g], b_scale[g] if b_scaling != "none" else None, b_format, b_scaling,
                       N, k) for g in range(len(ol))]
    return P.grouped_gemm(qa, qb, ol)


def _portable_split_k(a, a_scale, a_format, a_scaling, b, b_scale, b_format, b_scaling, ol, k):
    N, K = a.shape[0], b.shape[0]
    ga = ol if a_scaling in P.TOKEN_BLOCK_KINDS else None
    gb = ol if b_scaling in P.TOKEN_BLOCK_KINDS else None
    sa = trim_scale(a_scale, a_scaling, N, k, ga) if a_scaling != "none" else None
    sb = trim_scale(b_scale, b_scaling, K, k, gb) if b_scaling != "none" else None
    qa = _operand(a, sa, a_format, a_scaling, N, k, ga)
    qb = _operand(b, sb, b_format, b_scaling, K, k, gb)
    return P.grouped_gemm_wgrad(qa, qb, ol)


def _portable_scaled_grouped_mm(a: Tensor, a_scale: Tensor, a_format: str, a_scaling: str,
                                b: Tensor, b_scale: Tensor, b_format: str, b_scaling: str,
                                offs: Tensor, k: int, wgrad: bool, out_dtype: str = "f32",
                                b_kn: bool = False, n: int = -1) -> Tensor:
    ol = offs.tolist()
    if wgrad:
        out = _portable_split_k(a, a_scale, a_format, a_scaling, b, b_scale, b_format,
                                b_scaling, ol, k)
    else:
        out = _portable_split_m(a, a_scale, a_format, a_scaling, b, b_scale, b_format,
                                b_scaling, ol, k, b_kn, n)
    return out.to(OUT_DTYPES[out_dtype])


def _portable_delayed_update(history: Tensor, scales: Tensor, formats: List[str], margin: float,
                             algo: str) -> None:
    """docs/numerics.md section 5 on the state's device: new scales from the amax history (rows:
    roles; scaled_max = fmax * 2^-margin in binary32, as C computes it), then the history
    rolled where this step's amax (column 0) is not zero."""
    dev = history.device
    scaled_max = torch.tensor([P.FORMATS[f].fmax for f in formats], dtype=torch.float32,
                              device=dev) * torch.exp2(torch.tensor(-margin, dtype=torch.float32,
                                                                    device=dev))
    if algo == "max":
        amax = history.max(dim=1).values  # NaN wins, as C's loop
    else:
        amax = history[:, 0].clone()
    ok = torch.isfinite(amax) & (amax > 0)
    new = scaled_max / torch.where(ok, amax, torch.ones_like(amax))
    new = torch.where(torch.isinf(new), torch.full_like(new, _FLT_MAX), new)
    scales.copy_(torch.where(ok, new, scales))
    newest = history[:, 0].clone()
    rolled = torch.roll(history, -1, dims=1)
    rolled[:, 0] = 0.0
    history.copy_(torch.where((newest != 0)[:, None], rolled, history))


_FLT_MAX = 3.4028234663852886e38


def _check_delayed_update_args(history, scales, formats, margin, algo, *,
                               eager=False) -> None:
    fn = "lowp::delayed_update"
    for name, t in (("history", history), ("scales", scales)):
        if t.dtype != torch.float32:
            raise ValueError(f"{fn}: {name} must be float32, not {t.dtype}")
    if history.dim() != 2 or not history.is_contiguous():
        raise ValueError(f"{fn}: history must be a contiguous [roles, L] tensor, got shape "
                         f"{tuple(history.shape)}")
    if tuple(scales.shape) != (history.shape[0],) or len(formats) != history.shape[0]:
        raise ValueError(f"{fn}: scales {tuple(scales.shape)} and formats ({len(formats)}) "
                         f"must hold one entry per role ({history.shape[0]})")
    for f in formats:
        _check_name(fn, "formats[i]", f, ("e4m3", "e5m2"))
    if not -1e9 < margin < 1e9:
        raise ValueError(f"{fn}: margin ({margin}) must be finite")
    _check_name(fn, "algo", algo, ("max", "most_recent"))


# ---- the fake kernels ----


def _quantize_fake(x, format, scaling, scale_mode, pow2, eps, axis, offs=None, scale=None,
                   rounding="rne", seed=0, offset=0):
    _check_quantize_args(x, format, scaling, scale_mode, pow2, eps, axis, offs, scale, rounding,
                         seed, offset)
    R, C = x.shape[-2:]
    stack = tuple(x.shape[:-2])
    sdt = scale_dtype(scaling)
    if offs is not None:
        return (x.new_empty(0, dtype=torch.uint8), x.new_empty(0, dtype=torch.uint8),
                x.new_empty(data_shape(format, C, R), dtype=torch.uint8),
                x.new_empty(op_scale_shape(scaling, C, R, offs.shape[0]), dtype=sdt))
    out = [x.new_empty(0, dtype=torch.uint8) for _ in range(4)]
    if axis in ("row", "both"):
        out[0] = x.new_empty(stack + data_shape(format, R, C), dtype=torch.uint8)
        out[1] = x.new_empty(stack + op_scale_shape(scaling, R, C), dtype=sdt)
    if axis in ("col", "both"):
        out[2] = x.new_empty(stack + data_shape(format, C, R), dtype=torch.uint8)
        out[3] = x.new_empty(stack + op_scale_shape(scaling, C, R), dtype=sdt)
    return tuple(out)


def _dequantize_fake(data, scale, format, scaling, rows, cols, offs=None):
    _check_dequantize_args(data, scale, format, scaling, rows, cols, offs)
    return data.new_empty((rows, cols), dtype=torch.float32)


def _scaled_mm_fake(a, a_scale, a_format, a_scaling, b, b_scale, b_format, b_scaling, k,
                    out_dtype="f32", b_kn=False, n=-1):
    _check_scaled_mm_args(a, a_scale, a_format, a_scaling, b, b_scale, b_format, b_scaling, k,
                          out_dtype, b_kn, n)
    return a.new_empty((a.shape[0], kn_cols(b, b_format, n) if b_kn else b.shape[0]),
                       dtype=OUT_DTYPES[out_dtype])


def _scaled_grouped_mm_fake(a, a_scale, a_format, a_scaling, b, b_scale, b_format, b_scaling,
                            offs, k, wgrad, out_dtype="f32", b_kn=False, n=-1):
    _check_grouped_args(a, a_scale, a_format, a_scaling, b, b_scale, b_format, b_scaling, offs,
                        k, wgrad, out_dtype, b_kn, n)
    odt = OUT_DTYPES[out_dtype]
    if not wgrad:
        return a.new_empty((a.shape[0], kn_cols(b, b_format, n) if b_kn else b.shape[1]),
                           dtype=odt)
    return a.new_empty((offs.shape[0], a.shape[0], b.shape[0]), dtype=odt)


# ---- definitions and registration ----

_SCHEMAS = {
    "quantize": "(Tensor x, str format, str scaling, str scale_mode, SymInt pow2, float eps, "
                "str axis, Tensor? offs=None, Tensor? scale=None, str rounding=\"rne\", "
                "SymInt seed=0, SymInt offset=0) -> (Tensor, Tensor, Tensor, Tensor)",
    "dequantize": "(Tensor data, Tensor scale, str format, str scaling, SymInt rows, "
                  "SymInt cols, Tensor? offs=None) -> Tensor",
    "scaled_mm": "(Tensor a, Tensor a_scale, str a_format, str a_scaling, Tensor b, "
                 "Tensor b_scale, str b_format, str b_scaling, SymInt k, str out_dtype=\"f32\", "
                 "bool b_kn=False, SymInt n=-1) -> Tensor",
    "scaled_grouped_mm": "(Tensor a, Tensor a_scale, str a_format, str a_scaling, Tensor b, "
                         "Tensor b_scale, str b_format, str b_scaling, Tensor offs, SymInt k, "
                         "bool wgrad, str out_dtype=\"f32\", bool b_kn=False, "
                         "SymInt n=-1) -> Tensor",
}

_SCHEMAS["hadamard16"] = ("(Tensor x, SymInt seed, SymInt offset, Tensor? offs=None) -> Tensor")


def _check_hadamard_args(x, seed, offset, offs=None, *, eager=False) -> None:
    fn = "lowp::hadamard16"
    if x.dtype not in _PLAIN_DTYPES or x.dim() != 2:
        raise ValueError(f"{fn}: x must be a 2-D float32 or bfloat16 tensor, got {x.dtype} of "
                         f"shape {tuple(x.shape)}")
    _check_rounding(fn, "rne", seed, offset, "e2m1", "mx32")
    if offs is not None and offs.dim() != 1:
        raise ValueError(f"{fn}: offs must be 1-D, got shape {tuple(offs.shape)}")
    if offs is not None and eager:
        _check_offs_values(fn, offs.tolist(), x.shape[1])


def _hadamard_fake(x, seed, offset, offs=None):
    _check_hadamard_args(x, seed, offset, offs)
    return x.new_empty(x.shape, dtype=torch.float32)


def _portable_hadamard(x, seed, offset, offs=None):
    """lowp.torch.hadamard along x's rows (its torch ops: any device)."""
    return hadamard(x, int(seed), int(offset), None if offs is None else offs.tolist())


_SCHEMAS["delayed_update"] = ("(Tensor(a!) history, Tensor(b!) scales, str[] formats, "
                              "float margin, str algo) -> ()")


def _delayed_update_fake(history, scales, formats, margin, algo):
    _check_delayed_update_args(history, scales, formats, margin, algo)


# name -> (argument check, fake kernel, portable kernel, native CPU kernel)
_OPS = {
    "quantize": (_check_quantize_args, _quantize_fake, _portable_quantize, native.quantize),
    "dequantize": (_check_dequantize_args, _dequantize_fake, _portable_dequantize,
                   native.dequantize),
    "scaled_mm": (_check_scaled_mm_args, _scaled_mm_fake, _portable_scaled_mm,
                  native.scaled_mm),
    "scaled_grouped_mm": (_check_grouped_args, _scaled_grouped_mm_fake,
                          _portable_scaled_grouped_mm, native.scaled_grouped_mm),
    "delayed_update": (_check_delayed_update_args, _delayed_update_fake,
                       _portable_delayed_update, native.delayed_update),
    "hadamard16": (_check_hadamard_args, _hadamard_fake, _portable_hadamard, native.hadamard16),
}


# The device kernel table's router (set by lowp.torch.device_kernels when it loads):
# _ROUTER(device_type, op name, native, args, kwargs) -> (kernel name, fn) or None;
# _SERVES(device_type): whether the table runs kernels on that device now.
_ROUTER = None
_SERVES = None


def _kernel(name: str, check, impl, path: str, device_type: Optional[str] = None):
    """impl after check(..., eager=True), counted in stats() under path. With device_type,
    a trampoline: a device kernel of the table, where one serves the call, runs instead."""

    @functools.wraps(impl)
    def run(*args, **kwargs):
        check(*args, **kwargs, eager=True)
        if device_type is not None and _ROUTER is not None:
            hit = _ROUTER(device_type, name, path == "native", args, kwargs)
            if hit is not None:
                _count(name, "device")
                _STATS[f"device.{hit[0]}"] += 1
                return hit[1](*args, **kwargs)
        _count(name, path)
        return impl(*args, **kwargs)

    return run


_LIB = torch.library.Library("lowp", "DEF")
_PORTABLE = {}  # OpOverload -> the portable kernel (for kernel_preference)
for _name, (_check, _fake, _port, _nat) in _OPS.items():
    _LIB.define(_name + _SCHEMAS[_name])
    _PORTABLE[getattr(torch.ops.lowp, _name).default] = _kernel(_name, _check, _port, "portable")
    _LIB.impl(_name, _PORTABLE[getattr(torch.ops.lowp, _name).default],
              "CompositeExplicitAutograd")
    if native.available():
        _LIB.impl(_name, _kernel(_name, _check, _nat, "native", "cpu"), "CPU")
    torch.library.register_fake("lowp::" + _name, _fake, lib=_LIB)
    # lowp::<name>.portable: the portable kernel on every device, an overload of its own, so
    # that KernelPreference.PORTABLE holds inside torch.compile (no mode to enter there)
    _LIB.define(_name + ".portable" + _SCHEMAS[_name])
    _LIB.impl(_name + ".portable", _kernel(_name, _check, _port, "portable"),
              "CompositeExplicitAutograd")
    torch.library.register_fake(f"lowp::{_name}.portable", _fake, lib=_LIB)

quantize_op = torch.ops.lowp.quantize
dequantize_op = torch.ops.lowp.dequantize
scaled_mm_op = torch.ops.lowp.scaled_mm
scaled_grouped_mm_op = torch.ops.lowp.scaled_grouped_mm


_TRAMPOLINES = set()  # (op name, dispatch key) given a device-table trampoline


def _install_trampoline(name: str, device_type: str) -> None:
    """Route op `name` on device_type's dispatch key through the device kernel table (once;
    the CPU's native kernel already asks the table)."""
    key = _dispatch_key(device_type)
    if key == "Meta":
        raise ValueError("device_type ('meta') runs the fake kernels only")
    if (name, key) in _TRAMPOLINES or (key == "CPU" and native.available()):
        return
    check, _, port, _ = _OPS[name]
    _LIB.impl(name, _kernel(name, check, port, "portable", device_type), key)
    _TRAMPOLINES.add((name, key))


def _dispatch_key(device_type: str) -> str:
    """The dispatch key of a device type's dense tensors ("cpu" -> "CPU", an out-of-tree
    backend's name -> "PrivateUse1")."""
    if device_type == torch._C._get_privateuse1_backend_name():
        return "PrivateUse1"
    key = "Meta" if device_type == "meta" else device_type.upper()
    if key not in torch._C.DispatchKey.__members__:
        raise ValueError(f"device_type ({device_type!r}) has no dispatch key")
    return key


def has_native_kernel(device) -> bool:
    """Whether lowp::quantize has a kernel of its own for device's dispatch key (not the
    portable default)."""
    dt = torch.device(device).type
    try:
        key = _dispatch_key(dt)
    except ValueError:
        return False
    if key == "Meta":  # the fake kernels serve it: shapes only
        return False
    if ("quantize", key) in _TRAMPOLINES:  # the table's trampoline: kernels when enabled
        return _SERVES is not None and _SERVES(dt)
    return torch._C._dispatch_has_kernel_for_dispatch_key("lowp::quantize", key)


# ---- kernel preference ----


class _PortableMode(TorchDispatchMode):
    """Runs the lowp ops' portable kernels whatever the device; every other op as usual."""

    supports_higher_order_operators = True  # (functionalized mutating ops come as HOPs)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **(kwargs or {}))  # not a lowp op: as without this mode
        kwargs = kwargs or {}
        kernel = _PORTABLE.get(func)
        # real tensors only: FakeTensors (tracing, opcheck) go on to the fake kernel
        if kernel is not None and all(type(t) in (Tensor, torch.nn.Parameter) for t in
                                      (*args, *kwargs.values()) if isinstance(t, Tensor)):
            return kernel(*args, **kwargs)  # (the mode is off while it handles an op)
        return func(*args, **kwargs)


def _preference(pref) -> KernelPreference:
    try:
        return KernelPreference(getattr(pref, "value", pref))
    except ValueError:
        raise ValueError(f"kernel preference ({pref!r}) is not one of "
                         f"{', '.join(p.value for p in KernelPreference)}") from None


def check_preference(pref, device) -> KernelPreference:
    """pref as a KernelPreference; NATIVE needs native kernels for device (a ValueError
    otherwise)."""
    p = _preference(pref)
    if p is KernelPreference.NATIVE and not has_native_kernel(device):
        raise ValueError(f"kernel preference native: {torch.device(device).type} has no native "
                         "lowp kernels registered (use auto or portable)")
    return p


@contextlib.contextmanager
def kernel_preference(pref, device=None):
    """Within the block, the lowp ops run the kernels `pref` names (a KernelPreference or its
    value): PORTABLE enters a dispatch mode that runs the portable kernels; NATIVE checks that
    `device` (when given) has native kernels; AUTO changes nothing."""
    p = _preference(pref) if device is None else check_preference(pref, device)
    if p is not KernelPreference.PORTABLE:
        yield
        return
    with _PortableMode():
        yield
