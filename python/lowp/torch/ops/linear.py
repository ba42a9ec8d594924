"""The low-precision autograd matmul behind `linear`, `mm` and `grouped_mm`: one spec-driven
`torch.autograd.Function` for every format, its operands and the weight's quantized copies.

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

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import portable as P
from .cache import WeightCache, _InputMemo, _graph_anchor
from ... import rules
from .layout import OUT_DTYPES, empty
from .philox import HADAMARD_STATE, SR_STATE, philox_states
from .library import KernelPreference, _check_offs_values, check_preference
from .qtensor import LowpQTensor
from .._autocast import exact, out_dtype as _autocast_out
from ..config import MatmulSpec, OperandSpec, resolve_config

__all__ = ["linear", "mm", "grouped_mm"]

# ---- operands of the autograd functions ----


def _plain(x: Tensor) -> LowpQTensor:
    """BF16 operand [R, C] or stack [G, R, C] (C rounds every unquantized GEMM operand to
    BF16)."""
    b = x.to(torch.bfloat16).contiguous()
    return LowpQTensor(b, empty(x.device), "bf16", "none", b.shape[-2], b.shape[-1])


def _eager(*ts) -> bool:
    """Whether this runs eagerly on plain tensors (not compiling, not FakeTensor or another
    subclass): only then may host values be read (offs[-1]) or the input memo be used."""
    return not torch.compiler.is_compiling() and all(
        t is None or type(t) in _PLAIN_TYPES for t in ts)


_PLAIN_TYPES = (Tensor, torch.nn.Parameter)


def _quant(x: Tensor, s: OperandSpec, axis: str, scale: Optional[Tensor] = None,
           offs: Optional[Tensor] = None, ov: str = "default", sr=None):
    """(row LowpQTensor or None, col LowpQTensor or None) of x [R, C] (or [G, R, C], stacked
    copies) per spec s; sr: None (RNE), or the (seed, offset) of stochastic rounding."""
    R, C = x.shape[-2:]
    mode = s.scale_mode or ""
    pow2 = -1 if s.pow2 is None else int(s.pow2)
    rnd, seed, offset = ("rne", 0, 0) if sr is None else ("sr", sr[0], sr[1])
    rd, rs, cd, cs = _op("quantize", ov)(x, s.format, s.scaling, mode, pow2, 0.0, axis, offs,
                                             scale, rnd, seed, offset)
    row = LowpQTensor(rd, rs, s.format, s.scaling, R, C) if axis in ("row", "both") else None
    col = (LowpQTensor(cd, cs, s.format, s.scaling, C, R, grouped=offs is not None)
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


def _mm(a: LowpQTensor, b: LowpQTensor, out_dtype: str = "f32", b_kn: bool = False,
        ov: str = "default") -> Tensor:
    """a . b^T; b_kn: a . b, b (a forward copy [N, K]) read as stored."""
    return _op("scaled_mm", ov)(a.qdata, a.scale, a.format, a.scaling, b.qdata, b.scale,
                                    b.format, b.scaling, a.cols, out_dtype, b_kn, *_n(b, b_kn))


def _n(b: LowpQTensor, b_kn: bool):
    """The ops' n of b read as stored (packed E2M1 codes: N may be odd), else nothing."""
    return (b.cols,) if b_kn and b.format == "e2m1" else ()


def _stack(ops: List[LowpQTensor]) -> LowpQTensor:
    o = ops[0]
    data = torch.stack([p.qdata for p in ops])
    scale = torch.stack([p.scale for p in ops]) if o.quantized else empty(o.qdata.device)
    return LowpQTensor(data, scale, o.format, o.scaling, o.rows, o.cols)


def _grouped_mm(a: LowpQTensor, b: LowpQTensor, offs: Tensor, out_dtype: str = "f32",
                b_kn: bool = False, ov: str = "default") -> Tensor:
    return _op("scaled_grouped_mm", ov)(a.qdata, a.scale, a.format, a.scaling, b.qdata,
                                            b.scale, b.format, b.scaling, offs, a.cols, False,
                                            out_dtype, b_kn, *_n(b, b_kn))


