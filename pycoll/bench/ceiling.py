"""The ``-d cuda`` ceiling: device-to-device copy bandwidth on each rank's GPU, same run.

A collective on CUDA buffers cannot move data faster than the GPU copies it within its own
memory, so ``python -m pycoll.bench ... -d cuda`` measures ``dst.copy_(src)`` on every rank's
device at the run's largest message size, before the sweep, and reports busbw next to it
(``%d2d`` = busbw / D2D copy x 100).  The numbers drift between runs and machines, which
is why the ceiling is taken in the same run as the numbers it normalises.

Convention: bytes copied / time (one direction, like algbw = size / time), GB = 1e9 B.
CUDA samples' ``bandwidthTest`` counts a D2D copy twice (read + write); its figure is about
twice this one.

Only the ``-d cuda`` path uses this module; :func:`d2d_copy_bandwidth` also accepts a CPU
device (timed with ``perf_counter``), so its loop can be exercised where there is no GPU.
"""
from __future__ import annotations

import math
import statistics
import time

#: timed repetitions (the median is reported)
REPS = 5
#: each repetition copies at least this many bytes (several copies back to back for small
#: messages, so launch overhead and event resolution do not dominate) ...
MIN_BYTES_PER_REP = 64 << 20
#: ... but never more than this many copies
MAX_COPIES_PER_REP = 100


def copies_per_rep(nbytes: int) -> int:
    """Back-to-back copies timed together at ``nbytes`` (1 at 64 MiB and above)."""
    nbytes = max(1, int(nbytes))
    return max(1, min(MAX_COPIES_PER_REP, math.ceil(MIN_BYTES_PER_REP / nbytes)))


def median_gbps(nbytes: int, copies: int, seconds: list[float]) -> float:
    """Median over repetitions of ``copies * nbytes / seconds`` in GB/s (1e9 B)."""
    rates = [copies * nbytes / s / 1e9 for s in seconds if s > 0]
    if not rates:
        raise ValueError("no timed repetition took a measurable time")
    return float(statistics.median(rates))


def pct_of(busbw_gbps: float, ceiling_gbps: float | None) -> float | None:
    """busbw as a percentage of the ceiling (None without a usable ceiling)."""
    if ceiling_gbps is None or not ceiling_gbps > 0 or math.isnan(ceiling_gbps):
        return None
    return 100.0 * busbw_gbps / ceiling_gbps


def d2d_copy_bandwidth(nbytes: int, device=None, reps: int = REPS) -> dict:
    """Time ``dst.copy_(src)`` of ``nbytes`` on ``device`` (default: the current CUDA device).

    CUDA: each repetition is ``copies_per_rep(nbytes)`` copies between two CUDA events on the
    current stream.  Returns ``{"GBps": median, "bytes", "copies", "reps", "device",
    "seconds": [...]}``.  The two buffers are freed (and torch's cache emptied) before
    returning, so the benchmark's own buffers do not compete with them.
    """
    import torch

    dev = torch.device(device) if device is not None else \
        torch.device("cuda", torch.cuda.current_device())
    cuda = dev.type == "cuda"
    n = max(1, int(nbytes))
    copies = copies_per_rep(n)
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    try:
        src.fill_(1)                 # touch both buffers; the first copy is a warm-up
        dst.copy_(src)
        if cuda:
            torch.cuda.synchronize(dev)
        seconds = []
        for _ in range(max(1, reps)):
            if cuda:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(copies):
                    dst.copy_(src)
                end.record()
                end.synchronize()
                seconds.append(start.elapsed_time(end) / 1e3)     # ms -> s
            else:
                t0 = time.perf_counter()
                for _ in range(copies):
                    dst.copy_(src)
                seconds.append(time.perf_counter() - t0)
    finally:
        del src, dst
        if cuda:
            torch.cuda.empty_cache()
    return {"GBps": median_gbps(n, copies, seconds), "bytes": n, "copies": copies,
            "reps": len(seconds), "device": str(dev), "seconds": seconds}


def measure_ceiling(backend, nbytes: int, reps: int = REPS, device=None) -> dict:
    """D2D copy bandwidth on every rank's GPU, one rank at a time (ranks sharing a GPU must
    not slow each other down).  Collective over ``backend`` (barriers and one
    ``allgather_floats``): every rank returns the same dict, with ``GBps`` = the slowest
    rank's figure (a collective waits for its slowest member), ``per_rank_GBps``, ``bytes``,
    ``reps``, and ``error`` (a rank's failure, e.g. out of memory: then ``GBps`` is None and
    the run goes on without the ceiling).  ``device``: as for :func:`d2d_copy_bandwidth`."""
    got = None
    err = ""
    for r in range(backend.world_size):
        if r == backend.rank:
            try:
                got = d2d_copy_bandwidth(nbytes, device=device, reps=reps)
            except Exception as e:      # noqa: BLE001 - reported, the sweep still runs
                err = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        backend.barrier()
    mine = got["GBps"] if got is not None else float("nan")
    per_rank = [float(x) for x in backend.allgather_floats([mine])[:, 0]]
    failed = [r for r, x in enumerate(per_rank) if not x > 0]
    out = {"bytes": max(1, int(nbytes)), "reps": reps, "copies": copies_per_rep(nbytes),
           "per_rank_GBps": per_rank, "GBps": None if failed else min(per_rank),
           "error": None}
    if failed:
        out["error"] = (f"not measured on rank(s) {', '.join(map(str, failed))}"
                        + (f" (rank {backend.rank}: {err})" if err else ""))
    return out
