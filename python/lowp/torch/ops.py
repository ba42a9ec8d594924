"""lowp's torch operators and the low-precision autograd mm / linear / grouped mm.

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

The autograd functions follow the C training layer (src/train/linear.c): the forward GEMM
multiplies X rowwise by W rowwise, the input-gradient GEMM dY rowwise by W's columnwise copy,
or, where that copy would be the forward copy transposed (plain weights, tensorwise and the
32x32 and 128x128 tilings), by the forward copy itself read as stored (b_kn: one copy), the
weight-gradient GEMM dY's columnwise copy by X's columnwise copy (grouped: along each group's
tokens, no block straddling a group). A GEMM whose two operands are not both quantized runs in
BF16 (both operands rounded to BF16, binary32 accumulation). Gradients are straight-through.

Autocast (the rule of ``_autocast.py``): linear / mm / grouped_mm return the autocast dtype of
x's own device type when autocast is enabled there (F.linear and torch.mm do the same under
autocast), else x's dtype; a bias is added in binary32 to the unrounded GEMM result before that
one rounding. The gradients come back in the dtypes of x, w and bias. The GEMMs keep the
recipe's precision whatever autocast says, and the four lowp:: operators are exact: their
output dtypes are their arguments' (the portable path turns autocast off around its matmuls).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections import Counter
from typing import List, Optional, Tuple

import torch
from torch import Tensor
from torch.multiprocessing.reductions import StorageWeakRef

from . import _weight_epochs as _epochs
from . import portable as P
from ._autocast import exact, out_dtype as _autocast_out
from .config import MatmulSpec, OperandSpec, resolve_config

__all__ = [
    "linear",
    "mm",
    "grouped_mm",
    "WeightCache",
    "stats",
    "reset_stats",
    "force_portable",
    "native_available",
]

# ---- path selection and counters ----

_STATS: Counter = Counter()
_LOCAL = threading.local()

try:  # lowp's numpy API over the C extension (absent in a checkout without `make build`)
    from .. import _arrays
    from .. import _numpy_api as _lp
    from .._numpy_api import _lowp as _ext
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
    want_row, want_col = axis in ("row", "both"), axis in ("col", "both")
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


# ---- operands of the autograd functions ----


class _Op:
    """A GEMM operand as the ops see it: tensors plus names (scaling "none": plain bf16/f32)."""

    __slots__ = ("data", "scale", "format", "scaling", "rows", "cols", "grouped")

    def __init__(self, data, scale, fmt, scaling, rows, cols, grouped=False):
        self.data, self.scale, self.format, self.scaling = data, scale, fmt, scaling
        self.rows, self.cols, self.grouped = rows, cols, grouped


def _plain(x: Tensor) -> _Op:
    """BF16 operand (C rounds every unquantized GEMM operand to BF16)."""
    b = x.to(torch.bfloat16).contiguous()
    return _Op(b, _empty(x.device), "bf16", "none", b.shape[0], b.shape[1])


def _direct(*ts) -> bool:
    """Whether to call an op's implementation directly rather than through torch.ops.lowp: in
    eager mode on plain tensors. The dispatcher's Python path (schema checks, redispatch) cost
    about as much as a small MoE GEMM; torch.compile, FakeTensor and other subclasses still
    see the registered ops."""
    return not torch.compiler.is_compiling() and all(
        t is None or type(t) in _PLAIN_TYPES for t in ts)


_PLAIN_TYPES = (Tensor, torch.nn.Parameter)


def _quant(x: Tensor, s: OperandSpec, axis: str, scale: Optional[Tensor] = None,
           offs: Optional[Tensor] = None):
    """(row _Op or None, col _Op or None) of x [R, C] per spec s."""
    R, C = x.shape
    mode = s.scale_mode or ""
    pow2 = -1 if s.pow2 is None else int(s.pow2)
    op = _quantize_impl if _direct(x, offs, scale) else torch.ops.lowp.quantize
    rd, rs, cd, cs = op(x, s.format, s.scaling, mode, pow2, 0.0, axis, offs, scale)
    row = _Op(rd, rs, s.format, s.scaling, R, C) if axis in ("row", "both") else None
    col = (_Op(cd, cs, s.format, s.scaling, C, R, offs is not None)
           if axis in ("col", "both") else None)
    return row, col


def _x32(x: Tensor) -> Tensor:
    """The kernels read float32 or bfloat16; anything else goes through float32. A negative
    view is resolved (its memory holds the values unnegated; the memo keys on memory)."""
    x = x if x.dtype in (torch.float32, torch.bfloat16) else x.to(torch.float32)
    return x.resolve_neg().contiguous()


def _amax(x: Tensor) -> Tensor:
    """Tensor amax (NaN wins), float32 0-dim, on x's device."""
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)
    return x.detach().abs().amax().to(torch.float32)