def _wgrad_mm(a: LowpQTensor, b: LowpQTensor, offs: Tensor, out_dtype: str = "f32",
              ov: str = "default") -> Tensor:
    return _op("scaled_grouped_mm", ov)(a.qdata, a.scale, a.format, a.scaling, b.qdata,
                                            b.scale, b.format, b.scaling, offs, a.cols, True,
                                            out_dtype)


# ---- the weight's copies ----


def _weight_sources(W3: Tensor, spec: MatmulSpec) -> Tensor:
    """W3 [G, N, K] as the quantizer reads it (after the optional MXFP4 fake quantization,
    expert by expert)."""
    W3 = _x32(W3.detach())
    if not spec.fake_quant_mxfp4:
        return W3
    out = []
    for W in W3:
        rd, rs, _, _ = _op("quantize", _ov(spec))(W, "e2m1", "mx32", "rceil", -1, 0.0, "row",
                                                  None, None)
        out.append(_op("dequantize", _ov(spec))(rd, rs, "e2m1", "mx32", W.shape[0], W.shape[1],
                                                None))
    return torch.stack(out)


def _weight_copies(W3: Tensor, spec: MatmulSpec, fwd_q: bool, dgrad_q: bool, want_fwd: bool,
                   want_dgr: bool, fp8_state, record: bool):
    """Forward copies W_g [N, K] and dgrad copies W_g^T [K, N] of every expert (None when not
    wanted), each a stacked LowpQTensor made by one lowp::quantize call."""
    ws = spec.weight
    delayed = ws.delayed and fp8_state is not None
    scale = fp8_state.scale("weight") if delayed else None
    src = _weight_sources(W3, spec)
    if record and delayed:
        for g in range(src.shape[0]):
            fp8_state.record("weight", _amax(src[g]))
    qf, qd = want_fwd and fwd_q, want_dgr and dgrad_q
    axis = "both" if qf and qd else ("row" if qf else ("col" if qd else None))
    r = c = None
    if axis:
        r, c = _quant(src, ws, axis, scale, None, _ov(spec))
    fwd = (r if qf else _plain(src)) if want_fwd else None
    dgr = (c if qd else _plain(src.transpose(1, 2))) if want_dgr else None
    return fwd, dgr


# ---- the autograd function ----


_INPUTS = _InputMemo()


def _pref(spec: MatmulSpec) -> KernelPreference:
    """The spec's kernel preference (configs without the field: AUTO)."""
    return KernelPreference(getattr(getattr(spec, "kernel_preference", "auto"), "value",
                                    getattr(spec, "kernel_preference", "auto")))


def _layer_plan(spec: MatmulSpec, wgrad_hp: bool) -> dict:
    """The C library's linear plan of `spec` (lowp_linear_plan_get, through lowp.rules)."""
    w = spec.weight.scaling if spec.weight.quantized else "none"
    return rules.linear_plan(spec.input.quantized, spec.grad_output.quantized, wgrad_hp, w)


def _ov(spec: MatmulSpec) -> str:
    """The overload of the lowp ops a spec's matmul calls: "portable" (the portable kernels on
    every device, an op of its own, so it holds inside torch.compile too) for
    KernelPreference.PORTABLE, else "default" (the dispatcher's kernel for the device; NATIVE
    was checked to have one)."""
    return "portable" if _pref(spec) is KernelPreference.PORTABLE else "default"


def _op(name: str, ov: str):
    return getattr(getattr(torch.ops.lowp, name), ov)


def _plan(spec: MatmulSpec, wgrad_hp: bool):
    """Whether the forward, dgrad and wgrad GEMMs run quantized (else in BF16)."""
    p = _layer_plan(spec, wgrad_hp)
    return p["forward"]["quantized"], p["dgrad"]["quantized"], p["wgrad"]["quantized"]


