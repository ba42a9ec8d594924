"""Helpers shared by the Python oracle tests.

- `Lib`: liblowp loaded with ctypes (path in env LOWP_LIB), with numpy-friendly wrappers around
  lowp_cast (structs declared to match include/lowp/tensor.h, cast.h and device.h) and the scalar
  lowp_encode / lowp_decode / lowp_encode_sr.
- `encode_oracle` / `decode_oracle`: the element conversions of docs/numerics.md sections 1-2 built
  from ml_dtypes (its astype is the nonsat RNE cast), with lowp's documented rules for NaN inputs
  and for satfinite applied on top.
- `Report`: counts named checks and prints the first few offending inputs of a failed one.

Codes are numpy arrays with one element per code: uint8 for the 8-bit formats and for E2M1 (in the
low nibble; the library's packed layout is handled inside Lib.cast), uint16 for BF16 and F16.
"""

import ctypes
import os
import sys

import ml_dtypes
import numpy as np

# enum lowp_format (include/lowp/format.h)
F32, BF16, F16, E4M3, E5M2, E2M1, E8M0 = range(7)
SATFINITE, NONSAT, DEFAULT = 0, 1, 2  # enum lowp_overflow
RNE, SR = 0, 1  # enum lowp_rounding
PATH_AUTO, PATH_REFERENCE, PATH_AVX512 = 0, 1, 2  # enum lowp_kernel_path
OK, ERR_INVALID_ARG, ERR_UNSUPPORTED = 0, 1, 2  # enum lowp_status

PATH_NAMES = {PATH_AUTO: "auto", PATH_REFERENCE: "reference", PATH_AVX512: "avx512"}
OVERFLOW_NAMES = {SATFINITE: "satfinite", NONSAT: "nonsat", DEFAULT: "default"}


class Format:
    def __init__(self, fid, name, bits, mldtype, max_code, nan_code, signed=True):
        self.id, self.name, self.bits, self.mldtype = fid, name, bits, mldtype
        self.max_code, self.nan_code, self.signed = max_code, nan_code, signed
        self.code_dtype = np.uint16 if bits == 16 else np.uint8
        self.ncodes = 1 << bits
        self.sign_bit = (1 << (bits - 1)) if signed else 0


# max_code: +fmax; nan_code: the NaN lowp emits for a NaN input (sign added), None for E2M1 (0).
FORMATS = {
    E4M3: Format(E4M3, "e4m3", 8, ml_dtypes.float8_e4m3fn, 0x7E, 0x7F),
    E5M2: Format(E5M2, "e5m2", 8, ml_dtypes.float8_e5m2, 0x7B, 0x7E),
    E2M1: Format(E2M1, "e2m1", 4, ml_dtypes.float4_e2m1fn, 0x7, None),
    E8M0: Format(E8M0, "e8m0", 8, ml_dtypes.float8_e8m0fnu, 0xFE, 0xFF, signed=False),
    BF16: Format(BF16, "bf16", 16, ml_dtypes.bfloat16, 0x7F7F, 0x7FC0),
    F16: Format(F16, "f16", 16, np.float16, 0x7BFF, 0x7E00),
}
NARROW = [E4M3, E5M2, E2M1, E8M0, BF16, F16]  # every format lowp_cast encodes into from F32

SANITIZE = bool(os.environ.get("LOWP_SANITIZE"))


# ---- ctypes declarations (must match the C headers exactly) ----


class Device(ctypes.Structure):  # lowp_device
    _fields_ = [("type", ctypes.c_int32), ("index", ctypes.c_int32)]


class Tensor(ctypes.Structure):  # lowp_tensor
    _fields_ = [
        ("format", ctypes.c_int),  # lowp_format
        ("rows", ctypes.c_int64),
        ("cols", ctypes.c_int64),
        ("data", ctypes.c_void_p),
        ("device", Device),
    ]


