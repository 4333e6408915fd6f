"""Running a call on the fast path: the kernels, inside the communicator's rules.

A fast call is still an ordinary call of its communicator: it takes the next sequence number,
gets a flight-recorder entry, runs inline only when no asynchronous call is queued (else on
the communicator's worker, in order), has a deadline, and fails through the same handling
(abort record, flight-recorder dump, the communicator marked failed). What differs is the
body: one compiled call instead of an algorithm.

Between sleep slices (``WaitPolicy.liveness_seconds``) the waiter, back in Python, checks:
the deadline (``CollectiveTimeout`` naming the ranks that never published), the processes of
those ranks (``PeerLost`` when one exited), the job's abort records, and whether a missing
rank sent this rank a message of the generic path for the same call (the ranks disagree about
the call: ``CollectiveMismatch`` at once, not a timeout).
"""
from __future__ import annotations

import time
import zlib
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .. import debug
from ..errors import CollectiveMismatch, PycollError, describe
from ..memops import ReduceSpec
from ..reduction import ReduceOp, needs_finish, prepare
from ..tags import SEQ_MASK, SEQ_SHIFT, SIG_SHIFT, describe_tag, signature, tag_low_bits
from ..transports.progress import WaitPolicy, WaitTimeout
from ..transports.base import peer_lost
from ..transports.shm_segment import _exited
from ..flight_recorder import COMPLETED
from ..work import Work
from . import NATIVE_DTYPES

if TYPE_CHECKING:
    from ..communicator import Communicator
    from .segment import SharedSlots

#: bytes per chunk of a chunked allreduce (at most one slot). Measured here, 2 ranks, 1-16 MiB
#: (python -m pycoll.bench allreduce -n 2 -m 1M:16M): 256 KiB chunks ran 1 MiB in 120-125 us
#: and 16 MiB in 2.6-2.8 ms; 32-128 KiB chunks 200-230 us and 3.7-4.4 ms (twice the stages,
#: each a synchronisation of every rank, for no gain in cache residency on this CPU)
CHUNK_BYTES = 256 * 1024
#: the largest broadcast through the slots is this / (ranks - 1) (see FastPath.__init__)
BROADCAST_BUDGET = 4 * 1024 * 1024
#: ``kernels.SLEPT_AT`` and ``kernels.CMA_REFUSED`` (kept here so that importing this module
#: does not import numba)
SLEPT_AT = 1 << 40
CMA_REFUSED = 2
CMA_BROKEN = 3
#: smallest allreduce run by ``kernels.allreduce_cma`` (reading the peers' buffers) instead
#: of chunk by chunk through the slots, when every rank has a core. Measured here, 2 ranks
#: (python -m pycoll.bench allreduce -n 2 -m 512K:64M, with and without): 1 MiB 151-157 us
#: against 117, 2 MiB even, 4 MiB 394-472 against 511-519, 16 MiB 1.40-1.43 ms against
#: 2.05-2.06, 32 MiB 2.75 against 4.09. With 4 ranks on 2 cores it gained nothing (16 MiB
#: 4.7 against 5.4 ms, 64 MiB 31.4 against 28.2), so crowded hosts keep the slots.
ALLREDUCE_CMA_BYTES = 4 * 1024 * 1024
_OPS = {"sum": 0, "avg": 0, "prod": 1, "min": 2, "max": 3, "band": 4, "bor": 5, "bxor": 6}


#: How a waiter polls the peers' flags before it sleeps on the futex (``kernels._wait``):
#: (polls with the CPU's relax hint, polls with ``sched_yield`` between them).
#: * With a core per rank: a short spin, then yields. A waiter that sleeps at once is woken
#:   by a futex wake, and the kernel wakes it on the waker's core ("wake affine"): both ranks
#:   then share one core, and every later wait burns a spin before the peer can run. Measured
#:   here, 2 ranks, a sweep from 8 B: with 20000 relax polls and no yields, 2 of 3 runs fell
#:   into that state for good (1 MiB allreduce 650-730 us against 105-120). Yielding polls keep
#:   both ranks runnable, so the scheduler spreads them over the cores.
#: * With more ranks than cores: yields at once; the rank we wait for needs this core, and a
#:   yield hands it over without a system call to wake anybody (4 ranks on 2 cores: 8-10 us
#:   per 8-byte allreduce, against 23-28 us with futex sleeps alone).
POLLS = (2000, 2000)
CROWDED_POLLS = (0, 64)


