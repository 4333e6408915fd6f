#!/usr/bin/env python3
"""Where a small fast call's time goes: the whole ``comm.allreduce`` / ``comm.broadcast`` of
8 bytes, the bound call alone (``call.run``, what ``FastPath.bind`` made: the compiled
``BoundCall`` where it is built, else its ``run``) and the numba-compiled kernel called
alone through its entry point, back to back, 20000 calls, best of 3 loops (one for the broadcast
kernel alone). The gaps are the Python around the kernel: the collective's lookup of the
call's kind, and the call's claim, numbering, flight record and release.

    python -m pycoll.run -n 2 benchmarks/call_floor.py
    PYCOLL_FASTPATH_C=0 python -m pycoll.run -n 2 benchmarks/call_floor.py   # the Python path

The kernel-alone loop drives the communicator's sequence numbers and stages itself (a
measurement, not a way to call pycoll): the one-way broadcast's settling is left undone, so
the program ends with ``os._exit`` right after printing, without finalizing.
"""
from __future__ import annotations

import os
import time

import numpy as np

import pycoll
from pycoll.fastpath.compiled import callpath
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
        run = call.run

        def bound(run=run):
            run(a, None, False, a)

        single = fast.entry_point(np.dtype("float32"),
                                   "broadcast_bound" if call.one_way else "allreduce_bound")
        constants = call.constants.ctypes.data

        def kernel_alone(call=call, single=single, constants=constants):
            ex.seq += 1
            word = ((ex.seq & SEQ_MASK) << SEQ_SHIFT) | call.seq_bits
            k = fast.k = fast.k + 1
            state = single(a, constants, k, word)
            if state:           # it slept: the runner's own resumption
                fast.complete(state, call, a, a.view(np.uint8) if call.one_way else a,
                               ex.seq, word, k, time.monotonic() + 30)

        # a barrier after the kernel-alone broadcasts would find them unsettled: one loop
        loops = 3 if coll == "allreduce" else 1
        out[coll] = (min(loop(whole) for _ in range(3)),
                     min(loop(bound) for _ in range(3)),
                     min(loop(kernel_alone) for _ in range(loops)))
    path = "compiled (Cython)" if callpath.COMPILED else "Python"
    print(f"rank {comm.rank}, call path {path}: " + "; ".join(
        f"{c} 8 B: whole call {w:.2f} us, "
        + f"bound call {b:.2f} us, kernel alone {k:.2f} us"
        for c, (w, b, k) in out.items()), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
