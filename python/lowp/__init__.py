"""lowp: low-precision training numerics (FP8, MXFP8, MXFP4, Block FP8, NVFP4) from Python.

The kernels are lowp's C library (liblowp), reached through the extension module
``lowp._lowp``; this package is the numpy API over it. Every function takes C-contiguous
float32 or bfloat16 inputs, as numpy arrays (``ml_dtypes.bfloat16`` for bfloat16) or torch
CPU tensors, and answers numpy for numpy and torch for torch, sharing memory (no copies)::

    import numpy as np, lowp
    x = np.random.randn(64, 128).astype(np.float32)
    q = lowp.quantize(x, "e4m3", "mx32", axis="both")   # MXFP8, rowwise + columnwise copies
    q.data, q.scale            # uint8 [64, 128] E4M3 codes, uint8 [64, 4] E8M0 scales
    y = lowp.dequantize(q)     # float32 [64, 128]
    n = lowp.quantize(x, "e2m1", "nv16")   # NVFP4: n.data uint8 [64, 64] (two codes a byte),
    n.scale, n.tensor_scale    # uint8 [64, 8] E4M3 block codes, float32 [1] decode scale D
    c = lowp.gemm(q, lowp.quantize(w, "e4m3", "mx32"))   # float32 C = A . B^T

The numerics are those of ``lowp quantize``/``lowp cast`` and docs/numerics.md: the same bytes as
the C library, which the tests compare with torchao's reference code. Bad input raises
TypeError (wrong type or dtype) or ValueError (shape, layout, option), with a message naming
the argument; the C library's own message is passed through. The GIL is released while a
kernel runs. The package needs only numpy; ``lowp.torch`` holds the torch operators.

This ``__init__`` only re-exports: the numpy API is defined in ``lowp._numpy_api``, the
private test wrappers in ``lowp._testing``.
"""

from . import _arrays, _testing  # noqa: F401  (lowp._arrays, lowp._testing)
from ._numpy_api import (FORMATS, SCALE_MODES, SCALINGS, QTensor, __all__, __version__, _lowp,
                         cached_bytes, cast, decode, dequantize, empty_cache, gemm, gemm_kn,
                         get_threads, grouped_gemm, info, quantize, set_threads)
from ._numpy_api import checkpoint_verify, crc32c, default_corpus  # lowp.torch.trainer's

QTensor.__module__ = __name__  # lowp.QTensor, as before the API moved to its own module
