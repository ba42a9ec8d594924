#!/usr/bin/env python3
"""Compiler launcher that bounds each compile's peak memory (CMake's LOWP_COMPILE_MEM_LIMIT_MB).

Usage: compile_mem.py LIMIT_MB LOG -- COMPILER ARGS...

Runs the compiler, then reads the largest resident set of the processes it waited for (the
driver, cc1, as). It appends "PEAK_KB CPU_SECONDS SOURCE" to LOG, one line per compile, and
fails when the peak is over LIMIT_MB: one line on stderr naming the source, and the object
file (the argument after -o) removed, so that the next build compiles it again. `make sanitize`
builds with a bound of 2048 MB: two compiles at -j2 must fit a small machine.
"""

import os
import resource
import subprocess
import sys


def output_of(args):
    """The object file a compile writes (the argument after -o), or None."""
    for i, a in enumerate(args[:-1]):
        if a == "-o":
            return args[i + 1]
    return None


def source_of(args):
    """The source file a compile reads (its last argument ending in .c), or the command."""
    for a in reversed(args):
        if a.endswith(".c"):
            return a
    return " ".join(args)


def log_line(path, line):
    """Appends one line with a single write (compiles run in parallel)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def main(argv):
    if len(argv) < 5 or argv[3] != "--":
        sys.exit("usage: compile_mem.py LIMIT_MB LOG -- COMPILER ARGS...")
    try:
        limit_mb = int(argv[1])
    except ValueError:
        sys.exit(f"compile_mem.py: LIMIT_MB must be an integer, got {argv[1]!r}")
    log, cmd = argv[2], argv[4:]
    rc = subprocess.call(cmd)
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak_kb = use.ru_maxrss  # KiB on Linux: the largest of the compiler's processes
    src = source_of(cmd)
    log_line(log, f"{peak_kb} {use.ru_utime + use.ru_stime:.2f} {src}")
    if rc == 0 and peak_kb > limit_mb * 1024:
        out = output_of(cmd)
        if out and os.path.exists(out):
            os.remove(out)
        print(f"compile_mem.py: compiling {src} peaked at {peak_kb // 1024} MB, over the "
              f"bound of {limit_mb} MB (LOWP_COMPILE_MEM_LIMIT_MB)", file=sys.stderr)
        return 1
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
