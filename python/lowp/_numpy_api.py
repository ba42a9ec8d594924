"""lowp's numpy API over the C extension: owns loading ``lowp._lowp`` (``LOWP_EXT_DIR``), the
format / scaling / scale-mode names, the thread setting, and the functions and ``QTensor`` that
``lowp`` re-exports (see the package docstring for the contract). Users import ``lowp``, not this
module; lowp's own modules import from here, never from the package ``__init__``."""

import importlib.machinery
import importlib.util
import os
import sys

import numpy as np

from . import _arrays as A

__all__ = [
    "QTensor", "cast", "decode", "quantize", "dequantize", "gemm", "gemm_kn", "grouped_gemm",
    "info", "set_threads", "get_threads", "empty_cache", "cached_bytes", "FORMATS", "SCALINGS",
    "SCALE_MODES", "crc32c", "checkpoint_verify", "default_corpus",
]


def _load_extension():
    """lowp._lowp; LOWP_EXT_DIR names a build folder holding another build of it (the tests of
    a sanitized build load that build's module)."""
    d = os.environ.get("LOWP_EXT_DIR")
    if not d:
        from . import _lowp as ext
        return ext
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(d, "_lowp" + suffix)
        if os.path.exists(path):
            spec = importlib.util.spec_from_file_location(__package__ + "._lowp", path)
            ext = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = ext
            spec.loader.exec_module(ext)
            return ext
    raise ImportError(f"LOWP_EXT_DIR={d!r} holds no _lowp extension module")


_lowp = _load_extension()

__version__ = _lowp.version()

# The names come from the C library's tables (lowp.rules serves the same to the rest of the
# package; this module loads the extension, so it reads them there itself).
_TABLES = _lowp.tables()
_FMT, _KIND = _TABLES["formats"], _TABLES["scalings"]
#: Element formats of quantized tensors.
FORMATS = tuple(n for n in sorted(_FMT, key=lambda n: _FMT[n]["code"])
                if _FMT[n]["signed"] and _FMT[n]["bits"] <= 8)
#: Scaling kinds, as on the command line.
SCALINGS = tuple(n for n in sorted(_KIND, key=lambda n: _KIND[n]["code"]) if n != "none")
#: NVFP4 kinds: E4M3 block scale codes and a binary32 tensor decode scale D (docs/numerics.md 4b).
_NV_KINDS = tuple(k for k in SCALINGS if _KIND[k].get("tensor_scale"))
#: Kinds whose columnwise copy can be quantized in groups along the tokens (offs).
_GROUPED_KINDS = tuple(k for k in SCALINGS if _KIND[k]["grouped"])
#: E8M0 scale modes (mx32 and block32x32).
SCALE_MODES = tuple(m for m in sorted(_TABLES["scale_modes"], key=_TABLES["scale_modes"].get)
                    if m != "default")
_CAST_FORMATS = ("e4m3", "e5m2", "e2m1", "e8m0", "bf16", "f16")
_E8M0_KINDS = tuple(k for k in SCALINGS if _KIND[k]["scale"] == "e8m0")
_DEFAULT_MODE = {k: _KIND[k]["default_mode"] for k in _E8M0_KINDS}
_TORCH_DTYPE_NAMES = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2", "float4_e2m1fn_x2": "e2m1",
                      "float8_e8m0fnu": "e8m0", "bfloat16": "bf16", "float16": "f16"}
_LAYOUTS = ("canonical", "cublas", "npu")
_ALIASES = {"fp4": "e2m1", "mxfp4": "e2m1", "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}

# ---- threads ----

_threads = None


def set_threads(n):
    """Threads lowp's kernels use: n >= 1, 0 for every core, or None for the default (the
    calling torch's ``torch.get_num_threads()`` when torch is imported, else every core)."""
    global _threads
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"lowp.set_threads: n must be an int or None, got {type(n).__name__}")
        if n < 0 or n > 65536:
            raise ValueError(f"lowp.set_threads: n ({n}) must be in [0, 65536]")
        n = int(n)
    _threads = n


def get_threads():
    """The thread count passed to the kernels (0: every core)."""
    if _threads is not None:
        return _threads
    t = A.torch_module()
    if t is not None and hasattr(t, "get_num_threads"):
        return int(t.get_num_threads())
    return 0


def info():
    """The library version, its backends with their devices and capabilities, and the thread
    setting, as a dict. ``info()["cpu"]["caps"]`` lists the CPU features lowp uses."""
    d = _lowp.info()
    for b in d["backends"]:
        if b["name"] == "cpu" and b["devices"]:
            d["cpu"] = b["devices"][0]
    d["threads"] = get_threads()
    return d


def empty_cache():
    """Hand every block of lowp's host block cache back to the system, like
    ``torch.cuda.empty_cache()`` for PyTorch's caching allocator. lowp's calls release the
    host buffers that live for one call (GEMM workspaces, quantized copies of activations and
    gradients) into that cache and reuse them in the next call; it holds at most
    ``LOWP_HOST_CACHE_MB`` MiB (environment, read once; default 512, 0 turns it off). Blocks
    in use are never in it, so this is safe at any time. See ``cached_bytes()``."""
    _lowp.host_empty_cache()


def cached_bytes():
    """Bytes of host memory lowp's block cache holds now (``empty_cache()`` frees them)."""
    return int(_lowp.host_cache_bytes())


# ---- names ----