def _odt(dtype) -> str:
    """The GEMM output the caller wants: bfloat16 is rounded by the kernel (one RNE rounding
    of the binary32 sum, as .to(torch.bfloat16) would), saving a float32 buffer and a pass."""
    return "bf16" if dtype == torch.bfloat16 else "f32"


def _mm(a: _Op, b: _Op, out_dtype: str = "f32", b_kn: bool = False) -> Tensor:
    """a . b^T; b_kn: a . b, b (a forward copy [N, K]) read as stored."""
    op = _scaled_mm_impl if _direct(a.data, b.data) else torch.ops.lowp.scaled_mm
    return op(a.data, a.scale, a.format, a.scaling, b.data, b.scale, b.format, b.scaling, a.cols,
              out_dtype, b_kn)


def _stack(ops: List[_Op]) -> _Op:
    o = ops[0]
    data = torch.stack([p.data for p in ops])
    scale = torch.stack([p.scale for p in ops]) if o.scaling != "none" else _empty(o.data.device)
    return _Op(data, scale, o.format, o.scaling, o.rows, o.cols)


def _grouped_mm(a: _Op, b: _Op, offs: Tensor, out_dtype: str = "f32",
                b_kn: bool = False) -> Tensor:
    direct = _direct(a.data, b.data, offs)
    op = _scaled_grouped_mm_impl if direct else torch.ops.lowp.scaled_grouped_mm
    return op(a.data, a.scale, a.format, a.scaling, b.data, b.scale, b.format, b.scaling, offs,
              a.cols, False, out_dtype, b_kn)


def _wgrad_mm(a: _Op, b: _Op, offs: Tensor, out_dtype: str = "f32") -> Tensor:
    direct = _direct(a.data, b.data, offs)
    op = _scaled_grouped_mm_impl if direct else torch.ops.lowp.scaled_grouped_mm
    return op(a.data, a.scale, a.format, a.scaling, b.data, b.scale, b.format, b.scaling, offs,
              a.cols, True, out_dtype)


# ---- the weight's copies ----


class WeightCache:
    """Quantized copies of weights, reused only by a forward that runs inside a backward pass
    (activation-checkpoint recomputation), while nothing can have changed them. A forward
    outside a backward always quantizes afresh and stores its copies: no counter sees a write
    through `.data` or numpy between two forwards.

    Keyed by the weight tensor's storage (its identity, not its address: FSDP2 frees an
    unsharded weight's memory at each reshard and gathers into newly allocated memory of the
    same storage), storage offset, shape, strides, dtype, device and the recipe. An entry is
    reused only while all of these are unchanged (`lowp.torch._weight_epochs`):
    - the tensor's `_version` (in-place updates of the parameter or a view of it);
    - the optimizer epoch: every `torch.optim` optimizer step moves it (a global step
      post-hook), so does `lowp.torch.invalidate_weight_caches()`;
    - for an FSDP2 unsharded parameter (or a view of it), the versions of its sharded
      parameter: FSDP2 writes each all-gather into the unsharded one without moving its
      version;
    and while its storage is the one the copies were made from (a weak reference: a new
    tensor whose storage reuses a freed one's address never hits). Within one call, the
    backward reads the copies its forward made (kept on the autograd context), never the
    cache. Counters: `quantizations` (copies made), `hits` (reuses).

    `version_fn` (optional, no arguments): the version to compare instead of the tensor's own
    `_version`, for a wrapper whose op-time tensors do not share the master weight's version
    counter (e.g. `lambda: master._version`)."""

    def __init__(self, version_fn=None):
        if version_fn is not None and not callable(version_fn):
            raise TypeError("version_fn must be callable or None")
        self.quantizations = 0
        self.hits = 0
        self._entries = {}
        self._version_fn = version_fn
        _epochs.install()

    def _key(self, w: Tensor, spec: MatmulSpec):
        return (w.untyped_storage()._cdata, w.storage_offset(), tuple(w.shape),
                tuple(w.stride()), w.dtype, str(w.device),
                spec.weight, spec.fake_quant_mxfp4, spec.input.quantized,
                spec.grad_output.quantized)

    def lookup(self, w: Tensor, spec: MatmulSpec, make):
        key = self._key(w, spec)
        e = self._entries.get(key)
        storage = w.untyped_storage()
        own = self._version_fn() if self._version_fn is not None else w._version
        version = (own, _epochs.epoch(), _epochs.fsdp_token(w))
        if (e is not None and _in_backward() and e[0] == version and not e[1].expired()
                and e[1].cdata == storage._cdata):
            self.hits += 1
            return e[2]
        value = make()
        self.quantizations += 1
        self._entries[key] = (version, StorageWeakRef(storage), value)
        # forget entries whose weights are gone
        for k in [k for k, v in self._entries.items() if v[1].expired()]:
            del self._entries[k]
        return value

    def clear(self):
        self._entries.clear()

    def __len__(self):
        return len(self._entries)


