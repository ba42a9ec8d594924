"""The private wrappers of lowp._testing that the torch package's tests build on: the
delayed-scaling update (against NUMERICS.md section 5 written out in numpy), the extra-state
blob (against the committed spec-only fixture and a struct.pack writer), and train_linear (the
C training layer's linear, against float64 references at NUMERICS.md section 8's thresholds).
numpy only (also run under ASan)."""

import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

import lowp
from lowp import _testing as T
from np_ref import sqnr

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "extra_state_v1.bin"
FMAX = {"e4m3": 448.0, "e5m2": 57344.0}


def ref_update(hist, scale, fmax, margin, algo):
    """NUMERICS.md section 5, steps 1-4, in float32 numpy."""
    hist = hist.copy()
    amax = hist.max() if algo == "max" else hist[0]
    scaled_max = np.float32(fmax * 2.0**-margin)
    if np.isfinite(amax) and amax > 0:
        s = scaled_max / np.float32(amax)
        scale = np.float32(np.finfo(np.float32).max) if np.isinf(s) else np.float32(s)
    if hist[0] != 0:
        hist = np.roll(hist, -1)
        hist[0] = 0
    return hist, np.float32(scale), np.float32(1) / np.float32(scale)


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("margin", [0.0, 1.0])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_delayed_update_follows_numerics_5(fmt, margin, algo):
    rng = np.random.default_rng(1)
    hist = np.zeros(16, np.float32)
    scale = np.float32(1.0)
    mirror, mscale = hist.copy(), scale
    for step in range(40):
        amax = 0.0 if step % 7 == 3 else float(rng.random() * 2.0**rng.integers(-10, 10))
        T.delayed_record(hist, amax, fmt)
        mirror[0] = max(mirror[0], np.float32(amax))
        assert np.array_equal(hist, mirror)
        scale, sinv = T.delayed_update(hist, scale, fmt, margin, algo)
        mirror, mscale, msinv = ref_update(mirror, mscale, FMAX[fmt], margin, algo)
        assert np.array_equal(hist, mirror)
        assert np.float32(scale) == mscale and np.float32(sinv) == msinv
    # NaN sticks in the staging row; the scale is then kept
    T.delayed_record(hist, float("nan"), fmt)
    assert np.isnan(hist[0])
    assert np.float32(T.delayed_update(hist.copy(), scale, fmt, margin, "most_recent")[0]) == \
        np.float32(scale)


def spec_blob(L, margin, algo, formats, histories, scales):
    """The version-1 blob of include/lowp/checkpoint.h, from the spec."""
    codes = {"e4m3": 3, "e5m2": 4}
    body = struct.pack("<IIfI", 3, L, margin, 0 if algo == "max" else 1)
    body += struct.pack("<3I", *[codes[f] for f in formats])
    for r in range(3):
        body += struct.pack(f"<{L}f", *histories[r]) + struct.pack("<f", scales[r])
    data = b"LOWPXST1" + struct.pack("<II", 1, len(body)) + body
    return data + struct.pack("<I", zlib.crc32(data) & 0xFFFFFFFF)


def test_extra_state_pack_equals_the_spec_and_the_fixture():
    h = np.array([[0.0, 1.0, 4.0, 2.0], [0.0, 0.25, 0.5, 0.375],
                  [0.125, 0.0078125, 0.015625, 0.01171875]], np.float32)
    s = np.array([448.0 / 4, 448.0 / 0.5, 57344.0 / 0.015625], np.float32)
    blob = T.extra_state_pack(h, s)
    assert blob == FIXTURE.read_bytes()
    assert blob == spec_blob(4, 0.0, "max", ("e4m3", "e4m3", "e5m2"), h, s)
    h2, s2 = T.extra_state_unpack(blob, 4)
    assert np.array_equal(h2, h) and np.array_equal(s2, s)


def test_extra_state_unpack_other_length_and_corruption():
    rng = np.random.default_rng(2)
    h = rng.random((3, 8), dtype=np.float32)
    s = np.array([2.0, 4.0, 8.0], np.float32)
    blob = T.extra_state_pack(h, s, margin=1.0, algo="most_recent")
    assert blob == spec_blob(8, 1.0, "most_recent", ("e4m3", "e4m3", "e5m2"), h, s)
    # a shorter history keeps row 0 and the most recent rows that fit
    h3, s3 = T.extra_state_unpack(blob, 3, margin=1.0, algo="most_recent")
    assert np.array_equal(h3[:, 0], h[:, 0]) and np.array_equal(s3, s)
    bad = bytearray(blob)
    bad[30] ^= 1
    with pytest.raises(ValueError, match="CRC|crc"):
        T.extra_state_unpack(bytes(bad), 8)
    with pytest.raises(ValueError):
        T.extra_state_unpack(blob[:20], 8)
    with pytest.raises(ValueError, match=r"formats\[2\]|format"):
        T.extra_state_unpack(blob, 8, formats=("e4m3", "e4m3", "e4m3"), margin=1.0,
                             algo="most_recent")