def _name(value, fn, arg, allowed):
    if value is not None and not isinstance(value, str):
        s = str(value)
        if s.startswith("torch."):
            value = _TORCH_DTYPE_NAMES.get(s[6:], s)
    if not isinstance(value, str):
        raise TypeError(f"{fn}: {arg} must be a string, got {type(value).__name__}")
    v = _ALIASES.get(value.lower(), value.lower())
    if v not in allowed:
        raise ValueError(f"{fn}: {arg} ({value!r}) is not one of {', '.join(allowed)}")
    return v


# ---- casts ----

def cast(x, to, saturate=None, round="rne", seed=0, offset=0):
    """Encode x (float32 or bfloat16, any shape) into element codes of format `to` (e4m3,
    e5m2, e2m1, e8m0, bf16, f16), as ``lowp cast`` does: uint8 codes (e2m1 one code per byte,
    in the low nibble), uint16 for bf16 and f16, in x's shape.

    saturate: None (default: satfinite for the 8- and 4-bit formats, IEEE overflow to Inf for
    bf16 and f16), "satfinite" or True (overflow and Inf become +-fmax), "nonsat" or False
    (Inf where the format has one, else NaN). round: "rne" or "sr" (stochastic: element i
    uses Philox word offset + i of stream seed)."""
    fn = "lowp.cast"
    to = _name(to, fn, "to", _CAST_FORMATS)
    a, kind, tor = A.float_input(x, fn, "x")
    if saturate is None:
        nonsat = to in ("bf16", "f16")
    elif saturate is True or saturate == "satfinite":
        nonsat = False
    elif saturate is False or saturate == "nonsat":
        nonsat = True
    else:
        raise ValueError(f"{fn}: saturate ({saturate!r}) is not None, 'satfinite' or 'nonsat'")
    r = _name(round, fn, "round", ("rne", "sr"))
    seed, offset = _uint64(seed, fn, "seed"), _uint64(offset, fn, "offset")
    out = A.empty(a.shape, np.uint16 if to in ("bf16", "f16") else np.uint8, tor)
    _lowp.cast(a, kind, out, to, a.size, int(nonsat), int(r == "sr"), seed, offset,
               get_threads(), 0)
    return A.out_array(out, tor)


def _uint64(v, fn, arg):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{fn}: {arg} must be an int, got {type(v).__name__}")
    if v < 0 or v >= 2**64:
        raise ValueError(f"{fn}: {arg} ({v}) must be in [0, 2^64)")
    return int(v)


def decode(codes, fmt):
    """Decode element codes of `fmt` (uint8, one code per element; uint16 for bf16/f16; torch
    float8 and bfloat16 tensors are read as their bits) into float32, exactly, in codes'
    shape."""
    fn = "lowp.decode"
    fmt = _name(fmt, fn, "fmt", _CAST_FORMATS)
    a, _, tor = A.to_numpy(codes, fn, "codes")
    want = 2 if fmt in ("bf16", "f16") else 1
    if a.dtype.itemsize != want or a.dtype.kind not in "uif":
        raise TypeError(f"{fn}: codes of {fmt} must be {'uint16' if want == 2 else 'uint8'}, "
                        f"got {codes.dtype}")
    a = a.view(np.uint16 if want == 2 else np.uint8)
    out = A.empty(a.shape, np.float32, tor)
    _lowp.cast(a, fmt, out, "f32", a.size, 0, 0, 0, 0, get_threads(), 0)
    return A.out_array(out, tor)


# ---- quantized tensors ----