def _policy(polls: tuple[int, int]) -> int:
    """The kernels' wait-policy word: relax polls in the low 32 bits, yields above."""
    return polls[0] | (polls[1] << 32)


#: a ``FastPath.last_allreduce`` that matches no call
_NO_CALL = (object(), None, -1, None)

SMALL, CHUNKED, BROADCAST = "fastpath", "fastpath-chunked", "fastpath-broadcast"
SINGLE_COPY = "fastpath-broadcast-cma"
DIRECT = "fastpath-cma"


class FastCall:
    """What a call's kernel needs that does not change from call to call (cached per
    collective, dtype, count, op and root, and bound to a buffer by a persistent plan)."""

    __slots__ = ("collective", "nbytes", "sig", "op_code", "code", "seq_bits", "spec",
                 "reduce_here", "finish", "prepare", "rop", "dtype", "info", "kind",
                 "stages", "root", "count", "run")

    #: ``run(arr, timeout, async_op, output)``: the call on a 1-D C-contiguous aligned
    #: writable ``numpy.ndarray`` of ``dtype`` (``FastPath.bind``; ``FastPath.run`` checks
    #: an array that might not be one)
    run: Callable[[np.ndarray, Any, bool, Any], Work | None]

    def __init__(self, collective: str, dtype: str, count: int, itemsize: int,
                 rop: ReduceOp | None, root: int | None, spec: ReduceSpec | None,
                 comm_id: int, kind: str, chunk: int) -> None:
        self.collective = collective
        self.dtype = dtype
        self.rop = rop
        self.root = -1 if root is None else root
        self.count = count
        self.nbytes = count * itemsize
        self.sig = ((dtype, count, rop, root) if collective != "barrier"
                    else (None, None, None, None))
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
        #: what the flight recorder shows for this call
        self.info = {"dtype": dtype, "count": count, "algorithm": self.kind}
        if rop is not None:
            self.info["op"] = str(rop)
        if root is not None:
            self.info["root"] = root
        name = rop.name if rop is not None else "sum"
        self.reduce_here = rop is not None and (dtype not in NATIVE_DTYPES
                                                or name == "premul_sum")
        self.op_code = -1 if rop is None or self.reduce_here else _OPS[name]   # -1: OP_NONE
        self.finish = spec is not None and needs_finish(rop, 2)   # type: ignore[arg-type]
        self.prepare = rop is not None and rop.name == "premul_sum"
        # what the slots say about the call (compared by every reader), and the sequence
        # word's constant bits: the same bits the generic path puts in its message tags.
        # The kind is in it: two ranks that chose different kernels for one call (their
        # WaitPolicy.crowded differed: other CPU affinities) raise CollectiveMismatch
        self.code = zlib.crc32(repr((collective, self.sig, kind)).encode())
        low = tag_low_bits(collective, comm_id)
        self.seq_bits = (signature(collective, self.sig) << SIG_SHIFT) | low

    def waited(self, position: int) -> tuple[int, int]:
        """(stage offset, phase) a kernel's SLEPT_AT + ``position`` status was waiting in."""
        if self.kind == CHUNKED:
            return position // 2, position % 2
        return position, 0


