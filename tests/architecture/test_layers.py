"""The layers of docs/architecture.md, enforced: a module imports only from its own layer or
the layers below it, and no modules import each other in a circle (lazy imports and imports
under ``TYPE_CHECKING`` count too: a circle of annotations is still a circle of knowledge).

The layer order is written once, here (``LAYERS``); docs/architecture.md draws the same
picture.
"""
from __future__ import annotations

import ast
import os
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: lowest first; a module belongs to the layer of the longest prefix that names it
LAYERS: list[tuple[str, ...]] = [
    ("rendezvous",),                                        # the store: knows no pycoll
    ("pycoll._version", "pycoll.errors", "pycoll.envvars",
     "pycoll.timeouts", "pycoll.tags", "pycoll.debug"),     # settings, errors, leaves
    ("pycoll.buffers",),                                    # memory, tensors, reduction
    ("pycoll.cuda",),                                       # device memory (CuPy)
    ("pycoll.transports",),                                 # moving bytes between two ranks
    ("pycoll.algorithms",),                                 # collectives over point-to-point
    ("pycoll.runtime",),                                    # running, recording, failing a call
    ("pycoll.fastpath",),                                   # the compiled one-host path
    ("pycoll.comm",),                                       # communicators and collectives
    ("pycoll.launch",),                                     # launchers' environments, joining
    ("pycoll.world", "pycoll.compress", "pycoll"),          # the default communicator, the API
    ("pycoll.torch", "pycoll.spark", "pycoll.ray", "pycoll.hosted", "pycoll.bench",
     "pycoll.testing", "pycoll.trace", "pycoll.run", "pycoll.info",
     "pycoll.status", "pycoll.top"),                        # integrations and tools
]


def layer_of(module: str) -> int:
    best, found = -1, -1
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, found = len(name), i
    if found < 0:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS")
    return found


def module_name(path: str, root: str) -> str:
    name = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
    return name[:-len(".__init__")] if name.endswith(".__init__") else name


def import_graph(root: str, packages: tuple[str, ...] = ("pycoll", "rendezvous")
                 ) -> dict[str, dict[str, int]]:
    """module -> {imported module of ``packages``: line}, every import statement counted."""
    files = {}
    for pkg in packages:
        for dirpath, _dirs, names in os.walk(os.path.join(root, pkg)):
            for n in names:
                if n.endswith(".py"):
                    path = os.path.join(dirpath, n)
                    files[module_name(path, root)] = path
    graph: dict[str, dict[str, int]] = {}
    for mod, path in files.items():
        is_pkg = path.endswith("__init__.py")
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        edges: dict[str, int] = {}
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    parts = parts[:len(parts) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                for a in node.names:          # ``from . import x``: the module x if it is one
                    sub = f"{base}.{a.name}"
                    targets.append(sub if sub in files else base)
            for t in targets:
                while t and t not in files:   # ``import a.b.c`` of a name inside a module
                    t = t.rpartition(".")[0]
                if t and t != mod and t.split(".")[0] in packages:
                    edges.setdefault(t, node.lineno)
        graph[mod] = edges
    return graph


def upward_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    return [f"{a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)}) at line {line}"
            for a, edges in sorted(graph.items()) for b, line in edges.items()
            if layer_of(b) > layer_of(a)]


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_module_imports_only_its_layer_and_below():
    assert upward_imports(import_graph(ROOT)) == []


def test_no_import_circles():
    assert circles(import_graph(ROOT)) == []


def test_every_module_has_a_layer():
    for mod in import_graph(ROOT):
        layer_of(mod)


def _tree(tmp_path, files: dict[str, str]) -> str:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return str(tmp_path)


@pytest.mark.parametrize("statement", [
    "from ..comm.communicator import Communicator",            # relative, upward
    "import pycoll.comm.communicator",                         # absolute
    "def f():\n    from ..comm import communicator",           # lazy
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..comm.communicator import C",
])
def test_the_check_finds_an_upward_import(tmp_path, statement):
    root = _tree(tmp_path, {
        "pycoll/__init__.py": "", "pycoll/transports/__init__.py": "",
        "pycoll/transports/tcp.py": statement + "\n",
        "pycoll/comm/__init__.py": "", "pycoll/comm/communicator.py": "C = 1\n",
    })
    found = upward_imports(import_graph(root, ("pycoll",)))
    assert len(found) == 1 and "pycoll.transports.tcp (layer 4) imports pycoll.comm" in found[0]


def test_the_check_finds_a_circle_inside_a_layer(tmp_path):
    root = _tree(tmp_path, {
        "pycoll/__init__.py": "", "pycoll/comm/__init__.py": "",
        "pycoll/comm/a.py": "from . import b\n", "pycoll/comm/b.py": "from .a import x\n",
    })
    graph = import_graph(root, ("pycoll",))
    assert upward_imports(graph) == []
    assert circles(graph) == [["pycoll.comm.a", "pycoll.comm.b"]]
