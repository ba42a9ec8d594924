"""README.md's examples run (ctest `readme_examples`, pytest): every fenced block whose info
string is ``c test``, ``python test`` or ``sh test``.

- a ``c test`` block is compiled as a whole program against include/ and this build's shared
  library (LOWP_LIB), warning-free (-Wall -Wextra -Werror), and run: exit status 0;
- a ``python test`` block runs in a fresh interpreter with PYTHONPATH=python (the extension
  from LOWP_EXT_DIR when set): exit status 0;
- a ``sh test`` block runs under ``bash -euo pipefail`` in an empty folder, with this build's
  ``lowp`` (LOWP_CLI) and this Python first on PATH: exit status 0.

Also: the README names the test command that CI runs (`make test` in .ci/run), and stays about
three screens long. Without LOWP_LIB or LOWP_CLI (a run outside ctest), build/ is used.
"""

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")
FENCE = re.compile(r"^```(\w+)[ \t]+test[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
KINDS = ("c", "python", "sh")
MAX_LINES = 200  # about three screens
TIMEOUT = 300


def blocks(text):
    """[(kind, number of that kind, code)] of the blocks marked for testing, in order."""
    out, seen = [], {}
    for m in FENCE.finditer(text):
        kind = m.group(1)
        seen[kind] = seen.get(kind, 0) + 1
        out.append((kind, seen[kind], m.group(2)))
    return out


def _readme():
    with open(README, encoding="utf-8") as fh:
        return fh.read()


def _built(var, *rel):
    path = os.environ.get(var) or os.path.join(ROOT, "build", *rel)
    if not os.path.exists(path):
        pytest.skip(f"{var} not set and {path} not built")
    return path


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + env.get("PYTHONPATH", "")
    if env.get("LOWP_EXT_DIR"):  # the examples run in another folder
        env["LOWP_EXT_DIR"] = os.path.abspath(env["LOWP_EXT_DIR"])
    env.setdefault("OMP_NUM_THREADS", "2")
    return env


def _run(cmd, cwd, env=None):
    r = subprocess.run(cmd, cwd=cwd, env=env or _env(), capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0, (f"{cmd[0]} exited {r.returncode}\n--- stdout\n{r.stdout}"
                               f"\n--- stderr\n{r.stderr}")
    return r


def _run_c(code, tmp):
    lib = _built("LOWP_LIB", "lib", "liblowp.so")
    src, exe = os.path.join(tmp, "example.c"), os.path.join(tmp, "example")
    with open(src, "w", encoding="utf-8") as fh:
        fh.write(code)
    cc = os.environ.get("CC") or shutil.which("cc") or "gcc"
    libdir = os.path.dirname(os.path.realpath(lib))
    _run([cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", src,
          "-I" + os.path.join(ROOT, "include"), "-L" + libdir, "-Wl,-rpath," + libdir,
          "-l:" + os.path.basename(lib), "-lm", "-o", exe], tmp)
    _run([exe], tmp)


def _run_sh(code, tmp):
    cli = _built("LOWP_CLI", "bin", "lowp")
    env = _env()
    env["PATH"] = os.pathsep.join([os.path.dirname(os.path.abspath(cli)),
                                   os.path.dirname(sys.executable), env.get("PATH", "")])
    _run(["bash", "-euo", "pipefail", "-c", code], tmp, env)


def _run_python(code, tmp):
    _run([sys.executable, "-c", code], tmp)


RUNNERS = {"c": _run_c, "python": _run_python, "sh": _run_sh}


def test_every_kind_has_a_tested_example():
    kinds = [k for k, _, _ in blocks(_readme())]
    assert set(kinds) == set(KINDS), kinds  # a renamed fence would silently test nothing
    assert kinds.count("python") >= 2  # numpy and PyTorch


@pytest.mark.parametrize("kind, n, code",
                         [pytest.param(k, n, c, id=f"{k}{n}") for k, n, c in blocks(_readme())])
def test_the_example_runs(kind, n, code, tmp_path):
    RUNNERS[kind](code, str(tmp_path))


def test_the_test_command_is_the_ci_one():
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as fh:
        ci = fh.read()
    assert re.search(r"^make test$", ci, re.M), "CI no longer runs `make test`"
    assert re.search(r"^make test\b", _readme(), re.M), "the README does not show `make test`"


def test_the_readme_is_about_three_screens():
    assert len(_readme().splitlines()) <= MAX_LINES


def test_the_fence_pattern_finds_only_marked_blocks():
    text = "```c\nint x;\n```\n```c test\nint main(void) {}\n```\n```sh test\nls\n```\n"
    assert blocks(text) == [("c", 1, "int main(void) {}\n"), ("sh", 1, "ls\n")]
