"""No module outside a transport's own package and the registry names a transport
(docs/architecture.md, "Transport interface"): pycoll decides from ``Capabilities`` and the
transports' hooks, so adding a transport is its folder and one line in the registry.

Every string constant of ``pycoll/`` that equals a registered transport's name is judged
(docstrings are prose, not decisions, and are skipped).
"""
from __future__ import annotations

import ast
import os

from pycoll.transports import registry

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: (file, name): a user-facing default a caller may change, not a decision by name
ALLOWED = {
    ("pycoll/testing/faults.py", "shm"),   # kill_during(transport="shm"): the harness's default
}


def _owner(rel: str) -> str | None:
    """The transport whose package (or single module) ``rel`` is part of."""
    parts = rel[:-3].split("/")
    if parts[:2] == ["pycoll", "transports"] and len(parts) > 2 and parts[2] in registry.REGISTRY:
        return parts[2]
    return None


def _docstrings(tree: ast.Module) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def test_no_module_names_a_transport_outside_its_package_and_the_registry():
    names = set(registry.REGISTRY)
    found = []
    for dirpath, _dirs, files in os.walk(os.path.join(ROOT, "pycoll")):
        for n in sorted(files):
            if not n.endswith(".py"):
                continue
            path = os.path.join(dirpath, n)
            rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
            if rel == "pycoll/transports/registry.py":
                continue
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            skip = _docstrings(tree)
            owner = _owner(rel)
            for node in ast.walk(tree):
                if (isinstance(node, ast.Constant) and node.value in names
                        and id(node) not in skip and node.value != owner
                        and (rel, node.value) not in ALLOWED):
                    found.append(f"{rel}:{node.lineno}: {node.value!r}")
    assert not found, ("decide from the transport's Capabilities or a hook, not its name:\n"
                       + "\n".join(found))
