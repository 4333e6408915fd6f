"""The compiled one-host path: allreduce, broadcast and barrier through one shared segment.

For a communicator whose ranks all share one host (and shared memory), a small allreduce
does not go through the algorithms at all: every rank copies its input into its own slot of
one segment, raises a flag in the same cache line, waits for everyone else's flag, and
reduces all slots in rank order, all inside one numba-compiled call with the GIL released.
That costs about a microsecond, where the generic path (an algorithm over point-to-point
messages, written in Python) costs ten or more. Larger allreduces go chunk by chunk through
the same slots (or read the peers' buffers with cross-memory attach), broadcasts go through
the slots or, from 16 KiB, copy once with cross-memory attach, and a barrier is a call with
no payload. Blocked ranks sleep on a futex and are woken by the last publisher, so ranks
that outnumber the cores hand the CPU over at once instead of spinning through their time
slice. ``kernels.py`` describes each kernel; docs/algorithms.md#the-fast-path-one-host has
the protocol and the measurements behind every threshold.

What decides whether a call takes this path is known identically on every rank: the
communicator (one host, shm in use, every rank able to run the kernels: each rank's limits,
``probe_record``, travel in its bootstrap record) and the call (its collective, no forced
algorithm, its size). So ranks never disagree about the path of a call that they agree
about; a call they disagree about (another count, dtype, op or root) is caught by the
signature every slot carries and raised as ``CollectiveMismatch`` on every rank.

Modules: ``segment`` (the shared segment), ``atomics`` (the intrinsics), ``combine`` (the
element-wise reductions), ``kernels`` (the compiled calls), ``calls`` (what a fast call is),
``liveness`` (what a waiting rank checks), ``runner`` (``FastPath``: a call run through the
communicator's execution).

numba is part of the default install. ``probe_limit`` (at init) imports it once per process,
so that a rank whose numba is missing or cannot load (a broken llvmlite, an unsupported
Python) turns the path off for its communicator at init, where every rank learns it, instead
of failing at its first call; ``warn_if_missing`` then says so once, in one line, with the
cost.
"""
from __future__ import annotations

import importlib
import importlib.util
import platform
import warnings

from ..envvars import env_bool, env_int

#: largest allreduce (bytes per rank) through one slot; PYCOLL_FASTPATH_BYTES changes it
#: (docs/algorithms.md#fast-path-thresholds: where one slot stops beating the alternatives)
DEFAULT_LIMIT = 256 * 1024
#: the header page holds a pid and a futex timeout per rank: up to this many ranks
MAX_RANKS = 128
#: bytes of slots one rank reads per call (``limit * ranks``) before the generic algorithms
#: (which read each byte about twice, whatever the rank count) are cheaper; it also bounds
#: the segment: two slots per rank of ``limit`` bytes, 2 MiB at most
READ_BUDGET = 1024 * 1024


#: largest allreduce (bytes per rank) taken chunk by chunk through the slots, for the dtypes
#: the kernels reduce; PYCOLL_FASTPATH_CHUNKED_BYTES changes it (0: never). No limit by
#: default: the chunks beat the generic ring at every size (docs/algorithms.md)
DEFAULT_CHUNKED_LIMIT = 1 << 62


#: smallest broadcast that reads straight out of the root's buffer (cross-memory attach, a
#: single copy) instead of going through the slots (two copies); PYCOLL_FASTPATH_CMA_BYTES
#: changes it (0: never; PYCOLL_SHM_CMA=0 turns it off too). See ``runner.FastPath``.
DEFAULT_CMA_BYTES = 16 * 1024


def probe_record() -> dict[str, int]:
    """This rank's limits (0: off), published in its bootstrap record (``comm.bootstrap``)
    so that every rank knows every rank's. A rank that its launcher says is alone on its
    host (``alone_on_host``) publishes the path off without importing numba: no
    communicator it is part of can take a one-host path."""
    env_bool("PYCOLL_FASTPATH_C", True)   # read at import (COMPILED_CALL_OFF): a typo raises here
    if alone_on_host():
        return {"fast": 0, "fast_chunked": 0, "fast_cma": 0, "alone": 1}
    limit = probe_limit()
    if not limit:
        return {"fast": 0, "fast_chunked": 0, "fast_cma": 0}
    cma = env_int("PYCOLL_FASTPATH_CMA_BYTES", DEFAULT_CMA_BYTES, minimum=0)
    return {"fast": limit,
            "fast_chunked": env_int("PYCOLL_FASTPATH_CHUNKED_BYTES", DEFAULT_CHUNKED_LIMIT,
                                    minimum=0),
            "fast_cma": cma if env_bool("PYCOLL_SHM_CMA", True) else 0}


#: ranks on this host as the launcher told ``pycoll.init`` (``launch.join`` calls
#: ``declare_local_ranks``); None: not told
_local_ranks: list[int | None] = [None]


def declare_local_ranks(count: int | None) -> None:
    """What the launcher's environment says of this host: ``count`` ranks of the job run
    here (``PYCOLL_LOCAL_WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, Open MPI's, MPICH's or
    Slurm's), None when it says nothing or the job has one rank."""
    _local_ranks[0] = count


def alone_on_host() -> bool:
    """Whether the launcher said this rank is the only one of its job on its host: a
    multi-host job with one rank per host. The path needs two ranks on one host, so such a
    rank skips numba's import (about 0.2 s and 65 MB per rank). Two one-rank launchers on
    one host (a test of a multi-host job) then run their pair on the generic path: correct,
    only slower."""
    return _local_ranks[0] == 1


