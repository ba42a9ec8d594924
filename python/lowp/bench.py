"""Benchmarks of the Python layer (a benchmark, not a test).

  python -m lowp.bench linear [--tokens 4096 --in 1024 --out 4096 --threads 1 --reps 7]

times one forward + backward of a linear layer (bfloat16 input, weight and output gradient) in
one run, interleaved round by round:

  torch bf16      torch.nn.functional.linear on bfloat16 tensors (torch's own CPU GEMMs)
  torchao mxfp8   torchao's MXFP8 training linear (mx_mm autograd function) with
                  KernelPreference.EMULATED, RCEIL scales: the path a CPU user of torchao has
  lowp mxfp8      lowp.torch.linear(x, w, config="mxfp8"): quantization and GEMMs in lowp's
                  native kernels, the weight quantized on every call (no cache)
  lowp mxfp8 checkpointed + WeightCache   the same under activation checkpointing: the
                  recomputation reuses the forward's weight copies (the one reuse a cache makes)

and prints a markdown table of medians and ratios.

  python -m lowp.bench portable [--configs mxfp8,block32x32,block128,fp8_rowwise]
                                [--portable-from OLD_PORTABLE.py ...] [--device DEV]
                                [--device-kernels]

times the same forward + backward through lowp.torch's portable path (plain torch ops, the
path of every non-CPU device) under `kernel_preference("portable")`, one row per config, against torch's
BF16 F.linear in the same interleaved rounds. `--portable-from` adds rows that run the GEMMs
of another copy of portable.py (for instance the previous commit's), so that before and after
are measured in the same run on a shared machine. `--device cuda` (or any torch device) runs
it there, synchronizing the device around each timing; `--device-kernels` adds rows with the
device kernel table enabled (`lowp.torch.use_device_kernels()`: torch._scaled_mm on CUDA), for
the configs some registered kernel serves, falling back to portable for the rest.
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

    def lowp_checkpointed(x, w, dy):
        xc = x.detach().requires_grad_()
        y = torch.utils.checkpoint.checkpoint(
            lambda t: lt.linear(t, w, None, "mxfp8", cache=cache), xc, use_reentrant=False)
        y.backward(dy)

    impls["lowp mxfp8 checkpointed + WeightCache"] = lowp_checkpointed
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


def _gemms_from(path):
    """The GEMM functions of another copy of portable.py (loaded as a module of its own)."""
    import importlib.util

    with open(path) as fh:  # lowp/torch/ops/portable.py imports `from ... import rules`
        pkg = "lowp.torch.ops" if "from ... import" in fh.read() else "lowp.torch"
    spec = importlib.util.spec_from_file_location(pkg + "._bench_portable_other", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return {n: getattr(mod, n) for n in ("gemm", "grouped_gemm", "grouped_gemm_wgrad")}


def _portable_impls(lt, configs, others, layer=None):
    """{row name: f(x, w, dy)}: lowp.torch.linear (or layer(x, w, cfg)) under
    kernel_preference("portable"), per config, with the GEMMs of this portable.py and of every
    `others` copy (swapped in for the call)."""
    from lowp.torch import portable as P

    mine = {n: getattr(P, n) for n in ("gemm", "grouped_gemm", "grouped_gemm_wgrad")}
    impls = {}
    for label, fns in [("", mine)] + [(f" [{o}]", _gemms_from(o)) for o in others]:
        for cfg in configs:
            def run(x, w, dy, cfg=cfg, fns=fns):
                for n, f in fns.items():
                    setattr(P, n, f)
                try:
                    with lt.kernel_preference("portable"):
                        (layer or (lambda x, w, c: lt.linear(x, w, None, c)))(x, w, cfg) \
                            .backward(dy)
                finally:
                    for n, f in mine.items():
                        setattr(P, n, f)
            impls[f"portable {cfg}{label}"] = run
    return impls


def _synchronize(torch, dev):
    """Wait for the device's queued work (nothing to wait for on the CPU)."""
    if dev.type != "cpu":
        torch.accelerator.synchronize(dev)


def _interleaved(impls, x, w, dy, reps, sync):
    """{name: [seconds]} of reps rounds, every implementation once per round (round 0 warms
    up)."""
    times = {name: [] for name in impls}
    for rep in range(1 + reps):
        for name, f in impls.items():
            x.grad = w.grad = None
            sync()
            t0 = time.perf_counter()
            f(x, w, dy)
            sync()
            if rep:
                times[name].append(time.perf_counter() - t0)
    return times