def _dgrad_kn(spec: MatmulSpec, fwd_q: bool, dgrad_q: bool) -> bool:
    """Whether the input-gradient GEMM reads the forward copy as stored (no second copy): both
    GEMMs take the weight in one kind, whose copy of W^T is W's copy transposed (the plan's
    b_kn; fwd_q and dgrad_q are the plan's own)."""
    return _layer_plan(spec, False)["dgrad"]["b_kn"]


def _first(op: Optional[LowpQTensor]) -> Optional[LowpQTensor]:
    """Expert 0 of a stacked weight operand, as a 2-D operand."""
    if op is None:
        return None
    sc = op.scale[0] if op.quantized else op.scale
    return LowpQTensor(op.qdata[0], sc, op.format, op.scaling, op.rows, op.cols)


def _group_tokens(M: int, offs: Optional[Tensor], grouped: bool) -> Tuple[int, bool]:
    """(T, traced) of a matmul over M rows: T the rows in some group (offs[-1]) and traced
    False in eager mode; under tracing (torch.compile, FakeTensor) offs[-1] is data-dependent,
    so no host value is read: T = M and traced True (the rows past offs[-1] are zeroed by
    `_in_groups`, with static shapes and no host-side branch)."""
    if not grouped or offs.shape[0] == 0:
        return M, False
    if not _eager(offs):
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


def _input_copies(x2d, xs, spec: MatmulSpec, fwd_q: bool, keep: bool, grouped: bool, offs,
                  fp8_state):
    """(rowwise copy of the input for the forward GEMM, columnwise copy kept for the weight
    gradient or None) of xs, the grouped rows of x2d; the memo serves a graph tensor quantized
    by the previous matmul."""
    ispec, ov = spec.input, _ov(spec)
    delayed = fp8_state is not None and ispec.delayed
    iscale = fp8_state.scale("input") if delayed else None
    if delayed:
        fp8_state.record("input", _amax(xs))
    tok = grouped and ispec.scaling in P.TOKEN_BLOCK_KINDS
    if not fwd_q:
        xcol = _quant(xs, ispec, "col", iscale, offs if tok else None, ov)[1] if keep else None
        return _plain(xs), xcol
    axis = "both" if keep and not tok else "row"

    def quantize_input():
        r, c = _quant(xs, ispec, axis, iscale, None, ov)
        if keep and tok:
            _, c = _quant(xs, ispec, "col", None, offs, ov)
        return r, c

    anchor = _graph_anchor(x2d) if iscale is None and _eager(xs, offs) else None
    if anchor is None:
        return quantize_input()
    return _INPUTS.get(anchor, xs, offs, (ispec, axis, keep and tok), quantize_input)


def _grouped_forward(xrow, wf, offs, T: int, dims, yodt: str, dev, ov: str) -> Tensor:
    """The split-M forward GEMM, [M, N] with zero rows past the groups."""
    M, N, G = dims
    y = _grouped_mm(xrow, wf, offs[:G], yodt, False, ov) if T > 0 else None
    if y is None or y.shape[0] != M:
        yy = torch.zeros((M, N), dtype=OUT_DTYPES[yodt], device=dev)
        if y is not None:
            yy[:T] = y[:T]
        y = yy
    return y


