"""torch_tpu's modules import one another without cycles, and each imports first in a fresh interpreter.

The static graph (helpers/import_graph.py) counts every import, function-local ones included, and
resolves relative ones; ``from pkg import name`` is an edge to ``pkg.name`` when that is a module,
else to ``pkg``, and importing ``pkg.mod`` is an edge to ``pkg`` too. The edge from a module to its
own enclosing packages is implied by Python's import system (they are imported before it) and is
not counted: a package's ``__init__`` importing its submodules is not a cycle. Whether a submodule
may use its package's names while being imported is what the fresh-interpreter check covers.
"""

import ast
import importlib.util
import json

from helpers import import_graph
from helpers.paths import TORCH_TPU_DIR


def _write_package(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_graph_rules_on_a_small_package(tmp_path):
    _write_package(tmp_path, {
        "pkg/__init__.py": "from . import a\nimport pkg.sub.c\n",
        "pkg/a.py": "import pkg\nfrom pkg import sub\n\ndef f():\n    from .b import helper\n",
        "pkg/b.py": "import os\nfrom . import a\n\ndef helper():\n    pass\n",
        "pkg/sub/__init__.py": "from .. import VERSION\n",
        "pkg/sub/c.py": "from ..b import helper\n",
    })
    modules, edges = import_graph.build(str(tmp_path / "pkg"))
    assert modules == ["pkg", "pkg.a", "pkg.b", "pkg.sub", "pkg.sub.c"]
    assert {(e.source, e.target) for e in edges} == {
        ("pkg", "pkg.a"), ("pkg", "pkg.sub.c"), ("pkg", "pkg.sub"),  # importing pkg.sub.c runs pkg.sub
        ("pkg.a", "pkg.sub"), ("pkg.a", "pkg.b"),  # not pkg.a -> pkg: its own package
        ("pkg.b", "pkg.a"), ("pkg.sub.c", "pkg.b"),  # not pkg.sub -> pkg (VERSION): its own package
    }
    assert [e.in_function for e in edges if e.source == "pkg.a" and e.target == "pkg.b"] == [True]
    found = import_graph.cycles(modules, edges)
    assert found == [(["pkg.a", "pkg.b"], [["pkg.a", "pkg.b", "pkg.a"]])]
    text = import_graph.describe(found, edges)
    assert "pkg.a -> pkg.b -> pkg.a" in text
    assert "pkg/a.py:5: from .b import helper  (in a function)" in text


def test_torch_tpu_import_graph_has_no_cycle():
    modules, edges = import_graph.build(TORCH_TPU_DIR)
    assert "torch_tpu.runtime" in modules and edges
    found = import_graph.cycles(modules, edges)
    assert not found, "import cycles in torch_tpu:\n" + import_graph.describe(found, edges)


def _guards_its_main(path):
    """Whether a __main__ module runs its program only under ``if __name__ == "__main__":``."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    return any(isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) for node in tree.body)


# Modules that import an optional dependency at module level (their extra), by package prefix.
_OPTIONAL = {"torch_tpu.serving.": "vllm"}  # torch_tpu[serve]; torch_tpu.serving itself imports no vLLM


def _has_optional(name):
    for prefix, dist in _OPTIONAL.items():
        if name.startswith(prefix):
            return importlib.util.find_spec(dist) is not None
    return True


def _importable_modules():
    """Every torch_tpu module; a __main__ module only when importing it does not run its program,
    and a module of an optional extra only when the extra is installed."""
    return [name for name, path in sorted(import_graph.module_files(TORCH_TPU_DIR).items())
            if (not name.endswith(".__main__") or _guards_its_main(path)) and _has_optional(name)]


# One interpreter imports torch (no torch_tpu module: autoload is off), then forks a child per
# module, which imports that module first: a fresh interpreter for torch_tpu, at a fraction of the
# cost of starting Python and torch each time.
_IMPORT_EACH_FIRST = """
    import importlib, json, os, sys, traceback
    import torch
    loaded = sorted(m for m in sys.modules if m.split(".")[0] == "torch_tpu")
    assert not loaded, f"loaded before the fork: {loaded}"
    failures = {}
    for name in NAMES:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            try:
                importlib.import_module(name)
                report = ""
            except BaseException:
                report = traceback.format_exc()
            with os.fdopen(write_end, "w") as f:
                f.write(report)
            os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end) as f:
            report = f.read()
        _, status = os.waitpid(pid, 0)
        if status and not report:
            report = f"the importing process died (wait status {status})"
        if report:
            failures[name] = report
    print(json.dumps(failures))
"""


def test_each_module_imports_first_in_a_fresh_interpreter(run_python):
    names = _importable_modules()
    assert "torch_tpu.compile.graph_compiler" in names and "torch_tpu.demo.__main__" in names
    code = _IMPORT_EACH_FIRST.replace("NAMES", json.dumps(names))
    failures = run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, timeout=300).json()
    assert not failures, "\n\n".join(f"importing {name} first failed:\n{tb}" for name, tb in failures.items())