class CastCfg(ctypes.Structure):  # lowp_cast_cfg
    _fields_ = [
        ("overflow", ctypes.c_int),  # lowp_overflow
        ("rounding", ctypes.c_int),  # lowp_rounding
        ("seed", ctypes.c_uint64),
        ("offset", ctypes.c_uint64),
        ("threads", ctypes.c_int32),
        ("path", ctypes.c_int),  # lowp_kernel_path
    ]


class LowpError(Exception):
    def __init__(self, status, message):
        super().__init__(f"status {status}: {message}")
        self.status = status


class Lib:
    def __init__(self, path=None):
        path = path or os.environ.get("LOWP_LIB")
        if not path:
            sys.exit("LOWP_LIB is not set (path of liblowp.so); run through ctest")
        self.dll = ctypes.CDLL(path)
        d = self.dll
        d.lowp_cast.argtypes = [ctypes.POINTER(Tensor), ctypes.POINTER(Tensor), ctypes.POINTER(CastCfg)]
        d.lowp_cast.restype = ctypes.c_int
        d.lowp_cast_cfg_init.argtypes = [ctypes.POINTER(CastCfg)]
        d.lowp_cast_cfg_init.restype = ctypes.c_int
        d.lowp_encode.argtypes = [ctypes.c_int, ctypes.c_float, ctypes.c_int, ctypes.POINTER(ctypes.c_uint32)]
        d.lowp_encode.restype = ctypes.c_int
        d.lowp_encode_sr.argtypes = [
            ctypes.c_int, ctypes.c_float, ctypes.c_uint32, ctypes.c_int, ctypes.POINTER(ctypes.c_uint32)]
        d.lowp_encode_sr.restype = ctypes.c_int
        d.lowp_decode.argtypes = [ctypes.c_int, ctypes.c_uint32, ctypes.POINTER(ctypes.c_float)]
        d.lowp_decode.restype = ctypes.c_int
        d.lowp_fp4_pack.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        d.lowp_fp4_pack.restype = ctypes.c_int
        d.lowp_fp4_unpack.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        d.lowp_fp4_unpack.restype = ctypes.c_int
        d.lowp_philox_fill.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
        d.lowp_philox_fill.restype = ctypes.c_int
        d.lowp_last_error.argtypes = []
        d.lowp_last_error.restype = ctypes.c_char_p
        d.lowp_version.argtypes = []
        d.lowp_version.restype = ctypes.c_char_p

    def last_error(self):
        return self.dll.lowp_last_error().decode(errors="replace")

    def _check(self, st):
        if st != OK:
            raise LowpError(st, self.last_error())

    # -- bulk casts --

    def cast_raw(self, src_fmt, src, dst_fmt, dst, rows, cols, overflow=SATFINITE, path=PATH_AUTO,
                 rounding=RNE, seed=0, offset=0, threads=0):
        """lowp_cast on host buffers given as numpy arrays in the library's storage layout.
        overflow=None keeps what lowp_cast_cfg_init chose."""
        assert src.flags.c_contiguous and dst.flags.c_contiguous
        cfg = CastCfg()
        self._check(self.dll.lowp_cast_cfg_init(ctypes.byref(cfg)))
        if overflow is not None:
            cfg.overflow = overflow
        cfg.rounding, cfg.seed, cfg.offset = rounding, seed, offset
        cfg.threads, cfg.path = threads, path
        host = Device(0, 0)
        ts = Tensor(src_fmt, rows, cols, src.ctypes.data, host)
        td = Tensor(dst_fmt, rows, cols, dst.ctypes.data, host)
        self._check(self.dll.lowp_cast(ctypes.byref(ts), ctypes.byref(td), ctypes.byref(cfg)))

    def encode(self, x, fmt, src_fmt=F32, **kw):
        """Encode a 1-D array (float32, or uint16 BF16 codes when src_fmt is BF16) into codes of
        `fmt`, one per element (E2M1 unpacked from the library's packed row)."""
        n = x.size
        f = FORMATS[fmt]
        if fmt == E2M1:
            packed = np.zeros((n + 1) // 2, np.uint8)
            self.cast_raw(src_fmt, x, fmt, packed, 1, n, **kw)
            return unpack_fp4(packed, n)
        out = np.zeros(n, f.code_dtype)
        self.cast_raw(src_fmt, x, fmt, out, 1, n, **kw)
        return out

    def decode(self, codes, fmt, **kw):
        """Decode codes (one per element) of `fmt` to float32 with lowp_cast."""
        n = codes.size
        src = pack_fp4(codes) if fmt == E2M1 else np.ascontiguousarray(codes)
        out = np.zeros(n, np.float32)
        self.cast_raw(fmt, src, F32, out, 1, n, **kw)
        return out

    # -- scalar reference calls --

    def encode_scalar(self, fmt, x, overflow):
        c = ctypes.c_uint32()
        self._check(self.dll.lowp_encode(fmt, float(x), overflow, ctypes.byref(c)))
        return c.value

    def encode_sr_scalar(self, fmt, x, rbits, overflow):
        c = ctypes.c_uint32()
        self._check(self.dll.lowp_encode_sr(fmt, float(x), int(rbits), overflow, ctypes.byref(c)))
        return c.value

    def decode_scalar(self, fmt, code):
        v = ctypes.c_float()
        self._check(self.dll.lowp_decode(fmt, int(code), ctypes.byref(v)))
        return np.float32(v.value)

    def philox(self, seed, offset, n):
        out = np.zeros(n, np.uint32)
        self._check(self.dll.lowp_philox_fill(seed, offset, out.ctypes.data, n))
        return out


def pack_fp4(codes):
    """Two E2M1 codes per byte, element 2i in the low nibble (numpy, independent of the library)."""
    c = np.asarray(codes, np.uint8) & 0xF
    if c.size % 2:
        c = np.append(c, np.uint8(0))
    return np.ascontiguousarray(c[0::2] | (c[1::2] << 4)).astype(np.uint8)


def unpack_fp4(packed, n):
    p = np.asarray(packed, np.uint8)
    out = np.empty(2 * p.size, np.uint8)
    out[0::2] = p & 0xF
    out[1::2] = p >> 4
    return out[:n].copy()


# ---- the oracle ----


def f32(bits):
    return np.asarray(bits, np.uint32).view(np.float32)


def bits32(x):
    return np.asarray(x, np.float32).view(np.uint32)


def decode_oracle(codes, fmt):
    """ml_dtypes' value of every code, as float32 (exact)."""
    f = FORMATS[fmt]
    with np.errstate(all="ignore"):
        return np.ascontiguousarray(np.asarray(codes, f.code_dtype)).view(f.mldtype).astype(np.float32)


_FINITE_TABLE = {}


def finite_table(fmt):
    """finite_table(fmt)[code] is True where the code decodes to a finite value."""
    if fmt not in _FINITE_TABLE:
        f = FORMATS[fmt]
        _FINITE_TABLE[fmt] = np.isfinite(decode_oracle(np.arange(f.ncodes, dtype=np.uint32).astype(f.code_dtype), fmt))
    return _FINITE_TABLE[fmt]


def encode_oracle(x, fmt, overflow):
    """The code lowp must produce for each float32 in x (RNE), per docs/numerics.md sections 1-2.
    DEFAULT is each format's own rule: IEEE (ml_dtypes' default cast) for BF16 and F16,
    satfinite for the others."""
    if overflow == DEFAULT:
        overflow = NONSAT if fmt in (BF16, F16) else SATFINITE
    f = FORMATS[fmt]
    x = np.ascontiguousarray(x, np.float32)
    with np.errstate(all="ignore"):
        codes = x.astype(f.mldtype).view(f.code_dtype).copy()
    if fmt == E2M1:
        codes &= 0xF
    nan = np.isnan(x)
    if fmt == E8M0:
        # Unsigned: zero, negatives and NaN are NaN (ml_dtypes already says so). satfinite turns
        # the overflow of a positive value, and +Inf, into 0xFE.
        if overflow == SATFINITE:
            codes[(codes == 0xFF) & (x > 0)] = 0xFE
        return codes
    sign = (bits32(x) >> 31).astype(f.code_dtype) * f.code_dtype(f.sign_bit)
    # NaN inputs: the NaN lowp emits (with the input's sign); E2M1 has no NaN and gives 0.
    codes[nan] = 0 if f.nan_code is None else (sign[nan] | f.code_dtype(f.nan_code))
    if overflow == SATFINITE:
        finite = finite_table(fmt)[codes]
        over = ~nan & ~finite  # rounded past fmax (Inf, or E4M3's NaN), or was +-Inf
        codes[over] = sign[over] | f.code_dtype(f.max_code)
    return codes


def finite_values(fmt):
    """Every finite value of a format (float64, sorted, unique; -0 and +0 both as 0)."""
    f = FORMATS[fmt]
    v = decode_oracle(np.arange(f.ncodes, dtype=np.uint32).astype(f.code_dtype), fmt)
    return np.unique(v[np.isfinite(v)].astype(np.float64))


# ---- reporting ----


def hexs(a, width):
    return [f"0x{int(v):0{width}X}" for v in a]


class Report:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.notes = []

    def ok(self, name, detail=""):
        self.passed += 1
        if os.environ.get("LOWP_TEST_VERBOSE"):
            print(f"  ok   {name} {detail}")

    def fail(self, name, lines):
        self.failed += 1
        print(f"FAIL {name}")
        for ln in lines:
            print(f"       {ln}")

    def check(self, name, cond, lines=()):
        if cond:
            self.ok(name)
        else:
            self.fail(name, list(lines))
        return cond

    def note(self, text):
        self.notes.append(text)
        print(f"note: {text}")

    def codes_equal(self, name, x, got, want, code_width, x_is_code=False, x_width=8):
        """Compare two code arrays; on mismatch show the first offending inputs in hex."""
        got = np.asarray(got)
        want = np.asarray(want)
        bad = np.nonzero(got != want)[0]
        if bad.size == 0:
            self.ok(name, f"({got.size} values)")
            return True
        lines = [f"{bad.size} of {got.size} differ; first:"]
        for i in bad[:6]:
            if x_is_code:
                xs = f"in=0x{int(x[i]):0{x_width}X}"
            else:
                xs = f"x=0x{int(bits32(x[i])):08X} ({float(np.float32(x[i]))!r})"
            lines.append(f"{xs} lowp=0x{int(got[i]):0{code_width}X} oracle=0x{int(want[i]):0{code_width}X}")
        self.fail(name, lines)
        return False

    def floats_equal(self, name, codes, got, want, code_width):
        """Decoded values: bit-identical, or both NaN."""
        got = np.asarray(got, np.float32)
        want = np.asarray(want, np.float32)
        same = (bits32(got) == bits32(want)) | (np.isnan(got) & np.isnan(want))
        bad = np.nonzero(~same)[0]
        if bad.size == 0:
            self.ok(name, f"({got.size} values)")
            return True
        lines = [f"{bad.size} of {got.size} differ; first:"]
        for i in bad[:6]:
            lines.append(f"code=0x{int(codes[i]):0{code_width}X} lowp=0x{int(bits32(got[i])):08X} "
                         f"({float(got[i])!r}) oracle=0x{int(bits32(want[i])):08X} ({float(want[i])!r})")
        self.fail(name, lines)
        return False

    def finish(self):
        print(f"{self.passed} passed, {self.failed} failed")
        sys.exit(1 if self.failed else 0)
