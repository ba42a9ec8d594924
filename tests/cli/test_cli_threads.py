"""Test of the `--threads` bound of every `lowp` command (env LOWP_CLI; lowp/threads.h).

- `lowp cast`, `lowp quantize`, `lowp train` and `lowp compare` refuse --threads above
  LOWP_MAX_THREADS (256), and 65536, 40000, 100000 (which crashed OpenMP or failed to create
  threads before the bound), with exit status 2 and one stderr line naming --threads.
- --threads 256 and --threads 1 give the same bytes as the default in cast and quantize.
Prints "N passed, M failed"; exits nonzero on failure.
"""

import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle"))
from oracle import Report  # noqa: E402

CLI = os.environ.get("LOWP_CLI")
if not CLI:
    sys.exit("LOWP_CLI is not set (path of the lowp executable); run through ctest")

MAX_THREADS = 256
rep = Report()
tmp = tempfile.TemporaryDirectory(prefix="lowp_threads_")


def path(name):
    return os.path.join(tmp.name, name)


def run(*args):
    p = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def refused(name, rc, err):
    lines = err.strip().splitlines()
    rep.check(f"{name}: exit 2, one stderr line naming --threads",
              rc == 2 and len(lines) == 1 and "--threads" in lines[0], [f"exit {rc} stderr {err!r}"])


def main():
    x = (np.sin(np.arange(64 * 1024, dtype=np.float32) * 0.37) * 300).astype(np.float32).reshape(64, 1024)
    np.save(path("x.npy"), x)
    for t in ("65536", "40000", "100000", str(MAX_THREADS + 1)):
        rc, _, err = run("cast", "--to", "e4m3", "--threads", t, path("x.npy"), path("y.npy"))
        refused(f"cast --threads {t}", rc, err)
        rc, _, err = run("quantize", "--format", "e4m3", "--scaling", "mx32", "--threads", t,
                         path("x.npy"), path("q"))
        refused(f"quantize --threads {t}", rc, err)
        rc, _, err = run("train", "--config", "tiny", "--steps", "1", "--threads", t)
        refused(f"train --threads {t}", rc, err)
        rc, _, err = run("compare", "--recipes", "bf16", "--config", "tiny", "--steps", "1",
                         "--threads", t, "--out", path("cmp"))
        refused(f"compare --threads {t}", rc, err)

    ref = None
    for t in (None, "1", str(MAX_THREADS)):
        extra = [] if t is None else ["--threads", t]
        rc, _, err = run("cast", "--to", "e4m3", *extra, path("x.npy"), path("y.npy"))
        ok = rc == 0
        got = np.load(path("y.npy")) if ok else None
        if ref is None:
            ref = got
        rep.check(f"cast --threads {t}: exit 0, same codes as the default",
                  ok and got is not None and np.array_equal(got, ref), [f"exit {rc} stderr {err!r}"])
    qref = None
    for t in (None, "1", str(MAX_THREADS)):
        extra = [] if t is None else ["--threads", t]
        rc, _, err = run("quantize", "--format", "e4m3", "--scaling", "mx32", *extra,
                         path("x.npy"), path("q"))
        ok = rc == 0
        got = (np.load(path("q.data.npy")), np.load(path("q.scale.npy"))) if ok else None
        if qref is None:
            qref = got
        rep.check(f"quantize --threads {t}: exit 0, same codes and scales as the default",
                  ok and got is not None and all(np.array_equal(a, b) for a, b in zip(got, qref)),
                  [f"exit {rc} stderr {err!r}"])
    tmp.cleanup()
    rep.finish()


if __name__ == "__main__":
    main()
