"""Test of the `lowp` command (env LOWP_CLI): `lowp cast`, the dispatcher and `lowp demo`.

- Round trip of random multi-dimensional float32 arrays (with specials) through
  `lowp cast --to X` and `--from X` for every format equals ml_dtypes' round trip, the codes equal
  the oracle's, output dtypes and shapes are right (shapes (), (0,), (n,), 2-D to 5-D, odd E2M1);
  --saturate nonsat; .npy versions 1.0, 2.0 and 3.0 are read; written files load with np.load,
  have 64-byte-aligned headers and leave no PATH.tmp behind.
- Stochastic rounding: same seed reproduces, another seed differs, --offset k on x[k:] equals
  the tail of offset 0, the CLI equals lowp_cast through ctypes (LOWP_LIB), --threads 1 = default.
- Bad input: not an .npy file, float64, truncated, Fortran order, big-endian, structured dtype,
  malformed header, missing file, wrong code dtype, E2M1 code > 15, missing/extra arguments,
  unknown format or option, --round sr without --seed, SR on e8m0, --to with --from, bad numbers:
  exit status 2 and exactly one line on stderr. An unwritable output: exit 1, one line.
- Dispatcher: no arguments and unknown commands exit 2 with one stderr line; help, --version and
  demo exit 0.
Prints "N passed, M failed"; exits nonzero on failure.
"""

import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle"))
from oracle import (DEFAULT, E2M1, E4M3, E5M2, E8M0, BF16, F16, FORMATS, NARROW, NONSAT, SATFINITE, SR,  # noqa: E402
                    Lib, Report, bits32, decode_oracle, encode_oracle)

CLI = os.environ.get("LOWP_CLI")
if not CLI:
    sys.exit("LOWP_CLI is not set (path of the lowp executable); run through ctest")

rep = Report()
tmp = tempfile.TemporaryDirectory(prefix="lowp_cli_")
TMP = tmp.name


def path(name):
    return os.path.join(TMP, name)


def run(*args):
    p = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def save(name, arr, version=None):
    p = path(name)
    if version is None:
        np.save(p, arr, allow_pickle=False)
    else:
        with open(p, "wb") as fh:
            np.lib.format.write_array(fh, arr, version=version, allow_pickle=False)
    return p


def sample(shape, rng, fmt):
    """Random values at the scale of the format, with specials sprinkled in."""
    fmax = float(decode_oracle(np.array([FORMATS[fmt].max_code], FORMATS[fmt].code_dtype), fmt)[0])
    n = int(np.prod(shape))
    with np.errstate(all="ignore"):
        x = (rng.standard_normal(n) * min(fmax / 4, 1e4)).astype(np.float32)
        x[::7] = (rng.standard_normal(x[::7].size) * 1e-3).astype(np.float32)
    with np.errstate(all="ignore"):
        specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, fmax * 1.2, -fmax * 3, 1e-30], np.float32)
    k = min(n, specials.size)
    x[:k] = specials[:k]
    return x.reshape(shape)


def one_line(err):
    return err.endswith("\n") and err.count("\n") == 1 and len(err.strip()) > 0


def same_floats(a, b):
    return a.shape == b.shape and bool(np.all((bits32(a) == bits32(b)) | (np.isnan(a) & np.isnan(b))))


def header_len(p):
    with open(p, "rb") as fh:
        major, _ = np.lib.format.read_magic(fh)
        if major == 1:
            np.lib.format.read_array_header_1_0(fh)
        else:
            np.lib.format.read_array_header_2_0(fh)
        return fh.tell()


