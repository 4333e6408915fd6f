"""``--nonblocking W``: calls posted with ``async_op=True``, and how much of them computing
hides (OSU's non-blocking collectives, ``osu_iallreduce`` and kin).

Each iteration posts W calls, each on its own buffers, then waits for all of them. Two
passes of the same iterations:

1. pure communication: post W, wait all. ``Pure Comm.`` is the mean time of a window;
   the latency per call (the table's ``Avg Latency(us)``) is that over W.
2. overlap: post W, compute for the pure-communication time (the mean over ranks, so every
   rank computes alike), wait all. ``Overall`` is the mean time of a window, ``Compute``
   the time the compute actually took.

``Overlap(%) = 100 * (1 - (Overall - Compute) / Pure Comm.)``, clamped to [0, 100], from the
means over ranks, as OSU computes it: 100 when the calls finished entirely behind the compute,
0 when computing delayed them by its whole length. The compute is numpy arithmetic on a
small array in a loop until the time is up: numpy releases the GIL inside each operation,
as real work (a numpy or torch kernel) does, so pycoll's worker thread can progress; a pure
Python loop would hold the GIL and measure the interpreter instead.
"""
from __future__ import annotations

import time

import numpy as np

#: elements of the compute's arrays: a few microseconds per operation, so the compute
#: overshoots its target by little
COMPUTE_ELEMENTS = 4096


class BusyCompute:
    """Arithmetic that runs for a given time, releasing the GIL while it computes."""

    def __init__(self) -> None:
        self.a = np.ones(COMPUTE_ELEMENTS)
        self.out = np.empty(COMPUTE_ELEMENTS)

    def run(self, seconds: float) -> float:
        """Compute for about ``seconds``; return the time it took."""
        perf = time.perf_counter
        t0 = perf()
        end = t0 + seconds
        while perf() < end:
            np.multiply(self.a, 1.0000001, out=self.out)
        return perf() - t0


def measure_nonblocking(backend, steps: list, iters: int, warmup: int, roots: list[int],
                        algo: str | None) -> tuple[np.ndarray, list[float]]:
    """Both passes on this rank: (per-call latency of each timed window (s), [pure, overall,
    compute] means (s)) -- the latter for ``allgather_floats``."""
    b = backend
    first = steps[0]
    coll, op = first.collective, first.op
    compute = BusyCompute()
    perf = time.perf_counter

    def window(it: int, seconds: float) -> tuple[float, float]:
        r = roots[it % len(roots)]
        t0 = perf()
        works = [b.op(coll, s.bufs, op, r, algo, async_op=True) for s in steps]
        spent = compute.run(seconds) if seconds else 0.0
        for w in works:
            w.wait()
        b.sync()
        return perf() - t0, spent

    pure = np.empty(iters)
    for it in range(warmup + iters):
        t, _ = window(it, 0.0)
        if it >= warmup:
            pure[it - warmup] = t
        b.barrier()
    target = float(b.allgather_floats([float(pure.mean())])[:, 0].mean())
    overall = np.empty(iters)
    spent = np.empty(iters)
    for it in range(warmup + iters):
        t, c = window(it, target)
        if it >= warmup:
            overall[it - warmup], spent[it - warmup] = t, c
        b.barrier()
    return pure / len(steps), [float(pure.mean()), float(overall.mean()), float(spent.mean())]


def overlap_fields(stats: np.ndarray, window: int) -> dict:
    """Row fields from every rank's [pure, overall, compute] (a (ranks, 3) array, s)."""
    pure, overall, compute = (float(stats[:, i].mean()) for i in range(3))
    overlap = 100.0 * (1.0 - (overall - compute) / pure) if pure > 0 else 0.0
    return {"nonblocking": window, "pure_comm_us": pure * 1e6, "overall_us": overall * 1e6,
            "compute_us": compute * 1e6, "overlap_pct": min(100.0, max(0.0, overlap))}
