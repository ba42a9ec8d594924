"""The docs/benchmarks.md table from run.py's JSON files (one per model and world size):

    python benchmarks/torchtitan/table.py RUN.json [RUN.json ...] [--at 5,10,20]

One row per config: the loss at the given steps, tokens/s per device and TFLOPS (torchtitan's
`num_flops_per_token * tps / 1e12`) averaged over the steps after the first (which carries
the start-up), and the ratio of TFLOPS to the bf16 row of the same file ("all figures from one
run": each file is one process group training every config in turn).
"""

import argparse
import json
import statistics


def rows(path, at):
    """Markdown rows of one run file."""
    with open(path) as f:
        d = json.load(f)
    ws, runs = d["world_size"], d["runs"]
    stats = {}
    for name, r in runs.items():
        steps = {int(k): v for k, v in r["steps"].items()}
        later = [steps[s] for s in sorted(steps) if s > min(steps)] or list(steps.values())
        stats[name] = (steps, statistics.mean(x["tps"] for x in later),
                       statistics.mean(x["tflops"] for x in later))
    base = next((v[2] for k, v in stats.items() if k.endswith("_bf16")), None)
    out = []
    for name, (steps, tps, tfl) in stats.items():
        losses = " | ".join("%.4f" % steps[s]["loss"] if s in steps else "-" for s in at)
        ratio = "%.2f" % (tfl / base) if base else "-"
        out.append(f"| {name} | {ws} | {losses} | {tps:,.0f} | {tfl:.4f} | {ratio} |")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--at", default="5,10,20")
    a = ap.parse_args(argv)
    at = [int(s) for s in a.at.split(",")]
    head = ("| config | processes | " + " | ".join(f"loss@{s}" for s in at) +
            " | tokens/s per process | TFLOPS | ratio to bf16 |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for p in a.runs:
        lines += rows(p, at)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
