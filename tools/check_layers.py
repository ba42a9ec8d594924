#!/usr/bin/env python3
"""Check the layering of src/ (docs/architecture.md): run by ctest as `check_layers`.

1. No file includes a header from, or calls a function defined in, a folder of a higher layer
   than its own. Layers, bottom to top: core, cpu, device, ops, train, model, io, data, trainer.
   (The CPU backend sits below the registry that lists it as built in.)
2. No files call each other in a loop (the file-level call graph of src/ has no cycle), in
   src/device/ too: the registry owns loading, and the plugin loader calls nothing of it.
4. The CPU backend is a leaf (ggml's ggml-cpu): outside src/cpu/, a header of src/cpu/ is
   included only as "cpu/host.h" (its host interface) from src/model/ and src/train/, or as
   "cpu/cpu.h" from the registry (src/device/registry.c, which lists the backend as built in);
   and every function of src/cpu/ called from outside src/cpu/ is declared in cpu/host.h (the
   registry's call of lowp_cpu_backend_entry aside). Everything else reaches the backend through
   its vtable.
3. The Python package python/lowp ("no circles, no arrows back up into a
   package's __init__"), from each module's `import` statements found with `ast` (function
   bodies included, relative imports resolved):
   a. no module imports the __init__ of a package it sits in (`import lowp.torch`,
      `from lowp.torch import X`, `from . import X` with X not a submodule): it imports the
      submodule that defines X;
   b. no import cycle among the modules, a package __init__'s imports of its own
      submodules (re-exports going down) aside;
   c. an application inside the package (APPLICATIONS: the PyTorch trainer,
      lowp.torch.trainer) is a user of lowp: it imports lowp only through the public packages
      (the __init__s whose __all__ is the public API: lowp, lowp.torch) and its own modules,
      never another module of lowp (a private one, the extension, or a library module's path),
      and no module outside it imports it. Its imports of those public __init__s are the only
      imports of an enclosing package's __init__ that rule a allows.
   d. every module has a docstring saying what it owns, and no function (or method) is over
      PY_MAX_LINES (60) lines, decorators and docstring included.
   PY_ALLOW lists the known exceptions, each with the issue that removes it (none now).

Calls are found by name: every function defined (not static) in a .c file of src/, and every
identifier followed by "(" in the other files, comments and strings removed. Prints one line per
violation and exits 1 if there is any.
"""

import ast
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


def folder_of(path, src=SRC):
    rel = os.path.relpath(path, src).split(os.sep)
    return rel[0] if len(rel) > 1 else None


# Rule 4: who may include which header of src/cpu/ from outside it, and the registry's one call.
CPU_HOST = "cpu/host.h"
CPU_HOST_USERS = ("model", "train")
CPU_REGISTRY = (os.path.join("device", "registry.c"), "cpu/cpu.h", "lowp_cpu_backend_entry")


def check_cpu_leaf(src, text, defined):
    """Rule 4 over the files of src/ (text: path -> (raw, code), defined: name -> file)."""
    errors = []
    host = os.path.join(src, *CPU_HOST.split("/"))
    declared = set(CALL.findall(text[host][1])) if host in text else set()
    for f, (raw, code) in sorted(text.items()):
        me, rel = folder_of(f, src), os.path.relpath(f, src)
        if me == "cpu":
            continue
        shown = os.path.relpath(f, os.path.dirname(src))
        for inc in INCLUDE.findall(raw):
            if inc.split("/")[0] != "cpu":
                continue
            if not ((inc == CPU_HOST and me in CPU_HOST_USERS) or
                    (rel, inc) == CPU_REGISTRY[:2]):
                errors.append(f"{shown}: includes \"{inc}\": outside src/cpu/ only "
                              f"src/{'/, src/'.join(CPU_HOST_USERS)}/ may include {CPU_HOST} "
                              f"(and {CPU_REGISTRY[0]} {CPU_REGISTRY[1]})")
        local = set(ANYDEFN.findall(code))
        for name in sorted(set(CALL.findall(code)) - local):
            g = defined.get(name)
            if not g or folder_of(g, src) != "cpu" or name in declared:
                continue
            if (rel, name) != (CPU_REGISTRY[0], CPU_REGISTRY[2]):
                errors.append(f"{shown}: calls {name} of {os.path.relpath(g, os.path.dirname(src))}, "
                              f"which {CPU_HOST} does not declare")
    return errors


def check_c(src=SRC):
    """Rules 1, 2 and 4 over src/: (number of files, number of functions, [violations])."""
    root, files = os.path.dirname(src), []
    for d, _, names in os.walk(src):
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
        me = folder_of(f, src)
        local = set(ANYDEFN.findall(code))  # static and inline helpers shadow other files' names
        if me not in RANK:
            errors.append(f"{os.path.relpath(f, root)}: folder src/{me}/ is not a known layer")
            continue
        for inc in INCLUDE.findall(raw):
            top = inc.split("/")[0]
            if top in RANK and RANK[top] > RANK[me]:
                errors.append(f"{os.path.relpath(f, root)}: includes \"{inc}\" from a higher layer")
        for name in set(CALL.findall(code)):
            g = defined.get(name)
            if not g or g == f or name in local:
                continue
            other = folder_of(g, src)
            if RANK[other] > RANK[me]:
                errors.append(f"{os.path.relpath(f, root)}: calls {name} of {os.path.relpath(g, root)}, "
                              f"a higher layer")
            if f.endswith(".c"):
                calls[f].add(g)
    # Cycles among the .c files.
    nodes = [f for f in files if f.endswith(".c")]
    graph = {f: {g for g in calls[f] if g in nodes} for f in nodes}
    state = {}

    def visit(f, stack):
        state[f] = 1
        stack.append(f)
        for g in sorted(graph[f]):
            if state.get(g) == 1:
                cyc = stack[stack.index(g):] + [g]
                errors.append("call loop: " + " -> ".join(os.path.relpath(x, root) for x in cyc))
            elif g not in state:
                visit(g, stack)
        stack.pop()
        state[f] = 2

    for f in sorted(nodes):
        if f not in state:
            visit(f, [])
    errors += check_cpu_leaf(src, text, defined)
    return len(files), len(defined), errors


