"""``python -m lowp.torch.trainer``: the command. Its options (the C CLI's rules), the run's
setup from them or from a checkpoint, the JSON-lines log and the progress line, one run or a
compare run of several recipes, and the report from earlier logs.

    python -m lowp.torch.trainer --recipe all_mxfp8 --config small --data input.txt --steps 1000
    python -m lowp.torch.trainer --recipes bf16,all_mxfp8,mix,torchao_mxfp8 --out out/cmp
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import tempfile
import time

import torch

from .checkpoint import read_checkpoint, write_atomic
from .config import RECIPES, TrainConfig
from .data import CharData
from .loop import Trainer, sample_text, set_threads
from .model import MoEConfig, MoETransformer
from .report import Run, table, write_report

__all__ = ["OPTIONS", "Progress", "main"]


def _fmt_dur(s: float) -> str:
    if not (s >= 0) or s > 1e7:
        return "?"
    t = int(s + 0.5)
    return f"{t // 3600}h{t // 60 % 60:02d}m" if t >= 3600 else (
        f"{t // 60}m{t % 60:02d}s" if t >= 60 else f"{t}s")


class Progress:
    """The callback: JSON-lines log records and the progress line on stderr."""

    def __init__(self, log, every: int, label: str | None = None, trainer=None,
                 checkpoint: str | None = None, checkpoint_every: int = 0):
        self.log, self.every, self.label = log, max(every, 1), label
        self.tty = sys.stderr.isatty()
        self.trainer, self.checkpoint, self.checkpoint_every = trainer, checkpoint, checkpoint_every
        self.last_saved = -1
        self.save_error: str | None = None
        self.steps, self.val, self.tps = [], [], []
        self.last_loss = self.last_val = math.nan
        self.skipped = 0

    def __call__(self, r: dict) -> bool:
        self.last_loss = r["loss"]
        self.skipped += r["skipped"]
        self.tps.append(r["tokens_per_s"])
        if r["evaluated"]:
            self.last_val = r["val_loss"]
            self.steps.append(r["step"])
            self.val.append(r["val_loss"])
        if self.log:
            rec = {"recipe": self.label} if self.label else {}
            rec["step"] = r["step"]
            for k in ("loss", "aux_loss", "lr", "grad_norm", "tokens_per_s", "step_s",
                      "elapsed_s"):
                rec[k] = r[k] if math.isfinite(r[k]) else None
            if r["evaluated"]:
                rec["val_loss"] = r["val_loss"] if math.isfinite(r["val_loss"]) else None
            if r["skipped"]:
                rec["skipped"] = True
            self.log.write(json.dumps(rec) + "\n")
            self.log.flush()
        last = r["step"] == r["steps"]
        if self.tty or r["evaluated"] or last or r["step"] % self.every == 0:
            val = f" | val {r['val_loss']:.4f}" if r["evaluated"] else ""
            lab = f"{self.label} | " if self.label else ""
            line = (f"{lab}step {r['step']}/{r['steps']} | loss {r['loss']:.4f}{val} | lr "
                    f"{r['lr']:.2e} | {r['tokens_per_s']:.0f} tok/s | ETA {_fmt_dur(r['eta_s'])}")
            if self.tty:
                sys.stderr.write("\r" + line + "\x1b[K" + ("\n" if r["evaluated"] or last else ""))
            else:
                sys.stderr.write(line + "\n")
            sys.stderr.flush()
        if self.checkpoint and self.checkpoint_every > 0 and r["step"] % self.checkpoint_every == 0:
            return not self.save(r["step"])
        return False

    def save(self, step: int) -> bool:
        """Saves the checkpoint; on failure keeps the reason in ``save_error`` (one line: the
        previous checkpoint is kept, no temporary file is left) and returns False."""
        try:
            self.trainer.save(self.checkpoint)
        except OSError as e:
            if self.tty:
                sys.stderr.write("\n")
            self.save_error = (f"cannot save the checkpoint {self.checkpoint} at step {step} "
                               f"({e.strerror or e}); the previous checkpoint is kept")
            return False
        self.last_saved = step
        return True


_I32_MAX = 2 ** 31 - 1


def _i32(lo: int = 0, hi: int = _I32_MAX):
    """An integer option in [lo, hi] (the C CLI's LOWP_CLI_I32)."""
    def parse(v: str) -> int:
        try:
            x = int(v, 10)
        except ValueError:
            x = None
        if x is None or not lo <= x <= hi:
            raise argparse.ArgumentTypeError(f"'{v}' is not an integer from {lo} to {hi}")
        return x
    return parse


def _u64(v: str) -> int:
    """An unsigned 64-bit option (LOWP_CLI_U64)."""
    try:
        x = int(v, 10)
    except ValueError:
        x = -1
    if not 0 <= x < 2 ** 64 or v.strip() != v or v.startswith(("+", "-")):
        raise argparse.ArgumentTypeError(f"'{v}' is not an unsigned 64-bit integer")
    return x


def _fnonneg(v: str) -> float:
    """A float option, finite and >= 0 (LOWP_CLI_FLOAT with lo 0)."""
    try:
        x = float(v)
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and x >= 0):
        raise argparse.ArgumentTypeError(f"'{v}' is not a finite number >= 0")
    return x


