"""`lowp quantize` and `lowp dequantize` against the independent Python reference of
tests/oracle/quant_ref.py: every scaling kind, format and option, the files each axis writes (codes,
canonical scales, the metadata JSON), the round trip back to float32, and bad inputs (exit
status 2, one line on stderr, no output files).

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
import quant_ref as Q  # noqa: E402

CLI = os.environ.get("LOWP_CLI")
if not CLI:
    sys.exit("LOWP_CLI is not set (path of the lowp binary); run through ctest")

rep = Q.Report()
rng = np.random.default_rng(4242)
tmp = tempfile.mkdtemp(prefix="lowp_cli_quant_")


def run(*args):
    p = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def files_of(prefix):
    d, base = os.path.split(prefix)
    return sorted(f for f in os.listdir(d) if f.startswith(base + ".") or f == base)


def clean(prefix):
    for f in files_of(prefix):
        os.remove(os.path.join(os.path.dirname(prefix), f))


def cli_args(kind, fmt, mode, pow2, eps, axis):
    a = ["quantize", "--format", Q.FMT_NAMES[fmt], "--scaling", Q.KIND_NAMES[kind]]
    if mode != Q.SCALE_DEFAULT:
        a += ["--scale-mode", Q.MODE_NAMES[mode]]
    if pow2 == 1:
        a.append("--pow2")
    elif pow2 == 0:
        a.append("--no-pow2")
    if eps:
        a += ["--eps", repr(float(eps))]
    if axis is not None:
        a += ["--axis", axis]
    return a


def configs():
    out = []
    for kind in Q.FP32_KINDS:
        for fmt in (Q.E4M3, Q.E5M2):
            for pow2 in (-1, 0, 1):
                out.append((kind, fmt, Q.SCALE_DEFAULT, pow2, 0.0))
            out.append((kind, fmt, Q.SCALE_DEFAULT, -1, 1e-3))
    for kind in Q.E8M0_KINDS:
        for fmt in ((Q.E4M3, Q.E5M2, Q.E2M1) if kind == Q.MX32 else (Q.E4M3, Q.E5M2)):
            for mode in (Q.SCALE_DEFAULT, Q.RCEIL, Q.FLOOR, Q.CEIL, Q.EVEN):
                out.append((kind, fmt, mode, -1, 0.0))
    return out


def name_of(kind, fmt, mode, pow2, eps):
    return (f"{Q.KIND_NAMES[kind]}/{Q.FMT_NAMES[fmt]}/{Q.MODE_NAMES[mode]}/pow2={pow2}/"
            f"eps={eps:g}")


def test_tensor(label, x):
    path_in = os.path.join(tmp, f"{label}.npy")
    np.save(path_in, x)
    R, C = x.shape
    for cfg in configs():
        kind, fmt, mode, pow2, eps = cfg
        eps32 = float(np.float32(eps))
        ref = Q.quantize(x, fmt, kind, mode, pow2, eps32)
        rmode, rpow2 = Q.resolve(kind, mode, pow2)
        # axis both for every configuration; row and col alone for the defaults of each kind
        axes = ["both"]
        if mode == Q.SCALE_DEFAULT and pow2 == -1 and eps == 0:
            axes += [None, "row", "col"]
        for axis in axes:
            out = os.path.join(tmp, "q")
            clean(out)
            name = f"{label} {name_of(*cfg)} axis={axis}"
            rc, so, se = run(*cli_args(kind, fmt, mode, pow2, eps, axis), path_in, out)
            if not rep.check(name + " exit 0", rc == 0, [f"rc={rc} stderr={se.strip()}"]):
                continue
            a = axis or "row"
            want_files = ["q.json"]
            if a in ("row", "both"):
                want_files += ["q.data.npy", "q.scale.npy"]
            if a in ("col", "both"):
                want_files += ["q.col.data.npy", "q.col.scale.npy"]
            rep.check(name + " files", files_of(out) == sorted(want_files),
                      [f"{files_of(out)} != {sorted(want_files)}"])
            meta = json.load(open(out + ".json"))
            want_meta = {"format": Q.FMT_NAMES[fmt], "scaling": Q.KIND_NAMES[kind],
                         "rows": R, "cols": C, "axis": a}
            for k, v in want_meta.items():
                rep.check(name + f" json {k}", meta.get(k) == v, [f"{meta.get(k)!r} != {v!r}"])
            if kind in Q.E8M0_KINDS:
                rep.check(name + " json scale_mode", meta.get("scale_mode") == Q.MODE_NAMES[rmode],
                          [f"{meta.get('scale_mode')!r}"])
            else:
                rep.check(name + " json pow2/eps", meta.get("pow2") == rpow2 and
                          np.float32(meta.get("eps")) == np.float32(eps32),
                          [f"pow2={meta.get('pow2')!r} eps={meta.get('eps')!r}"])
            rep.check(name + " json lowp_version", isinstance(meta.get("lowp_version"), str)
                      and meta["lowp_version"].count(".") == 2)
            for o, tag in (("row", ""), ("col", ".col")):
                if o == "col" and a == "row" or o == "row" and a == "col":
                    continue
                data = np.load(out + tag + ".data.npy")
                scales = np.load(out + tag + ".scale.npy")
                want_d = Q.storage(ref[o][0], fmt)
                rep.check(name + f" {o} data dtype", data.dtype == np.uint8, [str(data.dtype)])
                rep.check(name + f" {o} scale dtype",
                          scales.dtype == (np.uint8 if kind in Q.E8M0_KINDS else np.float32),
                          [str(scales.dtype)])
                rep.arrays_equal(name + f" {o} codes", data, want_d)
                rep.arrays_equal(name + f" {o} scales", scales, ref[o][1])
                # Dequantize this copy; the columnwise one comes back in the input's shape.
                back = os.path.join(tmp, "back.npy")
                if os.path.exists(back):
                    os.remove(back)
                rc, so, se = run("dequantize", "--axis", o, out, back)
                if not rep.check(name + f" dequantize {o} exit 0", rc == 0, [f"rc={rc} {se.strip()}"]):
                    continue
                got = np.load(back)
                want = Q.dequantize(ref[o][0], ref[o][1], fmt, kind)
                rep.arrays_equal(name + f" dequantize {o}", got, want if o == "row" else want.T)
            # The default dequantize axis: the rowwise copy when written, else the columnwise.
            back = os.path.join(tmp, "back.npy")
            rc, so, se = run("dequantize", out, back)
            if rep.check(name + " dequantize (default axis) exit 0", rc == 0, [se.strip()]):
                o = "col" if a == "col" else "row"
                want = Q.dequantize(ref[o][0], ref[o][1], fmt, kind)
                rep.arrays_equal(name + " dequantize (default axis)", np.load(back),
                                 want if o == "row" else want.T)


def special_mosaic():
    x = rng.standard_normal((64, 96)).astype(np.float32)
    x[0:32, 0:32] = 0.0
    x[0:32:2, 0:32] = -0.0
    x[5, 40] = np.nan
    x[40, 5] = np.inf
    x[50, 70] = -np.inf
    x[33, 33] = 3e38
    x[34:40, 64:96] = Q.f32(rng.integers(1, 0x800000, size=(6, 32), dtype=np.uint32))
    x[60:64, 0:32] = 480.0
    x[41, 41:60] = 61440.0
    return x


def expect_error(name, args, must_mention=None, prefix=None):
    """Exit 2, exactly one line on stderr, nothing on stdout, no output files."""
    if prefix:
        clean(prefix)
    rc, so, se = run(*args)
    lines = se.strip().splitlines()
    ok = rep.check(name + ": exit 2", rc == 2, [f"rc={rc} stderr={se.strip()!r}"])
    rep.check(name + ": one line on stderr", len(lines) == 1, [f"stderr={se!r}"])
    rep.check(name + ": nothing on stdout", so == "", [f"stdout={so!r}"])
    if must_mention and ok:
        rep.check(name + f": message names {must_mention!r}",
                  any(m in se for m in ([must_mention] if isinstance(must_mention, str) else must_mention)),
                  [f"stderr={se.strip()!r}"])
    if prefix:
        rep.check(name + ": no output written", files_of(prefix) == [], [f"{files_of(prefix)}"])


def write_raw(name, raw):
    p = os.path.join(tmp, name)
    with open(p, "wb") as f:
        f.write(raw)
    return p


def test_bad_inputs():
    good = os.path.join(tmp, "good.npy")
    np.save(good, rng.standard_normal((4, 40)).astype(np.float32))
    out = os.path.join(tmp, "bad")
    base = ["quantize", "--format", "e4m3", "--scaling", "mx32"]
    expect_error("missing --format", ["quantize", "--scaling", "mx32", good, out], "--format", out)
    expect_error("missing --scaling", ["quantize", "--format", "e4m3", good, out], "--scaling", out)
    expect_error("format e8m0", ["quantize", "--format", "e8m0", "--scaling", "mx32", good, out], "e8m0", out)
    expect_error("format bf16", ["quantize", "--format", "bf16", "--scaling", "mx32", good, out], "bf16", out)
    expect_error("unknown scaling", ["quantize", "--format", "e4m3", "--scaling", "mx64", good, out], "mx64", out)
    expect_error("scaling none", ["quantize", "--format", "e4m3", "--scaling", "none", good, out], "none", out)
    for kind in ("tensor", "row", "block128", "block128x128", "block32x32"):
        expect_error(f"e2m1 with {kind}", ["quantize", "--format", "e2m1", "--scaling", kind, good, out],
                     kind, out)
    expect_error("scale-mode on tensor", ["quantize", "--format", "e4m3", "--scaling", "tensor",
                                          "--scale-mode", "floor", good, out], "--scale-mode", out)
    expect_error("pow2 on mx32", base + ["--pow2", good, out], "--pow2", out)
    expect_error("eps on block32x32", ["quantize", "--format", "e4m3", "--scaling", "block32x32",
                                       "--eps", "1", good, out], "--eps", out)
    expect_error("unknown scale mode", base + ["--scale-mode", "round", good, out], "round", out)
    for bad in ("-1", "nan", "inf", "abc", "", "1e99"):
        expect_error(f"eps {bad!r}", ["quantize", "--format", "e4m3", "--scaling", "row", "--eps", bad,
                                      good, out], "--eps", out)
    expect_error("pow2 and no-pow2", ["quantize", "--format", "e4m3", "--scaling", "row", "--pow2",
                                      "--no-pow2", good, out], "pow2", out)
    expect_error("axis diag", base + ["--axis", "diag", good, out], "--axis", out)
    expect_error("unknown option", base + ["--fast", good, out], "--fast", out)
    expect_error("option twice", base + ["--axis", "row", "--axis", "col", good, out], "--axis", out)
    expect_error("option without value", base + [good, out, "--axis"], "--axis", out)
    expect_error("one file", base + [good], None, None)
    expect_error("three files", base + [good, out, "extra"], "extra", out)
    expect_error("missing input", base + [os.path.join(tmp, "nope.npy"), out], "nope.npy", out)
    expect_error("not an npy", base + [write_raw("garbage.npy", b"hello world, not numpy"), out],
                 "garbage.npy", out)
    np.save(os.path.join(tmp, "one_d.npy"), np.ones(40, np.float32))
    expect_error("1-D input", base + [os.path.join(tmp, "one_d.npy"), out], "one_d.npy", out)
    np.save(os.path.join(tmp, "three_d.npy"), np.ones((2, 3, 40), np.float32))
    expect_error("3-D input", base + [os.path.join(tmp, "three_d.npy"), out], "three_d.npy", out)
    np.save(os.path.join(tmp, "f8.npy"), np.ones((4, 40), np.float64))
    expect_error("float64 input", base + [os.path.join(tmp, "f8.npy"), out], "f8.npy", out)
    np.save(os.path.join(tmp, "u1.npy"), np.ones((4, 40), np.uint8))
    expect_error("uint8 input", base + [os.path.join(tmp, "u1.npy"), out], "u1.npy", out)
    np.save(os.path.join(tmp, "empty.npy"), np.ones((0, 40), np.float32))
    expect_error("empty rows", base + [os.path.join(tmp, "empty.npy"), out], "empty.npy", out)
    np.save(os.path.join(tmp, "empty2.npy"), np.ones((4, 0), np.float32))
    expect_error("cols of 0", base + [os.path.join(tmp, "empty2.npy"), out], "empty2.npy", out)
    np.save(os.path.join(tmp, "fortran.npy"), np.asfortranarray(np.ones((4, 40), np.float32)))
    expect_error("fortran order", base + [os.path.join(tmp, "fortran.npy"), out], "fortran.npy", out)
    raw = open(good, "rb").read()
    expect_error("truncated npy", base + [write_raw("trunc.npy", raw[:-7]), out], "trunc.npy", out)

    # dequantize
    q = os.path.join(tmp, "dq")
    clean(q)
    rc, _, se = run(*base, "--axis", "row", good, q)
    rep.check("dequantize setup", rc == 0, [se])
    back = os.path.join(tmp, "dq_back.npy")
    expect_error("dequantize missing metadata", ["dequantize", os.path.join(tmp, "nothing"), back], "nothing")
    expect_error("dequantize col not written", ["dequantize", "--axis", "col", q, back], "col")
    expect_error("dequantize axis both", ["dequantize", "--axis", "both", q, back], "--axis")
    expect_error("dequantize one file", ["dequantize", q], None)
    expect_error("dequantize unknown option", ["dequantize", "--format", "e4m3", q, back], "--format")
    rep.check("dequantize errors wrote nothing", not os.path.exists(back))
    # Tampered files.
    shutil.copy(q + ".scale.npy", q + ".scale.keep")
    np.save(q + ".scale.npy", np.zeros((4, 1), np.uint8))  # wrong shape
    expect_error("dequantize scale shape mismatch", ["dequantize", q, back], "scale.npy")
    np.save(q + ".scale.npy", np.zeros((4, 2), np.float32))  # wrong dtype
    expect_error("dequantize scale dtype mismatch", ["dequantize", q, back], "scale.npy")
    shutil.copy(q + ".scale.keep", q + ".scale.npy")
    np.save(q + ".data.npy", np.zeros((4, 39), np.uint8))
    expect_error("dequantize data shape mismatch", ["dequantize", q, back], "data.npy")
    os.remove(q + ".data.npy")
    expect_error("dequantize data missing", ["dequantize", q, back], "data.npy")
    meta = open(q + ".json").read()
    with open(q + ".json", "w") as f:
        f.write(meta.replace('"mx32"', '"mx99"'))
    expect_error("dequantize bad metadata", ["dequantize", q, back], "mx99")
    with open(q + ".json", "w") as f:
        f.write("{}")
    expect_error("dequantize empty metadata", ["dequantize", q, back], "dq.json")
    rep.check("dequantize errors wrote nothing (tampered)", not os.path.exists(back))

    # help and exit 0
    rc, so, se = run("quantize", "--help")
    rep.check("quantize --help", rc == 0 and "usage: lowp quantize" in so and se == "")
    rc, so, se = run("dequantize", "--help")
    rep.check("dequantize --help", rc == 0 and "usage: lowp dequantize" in so and se == "")
    rc, so, se = run("help")
    rep.check("lowp help lists quantize and dequantize", rc == 0 and "quantize" in so and "dequantize" in so)


def test_bench_quant():
    """`lowp bench quant` on a small odd shape: every kernel on 1 and 2 threads, and --input
    changing the bytes each one moves (binary32 input reads 4 bytes an element, BF16 2)."""
    R, C = 67, 96
    n, mx_scales = R * C, R * ((C + 31) // 32)
    want = {"memcpy", "mxfp8_row", "mxfp8_dual", "block128_row", "block128x128", "block32x32",
            "block128_dual", "row_dual", "tensor_dual"}
    for inp, es in (("f32", 4), ("bf16", 2)):
        args = ["bench", "quant", "--rows", R, "--cols", C, "--reps", 1, "--json"]
        if inp == "f32":
            args += ["--input", "f32"]
        rc, so, se = run(*args)
        rows = [json.loads(l) for l in so.splitlines() if l.strip()]
        by = {(r["kernel"], r["threads"]): r for r in rows}
        name = f"bench quant --input {inp}"
        rep.check(name + ": exit 0, every kernel on 1 and 2 threads",
                  rc == 0 and set(by) == {(k, t) for k in want for t in (1, 2)},
                  [f"rc={rc} {se.strip()[-200:]}", str(sorted(by))])
        if rc != 0 or not rows:
            continue
        rep.check(name + ": shape and input in every line",
                  all((r["rows"], r["cols"], r["input"]) == (R, C, inp) for r in rows))
        mc, mr = by.get(("memcpy", 1), {}), by.get(("mxfp8_row", 1), {})
        rep.check(name + ": memcpy moves the input twice", mc.get("bytes") == 2 * es * n,
                  [f"{mc.get('bytes')} != {2 * es * n}"])
        rep.check(name + ": mxfp8_row reads the input, writes codes and scales",
                  mr.get("bytes") == es * n + n + mx_scales, [f"{mr.get('bytes')} != {es * n + n + mx_scales}"])
    expect_error("bench quant --input f16", ["bench", "quant", "--input", "f16"], "--input")
    expect_error("bench quant --input (no value)", ["bench", "quant", "--input"], "--input")


def main():
    try:
        shapes = [(1, 1), (37, 70), (130, 260)] if not Q.SANITIZE else [(1, 1), (37, 70)]
        for R, C in shapes:
            x = (rng.standard_normal((R, C)) * 10.0 ** rng.uniform(-3, 3, (R, 1))).astype(np.float32)
            test_tensor(f"random{R}x{C}", x)
        test_tensor("special", special_mosaic())
        test_bad_inputs()
        test_bench_quant()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rep.finish()


if __name__ == "__main__":
    main()
