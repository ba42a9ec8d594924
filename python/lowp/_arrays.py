"""Arrays in and out of the extension: numpy arrays and torch CPU tensors as buffers.

The extension module takes objects with the buffer protocol. A numpy array is passed as is
(bfloat16 arrays of ml_dtypes as their uint16 bits). A torch CPU tensor is passed as a numpy
array over its memory, made from its ``data_ptr()`` through ``__array_interface__`` (zero-copy;
the array's base holds the tensor, so the memory stays alive while the array does). Not through
``Tensor.numpy()``: that marks the tensor's storage non-resizable for good, and FSDP2 frees its
all-gather buffers with ``untyped_storage().resize_(0)``. Outputs for a torch input are
allocated with ``torch.empty`` (``empty``) and handed back as those tensors (``out_array``).

torch is never imported here: a tensor is recognised only when the caller has imported torch.
"""

import sys

import numpy as np

F32 = "f32"
BF16 = "bf16"


class _Memory:
    """The bytes of a contiguous torch tensor, as numpy sees them; keeps the tensor alive."""

    __slots__ = ("bytes", "ptr", "nbytes", "__array_interface__")

    def __init__(self, t):
        self.bytes = t.reshape(-1).view(torch_module().uint8)  # the same memory, as bytes
        self.ptr = t.data_ptr()
        self.nbytes = t.numel() * t.element_size()
        self.__array_interface__ = {"data": (self.ptr, False), "shape": (self.nbytes,),
                                    "typestr": "|u1", "version": 3}


def _alias(t, np_dtype):
    """A numpy array of dtype np_dtype in t's shape over t's memory (t contiguous, on the CPU,
    of np_dtype's item size)."""
    shape = tuple(t.shape)
    if t.numel() == 0:
        return np.empty(shape, np_dtype)
    return np.asarray(_Memory(t)).view(np_dtype).reshape(shape)


def _memory_of(a):
    """The _Memory under numpy array a (None for an array numpy allocated)."""
    while isinstance(a, np.ndarray):
        a = a.base
    return a if isinstance(a, _Memory) else None


def torch_module():
    """The torch module if the program has imported it, else None."""
    return sys.modules.get("torch")


def is_torch(x):
    t = torch_module()
    return t is not None and isinstance(x, t.Tensor)


def is_bf16_dtype(dtype):
    return dtype.name == "bfloat16"  # ml_dtypes.bfloat16, without importing ml_dtypes


_NP_DTYPES = None


def _np_dtypes():
    """torch dtype -> the numpy dtype its memory is read as (bfloat16 and float8 as bits)."""
    global _NP_DTYPES
    if _NP_DTYPES is not None:
        return _NP_DTYPES
    t = torch_module()
    table = {t.float32: np.float32, t.float64: np.float64, t.float16: np.float16,
             t.int8: np.int8, t.uint8: np.uint8, t.int16: np.int16, t.int32: np.int32,
             t.int64: np.int64, t.bool: np.bool_, t.bfloat16: np.uint16,
             t.float8_e4m3fn: np.uint8, t.float8_e5m2: np.uint8, t.uint16: np.uint16,
             t.uint32: np.uint32, t.uint64: np.uint64}
    if getattr(t, "float8_e8m0fnu", None) is not None:
        table[t.float8_e8m0fnu] = np.uint8
    _NP_DTYPES = table
    return table


def _torch_to_numpy(x, fn, arg):
    t = torch_module()
    if x.device.type != "cpu":
        raise ValueError(
            f"{fn}: {arg} is on device {x.device}; lowp's native kernels take CPU tensors "
            "(lowp.torch runs the portable path on other devices)")
    if not x.is_contiguous():
        raise ValueError(f"{fn}: {arg} must be contiguous (got strides {tuple(x.stride())})")
    nd = _np_dtypes().get(x.dtype)
    if nd is None:
        raise TypeError(f"{fn}: {arg} has dtype {x.dtype}, which lowp does not read")
    if x.is_neg() or x.is_conj():  # the memory of a negative view holds the values unnegated
        x = x.resolve_neg().resolve_conj()
    a = _alias(x.detach(), nd)
    if x.dtype == t.bfloat16:
        return a, BF16
    return a, (F32 if x.dtype == t.float32 else None)


