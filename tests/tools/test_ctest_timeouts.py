"""Every registered ctest test has a TIMEOUT (issue 10 item 11): a test that waits forever (on the
wrong device queue, on a child that never exits) must fail CI instead of hanging it.

Reads `ctest --show-only=json-v1` of the build tree that holds LOWP_CLI (BUILD/bin/lowp).
Prints "N passed, M failed"; exits nonzero on failure.
"""

import json
import os
import subprocess
import sys

CLI = os.environ.get("LOWP_CLI")
if not CLI:
    sys.exit("LOWP_CLI is not set (path of the lowp executable); run through ctest")

build = os.path.dirname(os.path.dirname(os.path.abspath(CLI)))
p = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build, capture_output=True, text=True,
                   timeout=60)
if p.returncode != 0:
    sys.exit(f"ctest --show-only failed in {build}: {p.stderr.strip()}")
tests = json.loads(p.stdout)["tests"]
passed = failed = 0
for t in tests:
    props = {q["name"]: q["value"] for q in t.get("properties", [])}
    timeout = float(props.get("TIMEOUT", 0) or 0)
    if 0 < timeout <= 3600:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {t['name']}: TIMEOUT is {props.get('TIMEOUT')!r}, want 0 < t <= 3600 s")
if len(tests) < 10:
    failed += 1
    print(f"FAIL only {len(tests)} tests registered in {build}")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
