"""Smoke test of benchmarks/compare.py: tiny sizes, every available library, one repetition.

Open MPI joins only when its venv (.venv-ompi, `bash benchmarks/setup_peers.sh`) exists; the
library selection, the skip reasons and the ratio columns are also checked in-process.
"""
import json
import os

import pytest

from .helpers import PY, ROOT, compare_module, run

pytestmark = pytest.mark.timeout(120)

OMPI_PY = os.path.join(ROOT, ".venv-ompi", "bin", "python")


def _ompi_reason():
    """None if the Open MPI venv is there and usable, else why not."""
    if not os.path.exists(OMPI_PY):
        return ".venv-ompi not found (bash benchmarks/setup_peers.sh creates it)"
    return compare_module().available("openmpi", OMPI_PY)


def test_libs_aliases_and_default():
    c = compare_module()
    a = c.parse_args(["--libs", "pycoll,mpi,MPICH,ompi"])
    assert a.libs == ["pycoll", "mpich", "openmpi"]
    assert c.parse_args([]).libs == ["pycoll", "gloo", "mpich", "openmpi"]
    assert c.parse_args([]).ompi_python == OMPI_PY
    with pytest.raises(SystemExit):
        c.parse_args(["--libs", "pycoll,nccl"])


def test_missing_openmpi_venv_is_skipped_with_reason(tmp_path):
    c = compare_module()
    why = c.available("openmpi", str(tmp_path / "nope" / "bin" / "python"))
    assert why and "setup_peers.sh" in why
    # an interpreter whose mpi4py is not Open MPI (or has no mpi4py at all) is refused too
    why = c.available("openmpi", PY)
    assert why and ("not Open MPI" in why or "not usable" in why)
    assert c.ompi_slots(1) == 1 and c.ompi_slots(64) == c.usable_cores()


def test_ratio_columns_and_best_mpi():
    c = compare_module()
    a = c.parse_args(["--libs", "pycoll,gloo,mpich,openmpi", "--collectives", "allreduce"])
    machine = {"date": "d", "host": "h", "nproc": 2, "cpu": "c", "memory_GiB": 1,
               "kernel": "k", "loadavg_start": (0, 0, 0), "git": "g"}

    def cell(lat, bw):
        return {"lat": lat, "bw": bw, "reps": 1, "spread": 0.0, "validation": []}

    agg = {("allreduce", 2, "pycoll", 1024): cell(10.0, 2.0),
           ("allreduce", 2, "gloo", 1024): cell(100.0, 0.5),
           ("allreduce", 2, "mpich", 1024): cell(5.0, 1.0),
           ("allreduce", 2, "openmpi", 1024): cell(4.0, 4.0)}
    md = c.markdown(a, machine, agg, a.libs, {}, [], {}, 1.0)
    head = next(ln for ln in md.splitlines() if ln.startswith("| size"))
    assert head.endswith("| pycoll/gloo | pycoll/mpich | pycoll/openmpi | pycoll/best MPI |")
    row = next(ln for ln in md.splitlines() if ln.startswith("| 1KiB"))
    assert row.endswith("| 4.00x | 2.00x | 0.50x | 0.50x (openmpi) |"), row
    # one MPI only: no best-MPI column
    md = c.markdown(a, machine, agg, ["pycoll", "mpich"], {}, [], {}, 1.0)
    assert "best MPI" not in md and "pycoll/mpich" in md


def test_compare_smoke(tmp_path):
    libs = ["pycoll"]
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
        libs.append("mpich")
    ompi_reason = _ompi_reason()
    if ompi_reason is None:
        libs.append("openmpi")
    if not libs:
        pytest.skip("no library to compare")
    r = run([PY, os.path.join(ROOT, "benchmarks", "compare.py"), "--sizes", "8:64", "--ranks", "2",
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
    if "mpich" in libs and "openmpi" in libs and "pycoll" in libs:
        assert "pycoll/best MPI" in md
    if mpi_reason:
        pytest.skip(f"compared without MPICH: {mpi_reason}")
    if ompi_reason:
        pytest.skip(f"compared without Open MPI: {ompi_reason}")