def test_round_trips(rng):
    shapes = [(), (0,), (1,), (7,), (3, 5), (2, 3, 4), (1, 2, 1, 9), (2, 1, 3, 1, 5), (1001,)]
    for fmt in NARROW:
        f = FORMATS[fmt]
        for shape in shapes:
            x = sample(shape, rng, fmt)
            src = save(f"x_{f.name}.npy", x)
            codes_p, back_p = path(f"c_{f.name}.npy"), path(f"b_{f.name}.npy")
            rc, _, err = run("cast", "--to", f.name, src, codes_p)
            if not rep.check(f"cast --to {f.name} {shape} exits 0", rc == 0, [err.strip()]):
                continue
            codes = np.load(codes_p)
            # The default policy: IEEE (+-Inf) for bf16 and f16, satfinite for the others.
            want_codes = encode_oracle(x.ravel(), fmt, DEFAULT).reshape(shape)
            rep.check(f"cast --to {f.name} {shape}: dtype {f.code_dtype.__name__}, shape, codes",
                      codes.dtype == f.code_dtype and codes.shape == shape
                      and np.array_equal(codes, want_codes),
                      [f"dtype {codes.dtype} shape {codes.shape}; codes {codes.ravel()[:8]} want "
                       f"{want_codes.ravel()[:8]}"])
            rep.check(f"cast --to {f.name} {shape}: 64-byte header, no .tmp left",
                      header_len(codes_p) % 64 == 0 and not os.path.exists(codes_p + ".tmp"))
            rc, _, err = run("cast", "--from", f.name, codes_p, back_p)
            if not rep.check(f"cast --from {f.name} {shape} exits 0", rc == 0, [err.strip()]):
                continue
            back = np.load(back_p)
            want = decode_oracle(want_codes.ravel(), fmt).reshape(shape)
            rep.check(f"round trip {f.name} {shape} equals ml_dtypes' round trip",
                      back.dtype == np.float32 and same_floats(back, want),
                      [f"dtype {back.dtype} shape {back.shape}; got {back.ravel()[:6]} want {want.ravel()[:6]}"])
        # nonsat and the --name=value spelling
        x = sample((4, 33), rng, fmt)
        src = save("ns.npy", x)
        rc, _, err = run("cast", f"--to={f.name}", "--saturate=nonsat", src, path("ns_c.npy"))
        ok = rc == 0 and np.array_equal(np.load(path("ns_c.npy")), encode_oracle(x.ravel(), fmt, NONSAT).reshape(x.shape))
        rep.check(f"cast --to={f.name} --saturate=nonsat", ok, [err.strip()])
        rc, _, err = run("cast", f"--to={f.name}", "--saturate", "satfinite", src, path("sf_c.npy"))
        ok = rc == 0 and np.array_equal(np.load(path("sf_c.npy")), encode_oracle(x.ravel(), fmt, SATFINITE).reshape(x.shape))
        rep.check(f"cast --to={f.name} --saturate satfinite", ok, [err.strip()])

    # .npy versions 2.0 and 3.0 on input
    x = sample((5, 6), rng, E4M3)
    for version in ((1, 0), (2, 0), (3, 0)):
        src = save(f"v{version[0]}.npy", x, version=version)
        rc, _, err = run("cast", "--to", "e4m3", src, path("v_out.npy"))
        ok = rc == 0 and np.array_equal(np.load(path("v_out.npy")), encode_oracle(x.ravel(), E4M3, SATFINITE).reshape(5, 6))
        rep.check(f"reads .npy version {version[0]}.{version[1]}", ok, [err.strip()])
    # A non-contiguous view saved by numpy is written in C order.
    xt = np.ascontiguousarray(sample((6, 4), rng, E5M2).T)
    src = save("t.npy", xt)
    rc, _, err = run("cast", "--to", "e5m2", src, path("t_out.npy"))
    rep.check("transposed (C-order copy) input", rc == 0 and np.array_equal(
        np.load(path("t_out.npy")), encode_oracle(xt.ravel(), E5M2, SATFINITE).reshape(xt.shape)), [err.strip()])


def test_sr(rng):
    lib = Lib() if os.environ.get("LOWP_LIB") else None
    for fmt in (E4M3, E5M2, E2M1, BF16, F16):
        f = FORMATS[fmt]
        x = (rng.standard_normal((8, 125)) * 3).astype(np.float32)
        src = save("sr.npy", x)
        outs = {}
        for tag, extra in (("a", ["--seed", "42"]), ("b", ["--seed", "42", "--threads", "1"]),
                           ("c", ["--seed", "43"]), ("d", ["--seed", "42", "--offset", "0"])):
            rc, _, err = run("cast", "--to", f.name, "--round", "sr", *extra, src, path(f"sr_{tag}.npy"))
            rep.check(f"sr {f.name} {' '.join(extra)} exits 0", rc == 0, [err.strip()])
            outs[tag] = np.load(path(f"sr_{tag}.npy")) if rc == 0 else None
        if any(v is None for v in outs.values()):
            continue
        rep.check(f"sr {f.name}: same seed reproduces (threads 1 and all)",
                  np.array_equal(outs["a"], outs["b"]) and np.array_equal(outs["a"], outs["d"]))
        rep.check(f"sr {f.name}: another seed differs", not np.array_equal(outs["a"], outs["c"]))
        # --offset k on x[k:] is the tail of offset 0 on x (element i uses word offset + i).
        k = 77
        tail = save("sr_tail.npy", x.ravel()[k:])
        rc, _, err = run("cast", "--to", f.name, "--round", "sr", "--seed", "42", "--offset", str(k), tail,
                         path("sr_tail_out.npy"))
        rep.check(f"sr {f.name}: --offset {k} continues the stream",
                  rc == 0 and np.array_equal(np.load(path("sr_tail_out.npy")), outs["a"].ravel()[k:]), [err.strip()])
        if lib is not None:
            want = lib.encode(np.ascontiguousarray(x.ravel()), fmt, rounding=SR, seed=42, offset=0)
            rep.check(f"sr {f.name}: CLI equals lowp_cast", np.array_equal(outs["a"].ravel(), want))


