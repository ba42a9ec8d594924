#!/usr/bin/env python3
"""Check the layering of src/ (docs/architecture.md): run by ctest as `check_layers`.

1. No file includes a header from, or calls a function defined in, a folder of a higher layer
   than its own. Layers, bottom to top: core, cpu, device, ops, train, model, io, data, trainer.
   (The CPU backend sits below the registry that lists it as built in.)
2. Outside src/device/ (where the registry and the plugin loader call back and forth by
   design), no files call each other in a loop (the file-level call graph has no cycle).

Calls are found by name: every function defined (not static) in a .c file of src/, and every
identifier followed by "(" in the other files, comments and strings removed. Prints one line per
violation and exits 1 if there is any.
"""

import os
import re
import sys

LAYERS = ["core", "cpu", "device", "ops", "train", "model", "io", "data", "trainer"]
RANK = {name: i for i, name in enumerate(LAYERS)}

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")

COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", re.S)
DEFN = re.compile(r"^(?!static\b)(?!typedef\b)[A-Za-z_][\w \t\*]*?\b([A-Za-z_]\w*)\s*\([^;{}]*\)\s*\{",
                  re.M)
CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
ANYDEFN = re.compile(r"^[A-Za-z_][\w \t\*]*?\b([A-Za-z_]\w*)\s*\([^;{}]*\)\s*\{", re.M)
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of(path):
    rel = os.path.relpath(path, SRC).split(os.sep)
    return rel[0] if len(rel) > 1 else None


def main():
    files = []
    for d, _, names in os.walk(SRC):
        for n in names:
            if n.endswith((".c", ".h")):
                files.append(os.path.join(d, n))
    text = {}
    for f in files:
        with open(f, encoding="utf-8") as fh:
            raw = fh.read()
        text[f] = (raw, COMMENT.sub(" ", raw))
    defined = {}  # function name -> file
    for f, (_, code) in text.items():
        if f.endswith(".c"):
            for m in DEFN.finditer(code):
                defined.setdefault(m.group(1), f)
    errors = []
    calls = {f: set() for f in files}
    for f, (raw, code) in text.items():
        me = folder_of(f)
        local = set(ANYDEFN.findall(code))  # static and inline helpers shadow other files' names
        if me not in RANK:
            errors.append(f"{os.path.relpath(f, ROOT)}: folder src/{me}/ is not a known layer")
            continue
        for inc in INCLUDE.findall(raw):
            top = inc.split("/")[0]
            if top in RANK and RANK[top] > RANK[me]:
                errors.append(f"{os.path.relpath(f, ROOT)}: includes \"{inc}\" from a higher layer")
        for name in set(CALL.findall(code)):
            g = defined.get(name)
            if not g or g == f or name in local:
                continue
            other = folder_of(g)
            if RANK[other] > RANK[me]:
                errors.append(f"{os.path.relpath(f, ROOT)}: calls {name} of {os.path.relpath(g, ROOT)}, "
                              f"a higher layer")
            if f.endswith(".c"):
                calls[f].add(g)
    # Cycles among .c files outside src/device/.
    nodes = [f for f in files if f.endswith(".c") and folder_of(f) != "device"]
    graph = {f: {g for g in calls[f] if g in nodes} for f in nodes}
    state = {}

    def visit(f, stack):
        state[f] = 1
        stack.append(f)
        for g in sorted(graph[f]):
            if state.get(g) == 1:
                cyc = stack[stack.index(g):] + [g]
                errors.append("call loop: " + " -> ".join(os.path.relpath(x, ROOT) for x in cyc))
            elif g not in state:
                visit(g, stack)
        stack.pop()
        state[f] = 2

    for f in sorted(nodes):
        if f not in state:
            visit(f, [])
    for e in errors:
        print(e)
    print(f"check_layers: {len(files)} files, {len(defined)} functions, {len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
