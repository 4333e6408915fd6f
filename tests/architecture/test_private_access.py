"""Nothing reads another class's private attributes (docs/architecture.md), enforced.

Every module of ``pycoll/`` and ``rendezvous/`` is parsed, and every attribute access
``X._name`` (one leading underscore; dunders are Python's) must be one of:

* on ``self`` or ``cls``, or through ``super()``: the object's own state;
* inside a class that defines ``_name`` itself, or whose base classes in the same module do
  (a method, a class attribute, a ``__slots__`` entry or a ``self._name = ...``): private
  means private to the class, as in C++ or Java, so a method may touch another object of
  its own class (a communicator handing its channels to its successor);
* on a module imported from outside pycoll (``os._exit``, torch's ``c10d._...``): another
  library's API, whose names pycoll does not choose;
* on an object of another library listed in ``FOREIGN`` (torch's sparse tensors, numba's
  code generation), with the reason.

Anything else is a class reading another class's internals: give the owner a public name
(a documented attribute or method), never a wider rule. A module's private helper imported
by name (``from .x import _y``) is not an attribute access and is not judged here.
"""
from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = ("pycoll", "rendezvous")

#: (file, attribute): a private name of another library's object, which pycoll cannot rename
FOREIGN = {
    ("pycoll/torch/sparse.py", "_indices"): "torch's sparse COO accessors (no public "
                                            "equivalent that keeps an uncoalesced layout)",
    ("pycoll/torch/sparse.py", "_values"): "torch's sparse COO accessors",
    ("pycoll/torch/sparse.py", "_nnz"): "torch's sparse COO accessors",
    ("pycoll/torch/arguments.py", "_timeout"): "torch's Backend.Options keeps the timeout "
                                               "under this name",
    ("pycoll/fastpath/atomics.py", "_getvalue"): "numba's code-generation structs (cgutils) "
                                                 "hand out their LLVM value so",
}

def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


def _foreign_modules(tree: ast.Module) -> set[str]:
    """Names bound by importing a module from outside pycoll (anywhere in the file: lazy
    imports inside functions count)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] not in PACKAGES:
                    names.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and (node.module or "").split(".")[0] not in PACKAGES:
                names.update(a.asname or a.name for a in node.names)
    return names


def _defined_by(cls: ast.ClassDef) -> set[str]:
    """The names class ``cls`` defines itself (methods, class attributes, ``__slots__``,
    ``self.x = ...`` in its methods)."""
    names: set[str] = set()
    for stmt in cls.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    names.add(t.id)
                    if t.id == "__slots__" and stmt.value is not None:
                        names.update(c.value for c in ast.walk(stmt.value)
                                     if isinstance(c, ast.Constant) and isinstance(c.value, str))
    for node in ast.walk(cls):
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            names.add(node.attr)
    return names


def _class_names(tree: ast.Module) -> dict[ast.ClassDef, set[str]]:
    """Per class: the names it and its bases of the same module define."""
    classes = {c.name: c for c in ast.walk(tree) if isinstance(c, ast.ClassDef)}
    own = {c: _defined_by(c) for c in classes.values()}
    result = {}
    for c in classes.values():
        names, todo, seen = set(), [c], set()
        while todo:
            k = todo.pop()
            if k.name in seen:
                continue
            seen.add(k.name)
            names |= own[k]
            todo += [classes[b.id] for b in k.bases
                     if isinstance(b, ast.Name) and b.id in classes]
        result[c] = names
    return result


def violations(path: str, rel: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    foreign = _foreign_modules(tree)
    class_names = _class_names(tree)
    found = []

    def visit(node: ast.AST, allowed: set[str]) -> None:
        if isinstance(node, ast.ClassDef):
            allowed = class_names[node]
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            value, root = node.value, _root(node.value)
            own = isinstance(value, ast.Name) and value.id in ("self", "cls")
            parent = (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                      and value.func.id == "super")
            library = isinstance(root, ast.Name) and root.id in foreign
            if not (own or parent or library or node.attr in allowed
                    or (rel, node.attr) in FOREIGN):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
        for child in ast.iter_child_nodes(node):
            visit(child, allowed)

    visit(tree, set())
    return found


def _modules():
    for pkg in PACKAGES:
        for dirpath, _dirs, names in os.walk(os.path.join(ROOT, pkg)):
            for n in sorted(names):
                if n.endswith(".py"):
                    path = os.path.join(dirpath, n)
                    yield path, os.path.relpath(path, ROOT).replace(os.sep, "/")


def test_no_module_reads_another_class_private_attributes():
    found = [v for path, rel in _modules() for v in violations(path, rel)]
    assert not found, ("another class's private attribute is read (give its owner a public, "
                       "documented name):\n" + "\n".join(found))


def test_the_allowances_are_still_needed():
    """An entry of ``FOREIGN`` whose access is gone is removed with it."""
    used = set()
    for path, rel in _modules():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        used |= {(rel, n.attr) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    stale = set(FOREIGN) - used
    assert not stale, f"no longer read, remove from the lists: {sorted(stale)}"


def test_the_rule_catches_a_private_read(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n"
                   "class A:\n"
                   "    def __init__(self):\n"
                   "        self._x = 1\n"
                   "    def same(self, other: 'A'):\n"
                   "        return other._x + super()._y + os._exit\n"
                   "class B:\n"
                   "    def peek(self, a: A):\n"
                   "        return a._x\n"
                   "def helper(a):\n"
                   "    return a._x\n")
    assert violations(str(bad), "bad.py") == ["bad.py:9: a._x", "bad.py:11: a._x"]
