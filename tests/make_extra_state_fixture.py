#!/usr/bin/env python3
"""Writes tests/fixtures/extra_state_v1.bin, the version-1 extra-state blob that
tests/test_checkpoint.c loads and checks value by value.

It is built from the format spec in include/lowp/checkpoint.h alone (struct.pack and
zlib.crc32), never from lowp's own writer, so that the test catches a writer and a reader
that agree with each other but not with the spec. The blob is committed: every later version
of lowp must keep loading it. Run it again only to regenerate the same bytes
(`--check` compares instead of writing).

Values: history length 4, margin 0, amax algorithm max, formats E4M3 / E4M3 / E5M2; all
amaxes and scales are exact in binary32 (scale = fmax / max(history) with power-of-two
amaxes), so the C test can write them as literals.
"""
import os
import struct
import sys
import zlib

MAGIC = b"LOWPXST1"
VERSION = 1
FORMAT_E4M3, FORMAT_E5M2 = 3, 4  # lowp_format values
ALGO_MAX = 0

HISTORY_LEN = 4
MARGIN = 0.0
FORMATS = [FORMAT_E4M3, FORMAT_E4M3, FORMAT_E5M2]  # input, weight, grad_output
# Per role: amax history rows (row 0 is this step's staging row), then the scale.
ROLES = [
    ([0.0, 1.0, 4.0, 2.0], 448.0 / 4.0),
    ([0.0, 0.25, 0.5, 0.375], 448.0 / 0.5),
    ([0.125, 0.0078125, 0.015625, 0.01171875], 57344.0 / 0.015625),
]


def blob():
    body = struct.pack("<IIfI", len(ROLES), HISTORY_LEN, MARGIN, ALGO_MAX)
    body += struct.pack("<%dI" % len(FORMATS), *FORMATS)
    for history, scale in ROLES:
        assert len(history) == HISTORY_LEN
        body += struct.pack("<%df" % HISTORY_LEN, *history)
        body += struct.pack("<f", scale)
    head = MAGIC + struct.pack("<II", VERSION, len(body))
    data = head + body
    return data + struct.pack("<I", zlib.crc32(data) & 0xFFFFFFFF)


def main():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures",
                        "extra_state_v1.bin")
    data = blob()
    if "--check" in sys.argv[1:]:
        with open(path, "rb") as f:
            same = f.read() == data
        print("%s: %s" % (path, "matches" if same else "DIFFERS"))
        return 0 if same else 1
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    print("wrote %s (%d bytes)" % (path, len(data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
