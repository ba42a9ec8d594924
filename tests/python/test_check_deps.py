"""python/check_deps.py (used by `make venv`): "name", "name>=X.Y" and "name==X.Y.Z" (the
torchtitan pin, issue 39.5) against the installed versions."""

import importlib.metadata as md
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
import check_deps  # noqa: E402


def test_requirement_forms():
    have = md.version("pytest")
    major = int(have.split(".")[0])
    assert check_deps.main(["pytest"]) == 0
    assert check_deps.main([f"pytest=={have}"]) == 0
    assert check_deps.main([f"pytest>={major}.0"]) == 0
    assert check_deps.main([f"pytest=={major + 1}.0.0"]) == 1   # pinned to another version
    assert check_deps.main([f"pytest=={major - 1}.0.0"]) == 1   # not only "at least"
    assert check_deps.main([f"pytest>={major + 1}.0"]) == 1
    assert check_deps.main(["no-such-package-lowp"]) == 1
