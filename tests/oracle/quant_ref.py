"""An independent Python reference of lowp's quantization (docs/numerics.md sections 3-5), plus the
ctypes bindings of lowp's quantization API and a small check counter, for the quantization tests.

The reference is written from docs/numerics.md and include/lowp/quant.h only (not from the C code):
numpy does the binary32 arithmetic (numpy float32 operations are IEEE binary32, correctly
rounded, without FTZ/DAZ) and ml_dtypes does every element conversion. Everything is vectorized
over blocks: a tensor is zero-padded to whole blocks (padding never changes an amax), reshaped
to [blocks, elements] and scaled block by block.

Arrays:
- inputs are 2-D float32 (a BF16 input is represented by its exact float32 values);
- element codes are uint8 [rows, cols], one code per element (E2M1 in the low nibble); the
  library's packed E2M1 rows are made with `pack_e2m1`;
- scales are in lowp's canonical layout: uint8 E8M0 codes, or float32 scale_inv.
"""

import ctypes
import os
import sys

import ml_dtypes
import numpy as np

# ---- enums (include/lowp/format.h, quant.h, cast.h, status.h) ----

F32, BF16, F16, E4M3, E5M2, E2M1, E8M0 = range(7)
TENSOR, ROW, MX32, BLOCK128, BLOCK128X128, BLOCK32X32 = range(6)
SCALE_DEFAULT, RCEIL, FLOOR, CEIL, EVEN = range(5)
PATH_AUTO, PATH_REFERENCE, PATH_AVX512 = range(3)
OK, ERR_INVALID_ARG, ERR_UNSUPPORTED = 0, 1, 2
AMAX_MAX, AMAX_MOST_RECENT = 0, 1
NPU_AXIS_LAST, NPU_AXIS_FIRST = 0, 1

KIND_NAMES = {TENSOR: "tensor", ROW: "row", MX32: "mx32", BLOCK128: "block128",
              BLOCK128X128: "block128x128", BLOCK32X32: "block32x32"}
MODE_NAMES = {SCALE_DEFAULT: "default", RCEIL: "rceil", FLOOR: "floor", CEIL: "ceil", EVEN: "even"}
FMT_NAMES = {E4M3: "e4m3", E5M2: "e5m2", E2M1: "e2m1", F32: "f32", BF16: "bf16"}
E8M0_KINDS = (MX32, BLOCK32X32)
FP32_KINDS = (TENSOR, ROW, BLOCK128, BLOCK128X128)

SANITIZE = bool(os.environ.get("LOWP_SANITIZE"))
FLT_MAX = np.float32(np.finfo(np.float32).max)


class ElemFormat:
    """An element format, from docs/numerics.md section 1's table."""

    def __init__(self, fid, name, mldtype, fmax, emax, mbits, nan_code):
        self.id, self.name, self.mldtype = fid, name, mldtype
        self.fmax = np.float32(fmax)
        self.emax, self.mbits = emax, mbits
        self.nan_code = nan_code  # what a NaN/Inf MX block holds (E2M1: 0)


ELEM = {
    E4M3: ElemFormat(E4M3, "e4m3", ml_dtypes.float8_e4m3fn, 448.0, 8, 3, 0x7F),
    E5M2: ElemFormat(E5M2, "e5m2", ml_dtypes.float8_e5m2, 57344.0, 15, 2, 0x7E),
    E2M1: ElemFormat(E2M1, "e2m1", ml_dtypes.float4_e2m1fn, 6.0, 2, 1, 0x0),
}


# ---- bit helpers ----

def f32(bits):
    return np.asarray(bits, np.uint32).view(np.float32)


def bits32(x):
    return np.asarray(x, np.float32).view(np.uint32)


def to_bf16_bits(x):
    """float32 -> BF16 codes (uint16), RNE (ml_dtypes)."""
    return np.ascontiguousarray(np.asarray(x, np.float32).astype(ml_dtypes.bfloat16)).view(np.uint16)


def bf16_bits_to_f32(b):
    return (np.asarray(b, np.uint32) << 16).view(np.float32)


