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
    for p, (_o, e) in zip(procs, outs):
        assert p.returncode == 0, e[-2000:]
    rows = _rows(outs[0][0])
    assert outs[1][0] == ""                       # only rank 0 prints
    assert {x["collective"] for x in rows} == {"allreduce", "broadcast", "allgather",
                                               "reduce_scatter"}
    assert all(x["validation"] == "Pass" and x["library"] == "gloo" for x in rows)


def test_call_loop_times_pycoll_and_mpich():
    """benchmarks/call_loop.py: both jobs run and rank 0 reports, for each of its six loops
    (allreduce back to back and in the OSU loop, barrier, broadcast, broadcast + barrier,
    broadcast + allreduce), a best and a median time, all positive."""
    r = run([PY, os.path.join(ROOT, "benchmarks", "call_loop.py"), "--calls", "200", "--reps", "1"],
            env=clean_env(), timeout=80)
    assert r.returncode == 0, (r.stdout[-1000:], r.stderr[-2000:])
    libs = ["pycoll"] + (["mpich"] if os.path.exists(MPIEXEC) else [])
    loops = ["loop", "osu", "barrier", "bcast", "bcast+barrier", "bcast+allreduce"]
    for lib in libs:
        line = next((ln for ln in r.stdout.splitlines() if ln.startswith(lib)), None)
        assert line is not None, r.stdout
        cells = re.findall(r"(\S+) (\d+\.\d+) / (\d+\.\d+)", line.split(":", 1)[1])
        assert [c[0] for c in cells] == loops, line
        assert all(float(c[1]) > 0 and float(c[2]) >= float(c[1]) for c in cells), line


def test_broadcast_order_reports_every_rank_for_pycoll_and_mpich():
    """benchmarks/experiments/broadcast_order.py: each rank's broadcast time, each receiver's start
    after the root's, how often each rank left the barrier first (one count per timed iteration,
    2,500 in all) and the loop's period, under pycoll's launcher and MPICH's."""
    script = os.path.join(ROOT, "benchmarks", "experiments", "broadcast_order.py")
    jobs = [("pycoll", [PY, "-m", "pycoll.run", "-n", "3", script, "pycoll"])]
    if os.path.exists(MPIEXEC):
        jobs.append(("mpi", [MPIEXEC, "-launcher", "fork", "-hosts", "127.0.0.1", "-n", "3",
                             PY, script, "mpi"]))
    for lib, cmd in jobs:
        r = run(cmd, env=dict(clean_env(), UCX_TLS="self,sm"), timeout=80)
        assert r.returncode == 0, (lib, r.stdout[-1000:], r.stderr[-2000:])
        out = r.stdout
        assert len(re.findall(r"^rank \d: broadcast mean \d+\.\d+ us", out, re.M)) == 3, out
        assert len(re.findall(r"^rank [12]: starts [-+]\d+\.\d+ us after the root", out,
                              re.M)) == 2, out
        counts = re.search(r"left the barrier first \(iterations per rank\): \[(.*)\]", out)
        assert counts is not None and sum(map(int, counts.group(1).split(","))) == 2500, out
        assert re.search(r"period of the loop .*: median \d+\.\d+ us", out), out


def test_first_calls_reports_both_times():
    """benchmarks/experiments/first_calls.py: the init and the first calls of a 2-rank job, in
    seconds."""
    r = run([PY, "-m", "pycoll.run", "-n", "2",
             os.path.join(ROOT, "benchmarks", "experiments", "first_calls.py")],
            env=clean_env(), timeout=80)
    assert r.returncode == 0, (r.stdout[-1000:], r.stderr[-2000:])
    m = re.search(r"init (\d+\.\d+) s, first three calls (\d+\.\d+) s", r.stdout)
    assert m is not None and float(m.group(1)) > 0 and float(m.group(2)) > 0, r.stdout