def expect_error(name, args, status=2, needle=None):
    rc, out, err = run(*args)
    ok = rc == status and one_line(err) and (needle is None or needle in err)
    rep.check(f"error: {name} -> exit {status}, one stderr line", ok,
              [f"exit {rc}, stderr {err!r}"])


def test_errors(rng):
    x = sample((3, 4), rng, E4M3)
    good = save("good.npy", x)
    out = path("err_out.npy")
    with open(path("text.npy"), "w") as fh:
        fh.write("hello, not numpy\n")
    save("f64.npy", x.astype(np.float64))
    raw = open(good, "rb").read()
    with open(path("trunc.npy"), "wb") as fh:
        fh.write(raw[:-5])
    with open(path("trunc_hdr.npy"), "wb") as fh:
        fh.write(raw[:40])
    with open(path("extra.npy"), "wb") as fh:
        fh.write(raw + b"\0\0\0\0")
    save("fortran.npy", np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4)))
    save("be.npy", x.astype(">f4"))
    save("struct.npy", np.zeros(3, dtype=[("a", "<f4"), ("b", "<i4")]))
    bad_hdr = raw.replace(b"'shape': (3, 4)", b"'shape': [3, 4]")
    with open(path("bad_hdr.npy"), "wb") as fh:
        fh.write(bad_hdr)
    neg = raw.replace(b"'shape': (3, 4)", b"'shape': (3,-4)")
    with open(path("neg.npy"), "wb") as fh:
        fh.write(neg)
    hdr_len = int.from_bytes(raw[8:10], "little")
    body = b"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999, 99999999999), }"
    body = body + b" " * (hdr_len - len(body) - 1) + b"\n"
    with open(path("huge.npy"), "wb") as fh:
        fh.write(raw[:10] + body + raw[10 + hdr_len:])
    save("u8.npy", np.arange(20, dtype=np.uint8))
    save("u16.npy", np.arange(20, dtype=np.uint16))

    expect_error("not an npy file", ["cast", "--to", "e4m3", path("text.npy"), out], needle="text.npy")
    expect_error("float64 input", ["cast", "--to", "e4m3", path("f64.npy"), out], needle="<f8")
    expect_error("truncated data", ["cast", "--to", "e4m3", path("trunc.npy"), out], needle="trunc.npy")
    expect_error("truncated header", ["cast", "--to", "e4m3", path("trunc_hdr.npy"), out], needle="trunc_hdr.npy")
    expect_error("trailing bytes", ["cast", "--to", "e4m3", path("extra.npy"), out])
    expect_error("fortran order", ["cast", "--to", "e4m3", path("fortran.npy"), out], needle="Fortran")
    expect_error("big-endian float32", ["cast", "--to", "e4m3", path("be.npy"), out], needle=">f4")
    expect_error("structured dtype", ["cast", "--to", "e4m3", path("struct.npy"), out])
    expect_error("malformed header", ["cast", "--to", "e4m3", path("bad_hdr.npy"), out])
    expect_error("negative dimension", ["cast", "--to", "e4m3", path("neg.npy"), out])
    expect_error("shape overflows", ["cast", "--to", "e4m3", path("huge.npy"), out])
    expect_error("missing input file", ["cast", "--to", "e4m3", path("nope.npy"), out])
    expect_error("directory as input", ["cast", "--to", "e4m3", TMP, out])
    expect_error("empty file", ["cast", "--to", "e4m3", os.devnull, out])
    expect_error("--from e4m3 of float32", ["cast", "--from", "e4m3", good, out], needle="uint8")
    expect_error("--from bf16 of uint8", ["cast", "--from", "bf16", path("u8.npy"), out], needle="uint16")
    expect_error("--from e2m1 code > 15", ["cast", "--from", "e2m1", path("u8.npy"), out], needle="16")
    expect_error("--from e4m3 of uint16", ["cast", "--from", "e4m3", path("u16.npy"), out])
    expect_error("no arguments", ["cast"])
    expect_error("no files", ["cast", "--to", "e4m3"])
    expect_error("one file", ["cast", "--to", "e4m3", good])
    expect_error("three files", ["cast", "--to", "e4m3", good, out, out])
    expect_error("missing --to/--from", ["cast", good, out])
    expect_error("--to and --from", ["cast", "--to", "e4m3", "--from", "e4m3", good, out])
    expect_error("--to twice", ["cast", "--to", "e4m3", "--to", "e5m2", good, out])
    expect_error("--to without value", ["cast", good, out, "--to"])
    expect_error("unknown format", ["cast", "--to", "fp7", good, out], needle="fp7")
    expect_error("f32 is not a cast target", ["cast", "--to", "f32", good, out])
    expect_error("unknown option", ["cast", "--to", "e4m3", "--fast", good, out], needle="--fast")
    expect_error("bad --saturate", ["cast", "--to", "e4m3", "--saturate", "clip", good, out])
    expect_error("bad --round", ["cast", "--to", "e4m3", "--round", "up", good, out])
    expect_error("--round sr without --seed", ["cast", "--to", "e4m3", "--round", "sr", good, out], needle="--seed")
    expect_error("--round sr for e8m0", ["cast", "--to", "e8m0", "--round", "sr", "--seed", "1", good, out])
    expect_error("--seed without --round sr", ["cast", "--to", "e4m3", "--seed", "1", good, out])
    expect_error("--round with --from", ["cast", "--from", "e4m3", "--round", "sr", "--seed", "1", path("u8.npy"), out])
    expect_error("negative seed", ["cast", "--to", "e4m3", "--round", "sr", "--seed", "-1", good, out])
    expect_error("seed overflows 64 bits", ["cast", "--to", "e4m3", "--round", "sr", "--seed",
                                            "18446744073709551616", good, out])
    expect_error("bad --threads", ["cast", "--to", "e4m3", "--threads", "x", good, out])
    expect_error("unwritable output", ["cast", "--to", "e4m3", good, os.path.join(TMP, "no", "dir", "o.npy")],
                 status=1)
    rc, _, err = run("cast", "--to", "e4m3", "--round", "sr", "--seed", "0x10", "--offset", "5", good, out)
    rep.check("hex --seed and --offset accepted", rc == 0, [err.strip()])
    rc, out_text, _ = run("cast", "--help")
    rep.check("cast --help exits 0 with usage", rc == 0 and "--to" in out_text and "--round" in out_text)