def same_floats(a, b):
    """Elementwise: identical bits, or both NaN."""
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    return (bits32(a) == bits32(b)) | (np.isnan(a) & np.isnan(b))


# ---- element encoding (docs/numerics.md section 2) ----

def encode_satfinite(x, fmt):
    """RNE, satfinite: finite overflow and +-Inf become +-fmax (clamping to fmax before the
    ml_dtypes cast is the same thing: nothing at or below fmax rounds past it); NaN becomes the
    format's NaN with the input's sign (E2M1: 0)."""
    e = ELEM[fmt]
    x = np.asarray(x, np.float32)
    nan = np.isnan(x)
    clipped = np.clip(np.where(nan, np.float32(0), x), -e.fmax, e.fmax).astype(np.float32)
    codes = np.ascontiguousarray(clipped.astype(e.mldtype)).view(np.uint8).copy()
    if fmt == E2M1:
        codes &= 0xF
        codes[nan] = 0
    else:
        sign = ((bits32(x) >> 31).astype(np.uint8) << 7).reshape(x.shape)
        codes[nan] = (sign | np.uint8(e.nan_code))[nan]
    return codes


def decode(codes, fmt):
    e = ELEM[fmt]
    return np.ascontiguousarray(np.asarray(codes, np.uint8)).view(e.mldtype).astype(np.float32)


# ---- E8M0 scales (docs/numerics.md section 3) ----

def e8m0_code(amax, fmt, mode):
    """Scale code of blocks with the given amax (array of float32 >= 0, or NaN/Inf)."""
    e = ELEM[fmt]
    amax = np.asarray(amax, np.float32)
    a = (bits32(amax) & 0x7FFFFFFF).astype(np.int64).reshape(amax.shape)
    E = a >> 23
    M = a & 0x7FFFFF
    if mode == FLOOR:
        code = E - e.emax
    elif mode == CEIL:
        code = E + (M != 0) - e.emax
    elif mode == EVEN:
        b = (a + (1 << (22 - e.mbits))) & 0xFF800000
        code = (b >> 23) - e.emax
    elif mode == RCEIL:
        inv = np.float32(1.0) / e.fmax  # the binary32 constant 1.0f/fmax
        with np.errstate(over="ignore"):
            d = (np.abs(amax) * inv).astype(np.float32)
        db = bits32(d).astype(np.int64).reshape(amax.shape)
        Ed, Md = db >> 23, db & 0x7FFFFF
        code = np.where(Ed != 0, np.minimum(Ed + (Md != 0), 254), np.where(Md > 0x400000, 1, 0))
    else:
        raise ValueError(mode)
    code = np.clip(code, 0, 254)
    code = np.where(a == 0, 0, code)
    code = np.where(a >= 0x7F800000, 255, code)
    return code.astype(np.uint8)


def pow2_f32(exponent):
    """2^exponent as float32, exactly (exponent in [-149, 127])."""
    return np.ldexp(np.float64(1.0), np.asarray(exponent, np.int64)).astype(np.float32)


def e8m0_value(code):
    """2^(code-127) as float32 (NaN for 0xFF)."""
    code = np.asarray(code, np.int64)
    v = pow2_f32(np.where(code == 255, 0, code) - 127)
    return np.where(code == 255, np.float32(np.nan), v).astype(np.float32)


# ---- binary32 scales (docs/numerics.md section 4) ----

def fp32_scale(amax, fmt, eps=0.0, pow2=False):
    e = ELEM[fmt]
    amax = np.asarray(amax, np.float32)
    a = np.where(np.isnan(amax), amax, np.maximum(amax, np.float32(eps))).astype(np.float32)
    bad = (a == 0) | np.isnan(a) | np.isinf(a)
    with np.errstate(all="ignore"):
        s = (e.fmax / np.where(bad, np.float32(1), a)).astype(np.float32)
    s = np.where(np.isinf(s), FLT_MAX, s).astype(np.float32)
    s = np.where(bad, np.float32(1), s).astype(np.float32)
    if pow2:
        s = f32(bits32(s) & np.uint32(0xFF800000)).reshape(s.shape)
    return s.astype(np.float32)