def _device_kernel_impls(lt, configs):
    """{row name: f(x, w, dy)}: lowp.torch.linear with the device kernel table enabled."""
    impls = {}
    for cfg in configs:
        def run(x, w, dy, cfg=cfg):
            with lt.use_device_kernels():
                lt.linear(x, w, None, cfg).backward(dy)
        impls[f"device kernels {cfg}"] = run
    return impls


def _bench_layers(torch, lt, a, g):
    """(the peer's row name, {that peer: f(x, w, dy), "layer": lowp's layer(x, w, cfg)}): the
    linear layer, or with a.groups the grouped mm over ragged groups (drawn with g)."""
    if not a.groups:
        import torch.nn.functional as F

        return "torch bf16 F.linear", {
            "torch bf16 F.linear": lambda x, w, dy: F.linear(x, w).backward(dy), "layer": None}
    sizes = torch.multinomial(torch.ones(a.groups), a.tokens, replacement=True, generator=g)
    offs = torch.bincount(sizes, minlength=a.groups).cumsum(0).to(torch.int32)

    def peer(x, w, dy):
        torch._grouped_mm(x, w.transpose(-2, -1), offs=offs.to(x.device)).backward(dy)

    def layer(x, w, cfg):
        return lt.grouped_mm(x, w.transpose(-2, -1), offs.to(x.device), cfg)

    return "torch bf16 _grouped_mm", {"torch bf16 _grouped_mm": peer, "layer": layer}


def bench_portable(argv=None):
    p = argparse.ArgumentParser(prog="python -m lowp.bench portable")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--in", dest="k", type=int, default=1024)
    p.add_argument("--out", dest="n", type=int, default=4096)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--configs", default="mxfp8,block32x32,block128,fp8_rowwise")
    p.add_argument("--portable-from", dest="others", action="append", default=[])
    p.add_argument("--device", default="cpu")
    p.add_argument("--device-kernels", action="store_true")
    p.add_argument("--groups", type=int, default=0,
                   help="G > 0: lowp.torch.grouped_mm over G ragged groups, w [G, out, in], "
                        "against torch._grouped_mm in bf16, instead of the linear layer")
    a = p.parse_args(argv)
    import torch

    import lowp.torch as lt

    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(a.tokens, a.k, generator=g).to(torch.bfloat16).requires_grad_()
    wshape = (a.groups, a.n, a.k) if a.groups else (a.n, a.k)
    w = (torch.randn(wshape, generator=g) / a.k ** 0.5).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(a.tokens, a.n, generator=g).to(torch.bfloat16)
    base_name, impls = _bench_layers(torch, lt, a, g)
    impls.update(_portable_impls(lt, a.configs.split(","), a.others, impls.pop("layer")))
    if a.device_kernels:
        impls.update(_device_kernel_impls(lt, a.configs.split(",")))
    dev = torch.device(a.device)
    x, w, dy = (x.detach().to(dev).requires_grad_(), w.detach().to(dev).requires_grad_(),
                dy.to(dev))
    times = _interleaved(impls, x, w, dy, a.reps, lambda: _synchronize(torch, dev))
    base = statistics.median(times[base_name])
    what = f"grouped mm ({a.groups} groups)" if a.groups else "linear"
    print(f"portable {what} forward+backward, {a.tokens} x {a.k} -> {a.n}, bfloat16, "
          f"{a.threads} thread(s), device {dev}, {a.reps} interleaved rounds (median, "
          "min-max)\n")
    print("| implementation | median ms | min-max ms | x torch bf16 speed |")
    print("| --- | ---: | ---: | ---: |")
    for name, v in times.items():
        m = statistics.median(v)
        print(f"| {name} | {m * 1e3:.0f} | {min(v) * 1e3:.0f}-{max(v) * 1e3:.0f} | "
              f"{base / m:.3f} |")
    return times


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    from ._bench_gemm import bench_gemm

    cmds = {"linear": bench_linear, "portable": bench_portable, "gemm": bench_gemm}
    if not argv or argv[0] not in cmds:
        print("usage: python -m lowp.bench linear|portable|gemm [options]", file=sys.stderr)
        return 2
    cmds[argv[0]](argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
