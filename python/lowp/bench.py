"""Benchmarks of the Python layer (a benchmark, not a test).

  python -m lowp.bench linear [--tokens 4096 --in 1024 --out 4096 --threads 1 --reps 7]

times one forward + backward of a linear layer (bfloat16 input, weight and output gradient) in
one run, interleaved round by round:

  torch bf16      torch.nn.functional.linear on bfloat16 tensors (torch's own CPU GEMMs)
  torchao mxfp8   torchao's MXFP8 training linear (mx_mm autograd function) with
                  KernelPreference.EMULATED, RCEIL scales: the path a CPU user of torchao has
  lowp mxfp8      lowp.torch.linear(x, w, config="mxfp8"): quantization and GEMMs in lowp's
                  native kernels, the weight quantized on every call (no cache)
  lowp mxfp8 +cache   the same with a WeightCache (the weight quantized once: a micro-batch
                  after the first)

and prints a markdown table of medians and ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def _linear_impls(torch, F, lt, args):
    impls = {}

    def torch_bf16(x, w, dy):
        y = F.linear(x, w)
        y.backward(dy)

    impls["torch bf16 F.linear"] = torch_bf16
    try:
        from torchao.prototype.moe_training.mxfp8_linear import _to_mxfp8_then_scaled_mm
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

        def torchao_emulated(x, w, dy):
            y = _to_mxfp8_then_scaled_mm(x, w, KernelPreference.EMULATED,
                                         ScaleCalculationMode.RCEIL)
            y.backward(dy)

        impls["torchao mxfp8 (emulated)"] = torchao_emulated
    except Exception as e:  # pragma: no cover - torchao absent or moved
        print(f"torchao MXFP8 linear unavailable: {e}", file=sys.stderr)

    def lowp_mxfp8(x, w, dy):
        y = lt.linear(x, w, None, "mxfp8")
        y.backward(dy)

    impls["lowp mxfp8"] = lowp_mxfp8
    cache = lt.WeightCache()

    def lowp_cached(x, w, dy):
        y = lt.linear(x, w, None, "mxfp8", cache=cache)
        y.backward(dy)

    impls["lowp mxfp8 + WeightCache"] = lowp_cached
    return impls


def bench_linear(argv=None):
    p = argparse.ArgumentParser(prog="python -m lowp.bench linear")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--in", dest="k", type=int, default=1024)
    p.add_argument("--out", dest="n", type=int, default=4096)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--warmup", type=int, default=1)
    a = p.parse_args(argv)
    import torch
    import torch.nn.functional as F

    import lowp.torch as lt

    from ._numpy_api import set_threads

    torch.set_num_threads(a.threads)
    set_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(a.tokens, a.k, generator=g).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(a.n, a.k, generator=g) / a.k ** 0.5).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(a.tokens, a.n, generator=g).to(torch.bfloat16)
    impls = _linear_impls(torch, F, lt, a)
    times = {name: [] for name in impls}
    lt.reset_stats()
    for rep in range(a.warmup + a.reps):
        for name, f in impls.items():  # interleaved: every implementation once per round
            x.grad = w.grad = None
            t0 = time.perf_counter()
            f(x, w, dy)
            dt = time.perf_counter() - t0
            if rep >= a.warmup:
                times[name].append(dt)
    st = lt.stats()
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["torch bf16 F.linear"]
    emu = med.get("torchao mxfp8 (emulated)")
    print(f"linear forward+backward, {a.tokens} tokens x {a.k} in -> {a.n} out, bfloat16, "
          f"{a.threads} thread(s), {a.reps} interleaved rounds (median)\n")
    print("| implementation | median ms | x torch bf16 speed | x torchao emulated speed |")
    print("| --- | ---: | ---: | ---: |")
    for name, m in med.items():
        r_emu = f"{emu / m:.2f}" if emu else "-"
        print(f"| {name} | {m * 1e3:.1f} | {base / m:.2f} | {r_emu} |")
    print(f"\nlowp.torch path counters: native {st['native']}, portable {st['portable']}")
    return med


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("linear",):
        print("usage: python -m lowp.bench linear [options]", file=sys.stderr)
        return 2
    bench_linear(argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