def _in_backward() -> bool:
    """Whether autograd is running a backward pass in this thread (activation-checkpoint
    recomputation runs the forward again there)."""
    return torch._C._current_graph_task_id() != -1


def _weight_source(W: Tensor, spec: MatmulSpec) -> Tensor:
    """W [N, K] as the quantizer reads it (after the optional MXFP4 fake quantization)."""
    W = _x32(W.detach())
    if spec.fake_quant_mxfp4:
        rd, rs, _, _ = torch.ops.lowp.quantize(W, "e2m1", "mx32", "rceil", -1, 0.0, "row", None,
                                               None)
        W = torch.ops.lowp.dequantize(rd, rs, "e2m1", "mx32", W.shape[0], W.shape[1], None)
    return W


def _weight_copies(W3: Tensor, spec: MatmulSpec, fwd_q: bool, dgrad_q: bool, want_fwd: bool,
                   want_dgr: bool, fp8_state, record: bool):
    """Per expert: forward copies W_g [N, K] and dgrad copies W_g^T [K, N] (None when not
    wanted), stacked into one _Op each."""
    ws = spec.weight
    scale = None
    if ws.delayed and fp8_state is not None:
        scale = fp8_state.scale("weight")
    if (want_fwd or want_dgr) and (fwd_q or not want_fwd) and (dgrad_q or not want_dgr) \
            and _native(W3) and _direct(W3) and not spec.fake_quant_mxfp4:
        return _weight_copies_native(W3, ws, want_fwd, want_dgr, fp8_state, record, scale)
    fwd, dgr = [], []
    for g in range(W3.shape[0]):
        src = _weight_source(W3[g], spec)
        if record and ws.delayed and fp8_state is not None:
            fp8_state.record("weight", _amax(src))
        qf = want_fwd and fwd_q
        qd = want_dgr and dgrad_q
        axis = "both" if qf and qd else ("row" if qf else ("col" if qd else None))
        r = c = None
        if axis:
            r, c = _quant(src, ws, axis, scale)
        if want_fwd:
            fwd.append(r if qf else _plain(src))
        if want_dgr:
            dgr.append(c if qd else _plain(src.t()))
    return (_stack(fwd) if want_fwd else None), (_stack(dgr) if want_dgr else None)


