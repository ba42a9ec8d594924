"""`python -m lowp.bench gemm` (python/lowp/_bench_gemm.py), issue 42:

- fold_bf16, the fold route's decode of an E4M3 copy with its E8M0 scales into BF16, against an
  independent numpy reference (ml_dtypes' E4M3 decode times 2^(s - 127) in binary64, rounded to
  BF16), bit for bit: mx32 and block32x32 scales, a width that is not a multiple of 32, a row
  count that is not a multiple of 32, scale codes over the range where every product is normal;
- the fold route's GEMMs give lowp's kernels' products, orientation included (forward, input
  gradient, weight gradient), up to the summation order;
- a bad --shape or --configs is refused naming the option;
- a small run prints one row per GEMM and implementation (no speed is checked).
"""

import contextlib
import io

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
lowp = pytest.importorskip("lowp")
from lowp import _bench_gemm as B  # noqa: E402


def _reference(codes, scales, tile_rows):
    """codes [R, C] uint8, scales E8M0 per 1 x 32 (tile_rows 1) or 32 x 32 block."""
    v = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    R, C = codes.shape
    rows = np.arange(R)[:, None] // tile_rows
    cols = np.arange(C)[None, :] // 32
    v = v * np.exp2(scales[rows, cols].astype(np.float64) - 127.0)
    return v.astype(ml_dtypes.bfloat16).view(np.uint16)


@pytest.mark.parametrize("scaling,R,C", [("mx32", 7, 96), ("mx32", 5, 45),
                                         ("block32x32", 70, 64), ("block32x32", 33, 50)])
def test_fold_matches_reference(scaling, R, C):
    rng = np.random.default_rng(R * 1000 + C)
    codes = rng.integers(0, 256, size=(R, C), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x3C  # no NaN codes
    tile = 32 if scaling == "block32x32" else 1
    # E8M0 codes 10..240: the smallest E4M3 magnitude (2^-9) times 2^(10 - 127) is normal.
    scales = rng.integers(10, 241, size=(-(-R // tile), -(-C // 32)), dtype=np.uint8)
    scales.flat[0], scales.flat[-1] = 10, 240
    q = lowp.QTensor(torch.from_numpy(codes), torch.from_numpy(scales), "e4m3", scaling, (R, C))
    got = B.fold_bf16(lowp, torch, q).contiguous().view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(got, _reference(codes, scales, tile))


@pytest.mark.parametrize("args,name", [(["--shape", "4x0x8"], "--shape"),
                                       (["--shape", "4x8"], "--shape"),
                                       (["--configs", "mxfp8,fp9"], "--configs")])
def test_bad_options_name_the_option(args, name, capsys):
    with pytest.raises(SystemExit) as e:
        B.bench_gemm(args + ["--reps", "1"])
    assert e.value.code == 2
    assert name in capsys.readouterr().err


@pytest.mark.parametrize("cfg", ["mxfp8", "block32x32"])
def test_fold_route_computes_lowps_products(cfg):
    """The fold route and lowp's kernel multiply the same quantized operands in each GEMM's
    orientation: their BF16 outputs differ only by the summation order (a rounding or two)."""
    torch.manual_seed(0)
    impls = B._impls(torch, lowp, [cfg], 96, 160, 128)
    for gm in ("fwd", "dgrad", "wgrad"):
        want = impls[(gm, f"lowp {cfg}")]().float()
        got = impls[(gm, f"fold {cfg} + torch.mm")]().float()
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=2 ** -7, atol=1e-3 * want.abs().max().item())


def test_small_run_has_every_row():
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        B.bench_gemm(["--shape", "64x96x128", "--reps", "1"])
    rows = [line.split("|")[2:4] for line in buf.getvalue().splitlines()
            if line.startswith("| 64x96x128 ")]
    got = {(g.strip(), n.strip()) for g, n in rows}
    impls = ["torch.mm bf16", "lowp bf16", "lowp mxfp8", "lowp block32x32", "lowp block128",
             "fold mxfp8 + torch.mm", "fold block32x32 + torch.mm", "(fold mxfp8 alone)",
             "(fold block32x32 alone)"]
    assert got == {(g, n) for g in ("fwd", "dgrad", "wgrad") for n in impls}
    assert len(rows) == len(got)
