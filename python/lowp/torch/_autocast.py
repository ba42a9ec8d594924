"""The autocast rule of lowp's torch ops, in one place.

Every lowp op that computes outside a GEMM (the output dtype of ``lowp.torch.linear`` / ``mm`` /
``grouped_mm`` and of the param swap's routes, a bias add, RMSNorm) takes its dtype from the
autocast state of the tensor's own device type, ``torch.is_autocast_enabled(x.device.type)`` and
``torch.get_autocast_dtype(x.device.type)``, never from a hard-coded device type:

* autocast enabled for that device type and the tensor float32, bfloat16 or float16: the
  autocast dtype (as torch's autocast casts F.linear's operands, so F.linear returns it);
* otherwise (autocast off, a device type autocast does not know, a float64 tensor, which torch's
  autocast never casts either): the tensor's own dtype.

The GEMMs themselves keep the recipe's precision (quantized operands, or BF16 for unquantized
ones, with binary32 accumulation): autocast decides what dtype comes out, not how the kernel
multiplies. ``exact(device_type)`` turns autocast off around the portable path's own matmuls so
that they stay binary32 (under autocast torch would run them in the autocast dtype).
"""

import contextlib

import torch

_ELIGIBLE = (torch.float32, torch.bfloat16, torch.float16)


def _enabled(device_type) -> bool:
    return torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type)


def autocast_dtype(device_type, default):
    """The dtype an op outside a GEMM returns on ``device_type`` for an input of dtype
    ``default``: the autocast dtype when autocast is enabled for that device type (and
    ``default`` is float32, bfloat16 or float16), else ``default``."""
    if default in _ELIGIBLE and _enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return default


def out_dtype(x: torch.Tensor):
    """``autocast_dtype(x.device.type, x.dtype)``."""
    return autocast_dtype(x.device.type, x.dtype)


@contextlib.contextmanager
def exact(device_type):
    """Autocast off for ``device_type`` inside (nothing to do when it is off already)."""
    if not _enabled(device_type):
        yield
        return
    with torch.autocast(device_type, enabled=False):
        yield