class QTensor:
    """A quantized tensor: element codes and scales of a rowwise copy (quantized along the last
    dimension) and/or a columnwise copy (the rowwise quantization of the transpose), in lowp's
    canonical layouts (see ``include/lowp/quant.h``).

    Attributes: ``data`` (uint8 codes [R, C], e2m1 packed two per byte [R, ceil(C/2)], element
    2i in the low nibble), ``scale`` (uint8 E8M0 codes for mx32/block32x32, uint8 E4M3 block
    codes for nv16/nv16x16, float32 scale_inv for the others), ``tensor_scale`` (nv16, nv16x16:
    the float32 tensor decode scale D of the rowwise copy, shape [1], or [G, 1] for a stack;
    None for the other kinds), ``data_col``/``scale_col``/``tensor_scale_col`` (the columnwise
    copy, [C, R]; its D is the rowwise copy's, except in a grouped copy, where it is that of the
    tokens in groups), ``format``,
    ``scaling``, ``scale_mode`` (E8M0 kinds), ``shape`` (the logical (R, C), or (G, R, C) for
    a stack of G matrices), ``offs`` (int32 group ends along the rows - the tokens - when the
    columnwise copy was quantized in groups), ``amax`` (tensor scaling: the tensor's amax),
    ``layout`` of the E8M0 scales ("canonical", "cublas" or "npu", see ``lowp.quantize``).
    Copies that were not made are None. Arrays are numpy or torch, as the input was.
    """

    __slots__ = ("data", "scale", "data_col", "scale_col", "format", "scaling", "scale_mode",
                 "shape", "offs", "amax", "layout", "tensor_scale", "tensor_scale_col",
                 "_colview")

    def __init__(self, data, scale, format, scaling, shape, scale_mode=None, data_col=None,
                 scale_col=None, offs=None, amax=None, layout="canonical", _colview=False, *,
                 tensor_scale=None, tensor_scale_col=None):
        fn = "lowp.QTensor"
        self.layout = _name(layout, fn, "layout", _LAYOUTS)
        if self.layout != "canonical" and scaling != "mx32":
            raise ValueError(f"{fn}: layout {layout} applies to mx32 scales only")
        self.format = _name(format, fn, "format", FORMATS)
        self.scaling = _name(scaling, fn, "scaling", SCALINGS)
        if self.scaling in _E8M0_KINDS:
            self.scale_mode = _name(scale_mode or _DEFAULT_MODE[self.scaling], fn, "scale_mode",
                                    SCALE_MODES)
        elif scale_mode is not None:
            raise ValueError(f"{fn}: scale_mode applies to mx32 and block32x32, not "
                             f"{self.scaling}")
        else:
            self.scale_mode = None
        try:
            shape = tuple(int(s) for s in shape)
        except (TypeError, ValueError):
            raise TypeError(f"{fn}: shape ({shape!r}) must be a tuple of ints") from None
        if len(shape) not in (2, 3) or min(shape) < 0:
            raise ValueError(f"{fn}: shape {shape} must be (R, C) or (G, R, C)")
        if data is None and data_col is None:
            raise ValueError(f"{fn}: data and data_col are both None")
        R, C = shape[-2:]
        o = offs if self.scaling in _GROUPED_KINDS else None  # grouped copies' scales
        _check_copy(fn, ("data", "scale"), data, scale, self, R, C, shape[:-2],
                    o if _colview else None, _colview)
        _check_copy(fn, ("data_col", "scale_col"), data_col, scale_col, self, C, R, shape[:-2],
                    None if _colview else o, not _colview)
        _check_tensor_scale(fn, "tensor_scale", tensor_scale, data, self.scaling, shape[:-2])
        _check_tensor_scale(fn, "tensor_scale_col", tensor_scale_col, data_col, self.scaling,
                            shape[:-2])
        self.shape = shape
        self.data, self.scale, self.data_col, self.scale_col = data, scale, data_col, scale_col
        self.tensor_scale, self.tensor_scale_col = tensor_scale, tensor_scale_col
        self.offs = offs
        self.amax = amax
        self._colview = _colview

    @property
    def is_torch(self):
        return any(A.is_torch(t) for t in (self.data, self.data_col))

    def col(self):
        """A view whose rowwise copy is this tensor's columnwise copy (shape transposed), for
        GEMMs that contract over the rows (the weight gradient's operands)."""
        if self.data_col is None:
            raise ValueError("lowp.QTensor.col: this tensor has no columnwise copy "
                             "(quantize with axis='col' or 'both')")
        shape = self.shape[:-2] + (self.shape[-1], self.shape[-2])
        return QTensor(self.data_col, self.scale_col, self.format, self.scaling, shape,
                       self.scale_mode, offs=self.offs, amax=self.amax, layout=self.layout,
                       _colview=True, tensor_scale=self.tensor_scale_col)

    def dequantize(self, axis="row"):
        return dequantize(self, axis)

    def __repr__(self):
        copies = "+".join(n for n, d in (("row", self.data), ("col", self.data_col))
                          if d is not None)
        mode = f", scale_mode={self.scale_mode}" if self.scale_mode else ""
        groups = f", groups={len(self.offs)}" if self.offs is not None else ""
        return (f"QTensor(shape={self.shape}, format={self.format}, scaling={self.scaling}"
                f"{mode}, copies={copies}{groups})")

    # The extension's descriptor (a lowp._lowp.QDesc) of one matrix (index g of a stack) of the
    # rowwise or columnwise copy.
    def _desc(self, which, fn, arg, g=None):
        data, scale, ts = ((self.data, self.scale, self.tensor_scale) if which == "row"
                           else (self.data_col, self.scale_col, self.tensor_scale_col))
        if data is None:
            hint = " (use q.col() for a columnwise copy)" if which == "row" else ""
            raise ValueError(f"{fn}: {arg} has no {which}wise copy{hint}")
        R, C = self.shape[-2:]
        rows, cols = (R, C) if which == "row" else (C, R)
        d, _, _ = A.to_numpy(data, fn, f"{arg}.data")
        s = None if scale is None else A.to_numpy(scale, fn, f"{arg}.scale")[0]
        if g is not None:
            d = d[g]
            s = None if s is None else s[g]
        offs = None
        is_col = (which == "col") != self._colview  # the original tensor's columnwise copy
        if self.offs is not None and is_col:
            offs = A.int32_input(self.offs, fn, f"{arg}.offs")[0]
        if self.scaling in _NV_KINDS:
            t = A.to_numpy(ts, fn, f"{arg}.tensor_scale")[0]
            s = _nv_join(s, t if g is None else t[g], self.format, self.scaling, rows, cols,
                         offs)
        if self.layout != "canonical":
            stacked = len(self.shape) == 3 and g is None
            s = _scales_to_canonical(s, self.layout, is_col, self.format, rows, cols, offs,
                                     self.shape[0] if stacked else None)
        return _lowp.QDesc(self.format, self.scaling, rows, cols, d, s, offs)


def _check_array(fn, arg, x, np_dtype, shape):
    """x (numpy or torch) has numpy dtype np_dtype (torch: the same name) and shape."""
    if not (A.is_torch(x) or isinstance(x, np.ndarray)):
        raise TypeError(f"{fn}: {arg} must be a numpy array or a torch tensor, got "
                        f"{type(x).__name__}")
    name = np.dtype(np_dtype).name
    got = str(x.dtype).replace("torch.", "")
    if got != name:
        raise ValueError(f"{fn}: {arg} must be {name}, got {got}")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{fn}: {arg} has shape {tuple(x.shape)}, expected {tuple(shape)}")


