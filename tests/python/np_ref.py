"""Shared helpers of the numpy-API tests: an independent numpy decoder of lowp's
quantized tensors (element codes through ml_dtypes, scales from their definition in
include/lowp/quant.h), the `lowp` command, and the sanitizer switch (smaller sizes)."""

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

SANITIZE = os.environ.get("LOWP_SANITIZE") == "1"
ROOT = Path(__file__).resolve().parents[2]


def lowp_cli():
    p = os.environ.get("LOWP_CLI") or shutil.which("lowp") or str(ROOT / "build" / "bin" / "lowp")
    return p if Path(p).exists() else None


@pytest.fixture
def cli(tmp_path):
    exe = lowp_cli()
    if exe is None:
        pytest.skip("the lowp command is not built")

    def run(*args):
        r = subprocess.run([exe, *map(str, args)], capture_output=True, text=True, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        return r
    run.dir = tmp_path
    return run


def decode_elements(codes, fmt, cols):
    """float64 values of element codes (uint8 [..., C] or packed e2m1 [..., ceil(C/2)])."""
    import ml_dtypes
    codes = np.asarray(codes)
    if fmt == "e2m1":
        lo, hi = codes & 0xF, codes >> 4
        un = np.stack([lo, hi], axis=-1).reshape(*codes.shape[:-1], -1)[..., :cols]
        return un.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    dt = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}[fmt]
    return codes.view(dt).astype(np.float64)


def scale_grid(q_scale, scaling, rows, cols):
    """The per-element float64 scale_inv of a [rows, cols] copy from its canonical scales."""
    s = np.asarray(q_scale)
    if s.dtype == np.uint8:  # E8M0
        v = np.where(s == 0xFF, np.nan, np.ldexp(1.0, s.astype(np.int64) - 127))
    else:
        v = s.astype(np.float64)
    br, bc = {"tensor": (rows, cols), "row": (1, cols), "mx32": (1, 32), "block128": (1, 128),
              "block128x128": (128, 128), "block32x32": (32, 32)}[scaling]
    br, bc = max(br, 1), max(bc, 1)
    return np.repeat(np.repeat(v, br, axis=0), bc, axis=1)[:rows, :cols]


def ref_dequantize(data, scale, fmt, scaling, rows, cols):
    """Independent float64 dequantization of one copy [rows, cols]."""
    return decode_elements(data, fmt, cols) * scale_grid(scale, scaling, rows, cols)


def sqnr(ref, x):
    ref, x = np.asarray(ref, np.float64), np.asarray(x, np.float64)
    e = np.linalg.norm(ref - x)
    return np.inf if e == 0 else 20 * np.log10(np.linalg.norm(ref) / e)
