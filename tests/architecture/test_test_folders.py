"""No folder of tests/ is named like a package that pycoll or its tests import.

pytest puts tests/ on ``sys.path`` (tests/conftest.py lives in a folder without
``__init__.py``), so a folder there named like a package is importable under that name: where
the package is missing (``ray`` without the ray extra) or installed as a meta-path finder (an
editable install of ``rendezvous``), ``import ray`` or ``pytest.importorskip("ray")`` returns
the test folder as a namespace package, and the tests fail instead of skipping. An
``__init__.py`` in the folder makes it worse: it then shadows the real package everywhere.
"""
from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent


def _top_level_imports() -> set[str]:
    """Top-level names imported (or ``importorskip``-ed) by pycoll, rendezvous and the tests."""
    names = set()
    for folder in (ROOT / "pycoll", ROOT / "rendezvous", TESTS):
        for path in folder.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
                elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                      and node.func.attr in ("importorskip", "import_module") and node.args
                      and isinstance(node.args[0], ast.Constant)):
                    names.add(str(node.args[0].value).split(".")[0])
    return names


def test_no_test_folder_shadows_an_imported_package():
    imported = _top_level_imports()
    assert {"ray", "rendezvous", "torch"} <= imported        # the scan sees what it should
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and any(p.glob("*.py"))}
    assert not folders & imported, (
        f"tests/{sorted(folders & imported)} shadow(s) the package(s) of that name: rename "
        "the folder (an __init__.py would shadow the real package outright)")
