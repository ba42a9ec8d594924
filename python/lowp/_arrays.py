"""Arrays in and out of the extension: numpy arrays and torch CPU tensors as buffers.

The extension module takes objects with the buffer protocol. A numpy array is passed as is
(bfloat16 arrays of ml_dtypes as their uint16 bits); a torch CPU tensor is viewed as a numpy
array with ``Tensor.numpy()``, which shares its memory. Outputs are allocated as numpy arrays
and handed back as torch tensors (``torch.from_numpy``, no copy) when an input was torch.

torch is never imported here: a tensor is recognised only when the caller has imported torch.
"""

import sys

import numpy as np

F32 = "f32"
BF16 = "bf16"


def torch_module():
    """The torch module if the program has imported it, else None."""
    return sys.modules.get("torch")


def is_torch(x):
    t = torch_module()
    return t is not None and isinstance(x, t.Tensor)


def is_bf16_dtype(dtype):
    return dtype.name == "bfloat16"  # ml_dtypes.bfloat16, without importing ml_dtypes


def _torch_to_numpy(x, fn, arg):
    t = torch_module()
    if x.device.type != "cpu":
        raise ValueError(
            f"{fn}: {arg} is on device {x.device}; lowp's native kernels take CPU tensors "
            "(lowp.torch runs the portable path on other devices)")
    if not x.is_contiguous():
        raise ValueError(f"{fn}: {arg} must be contiguous (got strides {tuple(x.stride())})")
    x = x.detach()
    if x.dtype == t.bfloat16:
        return x.view(t.int16).numpy().view(np.uint16), BF16
    if x.dtype in (t.float8_e4m3fn, t.float8_e5m2) or getattr(t, "float8_e8m0fnu", None) == x.dtype:
        return x.view(t.uint8).numpy(), None
    if getattr(t, "uint16", None) is not None and x.dtype == t.uint16:
        return x.view(t.int16).numpy().view(np.uint16), None
    return x.numpy(), (F32 if x.dtype == t.float32 else None)


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


def out_array(a, as_torch):
    """Hand a numpy result back as torch (sharing memory) when the input was torch."""
    if not as_torch:
        return a
    t = torch_module()
    if a.dtype == np.uint16:
        return t.from_numpy(a.view(np.int16)).view(t.uint16)
    return t.from_numpy(a)


def out_bf16(a_u16, as_torch):
    """uint16 bfloat16 bits -> torch.bfloat16 tensor, or an ml_dtypes.bfloat16 array when
    ml_dtypes is available (else the uint16 bits)."""
    if as_torch:
        t = torch_module()
        return t.from_numpy(a_u16.view(np.int16)).view(t.bfloat16)
    try:
        import ml_dtypes
    except ImportError:
        return a_u16
    return a_u16.view(ml_dtypes.bfloat16)
