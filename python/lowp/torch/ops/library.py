"""The `lowp::` torch operators: their schemas, argument checks, fake kernels and kernels.

Four operators in the `lowp` namespace, registered with `torch.library.custom_op` and given
fake (meta) kernels so that FakeTensor tracing and `torch.compile` see ordinary ops:

  lowp::quantize(x, format, scaling, scale_mode, pow2, eps, axis, offs, scale)
        -> (data, scale, data_col, scale_col)     (empty tensors for a copy not asked for)
  lowp::dequantize(data, scale, format, scaling, rows, cols, offs) -> float32 [rows, cols]
  lowp::scaled_mm(a, a_scale, a_format, a_scaling, b, b_scale, b_format, b_scaling, k)
        -> float32 A . B^T (b_kn=True: A . B, b given as stored [k, N])
  lowp::scaled_grouped_mm(a, ..., b, ..., offs, k, wgrad) -> split-M [T, N] or split-K [G, N, K]

Each op runs lowp's native kernels (the C extension `lowp._lowp`) for CPU tensors, and the
portable torch implementation (`lowp.torch.portable`, same bytes) for tensors on any other
device, or on the CPU inside `force_portable()`. `stats()` counts which path ran. The
autograd functions below call the ops' implementations directly in eager mode on plain
tensors (the dispatcher's Python path cost as much as a small expert GEMM) and through
`torch.ops.lowp` when compiling, tracing or on tensor subclasses. The native path passes CPU
tensors to the extension as raw memory, (data_ptr, nbytes), without numpy views.

A grouped columnwise copy (quantized along tokens with `offs`) has a data-dependent number of
scale blocks; the op returns its scales zero-padded to a static bound, [K, ceil(T/bs) + G]
(columns past the real blocks are 0), so its fake kernel has a static shape.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections import Counter
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import portable as P

__all__ = [
    "quantize_op",
    "dequantize_op",
    "scaled_mm_op",
    "scaled_grouped_mm_op",
    "KN_KINDS",
    "stats",
    "reset_stats",
    "force_portable",
    "native_available",
]

# ---- path selection and counters ----

_STATS: Counter = Counter()
_LOCAL = threading.local()

try:  # lowp's numpy API over the C extension (absent in a checkout without `make build`)
    from ... import _arrays
    from ... import _numpy_api as _lp
    from ..._numpy_api import _lowp as _ext
except Exception:  # pragma: no cover - depends on the build
    _lp = _ext = None


def native_available() -> bool:
    """True when lowp's C extension is importable (CPU tensors then run natively)."""
    return _ext is not None


def stats() -> dict:
    """Counters of the ops that ran: {"native": n, "portable": n, "<op>.native": n, ...}."""
    out = {"native": 0, "portable": 0}
    out.update(_STATS)
    return out


def reset_stats() -> None:
    _STATS.clear()


@contextlib.contextmanager
def force_portable():
    """Run CPU tensors through the portable torch path too (for tests)."""
    prev = getattr(_LOCAL, "portable", False)
    _LOCAL.portable = True
    try:
        yield
    finally:
        _LOCAL.portable = prev


def _native(t: Tensor) -> bool:
    return _ext is not None and t.device.type == "cpu" and not getattr(_LOCAL, "portable", False)


def _count(op: str, native: bool) -> None:
    path = "native" if native else "portable"
    _STATS[path] += 1
    _STATS[f"{op}.{path}"] += 1


def _threads() -> int:
    return _lp.get_threads()


# ---- numpy views of CPU tensors for the extension's buffer arguments ----


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


_XFMT = {torch.float32: "f32", torch.bfloat16: "bf16"}


def _desc(data: Tensor, scale: Optional[Tensor], fmt: str, scaling: str, rows: int, cols: int,
          offs: Optional[Tensor] = None):
    if scaling == "none":
        fmt = _XFMT[data.dtype]
        scale = None
    return (fmt, scaling, int(rows), int(cols), _buf(data), _buf(scale), _buf(offs))


# ---- shapes ----


