"""What a fast call is: its kind (which kernel runs it), its stages, and what never changes
from one call of that kind to the next (``FastCall``), plus the constants the kernels and
their callers share. Importing this module does not import numba.

Why the constants (chunk size, thresholds, wait policy) are what they are:
docs/algorithms.md#fast-path-thresholds; the measurements: docs/performance.md.
"""
from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from ..buffers.memops import ReduceSpec
from ..buffers.reduction import ReduceOp, needs_finish
from ..runtime.calls import CallInfo
from ..runtime.work import Work
from ..tags import call_bits, tag_low_bits
from . import NATIVE_DTYPES

#: bytes per chunk of a chunked allreduce (at most one slot): smaller chunks only add stages,
#: each a synchronisation of every rank
CHUNK_BYTES = 256 * 1024
#: the largest broadcast through the slots is this / (ranks - 1) (``FastPath.__init__``)
BROADCAST_BUDGET = 4 * 1024 * 1024
#: smallest allreduce that reads the peers' buffers (``kernels.allreduce_cma``) instead of
#: going chunk by chunk through the slots, when every rank has a core (crowded hosts keep
#: the slots: it gains nothing there)
ALLREDUCE_CMA_BYTES = 4 * 1024 * 1024
#: ``kernels.SLEPT_AT``, ``kernels.CMA_REFUSED`` and ``kernels.CMA_BROKEN``
SLEPT_AT = 1 << 40
CMA_REFUSED = 2
CMA_BROKEN = 3
#: the kernels' op codes (``combine.OP_*``); avg is a sum finished in Python
OP_CODES = {"sum": 0, "avg": 0, "prod": 1, "min": 2, "max": 3, "band": 4, "bor": 5, "bxor": 6}

#: How a waiter polls the peers' flags before it sleeps on the futex (``kernels._wait``):
#: (polls with the CPU's relax hint, polls with ``sched_yield`` between them). With a core
#: per rank a short spin, then yields: a waiter woken by a futex wake lands on its waker's
#: core, and yielding polls keep both ranks runnable so that the scheduler spreads them.
#: With more ranks than cores it yields at once: the rank we wait for needs this core.
POLLS = (2000, 2000)
CROWDED_POLLS = (0, 64)


def wait_policy(polls: tuple[int, int]) -> int:
    """The kernels' wait-policy word: relax polls in the low 32 bits, yields above."""
    return polls[0] | (polls[1] << 32)


# The kinds of fast call, by kernel (what ``FastPath.kind_of`` answers; the flight recorder,
# ``Communicator.selected_algorithm`` and ``Plan.path`` show them)
SMALL, CHUNKED, BROADCAST = "fastpath", "fastpath-chunked", "fastpath-broadcast"
SINGLE_COPY = "fastpath-broadcast-cma"
DIRECT = "fastpath-cma"
#: not kinds: the keys of the one-way broadcast's kernel and its settling in the runner
ONE_WAY, SETTLE = "one-way", "settle"


class FastCall:
    """What a call's kernel needs that does not change from call to call (cached per
    collective, dtype, count, op and root, and bound to a buffer by a persistent plan)."""

    __slots__ = ("collective", "nbytes", "op_code", "code", "seq_bits", "spec",
                 "reduce_here", "finish", "prepare", "rop", "dtype", "info", "kind",
                 "stages", "root", "count", "run", "constants", "fold", "one_way")

    #: ``run(arr, timeout, async_op, output)``: the call on a 1-D C-contiguous aligned
    #: writable ``numpy.ndarray`` of ``dtype`` (``FastPath.bind``; ``FastPath.run`` checks
    #: an array that might not be one)
    run: Callable[[np.ndarray, Any, bool, Any], Work | None]
    #: the single-slot kernel's constants, which ``run`` passes by address
    constants: np.ndarray

    def __init__(self, collective: str, dtype: str, count: int, itemsize: int,
                 rop: ReduceOp | None, root: int | None, spec: ReduceSpec | None,
                 comm_id: int, kind: str, chunk: int, fold: str | None = None) -> None:
        self.collective = collective
        self.dtype = dtype
        self.rop = rop
        self.root = -1 if root is None else root
        self.count = count
        self.nbytes = count * itemsize
        self.spec = spec
        self.kind = kind                    # FastPath.kind_of
        if kind == DIRECT:                  # kernels.allreduce_cma: four stages
            self.stages = 4
        elif kind == SINGLE_COPY:           # addresses, then "done" (kernels.broadcast_cma)
            self.stages = 2
        elif kind == BROADCAST:             # chunk by chunk, one stage each
            self.stages = max(1, -(-self.nbytes // chunk))
        elif kind == CHUNKED:               # allreduce larger than one slot
            self.stages = -(-count // (chunk // itemsize))
        else:
            self.stages = 1
        #: a broadcast of one stage runs one way (``kernels.broadcast_one_way``): nobody
        #: waits for its receivers, the next stage settles it
        self.one_way = kind == BROADCAST and self.stages == 1
        #: the call as the rest of the communicator sees it (signature, flight recorder,
        #: errors); a barrier agrees on nothing but being a barrier
        self.fold = fold
        self.info = (CallInfo(collective, 0, algorithm=kind) if collective == "barrier"
                     else CallInfo(collective, self.nbytes, dtype, count, rop, root, kind,
                                   fold))
        name = rop.name if rop is not None else "sum"
        self.reduce_here = rop is not None and (dtype not in NATIVE_DTYPES
                                                or name == "premul_sum")
        self.op_code = -1 if rop is None or self.reduce_here else OP_CODES[name]  # -1: none
        # avg's scale: after the kernels' sum; the Python fold of the others finishes itself
        self.finish = (rop is not None and spec is not None and needs_finish(rop, 2)
                       and not self.reduce_here)
        self.prepare = rop is not None and rop.name == "premul_sum"
        # what the slots say about the call (compared by every reader), and the sequence
        # word's constant bits: the same bits the generic path puts in its message tags.
        # The kind is in it: two ranks that chose different kernels for one call (their
        # WaitPolicy.crowded differed: other CPU affinities) raise CollectiveMismatch
        self.code = zlib.crc32(repr((collective, self.info.agreed, kind)).encode())
        self.seq_bits = call_bits(tag_low_bits(collective, comm_id), self.info.signature())

    def waited(self, position: int) -> tuple[int, int]:
        """(stage offset, phase) a kernel's SLEPT_AT + ``position`` status was waiting in."""
        if self.kind == CHUNKED:
            return position // 2, position % 2
        if self.one_way:        # 0: the previous stage's settling (FastPath.complete), 1
            return 0, 0
        return position, 0
