"""tools/check_layers.py's Python rules (issue 36.6) on small made-up packages: an import of a
package's own __init__ from inside it, and an import cycle, are found; a submodule import, an
import of the extension and a package __init__'s re-exports going down are not. An application
inside the package (the PyTorch trainer, issue 36.1) imports lowp only through its public
packages, and nothing else imports it."""

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


# An application inside the package (as lowp.torch.trainer), whose public package is lowp.
_APP = {"lowp.app": ("lowp",)}
_CLEAN_APP = dict(_CLEAN, **{
    "lowp/app/__init__.py": "from .run import main\n",
    "lowp/app/__main__.py": "from .run import main\nmain()\n",
    "lowp/app/run.py": "import lowp\nfrom lowp import f\nfrom . import util\n"
                       "def main():\n    return util.g(lowp.api)\n",
    "lowp/app/util.py": "def g(x):\n    return x\n",
})


def test_an_application_on_the_public_api_passes(tool, tmp_path):
    n, errors = tool.check_python(_tree(tmp_path, _CLEAN_APP), allow=set(), apps=_APP)
    assert (n, errors) == (9, [])


@pytest.mark.parametrize("line, module", [
    ("from lowp import _lowp", "lowp._lowp"),  # the extension
    ("from lowp.api import f", "lowp.api"),    # a library module, not the public package
    ("from ..sub import d", "lowp.sub.d"),
    ("import lowp.sub", "lowp.sub"),           # a package that is not among the public ones
])
def test_an_application_importing_another_module_of_lowp_is_found(tool, tmp_path, line, module):
    files = dict(_CLEAN_APP)
    files["lowp/app/util.py"] = "def g(x):\n    %s\n    return x\n" % line
    _, errors = tool.check_python(_tree(tmp_path, files), allow=set(), apps=_APP)
    where = os.path.join(tmp_path.name, "lowp", "app", "util.py")
    assert errors == [f"{where}:2: imports {module}: the application lowp.app imports only the "
                      "public lowp"]


def test_an_application_importing_its_own_init_is_found(tool, tmp_path):
    files = dict(_CLEAN_APP)
    files["lowp/app/util.py"] = "from . import main\n"
    _, errors = tool.check_python(_tree(tmp_path, files), allow=set(), apps=_APP)
    where = os.path.join(tmp_path.name, "lowp", "app", "util.py")
    assert errors == [f"{where}:1: imports the __init__ of its package lowp.app"]


@pytest.mark.parametrize("path", ["lowp/sub/d.py", "lowp/__init__.py"])
def test_the_library_importing_the_application_is_found(tool, tmp_path, path):
    files = dict(_CLEAN_APP)
    files[path] = files[path] + "def late():\n    from lowp.app import run\n"
    _, errors = tool.check_python(_tree(tmp_path, files), allow=set(), apps=_APP)
    where = os.path.join(tmp_path.name, *path.split("/"))
    line = files[path].count("\n")  # the last line
    assert errors == [f"{where}:{line}: imports the application lowp.app (nothing outside it "
                      "may)"]


def test_the_trainer_is_an_application_and_nothing_is_allowed(tool):
    assert tool.APPLICATIONS == {"lowp.torch.trainer": ("lowp", "lowp.torch")}
    assert tool.PY_ALLOW == set()


def test_module_docstrings_and_function_length(tool, tmp_path):
    """Rule 3d: a module without a docstring and a function over 60 lines (decorators
    counted) are found; a 60-line function is not."""
    body = "".join(f"    x{i} = {i}\n" for i in range(58))
    files = {
        "lowp/__init__.py": '"""The package."""\n',
        "lowp/ok.py": '"""Owns ok."""\n\n\ndef f():\n    """Doc."""\n' + body,
        "lowp/long.py": '"""Owns long."""\n\n\n@staticmethod\ndef g():\n    """Doc."""\n'
                        + body,
        "lowp/bare.py": "X = 1\n",
    }
    errors = tool.check_python_shape(_tree(tmp_path, files))
    root = tmp_path.name
    assert errors == [
        f"{os.path.join(root, 'lowp', 'bare.py')}:1: module lowp.bare has no docstring saying "
        "what it owns",
        f"{os.path.join(root, 'lowp', 'long.py')}:5: function g has 61 lines (> 60)",
    ]
