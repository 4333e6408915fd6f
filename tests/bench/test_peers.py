"""The peer runners (MPI via mpiexec, Gloo via torch.distributed) use the bench's runner."""
import json
import os
import re

import pytest

from .helpers import PY, ROOT, clean_env, free_port, run

pytestmark = pytest.mark.timeout(90)

MPIEXEC = os.path.join(os.path.dirname(PY), "mpiexec")
COLLS = "allreduce,broadcast,reduce,allgather,reduce_scatter,alltoall,gather,scatter,barrier," \
        "latency,bw"


def _rows(stdout):
    out = [json.loads(ln) for ln in stdout.splitlines() if ln.startswith("{")]
    assert "meta" in out[0]
    return out[1:]


def test_mpi_runner_all_collectives_validate():
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip("mpi4py not installed")
    if not os.path.exists(MPIEXEC):
        pytest.skip("mpiexec (pip install mpich) not found")
    r = run([MPIEXEC, "-launcher", "fork", "-hosts", "127.0.0.1", "-n", "3", PY,
             os.path.join(ROOT, "benchmarks", "peers", "mpi_runner.py"), "--collectives", COLLS,
             "-m", "4:256", "-i", "3", "-x", "1", "-c", "-k", "2"],
            env=clean_env(UCX_TLS="self,sm"))
    assert r.returncode == 0, r.stderr[-2000:]
    rows = _rows(r.stdout)
    assert {x["collective"] for x in rows} == set(COLLS.split(","))
    assert all(x["validation"] == "Pass" and x["library"] == "mpi" for x in rows), rows


def test_gloo_runner_validates():
    pytest.importorskip("torch.distributed")
    port = free_port()
    procs = []
    import subprocess
    for rank in range(2):
        env = clean_env(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(
            [PY, os.path.join(ROOT, "benchmarks", "peers", "gloo_runner.py"), "--collectives",
             "allreduce,broadcast,allgather,reduce_scatter", "-m", "8:1K", "-i", "3", "-x", "1",
             "-c"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True))
    outs = [p.communicate(timeout=80) for p in procs]
    for p, (o, e) in zip(procs, outs):
        assert p.returncode == 0, e[-2000:]
    rows = _rows(outs[0][0])
    assert outs[1][0] == ""                       # only rank 0 prints
    assert {x["collective"] for x in rows} == {"allreduce", "broadcast", "allgather",
                                               "reduce_scatter"}
    assert all(x["validation"] == "Pass" and x["library"] == "gloo" for x in rows)


def test_call_loop_times_pycoll_and_mpich():
    """benchmarks/call_loop.py: both jobs run and rank 0 reports three positive times each."""
    r = run([PY, os.path.join(ROOT, "benchmarks", "call_loop.py"), "--calls", "200", "--reps", "1"],
            env=clean_env(), timeout=80)
    assert r.returncode == 0, (r.stdout[-1000:], r.stderr[-2000:])
    libs = ["pycoll"] + (["mpich"] if os.path.exists(MPIEXEC) else [])
    for lib in libs:
        line = next((ln for ln in r.stdout.splitlines() if ln.startswith(lib)), None)
        assert line is not None, r.stdout
        times = [float(x) for x in re.findall(r"\d+\.\d+", line.split(":", 1)[1])]
        assert len(times) == 6 and all(t > 0 for t in times), line