def _data_shape(fmt: str, rows: int, cols: int):
    return (rows, (cols + 1) // 2) if fmt == "e2m1" else (rows, cols)


def _scale_dtype(scaling: str):
    return torch.uint8 if scaling in P.E8M0_KINDS else torch.float32


def _grouped_scale_bound(scaling: str, tokens: int, groups: int) -> int:
    bs = P.block_of(scaling)
    return (tokens + bs - 1) // bs + groups


def _empty(dev) -> Tensor:
    return torch.empty(0, dtype=torch.uint8, device=dev)


# ---- argument checks (the ops' implementations and fake kernels alike) ----
# The extension checks only that each buffer holds enough bytes: a `k` smaller than the
# operands', float32 values read as codes or fewer groups than experts would pass it. Every
# shape here is static, so the fake kernels run the same checks and torch.compile / opcheck
# see the errors eager mode gives.

_QFORMATS = ("e4m3", "e5m2", "e2m1")
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
        if data.dtype not in _XFMT:
            raise ValueError(f"{fn}: {dn} ({kname} none) must be float32 or bfloat16, not "
                             f"{data.dtype}")
        want = stack + (rows, cols)
    else:
        _check_name(fn, fname, fmt, _QFORMATS)
        if data.dtype != torch.uint8:
            raise ValueError(f"{fn}: {dn} holds {fmt} codes and must be torch.uint8, not "
                             f"{data.dtype}")
        want = stack + _data_shape(fmt, rows, cols)
    if tuple(data.shape) != want:
        what = f"{fmt} codes" if scaling != "none" else "values"
        n = f"{stack[0]} x " if stack else ""
        raise ValueError(f"{fn}: {dn} has shape {tuple(data.shape)}, but {n}[rows, cols] = "
                         f"[{rows}, {cols}] {what} are stored as {want}")
    if scaling == "none":
        return
    if groups is not None:
        want = stack + (rows, _grouped_scale_bound(scaling, cols, groups))
    else:
        want = stack + tuple(P.scale_shape(scaling, rows, cols))
    if scale.dtype != _scale_dtype(scaling) or tuple(scale.shape) != want:
        raise ValueError(f"{fn}: {sn} ({scale.dtype}, shape {tuple(scale.shape)}) does not "
                         f"match {dn}: {scaling} scales of [{rows}, {cols}] are "
                         f"{_scale_dtype(scaling)} of shape {want}")


def _check_k(fn: str, k, a: Tensor, a_format: str, a_scaling: str) -> None:
    """k, the contracted length, against a's stored columns."""
    if isinstance(k, bool) or not isinstance(k, (int, torch.SymInt)) or k < 0:
        raise ValueError(f"{fn}: k ({k!r}) must be an int >= 0")
    if a.dim() != 2:
        raise ValueError(f"{fn}: a must be 2-D, got shape {tuple(a.shape)}")
    cols = _data_shape(a_format, 1, k)[1] if a_scaling != "none" else k
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
    _check_name(fn, "out_dtype", out_dtype, tuple(_OUT_DTYPES))


def _check_quantize_args(x, format, scaling, scale_mode, pow2, eps, axis, offs=None,
                         scale=None, *, eager=False) -> None:
    fn = "lowp::quantize"
    if not x.is_floating_point():
        raise TypeError(f"{fn}: x must be a floating-point tensor, got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"{fn}: x must be 2-D, got shape {tuple(x.shape)}")
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
    if pow2 >= 0 and scaling in P.E8M0_KINDS:
        raise ValueError(f"{fn}: pow2 ({pow2}) applies to the binary32 scalings, not {scaling} "
                         "(pass -1)")
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
                          out_dtype="f32", b_kn=False, *, eager=False) -> None:
    fn = "lowp::scaled_mm"
    _check_out_dtype(fn, out_dtype)
    _check_k(fn, k, a, a_format, a_scaling)
    _check_operand(fn, "a", a, a_scale, a_format, a_scaling, a.shape[0], k)
    if b.dim() != 2:
        raise ValueError(f"{fn}: b must be 2-D, got shape {tuple(b.shape)}")
    if b_kn:
        _kn_check(b_scaling, fn)
        _check_operand(fn, "b", b, b_scale, b_format, b_scaling, k, b.shape[1])
    else:
        _check_operand(fn, "b", b, b_scale, b_format, b_scaling, b.shape[0], k)


def _check_grouped_args(a, a_scale, a_format, a_scaling, b, b_scale, b_format, b_scaling, offs,
                        k, wgrad, out_dtype="f32", b_kn=False, *, eager=False) -> None:
    fn = "lowp::scaled_grouped_mm"
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
            _kn_check(b_scaling, fn)
        rows, cols = (k, b.shape[2]) if b_kn else (b.shape[1], k)
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


def _checked(check, impl):
    """The registered op's implementation: impl after check(..., eager=True), the checks its
    fake kernel runs plus those of values (offs). The autograd functions call impl directly in
    eager mode, on operands they made themselves (the checks cost about a tenth of a small
    GEMM)."""

    @functools.wraps(impl)
    def run(*args, **kwargs):
        check(*args, **kwargs, eager=True)
        return impl(*args, **kwargs)

    return run


# ---- lowp::quantize ----


def _mode_arg(scaling: str, mode: str):
    return mode if scaling in P.E8M0_KINDS else None


def _pow2_arg(scaling: str, p2):
    return None if scaling in P.E8M0_KINDS else p2


def _qt(data: Tensor, scale: Tensor, fmt: str, scaling: str, shape):
    """A rowwise lowp.QTensor over existing tensors (zero-copy), or the plain tensor itself."""
    if scaling == "none":
        return data
    return _lp.QTensor(data, scale, fmt, scaling, shape)


def _quantize_impl(x: Tensor, format: str, scaling: str, scale_mode: str, pow2: int, eps: float,
                axis: str, offs: Optional[Tensor] = None,
                scale: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Quantize 2-D x; see the module docstring. scale_mode "" and pow2 -1 take the defaults;
    `scale` (tensorwise) is the delayed scale; `offs` (axis "col") quantizes along tokens."""
    R, C = x.shape
    mode = P.default_mode(scaling, scale_mode or None)
    p2 = None if pow2 < 0 else bool(pow2)
    dev = x.device
    native = _native(x)
    _count("quantize", native)
    if native and x.dtype in _XFMT:
        return _quantize_native(x.contiguous(), format, scaling, mode, p2, eps, axis, offs, scale)
    if offs is not None:
        G = offs.numel()
        bound = _grouped_scale_bound(scaling, R, G)
        sc_out = torch.zeros((C, bound), dtype=_scale_dtype(scaling), device=dev)
        if native:
            q = _lp.quantize(x, format, scaling, _mode_arg(scaling, mode), "col", eps,
                             _pow2_arg(scaling, p2), offs=offs.to(torch.int32))
            data, sc = q.data_col, q.scale_col
        else:
            q = P.quantize_grouped(x, offs.tolist(), format, scaling, mode, eps, p2)
            data, sc = q.data, q.scale
        sc_out[:, : sc.shape[1]] = sc
        return _empty(dev), _empty(dev), data, sc_out
    if native:
        s = None if scale is None else float(scale.reshape(()).item())
        q = _lp.quantize(x, format, scaling, _mode_arg(scaling, mode), axis, eps,
                         _pow2_arg(scaling, p2), scale=s)
        rd, rs, cd, cs = q.data, q.scale, q.data_col, q.scale_col
        return (rd if rd is not None else _empty(dev), rs if rs is not None else _empty(dev),
                cd if cd is not None else _empty(dev), cs if cs is not None else _empty(dev))
    row, col = P.quantize(x, format, scaling, mode, axis, eps, p2, scale)
    return (row.data if row else _empty(dev), row.scale if row else _empty(dev),
            col.data if col else _empty(dev), col.scale if col else _empty(dev))


def _quantize_native(x, fmt, scaling, mode, p2, eps, axis, offs, scale, out=None):
    """quantize_op on lowp's kernels, straight into torch tensors (x contiguous, 2-D); `out`
    (row axes only): the (row data, row scales, col data, col scales) to write, contiguous
    and shaped by the C layout (None for an axis not wanted)."""
    R, C = x.shape
    e8 = scaling in P.E8M0_KINDS
    mode_arg = mode if e8 else "default"
    pow2 = -1 if (e8 or p2 is None) else int(p2)
    thr = _threads()
    xb = _buf(x)
    xf = _XFMT[x.dtype]

    def alloc(rows, cols, o=None):  # one copy's codes and scales, shaped by the C layout
        _, _, sr, sc, _ = _ext.layout(fmt, scaling, rows, cols, o)
        return (torch.empty(_data_shape(fmt, rows, cols), dtype=torch.uint8),
                torch.empty((sr, sc), dtype=_scale_dtype(scaling)))

    if offs is not None:
        o32 = offs.to(torch.int32).contiguous()
        ob = _buf(o32)
        cd, cs = alloc(C, R, ob)
        _ext.quantize_grouped(xb, xf, R, C, fmt, scaling, ob, _buf(cd), _buf(cs), mode_arg, pow2,
                              float(eps), thr, 0)
        sc_out = torch.zeros((C, _grouped_scale_bound(scaling, R, o32.numel())), dtype=cs.dtype)
        sc_out[:, : cs.shape[1]] = cs
        return _empty(x.device), _empty(x.device), cd, sc_out
    rd = rs = cd = cs = None
    if out is not None:
        rd, rs, cd, cs = out
    else:
        if axis in ("row", "both"):
            rd, rs = alloc(R, C)
        if axis in ("col", "both"):
            cd, cs = alloc(C, R)
    s = None if scale is None else float(scale.reshape(()).item())
    _ext.quantize(xb, xf, R, C, fmt, scaling, _buf(rd), _buf(rs), _buf(cd), _buf(cs), mode_arg,
                  pow2, float(eps), thr, 0, s, False)
    return tuple(_empty(x.device) if t is None else t for t in (rd, rs, cd, cs))


quantize_op = torch.library.custom_op("lowp::quantize", mutates_args=())(
    _checked(_check_quantize_args, _quantize_impl))


@quantize_op.register_fake
def _quantize_fake(x, format, scaling, scale_mode, pow2, eps, axis, offs=None, scale=None):
    _check_quantize_args(x, format, scaling, scale_mode, pow2, eps, axis, offs, scale)
    R, C = x.shape
    sdt = _scale_dtype(scaling)
    if offs is not None:
        bound = _grouped_scale_bound(scaling, R, offs.shape[0])
        return (x.new_empty(0, dtype=torch.uint8), x.new_empty(0, dtype=torch.uint8),
                x.new_empty(_data_shape(format, C, R), dtype=torch.uint8),
                x.new_empty((C, bound), dtype=sdt))
    out = [x.new_empty(0, dtype=torch.uint8) for _ in range(4)]
    if axis in ("row", "both"):
        out[0] = x.new_empty(_data_shape(format, R, C), dtype=torch.uint8)
        out[1] = x.new_empty(P.scale_shape(scaling, R, C), dtype=sdt)
    if axis in ("col", "both"):
        out[2] = x.new_empty(_data_shape(format, C, R), dtype=torch.uint8)
        out[3] = x.new_empty(P.scale_shape(scaling, C, R), dtype=sdt)
    return tuple(out)


# ---- lowp::dequantize ----


def _trim_scale(scale: Tensor, scaling: str, rows: int, cols: int, offs) -> Tensor:
    """The real blocks of a (possibly padded) grouped scale array."""
    if offs is None:
        return scale
    nb = P.scale_shape(scaling, rows, cols, offs)[1]
    return scale[:, :nb].contiguous()


def _dequantize_impl(data: Tensor, scale: Tensor, format: str, scaling: str, rows: int, cols: int,
                  offs: Optional[Tensor] = None) -> Tensor:
    """float32 [rows, cols] values of a quantized copy."""
    native = _native(data)
    _count("dequantize", native)
    ol = offs.tolist() if offs is not None else None
    sc = _trim_scale(scale, scaling, rows, cols, ol)
    if native and ol is None:
        return _lp.dequantize(_qt(data, sc, format, scaling, (rows, cols)))
    if native:  # a grouped columnwise copy: [rows = features, cols = tokens]
        q = _lp.QTensor(None, None, format, scaling, (cols, rows), data_col=data, scale_col=sc,
                        offs=offs.to(torch.int32))
        return _lp.dequantize(q, axis="col").t().contiguous()
    return P.dequantize(P.QT(data, sc, format, scaling, rows, cols, ol))


dequantize_op = torch.library.custom_op("lowp::dequantize", mutates_args=())(
    _checked(_check_dequantize_args, _dequantize_impl))


@dequantize_op.register_fake
def _dequantize_fake(data, scale, format, scaling, rows, cols, offs=None):
    _check_dequantize_args(data, scale, format, scaling, rows, cols, offs)
    return data.new_empty((rows, cols), dtype=torch.float32)


# ---- lowp::scaled_mm ----

_OUT_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


# b_kn: the kinds whose columnwise copy is the rowwise copy transposed (lowp_gemm_kn).
KN_KINDS = ("none", "tensor", "block128x128", "block32x32")


def _kn_check(b_scaling: str, fn: str):
    if b_scaling not in KN_KINDS:
        raise ValueError(f"{fn}: b_scaling ({b_scaling}) runs along one axis, so b cannot be "
                         f"read as stored [K, N] (kinds that can: {', '.join(KN_KINDS)})")


def _kn_qt(b: Tensor, b_scale: Tensor, b_format: str, b_scaling: str, k: int, N: int) -> P.QT:
    """The portable path's [N, k] operand of a copy b given as stored, [k, N]: its codes and
    its tile grid of scales transposed, the bytes of the columnwise copy."""
    sc = None
    if b_scaling != "none":
        sc = b_scale.t().contiguous() if b_scaling in P.TILE_KINDS else b_scale
    return P.QT(b.t().contiguous(), sc, b_format, b_scaling, N, k)


def _scaled_mm_impl(a: Tensor, a_scale: Tensor, a_format: str, a_scaling: str, b: Tensor,
                 b_scale: Tensor, b_format: str, b_scaling: str, k: int,
                 out_dtype: str = "f32", b_kn: bool = False) -> Tensor:
    """C[M, N] = A[M, k] . B[N, k]^T, accumulated in binary32 and returned as float32 or
    (out_dtype "bf16") rounded once to bfloat16. Scaling "none": a/b are float32 or bfloat16.
    b_kn: b is given as stored, [k, N] (the bits of B's columnwise copy; KN_KINDS only)."""
    M, N = a.shape[0], b.shape[1] if b_kn else b.shape[0]
    if b_kn:
        _kn_check(b_scaling, "lowp::scaled_mm")
    native = _native(a)
    _count("scaled_mm", native)
    if native:
        out = torch.empty((M, N), dtype=_OUT_DTYPES[out_dtype])
        bd = (_desc(b, b_scale, b_format, b_scaling, k, N) if b_kn
              else _desc(b, b_scale, b_format, b_scaling, N, k))
        _ext.gemm(_desc(a, a_scale, a_format, a_scaling, M, k), bd, _buf(out), out_dtype, M, N,
                  False, _threads(), 0, b_kn)
        return out
    qa = P.QT(a, a_scale if a_scaling != "none" else None, a_format, a_scaling, M, k)
    qb = (_kn_qt(b, b_scale, b_format, b_scaling, k, N) if b_kn else
          P.QT(b, b_scale if b_scaling != "none" else None, b_format, b_scaling, N, k))
    return P.gemm(qa, qb).to(_OUT_DTYPES[out_dtype])


scaled_mm_op = torch.library.custom_op("lowp::scaled_mm", mutates_args=())(
    _checked(_check_scaled_mm_args, _scaled_mm_impl))


@scaled_mm_op.register_fake
def _scaled_mm_fake(a, a_scale, a_format, a_scaling, b, b_scale, b_format, b_scaling, k,
                    out_dtype="f32", b_kn=False):
    _check_scaled_mm_args(a, a_scale, a_format, a_scaling, b, b_scale, b_format, b_scaling, k,
                          out_dtype, b_kn)
    return a.new_empty((a.shape[0], b.shape[1] if b_kn else b.shape[0]),
                       dtype=_OUT_DTYPES[out_dtype])


# ---- lowp::scaled_grouped_mm ----


def _scaled_grouped_mm_impl(a: Tensor, a_scale: Tensor, a_format: str, a_scaling: str, b: Tensor,
                         b_scale: Tensor, b_format: str, b_scaling: str, offs: Tensor, k: int,
                         wgrad: bool, out_dtype: str = "f32", b_kn: bool = False) -> Tensor:
    """Split-M (wgrad False): a [T, k] rowwise, b [G, N, k] (scales [G, ...]), out [T, N] with
    rows past offs[-1] zero; b_kn: b [G, k, N] as stored (as in scaled_mm). Split-K (wgrad
    True): a = dY^T [N, T], b = X^T [K, T], both quantized along the tokens with offs (scales
    padded as quantize returns them); k = T; out [G, N, K]. out_dtype "bf16": the binary32
    sums rounded once to bfloat16."""
    odt = _OUT_DTYPES[out_dtype]
    if b_kn and wgrad:
        raise ValueError("lowp::scaled_grouped_mm: b_kn is for split-M (wgrad=False)")
    if b_kn:
        _kn_check(b_scaling, "lowp::scaled_grouped_mm")
    native = _native(a)
    _count("scaled_grouped_mm", native)
    ol = offs.tolist()
    G = len(ol)
    if not wgrad:
        T, N = a.shape[0], b.shape[2] if b_kn else b.shape[1]
        if native:
            # lowp writes every row of every group and leaves the rows past offs[-1]: only
            # those are zeroed (a zero-filled output cost 5% of a medium MoE step).
            out = torch.empty((T, N), dtype=odt)
            out[(ol[-1] if ol else 0):].zero_()
            o32 = offs.to(torch.int32).contiguous()
            bd = (_desc(b, b_scale, b_format, b_scaling, k, N) if b_kn
                  else _desc(b, b_scale, b_format, b_scaling, N, k))
            _ext.grouped_gemm(_desc(a, a_scale, a_format, a_scaling, T, k), bd, G, _buf(o32),
                              _buf(out), out_dtype, T, N, False, _threads(), 0, b_kn)
            return out
        qa = P.QT(a, a_scale if a_scaling != "none" else None, a_format, a_scaling, T, k)
        if b_kn:
            qb = [_kn_qt(b[g], b_scale[g] if b_scaling != "none" else b_scale, b_format,
                         b_scaling, k, N) for g in range(G)]
        else:
            qb = [P.QT(b[g], b_scale[g] if b_scaling != "none" else None, b_format, b_scaling,
                       N, k) for g in range(G)]
        return P.grouped_gemm(qa, qb, ol).to(odt)
    N, K = a.shape[0], b.shape[0]
    ga = ol if a_scaling in P.TOKEN_BLOCK_KINDS else None
    gb = ol if b_scaling in P.TOKEN_BLOCK_KINDS else None
    sa = _trim_scale(a_scale, a_scaling, N, k, ga) if a_scaling != "none" else None
    sb = _trim_scale(b_scale, b_scaling, K, k, gb) if b_scaling != "none" else None
    if native:  # the raw call: tensor/row copies carry no groups, which lowp.grouped_gemm wants
        out = torch.empty((G, N, K), dtype=odt)  # lowp writes every group (empty ones: 0)
        o32 = offs.to(torch.int32).contiguous()
        _ext.grouped_gemm_wgrad(_desc(a, sa, a_format, a_scaling, N, k, o32 if ga else None),
                                _desc(b, sb, b_format, b_scaling, K, k, o32 if gb else None),
                                _buf(o32), _buf(out), out_dtype, G * N, K, False, _threads(), 0)
        return out
    qa = P.QT(a, sa, a_format, a_scaling, N, k, ga)
    qb = P.QT(b, sb, b_format, b_scaling, K, k, gb)
    return P.grouped_gemm_wgrad(qa, qb, ol).to(odt)


scaled_grouped_mm_op = torch.library.custom_op("lowp::scaled_grouped_mm", mutates_args=())(
    _checked(_check_grouped_args, _scaled_grouped_mm_impl))


@scaled_grouped_mm_op.register_fake
def _scaled_grouped_mm_fake(a, a_scale, a_format, a_scaling, b, b_scale, b_format, b_scaling,
                            offs, k, wgrad, out_dtype="f32", b_kn=False):
    _check_grouped_args(a, a_scale, a_format, a_scaling, b, b_scale, b_format, b_scaling, offs,
                        k, wgrad, out_dtype, b_kn)
    odt = _OUT_DTYPES[out_dtype]
    if not wgrad:
        return a.new_empty((a.shape[0], b.shape[2] if b_kn else b.shape[1]), dtype=odt)
    return a.new_empty((offs.shape[0], a.shape[0], b.shape[0]), dtype=odt)

