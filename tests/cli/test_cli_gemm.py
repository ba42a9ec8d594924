"""`lowp gemm` (env LOWP_CLI) against a float64 product of the dequantized operands, issue 10
item 13: every operand pair lowp_gemm multiplies (none x none in f32 and bf16; tensor and row
in every e4m3/e5m2 combination; mx32 with e4m3, e5m2 and e2m1 and every scale mode; block128 x
block128x128; block128 x block128; mx32 x block32x32), on awkward sizes (K not a multiple of 32
or 128), and the grouped split-M form with --offs (an empty group, rows past the last offset
zero). The operands are dequantized by the independent reference of tests/oracle/quant_ref.py; the
result must agree to a relative error of 1e-5 of ||C|| (binary32 accumulation). Bad inputs: exit
2 and one line on stderr. Prints "N passed, M failed".
"""

import json
import os
import re
import subprocess
import sys
import tempfile

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle"))
import quant_ref as Q  # noqa: E402

CLI = os.environ.get("LOWP_CLI")
if not CLI:
    sys.exit("LOWP_CLI is not set (path of the lowp binary); run through ctest")

rep = Q.Report()
rng = np.random.default_rng(9001)
tmp = tempfile.TemporaryDirectory(prefix="lowp_cli_gemm_")
FMT = {"e4m3": Q.E4M3, "e5m2": Q.E5M2, "e2m1": Q.E2M1}
KIND = {"tensor": Q.TENSOR, "row": Q.ROW, "mx32": Q.MX32, "block128": Q.BLOCK128,
        "block128x128": Q.BLOCK128X128, "block32x32": Q.BLOCK32X32}
MODE = {None: Q.SCALE_DEFAULT, "rceil": Q.RCEIL, "floor": Q.FLOOR, "ceil": Q.CEIL, "even": Q.EVEN}


def path(name):
    return os.path.join(tmp.name, name)


def run(*args):
    p = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def deq(x, fmt, kind, mode):
    """The operand lowp multiplies, as float64: the reference's dequantized rowwise copy."""
    if kind == "none":
        return (x.astype(ml_dtypes.bfloat16) if fmt == "bf16" else x).astype(np.float64)
    m = mode if KIND[kind] in Q.E8M0_KINDS else None
    codes, scales = Q.quantize_rowwise(x, FMT[fmt], KIND[kind], MODE[m])
    return Q.dequantize(codes, scales, FMT[fmt], KIND[kind]).astype(np.float64)


def check(name, got, ref):
    err = np.linalg.norm(got.astype(np.float64) - ref)
    nrm = np.linalg.norm(ref)
    rep.check(name, got.shape == ref.shape and np.all(np.isfinite(got)) and err <= 1e-5 * nrm,
              [f"shape {got.shape} vs {ref.shape}; |C - ref| = {err:.3e}, 1e-5 |ref| = {1e-5 * nrm:.3e}"])


def operands(M, N, K, G=None):
    a = (rng.standard_normal((M, K)) * np.exp(rng.uniform(-2, 2, (M, 1)))).astype(np.float32)
    shape = (N, K) if G is None else (G, N, K)
    b = (rng.standard_normal(shape) * 0.5).astype(np.float32)
    a[0, :5] = 0.0  # zeros
    return a, b


PAIRS = [("f32", "none", "f32", "none", None), ("bf16", "none", "bf16", "none", None)]
for fa in ("e4m3", "e5m2"):
    for fb in ("e4m3", "e5m2"):
        PAIRS += [(fa, "tensor", fb, "tensor", None), (fa, "row", fb, "row", None)]
for f in ("e4m3", "e5m2", "e2m1"):
    for mode in ("rceil", "floor", "ceil", "even"):
        PAIRS.append((f, "mx32", f, "mx32", mode))
PAIRS += [("e4m3", "block128", "e4m3", "block128x128", None), ("e4m3", "block128", "e4m3", "block128", None),
          ("e4m3", "mx32", "e4m3", "block32x32", None), ("e4m3", "mx32", "e4m3", "block32x32", "floor")]


def args_of(fa, ka, fb, kb, mode):
    args = ["gemm", "--format", fa, "--scaling", ka, "--b-format", fb, "--b-scaling", kb]
    return args + (["--scale-mode", mode] if mode else [])