def unavailable_reason() -> str | None:
    """Why the path is off on this host before any limit applies (None: it may run);
    ``python -m pycoll.info`` shows it."""
    if not env_bool("PYCOLL_FASTPATH", True):
        return "PYCOLL_FASTPATH is off"
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "aarch64"):
        return f"unsupported platform {platform.system()}/{platform.machine()}"
    return numba_problem()


_numba_problem: list[str | None] = []


def numba_problem() -> str | None:
    """Why numba cannot run the kernels in this process (None: it imports), found once."""
    if not _numba_problem:
        if importlib.util.find_spec("numba") is None:
            why: str | None = "numba is not installed (pip install numba)"
        else:
            try:
                importlib.import_module("numba")
                why = None
            except Exception as e:  # noqa: BLE001 - any failure to load means the same here
                why = f"numba cannot be imported ({type(e).__name__}: {e})"
        _numba_problem.append(why)
    return _numba_problem[0]


_warned: list[bool] = []


def warn_if_missing(ranks_off: int = 1, size: int = 1) -> None:
    """One line, once per process, when numba is what keeps a one-host communicator off the
    compiled path (the user installed pycoll expecting its speed). The communicator calls it
    on the first of its ``ranks_off`` ranks without the path, so a job prints it once."""
    why = numba_problem() if env_bool("PYCOLL_FASTPATH", True) else None
    if why is None or _warned:
        return
    _warned.append(True)
    where = f"on {ranks_off} of {size} ranks"
    # explicit, at line 0 of this file: the warning prints as one line (no source line)
    warnings.warn_explicit(f"pycoll: the compiled one-host path is off ({where}): {why}; "
                           "collectives on this host take the generic path, 5-7x slower "
                           "below 64 KiB (PYCOLL_FASTPATH=0 turns the path off and this "
                           "warning with it)",
                           RuntimeWarning, __file__, 0, module=__name__)


def probe_limit() -> int:
    """This rank's limit in bytes (0: the path is off here)."""
    if unavailable_reason() is not None:
        return 0
    return env_int("PYCOLL_FASTPATH_BYTES", DEFAULT_LIMIT, minimum=0)


def agreed_limits(records: list[dict], size: int) -> tuple[int, int, int]:
    """The (one-slot, chunked, single-copy broadcast) limits of a communicator of ``size``
    ranks whose ranks' probe records are ``records``: the smallest of the first two (scaled
    to the read budget), the largest threshold of the third (0, off, if any rank has it
    off)."""
    if size < 2 or size > MAX_RANKS or not records:
        return 0, 0, 0
    limit = min(int(r.get("fast", 0)) for r in records)
    limit = min(limit, READ_BUDGET // size) // 64 * 64
    if limit < 64:
        return 0, 0, 0
    cma = [int(r.get("fast_cma", 0)) for r in records]
    return (limit, min(int(r.get("fast_chunked", 0)) for r in records),
            max(cma) if min(cma) > 0 else 0)


#: dtypes the kernels reduce themselves (others are exchanged as bytes, reduced by numpy)
NATIVE_DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                 "float32", "float64")


def warm(dtypes: tuple[str, ...] = NATIVE_DTYPES) -> float:
    """Compile (or load from numba's on-disk cache) the kernels for ``dtypes`` now; returns
    the seconds it took. The first fast call of a dtype otherwise does it: about 0.2 s from
    the cache, a few seconds the very first time on a machine (while the peers wait).
    Processes forked after this call inherit the compiled kernels (and, where the compiled
    call path is built, its C entry points: ``kernels.bound_cfunc``). The larger kernels take
    ``ordered`` as an argument, not as a compile-time constant: one compilation serves calls
    that fold in rank order and calls that do not; both are run here."""
    import time

    import numpy as np

    from . import kernels as K
    from .combine import OP_SUM
    from .segment import stride_for

    start = time.perf_counter()
    stride = stride_for(1024)        # room for the 512 bytes of 64 float64 below
    seg = np.zeros(K.HEADER_BYTES + 2 * stride, dtype=np.uint8)
    for k, name in enumerate(dtypes, start=1):
        data = np.zeros(64, dtype=name)
        K.allreduce(seg, data, 0, 1, stride, 2 * k, 0, 0, OP_SUM, False, 1, 1000)
        for ordered in (False, True):
            K.allreduce_chunked(seg, data, 0, 1, stride, 64, 2 * k + 1, 0, 0, OP_SUM, ordered,
                                False, 0, 1, 1000)
    K.broadcast(seg, np.zeros(64, dtype=np.uint8), 0, 1, stride, 64, 1, 0, 0, 0, False, 0, 1,
                1000)
    K.broadcast_cma(seg, np.zeros(64, dtype=np.uint8), 0, 1, stride, 1, 0, 0, 0, False, 0, 1,
                    1000, np.zeros(5, dtype=np.uint64))
    pending = np.array([-1, 0, 0, 0], dtype=np.int64)
    K.broadcast_one_way(seg, np.zeros(64, dtype=np.uint8), 0, 1, stride, 1, 0, 0, 0, 0, 1,
                        1000, pending)
    K.settle(seg, 0, 1, stride, pending, 1, 1000)
    for name in dtypes:
        for ordered in (False, True):
            K.allreduce_cma(seg, np.zeros(64, dtype=name), 0, 1, stride, 3, 0, 0, OP_SUM,
                            ordered, False, 0, 1, 1000, np.zeros(5, dtype=np.uint64),
                            np.zeros(512, dtype=np.uint8))
    from .compiled import callpath
    if callpath.COMPILED:           # the C entry points of the compiled call path
        for name in dict.fromkeys(dtypes + ("uint8",)):
            K.bound_cfunc("allreduce_bound", name)
        K.bound_cfunc("broadcast_bound", "uint8")
        K.bound_cfunc("settle_bound", "uint8")
    return time.perf_counter() - start
