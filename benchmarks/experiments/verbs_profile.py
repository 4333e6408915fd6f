"""Where an 8-byte verbs message's time goes: a ping-pong timed plainly, then under cProfile
(rank 0's top functions by own time), plus the cost of single pyverbs calls in a loop.

    bash tests/verbs/run_in_vm.sh --cmd python3 benchmarks/experiments/verbs_profile.py [iters]

Runs in the rdma-lab VM (Soft-RoCE under TCG: absolute numbers are ~10x native; the split
is what counts). ``PYCOLL_TRANSPORTS`` defaults to verbs; set it to tcp to compare.
"""
from __future__ import annotations

import cProfile
import io
import os
import pstats
import struct
import sys
import time
from typing import Any

import numpy as np

from pycoll.testing import run_ranks

ITERS = int(sys.argv[1]) if len(sys.argv) > 1 else 300


def _pingpong(comm, n):
    buf = np.zeros(1, dtype=np.float64)
    peer = 1 - comm.rank
    for _ in range(n):
        if comm.rank == 0:
            comm.send(buf, peer)
            comm.recv(buf, peer)
        else:
            comm.recv(buf, peer)
            comm.send(buf, peer)


def _rank(comm, iters):
    _pingpong(comm, 50)
    comm.barrier()
    t0 = time.perf_counter()
    _pingpong(comm, iters)
    plain = (time.perf_counter() - t0) / (2 * iters) * 1e6
    comm.barrier()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    _pingpong(comm, iters)
    prof.disable()
    profiled = (time.perf_counter() - t0) / (2 * iters) * 1e6
    comm.barrier()
    return plain, profiled, _table(prof, 2 * iters)


def _table(prof: cProfile.Profile, messages: int, top: int = 24) -> str:
    """The functions with the most own time: calls and microseconds per message sent one way
    (a round trip is two), and per call."""
    stats = pstats.Stats(prof, stream=io.StringIO()).stats  # type: ignore[attr-defined]
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    total = sum(v[2] for v in stats.values())
    lines = [f"  own time total {total / messages * 1e6:8.1f} us per message",
             f"  {'calls/msg':>9} {'us/msg':>8} {'us/call':>8}  function"]
    for (path, line, name), (_cc, ncalls, tottime, _ct, _callers) in rows:
        where = f"{os.path.basename(path)}:{line}({name})" if line else name
        lines.append(f"  {ncalls / messages:9.2f} {tottime / messages * 1e6:8.1f} "
                     f"{tottime / ncalls * 1e6:8.1f}  {where}")
    return "\n".join(lines)


def _calls() -> str:
    """Per-call cost of the pyverbs objects the per-message path builds (no device needed)."""
    from pyverbs.wr import SGE, RecvWR, SendWR

    def per(fn, n=2000):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        return (time.perf_counter_ns() - t0) / n / 1e3

    sge = SGE(0, 8, 0)
    wr = SendWR(wr_id=1, opcode=0, num_sge=1, sg=[sge], send_flags=2)
    rn = RecvWR(wr_id=1, num_sge=1, sg=[SGE(0, 8, 0)])
    a = np.zeros(64, dtype=np.uint8)
    b = np.ones(8, dtype=np.uint8)
    va, vb = a.data, b.data
    hdr = struct.Struct("<IIqqqQ")

    def new_send() -> Any:
        return SendWR(wr_id=1, opcode=0, num_sge=1, sg=[SGE(0, 8, 0)], send_flags=2)

    def new_recv() -> Any:
        return RecvWR(wr_id=1, num_sge=1, sg=[SGE(0, 8, 0)])

    def np_copy() -> None:
        a[8:16] = np.frombuffer(b, dtype=np.uint8)

    def mv_copy() -> None:
        va[8:16] = vb

    rows = [
        ("SGE(addr, len, lkey)", per(lambda: SGE(0, 8, 0))),
        ("SendWR(..., sg=[SGE(...)])", per(new_send)),
        ("RecvWR(..., sg=[SGE(...)])", per(new_recv)),
        ("wr.wr_id = x (reuse)", per(lambda: setattr(wr, "wr_id", 5))),
        ("sge.length = x (reuse)", per(lambda: setattr(sge, "length", 8))),
        ("wr.send_flags = x (reuse)", per(lambda: setattr(wr, "send_flags", 2))),
        ("HDR.pack_into", per(lambda: hdr.pack_into(a, 0, 1, 0, 0, 8, 0, 0))),
        ("8 B copy, numpy slices", per(np_copy)),
        ("8 B copy, memoryview slices", per(mv_copy)),
        ("time.perf_counter_ns()", per(time.perf_counter_ns)),
    ]
    try:
        wr.sg_list = sge
        rows.append(("wr.sg_list = sge (reuse)", per(lambda: setattr(wr, "sg_list", sge))))
    except Exception as e:  # noqa: BLE001
        rows.append((f"wr.sg_list: {e!r}", -1.0))
    rows.append(("RecvWR.next_wr = other", per(lambda: setattr(rn, "next_wr", rn), 200)))
    return "\n".join(f"  {name:32s} {us:8.2f} us" for name, us in rows)


if __name__ == "__main__":
    t = os.environ.setdefault("PYCOLL_TRANSPORTS", "verbs")
    print(f"# pyverbs call costs (one process, TCG)\n{_calls()}")
    res = run_ranks(_rank, 2, ITERS, env={"PYCOLL_TRANSPORTS": t}, timeout=600,
                    collective_timeout=300)
    for r, (plain, profiled, _text) in enumerate(res):
        print(f"# {t} rank {r}: 8 B one-way latency {plain:.1f} us plain, {profiled:.1f} us "
              f"under cProfile ({ITERS} round trips)")
    print(res[0][2])
