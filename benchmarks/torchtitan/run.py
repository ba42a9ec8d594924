"""Train torchtitan configs one after another in this process and write their per-step metrics.

    torchrun --nproc_per_node=N benchmarks/torchtitan/run.py --out RUN.json \\
        --configs debug_bf16,debug_mix [--module benchmarks.torchtitan] [-- torchtitan options]

Each config is built by torchtitan's own ``ConfigManager`` (``--module``/``--config`` and the
options after ``--``), trained by its ``Trainer``, and the process group is torn down before
the next. Rank 0 writes ``{"world_size": N, "runs": {config: {"steps": {step: {"loss",
"tps", "tflops"}}, "num_flops_per_token": F}}}``: loss is torchtitan's global average loss,
tps its tokens per second per device, tflops its ``num_flops_per_token * tps / 1e12``.
Without torchrun it runs as one rank (RANK, WORLD_SIZE, MASTER_ADDR/PORT set here). With two
ranks give one config per launch: a second Trainer in the same processes fails in FSDP2
(its parameters are found on the first Trainer's device mesh; torchtitan 0.3.0).
"""

import argparse
import json
import os
import sys


class _Recorder:
    """A torchtitan metrics logger that keeps what ``MetricsProcessor.log`` passes."""

    def __init__(self, inner):
        self.inner = inner  # torchtitan's own logger, still called
        self.steps = {}

    def log(self, metrics, step):
        self.inner.log(metrics, step)
        if "loss_metrics/global_avg_loss" in metrics:
            self.steps[int(step)] = {"loss": float(metrics["loss_metrics/global_avg_loss"]),
                                     "tps": float(metrics["throughput(tps)"]),
                                     "tflops": float(metrics["tflops"])}

    def close(self):
        self.inner.close()


def _single_process_env():
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                 ("LOCAL_WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                 ("MASTER_PORT", str(29500 + os.getpid() % 1000))):
        os.environ.setdefault(k, v)


def run_config(module, name, overrides):
    """Train one config; returns its recorded metrics."""
    import importlib
    import torch.distributed as dist
    from torchtitan.config import ConfigManager
    # torchtitan swallows an ImportError of `module.config_registry`: show it here
    importlib.import_module(module + ".config_registry")
    config = ConfigManager().parse_args(["--module", module, "--config", name, *overrides])
    trainer = config.build()
    rec = _Recorder(trainer.metrics_processor.logger)
    trainer.metrics_processor.logger = rec
    try:
        trainer.train()
        flops = trainer.metrics_processor.num_flops_per_token
    finally:
        trainer.close()
        if dist.is_initialized():
            dist.destroy_process_group()
    return {"steps": rec.steps, "num_flops_per_token": flops}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", required=True, help="comma-separated registry names")
    ap.add_argument("--module", default="benchmarks.torchtitan")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    _single_process_env()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for p in (root, os.path.join(root, "python")):
        if p not in sys.path:
            sys.path.insert(0, p)
    runs = {}
    for name in a.configs.split(","):
        runs[name] = run_config(a.module, name, extra)
    if os.environ.get("RANK", "0") == "0":
        with open(a.out, "w") as f:
            json.dump({"world_size": int(os.environ["WORLD_SIZE"]), "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