# ---- the Python package (rule 3) ----

PYROOT = os.path.join(ROOT, "python")
# Modules that are not .py files in the tree: the C extension (built into python/lowp/ or a
# build folder).
EXTENSION_MODULES = {"lowp._lowp"}
# Known violations: (importing module, imported module) pairs, each with the issue that
# removes it. None since the trainer moved to lowp.torch.trainer.
PY_ALLOW = set()
# Applications inside the package (rule 3c): {subpackage: the public packages it may import}.
APPLICATIONS = {"lowp.torch.trainer": ("lowp", "lowp.torch")}


def py_modules(pyroot=PYROOT):
    """{module name: (path, is_package)} for every .py file under pyroot/lowp."""
    mods = {}
    for d, _, names in os.walk(os.path.join(pyroot, "lowp")):
        for n in names:
            if not n.endswith(".py"):
                continue
            parts = os.path.relpath(os.path.join(d, n), pyroot)[:-3].split(os.sep)
            is_pkg = parts[-1] == "__init__"
            if is_pkg:
                parts = parts[:-1]
            mods[".".join(parts)] = (os.path.join(d, n), is_pkg)
    return mods


def py_imports(name, path, is_pkg, mods):
    """[(lowp module, line)] that module `name` imports, function bodies included."""
    known = set(mods) | EXTENSION_MODULES
    pkg = name if is_pkg else name.rpartition(".")[0]
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name in known]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            if base not in known:
                continue
            for a in node.names:  # a submodule when one is named so, else a name of `base`
                sub = base + "." + a.name
                out.append((sub if sub in known else base, node.lineno))
    return out


def _app_of(m, apps):
    """The application (a key of apps) that module m belongs to, or None."""
    return next((a for a in apps if m == a or m.startswith(a + ".")), None)


def app_violation(m, target, apps):
    """Rule 3c for one import of module m: a message, or None when the import is allowed."""
    mine, theirs = _app_of(m, apps), _app_of(target, apps)
    if theirs is not None and theirs != mine:
        return f"imports the application {theirs} (nothing outside it may)"
    if mine is not None and theirs is None and target not in apps[mine]:
        return (f"imports {target}: the application {mine} imports only the public "
                f"{', '.join(apps[mine])}")
    return None


def check_python(pyroot=PYROOT, allow=None, apps=None):
    """Rules 3a, 3b and 3c of the module docstring over the package under pyroot: (number of
    modules, [violations]). A package __init__'s imports of its own submodules go down and are
    left out of the cycle search; allow (default PY_ALLOW) holds (importer, imported) pairs
    to skip; apps (default APPLICATIONS): {application subpackage: its public packages}."""
    mods = py_modules(pyroot)
    allow = PY_ALLOW if allow is None else allow
    apps = APPLICATIONS if apps is None else apps
    errors = []
    graph = {m: set() for m in mods}
    for m, (path, is_pkg) in sorted(mods.items()):
        for target, line in py_imports(m, path, is_pkg, mods):
            if target == m or (m, target) in allow:
                continue
            rel = os.path.relpath(path, os.path.dirname(pyroot))
            bad = app_violation(m, target, apps)
            if bad:
                errors.append(f"{rel}:{line}: {bad}")
                continue
            public = target in apps.get(_app_of(m, apps), ())  # an application's public API
            if not public and target in mods and mods[target][1] and m.startswith(target + "."):
                errors.append(f"{rel}:{line}: imports the __init__ of its package {target}")
                continue
            if target in mods and not (is_pkg and target.startswith(m + ".")):
                graph[m].add(target)
    state = {}

    def visit(m, stack):
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                errors.append("import loop: " + " -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    return len(mods), errors


PY_MAX_LINES = 60


def check_python_shape(pyroot=PYROOT, max_lines=PY_MAX_LINES):
    """Rule 3d over the package under pyroot: [violations]."""
    errors = []
    for m, (path, _) in sorted(py_modules(pyroot).items()):
        rel = os.path.relpath(path, os.path.dirname(pyroot))
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        if not ast.get_docstring(tree):
            errors.append(f"{rel}:1: module {m} has no docstring saying what it owns")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                n = node.end_lineno - first + 1
                if n > max_lines:
                    errors.append(f"{rel}:{node.lineno}: function {node.name} has {n} lines "
                                  f"(> {max_lines})")
    return errors


def main():
    n_files, n_defined, errors = check_c()
    n_py, py_errors = check_python()
    errors += py_errors + check_python_shape()
    for e in errors:
        print(e)
    print(f"check_layers: {n_files} files, {n_defined} functions, {n_py} Python modules, "
          f"{len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