def _weight_copies_native(W3, ws, want_fwd, want_dgr, fp8_state, record, scale):
    """_weight_copies when every wanted copy is quantized on lowp's kernels: each expert's
    copies are written into slices of one stacked tensor per copy (no torch.stack, which
    copied every code and scale once more)."""
    G, N, K = W3.shape
    fmt, scaling = ws.format, ws.scaling
    mode = P.default_mode(scaling, ws.scale_mode)

    def stacked(rows, cols):
        _, _, sr, sc, _ = _ext.layout(fmt, scaling, rows, cols, None)
        return (torch.empty((G,) + _data_shape(fmt, rows, cols), dtype=torch.uint8),
                torch.empty((G, sr, sc), dtype=_scale_dtype(scaling)))

    fd, fs = stacked(N, K) if want_fwd else (None, None)
    dd, ds = stacked(K, N) if want_dgr else (None, None)
    axis = "both" if want_fwd and want_dgr else ("row" if want_fwd else "col")
    for g in range(G):
        src = _x32(W3[g].detach())
        if record and ws.delayed and fp8_state is not None:
            fp8_state.record("weight", _amax(src))
        _count("quantize", True)
        out = tuple(None if t is None else t[g] for t in (fd, fs, dd, ds))
        _quantize_native(src, fmt, scaling, mode, ws.pow2, 0.0, axis, None, scale, out)
    return ((_Op(fd, fs, fmt, scaling, N, K) if want_fwd else None),
            (_Op(dd, ds, fmt, scaling, K, N) if want_dgr else None))


# ---- the autograd function ----


class _InputMemo:
    """The quantized copies of the last forward input, for the next matmul on the same input:
    the model's q, k and v projections (and w1, w3 of a SwiGLU, dense or routed) read one
    tensor, which was quantized once per projection.

    Only for an input whose values are provably those of the entry: one produced by an op of
    an autograd graph (`_graph_anchor`: the tensor, or the base of the view, has a grad_fn),
    the same tensor object (a weak reference), at the same version. Such a tensor changes only
    through in-place ops, which bump the version; autograd itself relies on that. A leaf, a
    tensor without a graph (no_grad, inference_mode, `torch.from_numpy` over a buffer that
    numpy refills, writes through `x.data`, none of which moves a version) is quantized on
    every call. A hit also needs the same storage (alive), offset, shape, strides, dtype and
    version of the bytes quantized, the same values of `offs`, and the same operand spec and
    axes. Under no_grad or inference_mode (`enable(False)`, set by each call) nothing is
    reused or kept: an evaluation loop has no graph to vouch for a tensor made earlier, which a
    `.data` write could have changed. Per thread, one entry; cleared by every backward."""

    def __init__(self):
        self._local = threading.local()

    def enable(self, on: bool) -> None:
        """Whether the next matmuls of this thread may use the memo (grad mode, as the caller
        of the autograd function saw it: inside its forward grad mode is always off)."""
        self._local.on = on
        if not on:
            self._local.entry = None

    @staticmethod
    def _key(t: Tensor):
        st = t.untyped_storage()
        return (st._cdata, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype,
                t.device, t._version)

    def get(self, anchor: Tensor, x: Tensor, offs: Optional[Tensor], what, make):
        """The value for x (quantized from anchor's memory), made by make() on a miss."""
        if not getattr(self._local, "on", True):
            return make()
        key = (self._key(anchor), self._key(x), None if offs is None else tuple(offs.tolist()),
               what)
        e = getattr(self._local, "entry", None)
        if e is not None and e[0] == key and e[1]() is anchor and not e[2].expired():
            return e[3]
        value = make()
        self._local.entry = (key, weakref.ref(anchor), StorageWeakRef(x.untyped_storage()),
                             value)
        return value

    def clear(self):
        self._local.entry = None


def _graph_anchor(x: Tensor) -> Optional[Tensor]:
    """The tensor whose autograd history vouches for x's values (x, or the base of view x)
    when it has a grad_fn, else None (no memo)."""
    base = x._base if x._is_view() else x
    return base if base.grad_fn is not None else None


_INPUTS = _InputMemo()


def _plan(spec: MatmulSpec, wgrad_hp: bool):
    qi, qw, qg = spec.input.quantized, spec.weight.quantized, spec.grad_output.quantized
    return qi and qw, qg and qw, qg and qi and not wgrad_hp


def _dgrad_kn(spec: MatmulSpec, fwd_q: bool, dgrad_q: bool) -> bool:
    """Whether the input-gradient GEMM reads the forward copy as stored (no second copy): both
    GEMMs take the weight in one kind, whose copy of W^T is W's copy transposed."""
    return fwd_q == dgrad_q and (not dgrad_q or spec.weight.scaling in KN_KINDS)


def _first(op: Optional[_Op]) -> Optional[_Op]:
    """Expert 0 of a stacked weight operand, as a 2-D operand."""
    if op is None:
        return None
    sc = op.scale[0] if op.scaling != "none" else op.scale
    return _Op(op.data[0], sc, op.format, op.scaling, op.rows, op.cols)


