"""``--memory``: what a benchmark costs in memory on each rank.

Two numbers per rank, taken after each size: the process's peak resident set (``VmHWM`` of
/proc/self/status, the kernel's high-water mark; ``ru_maxrss`` where /proc is missing), and
the bytes the library holds for communication, from the backend's ``held_memory()``
(pycoll: ``Communicator.held_memory()``, the transports' mapped segments plus the fast
path's, and memory registered with a NIC or exposed to one-sided puts). The peak includes
the benchmark's own buffers, which is what a user sizing a job wants; the segment and
registered bytes say how much of it is pycoll's. Rows get the minimum and maximum over
ranks: ranks differ (lazily opened channels, the fast path's owner).
"""
from __future__ import annotations

import resource

import numpy as np

#: (row field stem, index in ``rank_memory``)
FIELDS = (("peak_rss_bytes", 0), ("segment_bytes", 1), ("registered_bytes", 2))


def peak_rss_bytes() -> int:
    """This process's peak resident set size in bytes."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024   # KiB on Linux


def held_bytes(backend) -> tuple[float, float]:
    """(segment, registered) bytes the backend's library holds; NaN where it cannot say."""
    f = getattr(backend, "held_memory", None)
    held = f() if f is not None else None
    if held is None:
        return float("nan"), float("nan")
    return (float(sum(v.get("segment", 0) for v in held.values())),
            float(sum(v.get("registered", 0) for v in held.values())))


def rank_memory(backend) -> list[float]:
    """This rank's [peak RSS, segment, registered] bytes, for ``allgather_floats``."""
    return [float(peak_rss_bytes()), *held_bytes(backend)]


def memory_fields(stats: np.ndarray) -> dict:
    """``<stem>_min`` / ``<stem>_max`` over ranks from every rank's ``rank_memory``."""
    out: dict = {}
    for stem, i in FIELDS:
        col = stats[:, i]
        known = not np.isnan(col).any()
        out[f"{stem}_min"] = int(col.min()) if known else None
        out[f"{stem}_max"] = int(col.max()) if known else None
    return out


def measure_memory(backend) -> dict:
    """Every rank's memory, exchanged (collective: every rank calls it), as row fields."""
    return memory_fields(backend.allgather_floats(rank_memory(backend)))