def _check_tensor_scale(fn, arg, ts, data, scaling, stack):
    """NVFP4's tensor decode scale of one copy: float32 [(G,) 1] beside its data, else None."""
    if scaling not in _NV_KINDS or data is None:
        if ts is not None:
            raise ValueError(f"{fn}: {arg} applies to a present copy of kind nv16 or nv16x16, "
                             f"not {scaling}" + ("" if data is not None else " (no codes)"))
        return
    if ts is None:
        raise ValueError(f"{fn}: {arg} is needed with scaling {scaling}")
    _check_array(fn, arg, ts, np.float32, stack + (1,))


def _nv_join(blocks, d, fmt, scaling, rows, cols, offs):
    """The C library's NVFP4 scale bytes of one matrix or a stack: the E4M3 block codes, zero
    padding to a multiple of 4 bytes, then D (lowp_qtensor_tensor_scale_offset)."""
    _, sb, _, _, _ = _lowp.layout(fmt, scaling, rows, cols, offs)
    stack = blocks.shape[:-2]
    n = blocks.shape[-2] * blocks.shape[-1]
    out = np.zeros(stack + (sb,), np.uint8)
    out[..., :n] = blocks.reshape(stack + (n,))
    out[..., sb - 4:] = np.ascontiguousarray(d, np.float32).reshape(stack + (1,)).view(np.uint8)
    return out


def _nv_split(buf, sr, sc, as_torch):
    """(block codes [(G,) sr, sc], D [(G,) 1]) of the C library's NVFP4 scale bytes."""
    stack = buf.shape[:-1]
    blocks = A.empty(stack + (sr, sc), np.uint8, as_torch)
    np.copyto(blocks, buf[..., :sr * sc].reshape(stack + (sr, sc)))
    d = A.empty(stack + (1,), np.float32, as_torch)
    np.copyto(d, np.ascontiguousarray(buf[..., -4:]).view(np.float32))
    return blocks, d


