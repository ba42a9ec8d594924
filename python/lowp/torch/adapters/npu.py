"""The Ascend 950's native MX kernels (torch_npu) as lowp kernels, with the conversions between
lowp's canonical E8M0 scales and the NPU's pair layout (include/lowp/layout.h: the block axis
zero-padded to an even count and split in pairs; a rowwise copy's scales [R, ceil(nb/2), 2], a
columnwise copy's, kept in the input's orientation, [ceil(nb/2), C, 2]).

UNVERIFIED ON HARDWARE: no NPU has run this code. It is written from torch_npu's documented
signatures and CANN's documented semantics, and tested against a stand-in module that
implements them on CPU tensors (tests/python/npu_standin.py). Run
`python -m lowp.torch.check_device --device npu` first on a real 950; a kernel that fails there
must not serve a recipe.

- "npu.dynamic_mx_quant": `npu_dynamic_mx_quant`, mx32 E4M3/E5M2 along one axis, RCEIL
  (`scale_alg=1`) and FLOOR (`scale_alg=0`), bfloat16 input;
- "npu.dynamic_mx_quant_with_dual_axis": both copies from one call;
- "npu.dynamic_block_mx_quant": block32x32 (FLOOR), its 32x32 scales read from `scale1`;
- "npu.quant_matmul.mx": `npu_quant_matmul`, MX x MX with E8M0 pair scales
  (`group_sizes=[1, 1, 32]`);
- "npu.quant_matmul.block_fp8": Block FP8, a 1x128 against b 128x128 (`[1, 128, 128]`);
- "npu.grouped_dynamic_mx_quant": `npu_grouped_dynamic_mx_quant`, the copy quantized along the
  tokens in groups (its grouped pair layout: each group's blocks padded to an even count);
- "npu.grouped_matmul.mx": `npu_grouped_matmul` on MX operands, split-M (`group_type=0`) and
  split-K (`group_type=2`), `group_list` the cumulative group ends.
The grouped ops' argument conventions (group_list, the split-K operands' orientation and their
scales' layout) are the least documented: they are this module's reading. CANN's FLOOR is predicted to write zero elements in blocks whose scale
code is 0 (docs/numerics.md section 10): check_device's edge suite reports those blocks.

`register()` registers the kernels for "npu" only when `torch_npu` has already been imported
(lowp never imports it); `kernels(module)` builds them on any module with torch_npu's
functions, which is how the tests run them.
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor
from torch.nn import functional as F

from ..device_kernels import KernelKey
from ._common import FP8_DTYPES, OUT_DTYPES, fp8, register_once

_ALG = {"floor": 0, "rceil": 1}


def to_pairs(canon: Tensor, columnwise: bool) -> Tensor:
    """Canonical E8M0 scales [sr, sc] (uint8) -> the NPU pair layout: [sr, ceil(sc/2), 2], or,
    columnwise (the copy of x^T), [ceil(sc/2), sr, 2]."""
    sr, sc = canon.shape
    p = F.pad(canon, (0, sc % 2)).reshape(sr, -1, 2)
    return p.permute(1, 0, 2).contiguous() if columnwise else p


def from_pairs(pairs: Tensor, nb: int, columnwise: bool) -> Tensor:
    """The NPU pair layout -> canonical [sr, nb] uint8 (inverse of to_pairs)."""
    p = pairs.view(torch.uint8)
    if columnwise:
        p = p.permute(1, 0, 2)
    return p.reshape(p.shape[0], -1)[:, :nb].contiguous()


def _group_blocks(offs, bs: int = 32):
    """Blocks of each group along the tokens (a group of n tokens has ceil(n / bs))."""
    out, prev = [], 0
    for e in offs:
        out.append(-(-(int(e) - prev) // bs))
        prev = int(e)
    return out


def to_grouped_pairs(canon: Tensor, offs) -> Tensor:
    """Canonical grouped scales [C, nb] (a copy quantized along the tokens in groups, each
    group's blocks in turn; columns past them ignored) -> the NPU's grouped pair layout
    (npu_grouped_dynamic_mx_quant's mxscale): each group's blocks zero-padded to an even count,
    in pairs, stacked along the first dimension: [sum_g ceil(nb_g / 2), C, 2]."""
    parts, b0 = [], 0
    for n in _group_blocks(offs):
        parts.append(to_pairs(canon[:, b0:b0 + n], True))
        b0 += n
    C = canon.shape[0]
    return torch.cat(parts) if parts else canon.new_zeros((0, C, 2))


def from_grouped_pairs(pairs: Tensor, offs, width: int) -> Tensor:
    """The NPU's grouped pair layout -> canonical grouped scales [C, width] (zero past the
    real blocks, as lowp::quantize pads them)."""
    p = pairs.view(torch.uint8)
    C = p.shape[1]
    out = torch.zeros((C, width), dtype=torch.uint8, device=p.device)
    b0, r0 = 0, 0
    for n in _group_blocks(offs):
        half = -(-n // 2)
        out[:, b0:b0 + n] = from_pairs(p[r0:r0 + half], n, True)
        b0, r0 = b0 + n, r0 + half
    return out


def _empty(dev) -> Tensor:
    return torch.empty(0, dtype=torch.uint8, device=dev)


def _mx_quant(mod):
    def run(x, format, scaling, scale_mode, pow2, eps, axis, offs=None, scale=None):
        R, C = x.shape
        alg, dt = _ALG[scale_mode], FP8_DTYPES[format]
        out = [_empty(x.device)] * 4
        if axis in ("row", "both"):
            y, s = mod.npu_dynamic_mx_quant(x, axis=-1, round_mode="rint", dst_type=dt,
                                            block_size=32, scale_alg=alg)
            out[0], out[1] = y.view(torch.uint8), from_pairs(s, -(-C // 32), False)
        if axis in ("col", "both"):
            y, s = mod.npu_dynamic_mx_quant(x, axis=-2, round_mode="rint", dst_type=dt,
                                            block_size=32, scale_alg=alg)
            out[2] = y.view(torch.uint8).t().contiguous()
            out[3] = from_pairs(s, -(-R // 32), True)
        return tuple(out)

    return run


def _mx_dual(mod):
    def run(x, format, scaling, scale_mode, pow2, eps, axis, offs=None, scale=None):
        R, C = x.shape
        y1, s1, y2, s2 = mod.npu_dynamic_mx_quant_with_dual_axis(
            x, round_mode="rint", dst_type=FP8_DTYPES[format], scale_alg=_ALG[scale_mode])
        return (y1.view(torch.uint8), from_pairs(s1, -(-C // 32), False),
                y2.view(torch.uint8).t().contiguous(), from_pairs(s2, -(-R // 32), True))

    return run


def _block_quant(mod):
    def run(x, format, scaling, scale_mode, pow2, eps, axis, offs=None, scale=None):
        R, C = x.shape
        y, s1, _ = mod.npu_dynamic_block_mx_quant(x, round_mode="rint",
                                                  dst_type=FP8_DTYPES[format], scale_alg=0)
        grid = from_pairs(s1, -(-C // 32), False)[::32].contiguous()  # one row per 32 rows
        d = y.view(torch.uint8)
        out = [_empty(x.device)] * 4
        if axis in ("row", "both"):
            out[0], out[1] = d, grid
        if axis in ("col", "both"):
            out[2], out[3] = d.t().contiguous(), grid.t().contiguous()
        return tuple(out)

    return run


def _grouped_quant(mod):
    def run(x, format, scaling, scale_mode, pow2, eps, axis, offs=None, scale=None):
        T, C = x.shape
        y, s = mod.npu_grouped_dynamic_mx_quant(x, offs.to(torch.int32), round_mode="rint",
                                                dst_type=FP8_DTYPES[format], blocksize=32,
                                                scale_alg=_ALG[scale_mode])
        width = -(-T // 32) + offs.numel()  # lowp::quantize's static bound
        e = _empty(x.device)
        return e, e, y.view(torch.uint8).t().contiguous(), from_grouped_pairs(s, offs.tolist(),
                                                                              width)

    return run


def _grouped_mm_mx(mod):
    """split-M: a [T, k] and b [G, N, k] with mx32 scales along k; split-K (wgrad): a = dY^T
    [N, T] and b = X^T [K, T] with grouped scales along the tokens."""

    def run(a, a_scale, a_format, a_scaling, b, b_scale, b_format, b_scaling, offs, k, wgrad,
            out_dtype="f32", b_kn=False):
        e8m0, ol = torch.float8_e8m0fnu, offs.tolist()
        if not wgrad:
            w = fp8(b, b_format).transpose(-2, -1)  # [G, k, N]
            ws = torch.stack([to_pairs(b_scale[g], True) for g in range(b.shape[0])])
            xs = to_pairs(a_scale, False)
            group_type = 0
        else:  # x = a [N, T] grouped along its columns; weight = b^T [T, K]
            w = fp8(b, b_format).t()
            ws = to_grouped_pairs(b_scale, ol)
            xs = to_grouped_pairs(a_scale, ol).permute(1, 0, 2)  # [N, P, 2]
            group_type = 2
        out = mod.npu_grouped_matmul(
            [fp8(a, a_format)], [w], scale=[ws.view(e8m0)], per_token_scale=[xs.view(e8m0)],
            group_list=offs.to(torch.int64), group_list_type=0, group_type=group_type,
            split_item=3, output_dtype=OUT_DTYPES[out_dtype], scale_dtype=e8m0,
            per_token_scale_dtype=e8m0)
        return out[0]

    return run


def _quant_matmul_mx(mod):
    def run(a, a_scale, a_format, a_scaling, b, b_scale, b_format, b_scaling, k,
            out_dtype="f32", b_kn=False):
        e8m0 = torch.float8_e8m0fnu
        return mod.npu_quant_matmul(
            fp8(a, a_format), fp8(b, b_format).t(), to_pairs(b_scale, True).view(e8m0),
            pertoken_scale=to_pairs(a_scale, False).view(e8m0),
            output_dtype=OUT_DTYPES[out_dtype], scale_dtype=e8m0, pertoken_scale_dtype=e8m0,
            group_sizes=[1, 1, 32])

    return run


def _quant_matmul_block(mod):
    def run(a, a_scale, a_format, a_scaling, b, b_scale, b_format, b_scaling, k,
            out_dtype="f32", b_kn=False):
        return mod.npu_quant_matmul(
            fp8(a, a_format), fp8(b, b_format).t(), b_scale.t().contiguous(),
            pertoken_scale=a_scale, output_dtype=OUT_DTYPES[out_dtype],
            group_sizes=[1, 128, 128])

    return run


def _quant_supports(axes, scaling="mx32", modes=("rceil", "floor")):
    def supports(key: KernelKey) -> bool:
        return (key.op == "quantize" and key.scaling == scaling and key.format in FP8_DTYPES
                and key.scale_mode in modes and key.axis in axes
                and key.dtype == torch.bfloat16 and not key.grouped and not key.stacked)

    return supports


def _grouped_quant_supports(key: KernelKey) -> bool:
    return (key.op == "quantize" and key.scaling == "mx32" and key.format in FP8_DTYPES
            and key.scale_mode in _ALG and key.axis == "col" and key.grouped
            and key.dtype == torch.bfloat16)


def _grouped_mm_supports(key: KernelKey) -> bool:
    return (key.op == "scaled_grouped_mm" and key.scaling == key.b_scaling == "mx32"
            and key.format in FP8_DTYPES and key.b_format in FP8_DTYPES and not key.b_kn)


def _mm_supports(sa, sb, formats):
    def supports(key: KernelKey) -> bool:
        return (key.op == "scaled_mm" and key.scaling == sa and key.b_scaling == sb
                and key.format in formats and key.b_format in formats and not key.b_kn)

    return supports


def kernels(mod):
    """(op, name, fn, supports) of the NPU kernels over module `mod` (torch_npu, or a module
    with its functions)."""
    fp8s = tuple(FP8_DTYPES)
    return [
        ("quantize", "npu.dynamic_mx_quant", _mx_quant(mod), _quant_supports(("row", "col"))),
        ("quantize", "npu.dynamic_mx_quant_with_dual_axis", _mx_dual(mod),
         _quant_supports(("both",))),
        ("quantize", "npu.dynamic_block_mx_quant", _block_quant(mod),
         _quant_supports(("row", "col", "both"), "block32x32", ("floor",))),
        ("scaled_mm", "npu.quant_matmul.mx", _quant_matmul_mx(mod),
         _mm_supports("mx32", "mx32", fp8s)),
        ("scaled_mm", "npu.quant_matmul.block_fp8", _quant_matmul_block(mod),
         _mm_supports("block128", "block128x128", ("e4m3",))),
        ("quantize", "npu.grouped_dynamic_mx_quant", _grouped_quant(mod),
         _grouped_quant_supports),
        ("scaled_grouped_mm", "npu.grouped_matmul.mx", _grouped_mm_mx(mod),
         _grouped_mm_supports),
    ]


def register(device_type: str = "npu", module=None) -> None:
    """Register the NPU kernels for device_type, over `module` (default: torch_npu, only if
    the user has imported it)."""
    mod = module if module is not None else sys.modules.get("torch_npu")
    if mod is None:
        return
    register_once(device_type, kernels(mod))