class _LowpMatmul(torch.autograd.Function):
    """x2d [M, K] times W3 [G, N, K] (G = 1 and offs None: a plain linear)."""

    @staticmethod
    def forward(ctx, x2d, W3, bias, offs, spec, keep_quantized, wgrad_hp, cache, fp8_state,
                grouped):
        odt = _autocast_out(x2d)  # x's dtype, or the autocast dtype of x's device type
        # lowp's own steps: no autocast inside; the kernels the spec prefers
        with exact(x2d.device.type):
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
        # with the wgrad Hadamard transform, X's wgrad copy is made in the backward, after it
        keep = keep_quantized and wgrad_q and T > 0 and not spec.wgrad_hadamard
        ctx.rng = _draws(spec, (fwd_q, dgrad_q, wgrad_q), T, N, ctx.needs_input_grad[:2])
        xrow, xcol = _input_copies(x2d, xs, spec, fwd_q, keep, grouped, offs, fp8_state)
        yodt = _odt(odt) if bias is None else "f32"  # a bias is added in binary32
        if grouped:
            y = _grouped_forward(xrow, wf, offs, T, (M, N, G), yodt, x2d.device, _ov(spec))
        else:
            y = _mm(xrow, _first(wf), yodt, False, _ov(spec))
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
            ctx.save_for_backward(x2d, W3, offs, xcol.qdata, xcol.scale)
        else:
            ctx.xcol_meta = None
            ctx.save_for_backward(x2d, W3, offs)
        return y.to(odt)

    @staticmethod
    def _backward(ctx, dy):
        if not torch.compiler.is_compiling():  # the memo is eager-only (thread-local state)
            _INPUTS.clear()
        saved = ctx.saved_tensors
        offs = saved[2]
        M, K, G, N = ctx.dims
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dev = dy.device
        dx = dw = db = None
        if ctx.T > 0 and (need_dx or need_dw):
            dys = _in_groups(_x32(dy), ctx.T, offs, ctx.traced)
            dyrow, dycol = _grad_copies(ctx, dys, offs, need_dx, need_dw)
            if need_dx:
                dx = _dgrad(ctx, dyrow, saved).to(ctx.x_dtype)
            if need_dw:
                dw = _wgrad(ctx, dycol, saved).to(ctx.w_dtype)
        if need_dx and dx is None:
            dx = torch.zeros((M, K), dtype=ctx.x_dtype, device=dev)
        if need_dw and dw is None:
            dw = torch.zeros((G, N, K), dtype=ctx.w_dtype, device=dev)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            acc = torch.float32 if dev.type == "mps" else torch.float64
            db = dy.to(acc).sum(0).to(torch.float32).to(ctx.bias_dtype)
        return dx, dw, db, None, None, None, None, None, None, None


def _draws(spec: MatmulSpec, plan, T: int, N: int, needs) -> dict:
    """The Philox positions this matmul's backward uses, taken in the forward (so that a
    compiled backward never reads host state): "hadamard", one sign word for both wgrad
    operands; "dgrad" and "wgrad", dY's copies' SR words (T * N each, the dgrad copy first),
    from lowp.torch's Philox states (ops/philox.py, C's RNG tracker states)."""
    _, dgrad_q, wgrad_q = plan
    need_dx, need_dw = needs
    states, out = philox_states(), {}
    if spec.wgrad_hadamard and wgrad_q and need_dw:
        out["hadamard"] = states.take(HADAMARD_STATE, 1)
    if spec.grad_output.rounding == "sr":
        for key, used in (("dgrad", need_dx and dgrad_q), ("wgrad", need_dw and wgrad_q)):
            if used:
                out[key] = states.take(SR_STATE, T * N)
    return out


def _hadamard_tokens(t: Tensor, ctx, offs) -> Tensor:
    """t [T, C] with the random Hadamard transform along its tokens (blocks restarting at each
    group), as [T, C] again: its columnwise copy quantizes the transformed t^T."""
    seed, offset = ctx.rng["hadamard"]
    go = offs[:ctx.dims[2]] if ctx.grouped else None
    return _op("hadamard16", _ov(ctx.spec))(t.t().contiguous(), seed, offset, go).t()


def _grad_copies(ctx, dys: Tensor, offs, need_dx: bool, need_dw: bool):
    """(rowwise copy of dY for the input gradient, columnwise copy for the weight gradient),
    None where not needed."""
    _, dgrad_q, wgrad_q = _plan(ctx.spec, ctx.wgrad_hp)
    gspec, fp8_state, ov = ctx.spec.grad_output, ctx.fp8_state, _ov(ctx.spec)
    delayed = fp8_state is not None and gspec.delayed
    gscale = fp8_state.scale("grad_output") if delayed else None
    if delayed:
        fp8_state.record("grad_output", _amax(dys))
    tok = ctx.grouped and gspec.scaling in P.TOKEN_BLOCK_KINDS
    # one call for both copies only where they take the same source and no SR words
    joint = not ctx.spec.wgrad_hadamard and gspec.rounding != "sr"
    dyrow = dycol = None
    if need_dx:
        if dgrad_q:
            axis = "both" if (need_dw and wgrad_q and not tok and joint) else "row"
            dyrow, dycol = _quant(dys, gspec, axis, gscale, None, ov, ctx.rng.get("dgrad"))
        else:
            dyrow = _plain(dys)
    if need_dw and dycol is None:
        if wgrad_q:
            src = _hadamard_tokens(dys, ctx, offs) if "hadamard" in ctx.rng else dys
            _, dycol = _quant(src, gspec, "col", gscale, offs if tok else None, ov,
                              ctx.rng.get("wgrad"))
        else:
            dycol = _plain(dys.t())
    return dyrow, dycol


