"""setup.py without a working C compiler (or without Cython): the optional compiled call path
is left out with a warning that says so (pip shows it with -v), or, with
``PYCOLL_REQUIRE_C=1``, the build fails. The build runs on a copy of what setup.py builds
from, with ``CC`` pointing at ``false`` (a compiler that fails every file); where Cython is
not installed it fails before that, and says so the same way."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
FILES = ["setup.py", "pyproject.toml", "README.md", "pycoll/__init__.py", "pycoll/_version.py",
         "pycoll/runtime/__init__.py", "pycoll/runtime/state.py", "pycoll/runtime/state.pxd",
         "pycoll/fastpath/__init__.py", "pycoll/fastpath/callpath.py",
         "pycoll/fastpath/callpath.pxd", "pycoll/runtime/ndarray.pxd",
         "pycoll/comm/__init__.py", "pycoll/comm/mapped.py", "pycoll/comm/mapped.pxd"]


def _build(tmp_path: Path, require: bool) -> subprocess.CompletedProcess[str]:
    for name in FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tmp_path / name)
    false = shutil.which("false")
    assert false is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYCOLL_")}
    env.update(CC=false, LDSHARED=false)
    if require:
        env["PYCOLL_REQUIRE_C"] = "1"
    # build_ext alone: the package's Python files are not needed for it
    return subprocess.run([sys.executable, "setup.py", "build_ext", "--build-lib", "lib",
                           "--build-temp", "tmp"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=240)


def test_a_failed_build_warns_and_goes_on(tmp_path):
    r = _build(tmp_path, require=False)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout + r.stderr
    for name in ("pycoll.runtime.state", "pycoll.fastpath.callpath", "pycoll.comm.mapped"):
        assert f"WARNING: pycoll's compiled module {name} did not build" in out, out
    assert "PYCOLL_REQUIRE_C=1" in out
    assert not list((tmp_path / "lib").rglob("*.so"))


def test_a_failed_build_fails_when_the_c_part_is_required(tmp_path):
    r = _build(tmp_path, require=True)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "did not build" not in r.stdout + r.stderr
