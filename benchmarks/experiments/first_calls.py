#!/usr/bin/env python3
"""What a new process pays before its small calls run at speed: ``pycoll.init`` and the first
allreduce, broadcast and barrier (8 bytes), which load the fast path's kernels and the
compiled call path's entry points from numba's cache.

    python -m pycoll.run -n 2 benchmarks/experiments/first_calls.py

Rank 0 prints both times in seconds. Run it a few times: the first run on a machine (or
after a change of the kernels) compiles instead of loading.
"""
from __future__ import annotations

import time

import numpy as np


def main() -> None:
    t0 = time.perf_counter()
    import pycoll
    comm = pycoll.init()
    t1 = time.perf_counter()
    a = np.zeros(2, np.float32)
    comm.allreduce(a)
    comm.broadcast(a, 0)
    comm.barrier()
    t2 = time.perf_counter()
    if comm.rank == 0:
        print(f"init {t1 - t0:.2f} s, first three calls {t2 - t1:.2f} s", flush=True)
    pycoll.finalize()


if __name__ == "__main__":
    main()
