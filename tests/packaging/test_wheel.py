"""The package as a user gets it: ``python -m build``, the wheel in a clean venv, README's example.

The tests elsewhere run the checkout; this one runs what ``pip install pycoll`` would install.
The source tree (tracked and new files, no build products) is copied aside and built with
``python -m build`` (sdist, then the wheel from the sdist: a file missing from the sdist
breaks the wheel). The wheel goes into a fresh venv (no system site-packages; pip fetches
numpy and numba as a user's pip would), and from a directory outside the checkout:

* every module of ``pycoll/`` and ``rendezvous/`` is in the wheel, with ``py.typed``;
* the console scripts exist, and ``pycoll-info --json`` reports the compiled path usable
  (numba is part of the default install), with its calls compiled where a C compiler is
  (setup.py compiles ``pycoll/fastpath/callpath.py`` with Cython, a build requirement);
* README.md's first Python example runs on 2 ranks under ``pycoll-run`` and imports the
  installed package, not the checkout.

It needs pip to reach an index (or its cache), as installing does; it takes about a minute.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".git", ".venv", "build", "dist", "__pycache__", ".mypy_cache", ".ruff_cache",
             ".pytest_cache"}


def _copy_source(dest: Path) -> None:
    """The files git would ship (tracked and new, not ignored); without git, the tree minus
    build products and caches."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard",
                             "-z"], capture_output=True, timeout=60)
    if listed.returncode == 0:
        for name in filter(None, listed.stdout.decode().split("\0")):
            src = ROOT / name
            if src.is_file():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / name)
        return
    shutil.copytree(ROOT, dest, dirs_exist_ok=True, ignore=lambda d, names: [
        n for n in names if n in SKIP_DIRS or n.endswith(".egg-info")])


def _clean_env() -> dict[str, str]:
    """The environment without anything that points Python at the checkout or another venv."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME") and not k.startswith("PYCOLL_")}


def _run(cmd: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, cwd=cwd, env=_clean_env(), capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{cmd} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def _readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    found = re.search(r"```python\n(.*?)```", text, re.S)
    assert found, "README.md has no ```python example"
    return found.group(1)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    pytest.importorskip("build", reason="python -m build needs the 'build' package "
                                        "(the test extra)")
    base = tmp_path_factory.mktemp("wheel")
    src, dist, env_dir, work = (base / n for n in ("src", "dist", "venv", "work"))
    for d in (src, work):
        d.mkdir()
    _copy_source(src)
    _run([sys.executable, "-m", "build", "--outdir", str(dist), str(src)], base, 300)
    wheels = list(dist.glob("pycoll-*.whl"))
    assert len(wheels) == 1, list(dist.iterdir())
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    _run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", str(wheels[0])], work,
         400)
    return wheels[0], env_dir / "bin", work


def test_the_wheel_holds_every_module(installed):
    wheel, _, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in ("pycoll", "rendezvous"):
        expected = {p.relative_to(ROOT).as_posix() for p in (ROOT / package).rglob("*.py")
                    if "__pycache__" not in p.parts}
        assert expected, package
        missing = sorted(expected - names)
        assert not missing, f"not in the wheel: {missing}"
        assert f"{package}/py.typed" in names


def test_console_scripts_and_the_compiled_path_from_a_plain_install(installed):
    _, bin_dir, work = installed
    for script in ("pycoll-run", "pycoll-bench", "pycoll-info", "pycoll-trace"):
        assert (bin_dir / script).exists(), script
    report = json.loads(_run([str(bin_dir / "pycoll-info"), "--json"], work, 120).stdout)
    assert report["extras"]["numba"]["found"] and report["extras"]["numba"]["imports"]
    assert report["fast_path"]["on"], report["fast_path"]
    if shutil.which(os.environ.get("CC", "cc")):    # setup.py built the compiled call path
        assert report["fast_path"]["call_path"] == "c", report["fast_path"]
    where = _run([str(bin_dir / "python"), "-c", "import pycoll; print(pycoll.__file__)"],
                 work, 60).stdout.strip()
    assert Path(where).is_relative_to(bin_dir.parent), where


def test_the_readme_example_runs_from_the_installed_wheel(installed):
    _, bin_dir, work = installed
    example = work / "example.py"
    # each rank leaves a file naming the pycoll it imported (the ranks' stderr interleaves)
    example.write_text(_readme_example() + "\nimport os, pycoll as _p\n"
                       "assert float(grad[0]) == 1.0 and float(grad.sum()) == grad.size\n"
                       "open(f'ok-{os.getpid()}', 'w').write(_p.__file__)\n")
    done = _run([str(bin_dir / "pycoll-run"), "-n", "2", str(example)], work, 120)
    imported = [p.read_text() for p in work.glob("ok-*")]
    assert len(imported) == 2, (imported, done.stderr)
    assert all(Path(f).is_relative_to(bin_dir.parent) for f in imported), imported
    assert "RuntimeWarning" not in done.stderr, done.stderr
