"""The lowp replacements that `patch_torchao()` installs in torchao's training modules.

Each function here has the signature of the torchao 0.18 function it stands in for, maps that
function's settings onto a lowp recipe (a `lowp.torch` config plus `wgrad_hp`) and runs
`lowp.torch.linear` / `lowp.torch.grouped_mm`: lowp's native kernels for CPU tensors, its
portable torch path on any other device. A setting lowp cannot honour raises `ValueError` (or
`TypeError`) naming it; nothing falls back silently to a different computation.

Settings and how they map:

  scale_calculation_mode      RCEIL / FLOOR / CEIL / EVEN -> MXQuantizeConfig(scale_mode=...)
  kernel_preference           AUTO, EMULATED (and TORCH for the linear) all run lowp's kernels:
                              lowp has one numerics for every kernel; other values raise
  wgrad_with_hp               -> wgrad_hp=True: lowp's high-precision weight gradient is a BF16
                              GEMM (binary32 accumulation), which is torchao's only when the
                              GEMM's inputs are BF16; float32 inputs raise
  out_dtype (grouped)         bfloat16 / float32: float32 from bfloat16 input runs lowp on the
                              input cast to float32 (exact), so the output keeps binary32
  pad_token_groups_for_grouped_mm
                              either value: lowp quantizes each group's tokens separately (a
                              short last block is zero-padded), which is what torchao's padding
                              computes; no copy is padded
  A, a pre-quantized MXTensor  (the MXFP8 grouped mm, as torchao: wgrad_with_hp=True only)
                              taken as it is when its bytes are a lowp MXFP8 operand: E4M3
                              codes, block 32, unswizzled E8M0 scales [T, K/32] (whatever rule
                              made them); the weight gradient multiplies dY^T by A dequantized.
                              Other element dtypes, block sizes, swizzled scales and
                              wgrad_with_hp=False raise, naming the setting
  block_size / element dtypes only 32 and float8_e4m3fn / float8_e5m2 / float4 elements
  float8_dtype (FP8 rowwise)  only torch.float8_e4m3fn
  float8_linear_recipe        (Float8TrainingOpConfig's linears) "rowwise" -> fp8_rowwise,
                              "tensorwise" -> Float8TensorwiseConfig() (e4m3 / e5m2 gradient,
                              current scaling); "rowwise_with_gw_hp" -> torchao's pairing on
                              lowp's ops: X and W rowwise forward, dY rowwise times W
                              tensorwise (its one scale in the rowwise layout) for dX, a BF16
                              GEMM for dW (bfloat16 inputs only, as wgrad_with_hp)

Weights: every weight gets one `lowp.torch.WeightCache`, held in a weak map keyed by torchao's
wrapper parameter (a plain weight: by its storage root), so a weight is quantized once per
version: activation checkpointing's recomputation reuses the copies (the backward reads its
own forward's, from the autograd context), an optimizer step makes new ones. The patched
`unwrap_weight` records which wrapper each tensor it returns came from: the `_data` views it
hands out are fresh tensors below autograd, and an in-place update of the wrapper bumps the
WRAPPER's version counter, not its `_data`'s (the update runs in `__torch_dispatch__`), so a
cache is emptied whenever its wrapper's version moved, or (FSDP2, whose all-gather into the
unsharded wrapper moves no version) its sharded parameter's did; every optimizer step expires
all copies too (`lowp.torch._weight_epochs`, docs/torch.md "Weight caches").
"""

from __future__ import annotations

import weakref
from typing import Optional

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ..ops import cache as _epochs
from ..ops import linear as _lops
from ..ops.cache import WeightCache
from ..config import (Float8RowwiseConfig, Float8TensorwiseConfig, MatmulSpec, MXQuantizeConfig,
                      OperandSpec)

__all__ = [
    "to_mxfp8_then_scaled_mm",
    "MXMM",
    "to_mxfp8_then_scaled_grouped_mm",
    "MXFP8GroupedMM",
    "to_fp8_rowwise_then_scaled_grouped_mm",
    "to_fp8_then_scaled_mm",
    "Float8GroupedMM",
    "weight_cache",
    "clear_caches",
]

_CACHES = WeakIdKeyDictionary()  # weight key -> [WeightCache, owner version seen]
_OWNERS = WeakIdKeyDictionary()  # tensor unwrap_weight returned -> weakref to its wrapper
_MODES = ("rceil", "floor", "ceil", "even")


