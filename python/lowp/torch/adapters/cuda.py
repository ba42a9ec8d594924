"""CUDA's native FP8/MX GEMMs as lowp kernels, each gated on the device's compute capability
(unverified on hardware in this repository: no GPU ran them; run
`python -m lowp.torch.check_device --device cuda` first):

- "cuda.scaled_mm.tensor_row" (SM89+): `torch._scaled_mm`, FP8 tensorwise and rowwise (rowwise
  with BF16 output, as torch requires); K and N zero-padded to 16;
- "cuda.scaled_mm.block128" (SM90): Block FP8, a 1x128 against b 128x128, binary32 scales
  (a's [M, K/128] passed column-major, b's [N/128, K/128] transposed), BF16 output;
- "cuda.scaled_mm.mx" (SM100): MXFP8 (E4M3/E5M2) with E8M0 scales in cuBLAS's swizzled layout
  (`cublas_scales`), K padded to 32 with zero codes;
- "cuda.scaled_grouped_mm.row" (SM90+): `torch._scaled_grouped_mm`, split-M rowwise.

Without a GPU (CI), `register()` registers nothing; the module imports cleanly anywhere.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from ..device_kernels import KernelKey
from ._common import OUT_DTYPES, fp8, register_once, scaled_mm_tensor_row, tensor_row_supports


def cublas_scales(canon: Tensor) -> Tensor:
    """Canonical E8M0 scales [sr, sc] -> cuBLAS's swizzled bytes (include/lowp/layout.h):
    zero-padded to [ceil(sr/128)*128, ceil(sc/4)*4], 128x4 tiles in row-major tile order, tile
    element (r, c) at byte (r % 32) * 16 + (r // 32) * 4 + c. Returns a flat uint8 tensor."""
    sr, sc = canon.shape
    R, C = -(-sr // 128) * 128, -(-sc // 4) * 4
    p = F.pad(canon, (0, C - sc, 0, R - sr))
    t = p.reshape(R // 128, 4, 32, C // 4, 4)  # [tile row, r // 32, r % 32, tile col, c]
    return t.permute(0, 3, 2, 1, 4).reshape(-1).contiguous()


def _tensor_row(*args, **kwargs):
    return scaled_mm_tensor_row(*args, **kwargs, pad_to=16, col_major_b=True)


def _block128(a, a_scale, a_format, a_scaling, b, b_scale, b_format, b_scaling, k,
              out_dtype="f32", b_kn=False):
    M, N = a.shape[0], b.shape[0]
    sa = a_scale.t().contiguous().t()  # [M, K/128], column-major
    sb = b_scale.t()  # [K/128, N/128]
    out = torch._scaled_mm(fp8(a, a_format), fp8(b, b_format).t(), scale_a=sa, scale_b=sb,
                           out_dtype=OUT_DTYPES[out_dtype])
    return out[:M, :N]


def _mx(a, a_scale, a_format, a_scaling, b, b_scale, b_format, b_scaling, k, out_dtype="f32",
        b_kn=False):
    Kp = -(-k // 32) * 32
    a8, b8 = F.pad(a, (0, Kp - k)), F.pad(b, (0, Kp - k))
    sa = cublas_scales(a_scale).view(torch.float8_e8m0fnu)
    sb = cublas_scales(b_scale).view(torch.float8_e8m0fnu)
    return torch._scaled_mm(fp8(a8, a_format), fp8(b8, b_format).t(), scale_a=sa, scale_b=sb,
                            out_dtype=OUT_DTYPES[out_dtype])


def _grouped_row(a, a_scale, a_format, a_scaling, b, b_scale, b_format, b_scaling, offs, k,
                 wgrad, out_dtype="f32", b_kn=False):
    out = torch._scaled_grouped_mm(fp8(a, a_format), fp8(b, b_format).transpose(-2, -1),
                                   a_scale.reshape(-1), b_scale.reshape(b.shape[0], -1),
                                   offs=offs.to(torch.int32), out_dtype=torch.bfloat16)
    return out.to(OUT_DTYPES[out_dtype])


_TENSOR_ROW = tensor_row_supports()


def _tensor_row_supports(key: KernelKey) -> bool:
    """cuBLASLt: no E5M2 x E5M2; rowwise scales only with BF16 output."""
    return (_TENSOR_ROW(key) and not key.format == key.b_format == "e5m2"
            and (key.scaling == "tensor" or key.out_dtype == "bf16"))


def _block128_supports(key: KernelKey) -> bool:
    return (key.op == "scaled_mm" and key.scaling == "block128" and not key.b_kn
            and key.b_scaling == "block128x128" and key.format == key.b_format == "e4m3"
            and key.out_dtype == "bf16")


def _mx_supports(key: KernelKey) -> bool:
    return (key.op == "scaled_mm" and key.scaling == key.b_scaling == "mx32" and not key.b_kn
            and key.format in ("e4m3", "e5m2") and key.b_format in ("e4m3", "e5m2"))


def _grouped_supports(key: KernelKey) -> bool:
    return (key.op == "scaled_grouped_mm" and not key.wgrad and not key.b_kn
            and key.scaling == key.b_scaling == "row" and key.format == key.b_format == "e4m3")


def kernels(capability):
    """(op, name, fn, supports, minimum capability) of the kernels a device of `capability`
    (major, minor) runs."""
    sm = capability[0] * 10 + capability[1]
    every = [
        ("scaled_mm", "cuda.scaled_mm.tensor_row", _tensor_row, _tensor_row_supports, 89),
        ("scaled_mm", "cuda.scaled_mm.block128", _block128, _block128_supports, 90),
        ("scaled_mm", "cuda.scaled_mm.mx", _mx, _mx_supports, 100),
        ("scaled_grouped_mm", "cuda.scaled_grouped_mm.row", _grouped_row, _grouped_supports, 90),
    ]
    # Block FP8 through _scaled_mm is SM90 only (not SM100's MX path)
    return [(op, n, fn, sup) for op, n, fn, sup, lo in every
            if sm >= lo and not (n.endswith("block128") and sm >= 100)]


def register() -> None:
    if not torch.cuda.is_available():
        return
    register_once("cuda", kernels(torch.cuda.get_device_capability()))