# ---- granularity ----

BLOCK = {  # (block rows, block cols); 0 = the whole dimension
    TENSOR: (0, 0), ROW: (1, 0), MX32: (1, 32), BLOCK128: (1, 128),
    BLOCK128X128: (128, 128), BLOCK32X32: (32, 32)}


def cdiv(a, b):
    return -(-a // b)


def scale_shape(kind, rows, cols):
    br, bc = BLOCK[kind]
    return (1 if br == 0 else cdiv(rows, br), 1 if bc == 0 else cdiv(cols, bc))


def block_geometry(kind, rows, cols):
    br, bc = BLOCK[kind]
    br = rows if br == 0 else br
    bc = cols if bc == 0 else bc
    return max(br, 1), max(bc, 1)


def blocks_view(x, br, bc):
    """Zero-pad x to whole br x bc blocks; return [nbr, nbc, br*bc] and the padded shape."""
    R, C = x.shape
    nbr, nbc = cdiv(R, br), cdiv(C, bc)
    p = np.zeros((nbr * br, nbc * bc), np.float32)
    p[:R, :C] = x
    return p.reshape(nbr, br, nbc, bc).transpose(0, 2, 1, 3).reshape(nbr, nbc, br * bc), p.shape


def expand(per_block, br, bc, R, C):
    """Broadcast a [nbr, nbc] array to the elements [R, C]."""
    return np.repeat(np.repeat(per_block, br, axis=0), bc, axis=1)[:R, :C]


def block_amax(x, kind):
    """amax per block, canonical scale shape; NaN wins (numpy's max propagates NaN)."""
    x = np.asarray(x, np.float32)
    R, C = x.shape
    br, bc = block_geometry(kind, R, C)
    if R == 0:
        return np.zeros(scale_shape(kind, R, C), np.float32)
    b, _ = blocks_view(x, br, bc)
    return np.max(np.abs(b), axis=2).astype(np.float32)


def resolve(kind, mode, pow2):
    if mode == SCALE_DEFAULT:
        mode = FLOOR if kind == BLOCK32X32 else RCEIL
    if pow2 is None or pow2 < 0:
        pow2 = kind == ROW
    return mode, bool(pow2)


def quantize_rowwise(x, fmt, kind, mode=SCALE_DEFAULT, pow2=-1, eps=0.0, scale=None):
    """Quantize x [R, C] along its rows. Returns (codes uint8 [R, C], canonical scales)."""
    x = np.ascontiguousarray(x, np.float32)
    R, C = x.shape
    mode, pow2 = resolve(kind, mode, pow2)
    br, bc = block_geometry(kind, R, C)
    amax = block_amax(x, kind)
    if kind in E8M0_KINDS:
        codes_s = e8m0_code(amax, fmt, mode)
        factor = pow2_f32(127 - np.where(codes_s == 255, 0, codes_s).astype(np.int64))
        f = expand(factor, br, bc, R, C)
        with np.errstate(all="ignore"):
            q = encode_satfinite((x * f).astype(np.float32), fmt)
        nanblk = expand(codes_s == 255, br, bc, R, C)
        q[nanblk] = ELEM[fmt].nan_code
        return q, codes_s
    if scale is not None:  # TENSOR with a given (delayed) scale
        s = np.full((1, 1), scale, np.float32)
    else:
        s = fp32_scale(amax, fmt, eps, pow2)
    f = expand(s, br, bc, R, C)
    with np.errstate(all="ignore"):
        q = encode_satfinite((x * f).astype(np.float32), fmt)
        return q, (np.float32(1.0) / s).astype(np.float32)  # 1/subnormal scale: Inf


def quantize(x, fmt, kind, mode=SCALE_DEFAULT, pow2=-1, eps=0.0, scale=None):
    """Both copies: {'row': (codes, scales) of x, 'col': (codes, scales) of x^T}. The
    columnwise copy is, by definition, the rowwise quantization of x^T."""
    x = np.asarray(x, np.float32)
    return {"row": quantize_rowwise(x, fmt, kind, mode, pow2, eps, scale),
            "col": quantize_rowwise(x.T, fmt, kind, mode, pow2, eps, scale)}


def dequantize(codes, scales, fmt, kind):
    codes = np.asarray(codes, np.uint8)
    R, C = codes.shape
    br, bc = block_geometry(kind, R, C)
    vals = decode(codes, fmt)
    if kind in E8M0_KINDS:
        f = expand(e8m0_value(scales), br, bc, R, C)
    else:
        f = expand(np.asarray(scales, np.float32), br, bc, R, C)
    with np.errstate(all="ignore"):
        return (vals * f).astype(np.float32)


# ---- grouped (MoE) columnwise quantization ----

def quantize_grouped(x, offs, fmt, kind, mode=SCALE_DEFAULT, pow2=-1, eps=0.0):
    """x [M, K] tokens x features -> codes [K, M], scales [K, sum_g ceil(size_g/bs)]. Each
    group is quantized on its own; tokens past offs[-1] hold code 0."""
    x = np.asarray(x, np.float32)
    M, K = x.shape
    codes = np.zeros((K, M), np.uint8)
    parts = []
    start = 0
    for end in offs:
        end = int(end)
        if end > start:
            q, s = quantize_rowwise(x[start:end].T, fmt, kind, mode, pow2, eps)
            codes[:, start:end] = q
            parts.append(s)
        start = end
    sdt = np.uint8 if kind in E8M0_KINDS else np.float32
    scales = np.concatenate(parts, axis=1) if parts else np.zeros((K, 0), sdt)
    return codes, scales.astype(sdt)


def dequantize_grouped(codes, scales, offs, fmt, kind):
    K, M = codes.shape
    out = np.zeros((K, M), np.float32)
    bs = BLOCK[kind][1]
    start, sb = 0, 0
    for end in offs:
        end = int(end)
        if end > start:
            nb = cdiv(end - start, bs)
            out[:, start:end] = dequantize(codes[:, start:end], scales[:, sb:sb + nb], fmt, kind)
            sb += nb
        start = end
    return out


# ---- E2M1 packing (two codes per byte, element 2i in the low nibble, rows byte-aligned) ----

def pack_e2m1(codes):
    c = np.asarray(codes, np.uint8) & 0xF
    R, C = c.shape
    if C % 2:
        c = np.concatenate([c, np.zeros((R, 1), np.uint8)], axis=1)
    return np.ascontiguousarray(c[:, 0::2] | (c[:, 1::2] << 4))


def unpack_e2m1(packed, cols):
    p = np.asarray(packed, np.uint8)
    out = np.empty((p.shape[0], p.shape[1] * 2), np.uint8)
    out[:, 0::2] = p & 0xF
    out[:, 1::2] = p >> 4
    return out[:, :cols]


def storage(codes, fmt):
    """The library's byte layout of a code array."""
    return pack_e2m1(codes) if fmt == E2M1 else np.ascontiguousarray(codes, np.uint8)


def row_bytes(fmt, cols):
    return cdiv(cols, 2) if fmt == E2M1 else cols


# ---- scale layouts (include/lowp/quant.h) ----

def cublas_swizzle(canon):
    """Canonical [sr, sc] -> the cuBLAS byte array: zero-pad to [128k, 4m], cut into 128x4
    tiles (row-major tile order); inside a tile, row r = 32*i + j goes to bytes j*16 + i*4."""
    canon = np.asarray(canon, np.uint8)
    sr, sc = canon.shape
    R, C = cdiv(sr, 128) * 128, cdiv(sc, 4) * 4
    p = np.zeros((R, C), np.uint8)
    p[:sr, :sc] = canon
    t = p.reshape(R // 128, 128, C // 4, 4).transpose(0, 2, 1, 3)  # [tr, tc, 128, 4]
    t = t.reshape(R // 128, C // 4, 4, 32, 4).transpose(0, 1, 3, 2, 4)  # [tr, tc, j, i, c]
    return np.ascontiguousarray(t).reshape(-1)


def cublas_unswizzle(swz, sr, sc):
    R, C = cdiv(sr, 128) * 128, cdiv(sc, 4) * 4
    t = np.asarray(swz, np.uint8)[:R * C].reshape(R // 128, C // 4, 32, 4, 4)  # [tr, tc, j, i, c]
    t = t.transpose(0, 1, 3, 2, 4).reshape(R // 128, C // 4, 128, 4).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(t.reshape(R, C)[:sr, :sc])


def npu_pairs(canon, axis):
    """Canonical [sr, sc] -> NPU array: block axis zero-padded to even and split in pairs;
    LAST: [sr, sc/2, 2]; FIRST (columnwise copy): [sc/2, sr, 2]."""
    canon = np.asarray(canon, np.uint8)
    sr, sc = canon.shape
    P = cdiv(sc, 2)
    p = np.zeros((sr, 2 * P), np.uint8)
    p[:, :sc] = canon
    a = p.reshape(sr, P, 2)
    if axis == NPU_AXIS_FIRST:
        a = a.transpose(1, 0, 2)
    return np.ascontiguousarray(a).reshape(-1)


# ---- delayed scaling (docs/numerics.md section 5) ----

class DelayedModel:
    def __init__(self, fmt, history_len=1024, margin=0, algo=AMAX_MAX):
        self.fmax = ELEM[fmt].fmax
        self.len, self.margin, self.algo = history_len, margin, algo
        self.hist = np.zeros(history_len, np.float32)
        self.scale = np.float32(1.0)
        self.scale_inv = np.float32(1.0)

    def record(self, amax):
        """Row 0 keeps the max of what it holds (NaN sticks), as quant.h documents."""
        a = np.abs(np.float32(amax))
        if np.isnan(self.hist[0]):
            return
        if np.isnan(a) or a > self.hist[0]:
            self.hist[0] = a

    def update(self):
        amax = np.max(self.hist) if self.algo == AMAX_MAX else self.hist[0]  # NaN wins
        scaled_max = np.float32(float(self.fmax) * 2.0 ** (-self.margin))
        if np.isfinite(amax) and amax > 0:
            with np.errstate(over="ignore"):
                s = np.float32(scaled_max / amax)
            self.scale = FLT_MAX if np.isinf(s) else s
        if self.hist[0] != 0:  # NaN is nonzero too
            self.hist = np.roll(self.hist, -1)
            self.hist[0] = 0
        self.scale_inv = np.float32(np.float32(1.0) / self.scale)


# ---- accuracy ----

def sqnr_db(ref, x):
    ref = np.asarray(ref, np.float64)
    err = ref - np.asarray(x, np.float64)
    return 20.0 * np.log10(np.linalg.norm(ref) / np.linalg.norm(err))


# ---- ctypes bindings (must match include/lowp/*.h exactly) ----


class Device(ctypes.Structure):  # lowp_device
    _fields_ = [("type", ctypes.c_int32), ("index", ctypes.c_int32)]


class Tensor(ctypes.Structure):  # lowp_tensor
    _fields_ = [("format", ctypes.c_int), ("rows", ctypes.c_int64), ("cols", ctypes.c_int64),
                ("data", ctypes.c_void_p), ("device", Device)]


class QTensor(ctypes.Structure):  # lowp_qtensor
    _fields_ = [("format", ctypes.c_int), ("scaling", ctypes.c_int),
                ("rows", ctypes.c_int64), ("cols", ctypes.c_int64),
                ("data", ctypes.c_void_p), ("scales", ctypes.c_void_p),
                ("device", Device),
                ("group_offs", ctypes.c_void_p), ("groups", ctypes.c_int32)]


class QuantCfg(ctypes.Structure):  # lowp_quant_cfg
    _fields_ = [("scale_mode", ctypes.c_int), ("pow2_scales", ctypes.c_int32),
                ("eps", ctypes.c_float), ("scale", ctypes.c_void_p),
                ("amax_out", ctypes.c_void_p), ("threads", ctypes.c_int32),
                ("path", ctypes.c_int), ("rounding", ctypes.c_int), ("seed", ctypes.c_uint64),
                ("offset", ctypes.c_uint64)]


class DelayedCfg(ctypes.Structure):  # lowp_delayed_cfg
    _fields_ = [("format", ctypes.c_int), ("history_len", ctypes.c_int32),
                ("margin", ctypes.c_float), ("algo", ctypes.c_int)]


class DelayedState(ctypes.Structure):  # lowp_delayed_state
    _fields_ = [("cfg", DelayedCfg), ("history", ctypes.c_void_p),
                ("scale", ctypes.c_float), ("scale_inv", ctypes.c_float)]


class LowpError(Exception):
    def __init__(self, status, message):
        super().__init__(f"status {status}: {message}")
        self.status = status
        self.message = message


SENTINEL = 0xA5
GUARD = 64  # bytes after every output buffer that must stay untouched


class Lib:
    def __init__(self, path=None):
        path = path or os.environ.get("LOWP_LIB")
        if not path:
            sys.exit("LOWP_LIB is not set (path of liblowp.so); run through ctest")
        self.dll = d = ctypes.CDLL(path)
        P = ctypes.POINTER
        i64, vp, st = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
        sigs = {
            "lowp_quant_cfg_init": [P(QuantCfg)],
            "lowp_quantize": [P(Tensor), P(QTensor), P(QTensor), P(QuantCfg)],
            "lowp_quantize_grouped": [P(Tensor), P(QTensor), P(QTensor), P(QuantCfg)],
            "lowp_dequantize": [P(QTensor), P(Tensor)],
            "lowp_amax": [P(Tensor), ctypes.c_int, vp, ctypes.c_size_t],
            "lowp_e8m0_scale": [ctypes.c_float, ctypes.c_int, ctypes.c_int, P(ctypes.c_uint8)],
            "lowp_fp32_scale": [ctypes.c_float, ctypes.c_int, ctypes.c_float, ctypes.c_int,
                                P(ctypes.c_float)],
            "lowp_qtensor_nbytes": [P(QTensor), P(ctypes.c_size_t), P(ctypes.c_size_t)],
            "lowp_qtensor_scale_shape": [P(QTensor), P(i64), P(i64), P(ctypes.c_int)],
            "lowp_scales_cublas_nbytes": [i64, i64, P(ctypes.c_size_t)],
            "lowp_scales_to_cublas": [vp, i64, i64, vp, ctypes.c_size_t],
            "lowp_scales_from_cublas": [vp, ctypes.c_size_t, i64, i64, vp],
            "lowp_scales_npu_nbytes": [i64, i64, P(ctypes.c_size_t)],
            "lowp_scales_to_npu": [vp, i64, i64, ctypes.c_int, vp, ctypes.c_size_t],
            "lowp_scales_from_npu": [vp, ctypes.c_size_t, i64, i64, ctypes.c_int, vp],
            "lowp_delayed_cfg_init": [P(DelayedCfg), ctypes.c_int],
            "lowp_delayed_init": [P(DelayedState), P(DelayedCfg), vp],
            "lowp_delayed_record": [P(DelayedState), ctypes.c_float],
            "lowp_delayed_update": [P(DelayedState)],
        }
        for name, args in sigs.items():
            fn = getattr(d, name)
            fn.argtypes = args
            fn.restype = st
        d.lowp_last_error.argtypes = []
        d.lowp_last_error.restype = ctypes.c_char_p
        d.lowp_version.argtypes = []
        d.lowp_version.restype = ctypes.c_char_p

    def last_error(self):
        return self.dll.lowp_last_error().decode(errors="replace")

    def check(self, status):
        if status != OK:
            raise LowpError(status, self.last_error())

    def version(self):
        return self.dll.lowp_version().decode()

    # -- helpers --

    @staticmethod
    def input_tensor(x, xfmt):
        """x: float32 [R, C] (xfmt F32) or uint16 BF16 codes [R, C] (xfmt BF16)."""
        x = np.ascontiguousarray(x)
        assert x.dtype == (np.float32 if xfmt == F32 else np.uint16)
        return x, Tensor(xfmt, x.shape[0], x.shape[1], x.ctypes.data if x.size else None, Device(0, 0))

    @staticmethod
    def alloc(nbytes):
        return np.full(nbytes + GUARD, SENTINEL, np.uint8)

    def cfg(self, mode=SCALE_DEFAULT, pow2=-1, eps=0.0, path=PATH_AUTO, threads=0, scale=None,
            amax_out=None):
        c = QuantCfg()
        self.check(self.dll.lowp_quant_cfg_init(ctypes.byref(c)))
        c.scale_mode, c.pow2_scales, c.eps, c.path, c.threads = mode, pow2, eps, path, threads
        keep = []
        if scale is not None:
            sbuf = np.array([scale], np.float32)
            keep.append(sbuf)
            c.scale = sbuf.ctypes.data
        if amax_out is not None:
            c.amax_out = amax_out.ctypes.data
        return c, keep

    def make_q(self, fmt, kind, rows, cols, offs=None):
        """A qtensor with sentinel-filled buffers of the documented sizes (+ a guard)."""
        sr, sc = scale_shape(kind, rows, cols)
        if offs is not None:
            bs = BLOCK[kind][1]
            sizes = np.diff(np.concatenate([[0], np.asarray(offs, np.int64)]))
            sc = int(sum(cdiv(int(s), bs) for s in sizes))
        sbytes = sr * sc * (1 if kind in E8M0_KINDS else 4)
        data = self.alloc(rows * row_bytes(fmt, cols))
        scales = self.alloc(sbytes)
        q = QTensor(fmt, kind, rows, cols, data.ctypes.data, scales.ctypes.data, Device(0, 0),
                    None, 0)
        ob = None
        if offs is not None:
            ob = np.ascontiguousarray(offs, np.int32)
            q.group_offs = ob.ctypes.data
            q.groups = len(ob)
        return {"q": q, "data": data, "scales": scales, "rows": rows, "cols": cols, "fmt": fmt,
                "kind": kind, "sshape": (sr, sc), "offs": ob}

    @staticmethod
    def result(h):
        """(data bytes [rows, row_bytes], canonical scales, guards_ok)."""
        rb = row_bytes(h["fmt"], h["cols"])
        n = h["rows"] * rb
        data = h["data"][:n].reshape(h["rows"], rb).copy()
        sr, sc = h["sshape"]
        if h["kind"] in E8M0_KINDS:
            sc_arr = h["scales"][:sr * sc].reshape(sr, sc).copy()
        else:
            sc_arr = h["scales"][:sr * sc * 4].view(np.float32).reshape(sr, sc).copy()
        guards = bool(np.all(h["data"][n:] == SENTINEL) and
                      np.all(h["scales"][h["scales"].size - GUARD:] == SENTINEL))
        return data, sc_arr, guards

    # -- API wrappers --

    def quantize(self, x, fmt, kind, orient="both", xfmt=F32, mode=SCALE_DEFAULT, pow2=-1,
                 eps=0.0, path=PATH_AUTO, threads=0, scale=None, amax_out=None):
        """Returns {'row': (data, scales, guards_ok), 'col': ...} for the requested copies."""
        x, t = self.input_tensor(x, xfmt)
        R, C = x.shape
        hr = self.make_q(fmt, kind, R, C) if orient in ("row", "both") else None
        hc = self.make_q(fmt, kind, C, R) if orient in ("col", "both") else None
        c, keep = self.cfg(mode, pow2, eps, path, threads, scale, amax_out)
        st = self.dll.lowp_quantize(ctypes.byref(t), ctypes.byref(hr["q"]) if hr else None,
                                    ctypes.byref(hc["q"]) if hc else None, ctypes.byref(c))
        del keep
        self.check(st)
        out = {}
        if hr:
            out["row"] = self.result(hr)
        if hc:
            out["col"] = self.result(hc)
        return out

    def quantize_grouped(self, x, offs, fmt, kind, xfmt=F32, mode=SCALE_DEFAULT, pow2=-1,
                         eps=0.0, path=PATH_AUTO, threads=0):
        x, t = self.input_tensor(x, xfmt)
        M, K = x.shape
        h = self.make_q(fmt, kind, K, M, offs=offs)
        c, keep = self.cfg(mode, pow2, eps, path, threads)
        self.check(self.dll.lowp_quantize_grouped(ctypes.byref(t), None, ctypes.byref(h["q"]),
                                                  ctypes.byref(c)))
        return self.result(h)

    def dequantize(self, data, scales, fmt, kind, rows, cols, offs=None):
        data = np.ascontiguousarray(data, np.uint8)
        scales = np.ascontiguousarray(scales)
        out = np.full(rows * cols + 16, np.float32(-7.0), np.float32)
        q = QTensor(fmt, kind, rows, cols, data.ctypes.data if data.size else None,
                    scales.ctypes.data if scales.size else None, Device(0, 0), None, 0)
        ob = None
        if offs is not None:
            ob = np.ascontiguousarray(offs, np.int32)
            q.group_offs, q.groups = ob.ctypes.data, len(ob)
        t = Tensor(F32, rows, cols, out.ctypes.data, Device(0, 0))
        self.check(self.dll.lowp_dequantize(ctypes.byref(q), ctypes.byref(t)))
        assert np.all(out[rows * cols:] == np.float32(-7.0)), "lowp_dequantize wrote past out"
        return out[:rows * cols].reshape(rows, cols)

    def amax(self, x, kind, xfmt=F32):
        x, t = self.input_tensor(x, xfmt)
        sr, sc = scale_shape(kind, *x.shape)
        out = np.full(sr * sc + 4, np.float32(-1.0), np.float32)
        self.check(self.dll.lowp_amax(ctypes.byref(t), kind, out.ctypes.data, sr * sc))
        assert np.all(out[sr * sc:] == np.float32(-1.0)), "lowp_amax wrote past out"
        return out[:sr * sc].reshape(sr, sc)

    def e8m0_scale(self, amax, fmt, mode):
        c = ctypes.c_uint8()
        self.check(self.dll.lowp_e8m0_scale(float(np.float32(amax)), fmt, mode, ctypes.byref(c)))
        return c.value

    def fp32_scale(self, amax, fmt, eps, pow2):
        s = ctypes.c_float()
        self.check(self.dll.lowp_fp32_scale(float(np.float32(amax)), fmt, float(eps), int(pow2),
                                            ctypes.byref(s)))
        return np.float32(s.value)


# ---- counting checks ----


class Report:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def ok(self):
        self.passed += 1

    def fail(self, name, lines=()):
        self.failed += 1
        if self.failed <= 200:
            print(f"FAIL {name}")
            for ln in lines:
                print(f"       {ln}")

    def check(self, name, cond, lines=()):
        if cond:
            self.ok()
        else:
            self.fail(name, list(lines))
        return bool(cond)

    def arrays_equal(self, name, got, want, fmt_fn=None, context=None):
        """Exact equality of two arrays (floats: same bits or both NaN)."""
        got = np.asarray(got)
        want = np.asarray(want)
        if got.shape != want.shape:
            return self.check(name, False, [f"shape {got.shape} != expected {want.shape}"])
        if got.dtype.kind == "f":
            same = same_floats(got, want)
        else:
            same = got == want
        if np.all(same):
            self.ok()
            return True
        bad = np.argwhere(~same)
        lines = [f"{len(bad)} of {got.size} differ; first:"]
        for idx in bad[:6]:
            idx = tuple(int(i) for i in idx)
            g, w = got[idx], want[idx]
            if got.dtype.kind == "f":
                gs = f"0x{int(np.float32(g).view(np.uint32)):08X} ({float(g)!r})"
                ws = f"0x{int(np.float32(w).view(np.uint32)):08X} ({float(w)!r})"
            else:
                gs, ws = f"0x{int(g):02X}", f"0x{int(w):02X}"
            extra = f" {context(idx)}" if context else ""
            lines.append(f"at {idx}: lowp={gs} expected={ws}{extra}")
        self.fail(name, lines)
        return False

    def finish(self):
        print(f"{self.passed} passed, {self.failed} failed")
        sys.exit(1 if self.failed else 0)
