"""tools/check_layers.py's Python rules (issue 36.6) on small made-up packages: an import of a
package's own __init__ from inside it, and an import cycle, are found; a submodule import, an
import of the extension and a package __init__'s re-exports going down are not."""

import importlib.util
import os
import textwrap

import pytest

_TOOL = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "check_layers.py")


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("check_layers_tool", _TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _tree(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return str(root)


_CLEAN = {
    "lowp/__init__.py": "from . import api\nfrom .api import f\nfrom .sub import g\nX = 1\n",
    "lowp/api.py": "def f():\n    from . import _lowp\n    return _lowp\n",
    "lowp/sub/__init__.py": "from .c import g\nfrom . import d\n",
    "lowp/sub/c.py": "from . import d\nfrom .. import api\nfrom lowp.api import f\n"
                     "def g():\n    from .d import h\n    return h\n",
    "lowp/sub/d.py": "def h():\n    pass\n",
}


def test_a_clean_tree_passes(tool, tmp_path):
    n, errors = tool.check_python(_tree(tmp_path, _CLEAN), allow=set())
    assert (n, errors) == (5, [])


@pytest.mark.parametrize("line, package", [
    ("import lowp.sub as s", "lowp.sub"),
    ("from lowp.sub import g", "lowp.sub"),
    ("from . import g", "lowp.sub"),       # g is a name of sub/__init__, not a submodule
    ("from lowp import X", "lowp"),        # an enclosing package's __init__
    ("from .. import X", "lowp"),
    ("import lowp", "lowp"),
])
def test_an_import_of_the_own_package_is_found(tool, tmp_path, line, package):
    files = dict(_CLEAN)
    files["lowp/sub/d.py"] = "def h():\n    %s\n" % line  # function level counts too
    _, errors = tool.check_python(_tree(tmp_path, files), allow=set())
    where = os.path.join(tmp_path.name, "lowp", "sub", "d.py")
    assert errors == [f"{where}:2: imports the __init__ of its package {package}"]


def test_an_import_cycle_is_found(tool, tmp_path):
    files = dict(_CLEAN)
    files["lowp/sub/d.py"] = "def h():\n    from .. import api\n"
    files["lowp/api.py"] = "from .sub import d\n"
    _, errors = tool.check_python(_tree(tmp_path, files), allow=set())
    assert errors == ["import loop: lowp.api -> lowp.sub.d -> lowp.api"]


def test_the_allow_list_names_pairs(tool, tmp_path):
    files = dict(_CLEAN)
    files["lowp/sub/d.py"] = "import lowp\n"
    root = _tree(tmp_path, files)
    assert tool.check_python(root, allow={("lowp.sub.d", "lowp")}) == (5, [])
    assert len(tool.check_python(root, allow={("lowp.sub.c", "lowp")})[1]) == 1


def test_the_package_passes(tool):
    n, errors = tool.check_python()
    assert n > 20 and errors == []