def test_pairs():
    M, N, K = 37, 45, 200
    a, b = operands(M, N, K)
    np.save(path("a.npy"), a)
    np.save(path("b.npy"), b)
    for fa, ka, fb, kb, mode in PAIRS:
        name = f"{fa}/{ka} x {fb}/{kb}" + (f" {mode}" if mode else "")
        out = path("c.npy")
        rc, _, err = run(*args_of(fa, ka, fb, kb, mode), path("a.npy"), path("b.npy"), out)
        if not rep.check(f"gemm {name}: exit 0", rc == 0, [err.strip()]):
            continue
        mb = mode if kb in ("mx32", "block32x32") else None
        if kb == "block32x32" and mode is None:
            mb = "floor"  # block32x32's own default
        ref = deq(a, fa, ka, mode) @ deq(b, fb, kb, mb).T
        check(f"gemm {name} [{M}x{K}].[{N}x{K}]^T vs float64 of the dequantized operands",
              np.load(out), ref)


def test_grouped():
    M, N, K, G = 70, 24, 96, 4
    offs = np.array([20, 20, 51, 64], np.int32)  # group 1 empty; rows 64..69 past the end
    a, b = operands(M, N, K, G)
    np.save(path("ga.npy"), a)
    np.save(path("gb.npy"), b)
    np.save(path("offs.npy"), offs)
    for fa, ka, fb, kb, mode in [("e4m3", "mx32", "e4m3", "mx32", None), ("e4m3", "row", "e4m3", "row", None),
                                 ("e5m2", "tensor", "e4m3", "tensor", None), ("bf16", "none", "bf16", "none", None),
                                 ("e4m3", "block128", "e4m3", "block128x128", None),
                                 ("e4m3", "mx32", "e4m3", "block32x32", None)]:
        name = f"grouped {fa}/{ka} x {fb}/{kb}"
        rc, _, err = run(*args_of(fa, ka, fb, kb, mode), "--offs", path("offs.npy"), path("ga.npy"),
                         path("gb.npy"), path("gc.npy"))
        if not rep.check(f"{name}: exit 0", rc == 0, [err.strip()]):
            continue
        ref = np.zeros((M, N))
        da = deq(a, fa, ka, "rceil")  # tensor/row scales of A are over all of A, as lowp quantizes it
        start = 0
        for g, end in enumerate(offs):
            mb = "floor" if kb == "block32x32" else "rceil"
            ref[start:end] = da[start:end] @ deq(b[g], fb, kb, mb).T
            start = end
        check(f"{name} (empty group, rows past offs[-1] zero) vs float64", np.load(path("gc.npy")), ref)


