"""Training throughput of the PyTorch MoE per recipe, against the C trainer, in one run.

    python -m lowp.torch.trainer.bench --config medium --threads 1,2 --steps 3
    python -m lowp.torch.trainer.bench --config medium --threads 2 --profile all_mxfp8

For each thread count, recipes are measured in rounds: a round builds every recipe's trainer
from the same initialization, runs one untimed update of each, then --steps timed updates
stepping the recipes in turn (one update each, round robin, so that a change in the machine's
load touches all of them alike), on the same batches for every recipe; tokens/s is the median
over the timed updates of all rounds. The C trainer (`lowp bench train`, env
LOWP_CLI or build/bin/lowp) runs the same configuration, batch and thread count between the
rounds. Prints a markdown table with the ratios to torch's bf16 and to torchao_mxfp8.
--profile runs torch.profiler over --steps updates of one recipe and prints where the time
goes (operators by self CPU time). A recipe written `name@portable` (all_mxfp8@portable) runs
lowp's portable kernels, the path of every device without native ones, on the CPU:

    python -m lowp.torch.trainer.bench --config medium --threads 1 \
        --recipes bf16,all_mxfp8,all_mxfp8@portable,all_block_fp8@portable,fp8_rowwise@portable

--portable-from FILE (an older lowp/torch/ops/portable.py) adds `name@portable-from` beside
every `name@portable`: the same recipe with that file's GEMM functions, in the same rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

import lowp.torch as lt

from .model import MoEConfig, MoETransformer
from .config import TrainConfig
from .loop import Trainer, set_threads
from .data import CharData

DEFAULT = "bf16,all_mxfp8,mix,all_block_fp8,torchao_mxfp8"


def _cli() -> str | None:
    c = os.environ.get("LOWP_CLI")
    if c:
        return c
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 4))
    c = os.path.join(root, "build", "bin", "lowp")
    return c if os.path.exists(c) else None


def _trainer(recipe, mcfg, data, batch, steps):
    cfg = TrainConfig(steps=10 ** 6, batch=batch, warmup=1, eval_every=0, seed=1234)
    return Trainer(MoETransformer(mcfg, 1234), data, recipe.partition("@")[0], cfg)


_OTHER_GEMMS = {}  # --portable-from: the GEMM functions of another portable.py


def _portable_gemms_from(path) -> dict:
    """gemm, grouped_gemm and grouped_gemm_wgrad of another copy of lowp/torch/ops/portable.py,
    loaded as a module of its own beside it."""
    import importlib.util  # noqa: PLC0415

    spec = importlib.util.spec_from_file_location("lowp.torch.ops._bench_portable_from", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return {n: getattr(mod, n) for n in ("gemm", "grouped_gemm", "grouped_gemm_wgrad")}


def _step(recipe, trainer):
    """One update; a recipe named `name@portable` runs under lowp.torch.kernel_preference
    ("portable"): the portable kernels, what every device without lowp's native kernels runs,
    measured on the CPU; `name@portable-from` the same with --portable-from's GEMMs."""
    kernels = recipe.partition("@")[2] or "auto"
    if kernels != "portable-from":
        with lt.kernel_preference(kernels):
            return trainer.step()
    from lowp.torch import portable as P  # noqa: PLC0415

    mine = {n: getattr(P, n) for n in _OTHER_GEMMS}
    try:
        for n, fn in _OTHER_GEMMS.items():
            setattr(P, n, fn)
        with lt.kernel_preference("portable"):
            return trainer.step()
    finally:
        for n, fn in mine.items():
            setattr(P, n, fn)


def measure(recipes, mcfg, data, batch, steps) -> dict:
    """Tokens/s of `steps` updates per recipe, the recipes' trainers stepped in turn (one
    update each, round robin) so that a change in the machine's load falls on all of them."""
    trainers = {r: _trainer(r, mcfg, data, batch, steps) for r in recipes}
    for r, t in trainers.items():
        _step(r, t)  # untimed: first-touch allocations, weight caches
    out = {r: [] for r in recipes}
    for _ in range(steps):
        for r, t in trainers.items():
            out[r].append(_step(r, t)["tokens_per_s"])
    return out


def c_bench(cfg_name, recipes, steps, batch, threads) -> dict:
    cli = _cli()
    if cli is None:
        return {}
    c_recipes = [r for r in recipes if r not in ("torchao_mxfp8", "fp32") and "@" not in r]
    r = subprocess.run([cli, "bench", "train", "--json", "--configs", cfg_name, "--recipes",
                        ",".join(c_recipes), "--steps", str(steps), "--batch", str(batch),
                        "--threads", str(threads)], capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(f"lowp bench train failed: {r.stderr}\n")
        return {}
    out = {}
    for line in r.stdout.splitlines():
        rec = json.loads(line)
        out[rec["recipe"]] = rec
    return out


def profile(recipe, mcfg, data, batch, steps, rows) -> None:
    from torch.profiler import ProfilerActivity, profile as prof  # noqa: PLC0415

    t = _trainer(recipe, mcfg, data, batch, steps)
    t.step()
    with prof(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(steps):
            t.step()
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lowp.torch.trainer.bench")
    ap.add_argument("--config", default="medium")
    ap.add_argument("--recipes", default=DEFAULT)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--data", default=None)
    ap.add_argument("--profile", default=None, help="a recipe to profile instead")
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument("--portable-from", default=None,
                    help="another copy of lowp/torch/ops/portable.py: every name@portable "
                         "recipe also runs as name@portable-from with its GEMMs, same rounds")
    a = ap.parse_args(argv)
    data = CharData.from_file(a.data) if a.data else CharData.builtin()
    mcfg = MoEConfig.preset(a.config, data.vocab)
    recipes = a.recipes.split(",")
    if a.portable_from:
        _OTHER_GEMMS.update(_portable_gemms_from(a.portable_from))
        recipes += [r + "-from" for r in recipes if r.endswith("@portable")]
    threads = [int(x) for x in a.threads.split(",")]
    if a.profile:
        set_threads(threads[0])
        profile(a.profile, mcfg, data, a.batch, a.steps, a.rows)
        return 0
    print(f"model {a.config}: {mcfg.describe()}; batch {a.batch} x {mcfg.seq_len} tokens; "
          f"torch {torch.__version__}; {a.rounds} rounds x {a.steps} timed updates\n")
    for th in threads:
        set_threads(th)
        tps = {r: [] for r in recipes}
        c_runs = []
        t0 = time.perf_counter()
        for rnd in range(a.rounds):
            for r, v in measure(recipes, mcfg, data, a.batch, a.steps).items():
                tps[r] += v
            c_runs.append(c_bench(a.config, recipes, a.steps, a.batch, th))
        med = {r: statistics.median(v) for r, v in tps.items()}
        base, ao = med.get("bf16"), med.get("torchao_mxfp8")
        print(f"### {th} thread{'s' if th > 1 else ''} ({time.perf_counter() - t0:.0f} s)\n")
        print("| recipe | PyTorch tokens/s | vs torch bf16 | vs torchao_mxfp8 | C trainer "
              "tokens/s | PyTorch / C |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for r in recipes:
            cs = [c[r]["tokens_per_s"] for c in c_runs if r in c]
            cval = statistics.median(cs) if cs else None
            vb = f"{med[r] / base:.2f}x" if base else "-"
            va = f"{med[r] / ao:.2f}x" if ao else "-"
            cc = f"{cval:.0f}" if cval else "-"
            pc = f"{med[r] / cval:.2f}x" if cval else "-"
            print(f"| {r} | {med[r]:.0f} | {vb} | {va} | {cc} | {pc} |")
        print()
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
