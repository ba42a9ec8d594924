"""tools/check_layers.py's rule 4 on small made-up C trees: the CPU backend is a leaf. Outside
src/cpu/ only src/model/ and src/train/ include cpu/host.h, only the registry includes
cpu/cpu.h, and every function of src/cpu/ called from outside it is declared in cpu/host.h
(the registry's lowp_cpu_backend_entry aside). And rule 2 on the same trees: no call loop
between files, src/device/ included."""

import importlib.util
import os
import textwrap

import pytest

_TOOL = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "check_layers.py")


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("check_layers_tool_c", _TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_CLEAN = {
    "cpu/host.h": "int lowp_cpu_f(int x);\n",
    "cpu/cpu.h": '#include "host.h"\nint lowp_cpu_g(int x);\nint lowp_cpu_backend_entry(void);\n',
    "cpu/a.c": '#include "cpu.h"\nint lowp_cpu_f(int x) {\n    return lowp_cpu_g(x);\n}\n'
               "int lowp_cpu_g(int x) {\n    return x;\n}\n",
    "cpu/backend.c": '#include "cpu.h"\nint lowp_cpu_backend_entry(void) {\n    return 0;\n}\n',
    "device/registry.c": '#include "cpu/cpu.h"\nint reg(void) {\n'
                         "    return lowp_cpu_backend_entry();\n}\n",
    "model/m.c": '#include "cpu/host.h"\nint m(void) {\n    return lowp_cpu_f(1);\n}\n',
    "train/t.c": '#include "cpu/host.h"\nint t(void) {\n    return lowp_cpu_f(2);\n}\n',
}


def _check(tool, tmp_path, changes):
    files = dict(_CLEAN)
    files.update(changes)
    for rel, text in files.items():
        path = tmp_path / "src" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    _, _, errors = tool.check_c(str(tmp_path / "src"))
    return errors


def test_a_leaf_backend_passes(tool, tmp_path):
    assert _check(tool, tmp_path, {}) == []


@pytest.mark.parametrize("rel, text", [
    ("model/m.c", '#include "cpu/cpu.h"\n'),            # the internal header
    ("train/t.c", '#include "cpu/cpu.h"\n'),
    ("ops/o.c", '#include "cpu/host.h"\n'),             # host.h is for model/ and train/ only
    ("trainer/r.c", '#include "cpu/host.h"\n'),
    ("device/plugin.c", '#include "cpu/cpu.h"\n'),      # only the registry lists the backend
])
def test_an_include_of_the_backend_is_found(tool, tmp_path, rel, text):
    errors = _check(tool, tmp_path, {rel: text})
    inc = text.split('"')[1]
    assert len(errors) == 1 and errors[0].startswith(f'src/{rel}: includes "{inc}"'), errors


@pytest.mark.parametrize("rel", ["model/m.c", "train/t.c", "device/registry.c"])
def test_a_call_of_an_undeclared_backend_function_is_found(tool, tmp_path, rel):
    inc = "cpu/cpu.h" if rel.startswith("device") else "cpu/host.h"
    text = f'#include "{inc}"\nint h(void) {{\n    return lowp_cpu_g(3);\n}}\n'
    errors = _check(tool, tmp_path, {rel: text})
    assert errors == [f"src/{rel}: calls lowp_cpu_g of src/cpu/a.c, which cpu/host.h does not "
                      f"declare"]


def test_a_local_helper_of_the_same_name_is_not_a_call(tool, tmp_path):
    text = ('#include "cpu/host.h"\nstatic int lowp_cpu_g(int x) {\n    return x;\n}\n'
            "int m(void) {\n    return lowp_cpu_g(1);\n}\n")
    assert _check(tool, tmp_path, {"model/m.c": text}) == []


_LOADER = '#include "plugin.h"\nint lowp_plugin_open(int x) {\n    return x;\n}\n'
_REGISTRY = ('#include "cpu/cpu.h"\n#include "plugin.h"\nint reg(void) {\n'
             "    return lowp_cpu_backend_entry();\n}\n"
             "int lowp_backend_load(int x) {\n    return lowp_plugin_open(x);\n}\n")


def test_a_registry_that_owns_loading_passes(tool, tmp_path):
    changes = {"device/plugin.c": _LOADER, "device/registry.c": _REGISTRY}
    assert _check(tool, tmp_path, changes) == []


@pytest.mark.parametrize("src_dir", ["device", "model"])
def test_a_call_loop_is_found_in_every_folder(tool, tmp_path, src_dir):
    # The loader calls back into the registry (the old plugin.c -> registry.c -> plugin.c);
    # the same loop between two files of src/model/.
    loader = ('#include "registry.h"\nint lowp_registry_add(int x);\n'
              "int lowp_plugin_open(int x) {\n    return lowp_registry_add(x);\n}\n")
    registry = _REGISTRY + "int lowp_registry_add(int x) {\n    return x;\n}\n"
    if src_dir == "device":
        changes = {"device/plugin.c": loader, "device/registry.c": registry}
    else:
        changes = {"model/a.c": "int b(int x);\nint a(int x) {\n    return x ? b(x - 1) : 0;\n}\n",
                   "model/b.c": "int a(int x);\nint b(int x) {\n    return a(x);\n}\n"}
    errors = _check(tool, tmp_path, changes)
    first, second = sorted(changes)
    assert errors == [f"call loop: src/{first} -> src/{second} -> src/{first}"], errors