def test_bad_input():
    np.save(path("a3.npy"), np.zeros((2, 3, 4), np.float32))
    np.save(path("k5.npy"), np.zeros((4, 5), np.float32))
    cases = [
        ("missing --format", ["gemm", "--scaling", "mx32", path("a.npy"), path("b.npy"), path("o.npy")]),
        ("unknown format", ["gemm", "--format", "e3m4", "--scaling", "mx32", path("a.npy"), path("b.npy"), path("o.npy")]),
        ("e4m3 with none", ["gemm", "--format", "e4m3", "--scaling", "none", path("a.npy"), path("b.npy"), path("o.npy")]),
        ("unsupported pair", ["gemm", "--format", "e4m3", "--scaling", "row", "--b-scaling", "mx32",
                              path("a.npy"), path("b.npy"), path("o.npy")]),
        ("3-D A", ["gemm", "--format", "e4m3", "--scaling", "row", path("a3.npy"), path("b.npy"), path("o.npy")]),
        ("K mismatch", ["gemm", "--format", "e4m3", "--scaling", "row", path("a.npy"), path("k5.npy"), path("o.npy")]),
        ("two files", ["gemm", "--format", "e4m3", "--scaling", "row", path("a.npy"), path("b.npy")]),
        ("missing file", ["gemm", "--format", "e4m3", "--scaling", "row", path("nope.npy"), path("b.npy"), path("o.npy")]),
        ("2-D B with --offs", ["gemm", "--format", "e4m3", "--scaling", "row", "--offs", path("offs.npy"),
                               path("a.npy"), path("b.npy"), path("o.npy")]),
    ]
    for what, args in cases:
        rc, out, err = run(*args)
        rep.check(f"gemm {what}: exit 2, one line on stderr",
                  rc == 2 and err.count("\n") == 1 and not os.path.exists(path("o.npy")), [f"exit {rc}", err[-300:]])
    rc, out, _ = run("gemm", "--help")
    rep.check("gemm --help: exit 0", rc == 0 and "--offs" in out)
    rc, out, _ = run("bench", "--help")
    rep.check("bench --help: exit 0, lists the benchmarks", rc == 0 and "quant" in out and "gemm" in out)
    # bench gemm --shape: one dense shape (odd sizes), every kernel on 1 and 2 threads, no grouped rows
    rc, out, err = run("bench", "gemm", "--shape", "67x45x33", "--reps", "1", "--json")
    rows = [json.loads(l) for l in out.splitlines() if l.strip()]
    kernels = {r["kernel"] for r in rows}
    rep.check("bench gemm --shape 67x45x33: exit 0, that shape only, the lowp kernels on 1 and 2 threads",
              rc == 0 and rows and all((r["m"], r["n"], r["k"], r["groups"]) == (67, 45, 33, 0) for r in rows)
              and {"lowp_bf16", "lowp_mxfp8", "lowp_block128", "lowp_block32x32", "lowp_f32"} <= kernels
              and {r["threads"] for r in rows} == {1, 2} and all(r["gflops"] > 0 for r in rows),
              [f"exit {rc}", err[-300:], out[:300]])
    # Every ratio names the oneDNN it was taken against (issue 42): the library's own version,
    # read at run time. A build without oneDNN says so on stderr and has no ratios.
    peer = [r for r in rows if r["kernel"] == "onednn_bf16" or "ratio_to_onednn_bf16" in r]
    named = all(re.fullmatch(r"oneDNN v\d+\.\d+\.\d+ \(\w[\w ]*\)", r.get("onednn", "")) for r in peer)
    rep.check("bench gemm --json: each onednn_bf16 row and each ratio names the oneDNN version, or no "
              "oneDNN and a stderr line saying so",
              named and (peer or "oneDNN was not found" in err), [f"exit {rc}", err[-300:], out[:300]])
    # --clock cpu: the calling thread's CPU time, so one thread only.
    rc, out, err = run("bench", "gemm", "--shape", "67x45x33", "--reps", "1", "--json", "--clock", "cpu")
    rows = [json.loads(l) for l in out.splitlines() if l.strip()]
    rep.check("bench gemm --clock cpu: exit 0, every kernel on 1 thread only",
              rc == 0 and len(rows) >= 5 and {r["threads"] for r in rows} == {1}
              and all(r["seconds"] > 0 for r in rows), [f"exit {rc}", err[-300:], out[:300]])
    for bad in (["--clock", "wall"], ["--clock"]):
        rc, out, err = run("bench", "gemm", "--shape", "8x8x8", *bad)
        rep.check(f"bench gemm {' '.join(bad)}: exit 2, the error names --clock",
                  rc == 2 and "--clock" in err, [f"exit {rc}", err[-300:]])
    for bad in ("12x0x3", "12x5", "12x5x3x1", "axbxc", "70000x1x1", "-4x5x6", "4x5x6junk", "+4x5x6", "4x 5x6", " 4x5x6"):
        rc, out, err = run("bench", "gemm", "--shape", bad)
        rep.check(f"bench gemm --shape {bad}: exit 2, the error names --shape",
                  rc == 2 and "--shape" in err and out == "", [f"exit {rc}", err[-300:]])
    rc, out, err = run("bench", "gemm", "--shape")
    rep.check("bench gemm --shape without a value: exit 2", rc == 2 and "--shape" in err, [f"exit {rc}", err[-300:]])


def main():
    test_pairs()
    test_grouped()
    test_bad_input()
    print(f"{rep.passed} passed, {rep.failed} failed")
    sys.exit(1 if rep.failed else 0)


if __name__ == "__main__":
    main()
