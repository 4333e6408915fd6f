#!/usr/bin/env python3
"""Why the OSU broadcast loop times what it times: per rank, how long its broadcast takes,
when it starts it relative to the root, and which rank leaves the (untimed) barrier first.

    python -m pycoll.run -n 4 benchmarks/experiments/broadcast_order.py pycoll
    mpirun -n 4 python benchmarks/experiments/broadcast_order.py mpi  # Open MPI, MPICH (mpi4py)

The loop is OSU's (``osu_bcast.c``; ``pycoll.bench`` and benchmarks/compare.py time it so):
each rank times its own 8-byte broadcast from rank 0, then an untimed barrier. Every rank
writes its start and end times (CLOCK_MONOTONIC, one clock for all processes of the host) to
a file in a temporary folder named after rank 0's process. Rank 0 reads them all and prints,
over the timed iterations: each rank's mean and median; each receiver's start and end
relative to the root's start; how often each rank started first (left the barrier first);
and the period of the loop (root start to root start), the whole cost of one broadcast and
one barrier.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np

ITERATIONS, WARMUP = 3000, 500


def main() -> None:
    lib = sys.argv[1] if len(sys.argv) > 1 else "pycoll"
    if lib == "mpi":
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        rank, size = comm.Get_rank(), comm.Get_size()
        arr = np.zeros(2, np.float32)

        def bcast():
            comm.Bcast(arr, root=0)
        barrier = comm.Barrier

        def share(word):
            comm.Bcast(word, root=0)
    else:
        import pycoll
        pc = pycoll.init()
        rank, size = pc.rank, pc.size
        arr = np.zeros(2, np.float32)

        def bcast():
            pc.broadcast(arr, 0)
        barrier = pc.barrier

        def share(word):
            pc.broadcast(word, 0)
    # the folder is named after rank 0's process id, which every rank learns by a broadcast
    word = np.array([os.getpid()], dtype=np.int64)
    share(word)
    folder = os.path.join(tempfile.gettempdir(), f"pycoll-bcast-order-{int(word[0])}")
    os.makedirs(folder, exist_ok=True)
    barrier()
    starts, ends = np.empty(ITERATIONS), np.empty(ITERATIONS)
    perf = time.perf_counter
    for i in range(ITERATIONS):
        t0 = perf()
        bcast()
        t1 = perf()
        starts[i], ends[i] = t0, t1
        barrier()
    np.save(os.path.join(folder, f"rank{rank}.npy"), np.stack([starts, ends]))
    barrier()
    if rank != 0:
        return
    times = [np.load(os.path.join(folder, f"rank{r}.npy"))[:, WARMUP:] for r in range(size)]
    for r, (s, e) in enumerate(times):
        d = (e - s) * 1e6
        print(f"rank {r}: broadcast mean {d.mean():.2f} us, median {np.median(d):.2f}")
    root_start = times[0][0]
    for r in range(1, size):
        s, e = times[r]
        print(f"rank {r}: starts {np.median((s - root_start) * 1e6):+.2f} us after the root "
              f"(median), ends {np.median((e - root_start) * 1e6):+.2f}")
    first = np.argmin(np.stack([t[0] for t in times]), axis=0)
    print("left the barrier first (iterations per rank):",
          np.bincount(first, minlength=size).tolist())
    period = np.diff(root_start) * 1e6
    print(f"period of the loop (broadcast + barrier): median {np.median(period):.2f} us, "
          f"mean {period.mean():.2f}")
    for r in range(size):
        os.remove(os.path.join(folder, f"rank{r}.npy"))
    os.rmdir(folder)


if __name__ == "__main__":
    main()