def _root(w: torch.Tensor) -> torch.Tensor:
    return w._base if w._base is not None else w


def _key_of(w: torch.Tensor):
    """(cache key, version source): the wrapper parameter a torchao weight was unwrapped from
    (its `_data` views are fresh tensors with their own counters), else the tensor's root."""
    ref = _OWNERS.get(w)
    owner = ref() if ref is not None else None
    if owner is not None:  # under FSDP2 the wrapper is the unsharded parameter: its sharded
        return owner, (owner._version, _epochs.fsdp_token(owner))  # one's versions count too
    return _root(w), None  # a plain weight: WeightCache follows its version counters


def _cache_for(w: torch.Tensor) -> Optional[WeightCache]:
    if torch.compiler.is_compiling():
        return None
    key, ver = _key_of(w)
    entry = _CACHES.get(key)
    if entry is None:
        entry = [WeightCache(), ver]
        _CACHES[key] = entry
    elif entry[1] != ver:  # the wrapper was updated in place: its copies are stale
        entry[0].clear()
        entry[1] = ver
    return entry[0]


def make_unwrap_weight(original):
    """torchao's `unwrap_weight` that also remembers which wrapper parameter the tensor it
    returns came from (the cache key and version source of that weight)."""

    _epochs.install()  # learn FSDP2 modules from the first forward on

    def unwrap_weight(wrapper_tensor):
        out = original(wrapper_tensor)
        if isinstance(out, torch.Tensor) and isinstance(wrapper_tensor, torch.Tensor):
            owner = wrapper_tensor._base if wrapper_tensor._base is not None else wrapper_tensor
            _OWNERS[out] = weakref.ref(owner)
        return out

    unwrap_weight.__wrapped__ = original
    return unwrap_weight


def make_mx_torch_function(original):
    """The MXFP8 weight wrapper's `__torch_function__` (a classmethod, `original`) with the
    two fixes torchao's tests leave room for. torchao 0.18's runs every one of linear, mm,
    matmul and addmm as `F.linear(args[0], args[1])`: `torch.mm(x, w)`, `torch.matmul(x, w)`
    and `x @ w` are x w^T for an [N, K] weight (torchao's tested contract, as for its FP8
    wrapper; kept: they go to `original`), but it drops `F.linear`'s bias and asserts on
    `torch.addmm(b, x, w)`. Here:
    - `F.linear(x, w, b)`: the product, then `+ b` (as torchao's FP8 wrapper does);
    - `torch.addmm(b, x, w)` (beta = alpha = 1): `b + torch.mm(x, w)`, i.e. the linear x w^T
      then `+ b`.
    Everything else goes to `original` (mm, matmul, grouped mm, other ops)."""
    fn = original.__func__
    lin = torch.nn.functional.linear

    def is_weight(cls, t):
        return isinstance(t, cls) and t.dim() == 2

    def __torch_function__(cls, func, types, args, kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", None)
        if name == "linear":
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if bias is not None:
                rest = {k: v for k, v in kwargs.items() if k != "bias"}
                out = fn(cls, func, types, tuple(args[:2]), rest)
                return out + bias.to(out.dtype)
        elif (name == "addmm" and len(args) == 3 and not kwargs and not isinstance(args[1], cls)
              and not isinstance(args[0], cls) and is_weight(cls, args[2])):
            out = fn(cls, lin, types, (args[1], args[2]), {})
            return out + args[0].to(out.dtype)
        return fn(cls, func, types, args, kwargs)

    __torch_function__.__wrapped__ = fn
    return classmethod(__torch_function__)


def weight_cache(weight) -> Optional[WeightCache]:
    """The WeightCache the patched ops keep for `weight` (a torchao training-weight wrapper
    parameter, or a plain weight tensor), or None when no patched op has seen it yet."""
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight must be a tensor, not {type(weight).__name__}")
    entry = _CACHES.get(weight)
    if entry is None:
        entry = _CACHES.get(_root(weight))
    return entry[0] if entry is not None else None


def clear_caches() -> None:
    _CACHES.clear()
    _OWNERS.clear()


# ---- settings ----


def _scale_mode(mode) -> str:
    v = getattr(mode, "value", mode)
    if not isinstance(v, str) or v.lower() not in _MODES:
        raise ValueError(f"scale_calculation_mode ({mode!r}) is not one of RCEIL, FLOOR, CEIL, "
                         "EVEN (the E8M0 scale rules lowp implements)")
    return v.lower()


def _kernel_preference(kp, allowed, where: str) -> None:
    v = getattr(kp, "value", kp)
    if not isinstance(v, str) or v.lower() not in allowed:
        raise ValueError(f"kernel_preference ({kp!r}) is not supported by lowp's {where} (it runs "
                         f"lowp's kernels for {', '.join(a.upper() for a in allowed)})")


def _elem_format(dtype, name: str) -> str:
    fp4 = getattr(torch, "float4_e2m1fn_x2", None)
    table = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}
    if fp4 is not None:
        table[fp4] = "e2m1"
    try:
        return table[dtype]
    except (KeyError, TypeError):
        raise ValueError(f"{name} ({dtype!r}) is not an MX element dtype lowp implements "
                         "(float8_e4m3fn, float8_e5m2, float4_e2m1fn_x2)") from None


