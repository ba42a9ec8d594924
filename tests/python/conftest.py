"""Paths for the Python tests: the in-tree package (python/) and the shared test helpers
(tests/oracle/quant_ref.py, the independent numpy reference of lowp's quantization)."""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
for p in (os.path.join(_HERE, "..", "..", "python"), os.path.join(_HERE, "..", "oracle")):
    p = os.path.abspath(p)
    if p not in sys.path:
        sys.path.insert(0, p)