def _group_tokens(M: int, offs: Optional[Tensor], grouped: bool) -> Tuple[int, bool]:
    """(T, traced) of a matmul over M rows: T the rows in some group (offs[-1]) and traced
    False in eager mode; under tracing (torch.compile, FakeTensor) offs[-1] is data-dependent,
    so no host value is read: T = M and traced True (the rows past offs[-1] are zeroed by
    `_in_groups`, with static shapes and no host-side branch)."""
    if not grouped or offs.shape[0] == 0:
        return M, False
    if not _direct(offs):
        return M, True
    return int(offs[-1].item()), False


def _in_groups(t: Tensor, T: int, offs: Optional[Tensor], traced: bool) -> Tensor:
    """The rows of t [M, C] that belong to a group: t[:T] in eager mode; traced, t with the
    rows past offs[-1] zeroed. Both give the kernels the same bytes for the grouped rows:
    the rows past offs[-1] are in no group of any GEMM, and zeros change no amax."""
    if not traced:
        return t[:T]
    rows = torch.arange(t.shape[0], device=t.device, dtype=torch.int32).unsqueeze(1)
    return torch.where(rows < offs[-1:].to(t.device), t, t.new_zeros(()))


class _LowpMatmul(torch.autograd.Function):
    """x2d [M, K] times W3 [G, N, K] (G = 1 and offs None: a plain linear)."""

    @staticmethod
    def forward(ctx, x2d, W3, bias, offs, spec, keep_quantized, wgrad_hp, cache, fp8_state,
                grouped):
        odt = _autocast_out(x2d)  # x's dtype, or the autocast dtype of x's device type
        with exact(x2d.device.type):  # lowp's own steps: no autocast inside
            return _LowpMatmul._forward(ctx, odt, x2d, W3, bias, offs, spec, keep_quantized,
                                        wgrad_hp, cache, fp8_state, grouped)

    @staticmethod
    def backward(ctx, dy):
        with exact(dy.device.type):
            return _LowpMatmul._backward(ctx, dy)

    @staticmethod
    def _forward(ctx, odt, x2d, W3, bias, offs, spec, keep_quantized, wgrad_hp, cache,
                 fp8_state, grouped):
        fwd_q, dgrad_q, wgrad_q = _plan(spec, wgrad_hp)
        kn = _dgrad_kn(spec, fwd_q, dgrad_q)
        M, K = x2d.shape
        G, N = W3.shape[0], W3.shape[1]
        T, traced = _group_tokens(M, offs, grouped)
        if torch.compiler.is_compiling():
            cache = None
        delayed = fp8_state is not None

        def make_both():
            return _weight_copies(W3, spec, fwd_q, dgrad_q, True, not kn, fp8_state, True)

        # With a cache, the backward reads this call's copies from ctx (never the cache: its
        # correctness within a step must not rest on a version counter); without one, it
        # quantizes the saved weight again.
        ctx.wcopies = None
        if cache is not None:
            wf, _ = ctx.wcopies = cache.lookup(W3, spec, make_both)
        else:
            wf, _ = _weight_copies(W3, spec, fwd_q, dgrad_q, True, False, fp8_state, True)

        xs = _in_groups(_x32(x2d.detach()), T, offs, traced)
        ispec = spec.input
        keep = keep_quantized and wgrad_q and T > 0
        iscale = fp8_state.scale("input") if (ispec.delayed and delayed) else None
        if ispec.delayed and delayed:
            fp8_state.record("input", _amax(xs))
        xcol = None
        if fwd_q:
            tok = grouped and ispec.scaling in P.TOKEN_BLOCK_KINDS
            axis = "both" if keep and not tok else "row"

            def quantize_input():
                r, c = _quant(xs, ispec, axis, iscale)
                if keep and tok:
                    _, c = _quant(xs, ispec, "col", None, offs)
                return r, c

            anchor = _graph_anchor(x2d) if iscale is None and _direct(xs, offs) else None
            xrow, xcol = (quantize_input() if anchor is None else
                          _INPUTS.get(anchor, xs, offs, (ispec, axis, keep and tok),
                                      quantize_input))
        else:
            xrow = _plain(xs)
            if keep:
                tok = grouped and ispec.scaling in P.TOKEN_BLOCK_KINDS
                _, xcol = _quant(xs, ispec, "col", iscale, offs if tok else None)
        yodt = _odt(odt) if bias is None else "f32"  # a bias is added in binary32
        if grouped:
            y = _grouped_mm(xrow, wf, offs[:G], yodt) if T > 0 else None
            if y is None or y.shape[0] != M:
                yy = torch.zeros((M, N), dtype=_OUT_DTYPES[yodt], device=x2d.device)
                if y is not None:
                    yy[:T] = y[:T]
                y = yy
        else:
            y = _mm(xrow, _first(wf), yodt)
        if bias is not None:
            y = y + bias.to(torch.float32)
        ctx.spec, ctx.keep, ctx.wgrad_hp, ctx.cache, ctx.fp8_state = (spec, keep, wgrad_hp,
                                                                     cache, fp8_state)
        ctx.grouped, ctx.T, ctx.traced, ctx.has_bias = grouped, T, traced, bias is not None
        ctx.dims = (M, K, G, N)
        ctx.x_dtype, ctx.w_dtype = x2d.dtype, W3.dtype
        ctx.bias_dtype = bias.dtype if bias is not None else None
        if xcol is not None:
            ctx.xcol_meta = (xcol.format, xcol.scaling, xcol.rows, xcol.cols, xcol.grouped)
            ctx.save_for_backward(x2d, W3, offs, xcol.data, xcol.scale)
        else:
            ctx.xcol_meta = None
            ctx.save_for_backward(x2d, W3, offs)
        return y.to(odt)

    @staticmethod
    def _backward(ctx, dy):
        if not torch.compiler.is_compiling():  # the memo is eager-only (thread-local state)
            _INPUTS.clear()
        saved = ctx.saved_tensors
        x2d, W3, offs = saved[:3]
        spec, T, grouped = ctx.spec, ctx.T, ctx.grouped
        M, K, G, N = ctx.dims
        fwd_q, dgrad_q, wgrad_q = _plan(spec, ctx.wgrad_hp)
        kn = _dgrad_kn(spec, fwd_q, dgrad_q)
        fp8_state = ctx.fp8_state
        delayed = fp8_state is not None
        need_dx = ctx.needs_input_grad[0]
        need_dw = ctx.needs_input_grad[1]
        dev = dy.device
        dys = _in_groups(_x32(dy), T, offs, ctx.traced)
        gspec, ispec = spec.grad_output, spec.input
        dx = dw = db = None
        if T > 0 and (need_dx or need_dw):
            gscale = fp8_state.scale("grad_output") if (gspec.delayed and delayed) else None
            if gspec.delayed and delayed:
                fp8_state.record("grad_output", _amax(dys))
            tok = grouped and gspec.scaling in P.TOKEN_BLOCK_KINDS
            dyrow = dycol = None
            if need_dx:
                if dgrad_q:
                    axis = "both" if (need_dw and wgrad_q and not tok) else "row"
                    dyrow, dycol = _quant(dys, gspec, axis, gscale)
                else:
                    dyrow = _plain(dys)
            if need_dw and dycol is None:
                if wgrad_q:
                    _, dycol = _quant(dys, gspec, "col", gscale, offs if tok else None)
                else:
                    dycol = _plain(dys.t())
            if need_dx:
                # kn: the forward copy, read as stored (its first element of the pair)
                if ctx.wcopies is not None:
                    wf, wd = ctx.wcopies
                else:
                    wf, wd = _weight_copies(W3, spec, fwd_q, dgrad_q, kn, not kn, fp8_state,
                                            False)
                wb = wf if kn else wd
                xodt = _odt(ctx.x_dtype)
                if grouped:
                    dxt = _grouped_mm(dyrow, wb, offs[:G], xodt, kn)
                else:
                    dxt = _mm(dyrow, _first(wb), xodt, kn)
                if T < M:
                    dx = torch.zeros((M, K), dtype=dxt.dtype, device=dev)
                    dx[:T] = dxt[:T]
                else:
                    dx = dxt
                dx = dx.to(ctx.x_dtype)
            if need_dw:
                if ctx.xcol_meta is not None:
                    f, s, r, c, gr = ctx.xcol_meta
                    xcol = _Op(saved[3], saved[4], f, s, r, c, gr)
                elif wgrad_q:
                    xs = _in_groups(_x32(x2d.detach()), T, offs, ctx.traced)
                    iscale = fp8_state.scale("input") if (ispec.delayed and delayed) else None
                    itok = grouped and ispec.scaling in P.TOKEN_BLOCK_KINDS
                    _, xcol = _quant(xs, ispec, "col", iscale, offs if itok else None)
                else:
                    xcol = _plain(_in_groups(_x32(x2d.detach()), T, offs, ctx.traced).t())
                wodt = _odt(ctx.w_dtype)
                if grouped:
                    dw = _wgrad_mm(dycol, xcol, offs[:G], wodt)
                else:
                    dw = _mm(dycol, xcol, wodt).unsqueeze(0)
                dw = dw.to(ctx.w_dtype)
        if need_dx and dx is None:
            dx = torch.zeros((M, K), dtype=ctx.x_dtype, device=dev)
        if need_dw and dw is None:
            dw = torch.zeros((G, N, K), dtype=ctx.w_dtype, device=dev)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            acc = torch.float32 if dev.type == "mps" else torch.float64
            db = dy.to(acc).sum(0).to(torch.float32).to(ctx.bias_dtype)
        return dx, dw, db, None, None, None, None, None, None, None