THRESH = {"mxfp8": (27, 25, 24), "fp8_rowwise": (25, 24, 23), "block128": (25, 28, 28),
          "block_fp8": (17, 17, 17), "block_fp8_fp4": (12, 12, 12), "fp8_current": (20, 20, 20),
          "bf16": (40, 40, 40)}


@pytest.mark.parametrize("preset", list(THRESH))
def test_train_linear_against_float64(preset):
    rng = np.random.default_rng(3)
    M, K, N = 256, 256, 128
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = (rng.standard_normal((N, K)) * 0.05).astype(np.float32)
    dy = rng.standard_normal((M, N)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    y, dx, dw, db = T.train_linear(preset, x, w, dy, bias=b)
    x64, w64, dy64 = x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64)
    t = THRESH[preset]
    assert sqnr(x64 @ w64.T + b, y) > t[0]
    assert sqnr(dy64 @ w64, dx) > t[1]
    assert sqnr(dy64.T @ x64, dw) > t[2]
    assert np.allclose(db, dy64.sum(0), rtol=1e-5, atol=1e-4)
    # the same inputs give the same bytes again (no state leaks between calls)
    y2, dx2, dw2, _ = T.train_linear(preset, x, w, dy, bias=b)
    assert np.array_equal(y, y2) and np.array_equal(dx, dx2) and np.array_equal(dw, dw2)


def test_train_linear_mxfp8_forward_is_the_gemm_of_quantized_operands():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((64, 96)).astype(np.float32)
    w = rng.standard_normal((32, 96)).astype(np.float32)
    dy = rng.standard_normal((64, 32)).astype(np.float32)
    y, _, _, db = T.train_linear("mxfp8", x, w, dy)
    assert db is None
    c = lowp.gemm(lowp.quantize(x, "e4m3", "mx32"), lowp.quantize(w, "e4m3", "mx32"))
    assert np.abs(y - c).max() <= 1e-5 * np.abs(c).max()


@pytest.mark.parametrize("preset", ["mxfp8", "block_fp8", "block128"])
def test_train_linear_grouped(preset):
    rng = np.random.default_rng(6)
    sizes = [0, 1, 70, 33, 0, 24]
    offs = np.cumsum(sizes).astype(np.int32)
    G, N, K, M = len(sizes), 64, 128, int(offs[-1])
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = (rng.standard_normal((G, N, K)) * 0.05).astype(np.float32)
    dy = rng.standard_normal((M, N)).astype(np.float32)
    y, dx, dw, _ = T.train_linear(preset, x, w, dy, offs=offs)
    assert y.shape == (M, N) and dw.shape == (G, N, K)
    ry, rdx, rdw = np.zeros((M, N)), np.zeros((M, K)), np.zeros((G, N, K))
    s = 0
    for g, e in enumerate(offs):
        w64 = w[g].astype(np.float64)
        ry[s:e] = x[s:e] @ w64.T
        rdx[s:e] = dy[s:e] @ w64
        rdw[g] = dy[s:e].astype(np.float64).T @ x[s:e]
        s = e
    t = {"mxfp8": 24, "block_fp8": 17, "block128": 25}[preset]
    assert sqnr(ry, y) > t and sqnr(rdx, dx) > t and sqnr(rdw, dw) > t
    assert np.all(dw[0] == 0) and np.all(dw[4] == 0)


def test_train_linear_bad_input():
    x = np.zeros((4, 32), np.float32)
    with pytest.raises(ValueError, match="shapes"):
        T.train_linear("mxfp8", x, np.zeros((8, 16), np.float32), np.zeros((4, 8), np.float32))
    with pytest.raises(ValueError, match="preset|recipe|name"):
        T.train_linear("nope", x, np.zeros((8, 32), np.float32), np.zeros((4, 8), np.float32))
    with pytest.raises(TypeError, match="x must be float32"):
        T.train_linear("mxfp8", x.astype(np.float64), np.zeros((8, 32), np.float32),
                       np.zeros((4, 8), np.float32))
    with pytest.raises(ValueError, match="offs"):
        T.train_linear("mxfp8", x, np.zeros((2, 8, 32), np.float32), np.zeros((4, 8), np.float32))