def _check_wgrad_hp(wgrad_with_hp, dtypes, where: str) -> bool:
    if not isinstance(wgrad_with_hp, bool):
        raise TypeError(f"wgrad_with_hp ({wgrad_with_hp!r}) must be a bool")
    if wgrad_with_hp and any(d != torch.bfloat16 for d in dtypes):
        raise ValueError(f"wgrad_with_hp=True with {'/'.join(str(d) for d in dtypes)} "
                         f"{where}: lowp's high-precision weight gradient is a BF16 GEMM, "
                         "torchao's would run in that dtype; use bfloat16 inputs")
    return wgrad_with_hp


def _out_dtype(out_dtype) -> torch.dtype:
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"out_dtype ({out_dtype!r}) must be torch.bfloat16 or torch.float32")
    return out_dtype


def _is_mx(t) -> bool:
    try:
        from torchao.prototype.mx_formats.mx_tensor import MXTensor
    except Exception:  # pragma: no cover - torchao layout checked by the patcher
        return False
    return isinstance(t, MXTensor)


def _check_plain(t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    if _is_mx(t):
        raise ValueError(f"{name} is a pre-quantized MXTensor, which only torchao's MXFP8 "
                         "grouped mm takes (_to_mxfp8_then_scaled_grouped_mm with "
                         "wgrad_with_hp=True); pass the high-precision tensor here")


def mx_linear_config(scale_calculation_mode, in_elem=torch.float8_e4m3fn,
                     w_elem=torch.float8_e4m3fn, grad_elem=torch.float8_e4m3fn):
    """The lowp.torch config equivalent to torchao's MXFP8 linear with these settings."""
    mode = _scale_mode(scale_calculation_mode)
    fi = _elem_format(in_elem, "in_elem_dtype")
    fw = _elem_format(w_elem, "w_elem_dtype")
    fg = _elem_format(grad_elem, "grad_elem_dtype")
    if fi == fw == fg:
        return MXQuantizeConfig(dtype=in_elem, scale_mode=mode)
    return MatmulSpec(OperandSpec(fi, "mx32", mode), OperandSpec(fw, "mx32", mode),
                      OperandSpec(fg, "mx32", mode), keep_quantized=True, name="custom")


# ---- MXFP8 linear (torchao.prototype.moe_training.mxfp8_linear) ----


def _mx_linear(input_hp, weight_hp, config, kernel_preference, wgrad_with_hp):
    _check_plain(input_hp, "input_hp")
    _check_plain(weight_hp, "weight_hp")
    _kernel_preference(kernel_preference, ("auto", "emulated", "torch"), "MXFP8 linear")
    hp = _check_wgrad_hp(wgrad_with_hp, (input_hp.dtype,), "input")
    return _lops.linear(input_hp, weight_hp, None, config, wgrad_hp=hp,
                        cache=_cache_for(weight_hp))


def to_mxfp8_then_scaled_mm(input_hp: torch.Tensor, weight_hp: torch.Tensor, kernel_preference,
                            scale_calculation_mode, wgrad_with_hp: bool = False) -> torch.Tensor:
    """torchao's `_to_mxfp8_then_scaled_mm` on lowp: input [..., K] x weight [N, K]^T."""
    cfg = mx_linear_config(scale_calculation_mode)
    return _mx_linear(input_hp, weight_hp, cfg, kernel_preference, wgrad_with_hp)


class MXMM:
    """Stands in for torchao's `mx_mm` autograd function: `MXMM.apply(...)` takes mx_mm's
    arguments and runs lowp.torch.linear (which carries its own autograd)."""

    @staticmethod
    def apply(input_hp, weight_hp, in_elem_dtype, w_elem_dtype, grad_elem_dtype, block_size,
              kernel_preference, mxfp8_dim0_cast_kernel_choice=None,
              mxfp8_dim1_cast_kernel_choice=None, scale_calculation_mode=None,
              wgrad_with_hp=False):
        # The cast kernel choices pick torchao kernels only; lowp's quantization is the same
        # bytes whichever kernel runs it, so they do not change the result and are not used.
        if block_size != 32:
            raise ValueError(f"block_size ({block_size!r}) must be 32 (lowp's MX block)")
        if scale_calculation_mode is None:
            raise ValueError("scale_calculation_mode (None) must be given (RCEIL, FLOOR, CEIL "
                             "or EVEN)")
        cfg = mx_linear_config(scale_calculation_mode, in_elem_dtype, w_elem_dtype,
                               grad_elem_dtype)
        return _mx_linear(input_hp, weight_hp, cfg, kernel_preference, wgrad_with_hp)


# ---- MXFP8 grouped mm (torchao.prototype.moe_training.mxfp8_grouped_mm) ----


def _grouped(A, B_t, offs, config, out_dtype, wgrad_hp):
    """lowp.torch.grouped_mm(A, B_t, offs) with torchao's out_dtype rule."""
    out_dtype = _out_dtype(out_dtype)
    x = A.to(torch.float32) if (out_dtype == torch.float32 and A.dtype != torch.float32) else A
    y = _lops.grouped_mm(x, B_t, offs, config, wgrad_hp=wgrad_hp, cache=_cache_for(B_t))
    return y if y.dtype == out_dtype else y.to(out_dtype)


def _check_prequant(A, wgrad_with_hp) -> None:
    """A pre-quantized MXTensor lowp takes as it is: the bytes of lowp's MXFP8 rowwise
    operand (E4M3 codes [T, K], one E8M0 scale per 32 codes along K, [T, K/32], unswizzled),
    with the weight gradient in high precision (torchao's own rule for such inputs)."""
    if A.elem_dtype != torch.float8_e4m3fn:
        raise ValueError(f"A.elem_dtype ({A.elem_dtype}) of a pre-quantized MXTensor must be "
                         "torch.float8_e4m3fn (torchao's MXFP8 grouped mm); pass the "
                         "high-precision activations otherwise")
    if A.block_size != 32:
        raise ValueError(f"A.block_size ({A.block_size}) of a pre-quantized MXTensor must be 32 "
                         "(lowp's MX block); pass the high-precision activations otherwise")
    if A.is_swizzled_scales:
        raise ValueError("A.is_swizzled_scales (True): lowp reads the E8M0 scales row-major "
                         "[T, K/32]; build the MXTensor with is_swizzled_scales=False")
    q, sc = A.qdata, A.scale
    if q.dim() != 2 or q.shape[1] % 32 or tuple(sc.shape) != (q.shape[0], q.shape[1] // 32):
        raise ValueError(f"A (a pre-quantized MXTensor) must hold qdata [T, K] with K a multiple "
                         f"of 32 and scales [T, K/32], not {tuple(q.shape)} and "
                         f"{tuple(sc.shape)}")
    if wgrad_with_hp is not True:
        raise ValueError(f"wgrad_with_hp ({wgrad_with_hp!r}) with a pre-quantized MXTensor A: "
                         "a quantized weight gradient needs A's high-precision values along "
                         "the tokens; set wgrad_with_hp=True (MXFP8_RCEIL_WGRAD_WITH_HP), as "
                         "torchao requires, or pass the high-precision activations")


def _gemm_dtype(dtype) -> str:
    return "bf16" if dtype == torch.bfloat16 else "f32"


def _mx_weight_copies(W3: torch.Tensor, mode: str):
    """((codes, scales) of each W_g [N, K], of each W_g^T [K, N]), stacked over the experts:
    lowp's MXFP8 forward and input-gradient weight operands."""
    fd, fs, dd, ds = [], [], [], []
    for g in range(W3.shape[0]):
        w = W3[g].to(torch.float32) if W3.dtype not in (torch.float32, torch.bfloat16) else W3[g]
        r, rs, c, cs = torch.ops.lowp.quantize(w.contiguous(), "e4m3", "mx32", mode, -1, 0.0,
                                               "both", None, None)
        fd.append(r), fs.append(rs), dd.append(c), ds.append(cs)
    return ((torch.stack(fd), torch.stack(fs)), (torch.stack(dd), torch.stack(ds)))


class _PrequantMXGroupedMM(torch.autograd.Function):
    """torchao's MXFP8 grouped mm of a pre-quantized MXTensor A (checked by _check_prequant)
    on lowp's kernels: the forward multiplies A's own codes and scales by lowp's MXFP8 copies
    of the expert weights; the input gradient is lowp's (dY and W^T in MXFP8); the weight
    gradient is lowp's BF16 GEMM of dY^T and A dequantized (exact in BF16), which is what
    torchao's high-precision weight gradient of such an input computes."""

    @staticmethod
    def forward(ctx, A, B_t, offs, mode: str, out_dtype):
        q = A.qdata.contiguous().view(torch.uint8)
        s = A.scale.contiguous().view(torch.uint8)
        (wfd, wfs), (wdd, wds) = _mx_weight_copies(B_t.detach().transpose(-2, -1), mode)
        y = torch.ops.lowp.scaled_grouped_mm(q, s, "e4m3", "mx32", wfd, wfs, "e4m3", "mx32",
                                             offs, q.shape[1], False, _gemm_dtype(out_dtype))
        ctx.save_for_backward(q, s, offs, wdd, wds)
        ctx.mode, ctx.a_dtype, ctx.w_dtype = mode, A.dtype, B_t.dtype
        return y.to(out_dtype)

    @staticmethod
    def backward(ctx, dy):
        q, s, offs, wdd, wds = ctx.saved_tensors
        T, K = q.shape
        dy = (dy if dy.dtype in (torch.float32, torch.bfloat16) else dy.float()).contiguous()
        dx = dw = None
        if ctx.needs_input_grad[0]:
            r, rs, _, _ = torch.ops.lowp.quantize(dy, "e4m3", "mx32", ctx.mode, -1, 0.0, "row",
                                                  None, None)
            dx = torch.ops.lowp.scaled_grouped_mm(r, rs, "e4m3", "mx32", wdd, wds, "e4m3",
                                                  "mx32", offs, dy.shape[1], False,
                                                  _gemm_dtype(ctx.a_dtype)).to(ctx.a_dtype)
        if ctx.needs_input_grad[1]:  # A dequantized: E4M3 values times 2^(s - 127), exact
            xd = (q.view(torch.float8_e4m3fn).to(torch.float32).view(T, K // 32, 32)
                  * s.view(torch.float8_e8m0fnu).to(torch.float32).unsqueeze(-1)).view(T, K)
            none = torch.empty(0, dtype=torch.uint8, device=dy.device)
            dw = torch.ops.lowp.scaled_grouped_mm(
                dy.t().to(torch.bfloat16).contiguous(), none, "bf16", "none",
                xd.t().to(torch.bfloat16).contiguous(), none, "bf16", "none", offs, T, True,
                _gemm_dtype(ctx.w_dtype))
            dw = dw.to(ctx.w_dtype).transpose(-2, -1)
        return dx, dw, None, None, None


def _mx_grouped(A, B_t, offs, out_dtype, kernel_preference, wgrad_with_hp,
                scale_calculation_mode, pad_token_groups_for_grouped_mm):
    prequant = _is_mx(A)
    if prequant:
        _check_prequant(A, wgrad_with_hp)
    else:
        _check_plain(A, "A")
    _check_plain(B_t, "B_t")
    if offs is None:
        raise ValueError("offs (None) must be the int32 group end offsets (lowp's grouped mm is "
                         "the 2d x 3d case with offsets)")
    _kernel_preference(kernel_preference, ("auto", "emulated"), "MXFP8 grouped mm")
    if not isinstance(pad_token_groups_for_grouped_mm, bool):
        raise TypeError(f"pad_token_groups_for_grouped_mm ({pad_token_groups_for_grouped_mm!r}) "
                        "must be a bool")
    od = _out_dtype(out_dtype)
    hp = _check_wgrad_hp(wgrad_with_hp, (A.dtype, od), "input / out_dtype")
    mode = _scale_mode(scale_calculation_mode)
    if prequant:
        if B_t.dim() != 3 or B_t.shape[1] != A.shape[1]:
            raise ValueError(f"B_t.shape ({tuple(B_t.shape)}) must be [G, K, N] with K = "
                             f"A.shape[1] ({A.shape[1]})")
        _lops._check_offs(offs, B_t.shape[0], A.shape[0])
        return _PrequantMXGroupedMM.apply(A, B_t, offs.to(B_t.device), mode, od)
    return _grouped(A, B_t, offs, MXQuantizeConfig(scale_mode=mode), od, hp)


def to_mxfp8_then_scaled_grouped_mm(A: torch.Tensor, B_t: torch.Tensor,
                                    offs: Optional[torch.Tensor] = None,
                                    bias: Optional[torch.Tensor] = None,
                                    out_dtype: Optional[torch.dtype] = torch.bfloat16,
                                    kernel_preference=None, wgrad_with_hp: bool = False,
                                    scale_calculation_mode=None,
                                    pad_token_groups_for_grouped_mm: bool = False):
    """torchao's `_to_mxfp8_then_scaled_grouped_mm` on lowp: A [T, K], B_t [G, K, N] (the
    transposed view of [G, N, K] expert weights), offs int32 [G]; bias [G?, N] added after."""
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.quantization.quantize_.common import KernelPreference
    kp = KernelPreference.AUTO if kernel_preference is None else kernel_preference
    mode = ScaleCalculationMode.RCEIL if scale_calculation_mode is None else scale_calculation_mode
    y = _mx_grouped(A, B_t, offs, out_dtype, kp, wgrad_with_hp, mode,
                    pad_token_groups_for_grouped_mm)
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y


class MXFP8GroupedMM:
    """Stands in for torchao's `_MXFP8GroupedMM` autograd function (same `apply` arguments)."""

    @staticmethod
    def apply(input_act, weight_t, group_end_offsets=None, out_dtype=torch.bfloat16,
              kernel_preference=None, wgrad_with_hp=False, scale_calculation_mode=None,
              pad_token_groups_for_grouped_mm=False):
        return to_mxfp8_then_scaled_grouped_mm(
            input_act, weight_t, group_end_offsets, None, out_dtype, kernel_preference,
            wgrad_with_hp, scale_calculation_mode, pad_token_groups_for_grouped_mm)


# ---- FP8 rowwise grouped mm (torchao.prototype.moe_training.fp8_grouped_mm) ----


def to_fp8_rowwise_then_scaled_grouped_mm(A: torch.Tensor, B_t: torch.Tensor,
                                          offs: torch.Tensor,
                                          out_dtype: Optional[torch.dtype] = torch.bfloat16,
                                          float8_dtype: torch.dtype = torch.float8_e4m3fn,
                                          pad_token_groups_for_grouped_mm: bool = True):
    """torchao's `_to_fp8_rowwise_then_scaled_grouped_mm` on lowp's fp8_rowwise recipe (e4m3,
    power-of-two rowwise scales). One difference, by lowp's recipe: in the weight gradient the
    per-row scales of dY^T and X^T span all tokens, where torchao's span each group's tokens."""
    _check_plain(A, "A")
    _check_plain(B_t, "B_t")
    if offs is None:
        raise ValueError("offs (None) must be the int32 group end offsets")
    if float8_dtype != torch.float8_e4m3fn:
        raise ValueError(f"float8_dtype ({float8_dtype!r}) must be torch.float8_e4m3fn (lowp's "
                         "fp8_rowwise recipe; e4m3fnuz is not a lowp format)")
    if not isinstance(pad_token_groups_for_grouped_mm, bool):
        raise TypeError(f"pad_token_groups_for_grouped_mm ({pad_token_groups_for_grouped_mm!r}) "
                        "must be a bool")
    return _grouped(A, B_t, offs, Float8RowwiseConfig(), out_dtype, False)


class Float8GroupedMM:
    """Stands in for torchao's `_Float8GroupedMM` autograd function (same `apply` arguments)."""

    @staticmethod
    def apply(A, B_t, offs=None, out_dtype=torch.bfloat16, float8_dtype=torch.float8_e4m3fn,
              pad_token_groups_for_grouped_mm=True):
        return to_fp8_rowwise_then_scaled_grouped_mm(A, B_t, offs, out_dtype, float8_dtype,
                                                     pad_token_groups_for_grouped_mm)


# ---- FP8 linear of Float8TrainingOpConfig (torchao.prototype.moe_training.tensor) ----

_FP8_LINEAR = {"rowwise": Float8RowwiseConfig, "tensorwise": Float8TensorwiseConfig}


def _fp8_row(t: torch.Tensor, scaling: str = "row"):
    """(codes, scales) of t [R, C] in E4M3 along its rows, power-of-two scales: lowp's
    fp8_rowwise operand; scaling "tensor": one scale, repeated per row (a tensorwise operand
    in the row layout, so that it pairs with a rowwise one; the same dequantized values)."""
    t = (t if t.dtype in (torch.float32, torch.bfloat16) else t.float()).contiguous()
    d, sc, _, _ = torch.ops.lowp.quantize(t, "e4m3", scaling, "", 1, 0.0, "row", None, None)
    if scaling == "tensor":
        sc = sc.reshape(1, 1).expand(t.shape[0], 1).contiguous()
    return d, sc


class _RowwiseGwHp(torch.autograd.Function):
    """torchao's rowwise_with_gw_hp linear on lowp's kernels, x2d [M, K] x w [N, K]^T:
    out = X (E4M3 rowwise) . W (E4M3 rowwise)^T; dX = dY (E4M3 rowwise) . W (E4M3
    tensorwise); dW = dY^T . X as a BF16 GEMM (binary32 sums). Scales are powers of two."""

    @staticmethod
    def forward(ctx, x2d, w):
        xd, xs = _fp8_row(x2d.detach())
        wd, ws = _fp8_row(w.detach())
        y = torch.ops.lowp.scaled_mm(xd, xs, "e4m3", "row", wd, ws, "e4m3", "row", x2d.shape[1],
                                     _gemm_dtype(x2d.dtype))
        ctx.save_for_backward(x2d, w)
        return y.to(x2d.dtype)

    @staticmethod
    def backward(ctx, dy):
        x2d, w = ctx.saved_tensors
        dx = dw = None
        if ctx.needs_input_grad[0]:
            gd, gs = _fp8_row(dy)
            td, ts = _fp8_row(w.detach().t(), "tensor")
            dx = torch.ops.lowp.scaled_mm(gd, gs, "e4m3", "row", td, ts, "e4m3", "row",
                                          dy.shape[1], _gemm_dtype(x2d.dtype)).to(x2d.dtype)
        if ctx.needs_input_grad[1]:
            none = torch.empty(0, dtype=torch.uint8, device=dy.device)
            a = dy.t().to(torch.bfloat16).contiguous()
            b = x2d.detach().t().to(torch.bfloat16).contiguous()
            dw = torch.ops.lowp.scaled_mm(a, none, "bf16", "none", b, none, "bf16", "none",
                                          dy.shape[0], _gemm_dtype(w.dtype)).to(w.dtype)
        return dx, dw


def _rowwise_with_gw_hp(input, weight):
    _lops._check_tensor("input", input)
    _lops._check_tensor("weight", weight, (2,))
    if input.dim() < 1 or input.shape[-1] != weight.shape[1]:
        raise ValueError(f"input.shape ({tuple(input.shape)}) must end in weight.shape[1] "
                         f"({weight.shape[1]}) (weight is [out_features, in_features])")
    _check_wgrad_hp(True, (input.dtype,), "input (float8_linear_recipe rowwise_with_gw_hp)")
    y = _RowwiseGwHp.apply(input.reshape(-1, input.shape[-1]), weight)
    return y.reshape(*input.shape[:-1], weight.shape[0])


def to_fp8_then_scaled_mm(input, weight, config):
    """torchao's `_to_fp8_then_scaled_mm` (the linear of `Float8TrainingOpConfig`) on lowp:
    input [..., K] x weight [N, K]^T; the wrapper adds the bias."""
    _check_plain(input, "input")
    _check_plain(weight, "weight")
    recipe = getattr(config, "float8_linear_recipe", None)
    if recipe == "rowwise_with_gw_hp":
        return _rowwise_with_gw_hp(input, weight)
    make = _FP8_LINEAR.get(recipe)
    if make is None:
        raise ValueError(f"float8_linear_recipe ({recipe!r}) is not one lowp implements "
                         "(rowwise, tensorwise, rowwise_with_gw_hp)")
    return _lops.linear(input, weight, None, make(), cache=_cache_for(weight))