def to_numpy(x, fn, arg):
    """(numpy view of x, "f32" | "bf16" | None, was_torch). Raises TypeError for anything that
    is not a numpy array or a torch tensor, ValueError for a non-contiguous or non-CPU one."""
    if is_torch(x):
        a, kind = _torch_to_numpy(x, fn, arg)
        return a, kind, True
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{fn}: {arg} must be a numpy array or a torch CPU tensor, "
                        f"got {type(x).__name__}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{fn}: {arg} must be C-contiguous")
    if is_bf16_dtype(x.dtype):
        return x.view(np.uint16), BF16, False
    return x, (F32 if x.dtype == np.float32 else None), False


def float_input(x, fn, arg):
    """A float32 or bfloat16 input: (numpy view, "f32" | "bf16", was_torch)."""
    a, kind, tor = to_numpy(x, fn, arg)
    if kind is None:
        raise TypeError(f"{fn}: {arg} must be float32 or bfloat16, got {x.dtype}")
    return a, kind, tor


def int32_input(x, fn, arg):
    """A 1-D int32 array (numpy, torch or a sequence of ints): (numpy int32 array, was_torch)."""
    if isinstance(x, (list, tuple)):
        a = np.asarray(x, dtype=np.int64)
        if a.ndim != 1 or (a.size and (a.min() < -2**31 or a.max() >= 2**31)):
            raise ValueError(f"{fn}: {arg} must be a 1-D sequence of int32 values")
        return np.ascontiguousarray(a, dtype=np.int32), False
    a, _, tor = to_numpy(x, fn, arg)
    if a.dtype != np.int32:
        raise TypeError(f"{fn}: {arg} must be int32, got {x.dtype}")
    if a.ndim != 1:
        raise ValueError(f"{fn}: {arg} must be 1-D, got shape {tuple(a.shape)}")
    return a, tor


def _torch_dtype(np_dtype):
    t = torch_module()
    return {np.float32: t.float32, np.float64: t.float64, np.float16: t.float16,
            np.int8: t.int8, np.uint8: t.uint8, np.int16: t.int16, np.int32: t.int32,
            np.int64: t.int64, np.bool_: t.bool, np.uint16: t.uint16, np.uint32: t.uint32,
            np.uint64: t.uint64}[np.dtype(np_dtype).type]


def empty(shape, np_dtype, as_torch, zero=False):
    """An output array: numpy, or (as_torch) a numpy view of a new torch.empty tensor, which
    out_array hands back."""
    if not as_torch:
        return (np.zeros if zero else np.empty)(shape, np_dtype)
    t = torch_module()
    n = int(np.prod(shape, dtype=np.int64)) * np.dtype(np_dtype).itemsize
    mem = (t.zeros if zero else t.empty)(n, dtype=t.uint8)
    return _alias(mem, np.uint8).view(np_dtype).reshape(shape)


def _as_tensor(a):
    """The torch tensor over numpy array a's memory: the torch tensor under it when a lies in
    one (a view of an input or of an ``empty`` output), else a numpy-owned one."""
    t = torch_module()
    dt = _torch_dtype(a.dtype)
    if a.size == 0:
        return t.empty(a.shape, dtype=dt)
    mem = _memory_of(a)
    if mem is not None and a.flags.c_contiguous:
        off = a.ctypes.data - mem.ptr
        if 0 <= off and off + a.nbytes <= mem.nbytes:
            return mem.bytes[off:off + a.nbytes].view(dt).view(a.shape)
    if a.dtype == np.uint16:
        return t.from_numpy(a.view(np.int16)).view(t.uint16)
    return t.from_numpy(a)


def out_array(a, as_torch):
    """Hand a numpy result back as torch (sharing memory) when the input was torch."""
    if not as_torch:
        return a
    return _as_tensor(a)


def out_bf16(a_u16, as_torch):
    """uint16 bfloat16 bits -> torch.bfloat16 tensor, or an ml_dtypes.bfloat16 array when
    ml_dtypes is available (else the uint16 bits)."""
    if as_torch:
        return _as_tensor(a_u16).view(torch_module().bfloat16)
    try:
        import ml_dtypes
    except ImportError:
        return a_u16
    return a_u16.view(ml_dtypes.bfloat16)
