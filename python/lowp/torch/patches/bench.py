"""Benchmark: torchao's own MXFP8 training recipe, patched onto lowp against unpatched.

    python -m lowp.torch.patches.bench [--tokens 4096] [--in 1024] [--out 4096] [--iters 5]
                                       [--threads 1]

An `nn.Linear(in, out, bias=False)` in bfloat16 converted with torchao's `quantize_` and
`MXFP8TrainingOpConfig.from_recipe(MXFP8_EMULATED_RCEIL)`; one step = forward + backward of a
[tokens, in] bfloat16 input with a fixed output gradient, the weight touched in place before
each step (as an optimizer step does), so every step quantizes the weight afresh. The
unpatched and the patched model run alternately in the same process (patch_torchao /
unpatch_torchao around each patched step), after one warm-up step each; the table gives each
side's median and the ratio of the medians. AUTO (`MXFP8_RCEIL`) cannot run unpatched on a
CPU (torchao asserts: Triton/SM100); the patched AUTO recipe runs the same lowp kernels and is
timed as a third row.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings


def _model(recipe, w):
    import torch
    from torch import nn
    from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig
    from torchao.quantization import quantize_
    m = nn.Linear(w.shape[1], w.shape[0], bias=False).to(torch.bfloat16)
    with torch.no_grad():
        m.weight.copy_(w)
    quantize_(m, MXFP8TrainingOpConfig.from_recipe(recipe))
    return m


def _step(m, x, dy):
    import torch
    with torch.no_grad():  # as after an optimizer step: the weight's copies are stale
        m.weight.add_(0)
    m.weight.grad = None
    xx = x.detach().requires_grad_()
    y = m(xx)
    y.backward(dy)
    return y


def _print_table(a, med, lops) -> None:
    import torch
    print(f"torchao MXFP8 linear training step: {a.tokens} tokens, {a.fin} -> {a.fout}, bf16, "
          f"forward+backward, {a.threads} thread(s), {a.iters} interleaved rounds, medians")
    print(f"torch {torch.__version__.split('+')[0]} / torchao "
          f"{__import__('torchao').__version__}, lowp native: {lops.native_available()}")
    print("| path | recipe | median s | speed-up vs unpatched |")
    print("| --- | --- | --- | --- |")
    print(f"| torchao unpatched (emulated) | MXFP8_EMULATED_RCEIL | {med['torchao']:.3f} "
          "| 1.00x |")
    print(f"| patched (lowp) | MXFP8_EMULATED_RCEIL | {med['lowp']:.3f} | "
          f"{med['torchao'] / med['lowp']:.2f}x |")
    print(f"| patched (lowp) | MXFP8_RCEIL (AUTO) | {med['lowp_auto']:.3f} | "
          f"{med['torchao'] / med['lowp_auto']:.2f}x |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lowp.torch.patches.bench",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--in", dest="fin", type=int, default=1024)
    ap.add_argument("--out", dest="fout", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    flags = {"tokens": "--tokens", "fin": "--in", "fout": "--out", "iters": "--iters",
             "threads": "--threads"}
    for name, flag in flags.items():
        if getattr(a, name) < 1:
            ap.error(f"{flag} ({getattr(a, name)}) must be >= 1")
    warnings.filterwarnings("ignore")
    import torch
    from .. import ops as _lops
    from . import torchao_patch as _tp
    from torchao.prototype.moe_training.config import MXFP8TrainingRecipe as R
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(a.fout, a.fin, generator=g) * a.fin ** -0.5).to(torch.bfloat16)
    x = torch.randn(a.tokens, a.fin, generator=g).to(torch.bfloat16)
    dy = torch.randn(a.tokens, a.fout, generator=g).to(torch.bfloat16)
    _tp.unpatch_torchao()
    ao = _model(R.MXFP8_EMULATED_RCEIL, w)
    lp = _model(R.MXFP8_EMULATED_RCEIL, w)
    la = _model(R.MXFP8_RCEIL, w)
    times = {"torchao": [], "lowp": [], "lowp_auto": []}

    def timed(label, m, patched):
        if patched:
            _tp.patch_torchao()
        try:
            t0 = time.perf_counter()
            _step(m, x, dy)
            dt = time.perf_counter() - t0
        finally:
            _tp.unpatch_torchao()
        times[label].append(dt)

    for i in range(a.iters + 1):  # the first round is the warm-up
        timed("torchao", ao, False)
        timed("lowp", lp, True)
        timed("lowp_auto", la, True)
        if i == 0:
            for v in times.values():
                v.clear()
    _print_table(a, {k: statistics.median(v) for k, v in times.items()}, _lops)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
