"""Hardening of `lowp train` (env LOWP_CLI), issue 10; each case failed on the code before it.

- item 2: a diverging run stops with exit 1 and one message: --lr 1e6 stops after
  --max-skipped consecutive skipped updates (default 10) instead of running all 40 and exiting 0;
  fp8_delayed with --lr 1e6 stops at the non-finite loss; with --checkpoint-every 1 no
  checkpoint holding a non-finite weight, moment or FP8 value is ever written (the file left
  behind, if any, has only finite F32 tensors and a non-negative exp_avg_sq).
- item 4: --checkpoint in a directory that does not exist, or that is a directory, fails with exit
  2 before the first step (no step line on stderr).
- item 8: --seq-len 20000000 is refused from the corpus length before the model is built, and
  --experts 100000 from the memory estimate; both exit 2 at once, under a 2 GB address-space
  limit (before: an allocation of 1.26 GB or 160 GB, then exit 1 or a long wait).
- item 9: after a run logged steps 1-6 and is resumed from its step-3 checkpoint, every step
  appears once in --log.
Prints "N passed, M failed"; exits nonzero on failure.
"""

import json
import os
import resource
import struct
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle import Report  # noqa: E402

CLI = os.environ.get("LOWP_CLI")
if not CLI:
    sys.exit("LOWP_CLI is not set (path of the lowp executable); run through ctest")
SANITIZE = bool(os.environ.get("LOWP_SANITIZE"))

rep = Report()
tmp = tempfile.TemporaryDirectory(prefix="lowp_hard_")
TMP = tmp.name
BASE = ["train", "--config", "tiny", "--threads", "1", "--sample", "0", "--eval-batches", "1"]


def path(name):
    return os.path.join(TMP, name)


def limit_memory():
    # Address-space cap: an allocation the checks should have prevented fails fast here.
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def run(*args, cap=False, timeout=300):
    e = dict(os.environ)
    e.setdefault("OMP_WAIT_POLICY", "passive")
    p = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout, env=e,
                       preexec_fn=limit_memory if cap and not SANITIZE else None)
    return p.returncode, p.stdout, p.stderr


def one_line(err):
    return err.endswith("\n") and err.count("\n") == 1 and len(err.strip()) > 0


def steps_run(err):
    return [line for line in err.splitlines() if line.startswith("step ")]


def safetensors_arrays(p):
    with open(p, "rb") as fh:
        raw = fh.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for k, v in header.items():
        if k == "__metadata__" or v["dtype"] != "F32":
            continue
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(raw[8 + n + a:8 + n + b], np.float32)
    return out


def test_divergence():
    rc, out, err = run(*BASE, "--steps", "40", "--lr", "1e6")
    last = err.strip().splitlines()[-1] if err.strip() else ""
    rep.check("--lr 1e6: exit 1 after 10 consecutive skipped updates",
              rc == 1 and "consecutive updates skipped" in last and "diverged" in last
              and len(steps_run(err)) < 20 and "trained" not in out, [f"exit {rc}", err[-400:]])
    rc, out, err = run(*BASE, "--steps", "40", "--lr", "1e6", "--max-skipped", "3")
    rep.check("--max-skipped 3 stops after 3", rc == 1 and "3 consecutive" in err, [err[-300:]])
    ck = path("div.st")
    rc, out, err = run(*BASE, "--recipe", "fp8_delayed", "--steps", "40", "--lr", "1e6",
                       "--checkpoint", ck, "--checkpoint-every", "1")
    rep.check("fp8_delayed --lr 1e6: exit 1, says it diverged", rc == 1 and "diverged" in err,
              [f"exit {rc}", err[-400:]])
    if os.path.exists(ck):
        arrays = safetensors_arrays(ck)
        bad = [k for k, a in arrays.items() if not np.all(np.isfinite(a))
               or (k.startswith("optim.exp_avg_sq.") and np.any(a < 0))]
        rep.check("the checkpoint left behind holds only finite state", not bad, [str(bad[:3])])
    ck2 = path("div_fresh.st")
    rc, out, err = run(*BASE, "--recipe", "fp8_delayed", "--steps", "40", "--lr", "1e6",
                       "--checkpoint", ck2)
    rep.check("fp8_delayed diverged: no final checkpoint written", rc == 1 and not os.path.exists(ck2),
              [f"exit {rc}", err[-300:]])


def test_checkpoint_path():
    for what, p in (("missing directory", "/nonexistent/dir/ck.safetensors"), ("a directory", TMP)):
        rc, out, err = run(*BASE, "--steps", "3", "--checkpoint", p)
        rep.check(f"--checkpoint in {what}: exit 2 before the first step",
                  rc == 2 and one_line(err) and p in err and not steps_run(err), [f"exit {rc}", err[-300:]])


def test_cheap_checks_first():
    rc, out, err = run(*BASE, "--steps", "2", "--seq-len", "20000000", cap=True)
    rep.check("--seq-len 20000000: exit 2 naming the corpus length",
              rc == 2 and one_line(err) and "too short" in err, [f"exit {rc}", err[-300:]])
    rc, out, err = run(*BASE, "--steps", "2", "--experts", "100000", cap=True)
    rep.check("--experts 100000: exit 2 from the memory estimate",
              rc == 2 and one_line(err) and "physical memory" in err, [f"exit {rc}", err[-300:]])


def test_log_after_resume():
    log, ck = path("run.jsonl"), path("mid.st")
    args = BASE + ["--steps", "6", "--eval-every", "3", "--log", log]
    rc1, _, e1 = run(*args, "--stop-at", "3", "--checkpoint", ck)
    # The run goes on past the checkpoint (and, say, crashes): steps 4-6 are logged.
    rc2, _, e2 = run(*args, "--resume", ck, "--stop-at", "5")
    rc3, _, e3 = run(*args, "--resume", ck)
    with open(log) as fh:
        steps = [json.loads(line)["step"] for line in fh if line.strip()]
    rep.check("--log after resuming an earlier checkpoint: each step once",
              rc1 == rc2 == rc3 == 0 and steps == [1, 2, 3, 4, 5, 6],
              [f"exits {rc1} {rc2} {rc3}", f"steps {steps}", e3[-200:]])


def main():
    test_checkpoint_path()
    test_cheap_checks_first()
    test_divergence()
    test_log_after_resume()
    rep.finish()


if __name__ == "__main__":
    main()
