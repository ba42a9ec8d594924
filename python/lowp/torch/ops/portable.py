"""The portable path: lowp's quantization and GEMM rules written with plain torch operations.

Tensors on a device other than the CPU (CUDA, NPU, XPU, MPS...) run these functions; on the CPU
they run only under `lowp.torch.kernel_preference("portable")` (the tests compare them with
the native
kernels byte for byte). Every rule is docs/numerics.md: element encoding
(round to nearest even, satfinite), E8M0 block scales (RCEIL, FLOOR, CEIL, EVEN), binary32
scales, and the GEMM's block-wise scale combination. Bit manipulations go through integer
views (`x.view(torch.int32)`), never through `log2`/`exp2`, so that the bytes do not depend on a
device's transcendental functions; the only float operations are IEEE multiplies, divisions,
comparisons and matmuls whose products are exact (the 128-block GEMMs aside: they dequantize to
binary32 and stay within section 6's bound).

Each GEMM is one vendor matmul on exactly represented operands: MX scales folded into the
values relative to each row's largest block exponent (exact in BF16), FP8 codes as they are;
rows whose scales leave the range where that is exact (and NaN/Inf would move) take the
block-by-block reference route. On the CPU the matmul runs in binary32, where torch's BF16
matmul would round its output to BF16. The grouped GEMMs (split-M, split-K) fold every group
at once and multiply them in one `torch._grouped_mm` where it takes the operands (binary32 on
the CPU, whose kernel gives BF16 operands only a BF16 output), else group by group; the CPU
keeps split-M group by group (faster there, see _SPLIT_M_LOOP_DEVICES).

A quantized operand is a `LowpQTensor` (`qtensor.py`): element codes (`uint8`, E2M1 packed two
per byte, element 2i in the low nibble), scales in lowp's canonical 2-D layout (E8M0 `uint8` or
binary32 scale_inv), format and scaling names, the logical shape `[rows, cols]` (cols is the
quantized, reduction dimension) and, for a copy quantized along tokens in groups, the group
ends `offs`. A plain (not quantized) GEMM operand is a `LowpQTensor` with scaling "none" whose
`qdata` is the float32 or bfloat16 tensor itself.
"""

from __future__ import annotations

import contextlib
import struct
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch

from ... import rules
from .._autocast import exact
from .philox import philox_words
from .qtensor import LowpQTensor

__all__ = [
    "FORMATS",
    "encode",
    "decode",
    "e8m0_codes",
    "fp32_scales",
    "quantize",
    "quantize_grouped",
    "dequantize",
    "gemm",
    "grouped_gemm",
    "grouped_gemm_wgrad",
    "scale_shape",
    "block_of",
]


def _f32(v: float) -> float:
    """v rounded to binary32 (as a Python float)."""
    return struct.unpack("<f", struct.pack("<f", v))[0]


@dataclass(frozen=True)
class _Fmt:
    name: str
    bits: int
    mbits: int
    bias: int
    max_code: int  # magnitude code of fmax
    nan_code: int  # code emitted for NaN (E2M1: 0, no sign)
    fmax: float
    emax: int


# The C library's tables (lowp.rules): the element formats (signed, 8 bits or fewer) and the
# scaling kinds' traits.
FORMATS = {n: _Fmt(n, f["bits"], f["mbits"], f["bias"], f["max_code"], f["nan_code"], f["fmax"],
                   f["emax"])
           for n, f in ((n, rules.TABLES["formats"][n]) for n in rules.names("formats"))
           if f["signed"] and f["bits"] <= 8}

E8M0_KINDS = rules.kinds(scale="e8m0")
FP32_KINDS = rules.kinds(scale="f32")
NV_KINDS = rules.kinds(tensor_scale=True)  # NVFP4: E4M3 block codes and a binary32 tensor scale
TILE_KINDS = rules.kinds(tile=True)
TOKEN_BLOCK_KINDS = rules.kinds(grouped=True)  # grouped copies restart
SCALINGS = rules.kinds()
SCALE_MODES = tuple(m for m in rules.names("scale_modes") if m != "default")

_F32_MAX = _f32(3.4028234663852886e38)
_NV_SIXTH = _f32(1.0 / 6.0)  # 0x3E2AAAAB, docs/numerics.md 4b
_NV_NUM = 2688.0  # E4M3 fmax times E2M1 fmax
_NV_NAN = 0x7F  # the block scale code of a block holding a NaN or an Inf


def block_of(scaling: str) -> int:
    """Block size along the quantized dimension (0: the whole row)."""
    return rules.TABLES["scalings"][scaling]["block_cols"] if scaling in SCALINGS else 0


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def scale_shape(scaling: str, rows: int, cols: int, offs: Optional[Sequence[int]] = None):
    """Canonical scale shape of a [rows, cols] copy (grouped: blocks of every group in turn)."""
    if scaling == "tensor":
        return (1, 1)
    if scaling == "row":
        return (rows, 1)
    bs = block_of(scaling)
    if scaling in TILE_KINDS:
        return (_cdiv(rows, bs), _cdiv(cols, bs))
    if offs is not None:
        nb, prev = 0, 0
        for e in offs:
            nb += _cdiv(int(e) - prev, bs)
            prev = int(e)
        return (rows, nb)
    return (rows, _cdiv(cols, bs))


# ---- element formats ----


