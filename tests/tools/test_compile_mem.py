"""The compile memory bound of `make sanitize` (tools/compile_mem.py, issue 40 point 11).

The launcher runs a stand-in "compiler" (this Python, told to fill N MB and write its -o file):
- under the bound: exit 0, the object kept, one log line "PEAK_KB CPU_SECONDS SOURCE" whose
  peak is at least the N MB filled;
- over the bound: exit 1, one stderr line naming the source and the bound, the object removed
  (so that the next build compiles it again), the peak still logged;
- a failing compiler's exit status passes through; bad usage exits nonzero.
Prints "N passed, M failed"; exits nonzero on failure.
"""

import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCHER = os.path.join(ROOT, "tools", "compile_mem.py")

# Fills argv[1] MB (written, so resident), writes the file after -o, exits with argv[2].
FAKE_CC = ("import sys; b = bytearray(b'x') * (int(sys.argv[1]) << 20); "
           "open(sys.argv[sys.argv.index('-o') + 1], 'w').write('obj'); sys.exit(int(sys.argv[2]))")

passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {name} {detail}")


def launch(tmp, limit_mb, fill_mb, rc=0):
    """Runs the launcher on the stand-in compiler; returns (process, object path, log lines)."""
    obj, log = os.path.join(tmp, "k.o"), os.path.join(tmp, "mem.log")
    for p in (obj, log):
        if os.path.exists(p):
            os.remove(p)
    cmd = [sys.executable, LAUNCHER, str(limit_mb), log, "--", sys.executable, "-c", FAKE_CC,
           str(fill_mb), str(rc), "-c", "src/cpu/k.c", "-o", obj]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    lines = open(log).read().splitlines() if os.path.exists(log) else []
    return p, obj, lines


with tempfile.TemporaryDirectory() as tmp:
    p, obj, lines = launch(tmp, 2048, 64)
    check("under: exit 0", p.returncode == 0, p.stderr)
    check("under: object kept", os.path.exists(obj))
    check("under: one log line", len(lines) == 1, lines)
    if lines:
        kb, _, src = lines[0].split(" ", 2)
        check("under: peak >= 64 MB filled", int(kb) >= 64 << 10, lines[0])
        check("under: source logged", src == "src/cpu/k.c", lines[0])

    p, obj, lines = launch(tmp, 100, 300)
    check("over: exit 1", p.returncode == 1, f"rc {p.returncode}")
    check("over: object removed", not os.path.exists(obj))
    err = p.stderr.strip().splitlines()
    check("over: one stderr line naming source and bound",
          len(err) == 1 and "src/cpu/k.c" in err[0] and "100 MB" in err[0], p.stderr)
    check("over: peak logged", len(lines) == 1 and int(lines[0].split()[0]) >= 300 << 10, lines)

    p, obj, lines = launch(tmp, 2048, 1, rc=3)
    check("compiler failure passes through", p.returncode == 3, f"rc {p.returncode}")

    for bad in (["x", os.path.join(tmp, "l"), "--", "true"], ["100", os.path.join(tmp, "l")]):
        p = subprocess.run([sys.executable, LAUNCHER] + bad, capture_output=True, text=True,
                           timeout=60)
        check(f"bad usage {bad[:2]}", p.returncode != 0 and p.stderr.strip() != "", p.stderr)

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
