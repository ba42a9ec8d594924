"""The docs/benchmarks.md table from run.py's JSON files:

    python benchmarks/torchtitan/table.py RUN.json [RUN.json ...] [--at 5,10,20]

One row per config and world size: the loss at the given steps, tokens/s per device and
TFLOPS (torchtitan's `num_flops_per_token * tps / 1e12`) averaged over the steps after the first (which carries
the start-up), and the ratio of TFLOPS to the bf16 row of the same model and world size.
"""

import argparse
import json
import statistics


def load(paths):
    """{(world size, config): (steps, mean tps, mean tflops)} over run.py's JSON files."""
    out = {}
    for path in paths:
        with open(path) as f:
            d = json.load(f)
        for name, r in d["runs"].items():
            steps = {int(k): v for k, v in r["steps"].items()}
            later = [steps[s] for s in sorted(steps) if s > min(steps)] or list(steps.values())
            out[(d["world_size"], name)] = (steps,
                                            statistics.mean(x["tps"] for x in later),
                                            statistics.mean(x["tflops"] for x in later))
    return out


def rows(stats, at):
    """Markdown rows, by world size, then in the order of the files; the ratio is to the bf16 config of the
    same model and world size."""
    out = []
    for (ws, name), (steps, tps, tfl) in sorted(stats.items(), key=lambda kv: kv[0][0]):
        base = next((v[2] for (w, n), v in stats.items() if w == ws and n.endswith("_bf16")
                     and name.startswith(n[:-len("bf16")])), None)
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
    lines += rows(load(a.runs), at)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