def encode(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """Codes (int32) of binary32 x in `fmt`, RNE, satfinite (docs/numerics.md section 2)."""
    f = FORMATS[fmt]
    u = x.to(torch.float32).contiguous().view(torch.int32)
    a = u & 0x7FFFFFFF
    sbit = ((u >> 31) & 1) << (f.bits - 1)
    e32 = a >> 23
    m24 = (a & 0x7FFFFF) | 0x800000
    e = e32 - 127 + f.bias
    shift = (23 - f.mbits) + torch.clamp(1 - e, min=0)
    # A shift of 25 or more rounds every significand (< 2^24) to 0: clamp so shifts stay legal.
    shift = torch.clamp(shift, max=25)
    half_minus_1 = (torch.ones_like(shift) << (shift - 1)) - 1
    q = (m24 + half_minus_1 + ((m24 >> shift) & 1)) >> shift
    code = torch.where(e >= 1, ((e - 1) << f.mbits) + q, q)
    code = torch.clamp(code, max=f.max_code)
    code = torch.where(a == 0x7F800000, torch.full_like(code, f.max_code), code)  # satfinite Inf
    code = torch.where(e32 == 0, torch.zeros_like(code), code)  # zero and binary32 subnormals
    code = code | sbit
    nan = torch.full_like(code, f.nan_code) | (sbit if f.nan_code else 0)
    return torch.where(a > 0x7F800000, nan, code)


def encode_sr(x: torch.Tensor, fmt: str, r: torch.Tensor) -> torch.Tensor:
    """Codes (int32) of binary32 x in `fmt` with stochastic rounding, satfinite
    (docs/numerics.md section 2, C's encode_sr): the significand as a number of target quanta
    with 32 fraction bits, plus the element's random word r (int64 in [0, 2^32), x's shape),
    truncated. NaN, Inf, zero and binary32 subnormals as `encode`."""
    f = FORMATS[fmt]
    u = x.to(torch.float32).contiguous().view(torch.int32).to(torch.int64)
    a = u & 0x7FFFFFFF
    sbit = ((u >> 31) & 1) << (f.bits - 1)
    e32 = a >> 23
    m24 = (a & 0x7FFFFF) | 0x800000
    e = e32 - 127 + f.bias
    shift = (23 - f.mbits) + torch.clamp(1 - e, min=0)
    up = torch.clamp(32 - shift, min=0)  # shift <= 32: m24 << (32 - shift) (< 2^35)
    down = torch.clamp(shift - 32, 0, 40)  # shift > 32: m24 >> (shift - 32) (0 past 24)
    v = torch.where(shift <= 32, m24 << up, m24 >> down)
    q = (v + r.to(torch.int64)) >> 32
    code = torch.where(e >= 1, ((e - 1) << f.mbits) + q, q)
    code = torch.clamp(code, max=f.max_code)
    code = torch.where(a == 0x7F800000, torch.full_like(code, f.max_code), code)
    code = torch.where(e32 == 0, torch.zeros_like(code), code)
    code = code | sbit
    nan = torch.full_like(code, f.nan_code) | (sbit if f.nan_code else 0)
    return torch.where(a > 0x7F800000, nan, code).to(torch.int32)


def _decode_value(fmt: str, code: int) -> float:
    f = FORMATS[fmt]
    ebits = f.bits - 1 - f.mbits
    mag = code & ((1 << (f.bits - 1)) - 1)
    neg = (code >> (f.bits - 1)) & 1
    ef, mf = mag >> f.mbits, mag & ((1 << f.mbits) - 1)
    if fmt == "e5m2" and ef == (1 << ebits) - 1:
        v = float("inf") if mf == 0 else float("nan")
    elif fmt == "e4m3" and mag == 0x7F:
        v = float("nan")
    elif ef == 0:
        v = mf * 2.0 ** (1 - f.bias - f.mbits)
    else:
        v = (mf | (1 << f.mbits)) * 2.0 ** (ef - f.bias - f.mbits)
    return -v if neg else v


_LUTS = {}


def _lut(fmt: str, device) -> torch.Tensor:
    key = (fmt, str(device))
    t = _LUTS.get(key)
    if t is None:
        n = 1 << FORMATS[fmt].bits
        t = torch.tensor([_decode_value(fmt, c) for c in range(n)], dtype=torch.float32)
        t = t.to(device)
        _LUTS[key] = t
    return t


def decode(codes: torch.Tensor, fmt: str) -> torch.Tensor:
    """binary32 values of unpacked codes (exact). ``index_select`` on the flattened codes gives
    the values of advanced indexing about 7x faster on the CPU."""
    flat = _lut(fmt, codes.device).index_select(0, codes.reshape(-1).long())
    return flat.reshape(codes.shape)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """[R, C] codes -> [R, ceil(C/2)] bytes, element 2i in the low nibble, pad nibble 0."""
    r, c = codes.shape
    if c % 2:
        codes = torch.cat([codes, torch.zeros((r, 1), dtype=codes.dtype, device=codes.device)], 1)
    codes = codes.to(torch.int32)
    return ((codes[:, 0::2] & 0xF) | ((codes[:, 1::2] & 0xF) << 4)).to(torch.uint8)


def unpack(q: LowpQTensor) -> torch.Tensor:
    """Element codes of q as an int32 [rows, cols] tensor."""
    if q.format != "e2m1":
        return q.qdata.reshape(q.rows, q.cols).to(torch.int32)
    d = q.qdata.reshape(q.rows, -1).to(torch.int32)
    out = torch.stack([d & 0xF, (d >> 4) & 0xF], dim=-1).reshape(q.rows, -1)
    return out[:, : q.cols]


# ---- scale rules ----


def _bits_f32(i: torch.Tensor) -> torch.Tensor:
    return i.to(torch.int32).contiguous().view(torch.float32)


def e8m0_codes(amax: torch.Tensor, fmt: str, mode: str) -> torch.Tensor:
    """E8M0 scale codes (int32) of blocks whose binary32 amax is `amax` (docs/numerics.md
    3.1-3.3)."""
    f = FORMATS[fmt]
    amax = amax.to(torch.float32).contiguous()
    a = amax.view(torch.int32) & 0x7FFFFFFF
    E, M = a >> 23, a & 0x7FFFFF
    if mode == "floor":
        e = E - f.emax
    elif mode == "ceil":
        e = E + (M != 0).to(torch.int32) - f.emax
    elif mode == "even":
        b = (a + (1 << (22 - f.mbits))) & 0x7F800000  # a < 2^31: the sign bit stays clear
        e = (b >> 23) - f.emax
    elif mode == "rceil":
        d = (amax.abs() * _f32(1.0 / _f32(f.fmax))).contiguous().view(torch.int32) & 0x7FFFFFFF
        de, dm = d >> 23, d & 0x7FFFFF
        e = torch.where(de == 0, (dm > 0x400000).to(torch.int32), de + (dm != 0).to(torch.int32))
    else:
        raise ValueError(f"scale_mode ({mode!r}) is not one of {', '.join(SCALE_MODES)}")
    e = torch.clamp(e, 0, 254)
    e = torch.where(a == 0, torch.zeros_like(e), e)
    return torch.where(a >= 0x7F800000, torch.full_like(e, 0xFF), e)


def _e8m0_quant_factor(code: torch.Tensor) -> torch.Tensor:
    """2^(127 - code), built from bits (code 254 -> 2^-127, a binary32 subnormal)."""
    be = 254 - code
    return _bits_f32(torch.where(be == 0, torch.full_like(be, 0x00400000), be.clamp(min=0) << 23))


def _e8m0_value(code: torch.Tensor) -> torch.Tensor:
    """2^(code - 127) (NaN for 0xFF, 2^-127 for 0x00)."""
    code = code.to(torch.int32)
    v = _bits_f32(torch.where(code == 0, torch.full_like(code, 0x00400000), code << 23))
    return torch.where(code == 0xFF, torch.full_like(v, float("nan")), v)


def fp32_scales(amax: torch.Tensor, fmt: str, eps: float, pow2: bool) -> torch.Tensor:
    """Binary32 scales of groups whose amax is `amax` (docs/numerics.md section 4, steps 1-3)."""
    fmax = FORMATS[fmt].fmax
    amax = amax.to(torch.float32)
    eps = _f32(eps)
    a = torch.where(amax > eps, amax, torch.where(torch.isnan(amax), amax, torch.full_like(amax, eps)))
    bad = (a == 0) | torch.isnan(a) | torch.isinf(a)
    s = torch.full_like(a, fmax) / torch.where(bad, torch.ones_like(a), a)
    s = torch.where(torch.isinf(s), torch.full_like(s, _F32_MAX), s)
    if pow2:
        s = _bits_f32(s.contiguous().view(torch.int32) & 0x7F800000)
    return torch.where(bad, torch.ones_like(s), s)


def _amax(x: torch.Tensor, dims) -> torch.Tensor:
    """max |x| over dims; NaN wins (torch.amax propagates NaN)."""
    return x.abs().amax(dim=dims)


# ---- quantize ----


def _pad_to(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """x [r, c] zero-padded to [rows, cols] (one constant pad, no in-place write)."""
    r, c = x.shape
    if r == rows and c == cols:
        return x
    return torch.nn.functional.pad(x, (0, cols - c, 0, rows - r))


def _enc(y: torch.Tensor, fmt: str, r: Optional[torch.Tensor]) -> torch.Tensor:
    """Element codes of y: RNE, or (r: the elements' random words, y's shape) SR."""
    return encode(y, fmt) if r is None else encode_sr(y, fmt, r)


def sr_words(seed: int, offset: int, rows: int, cols: int, device) -> torch.Tensor:
    """The SR words of a [rows, cols] copy: element (i, j) takes word offset + i * cols + j of
    stream seed (int64 [rows, cols])."""
    return philox_words(seed, offset, rows * cols, device).reshape(rows, cols)


def _tile_words(r: Optional[torch.Tensor], nbr: int, nbc: int, bs: int):
    """SR words r [R, C] laid out as the padded tiles [nbr, bs, nbc, bs] (None stays None)."""
    if r is None:
        return None
    return _pad_to(r, nbr * bs, nbc * bs).reshape(nbr, bs, nbc, bs)


def _quant_rows(x: torch.Tensor, fmt: str, scaling: str, mode: str, eps: float, pow2: bool,
                scale: Optional[torch.Tensor], r: Optional[torch.Tensor] = None):
    """Rowwise quantization of float32 x [R, C] (blocks along C). Returns (codes int32, scales).
    r: None (RNE), or the elements' SR words (int64 [R, C])."""
    R, C = x.shape
    f = FORMATS[fmt]
    if scaling in NV_KINDS:
        return _quant_nv(x, scaling, scale, r)
    if scaling == "tensor":
        if scale is None:
            s = fp32_scales(_amax(x, (0, 1)) if x.numel() else torch.zeros((), device=x.device),
                            fmt, eps, pow2)
        else:
            s = scale.to(device=x.device, dtype=torch.float32).reshape(())
        codes = _enc(x * s, fmt, r)
        return codes, (torch.ones_like(s) / s).reshape(1, 1)
    if scaling == "row":
        am = _amax(x, (1,)) if C else torch.zeros(R, device=x.device)
        s = fp32_scales(am, fmt, eps, pow2)
        codes = _enc(x * s[:, None], fmt, r)
        return codes, (torch.ones_like(s) / s).reshape(R, 1)
    bs = block_of(scaling)
    if scaling in TILE_KINDS:
        nbr, nbc = _cdiv(R, bs), _cdiv(C, bs)
        xp = _pad_to(x, nbr * bs, nbc * bs).reshape(nbr, bs, nbc, bs)
        am = _amax(xp, (1, 3))
        if scaling == "block32x32":
            code = e8m0_codes(am, fmt, mode)
            y = xp * _e8m0_quant_factor(code)[:, None, :, None]
            c = _enc(y, fmt, _tile_words(r, nbr, nbc, bs))
            c = torch.where(code[:, None, :, None] == 0xFF, torch.full_like(c, f.nan_code), c)
            sc = code.to(torch.uint8)
        else:
            s = fp32_scales(am, fmt, eps, pow2)
            c = _enc(xp * s[:, None, :, None], fmt, _tile_words(r, nbr, nbc, bs))
            sc = torch.ones_like(s) / s
        return c.reshape(nbr * bs, nbc * bs)[:R, :C], sc
    nb = _cdiv(C, bs)
    xp = _pad_to(x, R, nb * bs).reshape(R, nb, bs)
    am = _amax(xp, (2,)) if nb else torch.zeros((R, 0), device=x.device)

    block = torch.arange(C, device=x.device) // bs  # each column's block

    def per_element(t):  # [R, nb] block values -> [R, C], each repeated over its block
        return t.index_select(1, block)

    # The codes are computed on x itself, not on the padded blocks: inductor (torch 2.15,
    # CPU) wrote only the full blocks of `codes.reshape(R, nb * bs)[:, :C]` when it fused the
    # slice into a cast, leaving a partial last block's bytes unwritten.
    if scaling == "mx32":
        code = e8m0_codes(am, fmt, mode)
        c = _enc(x * per_element(_e8m0_quant_factor(code)), fmt, r)
        c = torch.where(per_element(code == 0xFF), torch.full_like(c, f.nan_code), c)
        sc = code.to(torch.uint8)
    else:
        s = fp32_scales(am, fmt, eps, pow2)
        c = _enc(x * per_element(s), fmt, r)
        sc = torch.ones_like(s) / s
    return c, sc


# ---- NVFP4 (docs/numerics.md 4b) ----


def nv_tensor_scales(amax: torch.Tensor):
    """(S, D) of a tensor whose binary32 amax is `amax` (4b step 1): S = 2688 / amax (one
    rounded division), FLT_MAX where that overflows, 1 for an amax of 0, Inf or NaN; D = 1 / S.
    Both float32 of shape [1]."""
    a = amax.to(torch.float32).reshape(1)
    ok = (a > 0) & (a < float("inf"))  # (False for NaN)
    s = torch.full_like(a, _NV_NUM) / torch.where(ok, a, torch.ones_like(a))
    s = torch.where(torch.isinf(s), torch.full_like(s, _F32_MAX), s)
    s = torch.where(ok, s, torch.ones_like(s))
    return s, torch.ones_like(s) / s


def e4m3_value(code: torch.Tensor) -> torch.Tensor:
    """binary32 values of E4M3 codes (exact; 0x7F and 0xFF are NaN), built from bits."""
    c = code.to(torch.int32)
    mag, m = c & 0x7F, c & 7
    e = mag >> 3
    normal = _bits_f32(((e + 120) << 23) | (m << 20))  # (8 + m) * 2^(e - 10)
    v = torch.where(e == 0, m.to(torch.float32) * _f32(2.0 ** -9), normal)
    v = torch.where((c & 0x80) != 0, -v, v)
    return torch.where(mag == 0x7F, torch.full_like(v, float("nan")), v)


def _nv_blocks(bamax: torch.Tensor, s: torch.Tensor):
    """(E4M3 codes int32, element factors) of blocks whose binary32 amax is bamax, under the
    tensor encode scale s (4b steps 2 and 3)."""
    v = bamax * (s * _NV_SIXTH)
    code = torch.where(torch.isfinite(bamax), encode(v, "e4m3"),
                       torch.full_like(bamax, _NV_NAN, dtype=torch.int32))
    d = torch.ones_like(s) / s
    f = torch.ones_like(v) / (e4m3_value(code) * d)
    return code, torch.where(torch.isinf(f), torch.full_like(f, _F32_MAX), f)


def _quant_nv(x: torch.Tensor, scaling: str, s: torch.Tensor, r: Optional[torch.Tensor] = None):
    """Element codes (int32 [R, C]) and E4M3 block codes (uint8) of float32 x [R, C] under
    the tensor encode scale s (4b steps 2-4): nv16 blocks of 1x16 along the rows, nv16x16
    tiles. A NaN block's elements are code 0."""
    R, C = x.shape
    if scaling == "nv16x16":
        nbr, nbc = _cdiv(R, 16), _cdiv(C, 16)
        xp = _pad_to(x, nbr * 16, nbc * 16).reshape(nbr, 16, nbc, 16)
        code, f = _nv_blocks(_amax(xp, (1, 3)), s)
        c = _enc(xp * f[:, None, :, None], "e2m1", _tile_words(r, nbr, nbc, 16))
        c = torch.where(code[:, None, :, None] == _NV_NAN, torch.zeros_like(c), c)
        return c.reshape(nbr * 16, nbc * 16)[:R, :C], code.to(torch.uint8)
    nb = _cdiv(C, 16)
    xp = _pad_to(x, R, nb * 16).reshape(R, nb, 16)
    am = _amax(xp, (2,)) if nb else torch.zeros((R, 0), device=x.device)
    code, f = _nv_blocks(am, s)
    block = torch.arange(C, device=x.device) // 16  # each column's block (as in _quant_rows)
    c = _enc(x * f.index_select(1, block), "e2m1", r)
    c = torch.where((code == _NV_NAN).index_select(1, block), torch.zeros_like(c), c)
    return c, code.to(torch.uint8)


def _nv_amax_scales(x: torch.Tensor):
    """(S, D) of float32 x from its amax (NaN wins; an empty x has amax 0)."""
    am = _amax(x, (0, 1)) if x.numel() else torch.zeros((), device=x.device)
    return nv_tensor_scales(am)


ROUNDINGS = ("rne", "sr")


def _check_rounding(rounding: str, seed: int, offset: int) -> bool:
    """Whether `rounding` asks for SR (after checking it and the stream position)."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding ({rounding!r}) is not one of {', '.join(ROUNDINGS)}")
    for name, v in (("seed", seed), ("offset", offset)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 64:
            raise ValueError(f"{name} ({v!r}) must be an int in [0, 2^64)")
    return rounding == "sr"


def _finish(codes: torch.Tensor, fmt: str) -> torch.Tensor:
    return pack_e2m1(codes) if fmt == "e2m1" else codes.to(torch.uint8)


def default_mode(scaling: str, mode: Optional[str]) -> str:
    if mode:
        return mode
    return rules.TABLES["scalings"][scaling]["default_mode"] or "rceil"  # rceil: binary32 kinds


def default_pow2(scaling: str, pow2: Optional[bool]) -> bool:
    return rules.TABLES["scalings"][scaling]["default_pow2"] if pow2 is None else bool(pow2)


def quantize(x: torch.Tensor, fmt: str, scaling: str, scale_mode: Optional[str] = None,
             axis: str = "row", eps: float = 0.0, pow2: Optional[bool] = None,
             scale: Optional[torch.Tensor] = None, rounding: str = "rne", seed: int = 0,
             offset: int = 0):
    """Quantize 2-D float32/bfloat16 x [R, C]: returns (row LowpQTensor or None, col
    LowpQTensor or None).

    The columnwise copy is the rowwise quantization of x^T ([C, R]); for the tile kinds it is
    the transpose of the rowwise copy, scales included. `scale` (tensorwise only): the delayed
    scale to multiply by, instead of one from the amax. `rounding` "sr": stochastic rounding of
    the elements, element (i, j) of a copy [rows, cols] taking Philox word
    offset + i * cols + j of stream `seed`, the columnwise copy by its own index (a tile
    kind's columnwise copy then has the rowwise copy's scales, transposed, but its own
    elements)."""
    if fmt not in FORMATS:
        raise ValueError(f"format ({fmt!r}) is not one of e4m3, e5m2, e2m1")
    if scaling not in SCALINGS:
        raise ValueError(f"scaling ({scaling!r}) is not one of {', '.join(SCALINGS)}")
    if fmt == "e2m1" and scaling not in ("mx32",) + NV_KINDS:
        raise ValueError(f"format e2m1 needs scaling mx32, nv16 or nv16x16, not {scaling!r}")
    if scaling in NV_KINDS and fmt != "e2m1":
        raise ValueError(f"scaling {scaling} (NVFP4) needs format e2m1, not {fmt!r}")
    mode = default_mode(scaling, scale_mode)
    p2 = default_pow2(scaling, pow2)
    xf = x.to(torch.float32)
    R, C = xf.shape
    sr = _check_rounding(rounding, seed, offset)
    rw = sr_words(seed, offset, R, C, x.device) if sr else None
    cw = sr_words(seed, offset, C, R, x.device) if sr else None
    row = col = ts = None
    if scaling in NV_KINDS:  # one tensor scale for both copies
        scale, ts = _nv_amax_scales(xf)
    if scaling in TILE_KINDS:
        codes, sc = _quant_rows(xf, fmt, scaling, mode, eps, p2, scale, rw)
        if axis in ("row", "both"):
            row = LowpQTensor(_finish(codes, fmt), sc, fmt, scaling, R, C, tensor_scale=ts)
        if axis in ("col", "both"):
            if sr:  # the columnwise copy's own words: its codes differ from the rowwise copy's
                codes, _ = _quant_rows(xf, fmt, scaling, mode, eps, p2, scale, cw.t())
            col = LowpQTensor(_finish(codes.t().contiguous(), fmt),
                              sc.t().clone(memory_format=torch.contiguous_format), fmt,
                              scaling, C, R, tensor_scale=ts)
        return row, col
    if scaling == "tensor" and scale is None and axis == "both":
        # one scale for both copies
        s = fp32_scales(_amax(xf, (0, 1)) if xf.numel() else torch.zeros((), device=x.device),
                        fmt, eps, p2)
        scale = s
    if axis in ("row", "both"):
        codes, sc = _quant_rows(xf, fmt, scaling, mode, eps, p2, scale, rw)
        row = LowpQTensor(_finish(codes, fmt), sc, fmt, scaling, R, C, tensor_scale=ts)
    if axis in ("col", "both"):
        codes, sc = _quant_rows(xf.t().contiguous(), fmt, scaling, mode, eps, p2, scale, cw)
        col = LowpQTensor(_finish(codes, fmt), sc, fmt, scaling, C, R, tensor_scale=ts)
    return row, col


def quantize_grouped(x: torch.Tensor, offs: Sequence[int], fmt: str, scaling: str,
                     scale_mode: Optional[str] = None, eps: float = 0.0,
                     pow2: Optional[bool] = None, rounding: str = "rne", seed: int = 0,
                     offset: int = 0) -> LowpQTensor:
    """Columnwise copy [K, M] of x [M, K] (tokens x features) whose token blocks restart at
    every group end in offs (mx32, block128, nv16); tokens past offs[-1] hold code 0. An nv16
    copy's tensor scale is that of the tokens in groups (docs/numerics.md 4b step 1)."""
    if scaling not in TOKEN_BLOCK_KINDS:
        raise ValueError(f"grouped quantization needs scaling {', '.join(TOKEN_BLOCK_KINDS)}, "
                         f"not {scaling!r}")
    mode = default_mode(scaling, scale_mode)
    p2 = default_pow2(scaling, pow2)
    xf = x.to(torch.float32)
    M, K = xf.shape
    offs = [int(o) for o in offs]
    words = sr_words(seed, offset, K, M, x.device) if _check_rounding(rounding, seed,
                                                                       offset) else None
    s = ts = None
    if scaling in NV_KINDS:
        s, ts = _nv_amax_scales(xf[:offs[-1] if offs else 0])
    codes: List[torch.Tensor] = []
    scales: List[torch.Tensor] = []
    start = 0
    for end in offs:
        if end > start:
            c, sc = _quant_rows(xf[start:end].t().contiguous(), fmt, scaling, mode, eps, p2, s,
                                None if words is None else words[:, start:end])
            codes.append(c)
            scales.append(sc)
        start = end
    if start < M:
        codes.append(torch.zeros((K, M - start), dtype=torch.int32, device=x.device))
    sdt = torch.uint8 if scaling in E8M0_KINDS + NV_KINDS else torch.float32
    c = torch.cat(codes, 1) if codes else torch.zeros((K, M), dtype=torch.int32, device=x.device)
    sc = torch.cat(scales, 1) if scales else torch.zeros((K, 0), dtype=sdt, device=x.device)
    return LowpQTensor(_finish(c, fmt), sc, fmt, scaling, K, M, tuple(offs), tensor_scale=ts)


# ---- dequantize ----


def _group_blocks(offs: Sequence[int], bs: int):
    """(start, end, first block) of every group."""
    out, start, blk = [], 0, 0
    for end in offs:
        end = int(end)
        out.append((start, end, blk))
        blk += _cdiv(end - start, bs)
        start = end
    return out


def _elem_factors(q: LowpQTensor) -> torch.Tensor:
    """Per-element decode factor [rows, cols] (0 for grouped columns past the last group)."""
    R, C = q.rows, q.cols
    dev = q.qdata.device
    if q.scaling == "tensor":
        return q.scale.reshape(1, 1).expand(R, C)
    if q.scaling == "row":
        return q.scale.reshape(R, 1).expand(R, C)
    bs = block_of(q.scaling)
    if q.scaling in E8M0_KINDS:
        sv = _e8m0_value(q.scale)
    else:
        sv = e4m3_value(q.scale) if q.scaling in NV_KINDS else q.scale
    if q.scaling in TILE_KINDS:
        return sv.repeat_interleave(bs, 0).repeat_interleave(bs, 1)[:R, :C]
    if q.offs is None:
        return sv.repeat_interleave(bs, 1)[:, :C] if C else sv.new_zeros((R, 0))
    parts = []
    for start, end, blk in _group_blocks(q.offs, bs):
        n = end - start
        if n:
            nb = _cdiv(n, bs)
            parts.append(sv[:, blk:blk + nb].repeat_interleave(bs, 1)[:, :n])
    used = int(q.offs[-1]) if len(q.offs) else 0
    if used < C:
        parts.append(torch.zeros((R, C - used), dtype=torch.float32, device=dev))
    return torch.cat(parts, 1) if parts else torch.zeros((R, C), dtype=torch.float32, device=dev)


def dequantize(q: LowpQTensor) -> torch.Tensor:
    """binary32 values of q (docs/numerics.md sections 3.5, 4.4 and 4b step 5)."""
    if q.scaling == "none":
        return q.qdata.to(torch.float32)
    v = decode(unpack(q), q.format) * _elem_factors(q)
    return v * q.tensor_scale.reshape(1, 1) if q.scaling in NV_KINDS else v


# ---- GEMM ----


# The pairs lowp multiplies, (a format, a scaling, b format, b scaling): the C library's
# (src/core/gemm_pair.c, through lowp.rules); below, which of this module's GEMM routes runs one.
_GEMM_PAIRS = frozenset(rules.TABLES["gemm_pairs"])
_ROUTES = {("none", "none"): "plain", ("tensor", "tensor"): "tensor", ("row", "row"): "row",
           ("mx32", "mx32"): "mx", ("mx32", "block32x32"): "mx_b32",
           ("block128", "block128"): "b128", ("block128", "block128x128"): "b128",
           **dict.fromkeys(((a, b) for a in NV_KINDS for b in NV_KINDS), "nv")}
_PLAIN = {torch.float32: "f32", torch.bfloat16: "bf16"}


def _pair(a: LowpQTensor, b: LowpQTensor) -> str:
    sa, sb = a.scaling, b.scaling
    if sa == "none" and sb == "none":
        fa, fb = _PLAIN.get(a.qdata.dtype), _PLAIN.get(b.qdata.dtype)
        if (fa, sa, fb, sb) not in _GEMM_PAIRS:
            raise ValueError(f"plain operand pair a ({a.qdata.dtype}) x b ({b.qdata.dtype}) is not "
                             "float32 x float32 or bfloat16 x bfloat16")
    elif (a.format, sa, b.format, sb) not in _GEMM_PAIRS:
        raise ValueError(f"operand pair a ({sa} {a.format}) x b ({sb} {b.format}) is not supported "
                         "(pairs: none x none, tensor x tensor, row x row, mx32 x mx32, "
                         "block128 x block128x128, block128 x block128, mx32 x block32x32, "
                         "nv16 or nv16x16 x nv16 or nv16x16)")
    return _ROUTES[(sa, sb)]


def _pow2_int(e: torch.Tensor) -> torch.Tensor:
    """2^e for integer e in [-127, 127], from bits."""
    be = e + 127
    return _bits_f32(torch.where(be == 0, torch.full_like(be, 0x00400000), be.clamp(min=0) << 23))


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [M, k] @ b[N, k]^T in binary32 (products of 8-bit codes are exact), with autocast off
    for the tensors' device type (under autocast torch would multiply in the autocast dtype)."""
    with exact(a.device.type):
        return a @ b.t()


_NO_OUT_DTYPE = set()  # device types whose torch.mm has no out_dtype (the CPU in torch 2.15)


def _mm_exact(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [M, k] @ b[N, k]^T with binary32 accumulation and output, for operands whose every
    element is exact in BF16 (so every product is exact in binary32): one BF16 matmul with
    `out_dtype=torch.float32` where the device has it, else one binary32 matmul of the same
    values (the CPU: its BF16 matmul rounds the output to BF16)."""
    dev = a.device.type
    if dev not in _NO_OUT_DTYPE:
        try:
            with exact(dev):
                return torch.mm(a.to(torch.bfloat16), b.to(torch.bfloat16).t(),
                                out_dtype=torch.float32)
        except torch.OutOfMemoryError:
            raise  # not a missing kernel
        except (RuntimeError, TypeError, NotImplementedError):
            _NO_OUT_DTYPE.add(dev)
    return _mm(a.to(torch.float32), b.to(torch.float32))


def _ldexp2(c: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """c * 2^e for integer e in [-254, 254], in two exact power-of-two steps."""
    e1 = torch.div(e, 2, rounding_mode="floor")
    return c * _pow2_int(e1) * _pow2_int(e - e1)


def _mx_loop(av, ca, bv, cb) -> torch.Tensor:
    """The reference route (docs/numerics.md section 6): per 32-block binary32 sums times
    2^(eA + eB). av [M, K], bv [N, K] decoded codes; ca [M, nb], cb [N, nb] int32 E8M0 codes."""
    M, N, K = av.shape[0], bv.shape[0], av.shape[1]
    acc = torch.zeros((M, N), dtype=torch.float32, device=av.device)
    for blk, k in enumerate(range(0, K, 32)):
        s = _mm(av[:, k:k + 32], bv[:, k:k + 32])
        ea, eb = ca[:, blk][:, None], cb[:, blk][None, :]
        s = _ldexp2(s, ea + eb - 254)  # combined as integers: 2^-127 * 2^-127 would underflow
        acc = acc + torch.where((ea == 0xFF) | (eb == 0xFF), torch.full_like(s, float("nan")), s)
    return acc


_MX_SPREAD = 40  # the widest exponent spread of one row's live blocks that the fold takes
_MX_REACH = 45  # the largest |r - 127| of a row that the fold takes


def _mx_fold(v: torch.Tensor, codes: torch.Tensor):
    """Fold an MX operand's scales into its values, relative to each row's largest live block
    code r: v * 2^(code - r). The fold takes the rows whose live (nonzero, not 0xFF) blocks lie
    within _MX_SPREAD binades of r, and r within _MX_REACH of 127: every folded element is then
    exact in BF16, every product of two is an exact normal binary32 number, and no block's
    contribution 2^(eA + eB) * sum can overflow, so NaN and Inf land where the reference puts
    them. The other ("deep") rows take the reference route. Returns (folded [R, K], r [R],
    deep rows, NaN rows)."""
    R, K = v.shape
    nb = codes.shape[1]
    vp = torch.nn.functional.pad(v, (0, nb * 32 - K)).reshape(R, nb, 32)
    live = (vp != 0).any(-1) & (codes != 0xFF)
    r = torch.where(live, codes, torch.full_like(codes, -1)).amax(1, keepdim=True) if nb else \
        codes.new_full((R, 1), -1)
    r = torch.where(r < 0, torch.full_like(r, 127), r)
    deep = (live & (codes < r - _MX_SPREAD)).any(1) | ((r[:, 0] - 127).abs() > _MX_REACH)
    f = _pow2_int((codes - r).clamp(min=-_MX_SPREAD - 1))
    f = torch.where(live, f, torch.zeros_like(f))  # dead blocks: zeros (NaN rows are set after)
    folded = (vp * f[:, :, None]).reshape(R, nb * 32)[:, :K]
    return folded, r[:, 0], deep, (codes == 0xFF).any(1)


def _gemm_mx(av, ca, bv, cb) -> torch.Tensor:
    """MX x MX (and MX x block32x32, cb given per row of B): one matmul of the folded operands,
    the row exponents applied to the output; rows outside the fold's range take _mx_loop."""
    fa, ra, deep_a, nan_a = _mx_fold(av, ca)
    fb, rb, deep_b, nan_b = _mx_fold(bv, cb)
    # 2^(rA + rB - 254) as 2^(rA - 127) * 2^(rB - 127): both normal where |r - 127| <= _MX_REACH
    # (the deep rows' factors are placeholders: those rows are computed again below)
    sa = _pow2_int((ra - 127).clamp(-_MX_REACH, _MX_REACH))
    sb = _pow2_int((rb - 127).clamp(-_MX_REACH, _MX_REACH))
    c = _mm_exact(fa, fb) * sa[:, None] * sb[None, :]
    if c.device.type != "meta" and (bool(nan_a.any()) or bool(nan_b.any())):
        c = torch.where(nan_a[:, None] | nan_b[None, :], torch.full_like(c, float("nan")), c)
    return _redo_rows(c, deep_a, deep_b, _mx_loop, (av, ca), (bv, cb))


def _redo_rows(c, bad_a, bad_b, loop, a, b) -> torch.Tensor:
    """C with its rows bad_a and columns bad_b (those the one-matmul route cannot take exactly)
    computed again by `loop(a values, a scales, b values, b scales)`. Data-dependent (a host
    sync), so skipped on the meta device, which has shapes only."""
    if c.device.type == "meta":
        return c
    ia = bad_a.nonzero()[:, 0]
    if ia.numel():
        c[ia] = loop(a[0][ia], a[1][ia], *b)
    ib = bad_b.nonzero()[:, 0]
    if ib.numel():
        c[:, ib] = loop(*a, b[0][ib], b[1][ib])
    return c


@contextlib.contextmanager
def _ieee_f32():
    """binary32 matmuls in full binary32 inside (float32 matmul precision "highest": no TF32 or
    reduced-precision internal passes, which would round the dequantized 128-block operands;
    the codes and the BF16-exact folds need no guard)."""
    prev = torch.get_float32_matmul_precision()
    if prev == "highest":
        yield
        return
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(prev)


def _b128_loop(av, sa, bv, sb) -> torch.Tensor:
    """The reference route for 128-blocks: per-block binary32 sums times scale_inv_A, then
    scale_inv_B (docs/numerics.md section 6)."""
    M, N, K = av.shape[0], bv.shape[0], av.shape[1]
    acc = torch.zeros((M, N), dtype=torch.float32, device=av.device)
    for blk, k in enumerate(range(0, K, 128)):
        s = _mm(av[:, k:k + 128], bv[:, k:k + 128])
        acc = acc + s * sa[:, blk][:, None] * sb[:, blk][None, :]
    return acc


_B128_RANGE = (2.0 ** -40, 2.0 ** 40)  # scale_invs whose dequantized products stay normal


def _gemm_b128(av, sa, bv, sb) -> torch.Tensor:
    """128-blocks: binary32 dequantization of both operands (each element rounded once) and one
    binary32 matmul: 4.4x faster than a batched matmul over the K/128 blocks plus the scaled
    sum on this project's CPU (4096 x 1024 x 4096, one thread). Rows with a scale_inv outside
    _B128_RANGE (or not finite) in a nonzero block take _b128_loop."""
    K = av.shape[1]

    def deq(v, s):
        R, nb = s.shape
        vp = torch.nn.functional.pad(v, (0, nb * 128 - K)).reshape(R, nb, 128)
        live = (vp != 0).any(-1)
        ok = (s.abs() >= _B128_RANGE[0]) & (s.abs() <= _B128_RANGE[1])
        return (vp * s[:, :, None]).reshape(R, nb * 128)[:, :K], (live & ~ok).any(1)

    da, bad_a = deq(av, sa)
    db, bad_b = deq(bv, sb)
    with _ieee_f32():
        c = _mm(da, db)
    return _redo_rows(c, bad_a, bad_b, _b128_loop, (av, sa), (bv, sb))


def _gemm_nv(a: LowpQTensor, av: torch.Tensor, b: LowpQTensor, bv: torch.Tensor):
    """NVFP4 x NVFP4: each E2M1 value times its E4M3 block scale is exact in BF16 (at most 6
    significant bits, magnitudes in [2^-10, 2688]: always normal), and the product of two
    such values is exact in binary32, so one matmul with binary32 accumulation differs from
    the reference's block sums only in the order of its roundings (section 6's bound); then
    the tensor scales, (acc * D_A) * D_B as the reference. A NaN block scale makes its
    folded block NaN, so NaN lands in the rows and columns where the reference puts it."""
    acc = _mm_exact(av * _elem_factors(a), bv * _elem_factors(b))
    return acc * a.tensor_scale.reshape(1, 1) * b.tensor_scale.reshape(1, 1)


def gemm(a: LowpQTensor, b: LowpQTensor) -> torch.Tensor:
    """C[M, N] = A[M, K] . B[N, K]^T in binary32 (docs/numerics.md section 6), each pair as one
    matmul on exactly represented operands (only the summation order differs from the
    reference's, within section 6's bound of 1e-5 of ||C||)."""
    if a.cols != b.cols:
        raise ValueError(f"a.cols ({a.cols}) != b.cols ({b.cols})")
    if a.offs is not None or b.offs is not None:
        raise ValueError("a grouped operand goes to grouped_gemm_wgrad")
    pair = _pair(a, b)
    M, N, K = a.rows, b.rows, a.cols
    if pair == "plain":
        return _mm(a.qdata.reshape(M, K).to(torch.float32), b.qdata.reshape(N, K).to(torch.float32))
    av = decode(unpack(a), a.format)
    bv = decode(unpack(b), b.format)
    if pair in ("tensor", "row"):
        acc = _mm_exact(av, bv)  # the codes are exact in BF16
        sa = a.scale.reshape(-1, 1) if pair == "row" else a.scale.reshape(1, 1)
        sb = b.scale.reshape(1, -1) if pair == "row" else b.scale.reshape(1, 1)
        return acc * sa * sb  # (acc * sa) * sb, the reference's order (src/cpu/gemm_ref.c)
    if pair == "nv":
        return _gemm_nv(a, av, b, bv)
    if pair in ("mx", "mx_b32"):
        cb = b.scale.to(torch.int32)
        if pair == "mx_b32":
            cb = cb.repeat_interleave(32, 0)[:N]
        return _gemm_mx(av, a.scale.to(torch.int32), bv, cb)
    sb = b.scale if b.scaling == "block128" else b.scale.repeat_interleave(128, 0)[:N]
    return _gemm_b128(av, a.scale, bv, sb)


def rows_of(q: LowpQTensor, r0: int, r1: int) -> LowpQTensor:
    """Rows [r0, r1) of an ungrouped rowwise operand (row-blocked kinds, tensor, none; an
    nv16x16 copy's rows are an nv16 copy with each row's tile scales, the same values)."""
    if q.scaling == "nv16x16":
        sc = q.scale.repeat_interleave(16, 0)[r0:r1]
        return LowpQTensor(q.qdata[r0:r1], sc, q.format, "nv16", r1 - r0, q.cols,
                           tensor_scale=q.tensor_scale)
    if q.scaling in TILE_KINDS:
        raise ValueError("rows_of: tile kinds cannot be sliced by rows")
    sc = q.scale
    if sc is not None and q.scaling != "tensor":
        sc = sc[r0:r1]
    return LowpQTensor(q.qdata[r0:r1], sc, q.format, q.scaling, r1 - r0, q.cols,
                       tensor_scale=q.tensor_scale)


def _cols_of_group(q: LowpQTensor, start: int, end: int, blk: int) -> LowpQTensor:
    """Columns [start, end) of a copy quantized along tokens (grouped or not)."""
    n = end - start
    if q.scaling == "none":
        return LowpQTensor(q.qdata[:, start:end], None, q.format, "none", q.rows, n)
    codes = unpack(q)[:, start:end]
    sc = q.scale
    if q.scaling in TOKEN_BLOCK_KINDS:
        bs = block_of(q.scaling)
        if q.offs is None:
            if start % bs:
                raise ValueError("an ungrouped token-blocked copy cannot be split at a group")
            blk = start // bs
        sc = sc[:, blk:blk + _cdiv(n, bs)]
    return LowpQTensor(_finish(codes, q.format), sc, q.format, q.scaling, q.rows, n,
                       tensor_scale=q.tensor_scale)


# ---- grouped GEMMs: every group in one torch._grouped_mm ----


_GROUPED_REFUSED = set()  # (device type, operand dtype) whose torch._grouped_mm refused the call


def _align8(t: torch.Tensor) -> torch.Tensor:
    """t zero-padded along its last (reduction) dimension to a multiple of 8 elements:
    torch._grouped_mm wants 16-byte strides, and zeros add nothing to a sum."""
    n = t.shape[-1]
    return t if n % 8 == 0 else torch.nn.functional.pad(t, (0, 8 - n % 8))


def _try_grouped_mm(a, b, offs_t, dtype):
    """torch._grouped_mm of a and b as `dtype` with a binary32 output, or None where the
    device's kernel refuses it (then not asked again)."""
    key = (a.device.type, dtype)
    if key in _GROUPED_REFUSED or not hasattr(torch, "_grouped_mm"):
        return None
    mat2 = b.to(dtype).transpose(-2, -1)
    try:
        with exact(a.device.type):
            return torch._grouped_mm(a.to(dtype), mat2, offs=offs_t, out_dtype=torch.float32)
    except torch.OutOfMemoryError:
        raise  # not a missing kernel
    except (RuntimeError, TypeError, NotImplementedError):
        _GROUPED_REFUSED.add(key)
        return None


def _mm_has_out_dtype(dev: str) -> bool:
    """Whether the device's torch.mm multiplies BF16 operands into binary32 (`out_dtype`), as
    _mm_exact finds out (once, on a 1 x 1 product)."""
    if dev not in _NO_OUT_DTYPE and dev not in _OUT_DTYPE:
        z = torch.zeros((1, 1), device=dev)
        _mm_exact(z, z)
        if dev not in _NO_OUT_DTYPE:
            _OUT_DTYPE.add(dev)
    return dev not in _NO_OUT_DTYPE


_OUT_DTYPE = set()  # device types whose torch.mm has out_dtype (_mm_has_out_dtype)


def _grouped_products(a: torch.Tensor, b: torch.Tensor, offs: List[int],
                      bf16_exact: bool) -> torch.Tensor:
    """Every group's product in binary32. Split-M (b 3-D): a [T, K] with T == offs[-1],
    b [G, N, K] -> [T, N], rows of group g times b[g]^T. Split-K (b 2-D): a [N, T], b [K, T] ->
    [G, N, K], group g's columns of a times b's (0 for an empty group). bf16_exact: every
    element is exact in BF16, so every product is exact in binary32. In order: one
    torch._grouped_mm of BF16 operands with `out_dtype=torch.float32` (torch 2.15 refuses that
    everywhere: "output dtype must match"); a loop of BF16 matmuls into binary32 where the
    device's mm has out_dtype (CUDA); one torch._grouped_mm of binary32 operands (the CPU: its
    kernel loops over binary32 mm, 1.2x faster than a Python loop, the same sums); a loop."""
    G, dev = len(offs), a.device.type
    a, b = _align8(a), _align8(b)
    offs_t = torch.tensor(offs, dtype=torch.int32, device=a.device)
    c = _try_grouped_mm(a, b, offs_t, torch.bfloat16) if bf16_exact else None
    if c is None and not (bf16_exact and _mm_has_out_dtype(dev)):
        c = _try_grouped_mm(a.to(torch.float32), b.to(torch.float32), offs_t, torch.float32)
    if c is None:
        mm = _mm_exact if bf16_exact else _mm
        split_m = b.dim() == 3
        c = a.new_zeros((a.shape[0], b.shape[1]) if split_m else (G, a.shape[0], b.shape[0]),
                        dtype=torch.float32)
        start = 0
        for g, end in enumerate(offs):
            if end > start:
                if split_m:
                    c[start:end] = mm(a[start:end], b[g])
                else:
                    c[g] = mm(a[:, start:end], b[:, start:end])
            start = end
    if b.dim() == 2 and any(e == s for s, e in zip([0] + offs, offs)):
        empty = torch.tensor([e == s for s, e in zip([0] + offs, offs)], device=c.device)
        c = torch.where(empty[:, None, None], torch.zeros_like(c), c)  # whatever a kernel left
    return c


def _group_ids(offs: List[int], device) -> torch.Tensor:
    """The group of each of the offs[-1] rows."""
    sizes = torch.tensor([e - s for s, e in zip([0] + offs, offs)], device=device)
    return torch.repeat_interleave(torch.arange(len(offs), device=device), sizes,
                                   output_size=offs[-1])


def _per_group_any(flags: torch.Tensor, gid: torch.Tensor, G: int) -> torch.Tensor:
    """[G] bool: any of the rows of group g (gid: each row's group) flagged."""
    hit = torch.zeros(G, dtype=torch.int32, device=flags.device)
    return hit.index_add(0, gid, flags.to(torch.int32)) > 0


def _b128_deq(vp: torch.Tensor, s: torch.Tensor):
    """128-block values vp [R, nb, 128] times their scale_inv s [R, nb] in binary32, and the
    rows' blocks that the dequantized route cannot take (a nonzero block whose scale_inv is
    outside _B128_RANGE or not finite): [R, nb]."""
    live = (vp != 0).any(-1)
    ok = (s.abs() >= _B128_RANGE[0]) & (s.abs() <= _B128_RANGE[1])
    return vp * s[:, :, None], live & ~ok


def _redo_split_m(c, offs, gid, bad_a, bad_b, loop, a_ops, b_ops) -> torch.Tensor:
    """gemm's exact route (_redo_rows) for the rows bad_a [T] of A and bad_b [G, N] of B that
    the one-matmul route cannot take, group by group: a_ops (values [T, K], scales), b_ops
    (values [G, N, K], scales per row [G, N, nb])."""
    if c.device.type == "meta":
        return c
    redo = _per_group_any(bad_a, gid, len(offs)) | bad_b.any(1)
    for g in redo.nonzero()[:, 0].tolist():
        s, e = offs[g - 1] if g else 0, offs[g]
        if e > s:
            _redo_rows(c[s:e], bad_a[s:e], bad_b[g], loop, (a_ops[0][s:e], a_ops[1][s:e]),
                       (b_ops[0][g], b_ops[1][g]))
    return c


def _split_m_fast(a: LowpQTensor, b: Sequence[LowpQTensor], offs: List[int],
                  route: str) -> torch.Tensor:
    """Split-M of the rows [0, offs[-1]): every group folded at once and multiplied in one call
    (see gemm for each route's operands and the order of its scale factors); the rows the
    one-matmul route cannot take exactly (deep MX rows, 128-blocks with scale_invs out of
    range) take gemm's exact route, NaN blocks give NaN as in gemm."""
    T, K, G, N = offs[-1], a.cols, len(offs), b[0].rows
    gid = _group_ids(offs, a.qdata.device)
    av = decode(unpack(rows_of(a, 0, T)), a.format)
    bv = torch.stack([decode(unpack(q), q.format) for q in b])  # [G, N, K]
    bsc = torch.stack([q.scale for q in b])
    if route in ("tensor", "row"):
        acc = _grouped_products(av, bv, offs, True)
        sa = a.scale[:T].reshape(-1, 1) if route == "row" else a.scale.reshape(1, 1)
        return acc * sa * bsc.reshape(G, -1).index_select(0, gid)  # (acc * sa) * sb, as gemm
    if route in ("mx", "mx_b32"):
        ca, cb = a.scale[:T].to(torch.int32), bsc.to(torch.int32)
        if route == "mx_b32":
            cb = cb.repeat_interleave(32, 1)[:, :N]
        fa, ra, deep_a, nan_a = _mx_fold(av, ca)
        fb, rb, deep_b, nan_b = _mx_fold(bv.reshape(G * N, K), cb.reshape(G * N, -1))
        sa = _pow2_int((ra - 127).clamp(-_MX_REACH, _MX_REACH))
        sb = _pow2_int((rb - 127).clamp(-_MX_REACH, _MX_REACH)).reshape(G, N)
        c = _grouped_products(fa, fb.reshape(G, N, K), offs, True) * sa[:, None] \
            * sb.index_select(0, gid)
        if c.device.type != "meta" and (bool(nan_a.any()) or bool(nan_b.any())):
            nan = nan_a[:, None] | nan_b.reshape(G, N).index_select(0, gid)
            c = torch.where(nan, torch.full_like(c, float("nan")), c)
        return _redo_split_m(c, offs, gid, deep_a, deep_b.reshape(G, N), _mx_loop, (av, ca),
                             (bv, cb))
    if b[0].scaling == "block128x128":  # 128-blocks: binary32 dequantization, one matmul
        bsc = bsc.repeat_interleave(128, 1)[:, :N]
    nb = bsc.shape[-1]
    pad = (0, nb * 128 - K)
    da, bad_a = _b128_deq(torch.nn.functional.pad(av, pad).reshape(T, nb, 128), a.scale[:T])
    db, bad_b = _b128_deq(torch.nn.functional.pad(bv, pad).reshape(G * N, nb, 128),
                          bsc.reshape(G * N, nb))
    with _ieee_f32():
        c = _grouped_products(da.reshape(T, -1), db.reshape(G, N, -1), offs, False)
    return _redo_split_m(c, offs, gid, bad_a.any(1), bad_b.any(1).reshape(G, N), _b128_loop,
                         (av, a.scale[:T]), (bv, bsc))


_SPLIT_M_ROUTES = ("tensor", "row", "mx", "mx_b32", "b128")
# Device types whose split-M stays group by group: on this project's CPU (MoE-medium shapes,
# 4096 tokens x 384 -> 512, 8 groups, one thread, thread CPU time) folding and scaling all the
# tokens at once is 0.7-0.9x as fast as gemm per group, which keeps a group in cache; split-K's
# single route is 0.95-1.5x as fast as its loop (rowwise 1.4x), so it runs everywhere
# (docs/benchmarks.md, the portable grouped GEMMs).
_SPLIT_M_LOOP_DEVICES = {"cpu"}


def grouped_gemm(a: LowpQTensor, b: Sequence[LowpQTensor], offs: Sequence[int],
                 out: Optional[torch.Tensor] = None):
    """Split-M: C[rows_g] = A[rows_g] . B[g]^T; rows past offs[-1] are 0 (or out's). The pairs of
    gemm's one-matmul routes fold every group at once and multiply them in one call
    (_split_m_fast), except on _SPLIT_M_LOOP_DEVICES (gemm group by group)."""
    offs = [int(o) for o in offs]
    N = b[0].rows
    if out is None:
        out = torch.zeros((a.rows, N), dtype=torch.float32, device=a.qdata.device)
    if offs and offs[-1] and _pair(a, b[0]) in _SPLIT_M_ROUTES \
            and a.qdata.device.type not in _SPLIT_M_LOOP_DEVICES:
        out[:offs[-1]] = _split_m_fast(a, b, offs, _pair(a, b[0]))
        return out
    start = 0
    for g, end in enumerate(offs):
        if end > start:
            out[start:end] = gemm(rows_of(a, start, end), b[g])
        start = end
    return out


def _token_blocks(q: LowpQTensor, offs: List[int], bs: int):
    """The values of a copy quantized along tokens in groups (q [R, M], q.offs == offs), each
    group's columns zero-padded to whole blocks: [R, nb, bs], block j scaled by q.scale[:, j].
    Returns (that, the group of each block [nb], the padded group ends)."""
    dev = q.qdata.device
    v = decode(unpack(q), q.format)
    pos, seg, pends, nb = [], [], [], 0
    for g, (start, end, blk) in enumerate(_group_blocks(offs, bs)):
        n = _cdiv(end - start, bs)
        pos.append(torch.arange(end - start, device=dev) + blk * bs)
        seg += [g] * n
        nb = blk + n
        pends.append(nb * bs)
    vp = v.new_zeros((q.rows, nb * bs)).index_copy(1, torch.cat(pos), v[:, :offs[-1]])
    return vp.reshape(q.rows, nb, bs), torch.tensor(seg, dtype=torch.long, device=dev), pends


def _seg_any(flags: torch.Tensor, seg: torch.Tensor, G: int) -> torch.Tensor:
    """[R, G]: any of row r's blocks of group g flagged (flags [R, nb], seg the group of each
    block)."""
    R, nb = flags.shape
    out = torch.zeros((R, G), dtype=torch.int32, device=flags.device)
    return out.scatter_reduce(1, seg[None, :].expand(R, nb), flags.to(torch.int32), "amax") > 0


def _mx_fold_groups(vp: torch.Tensor, codes: torch.Tensor, seg: torch.Tensor, G: int):
    """_mx_fold of every (row, group) of a grouped copy: vp [R, nb, 32] values, codes [R, nb],
    seg the group of each block. Returns (folded [R, nb * 32], r [R, G], the deep rows that
    the fold cannot take exactly [R, G], the rows holding a NaN block [R, G])."""
    R, nb, _ = vp.shape
    live = (vp != 0).any(-1) & (codes != 0xFF)
    r = torch.full((R, G), -1, dtype=torch.int32, device=vp.device).scatter_reduce(
        1, seg[None, :].expand(R, nb), torch.where(live, codes, torch.full_like(codes, -1)),
        "amax")
    r = torch.where(r < 0, torch.full_like(r, 127), r)
    rb = r.index_select(1, seg)
    deep = _seg_any(live & (codes < rb - _MX_SPREAD), seg, G) | ((r - 127).abs() > _MX_REACH)
    f = _pow2_int((codes - rb).clamp(min=-_MX_SPREAD - 1))
    f = torch.where(live, f, torch.zeros_like(f))
    return (vp * f[:, :, None]).reshape(R, -1), r, deep, _seg_any(codes == 0xFF, seg, G)


def _redo_split_k(c, offs, bs, bad_a, bad_b, loop, a_ops, b_ops) -> torch.Tensor:
    """gemm's exact route (_redo_rows) for the rows bad_a [N, G] of A and bad_b [K, G] of B that
    the one-matmul route cannot take, group by group: a_ops, b_ops (block values [R, nb, bs],
    block scales [R, nb]) of the token-blocked copies."""
    if c.device.type == "meta":
        return c
    groups = _group_blocks(offs, bs)
    for g in (bad_a.any(0) | bad_b.any(0)).nonzero()[:, 0].tolist():
        start, end, blk = groups[g]
        n = _cdiv(end - start, bs)
        if n:
            a_g, b_g = ((v[:, blk:blk + n].reshape(v.shape[0], n * bs), sc[:, blk:blk + n])
                        for v, sc in (a_ops, b_ops))
            _redo_rows(c[g], bad_a[:, g], bad_b[:, g], loop, a_g, b_g)
    return c


def _split_k_fast(a: LowpQTensor, b: LowpQTensor, offs: List[int], route: str) -> torch.Tensor:
    """Split-K in one call (gemm's routes; the token-blocked copies on their groups' blocks,
    zero-padded); the rows of a group the one-matmul route cannot take exactly take gemm's
    exact route, NaN blocks give NaN as in gemm."""
    G = len(offs)
    if route in ("tensor", "row"):
        av = decode(unpack(a), a.format)[:, :offs[-1]]
        bv = decode(unpack(b), b.format)[:, :offs[-1]]
        acc = _grouped_products(av, bv, offs, True)
        return acc * a.scale.reshape(-1, 1) * b.scale.reshape(1, -1)
    bs = block_of(a.scaling)
    vpa, seg, pends = _token_blocks(a, offs, bs)
    vpb, _, _ = _token_blocks(b, offs, bs)
    if route == "mx":
        ca, cb = a.scale.to(torch.int32), b.scale.to(torch.int32)
        fa, ra, deep_a, nan_a = _mx_fold_groups(vpa, ca, seg, G)
        fb, rb, deep_b, nan_b = _mx_fold_groups(vpb, cb, seg, G)
        sa = _pow2_int((ra - 127).clamp(-_MX_REACH, _MX_REACH)).t()
        sb = _pow2_int((rb - 127).clamp(-_MX_REACH, _MX_REACH)).t()
        c = _grouped_products(fa, fb, pends, True) * sa[:, :, None] * sb[:, None, :]
        if c.device.type != "meta" and (bool(nan_a.any()) or bool(nan_b.any())):
            nan = nan_a.t()[:, :, None] | nan_b.t()[:, None, :]
            c = torch.where(nan, torch.full_like(c, float("nan")), c)
        return _redo_split_k(c, offs, bs, deep_a, deep_b, _mx_loop, (vpa, ca), (vpb, cb))
    da, bad_a = _b128_deq(vpa, a.scale)  # 128-blocks: binary32 dequantization
    db, bad_b = _b128_deq(vpb, b.scale)
    with _ieee_f32():
        c = _grouped_products(da.reshape(a.rows, -1), db.reshape(b.rows, -1), pends, False)
    return _redo_split_k(c, offs, bs, _seg_any(bad_a, seg, G), _seg_any(bad_b, seg, G),
                         _b128_loop, (vpa, a.scale), (vpb, b.scale))


def _split_k_route(a: LowpQTensor, b: LowpQTensor, offs: List[int]) -> Optional[str]:
    """The route of _split_k_fast for this pair, or None (gemm group by group)."""
    route = _pair(a, b)
    if route in ("tensor", "row"):
        return route
    if route in ("mx", "b128") and a.scaling == b.scaling and a.scaling in TOKEN_BLOCK_KINDS \
            and a.offs is not None and b.offs is not None \
            and [int(o) for o in a.offs] == offs == [int(o) for o in b.offs]:
        return route
    return None


def grouped_gemm_wgrad(a: LowpQTensor, b: LowpQTensor, offs: Sequence[int]) -> torch.Tensor:
    """Split-K: dW[g] = A[:, rows_g] . B[:, rows_g]^T with A = dY^T [N, M], B = X^T [K, M]
    (token-blocked kinds quantized with the same offs); out [G, N, K]. The pairs of gemm's
    one-matmul routes fold every group at once and multiply them in one call (_split_k_fast);
    the others run gemm group by group."""
    offs = [int(o) for o in offs]
    route = _split_k_route(a, b, offs) if offs and offs[-1] else None
    if route is not None:
        return _split_k_fast(a, b, offs, route)
    out = torch.zeros((len(offs), a.rows, b.rows), dtype=torch.float32, device=a.qdata.device)
    bs = block_of(a.scaling) if a.scaling in TOKEN_BLOCK_KINDS else 1
    for g, (start, end, blk) in enumerate(_group_blocks(offs, bs)):
        if end > start:
            ag = _cols_of_group(a, start, end, blk)
            bg = _cols_of_group(b, start, end, blk)
            if a.scaling in ("tensor", "row"):
                ag.offs = bg.offs = None
            out[g] = gemm(ag, bg)
    return out