def _dgrad(ctx, dyrow: LowpQTensor, saved) -> Tensor:
    """dX [M, K] = dY . W (zero rows past the groups)."""
    W3, offs = saved[1], saved[2]
    M, K, G, _ = ctx.dims
    fwd_q, dgrad_q, _ = _plan(ctx.spec, ctx.wgrad_hp)
    kn = _dgrad_kn(ctx.spec, fwd_q, dgrad_q)
    # kn: the forward copy, read as stored (its first element of the pair)
    if ctx.wcopies is not None:
        wf, wd = ctx.wcopies
    else:
        wf, wd = _weight_copies(W3, ctx.spec, fwd_q, dgrad_q, kn, not kn, ctx.fp8_state, False)
    wb = wf if kn else wd
    xodt = _odt(ctx.x_dtype)
    if ctx.grouped:
        dxt = _grouped_mm(dyrow, wb, offs[:G], xodt, kn, _ov(ctx.spec))
    else:
        dxt = _mm(dyrow, _first(wb), xodt, kn, _ov(ctx.spec))
    if ctx.T >= M:
        return dxt
    dx = torch.zeros((M, K), dtype=dxt.dtype, device=dxt.device)
    dx[:ctx.T] = dxt[:ctx.T]
    return dx


def _wgrad(ctx, dycol: LowpQTensor, saved) -> Tensor:
    """dW [G, N, K] = dY^T . X along each group's tokens, from the input's columnwise copy
    kept by the forward or made again here."""
    x2d, offs = saved[0], saved[2]
    G = ctx.dims[2]
    _, _, wgrad_q = _plan(ctx.spec, ctx.wgrad_hp)
    ispec, fp8_state = ctx.spec.input, ctx.fp8_state
    if ctx.xcol_meta is not None:
        f, s, r, c, gr = ctx.xcol_meta
        xcol = LowpQTensor(saved[3], saved[4], f, s, r, c, grouped=gr)
    elif wgrad_q:
        xs = _in_groups(_x32(x2d.detach()), ctx.T, offs, ctx.traced)
        if "hadamard" in ctx.rng:
            xs = _hadamard_tokens(xs, ctx, offs)
        delayed = fp8_state is not None and ispec.delayed
        iscale = fp8_state.scale("input") if delayed else None
        itok = ctx.grouped and ispec.scaling in P.TOKEN_BLOCK_KINDS
        _, xcol = _quant(xs, ispec, "col", iscale, offs if itok else None, _ov(ctx.spec))
    else:
        xcol = _plain(_in_groups(_x32(x2d.detach()), ctx.T, offs, ctx.traced).t())
    wodt = _odt(ctx.w_dtype)
    if ctx.grouped:
        return _wgrad_mm(dycol, xcol, offs[:G], wodt, _ov(ctx.spec))
    return _mm(dycol, xcol, wodt, False, _ov(ctx.spec)).unsqueeze(0)


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
    for role in ("input", "weight"):
        if getattr(spec, role).rounding != "rne":
            raise ValueError(f"config ({spec.name}): {role} rounding "
                             f"({getattr(spec, role).rounding!r}) must be 'rne'; lowp.torch "
                             "rounds only the output gradient stochastically")
    if x2d.device != W3.device:
        raise ValueError(f"x.device ({x2d.device}) != w.device ({W3.device})")
    check_preference(_pref(spec), x2d.device)
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
