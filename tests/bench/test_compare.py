"""Smoke test of bench/compare.py: tiny sizes, every available library, one repetition."""
import json
import os

import pytest

from .helpers import PY, ROOT, pycoll_core_available, run

pytestmark = pytest.mark.timeout(120)


def test_compare_smoke(tmp_path):
    libs = []
    if pycoll_core_available() is None:
        libs.append("pycoll")
    try:
        import torch.distributed  # noqa: F401
        libs.append("gloo")
    except ImportError:
        pass
    mpi_reason = None
    try:
        import mpi4py  # noqa: F401
        if not os.path.exists(os.path.join(os.path.dirname(PY), "mpiexec")):
            mpi_reason = "mpiexec not found next to the interpreter (pip install mpich)"
    except ImportError:
        mpi_reason = "mpi4py not installed"
    if mpi_reason is None:
        libs.append("mpi")
    if not libs:
        pytest.skip("no library to compare")
    r = run([PY, os.path.join(ROOT, "bench", "compare.py"), "--sizes", "8:64", "--ranks", "2",
             "--collectives", "allreduce,broadcast", "--libs", ",".join(libs), "--reps", "1",
             "--time-budget", "0.05", "--min-iterations", "3", "-c", "--label", "smoke",
             "--out", str(tmp_path)], timeout=110)
    assert r.returncode == 0, r.stderr[-3000:]
    (d,) = list(tmp_path.iterdir())
    assert d.name.endswith("-smoke")
    md = (d / "results.md").read_text()
    assert "## allreduce, 2 ranks" in md and "## broadcast, 2 ranks" in md
    for lib in libs:
        assert f"{lib} lat (us)" in md and f"{lib} busbw (GB/s)" in md
    if "pycoll" in libs:
        for lib in libs:
            if lib != "pycoll":
                assert f"pycoll/{lib}" in md
    assert "| 64B |" in md
    machine = json.loads((d / "machine.json").read_text())
    assert machine["nproc"] >= 1 and machine["memory_GiB"] > 0
    raw = [json.loads(ln) for ln in (d / "raw.jsonl").read_text().splitlines()]
    assert {x["library"] for x in raw} == set(libs)
    assert all(x["validation"] == "Pass" for x in raw)
    try:
        import matplotlib  # noqa: F401
        assert (d / "allreduce-n2.png").read_bytes()[:4] == b"\x89PNG"
    except ImportError:
        pass
    if mpi_reason:
        pytest.skip(f"compared without MPI: {mpi_reason}")
