#!/usr/bin/env python3
"""Where a small fast call's time goes: the whole ``comm.allreduce`` / ``comm.broadcast`` of
8 bytes against the numba-compiled kernel it binds (``FastPath.bind``: ``single``) called
alone, back to back, 20000 calls, best of 3 loops (one for the broadcast kernel alone). The
gap is the Python call path around the kernel (argument checks, numbering, flight record, the
execution's claim): what a C entry point could remove (issue 30, part 2).

    python -m pycoll.run -n 2 benchmarks/call_floor.py

The kernel-alone loop drives the communicator's sequence numbers and stages itself (a
measurement, not a way to call pycoll): the one-way broadcast's settling is left undone, so
the program ends with ``os._exit`` right after printing, without finalizing.
"""
from __future__ import annotations

import os
import time

import numpy as np

import pycoll
from pycoll.tags import SEQ_MASK, SEQ_SHIFT

CALLS = 20000


def main() -> None:
    comm = pycoll.init()
    a = np.zeros(2, np.float32)
    fast, ex = comm._fast, comm._exec

    def loop(fn) -> float:
        comm.barrier()
        t = time.perf_counter_ns()
        for _ in range(CALLS):
            fn()
        return (time.perf_counter_ns() - t) / CALLS / 1000

    out = {}
    for coll in ("allreduce", "broadcast"):     # broadcast last: its settling is left undone
        def whole(coll=coll):
            return comm.broadcast(a, 0) if coll == "broadcast" else comm.allreduce(a)
        whole()
        call = (fast.last_broadcast if coll == "broadcast" else fast.last_allreduce)[3]
        bound = dict(zip(call.run.__code__.co_freevars,
                         (c.cell_contents for c in call.run.__closure__)))

        def kernel_alone(call=call, single=bound["single"], constants=bound["constants"]):
            ex.seq += 1
            word = ((ex.seq & SEQ_MASK) << SEQ_SHIFT) | call.seq_bits
            k = fast.k = fast.k + 1
            state = single(a, constants, k, word)
            if state:           # it slept: the runner's own resumption
                fast._complete(state, call, a, a.view(np.uint8) if call.one_way else a,
                               ex.seq, word, k, time.monotonic() + 30)

        # a barrier after the kernel-alone broadcasts would find them unsettled: one loop
        loops = 3 if coll == "allreduce" else 1
        out[coll] = (min(loop(whole) for _ in range(3)),
                     min(loop(kernel_alone) for _ in range(loops)))
    print(f"rank {comm.rank}: " + "; ".join(
        f"{c} 8 B: whole call {w:.2f} us, bound kernel alone {k:.2f} us"
        for c, (w, k) in out.items()), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
