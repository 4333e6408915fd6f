"""The device script (tools/gpu_checks.sh) stays ready to run: CI has no GPU, so a rename in
the tree would otherwise be found only on the scarce GPU machine, costing its minutes.

Checks what can be checked without a GPU: the script parses, every file it runs exists, every
name its drivers import from the tests exists there, the drivers compile, and its stage
machinery (time limit, killing what a stage started, skipping what no longer fits, the
summary) works, on a stand-in stage list run on the CPU.
"""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "gpu_checks.sh"


def test_the_script_parses_and_every_file_it_runs_exists():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    text = SCRIPT.read_text()
    named = set(re.findall(r"(?:tools/gpu/\w+\.py|benchmarks/\w+\.py|tests/[\w/]+\.py)", text))
    assert "tools/gpu/correctness.py" in named and "benchmarks/ddp_cuda.py" in named
    for path in named:
        assert (ROOT / path).is_file(), f"tools/gpu_checks.sh runs {path}, which is not there"


def test_every_name_the_drivers_import_from_the_tests_exists():
    imports = {"tools/gpu/correctness.py": "tests/cuda/test_cuda_collectives.py",
               "tools/gpu/torch_cuda.py": "tests/torch_backend/torch_harness.py"}
    for driver, module in imports.items():
        tree = ast.parse((ROOT / driver).read_text())
        wanted = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                  and node.module == Path(module).stem for alias in node.names}
        assert wanted, f"{driver} imports nothing from {module}"
        defined = {node.name for node in ast.parse((ROOT / module).read_text()).body
                   if isinstance(node, ast.FunctionDef)}
        assert wanted <= defined, f"{driver} imports {wanted - defined} from {module}"
    worker = (ROOT / "tests/torch_backend").glob("*.py")
    assert any("def scenario_cuda(" in p.read_text() for p in worker)
    for driver in (ROOT / "tools" / "gpu").glob("*.py"):
        compile(driver.read_text(), str(driver), "exec")


def test_stages_are_time_boxed_reaped_skipped_and_summarised(tmp_path):
    """The script's own stage() with a stand-in list: a stage that hangs with a child in a
    session of its own is killed at its limit with that child, the next stage still runs,
    and a stage that no longer fits the budget is skipped; summary.txt says each."""
    text = SCRIPT.read_text()
    machinery = text[:text.index("stage env ")]
    marker = tmp_path / "child.pid"
    stand_in = machinery + f"""
export -f left
export T0 LIMIT
stage hang 3 a.txt bash -c 'setsid sleep 300 & echo $! >{marker}; sleep 300'
stage quick 60 a.txt bash -c 'while [ "$(left)" -ge 14 ]; do sleep 0.2; done; exit 3'
stage late 60 a.txt bash -c 'echo never'
"""
    script = tmp_path / "stand_in.sh"
    script.write_text(stand_in)
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "LIMIT": "30", "PY": sys.executable}
    subprocess.run(["bash", str(script)], env=env, cwd=ROOT, timeout=90, check=True)
    summary = (out / "summary.txt").read_text()
    assert re.search(r"^hang rc=124 ", summary, re.M), summary
    assert re.search(r"^quick rc=3 ", summary, re.M), summary
    assert "SKIP late" in summary, summary
    child = Path(f"/proc/{int(marker.read_text())}/stat")
    assert not child.exists() or child.read_text().split()[2] == "Z", "the stage's child lives on"
    assert "TIMED OUT" in (out / "a.txt").read_text()


def _wheel(path: Path, name: str, files: dict[str, tuple[bytes, int]]) -> Path:
    import zipfile
    whl = path / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for arc, (data, mode) in files.items():
            info = zipfile.ZipInfo(arc)
            info.external_attr = mode << 16
            z.writestr(info, data)
    return whl


def test_install_wheels_lays_them_out_as_pip_does(tmp_path):
    """The CPU comparison's MPI wheels are installed on the GPU machine without pip
    (tools/gpu/install_wheels.py): packages into site-packages, ``.data/data`` into the
    prefix (the MPI wheels' mpiexec and libmpi), scripts with ``#!python`` pointed at the
    venv's interpreter, executable bits kept; the venv also imports this interpreter's
    packages (numpy), and its own win over them."""
    whl = _wheel(tmp_path, "demo", {
        "demo/__init__.py": (b"WHERE = 'venv'\n", 0o644),
        "numpy_shadow_check.py": (b"import numpy\nNUMPY = numpy.__version__\n", 0o644),
        "demo-1.0.data/data/bin/tool": (b"#!/bin/sh\necho tool ran\n", 0o755),
        "demo-1.0.data/data/lib/libdemo.so": (b"\x7fELF", 0o644),
        "demo-1.0.data/scripts/demo-script": (b"#!python\nimport demo; print(demo.WHERE)\n",
                                              0o644),
        "demo-1.0.dist-info/METADATA": (b"Name: demo\nVersion: 1.0\n", 0o644),
    })
    prefix = tmp_path / "venv"
    subprocess.run([sys.executable, str(ROOT / "tools" / "gpu" / "install_wheels.py"),
                    str(prefix), str(whl)], check=True, timeout=120)
    assert (prefix / "lib" / "libdemo.so").read_bytes() == b"\x7fELF"
    tool = prefix / "bin" / "tool"
    assert subprocess.run([str(tool)], capture_output=True, text=True,
                          timeout=30).stdout == "tool ran\n"
    script = subprocess.run([str(prefix / "bin" / "demo-script")], capture_output=True,
                            text=True, timeout=60, env={**os.environ, "PYTHONPATH": ""})
    assert script.stdout == "venv\n", script.stderr
    import numpy
    got = subprocess.run([str(prefix / "bin" / "python"), "-c",
                          "import numpy_shadow_check as m, demo, sys; "
                          "print(m.NUMPY, demo.__file__.startswith(sys.prefix))"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": ""})
    assert got.stdout.split() == [numpy.__version__, "True"], got.stderr
