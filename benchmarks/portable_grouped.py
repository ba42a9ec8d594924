"""The portable grouped GEMMs alone (issue 35.1): lowp.torch.portable's grouped_gemm (split-M)
and grouped_gemm_wgrad (split-K) on quantized operands, without quantization or autograd, in
thread CPU time, interleaved rounds (medians, min-max), against the same functions of another
portable.py (--portable-from) and with split-M's single route forced on the CPU:

    OMP_NUM_THREADS=1 PYTHONPATH=python .venv/bin/python benchmarks/portable_grouped.py \\
        --portable-from /tmp/portable_old.py

Defaults: the MoE `medium` expert shapes, 4096 routed tokens x 384 -> 512 over 8 ragged groups.
"""

import argparse
import importlib.util
import statistics
import sys
import time

import torch

from lowp.torch import portable as P

KINDS = (("mx32", "mx32"), ("block128", "block128x128"), ("row", "row"))


def _load(path):
    """Another copy of lowp/torch/ops/portable.py, as a module of its own beside it."""
    spec = importlib.util.spec_from_file_location("lowp.torch.ops._bench_grouped_from", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _cases(a, g, kind, bkind):
    """(split-M arguments, split-K arguments) of one pair of kinds, E4M3."""
    sizes = torch.multinomial(torch.ones(a.groups), a.tokens, replacement=True, generator=g)
    offs = torch.bincount(sizes, minlength=a.groups).cumsum(0).tolist()
    x = torch.randn(a.tokens, a.k, generator=g)
    w = torch.randn(a.groups, a.n, a.k, generator=g)
    dy = torch.randn(a.tokens, a.n, generator=g)
    qa, _ = P.quantize(x, "e4m3", kind, axis="row")
    qb = [P.quantize(w[i], "e4m3", bkind, axis="row")[0] for i in range(a.groups)]
    if kind in P.TOKEN_BLOCK_KINDS:
        qa2, qb2 = (P.quantize_grouped(t, offs, "e4m3", kind) for t in (dy, x))
    else:
        qa2, qb2 = (P.quantize(t, "e4m3", kind, axis="col")[1] for t in (dy, x))
    return (qa, qb, offs), (qa2, qb2, offs)


def _one_call_split_m(mod, m):
    """mod.grouped_gemm with split-M's single route forced (the CPU keeps the loop)."""
    keep = set(mod._SPLIT_M_LOOP_DEVICES)
    mod._SPLIT_M_LOOP_DEVICES.clear()
    try:
        return mod.grouped_gemm(*m)
    finally:
        mod._SPLIT_M_LOOP_DEVICES.update(keep)


def _rows(mods, m, k):
    """{row name: f()} for every module: split-M (and forced single), split-K."""
    rows = {}
    for label, mod in mods.items():
        rows[f"split-M {label}"] = lambda mod=mod: mod.grouped_gemm(*m)
        if hasattr(mod, "_SPLIT_M_LOOP_DEVICES"):
            rows[f"split-M {label}, single route"] = lambda mod=mod: _one_call_split_m(mod, m)
        rows[f"split-K {label}"] = lambda mod=mod: mod.grouped_gemm_wgrad(*k)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(prog="benchmarks/portable_grouped.py")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--in", dest="k", type=int, default=384)
    ap.add_argument("--out", dest="n", type=int, default=512)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--portable-from", dest="other", default=None)
    a = ap.parse_args(argv)
    mods = {"this": P}
    if a.other:
        mods["from"] = _load(a.other)
    g = torch.Generator().manual_seed(0)
    print(f"portable grouped GEMMs, {a.tokens} tokens x {a.k} -> {a.n}, {a.groups} groups, "
          f"{torch.get_num_threads()} thread(s), thread CPU ms, {a.reps} interleaved rounds\n")
    print("| pair | implementation | median ms | min-max ms |")
    print("| --- | --- | ---: | ---: |")
    for kind, bkind in KINDS:
        rows = _rows(mods, *_cases(a, g, kind, bkind))
        times = {name: [] for name in rows}
        for rep in range(1 + a.reps):  # round 0 warms up
            for name, f in rows.items():
                t0 = time.thread_time()
                f()
                if rep:
                    times[name].append(time.thread_time() - t0)
        for name, v in times.items():
            print(f"| {kind} x {bkind} | {name} | {statistics.median(v) * 1e3:.1f} | "
                  f"{min(v) * 1e3:.1f}-{max(v) * 1e3:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
