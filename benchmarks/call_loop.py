#!/usr/bin/env python3
"""The cost of one small call, without the benchmark's barrier between calls: pycoll's
``comm.allreduce`` / ``comm.barrier`` against MPICH's ``Allreduce`` / ``Barrier`` (mpi4py),
in back-to-back loops.

    python benchmarks/call_loop.py [--ranks 2] [--bytes 8] [--calls 20000] [--reps 5]

It starts the job itself twice (``python -m pycoll.run`` for pycoll, the mpich wheel's
``mpiexec`` for MPICH), each rank running this file with ``--rank-body``. Rank 0 prints, per
library, the best and the median over repetitions of the time per call (µs): ``loop`` (calls
back to back: what the call itself costs, the peers in step), ``osu`` (each call timed,
a barrier after it, as ``pycoll.bench`` and benchmarks/compare.py time) and ``barrier``.
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
from compare import find_mpiexec  # noqa: E402


def _loops(allreduce, barrier, arr: np.ndarray, calls: int, reps: int) -> dict:
    perf = time.perf_counter

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
    results: dict[str, list[float]] = {"loop": [], "osu": [], "barrier": []}
    for _ in range(reps):
        results["loop"].append(loop())
        results["osu"].append(osu())
        results["barrier"].append(barriers())
    return results


def rank_body(lib: str, nbytes: int, calls: int, reps: int) -> None:
    arr = np.zeros(max(1, nbytes // 4), dtype=np.float32)
    if lib == "pycoll":
        import pycoll
        comm = pycoll.init()
        results = _loops(comm.allreduce, comm.barrier, arr, calls, reps)
        rank = comm.rank
        pycoll.finalize()
    else:
        from mpi4py import MPI
        c = MPI.COMM_WORLD
        in_place, op = MPI.IN_PLACE, MPI.SUM
        results = _loops(lambda a: c.Allreduce(in_place, a, op=op), c.Barrier, arr, calls, reps)
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
    ap.add_argument("--rank-body", choices=("pycoll", "mpich"), help=argparse.SUPPRESS)
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
        return rc
    env = dict(os.environ, UCX_TLS="self,sm")
    rc |= subprocess.run([mpiexec, "-launcher", "fork", "-hosts", "127.0.0.1", "-n",
                          str(a.ranks), py, *args, "mpich"], env=env, timeout=600).returncode
    return rc


if __name__ == "__main__":
    sys.exit(main())