def test_dispatcher():
    rc, out, err = run()
    rep.check("lowp (no arguments): exit 2, usage on stdout, one stderr line",
              rc == 2 and "usage" in out and one_line(err), [f"exit {rc} stderr {err!r}"])
    rc, out, err = run("frobnicate")
    rep.check("lowp frobnicate: exit 2, one stderr line", rc == 2 and one_line(err) and "frobnicate" in err,
              [f"exit {rc} stderr {err!r}"])
    rc, out, err = run("help")
    rep.check("lowp help: exit 0, lists commands", rc == 0 and all(c in out for c in ("cast", "demo", "info", "bench")),
              [f"exit {rc} stdout {out!r}"])
    rc, out, err = run("--version")
    rep.check("lowp --version", rc == 0 and out.startswith("lowp ") and out.count(".") >= 2, [repr(out)])
    rc, out, err = run("bench")
    rep.check("lowp bench (no name): exit 2, one stderr line", rc == 2 and one_line(err), [repr(err)])
    rc, out, err = run("bench", "nosuch")
    rep.check("lowp bench nosuch: exit 2, one stderr line", rc == 2 and one_line(err), [repr(err)])
    rc, out, err = run("demo")
    ok = rc == 0 and all(n in out for n in ("e4m3", "e5m2", "e2m1", "e8m0", "bf16", "f16")) and "0x7E" in out \
        and "tochastic" in out
    rep.check("lowp demo: exit 0, every format and SR", ok, [f"exit {rc} stderr {err!r}"])
    rc, out, err = run("demo", "extra")
    rep.check("lowp demo extra: exit 2, one stderr line", rc == 2 and one_line(err), [repr(err)])


def main():
    rng = np.random.default_rng(7)
    test_dispatcher()
    test_round_trips(rng)
    test_sr(rng)
    test_errors(rng)
    tmp.cleanup()
    rep.finish()


if __name__ == "__main__":
    main()