def _check_copy(fn, names, data, scale, q, rows, cols, stack, offs, is_col):
    """One copy of QTensor q, [rows, cols] per matrix of the stack: uint8 codes and the scales
    its format, scaling, layout and (grouped copies) offs make, as lowp_qtensor_nbytes sizes
    them; the extension checks only that the buffers hold at least that many bytes."""
    dn, sn = names
    if data is None:
        if scale is not None:
            raise ValueError(f"{fn}: {sn} is given without {dn}")
        return
    if scale is None:
        raise ValueError(f"{fn}: {dn} is given without {sn}")
    _check_array(fn, dn, data, np.uint8,
                 stack + (rows, (cols + 1) // 2 if q.format == "e2m1" else cols))
    o = None if offs is None else A.int32_input(offs, fn, "offs")[0]
    _, _, sr, sc, e8 = _lowp.layout(q.format, q.scaling, rows, cols, o)
    sshape = (sr, sc) if q.layout == "canonical" else _layout_shape(q.layout, is_col, sr, sc, o)
    codes = e8 or q.scaling in _NV_KINDS  # uint8 E8M0 or E4M3 codes
    _check_array(fn, sn, scale, np.uint8 if codes else np.float32, stack + sshape)


def _check_enum_options(fn, scaling, scale_mode, pow2, eps):
    if scaling in _E8M0_KINDS:
        mode = _name(scale_mode, fn, "scale_mode", SCALE_MODES) if scale_mode is not None \
            else _DEFAULT_MODE[scaling]
        if pow2 is not None:
            raise ValueError(f"{fn}: pow2 applies to the binary32 scalings, not {scaling}")
        if eps:
            raise ValueError(f"{fn}: eps applies to the binary32 scalings, not {scaling}")
        return mode, "default" if scale_mode is None else mode, -1
    if scale_mode is not None:
        raise ValueError(f"{fn}: scale_mode applies to mx32 and block32x32, not {scaling}")
    if scaling in _NV_KINDS and (pow2 is not None or eps):
        raise ValueError(f"{fn}: {'pow2' if pow2 is not None else 'eps'} applies to the binary32 "
                         f"scalings, not {scaling} (NVFP4's scales take no options)")
    if pow2 is None:
        p = -1
    elif isinstance(pow2, (bool, np.bool_)):
        p = int(pow2)
    else:
        raise TypeError(f"{fn}: pow2 must be None, True or False, got {type(pow2).__name__}")
    return None, "default", p


def _alloc_copy(fmt, scaling, rows, cols, offs=None, stack=(), as_torch=False):
    """(codes, scales) of a copy; NVFP4's scales are the C library's bytes (_nv_split them)."""
    db, sb, sr, sc, e8 = _lowp.layout(fmt, scaling, rows, cols, offs)
    data = A.empty(stack + (rows, (cols + 1) // 2 if fmt == "e2m1" else cols), np.uint8,
                   as_torch)
    if scaling in _NV_KINDS:
        return data, np.empty(stack + (sb,), np.uint8)
    scale = A.empty(stack + (sr, sc), np.uint8 if e8 else np.float32, as_torch)
    n = int(np.prod(stack, dtype=np.int64))
    assert data.nbytes == db * n and scale.nbytes == sb * n
    return data, scale


def _quantize_extras(fn, a, kind, ax, scale, offs):
    """quantize's checks of x's rank, `scale` and `offs`: (scale as a float or None, offs as an
    int32 array or None)."""
    if a.ndim not in (2, 3):
        raise ValueError(f"{fn}: x must be 2-D [R, C] or 3-D [G, R, C], got shape {a.shape}")
    if scale is not None:
        if kind != "tensor":
            raise ValueError(f"{fn}: scale applies to tensor scaling, not {kind}")
        scale = float(scale)
    o = None
    if offs is not None:
        if a.ndim != 2:
            raise ValueError(f"{fn}: offs needs a 2-D x, got shape {a.shape}")
        if ax == "row":
            raise ValueError(f"{fn}: offs groups the columnwise copy: axis must be 'col' or "
                             "'both'")
        o, _ = A.int32_input(offs, fn, "offs")
    return scale, o


def _quantize_into(a, xfmt, fmt, kind, row, col, o, cfg):
    """Quantize a ([R, C] or a stack) into the allocated copies row = (codes, scales) and col
    (grouped along tokens with o); returns the amaxes the library reported."""
    stack = a.shape[:-2]
    R, C = a.shape[-2:]
    amax = []
    grouped = o is not None
    for g in range(stack[0] if stack else 1):
        pick = (lambda t: t if t is None or not stack else t[g])
        xg = _lowp.QDesc(xfmt, "none", R, C, a[g] if stack else a)
        am = None
        if row[0] is not None or not grouped:
            rq = None if row[0] is None else _lowp.QDesc(fmt, kind, R, C, pick(row[0]),
                                                         pick(row[1]))
            cq = None if grouped or col[0] is None else _lowp.QDesc(fmt, kind, C, R, pick(col[0]),
                                                                    pick(col[1]))
            am = _lowp.quantize(xg, rq, cq, cfg)
        if grouped:
            _lowp.quantize_grouped(xg, _lowp.QDesc(fmt, kind, C, R, col[0], col[1], o), cfg)
        if am is not None:
            amax.append(am)
    return amax


def quantize(x, format="e4m3", scaling="mx32", scale_mode=None, axis="row", eps=0.0, pow2=None,
             layout="canonical", offs=None, *, scale=None):
    """Quantize x (float32 or bfloat16, [R, C], or [G, R, C] for G matrices quantized one by
    one) as ``lowp quantize`` does, into a QTensor.

    format: e4m3, e5m2 or e2m1 (mx32, nv16, nv16x16 only; also a torch float8 dtype).
    scaling: tensor, row, mx32, block128, block128x128, block32x32, nv16 (NVFP4 1x16 blocks)
    or nv16x16 (NVFP4 16x16 weight tiles): NVFP4 scales are uint8 E4M3 block codes in
    q.scale and the float32 tensor decode scale D in q.tensor_scale (docs/numerics.md 4b),
    and take none of scale_mode, eps, pow2, scale. scale_mode (mx32, block32x32): rceil (mx32's
    default), floor (block32x32's default), ceil, even. axis: "row" (the rowwise copy), "col"
    (the columnwise copy: x^T [C, R] quantized along R) or "both" (from one read of x).
    eps (binary32 kinds): amax floor (torchao uses 1e-12). pow2 (binary32 kinds): round scales
    down to powers of two (None: on for row, off for the others). layout of the mx32 scales:
    "canonical" ([R, ceil(C/32)] row-major), "cublas" (cuBLAS/TE swizzled 128x4 tiles,
    [ceil(R/128)*128, ceil(C/128)*4]) or "npu" (Ascend npu_dynamic_mx_quant pairs: rowwise
    [R, ceil(C/64), 2], columnwise [ceil(R/64), C, 2]; a grouped copy, each group's blocks in
    pairs, [sum_g ceil(nb_g/2), C, 2], npu_grouped_dynamic_mx_quant's); dequantize and gemm
    accept every layout.
    offs (int32 cumulative group ends along the rows, the tokens; mx32, block128 or nv16, 2-D
    x): the columnwise copy is quantized per group, no block straddling a group boundary (for
    the split-K grouped GEMM; nv16: its D, q.tensor_scale_col, is the tokens' in groups).
    scale (tensor scaling only, keyword): quantize with this scale (delayed scaling) instead
    of one from the amax; q.amax is the amax.
    """
    fn = "lowp.quantize"
    fmt = _name(format, fn, "format", FORMATS)
    kind = _name(scaling, fn, "scaling", SCALINGS)
    ax = _name(axis, fn, "axis", ("row", "col", "both"))
    lay = _name(layout, fn, "layout", _LAYOUTS)
    if lay != "canonical" and kind != "mx32":
        raise ValueError(f"{fn}: layout {lay} applies to mx32 scales only")
    if lay == "cublas" and offs is not None:
        raise ValueError(f"{fn}: layout cublas does not take grouped (offs) copies")
    mode_name, mode_arg, p = _check_enum_options(fn, kind, scale_mode, pow2, eps)
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating, np.integer)):
        raise TypeError(f"{fn}: eps must be a float, got {type(eps).__name__}")
    a, xfmt, tor = A.float_input(x, fn, "x")
    scale, o = _quantize_extras(fn, a, kind, ax, scale, offs)
    stack = a.shape[:-2]
    R, C = a.shape[-2:]
    thr = get_threads()
    row = col = (None, None)
    if ax in ("row", "both"):
        row = _alloc_copy(fmt, kind, R, C, None, stack, tor)
    if ax in ("col", "both"):
        col = _alloc_copy(fmt, kind, C, R, o, stack, tor)
    cfg = _lowp.QuantCfg(scale_mode=mode_arg, pow2=p, eps=float(eps), scale=scale,
                         amax=kind == "tensor", threads=thr)
    amax = _quantize_into(a, xfmt, fmt, kind, row, col, o, cfg)
    amax = (amax[0] if not stack else np.asarray(amax, np.float32)) if kind == "tensor" and amax \
        else None
    if lay != "canonical":
        row = (row[0], _scales_to_layout(row[1], lay, False, stack, tor))
        col = (col[0], _scales_to_layout(col[1], lay, True, stack, tor, o))
    row, col, ts = _nv_copies(fmt, kind, R, C, o, row, col, tor)
    w = (lambda t: None if t is None else A.out_array(t, tor))
    return QTensor(w(row[0]), w(row[1]), fmt, kind, a.shape, mode_name, w(col[0]), w(col[1]),
                   offs=None if o is None else A.out_array(o, tor) if tor else o, amax=amax,
                   layout=lay, tensor_scale=w(ts[0]), tensor_scale_col=w(ts[1]))


def _nv_copies(fmt, kind, R, C, o, row, col, tor):
    """quantize's NVFP4 copies with their scale bytes split: (row, col, [D row, D col]); the
    other kinds' copies as they are."""
    ts = [None, None]
    if kind not in _NV_KINDS:
        return row, col, ts
    copies = [row, col]
    for i, (rows, cols, offs) in enumerate(((R, C, None), (C, R, o))):
        if copies[i][0] is not None:
            _, _, sr, sc, _ = _lowp.layout(fmt, kind, rows, cols, offs)
            blocks, ts[i] = _nv_split(copies[i][1], sr, sc, tor)
            copies[i] = (copies[i][0], blocks)
    return copies[0], copies[1], ts


def _layout_name(layout, is_col):
    return "cublas" if layout == "cublas" else ("npu_first" if is_col else "npu_last")


def _npu_group_blocks(offs):
    """The 32-token blocks of each group of a grouped copy."""
    ends = [int(e) for e in np.asarray(offs).reshape(-1)]
    return [-(-(e - p) // 32) for p, e in zip([0] + ends[:-1], ends)]


def _layout_shape(layout, is_col, sr, sc, offs=None):
    """Shape of canonical E8M0 scales [sr, sc] in a device layout (include/lowp/layout.h). A
    grouped copy (offs) in the npu layout: each group's blocks padded to an even count and
    paired, stacked along the first dimension, [sum_g ceil(nb_g / 2), sr, 2]
    (npu_grouped_dynamic_mx_quant's mxscale)."""
    if offs is not None and layout == "npu":
        return (sum(-(-n // 2) for n in _npu_group_blocks(offs)), sr, 2)
    if layout == "cublas":
        return (-(-sr // 128) * 128, -(-sc // 4) * 4)
    return (-(-sc // 2), sr, 2) if is_col else (sr, -(-sc // 2), 2)


def _grouped_npu(src, dst, offs, to_canonical):
    """A grouped copy's scales, canonical [sr, sum nb_g] <-> npu [sum ceil(nb_g/2), sr, 2]:
    each group converted on its own (npu_first)."""
    canon, npu = (dst, src) if to_canonical else (src, dst)
    sr, b0, r0 = canon.shape[0], 0, 0
    for n in _npu_group_blocks(offs):
        if n:
            part = np.empty((sr, n), np.uint8) if to_canonical else \
                np.ascontiguousarray(canon[:, b0:b0 + n])
            pairs = npu[r0:r0 + -(-n // 2)]
            if to_canonical:
                _lowp.scale_layout(np.ascontiguousarray(pairs), sr, n, "npu_first", True, part)
                canon[:, b0:b0 + n] = part
            else:
                _lowp.scale_layout(part, sr, n, "npu_first", False, pairs)
        b0, r0 = b0 + n, r0 + -(-n // 2)


def _scales_to_layout(canon, layout, is_col, stack, as_torch=False, offs=None):
    """Canonical scales [(G,) sr, sc] -> the layout (per matrix of a stack; offs: a grouped
    copy, npu layout)."""
    if canon is None:
        return None
    sr, sc = canon.shape[-2:]
    out = A.empty(stack + _layout_shape(layout, is_col, sr, sc, offs), np.uint8, as_torch)
    if offs is not None:
        _grouped_npu(canon, out, offs, False)
        return out
    for g in range(stack[0] if stack else 1):
        _lowp.scale_layout(canon[g] if stack else canon, sr, sc, _layout_name(layout, is_col),
                           False, out[g] if stack else out)
    return out


def _scales_to_canonical(s, layout, is_col, fmt, rows, cols, offs, groups=None):
    """Scales in a layout -> canonical [sr, sc] (or [groups, sr, sc] for a stack)."""
    _, _, sr, sc, _ = _lowp.layout(fmt, "mx32", rows, cols, offs)
    out = np.empty(((groups,) if groups else ()) + (sr, sc), np.uint8)
    if offs is not None and layout == "npu":
        _grouped_npu(s, out, offs, True)
        return out
    for g in range(groups or 1):
        src = np.ascontiguousarray(s[g] if groups else s)
        _lowp.scale_layout(src, sr, sc, _layout_name(layout, is_col), True,
                           out[g] if groups else out)
    return out


def dequantize(q, axis="row"):
    """Decode a QTensor into float32 of its logical shape: axis "row" decodes the rowwise copy,
    "col" the columnwise copy (transposed back)."""
    fn = "lowp.dequantize"
    if not isinstance(q, QTensor):
        raise TypeError(f"{fn}: q must be a lowp.QTensor, got {type(q).__name__}")
    ax = _name(axis, fn, "axis", ("row", "col"))
    R, C = q.shape[-2:]
    stack = q.shape[:-2]
    rows, cols = (R, C) if ax == "row" else (C, R)
    tor = q.is_torch
    out = A.empty(stack + (rows, cols), np.float32, tor and ax == "row")
    for g in range(stack[0] if stack else 1):
        _lowp.dequantize(q._desc(ax, fn, "q", g if stack else None), out[g] if stack else out)
    if ax == "col":
        t = A.empty(stack + (cols, rows), np.float32, tor)
        np.copyto(t, np.swapaxes(out, -1, -2))
        out = t
    return A.out_array(out, tor)


# ---- GEMMs ----

def _operand(x, fn, arg, which="row", g=None):
    """(descriptor, shape, was_torch) of a GEMM operand: a QTensor or a float32/bf16 array."""
    if isinstance(x, QTensor):
        return x._desc(which, fn, arg, g), x.shape, x.is_torch
    a, kind, tor = A.float_input(x, fn, arg)
    if a.ndim not in (2, 3):
        raise ValueError(f"{fn}: {arg} must be 2-D, got shape {a.shape}")
    if which == "col":
        a = np.ascontiguousarray(np.swapaxes(a, -1, -2))
    m = a[g] if g is not None else a
    return _lowp.QDesc(kind, "none", m.shape[-2], m.shape[-1], m), x.shape, tor


def _check_k(fn, ka, kb, b_dim):
    """The contracted lengths of a GEMM's operands, checked before the output is allocated."""
    if ka != kb:
        raise ValueError(f"{fn}: a.shape[1] ({ka}) != {b_dim} ({kb}): the operands' K differ")


def _out_arg(out, shape, fn, accumulate, as_torch=False):
    if out is None:
        if accumulate:
            raise ValueError(f"{fn}: accumulate=True needs out")
        return A.empty(shape, np.float32, as_torch, zero=True), "f32", None
    if A.is_torch(out) and (out.is_neg() or out.is_conj()):
        raise ValueError(f"{fn}: out is a negative or conjugate view (resolve_neg() gives a "
                         "copy; pass a plain tensor)")
    a, kind, _ = A.float_input(out, fn, "out")
    if tuple(a.shape) != tuple(shape):
        raise ValueError(f"{fn}: out has shape {tuple(a.shape)}, expected {tuple(shape)}")
    if A.is_torch(out) and out.requires_grad:
        raise ValueError(f"{fn}: out must not require grad")
    return a, kind, out


def _gemm_cfg(out_kind, accumulate, b_layout="nk", threads=None):
    """The extension's GEMM settings, a lowp._lowp.GemmCfg."""
    return _lowp.GemmCfg(out_dtype=out_kind, accumulate=bool(accumulate),
                         threads=get_threads() if threads is None else threads, b_layout=b_layout)


def gemm(a, b, out=None, accumulate=False):
    """C = A . B^T in float32 (or into `out`, float32 or bfloat16 [M, N]; accumulate=True adds
    to it). a [M, K] and b [N, K] are QTensors (their rowwise copies; pass ``q.col()`` for a
    columnwise copy) or float32/bfloat16 arrays (both plain, of one dtype). The pairs of
    ``include/lowp/gemm.h`` are supported: tensor x tensor, row x row, mx32 x mx32,
    block128 x block128x128, block128 x block128, mx32 x block32x32, nv16 or nv16x16 x nv16
    or nv16x16, plain x plain."""
    fn = "lowp.gemm"
    da, sa, ta = _operand(a, fn, "a")
    db, sb, tb = _operand(b, fn, "b")
    if len(sa) != 2 or len(sb) != 2:
        raise ValueError(f"{fn}: a and b must be 2-D, got {tuple(sa)} and {tuple(sb)} "
                         "(lowp.grouped_gemm takes 3-D b)")
    _check_k(fn, sa[1], sb[1], "b.shape[1]")
    shape = (sa[0], sb[0])
    c, ckind, given = _out_arg(out, shape, fn, accumulate, ta or tb)
    _lowp.gemm(da, db, c, _gemm_cfg(ckind, accumulate))
    return given if given is not None else A.out_array(c, ta or tb)


def gemm_kn(a, b, out=None, accumulate=False):
    """C = A . B in float32 (or into `out`, as in `gemm`), with b given as stored, [K, N]: the
    input gradient dX = dY . W reads the weight's own copy W [N, K] (``lowp_gemm`` with
    ``b_layout`` ``LOWP_LAYOUT_KN``). b is a QTensor (its rowwise copy) of a kind whose
    transposed copy is the transpose of this one (tensor, block128x128, block32x32, nv16x16),
    or a plain float32/bfloat16 array; the result has the bits of ``gemm(a, b.col())`` for the same
    input. Other kinds raise ValueError (their columnwise copy is a different quantization:
    pass it to `gemm`)."""
    fn = "lowp.gemm_kn"
    da, sa, ta = _operand(a, fn, "a")
    db, sb, tb = _operand(b, fn, "b")
    if len(sa) != 2 or len(sb) != 2:
        raise ValueError(f"{fn}: a and b must be 2-D, got {tuple(sa)} and {tuple(sb)}")
    _check_k(fn, sa[1], sb[0], "b.shape[0]")
    shape = (sa[0], sb[1])
    c, ckind, given = _out_arg(out, shape, fn, accumulate, ta or tb)
    _lowp.gemm(da, db, c, _gemm_cfg(ckind, accumulate, "kn"))
    return given if given is not None else A.out_array(c, ta or tb)


def grouped_gemm(a, b, offs, out=None, accumulate=False):
    """Grouped GEMM with ``torch._grouped_mm``'s offs (int32 cumulative group ends along the
    tokens; group g owns tokens [offs[g-1], offs[g]), empty groups allowed).

    split-M (MoE forward and input gradient), when b is 3-D: a [M, K] (QTensor or array),
    b [G, N, K] (a QTensor of shape (G, N, K) or a 3-D array): out [M, N] float32 with
    out[rows_g] = a[rows_g] . b[g]^T; rows past offs[-1] are 0 (or left as they are in a
    given out).

    split-K (MoE weight gradient), when a and b are 2-D: a = dY [M, N] and b = X [M, K], both
    QTensors quantized with the same offs (axis "col" or "both": their grouped columnwise
    copies are used; ``q.col()`` views are taken as they are) or float32/bf16 arrays: out
    [G, N, K] float32 with out[g] = dY[rows_g]^T . X[rows_g]. Scalings without blocks along the
    tokens (tensor, row, block128x128, block32x32) need no offs in the QTensors.
    """
    fn = "lowp.grouped_gemm"
    o, to = A.int32_input(offs, fn, "offs")
    G = len(o)
    if G < 1:
        raise ValueError(f"{fn}: offs must hold at least one group")
    bshape = b.shape if isinstance(b, QTensor) else getattr(b, "shape", None)
    thr = get_threads()
    if bshape is not None and len(bshape) == 3:
        da, sa, ta = _operand(a, fn, "a")
        if len(sa) != 2:
            raise ValueError(f"{fn}: a must be 2-D [M, K], got {tuple(sa)}")
        if bshape[0] != G:
            raise ValueError(f"{fn}: b has {bshape[0]} groups, offs has {G}")
        _check_k(fn, sa[1], bshape[2], "b.shape[2]")
        db0, _, tb = _operand(b, fn, "b", g=None)
        # one expert [N, K]; its data and scales hold the G experts one after the other
        db = _lowp.QDesc(db0.format, db0.scaling, bshape[1], bshape[2], db0.data, db0.scale)
        shape = (sa[0], bshape[1])
        c, ckind, given = _out_arg(out, shape, fn, accumulate, ta or tb or to)
        _lowp.grouped_gemm(da, db, o, c, _gemm_cfg(ckind, accumulate, threads=thr))
        return given if given is not None else A.out_array(c, ta or tb or to)
    da, sa, ta = _wgrad_operand(a, o, fn, "a")
    db, sb, tb = _wgrad_operand(b, o, fn, "b")
    if da.cols != db.cols:
        raise ValueError(f"{fn}: a has {da.cols} tokens (rows), b has {db.cols}")
    shape = (G, da.rows, db.rows)
    c, ckind, given = _out_arg(out, shape, fn, accumulate, ta or tb or to)
    _lowp.grouped_gemm_wgrad(da, db, o, c, _gemm_cfg(ckind, accumulate, threads=thr))
    return given if given is not None else A.out_array(c, ta or tb or to)


def _wgrad_operand(x, o, fn, arg):
    """The token-contracted operand of the split-K GEMM: [features, tokens], grouped."""
    if isinstance(x, QTensor):
        if len(x.shape) != 2:
            raise ValueError(f"{fn}: {arg} must be 2-D, got {x.shape}")
        which = "row" if x._colview else "col"
        if x.offs is None:
            if x.scaling in _GROUPED_KINDS:  # blocks along the tokens: grouped copies
                raise ValueError(f"{fn}: {arg} was not quantized along the tokens with offs")
        elif not np.array_equal(A.int32_input(x.offs, fn, f"{arg}.offs")[0], o):
            raise ValueError(f"{fn}: {arg}.offs differs from offs")
        return x._desc(which, fn, arg), x.shape, x.is_torch
    return _operand(x, fn, arg, which="col")


# ---- the C trainer's checkpoint checks and corpus (used by lowp.torch.trainer) ----


def crc32c(data, crc=0):
    """The CRC-32C of ``data``'s bytes continued from ``crc``, as an int in [0, 2^32).

    CRC-32C is Castagnoli's CRC (reflected polynomial 0x82F63B78, initial value and final XOR
    0xFFFFFFFF; ``crc32c(b"123456789") == 0xE3069283``), the checksum of every tensor and of
    the metadata in the C trainer's checkpoints (src/io/crc32c.c). ``crc``: the CRC-32C of the
    bytes before, so ``crc32c(b, crc32c(a)) == crc32c(a + b)``. ``data``: any C-contiguous
    buffer (bytes, bytearray, memoryview, a numpy array)."""
    if isinstance(crc, bool) or not isinstance(crc, (int, np.integer)):
        raise TypeError(f"crc32c: crc must be an int, got {type(crc).__name__}")
    if not 0 <= crc < 2 ** 32:
        raise ValueError(f"crc32c: crc ({crc}) must be in [0, 2^32)")
    return int(_lowp.crc32c(data, int(crc)))


def checkpoint_verify(data, path="<memory>"):
    """Check the bytes of a lowp checkpoint as the C trainer does before it reads one: the
    safetensors structure, then the CRC-32C of the metadata and of every tensor
    (``crc32c.NAME`` and ``crc32c.__metadata__`` entries of ``__metadata__``). Returns None;
    raises ValueError naming the tensor, the metadata or the malformed part (``path`` names
    the file in the checksum messages). ``data``: any C-contiguous buffer."""
    if not isinstance(path, str):
        raise TypeError(f"checkpoint_verify: path must be a str, got {type(path).__name__}")
    _lowp.checkpoint_verify(data, path)


def default_corpus():
    """The C library's built-in training corpus (what ``lowp train`` trains on without
    ``--data``), as bytes."""
    return bytes(_lowp.default_corpus())