#: The rules of the command's valued options: the C CLI's (tools/cli_train.c OPTS), one entry
#: per option: (name, parse, help). Range rules between options are TrainConfig.check's.
OPTIONS = (
    ("steps", _i32(), "optimizer updates, the schedule's length (default 200)"),
    ("stop-at", _i32(), "stop after update N (the schedule still spans --steps)"),
    ("batch", _i32(), "sequences per micro-batch (default 8)"),
    ("accum", _i32(), "micro-batches per update (default 1)"),
    ("seq-len", _i32(), "tokens per sequence (default: the configuration's)"),
    ("lr", _fnonneg, "peak learning rate (default 3e-3)"),
    ("min-lr", _fnonneg, "final learning rate (default lr / 10)"),
    ("warmup", _i32(), "updates of linear warm-up (default steps / 10)"),
    ("weight-decay", _fnonneg, "AdamW decoupled weight decay on matrices (default 0.1)"),
    ("beta1", _fnonneg, "AdamW beta1 (default 0.9)"),
    ("beta2", _fnonneg, "AdamW beta2 (default 0.95)"),
    ("clip", _fnonneg, "global gradient-norm clipping, 0 off (default 1)"),
    ("eval-every", _i32(), "validate every N updates and after the last (default "
                           "steps / 10; compare: steps / 20)"),
    ("eval-batches", _i32(), "validation batches per evaluation (default 8)"),
    ("seed", _u64, "initialization, data order and dropout (default 1234)"),
    ("threads", _i32(0, 256), "torch and lowp threads (0: torch's default)"),
    ("log", str, "JSON lines: step, loss, lr, grad_norm, tokens_per_s, val_loss..."),
    ("checkpoint", str, "save a checkpoint there at the end"),
    ("checkpoint-every", _i32(), "and every N updates"),
    ("resume", str, "continue from a checkpoint (bit for bit); unset options are taken "
                    "from it"),
    ("sample", _i32(), "print N sampled characters at the end (default 200; compare: 0)"),
    ("temperature", _fnonneg, "sampling temperature (default 0.8; 0: greedy)"),
    ("sample-top-k", _i32(), "sample from the K most likely (default 0: all)"),
    ("prompt", str, "start the sample with TEXT"),
    ("progress-every", _i32(), "without a terminal, a progress line every N updates"),
    ("dim", _i32(), None), ("layers", _i32(), None), ("heads", _i32(), None),
    ("experts", _i32(), None), ("top-k", _i32(), None), ("expert-hidden", _i32(), None),
    ("shared-hidden", _i32(), None), ("dropout", _fnonneg, None),
    ("aux-loss-coef", _fnonneg, "override the configuration"))


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line on stderr, exit status 2 (as `lowp train`)."""

    def error(self, message):
        self.exit(2, f"lowp.torch.trainer: {message}\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m lowp.torch.trainer",
        description="Train the MoE transformer in PyTorch with a lowp recipe on a text file, "
                    "character by character (the first 90%% of the bytes train, the last 10%% "
                    "validate). With --recipes, compare several recipes from the same "
                    "initialization on the same batches and write a report.",
        epilog="Recipes: " + ", ".join(RECIPES) + ".")
    a = p.add_argument
    a("--recipe", help="one recipe (default bf16)")
    a("--recipes", help="comma-separated recipes to compare (compare mode)")
    a("--out", help="compare mode: the report's directory (default out/torch_compare)")
    a("--config", help="tiny, small or medium (default tiny)")
    a("--data", help="any text file (default: lowp's built-in corpus)")
    for name, typ, what in OPTIONS:
        a("--" + name, type=typ, default=None, help=what)
    a("--report-from", help="compare mode without training: build the report from the "
                            "--log files (comma-separated) of earlier runs")
    a("--activation-checkpoint", action="store_true",
      help="recompute layer activations in the backward")
    return p


_OVERRIDES = ("dim", "layers", "heads", "experts", "top_k", "expert_hidden", "shared_hidden",
              "dropout", "aux_loss_coef", "seq_len")


def _setup(args, ck: dict | None):
    try:
        data = CharData.from_file(args.data) if args.data else CharData.builtin()
    except OSError as e:
        raise ValueError(f"--data {args.data}: {e.strerror or e}") from None
    if ck is not None and ck["data_hash"] != data.hash:
        raise ValueError(f"--resume: the checkpoint was trained on other data "
                         f"({ck['data_name']}); this run's data is {data.name}: pass the same "
                         "--data")
    overrides = {k: getattr(args, k) for k in _OVERRIDES if getattr(args, k) is not None}
    if ck is not None and args.config is None and not overrides:
        mcfg, cname = MoEConfig(**ck["config"]), "from checkpoint"
    else:
        cname = args.config or "tiny"
        mcfg = MoEConfig.preset(cname, data.vocab, **overrides)
    tc = TrainConfig(**ck["train"]) if ck is not None else TrainConfig()
    tc.seq_len = mcfg.seq_len
    for k in ("steps", "batch", "accum", "lr", "weight_decay", "beta1", "beta2", "clip",
              "eval_batches", "seed"):
        if getattr(args, k) is not None:
            setattr(tc, k, getattr(args, k))
    if args.min_lr is not None:
        tc.min_lr = args.min_lr
    elif ck is None or args.lr is not None:
        tc.min_lr = tc.lr / 10
    if args.warmup is not None:
        tc.warmup = args.warmup
    elif ck is None:
        tc.warmup = tc.steps // 10
    if args.eval_every is not None:
        tc.eval_every = args.eval_every
    elif ck is None:
        tc.eval_every = tc.steps // (20 if args.recipes else 10) or 1
    tc.threads = args.threads or 0
    tc.activation_checkpoint = args.activation_checkpoint
    tc.check()
    _check_memory(mcfg, tc)
    return data, mcfg, cname, tc


def _check_memory(mcfg: MoEConfig, tc: TrainConfig) -> None:
    """Refuses a micro-batch whose activations cannot fit this machine's memory: a lower
    bound (per token and layer 10 x dim floats kept for the backward, and the logits),
    against the physical memory, so that an enormous --batch ends in one line, not in an
    allocation failure or the out-of-memory killer after the model is built."""
    floats = tc.batch * tc.seq_len * (mcfg.layers * 10 * mcfg.dim + mcfg.vocab)
    try:
        phys = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return
    if phys > 0 and 4 * floats > phys:
        raise ValueError(f"--batch {tc.batch} x --seq-len {tc.seq_len}: a micro-batch needs "
                         f"at least {4 * floats / 2 ** 30:.3g} GiB of activations, more than "
                         f"this machine's {phys / 2 ** 30:.3g} GiB")


def _check_writable(path: str) -> None:
    """A path the checkpoint can be written to (as `lowp train`): not a directory, and a
    temporary file can be created and removed beside it; checked before the first update."""
    if os.path.isdir(path):
        raise ValueError(f"--checkpoint {path}: is a directory")
    try:
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".",
                                   dir=os.path.dirname(os.path.abspath(path)))
    except OSError as e:
        raise ValueError(f"--checkpoint {path}: cannot write there: {e.strerror or e}") from None
    os.close(fd)
    os.unlink(tmp)


def _open_log(path: str, step0: int | None):
    """The --log file. A resumed run (step0: its step) keeps the records of the steps up to
    the checkpoint's and drops later ones and partial lines (written by a run killed after
    its last checkpoint), so that no step is logged twice; the kept lines are rewritten
    atomically, then appended to."""
    try:
        if step0 is None or not os.path.exists(path):
            return open(path, "w")
        keep = []
        with open(path, "rb") as f:
            for line in f.read().decode("utf-8", "replace").splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(rec, dict) or not isinstance(rec.get("step"), int) or \
                        rec["step"] <= step0:
                    keep.append(line + "\n")
        write_atomic(path, "".join(keep).encode())
        return open(path, "a")
    except OSError as e:
        raise ValueError(f"cannot open --log {path}: {e.strerror or e}") from None


def _train(args) -> int:
    ck = read_checkpoint(args.resume) if args.resume else None
    data, mcfg, cname, tc = _setup(args, ck)
    recipe = args.recipe or (ck["recipe"] if ck else "bf16")
    if recipe not in RECIPES:
        raise ValueError(f"--recipe: unknown recipe {recipe!r} (one of {', '.join(RECIPES)})")
    if args.checkpoint_every and not args.checkpoint:
        raise ValueError("--checkpoint-every needs --checkpoint PATH")
    if args.checkpoint:
        _check_writable(args.checkpoint)
    sample_n = 200 if args.sample is None else args.sample
    if args.prompt and sample_n > 0:
        data.encode(args.prompt)  # refuse a prompt the vocabulary cannot spell, now
    model_seed = ck["model_seed"] if ck is not None and args.seed is None else tc.seed
    model = MoETransformer(mcfg, model_seed)
    t = Trainer(model, data, recipe, tc, model_seed)
    if ck is not None:
        t.load(args.resume, ck)
    until = args.stop_at if args.stop_at and args.stop_at < tc.steps else tc.steps
    sys.stderr.write(f"lowp.torch.trainer: recipe {recipe} ({t.wrapped})\n  model {cname}: "
                     f"{mcfg.describe()}\n  data {data.describe()}\n")
    if ck is not None:
        sys.stderr.write(f"  resuming from {args.resume} at step {t.step_n} of {tc.steps}\n")
    log = _open_log(args.log, t.step_n if ck else None) if args.log else None
    try:
        every = args.progress_every or (tc.steps // 20 if tc.steps >= 20 else 1)
        prog = Progress(log, every, None, t, args.checkpoint, args.checkpoint_every or 0)
        step0, t_run = t.step_n, time.perf_counter()
        t.run(until, prog)
    finally:
        if log:
            log.close()
    if args.checkpoint and prog.save_error is None and prog.last_saved != t.step_n:
        prog.save(t.step_n)
    if prog.save_error is not None:
        sys.stderr.write(f"lowp.torch.trainer: {prog.save_error}\n")
        return 1
    secs = time.perf_counter() - t_run
    if t.step_n > step0:
        line = f"trained {recipe}: step {t.step_n}/{tc.steps}, loss {prog.last_loss:.4f}"
        if math.isfinite(prog.last_val):
            line += f", val_loss {prog.last_val:.4f}"
        line += f", {secs:.1f} s"
        if prog.skipped:
            line += f", {prog.skipped} updates skipped (non-finite gradient)"
        print(line)
    else:
        print(f"nothing to train: the checkpoint is at step {t.step_n} of {tc.steps}")
    if args.checkpoint:
        print(f"checkpoint: {args.checkpoint}")
    if t.step_n > step0 and not math.isfinite(prog.last_loss):
        sys.stderr.write(f"lowp.torch.trainer: the loss is {prog.last_loss} at step {t.step_n}: "
                         "training diverged\n")
        return 1
    if sample_n > 0:
        temp = 0.8 if args.temperature is None else args.temperature
        text = sample_text(model, data, sample_n, temp, args.sample_top_k or 0, tc.seed,
                           args.prompt)
        print(f"--- sample (temperature {temp:g}) ---\n{args.prompt or ''}{text}")
    return 0


def _compare(args) -> int:
    for opt in ("recipe", "checkpoint", "resume", "stop_at"):
        if getattr(args, opt) is not None:
            raise ValueError(f"--{opt.replace('_', '-')} does not apply to compare mode")
    names = [r for r in args.recipes.split(",")]
    for r in names:
        if r not in RECIPES:
            raise ValueError(f"--recipes: unknown recipe {r!r} (one of {', '.join(RECIPES)})")
    data, mcfg, cname, tc = _setup(args, None)
    out = args.out or "out/torch_compare"
    sys.stderr.write(f"lowp.torch.trainer compare: {len(names)} recipes, {tc.steps} updates each\n"
                     f"  model {cname}: {mcfg.describe()}\n  data {data.describe()}\n")
    log = _open_log(args.log, None) if args.log else None
    runs = []
    try:
        for i, name in enumerate(names):
            model = MoETransformer(mcfg, tc.seed)
            t = Trainer(model, data, name, dataclasses.replace(tc), tc.seed)
            sys.stderr.write(f"[{i + 1}/{len(names)}] {name}: {t.wrapped}\n")
            every = args.progress_every or (tc.steps // 10 if tc.steps >= 10 else 1)
            prog = Progress(log, every, name)
            t0 = time.perf_counter()
            t.run(0, prog)
            tps = statistics.median(prog.tps)
            runs.append(Run(name, prog.steps, prog.val, prog.last_loss, tps,
                            model.flops_per_token(tc.seq_len) * tps / 1e9,
                            time.perf_counter() - t0, prog.skipped, t.wrapped))
    finally:
        if log:
            log.close()
    settings = {
        "model": f"{cname}: {mcfg.describe()}", "data": data.describe(),
        "updates": f"{tc.steps} (warm-up {tc.warmup}, lr {tc.lr:.3g} -> {tc.min_lr:.3g} cosine)",
        "tokens per update": f"{tc.batch} x {tc.seq_len} x {tc.accum} (batch x sequence x "
                             "accumulation)",
        "seed": tc.seed, "threads": tc.threads or torch.get_num_threads(),
        "torch": torch.__version__,
        "command": "`python -m lowp.torch.trainer " + " ".join(sys.argv[1:]) + "`"}
    md, svg = write_report(out, settings, runs)
    print(table(runs), end="")
    print(f"report: {md}\nplot: {svg}")
    bad = [r.recipe for r in runs if not math.isfinite(r.final_val)]
    for r in bad:
        sys.stderr.write(f"lowp.torch.trainer: recipe {r} diverged (validation loss is not "
                         "finite)\n")
    return 1 if bad else 0


def _report_from(args) -> int:
    """The compare report from JSON-lines logs (runs of one seed and settings, e.g. recipes
    trained in separate processes; each recipe's last log wins)."""

    recs: dict[str, list] = {}
    for path in args.report_from.split(","):
        mine: dict[str, list] = {}
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                mine.setdefault(r.get("recipe") or args.recipe or "run", []).append(r)
        recs.update(mine)
    runs = []
    for name, rs in recs.items():
        ev = [r for r in rs if "val_loss" in r]
        val = [math.nan if r["val_loss"] is None else r["val_loss"] for r in ev]
        loss = rs[-1]["loss"]
        runs.append(Run(name, [r["step"] for r in ev], val,
                        math.nan if loss is None else loss,
                        statistics.median(r["tokens_per_s"] for r in rs), 0.0,
                        rs[-1]["elapsed_s"], sum(1 for r in rs if r.get("skipped")),
                        f"{len(rs)} updates logged"))
    runs.sort(key=lambda r: (r.recipe != "bf16", r.recipe))
    md, svg = write_report(args.out or "out/torch_compare",
                           {"source": ", ".join(f"`{p}`" for p in args.report_from.split(","))},
                           runs)
    print(table(runs), end="")
    print(f"report: {md}\nplot: {svg}")
    return 0


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        set_threads(args.threads or 0)
        if args.report_from:
            return _report_from(args)
        return _compare(args) if args.recipes else _train(args)
    except (ValueError, TypeError, FileNotFoundError) as e:
        sys.stderr.write(f"lowp.torch.trainer: {e}\n")
        return 2
    except MemoryError:
        sys.stderr.write("lowp.torch.trainer: out of memory\n")
        return 1

