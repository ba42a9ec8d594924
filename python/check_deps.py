"""Exit 0 when this Python has every requirement given on the command line ("name",
"name>=X.Y" or "name==X.Y.Z"), else 1; used by `make venv` so that a ready .venv is reused
without pip. Stdlib only (no network, no imports of the packages themselves)."""

import importlib.metadata as md
import re
import sys


def version_tuple(v):
    return tuple(int(p) for p in re.findall(r"\d+", v.split("+")[0])[:3])


def main(reqs):
    missing = []
    for r in reqs:
        exact = "==" in r
        name, _, want = r.partition("==") if exact else r.partition(">=")
        try:
            have = md.version(name)
        except md.PackageNotFoundError:
            missing.append(r)
            continue
        if want and (version_tuple(have) != version_tuple(want) if exact
                     else version_tuple(have) < version_tuple(want)):
            missing.append(f"{r} (have {have})")
    if missing:
        print("venv: installing " + ", ".join(missing), file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
