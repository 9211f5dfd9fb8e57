"""A package's static import graph, read with ``ast``, and the cycles in it.

Nodes are the package's modules (``.py`` files, packages, extension modules). ``import a.b`` and
``from a import b`` anywhere in a module (at module level or inside a function: both run some day)
are edges from the module to ``a.b`` when that is a module, else to ``a``; relative imports are
resolved against the importing module's package. Importing ``a.b`` also runs ``a/__init__.py``
first, so the edge goes to ``a`` too.

Python imports a module's enclosing packages before the module itself: the edge from a module to
its own packages is implied by the import system and is left out (an ``import torch_tpu`` inside
``torch_tpu.compile.cache``, or ``from .. import _C``'s edge to ``torch_tpu``). Were it counted,
every package whose ``__init__`` imports one of its submodules would be a cycle. Whether such a
submodule may use names of its package at import time is what importing each module first in a
fresh interpreter checks.
"""

import ast
import importlib.machinery
import os
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    path: str  # the importing file, relative to the package's parent folder
    line: int
    text: str  # the import statement's first line
    in_function: bool


def module_files(package_dir):
    """{module name: file path} of every module under `package_dir` (extension modules included)."""
    root = os.path.dirname(os.path.abspath(package_dir))
    modules = {}
    for folder, dirs, files in os.walk(package_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        parts = os.path.relpath(folder, root).split(os.sep)
        for f in sorted(files):
            stem = _module_stem(f)
            if stem is None:
                continue
            name = ".".join(parts if stem == "__init__" else parts + [stem])
            modules[name] = os.path.join(folder, f)
    return modules


def _module_stem(filename):
    if filename.endswith(".py"):
        return filename[:-3]
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if filename.endswith(suffix):
            return filename[:-len(suffix)]
    return None


def _ancestors(name):
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]


class _ImportCollector(ast.NodeVisitor):
    """(imported name, node, inside a function) for each import of a module, relative ones resolved."""

    def __init__(self, module, is_package):
        self.package = module if is_package else module.rpartition(".")[0]
        self.imports = []
        self._function_depth = 0

    def _visit_function(self, node):
        self._function_depth += 1
        self.generic_visit(node)
        self._function_depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _visit_function

    def visit_Import(self, node):
        for alias in node.names:
            self.imports.append((alias.name, None, node, self._function_depth > 0))

    def visit_ImportFrom(self, node):
        base = node.module or ""
        if node.level:
            parts = self.package.split(".")
            anchor = ".".join(parts[:len(parts) - node.level + 1])
            base = f"{anchor}.{base}" if base else anchor
        for alias in node.names:
            self.imports.append((base, alias.name, node, self._function_depth > 0))


def build(package_dir):
    """(modules, edges): the module names under `package_dir` and the import edges between them."""
    files = module_files(package_dir)
    root = os.path.dirname(os.path.abspath(package_dir))
    edges = []
    for module, path in files.items():
        if not path.endswith(".py"):
            continue
        with open(path, encoding="utf-8") as f:
            source = f.read()
        collector = _ImportCollector(module, os.path.basename(path) == "__init__.py")
        collector.visit(ast.parse(source, path))
        lines = source.splitlines()
        own_packages = set(_ancestors(module))
        for base, name, node, in_function in collector.imports:
            target = f"{base}.{name}" if name and f"{base}.{name}" in files else base
            while target and target not in files:  # `import pkg.missing` still runs pkg
                target = target.rpartition(".")[0]
            if not target:
                continue  # outside the package
            for reached in [target] + _ancestors(target):
                if reached != module and reached not in own_packages and reached in files:
                    edges.append(Edge(module, reached, os.path.relpath(path, root), node.lineno,
                                      lines[node.lineno - 1].strip(), in_function))
    unique = {(e.source, e.target, e.line): e for e in edges}  # `from a import b, c`: one edge to a
    return sorted(files), list(unique.values())


def _strongly_connected(nodes, successors):
    """Tarjan's components with more than one node."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in successors.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in nodes:
        if v not in index:
            visit(v)
    return sorted(components)


def _shortest_cycle_through(start, successors, allowed):
    """[start, ..., start] along the fewest edges, staying within `allowed`."""
    came_from = {start: None}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in successors.get(v, ()):
            if w == start:
                path = [v]
                while came_from[path[-1]] is not None:
                    path.append(came_from[path[-1]])
                return [start] + path[::-1][1:] + [start]
            if w in allowed and w not in came_from:
                came_from[w] = v
                queue.append(w)
    return None


def cycles(modules, edges):
    """[(component, [cycle, ...])]: each set of modules that import one another, with the shortest
    cycle through each of its modules (duplicates dropped), a cycle being [m0, m1, ..., m0]."""
    successors = {}
    for e in edges:
        successors.setdefault(e.source, set()).add(e.target)
    successors = {v: sorted(ws) for v, ws in successors.items()}
    found = []
    for component in _strongly_connected(modules, successors):
        members, seen, loops = set(component), set(), []
        for start in component:
            loop = _shortest_cycle_through(start, successors, members)
            key = frozenset(zip(loop, loop[1:]))
            if key not in seen:
                seen.add(key)
                loops.append(loop)
        found.append((component, loops))
    return found


def describe(found, edges):
    """The cycles as text: each cycle's path, then the import statement behind each of its edges."""
    first_edge = {}
    for e in sorted(edges, key=lambda e: e.in_function):  # a module-level import explains best
        first_edge.setdefault((e.source, e.target), e)
    out = []
    for component, loops in found:
        out.append(f"{len(component)} modules import one another: {', '.join(component)}")
        for loop in loops:
            out.append("  cycle: " + " -> ".join(loop))
            for source, target in zip(loop, loop[1:]):
                e = first_edge[(source, target)]
                where = "in a function" if e.in_function else "at module level"
                out.append(f"    {e.path}:{e.line}: {e.text}  ({where})")
    return "\n".join(out)