# ---- public API ----


def _check_tensor(name: str, t, dims=None):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    if not (t.is_floating_point()):
        raise TypeError(f"{name}.dtype ({t.dtype}) must be a floating-point dtype")
    if t.dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        raise TypeError(f"{name}.dtype ({t.dtype}) must be float32 or bfloat16")
    if dims is not None and t.dim() not in dims:
        raise ValueError(f"{name} must have {' or '.join(map(str, dims))} dimensions, "
                         f"not {t.dim()} (shape {tuple(t.shape)})")


def _check_opts(cache, fp8_state, spec: MatmulSpec):
    if cache is not None and not isinstance(cache, WeightCache):
        raise TypeError(f"cache must be a lowp.torch.WeightCache or None, not "
                        f"{type(cache).__name__}")
    if fp8_state is not None and not (hasattr(fp8_state, "scale") and
                                      hasattr(fp8_state, "record")):
        raise TypeError("fp8_state must have scale(role) and record(role, amax) methods")
    if fp8_state is not None and not spec.weight.delayed:
        raise ValueError(f"fp8_state is given but config ({spec.name}) is not delayed tensorwise "
                         "scaling (Float8TensorwiseConfig(delayed=True))")


def _spec_for(config, keep_quantized, wgrad_hp):
    spec = resolve_config(config)
    if wgrad_hp:
        spec = resolve_config(spec.replace(wgrad_hp=True))
    return spec


