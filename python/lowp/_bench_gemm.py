"""`python -m lowp.bench gemm`: the three GEMMs of a linear layer's training step, lowp's native
kernels beside torch's own BF16 `torch.mm` (a benchmark, not a test).

  python -m lowp.bench gemm [--shape 4096x4096x1024 ...] [--configs bf16,mxfp8,block32x32,block128]
                            [--threads 1] [--reps 7] [--clock wall|cpu]

For y = x . W^T with x [M, K] (tokens x in features) and W [N, K], --shape MxNxK:

  fwd    y [M, N]  = x . W^T         (B read as [N, K])
  dgrad  dx [M, K] = dy . W          (B read as stored [N, K], i.e. KN; MX weights use their
                                      columnwise copy, whose scales run along N)
  wgrad  dW [N, K] = dy^T . x        (split-K over the M tokens; both columnwise copies)

Rows, per GEMM: `torch.mm` on BF16 tensors into a preallocated BF16 output (the oneDNN that torch
bundles, named in the header), lowp's GEMM on the operands of each config (quantized once,
outside the timed region, into a preallocated BF16 output as torch's: torch has no CPU BF16 GEMM
with a binary32 output, and lowp's F32 output would write twice the bytes), and for the configs
whose scales fold exactly into BF16 (mxfp8: MX x MX; block32x32: MX x 32x32 tiles) the "fold" route:
both quantized operands decoded to BF16 with the scale multiplied in (exact: an E4M3 value
times a power of two is a BF16 number while it stays normal; checked against lowp.dequantize
before timing), then torch.mm, timed as fold + GEMM. The bf16 config gives lowp's BF16 GEMM the
BF16 operands, transposed copies for the weight gradient made outside the timing, as torch's
strided views are free to it. Every implementation runs once per round, rounds interleaved
(the first untimed); the table reports medians and each speed relative to torch.mm's.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time

CONFIGS = {  # (x, W, dy) scalings, as lowp's recipes quantize a linear's operands
    "mxfp8": ("mx32", "mx32", "mx32"),
    "block32x32": ("mx32", "block32x32", "mx32"),
    "block128": ("block128", "block128x128", "block128"),
}
FOLDABLE = ("mxfp8", "block32x32")


def torch_onednn_version(torch):
    """The oneDNN version torch reports in its build configuration ('?' when absent)."""
    m = re.search(r"MKL-DNN v([0-9.]+)", torch._C._show_config())
    return m.group(1) if m else "?"


def fold_bf16(lowp, torch, q):
    """A QTensor's rowwise copy (E4M3, mx32 or block32x32 scales) as BF16 [R, C]: the codes
    decoded to binary32 (lowp.decode, exact), times their E8M0 scales 2^(s - 127) in place
    (exact while normal), rounded to BF16 (exact: at most 4 significant bits)."""
    R, C = q.shape[-2:]
    x = lowp.decode(q.data, "e4m3")
    s = q.scale.to(torch.int32)
    # 2^(s - 127) as binary32 bits: the exponent field is s (s = 0, 2^-127, is subnormal).
    scale = torch.where(s > 0, s << 23, torch.full_like(s, 0x400000)).view(torch.float32)
    if q.scaling == "block32x32":
        scale = scale.repeat_interleave(32, dim=0)[:R]
    nb = scale.shape[-1]
    if C % 32:
        x = torch.nn.functional.pad(x, (0, nb * 32 - C))
    x.view(R, nb, 32).mul_(scale.view(R, nb, 1))
    return x[:, :C].to(torch.bfloat16)


def _check_fold(torch, lowp, q):
    want = torch.as_tensor(lowp.dequantize(q)).to(torch.bfloat16)
    got = fold_bf16(lowp, torch, q)
    if not torch.equal(got.view(torch.int16), want.view(torch.int16)):
        raise RuntimeError(f"fold of {q!r} differs from lowp.dequantize")


def _lowp_rows(torch, lowp, cfg, x, w, dy, out):
    """({gemm: f()} of lowp's kernels, {gemm: f()} of the fold route or {}) for one config."""
    y, dx, dw = out
    if cfg == "bf16":
        dyt, xt = dy.t().contiguous(), x.t().contiguous()
        return {"fwd": lambda: lowp.gemm(x, w, out=y),
                "dgrad": lambda: lowp.gemm_kn(dy, w, out=dx),
                "wgrad": lambda: lowp.gemm(dyt, xt, out=dw)}, ({}, {})
    sx, sw, sdy = CONFIGS[cfg]
    qx = lowp.quantize(x, "e4m3", sx, axis="both")
    qw = lowp.quantize(w, "e4m3", sw, axis="both")
    qdy = lowp.quantize(dy, "e4m3", sdy, axis="both")
    if sw == "mx32":
        dgrad = lambda: lowp.gemm(qdy, qw.col(), out=dx)  # noqa: E731
    else:
        dgrad = lambda: lowp.gemm_kn(qdy, qw, out=dx)  # noqa: E731
    rows = {"fwd": lambda: lowp.gemm(qx, qw, out=y), "dgrad": dgrad,
            "wgrad": lambda: lowp.gemm(qdy.col(), qx.col(), out=dw)}
    fold = _fold_rows(torch, lowp, cfg, qx, qw, qdy, out) if cfg in FOLDABLE else ({}, {})
    return rows, fold


def _fold_rows(torch, lowp, cfg, qx, qw, qdy, out):
    """The fold route's {gemm: f()}: fold both operands to BF16, then torch.mm with B as [N, K]
    (or [K, N] where W is read as stored: block32x32's dgrad); and {gemm: f()} of the folds
    alone, to show their share."""
    kn = cfg != "mxfp8"
    pairs = {"fwd": (qx, qw), "dgrad": (qdy, qw if kn else qw.col()),
             "wgrad": (qdy.col(), qx.col())}
    for a, b in pairs.values():
        _check_fold(torch, lowp, a)
        _check_fold(torch, lowp, b)
    bufs = {"fwd": out[0], "dgrad": out[1], "wgrad": out[2]}
    bufs = {gm: torch.empty(o.shape, dtype=torch.bfloat16) for gm, o in bufs.items()}

    def route(gm):
        a, b = pairs[gm]
        fb = fold_bf16(lowp, torch, b)
        return torch.mm(fold_bf16(lowp, torch, a), fb if gm == "dgrad" and kn else fb.t(),
                        out=bufs[gm])

    def folds(gm):
        a, b = pairs[gm]
        fold_bf16(lowp, torch, a), fold_bf16(lowp, torch, b)

    return ({gm: (lambda gm=gm: route(gm)) for gm in pairs},
            {gm: (lambda gm=gm: folds(gm)) for gm in pairs})


def _impls(torch, lowp, configs, m, n, k):
    """{(gemm, row name): f()} for one shape."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(torch.bfloat16)
    dy = torch.randn(m, n, generator=g).to(torch.bfloat16)
    y, dx, dw = (torch.empty(s, dtype=torch.bfloat16) for s in ((m, n), (m, k), (n, k)))
    impls = {("fwd", "torch.mm bf16"): lambda: torch.mm(x, w.t(), out=y),
             ("dgrad", "torch.mm bf16"): lambda: torch.mm(dy, w, out=dx),
             ("wgrad", "torch.mm bf16"): lambda: torch.mm(dy.t(), x, out=dw)}
    out = tuple(torch.empty(s, dtype=torch.bfloat16) for s in ((m, n), (m, k), (n, k)))
    for cfg in configs:
        rows, fold = _lowp_rows(torch, lowp, cfg, x, w, dy, out)
        impls.update({(gm, f"lowp {cfg}"): f for gm, f in rows.items()})
        impls.update({(gm, f"fold {cfg} + torch.mm"): f for gm, f in fold[0].items()})
        impls.update({(gm, f"(fold {cfg} alone)"): f for gm, f in fold[1].items()})
    return impls


def _time(impls, reps, clock=time.perf_counter):
    """Median seconds of each f, over `reps` interleaved rounds after one untimed round."""
    times = {key: [] for key in impls}
    for r in range(1 + reps):
        for key, f in impls.items():
            t0 = clock()
            f()
            if r:
                times[key].append(clock() - t0)
    return {key: statistics.median(v) for key, v in times.items()}


def _shape(s):
    try:
        m, n, k = (int(v) for v in s.split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape {s!r} is not MxNxK") from None
    if min(m, n, k) < 1:
        raise argparse.ArgumentTypeError(f"--shape {s!r}: sizes must be >= 1")
    return m, n, k


def bench_gemm(argv=None):
    p = argparse.ArgumentParser(prog="python -m lowp.bench gemm")
    p.add_argument("--shape", type=_shape, action="append", default=None)
    p.add_argument("--configs", default="bf16,mxfp8,block32x32,block128")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: the calling thread's CPU time (time.thread_time), which leaves out "
                        "the time other processes hold the core on a shared machine; --threads 1 "
                        "only (every GEMM then runs on the calling thread)")
    a = p.parse_args(argv)
    if a.clock == "cpu" and a.threads != 1:
        p.error("--clock cpu needs --threads 1 (other threads' work is not on the clock)")
    clock = time.thread_time if a.clock == "cpu" else time.perf_counter
    configs = a.configs.split(",")
    bad = [c for c in configs if c != "bf16" and c not in CONFIGS]
    if bad:
        p.error(f"--configs: unknown {bad} (known: bf16, {', '.join(CONFIGS)})")
    import torch

    from . import _numpy_api as lowp  # the public numpy API (lowp's __init__ re-exports it)

    torch.set_num_threads(a.threads)
    lowp.set_threads(a.threads)
    print(f"GEMMs of a linear's training step, {a.threads} thread(s), {a.reps} interleaved "
          f"rounds (median of {a.clock} time); peer: torch {torch.__version__} torch.mm on "
          f"BF16 (its bundled oneDNN v{torch_onednn_version(torch)}); lowp {lowp.__version__} "
          f"on {lowp.info()['cpu'].get('name', '?')}\n")
    print("| M x N x K | GEMM | implementation | median ms | x torch.mm speed |")
    print("| --- | --- | --- | ---: | ---: |")
    results = {}
    for m, n, k in a.shape or [(4096, 4096, 1024)]:
        med = _time(_impls(torch, lowp, configs, m, n, k), a.reps, clock)
        for (gm, name), t in sorted(med.items(), key=lambda kv: ("fwd", "dgrad", "wgrad")
                                    .index(kv[0][0])):
            base = med[(gm, "torch.mm bf16")]
            print(f"| {m}x{n}x{k} | {gm} | {name} | {t * 1e3:.2f} | {base / t:.2f} |")
        results[(m, n, k)] = med
    return results