class FastPath:
    """A communicator's fast path: its limit (agreed at init), its segment (made by its
    first fast call) and its count of fast calls."""

    def __init__(self, comm: "Communicator", limit: int, chunked_limit: int, cma_bytes: int,
                 slots: "SharedSlots") -> None:
        self.comm = comm
        self.limit = limit                  # one slot: the single-stage kernel
        self.chunked_limit = chunked_limit  # larger native-dtype allreduces, chunk by chunk
        # A broadcast through the slots copies twice (in at the root, out everywhere else);
        # cross-memory attach copies once but pins pages: measured here (pycoll.bench
        # broadcast, PYCOLL_FASTPATH=1 against 0), the slots win up to 4 MiB with 2 ranks
        # (262 against 372 us) and lose from 8 MiB (1.28 against 1.02 ms); with 4 ranks
        # they win up to 1 MiB and lose from 2 MiB. So: 4 MiB / (ranks - 1).
        self.broadcast_limit = min(chunked_limit, BROADCAST_BUDGET // (comm.size - 1))
        # From ``cma_bytes`` on (0: never), a broadcast reads straight out of the root's
        # buffer instead (kernels.broadcast_cma: one copy, no size limit). Whether the OS
        # lets this rank read its peers' memory (ptrace rules: Yama, seccomp in containers)
        # is learnt by the first such call, on every rank alike; if not, that call and all
        # later ones go through the slots (or the generic path) as above.
        # With more ranks than cores the copies of a single-copy broadcast queue for the cores
        # like any others, and its two system calls and page pinning per rank are what is
        # left to save: measured here, 4 ranks on 2 cores (pycoll.bench broadcast -n 4, 3
        # interleaved runs each), the slots took 27-29 us at 128 KiB, 69-71 at 512 KiB and
        # 171-175 at 1 MiB, the single copy 33-37, 108-122 and 217-255; at 2 MiB the single
        # copy won (435-497 against 545-581). So crowded hosts go through the slots as far
        # as they go (``broadcast_limit``) before the single copy.
        if WaitPolicy.crowded and cma_bytes:
            cma_bytes = max(cma_bytes, self.broadcast_limit + 1)
        self.cma_bytes = cma_bytes
        self.iov = np.zeros(4 + comm.size, dtype=np.uint64)    # the kernels' scratch
        self.piece = np.empty(0, dtype=np.uint8)    # allreduce_cma's (made when needed)
        self.direct_bytes = 1 << 62 if WaitPolicy.crowded else ALLREDUCE_CMA_BYTES
        self.chunk = min(limit, CHUNK_BYTES) // 64 * 64
        self.slots: "SharedSlots | None" = slots
        self.k = 0                      # stages run so far (all ranks count alike)
        self._calls: dict[tuple, FastCall] = {}
        self.barrier_buffer = np.zeros(0, dtype=np.uint8)
        #: the calls a 1-D numpy array takes without ``as_buffer``: (collective, op or root
        #: as passed, dtype, bytes) -> FastCall, filled by the first validated call of each
        #: kind (``remember``)
        self.host_calls: dict[tuple, FastCall] = {}
        #: the entry of ``host_calls`` that the previous allreduce (broadcast) took, as (op
        #: or root, dtype, bytes, FastCall): compared by identity before any hashing
        self.last_allreduce: tuple = _NO_CALL
        self.last_broadcast: tuple = _NO_CALL
        self.spin = _policy(CROWDED_POLLS if WaitPolicy.crowded else POLLS)
        self.slice_ns = int(WaitPolicy.liveness_seconds * 1e9)
        # the kernels: numba is imported by the first call that needs them, not at init
        self._kernels: Any = None
        self.barrier_call: FastCall | None = None     # made by the first barrier

    # -- what takes the path -----------------------------------------------------------------
    def takes(self, nbytes: int, dtype: str, rop: ReduceOp) -> bool:
        """Whether an allreduce of ``nbytes`` of ``dtype`` with ``rop`` runs here (decided
        alike on every rank that agrees about the call)."""
        return nbytes <= self.limit or (nbytes <= self.chunked_limit and dtype in NATIVE_DTYPES
                                        and rop.name != "premul_sum")

    def remember(self, key: tuple, tensor: np.ndarray, call: FastCall) -> None:
        """Let later calls of ``key`` (collective, op or root as passed) on 1-D numpy arrays
        of this dtype and size skip the classification (``host_calls``). ``tensor`` is the
        classified buffer's array; not one that stands for another dtype (bfloat16 as
        uint16: a real uint16 array must not get bfloat16's reduction)."""
        if (type(tensor) is np.ndarray and tensor.dtype.name == call.dtype
                and len(self.host_calls) < 256):
            self.host_calls[key + (tensor.dtype, tensor.nbytes)] = call
            memo = (key[1], tensor.dtype, tensor.nbytes, call)
            if key[0] == "allreduce":
                self.last_allreduce = memo
            else:
                self.last_broadcast = memo

    def kind_of(self, collective: str, nbytes: int) -> str | None:
        """What runs ``collective`` of ``nbytes`` here (allreduce above one slot: of a
        native dtype, see ``takes``), or None for the generic path; the one place that
        decides (``FastCall`` and ``Communicator.selected_algorithm`` ask it)."""
        if collective == "barrier":
            return SMALL
        if collective == "broadcast":
            return self.broadcast_kind(nbytes)
        if collective == "allreduce" and nbytes <= self.chunked_limit:
            if nbytes <= self.limit:
                return SMALL
            return DIRECT if self.cma_bytes and nbytes >= self.direct_bytes else CHUNKED
        return None

    def broadcast_kind(self, nbytes: int) -> str | None:
        """What runs a broadcast of ``nbytes`` here (None: the generic path)."""
        if self.cma_bytes and nbytes >= self.cma_bytes:
            return SINGLE_COPY
        return BROADCAST if nbytes <= self.broadcast_limit else None

    def call(self, collective: str, dtype: str, count: int, itemsize: int,
             rop: ReduceOp | None, root: int | None = None) -> FastCall:
        key = (collective, dtype, count, rop, root)
        found = self._calls.get(key)
        if found is None:
            if self._kernels is None:
                from . import kernels
                self._kernels = {SMALL: kernels.allreduce, CHUNKED: kernels.allreduce_chunked,
                                 BROADCAST: kernels.broadcast,
                                 SINGLE_COPY: kernels.broadcast_cma,
                                 DIRECT: kernels.allreduce_cma}
            comm = self.comm
            spec = comm._ops.reduce_spec(rop, dtype, comm.size) if rop is not None else None
            kind = self.kind_of(collective, count * itemsize)
            assert kind is not None, (collective, count * itemsize)   # callers checked
            found = FastCall(collective, dtype, count, itemsize, rop, root, spec,
                             comm._comm_id, kind, self.chunk)
            self.bind(found)
            if len(self._calls) < 1024:
                self._calls[key] = found
        return found

    # -- running -------------------------------------------------------------------------------
    def run(self, call: FastCall, arr: np.ndarray, timeout: Any, async_op: bool,
            output: Any) -> Work | None:
        """Run ``call`` on ``arr``, any array of its dtype and size: ``call.run`` takes the
        arrays its compiled entry point was made for, the generic execution the rest (an
        unaligned view, say)."""
        if type(arr) is np.ndarray and arr.ndim == 1 and arr.flags.carray:
            return call.run(arr, timeout, async_op, output)
        return self._run_generic(call, arr, timeout, async_op, output)

    def bind(self, call: FastCall) -> None:
        """Make ``call.run``: ``call`` run like ``Execution._execute`` runs a body (same
        numbering, recording, ordering and failure handling), written out for the common
        case (a synchronous call, nothing queued, the segment made), everything else through
        the generic execution.

        Why a closure: this is the whole cost of a small call beside the kernel. What never
        changes for the call or the communicator is read once, here, and the single-slot
        kernel is called through numba's entry point for exactly these argument types
        (skipping the dispatcher's type check, 0.2 us), with the call's constants in one
        array (``kernels.allreduce_bound``): 2 ranks, 8 B, back to back
        (bench/call_loop.py), 1.96-1.99 us a call with attribute lookups and the dispatcher,
        1.62-1.67 us through the entry point with twelve arguments, 1.19-1.22 us now (with
        the kernels' uncounted views, ``atomics.view_as``; docs/algorithms.md)."""
        comm = self.comm
        executor = comm._executor
        acquire = executor._run_lock.acquire
        release = executor._run_lock.release
        fr = comm._flight
        mono = time.monotonic
        run_generic = self._run_generic
        info, collective, nbytes, stages = call.info, call.collective, call.nbytes, call.stages
        seq_bits, code, op_code = call.seq_bits, call.code, call.op_code
        rank, size, spin, slice_ns = comm.rank, comm.size, self.spin, self.slice_ns
        # the bytes go through as bytes: exchange-only calls (Python reduces) and barriers
        raw = op_code < 0 and call.dtype != "uint8"
        more = call.reduce_here or call.finish
        generic = call.prepare or comm._detail      # premul factors, DETAIL's checks
        single = None
        if call.kind is SMALL and self.slots is not None:
            single = self._entry(np.dtype("uint8" if raw else call.dtype))
            seg = self.slots.bytes
            constants = np.array([seg.ctypes.data, seg.size, rank, size, self.slots.stride,
                                  code, op_code, spin, slice_ns], dtype=np.int64)

        def run(arr: np.ndarray, timeout: Any, async_op: bool, output: Any) -> Work | None:
            slots = self.slots
            if (async_op or timeout is not None or generic or slots is None
                    or comm._failed is not None or comm._closed or executor._closed
                    or executor._queue or not acquire(False)):
                return run_generic(call, arr, timeout, async_op, output)
            rec = None
            try:
                seq = comm._seq = comm._seq + 1
                k = self.k + 1
                self.k += stages
                word = ((seq & SEQ_MASK) << SEQ_SHIFT) | seq_bits
                start = mono()
                if fr is not None:   # flight recorder, inlined as in Execution._execute
                    rec = [seq, collective, nbytes, 0, 0.0, start, 0.0, None, info]
                    i = fr.count
                    fr.count = i + 1
                    fr.ring[i % fr.capacity] = rec
                data = arr.view(np.uint8) if raw else arr
                # the single-slot kernel gets only the segment's address (``constants``): its
                # array is held while the kernel runs, so that a finalize on another thread
                # cannot unmap it (SharedSlots.close leaves a mapping that is still exported),
                # and dropped after, so that a failure's traceback does not keep it
                mapped = slots.bytes if single is not None else None
                if mapped is not None:
                    state = single(data, constants, k, word)
                    del mapped
                else:
                    state = self.launch(call, data, k, word, False, 0)
                if state != 0 or more:
                    self._complete(state, call, arr, data, seq, word, k,
                                   start + comm.timeout, comm.timeout)
                if rec is not None:
                    rec[3] = COMPLETED  # flight_recorder.STATE (fast calls: no end time)
                if comm._generic_ran:
                    self._refuse_leftovers(word)
            except BaseException as e:  # noqa: BLE001 - reported like any failed call
                if rec is not None:
                    rec[8] = dict(info)     # the failure notes go into a copy
                err = comm._collective_failed(collective, seq, comm.timeout, e, rec,
                                              call.sig, None)
                if err is e:
                    raise
                raise err from None
            finally:
                release()
            return None

        call.run = run

    def _entry(self, dtype: np.dtype) -> Any:
        """The single-slot kernel's compiled entry point (``kernels.allreduce_bound``) for a
        1-D C-contiguous aligned writable array of ``dtype`` (loaded from numba's cache, or
        compiled, now)."""
        from numba import types
        from numba.np.numpy_support import from_dtype

        from .kernels import allreduce_bound
        data = types.Array(from_dtype(dtype), 1, "C")
        constants = types.Array(types.int64, 1, "C")
        return allreduce_bound.compile((data, constants, types.int64, types.int64))

    def _run_generic(self, call: FastCall, arr: np.ndarray, timeout: Any, async_op: bool,
                     output: Any) -> Work | None:
        """The call as a body of the generic execution (queued, async, DETAIL, timeout=)."""
        def body(peers: Any) -> None:
            word = -peers.tag - 1
            self.execute(call, arr, (word >> SEQ_SHIFT) & SEQ_MASK, word,
                         peers.deadline - time.monotonic())
            if self.comm._generic_ran:
                self._refuse_leftovers(word)
        body.fast = True                    # type: ignore[attr-defined]
        body.flight_info = call.info        # type: ignore[attr-defined]
        return self.comm._execute(call.collective, call.nbytes, body, timeout, async_op,
                                  call.sig, output)

    def _refuse_leftovers(self, word: int) -> None:
        """After the first fast call that follows a call of the generic path: a message of
        that call (or an earlier one) still held, or still unread in an inbox, was sent for a
        receive that was never posted: the ranks disagreed about that call (two that both
        believed they were a scatter's root, say). The generic path finds these when its
        next receive is posted; fast calls post none, so they look once here. Every peer
        has entered this fast call, so its messages of earlier calls have been sent."""
        comm = self.comm
        comm._generic_ran = False
        channels = list(comm._peers.channels.values())
        if channels:
            self._read_and_check(channels, -word - 1)

    def _read_and_check(self, channels: list[Any], tag: int) -> None:
        """Raise ``CollectiveMismatch`` for a message on ``channels``, held or still unread,
        that disagrees with call ``tag``."""
        with self.comm._peers.engine.lock:
            for ch in channels:
                ch.progress()
                ch.check_leftovers(tag)

    def execute(self, call: FastCall, arr: np.ndarray, seq: int, word: int,
                limit: float) -> None:
        """The whole call (the generic execution's body; makes the segment if needed)."""
        deadline = time.monotonic() + limit
        slots = self.slots
        if slots is None:
            raise PycollError(f"rank {self.comm.rank}: {call.collective} #{seq}: the fast "
                              "path's segment is closed (communicator finalized)")
        if call.prepare:
            prepare(call.rop, call.dtype, arr)      # type: ignore[arg-type]
        k = self.k + 1
        self.k += call.stages
        data = arr if call.op_code >= 0 else arr.view(np.uint8)
        state = self.launch(call, data, k, word, False, 0)
        self._complete(state, call, arr, data, seq, word, k, deadline, limit)

    def launch(self, call: FastCall, data: np.ndarray, k: int, word: int, resume: bool,
               position: int) -> int:
        """Run ``call``'s kernel from stage ``k`` (``resume``: after a sleep, at
        ``position``); returns its status."""
        slots = self.slots
        assert slots is not None
        comm = self.comm
        kind = call.kind
        kernel = self._kernels[kind]
        if kind == SMALL:
            return kernel(slots.bytes, data, comm.rank, comm.size, slots.stride, k, word,
                          call.code, call.op_code, resume, self.spin, self.slice_ns)
        if kind == SINGLE_COPY:
            return kernel(slots.bytes, data, comm.rank, comm.size, slots.stride, k, word,
                          call.code, call.root, resume, position, self.spin, self.slice_ns,
                          self.iov)
        if kind == DIRECT:
            if not self.piece.size:
                self.piece = np.empty(CHUNK_BYTES, dtype=np.uint8)
            return kernel(slots.bytes, data, comm.rank, comm.size, slots.stride, k, word,
                          call.code, call.op_code, resume, position, self.spin,
                          self.slice_ns, self.iov, self.piece)
        last = call.root if kind == BROADCAST else call.op_code
        return kernel(slots.bytes, data, comm.rank, comm.size, slots.stride, self.chunk, k,
                      word, call.code, last, resume, position, self.spin, self.slice_ns)

    def _complete(self, state: int, call: FastCall, arr: np.ndarray, data: np.ndarray,
                  seq: int, word: int, k: int, deadline: float, limit: float) -> None:
        """Wait on in sleep slices until done, then what the kernel left to Python."""
        while state != 0:
            if state == CMA_REFUSED:        # the same on every rank: all go on this way
                call, k = self._without_cma(call)
                state = self.launch(call, data, k, word, False, 0)
                continue
            if state == CMA_BROKEN:
                self._broken_read(call, seq)
            position = state - SLEPT_AT if state >= SLEPT_AT else 0   # kernels.SLEPT_AT
            offset, phase = call.waited(position)   # the stage and flag value waited for
            self._between_slices(state, call, seq, word, k + offset,
                                 2 * (k + offset) + phase, deadline, limit)
            state = self.launch(call, data, k, word, True, position)
        if call.reduce_here:
            self._reduce_here(call, arr, k)
        if call.finish:
            call.spec.finish(arr)               # type: ignore[union-attr]

    def _broken_read(self, call: FastCall, seq: int) -> None:
        """A read of a peer's buffer failed mid-call: a peer that exited is PeerLost, else
        the OS refused after allowing it (the call cannot be redone: buffers changed)."""
        comm = self.comm
        self._raise_if_exited([r for r in range(comm.size) if r != comm.rank])
        raise PycollError(f"{describe(comm.rank, call.collective, seq)}: reading a peer's "
                          "buffer with process_vm_readv failed after the call had started "
                          "(it worked a moment before); set PYCOLL_SHM_CMA=0 to avoid "
                          "cross-memory attach")

    def _without_cma(self, call: FastCall) -> tuple[FastCall, int]:
        """Some rank may not read its peers' memory: no cross-memory attach on this
        communicator any more (the kernels found out before changing any buffer). Returns
        ``call`` through the slots, and its first stage."""
        debug.logger.info("rank %d: %s: a rank could not read a peer's memory with "
                          "process_vm_readv (ptrace rules: Yama's ptrace_scope, a container's "
                          "seccomp profile); broadcasts and allreduces go through the slots "
                          "from now on", self.comm.rank, self.comm.name)
        self.cma_bytes = 0
        self._calls.clear()
        self.host_calls.clear()
        self.last_allreduce = self.last_broadcast = _NO_CALL
        fallback = FastCall(call.collective, call.dtype, call.count, call.nbytes // call.count,
                            call.rop, call.root if call.root >= 0 else None, call.spec,
                            self.comm._comm_id,
                            BROADCAST if call.collective == "broadcast" else CHUNKED,
                            self.chunk)
        k = self.k + 1
        self.k += fallback.stages
        return fallback, k

    def _reduce_here(self, call: FastCall, arr: np.ndarray, k: int) -> None:
        """The reduction for dtypes the kernels do not know, over the slots, in rank order."""
        slots = self.slots
        assert slots is not None and call.spec is not None
        raw = arr.view(np.uint8)
        raw[...] = slots.payload(0, k, call.nbytes)
        for r in range(1, self.comm.size):
            call.spec.reduce(arr, slots.payload(r, k, call.nbytes).view(arr.dtype))

    # -- between sleep slices ----------------------------------------------------------------
    def _between_slices(self, state: int, call: FastCall, seq: int, word: int, stage: int,
                        flag: int, deadline: float, limit: float) -> None:
        comm = self.comm
        slots = self.slots
        assert slots is not None
        where = describe(comm.rank, call.collective, seq)
        if state < 0:
            peer = -state - 1
            theirs, their_bytes = slots.call_of(peer, stage)
            peer = comm._members[peer]
            raise CollectiveMismatch(
                f"peer rank {peer} published {describe_tag(-theirs - 1)} ({their_bytes} bytes) "
                f"in the fast path's slot where this rank is in {describe_tag(-word - 1)} "
                f"({call.nbytes} bytes): the two ranks disagree on the collective or on its "
                "arguments (dtype, element count, op or premul factor), or one of them "
                "skipped a call. Hint: PYCOLL_DEBUG=DETAIL reports who called what", peer=peer)
        if comm._check is not None:
            comm._check()            # an abort record first: it names the root cause
        missing = [r for r in range(comm.size)
                   if r != comm.rank and not slots.published(r, stage, flag)]
        self._raise_if_exited(missing)
        self._refuse_generic(missing, word, where)
        if time.monotonic() >= deadline:
            # reported like the generic path's timeout (which names world ranks too)
            raise WaitTimeout([], [comm._members[r] for r in missing])

    def _raise_if_exited(self, ranks: list[int]) -> None:
        """PeerLost for the first of ``ranks`` whose process has exited (named as the
        channels name ranks: world ranks)."""
        slots = self.slots
        assert slots is not None
        for r in ranks:
            pid = slots.pid(r)
            if pid and _exited(pid):
                raise peer_lost(self.comm._members[r], f"process {pid} exited")

    def _refuse_generic(self, missing: list[int], word: int, where: str) -> None:
        """A missing rank that sent this rank a message of the generic path for this very
        call (or an earlier one) disagrees about the call: its count, dtype or op took it
        off the fast path. Its channel is opened here if it was not yet (the generic path
        opens channels lazily, from both sides), so that its message can arrive at all."""
        comm = self.comm
        channels = comm._peers.channels
        my_tag = -word - 1
        opened = []
        for r in missing:
            try:
                opened.append(channels[r])
            except PycollError:
                continue         # unreachable: the liveness checks will say why
        self._read_and_check(opened, my_tag)

    # -- setup and teardown ------------------------------------------------------------------
    def close(self) -> None:
        if self.slots is not None:
            self.slots.close()
            self.slots = None
