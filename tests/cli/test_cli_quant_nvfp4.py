"""`lowp quantize` and `lowp dequantize` for NVFP4 (--scaling nv16 / nv16x16, --format e2m1 or
its alias nvfp4) against the independent ml_dtypes/numpy reference of tests/oracle/nvfp4_ref.py
(docs/numerics.md section 4b): the packed E2M1 codes, the uint8 E4M3 block scale codes and the
float32 tensor decode scale each axis writes, the round trip back to float32, and bad usage
(exit status 2, one line on stderr).

Run by ctest with LOWP_CLI (the lowp binary) set. Prints "N passed, M failed".
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle"))
import nvfp4_ref as N  # noqa: E402
import quant_ref as Q  # noqa: E402

CLI = os.environ.get("LOWP_CLI")
if not CLI:
    sys.exit("LOWP_CLI is not set (path of the lowp binary); run through ctest")

rep = Q.Report()
rng = np.random.default_rng(3838)
tmp = tempfile.mkdtemp(prefix="lowp_cli_nvfp4_")


def run(*args):
    p = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def check_axis(tag, out, suffix, xv, tiles):
    """The files of one copy against the reference's quantization of xv (along its rows)."""
    want_c, want_s, want_g = N.quantize(xv, tiles)
    data = np.load(out + suffix + ".data.npy")
    scales = np.load(out + suffix + ".scale.npy")
    g = np.load(out + suffix + ".tensor_scale.npy")
    rep.check(f"{tag}: dtypes and shapes", data.dtype == np.uint8 and scales.dtype == np.uint8
              and g.dtype == np.float32 and g.shape == (1,)
              and data.shape == (xv.shape[0], (xv.shape[1] + 1) // 2),
              [f"{data.dtype} {data.shape}, {scales.dtype} {scales.shape}, {g.dtype} {g.shape}"])
    rep.arrays_equal(f"{tag}: codes", N.unpack(data, xv.shape[1]), want_c)
    rep.arrays_equal(f"{tag}: pad nibbles", data, N.pack(want_c))
    rep.arrays_equal(f"{tag}: block scales", scales, want_s)
    rep.arrays_equal(f"{tag}: tensor scale", g, np.array([want_g], np.float32))
    return N.dequantize(want_c, want_s, want_g, tiles)


def test_tensor(name, x):
    for scaling in ("nv16", "nv16x16"):
        tiles = scaling == "nv16x16"
        for fmt in ("e2m1", "nvfp4"):
            out = os.path.join(tmp, f"{name}_{scaling}_{fmt}")
            xin = os.path.join(tmp, name + ".npy")
            np.save(xin, x)
            tag = f"{name} {scaling} --format {fmt}"
            rc, _, err = run("quantize", "--format", fmt, "--scaling", scaling, "--axis", "both",
                             xin, out)
            rep.check(f"{tag}: exit 0", rc == 0, [err])
            if rc != 0:
                continue
            meta = json.load(open(out + ".json"))
            rep.check(f"{tag}: metadata", meta["scaling"] == scaling and meta["format"] == "e2m1"
                      and meta["scale_dtype"] == "uint8", [str(meta)])
            want_row = check_axis(tag + " row", out, "", x, tiles)
            want_col = check_axis(tag + " col", out, ".col", x.T, tiles)
            for axis, want in (("row", want_row), ("col", want_col.T)):
                dq = out + f".{axis}.dq.npy"
                rc, _, err = run("dequantize", "--axis", axis, out, dq)
                rep.check(f"{tag}: dequantize --axis {axis} exit 0", rc == 0, [err])
                if rc == 0:
                    rep.arrays_equal(f"{tag}: dequantize {axis}", np.load(dq), want)


def test_alias_default():
    """--format nvfp4 alone is nv16; the rowwise copy only by default."""
    x = rng.standard_normal((3, 17)).astype(np.float32)
    xin, out = os.path.join(tmp, "alias.npy"), os.path.join(tmp, "alias")
    np.save(xin, x)
    rc, _, err = run("quantize", "--format", "nvfp4", xin, out)
    rep.check("--format nvfp4 alone: exit 0", rc == 0, [err])
    if rc == 0:
        rep.check("--format nvfp4 alone: nv16", json.load(open(out + ".json"))["scaling"] == "nv16")
        check_axis("--format nvfp4 alone", out, "", x, False)
        rep.check("--format nvfp4 alone: no columnwise copy",
                  not os.path.exists(out + ".col.data.npy"))


def expect_error(name, args, needle):
    rc, out, err = run(*args)
    rep.check(f"{name}: exit 2, one line naming {needle}",
              rc == 2 and out == "" and err.count("\n") == 1 and needle in err, [f"rc {rc}", err])


def test_bad_usage():
    x = rng.standard_normal((4, 16)).astype(np.float32)
    xin, out = os.path.join(tmp, "bad.npy"), os.path.join(tmp, "bad")
    np.save(xin, x)
    expect_error("nv16 with e4m3", ["quantize", "--format", "e4m3", "--scaling", "nv16", xin, out],
                 "e2m1")
    expect_error("nvfp4 with mx32", ["quantize", "--format", "nvfp4", "--scaling", "mx32", xin,
                                     out], "nv16")
    expect_error("nv16 with --pow2", ["quantize", "--format", "e2m1", "--scaling", "nv16",
                                      "--pow2", xin, out], "--pow2")
    expect_error("nv16x16 with --scale-mode", ["quantize", "--format", "e2m1", "--scaling",
                                               "nv16x16", "--scale-mode", "floor", xin, out],
                 "--scale-mode")
    # a tensor scale that is not the one the metadata describes
    rc, _, err = run("quantize", "--format", "nvfp4", xin, out)
    rep.check("bad: quantize exit 0", rc == 0, [err])
    np.save(out + ".tensor_scale.npy", np.array([0.5], np.float32))
    expect_error("dequantize with another tensor scale", ["dequantize", out, out + ".dq.npy"],
                 "tensor_scale")


def test_bench_fp4():
    """`lowp bench quant --fp4 --clock cpu`: the E2M1 kernels on one thread; nvfp4_row reads the
    input and writes the packed codes, the block scales padded to 4 bytes and the tensor scale."""
    R, C = 67, 96
    rc, so, se = run("bench", "quant", "--fp4", "--clock", "cpu", "--rows", R, "--cols", C,
                     "--reps", 1, "--json")
    rows = [json.loads(ln) for ln in so.splitlines() if ln.strip()]
    by = {(r["kernel"], r["threads"]): r for r in rows}
    want = {"memcpy", "nvfp4_row", "nvfp4_dual", "nvfp4_16x16", "mxfp4_row", "mxfp4_dual"}
    rep.check("bench quant --fp4 --clock cpu: exit 0, every E2M1 kernel on 1 thread",
              rc == 0 and set(by) == {(k, 1) for k in want}, [se.strip()[-200:], str(sorted(by))])
    nb = R * ((C + 15) // 16)
    want_bytes = 2 * R * C + R * ((C + 1) // 2) + (nb + 3) // 4 * 4 + 4
    got = by.get(("nvfp4_row", 1), {}).get("bytes")
    rep.check("bench quant --fp4: nvfp4_row's bytes", got == want_bytes, [f"{got} != {want_bytes}"])


def main():
    try:
        x = (rng.standard_normal((37, 70)) * 10.0 ** rng.uniform(-3, 3, (37, 1))).astype(np.float32)
        x[5, 3:19] = 0.0
        x[6, 0] = -0.0
        x[7, :16] = np.float32(1e-40)  # binary32 subnormals
        test_tensor("random37x70", x)
        for shape in ((1, 1), (1, 15), (16, 16), (17, 33), (33, 65)):
            test_tensor(f"gaussian{shape[0]}x{shape[1]}",
                        rng.standard_normal(shape).astype(np.float32))
        y = rng.standard_normal((20, 40)).astype(np.float32)
        y[3, 7], y[12, 30] = np.inf, np.nan  # NaN/Inf blocks, tensor scale forced to 1
        test_tensor("special", y)
        test_alias_default()
        test_bad_usage()
        test_bench_fp4()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rep.finish()


if __name__ == "__main__":
    main()