def _run(x2d, W3, bias, offs, config, keep_quantized, wgrad_hp, cache, fp8_state, grouped):
    spec = _spec_for(config, keep_quantized, wgrad_hp)
    if keep_quantized is None:
        keep_quantized = spec.keep_quantized
    if not isinstance(keep_quantized, bool):
        raise TypeError(f"keep_quantized ({keep_quantized!r}) must be a bool")
    if not isinstance(wgrad_hp, bool):
        raise TypeError(f"wgrad_hp ({wgrad_hp!r}) must be a bool")
    _check_opts(cache, fp8_state, spec)
    if x2d.device != W3.device:
        raise ValueError(f"x.device ({x2d.device}) != w.device ({W3.device})")
    _INPUTS.enable(torch.is_grad_enabled())
    return _LowpMatmul.apply(x2d, W3, bias, offs, spec, keep_quantized, bool(wgrad_hp), cache,
                             fp8_state, grouped)


def _no_products(x: Tensor, w: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """x [..., K] . w [K, N] (+ bias) where no product is summed (K = 0, or a grouped mm with
    no groups): zeros, or the bias, as F.linear and torch.mm give; differentiable (the input
    and weight gradients are zeros or empty, the bias gradient dy summed). The output dtype
    follows the autocast rule of the module docstring."""
    odt = _autocast_out(x)
    with exact(x.device.type):
        y = torch.matmul(x.to(torch.float32), w.to(torch.float32))
        if bias is not None:
            y = y + bias.to(torch.float32)
    return y.to(odt)


def linear(x: Tensor, w: Tensor, bias: Optional[Tensor] = None, config="mxfp8", *,
           keep_quantized: Optional[bool] = None, wgrad_hp: bool = False,
           cache: Optional[WeightCache] = None, fp8_state=None) -> Tensor:
    """`F.linear(x, w, bias)` with low-precision forward, input-gradient and weight-gradient
    GEMMs. x [..., K] float32/bfloat16, w [N, K], bias [N]; output [..., N] in x's dtype, or
    in the autocast dtype when autocast is enabled for x's device type (see the module
    docstring).
    `keep_quantized` (default: the recipe's) keeps X's columnwise copy from the forward for the
    weight gradient instead of requantizing; `wgrad_hp` runs the weight gradient in BF16;
    `cache` reuses the weight's quantized copies while it is unchanged; `fp8_state` supplies
    delayed tensorwise scales."""
    _check_tensor("x", x)
    _check_tensor("w", w, (2,))
    if x.dim() < 1:
        raise ValueError("x must have at least 1 dimension")
    if x.shape[-1] != w.shape[1]:
        raise ValueError(f"x.shape[-1] ({x.shape[-1]}) != w.shape[1] ({w.shape[1]}) (w is "
                         "[out_features, in_features])")
    if bias is not None:
        _check_tensor("bias", bias, (1,))
        if bias.shape[0] != w.shape[0]:
            raise ValueError(f"bias.shape[0] ({bias.shape[0]}) != w.shape[0] ({w.shape[0]})")
    if x.shape[-1] == 0:
        resolve_config(config)  # the same errors as with K > 0
        return _no_products(x, w.t(), bias)
    lead = x.shape[:-1]
    x2d = x.reshape(-1, x.shape[-1])
    y = _run(x2d, w.unsqueeze(0), bias, None, config, keep_quantized, wgrad_hp, cache,
             fp8_state, False)
    return y.reshape(*lead, w.shape[0])


def mm(x: Tensor, w: Tensor, config="mxfp8", **kw) -> Tensor:
    """`torch.mm(x, w)` in low precision: x [M, K], w [K, N] (typically the transposed view of
    an [N, K] weight)."""
    _check_tensor("x", x, (2,))
    _check_tensor("w", w, (2,))
    if x.shape[1] != w.shape[0]:
        raise ValueError(f"x.shape[1] ({x.shape[1]}) != w.shape[0] ({w.shape[0]})")
    return linear(x, w.t(), None, config, **kw)


def _check_offs(offs, G: int, T: int):
    if not isinstance(offs, torch.Tensor):
        raise TypeError(f"offs must be a torch.Tensor of int32, not {type(offs).__name__}")
    if offs.dtype != torch.int32:
        raise TypeError(f"offs.dtype ({offs.dtype}) must be torch.int32")
    if offs.dim() != 1 or offs.shape[0] != G:
        raise ValueError(f"offs.shape ({tuple(offs.shape)}) must be ({G},) (one end per group)")
    if not torch.compiler.is_compiling():
        _check_offs_values("", offs.tolist(), T, "x.shape[0]")


def grouped_mm(x: Tensor, w: Tensor, offs: Tensor, config="mxfp8", *,
               keep_quantized: Optional[bool] = None, wgrad_hp: bool = False,
               cache: Optional[WeightCache] = None, fp8_state=None) -> Tensor:
    """`torch._grouped_mm(x, w, offs)` in low precision: x [T, K], w [G, K, N] (possibly the
    transposed view of a [G, N, K] parameter), offs int32 [G] cumulative group ends; out
    [T, N] (rows past offs[-1] are 0)."""
    _check_tensor("x", x, (2,))
    _check_tensor("w", w, (3,))
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"x.shape[1] ({x.shape[1]}) != w.shape[1] ({w.shape[1]})")
    _check_offs(offs, w.shape[0], x.shape[0])
    if x.shape[1] == 0 or w.shape[0] == 0:  # no products: zeros, as torch._grouped_mm
        resolve_config(config)
        return _no_products(x, w.sum(0))
    offs = offs.to(x.device)
    return _run(x, w.transpose(-2, -1), None, offs, config, keep_quantized, wgrad_hp, cache,
                fp8_state, True)
