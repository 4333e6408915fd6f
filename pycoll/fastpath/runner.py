"""Running a call on the fast path: the kernels, inside the communicator's rules.

A fast call is still an ordinary call of its communicator: through the communicator's
``Execution`` it takes the next sequence number, gets a flight-recorder entry, runs inline
only when no asynchronous call is queued (else on the communicator's worker, in order), has
a deadline, and fails through the same handling (abort record, flight-recorder dump, the
communicator marked failed). What differs is the body: one compiled call instead of an
algorithm, and, while it sleeps, the checks of ``liveness``.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import debug
from ..algorithms.primitives import Peers
from ..buffers.memops import HostOps
from ..buffers.reduction import ReduceOp, prepare
from ..errors import PycollError
from ..runtime.execution import Execution
from ..runtime.work import Work
from ..tags import SEQ_MASK, SEQ_SHIFT
from ..transports.progress import WaitPolicy
from . import NATIVE_DTYPES
from .calls import (
    ALLREDUCE_CMA_BYTES,
    BROADCAST,
    BROADCAST_BUDGET,
    CHUNK_BYTES,
    CHUNKED,
    CMA_BROKEN,
    CMA_REFUSED,
    CROWDED_POLLS,
    DIRECT,
    ONE_WAY,
    POLLS,
    SETTLE,
    SINGLE_COPY,
    SLEPT_AT,
    SMALL,
    FastCall,
    wait_policy,
)
from .compiled import callpath, warn_if_not_built
from .liveness import Liveness
from .segment import SharedSlots

NO_CALL = callpath.NO_CALL


class FastPath(callpath.FastPathState):
    """A communicator's fast path: its limits (agreed at init), its segment (made when the
    communicator was) and its count of stages run.

    It is given what it runs with, nothing more: the communicator's ``execution`` (numbering,
    recording, failing), its ``peers`` (channels, for the liveness checks and the generic
    execution of a fast body), ``members`` (world ranks, to name ranks in errors) and
    ``ops`` (the reductions the kernels leave to numpy).
    """

    def __init__(self, execution: Execution, peers: Peers, members: Sequence[int],
                 ops: HostOps, limit: int, chunked_limit: int, cma_bytes: int,
                 slots: SharedSlots) -> None:
        # the fields every call changes (``callpath.FastPathState``: the stage count, the
        # one-way broadcast pending, the previous calls' kinds)
        super().__init__()
        self.execution = execution
        self.rank = execution.rank
        self.size = execution.size
        self.ops = ops
        self.liveness = Liveness(self.rank, self.size, members, peers,
                                 execution.failures.check)
        self.limit = limit                  # one slot: the single-stage kernel
        self.chunked_limit = chunked_limit  # larger native-dtype allreduces, chunk by chunk
        # A broadcast through the slots copies twice, a single copy pins pages: the slots
        # win up to ~4 MiB with 2 ranks, 1 MiB with 4 (docs/algorithms.md)
        self.broadcast_limit = min(chunked_limit, BROADCAST_BUDGET // (self.size - 1))
        # From ``cma_bytes`` on (0: never), a broadcast reads straight out of the root's
        # buffer instead (kernels.broadcast_cma: one copy, no size limit). Whether the OS
        # lets this rank read its peers' memory (ptrace rules: Yama, seccomp in containers)
        # is learnt by the first such call, on every rank alike; if not, that call and all
        # later ones go through the slots (or the generic path) as above. With more ranks
        # than cores the copies queue for the cores anyway: a crowded host goes through the
        # slots as far as they go before the single copy.
        if WaitPolicy.crowded and cma_bytes:
            cma_bytes = max(cma_bytes, self.broadcast_limit + 1)
        self.cma_bytes = cma_bytes
        self.iov = np.zeros(4 + self.size, dtype=np.uint64)    # the kernels' scratch
        self.piece = np.empty(0, dtype=np.uint8)    # allreduce_cma's 2 pieces (made when needed)
        self.direct_bytes = 1 << 62 if WaitPolicy.crowded else ALLREDUCE_CMA_BYTES
        self.chunk = min(limit, CHUNK_BYTES) // 64 * 64
        self.slots = slots
        #: the last one-way broadcast's stage, sequence word, signature and bytes, until
        #: every rank is seen to have published it (``kernels.settle``; stage -1: none), and
        #: that call (to name it in errors)
        self.pending = np.array([-1, 0, 0, 0], dtype=np.int64)
        self._calls: dict[tuple, FastCall] = {}
        self.spin = wait_policy(CROWDED_POLLS if WaitPolicy.crowded else POLLS)
        self.slice_ns = int(WaitPolicy.liveness_seconds * 1e9)
        # the kernels: numba is imported by the first call that needs them, not at init
        self._kernels: Any = None
        if self.rank == 0:
            warn_if_not_built()

    # -- what takes the path -----------------------------------------------------------------
    def takes(self, nbytes: int, dtype: str, rop: ReduceOp, fold: str | None = None) -> bool:
        """Whether an allreduce of ``nbytes`` of ``dtype`` with ``rop`` runs here (decided
        alike on every rank that agrees about the call). ``fold``: how the call folds
        (``CallInfo.fold``); every kernel folds in rank order when the call says so (the
        one-slot kernel always does, the larger ones take ``ordered``), and so do the Python
        reductions of the other dtypes, which take the path up to one slot."""
        if nbytes <= self.limit:
            return True
        return (nbytes <= self.chunked_limit and dtype in NATIVE_DTYPES
                and rop.name != "premul_sum")

    def remember(self, key: tuple, tensor: np.ndarray, call: FastCall) -> None:
        """Let later calls of ``key`` (collective, op or root as passed) on 1-D numpy arrays
        of this dtype and length skip the classification (``host_calls``, read by
        ``callpath``). ``tensor`` is the classified buffer's array; not one that stands for
        another dtype (bfloat16 as uint16: a real uint16 array must not get bfloat16's
        reduction)."""
        if (type(tensor) is np.ndarray and tensor.dtype.name == call.dtype
                and len(self.host_calls) < 256):
            self.host_calls[key + (tensor.dtype, len(tensor))] = call
            memo = (key[1], tensor.dtype, len(tensor), call)
            if key[0] == "allreduce":
                self.last_allreduce = memo
            else:
                self.last_broadcast = memo

    def kind_of(self, collective: str, nbytes: int) -> str | None:
        """What runs ``collective`` of ``nbytes`` here (allreduce above one slot: of a
        native dtype, see ``takes``), or None for the generic path; the one place that
        decides (``FastCall`` and ``Communicator.selected_algorithm`` ask it). A call that
        folds in rank order runs the same kernel as one that does not, told to
        (``launch``): which one is in the call's signature either way (``FastCall.code``)."""
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
             rop: ReduceOp | None, root: int | None = None,
             fold: str | None = None) -> FastCall:
        key = (collective, dtype, count, rop, root, fold)
        found = self._calls.get(key)
        if found is None:
            if self._kernels is None:
                from . import kernels
                self._kernels = {SMALL: kernels.allreduce, CHUNKED: kernels.allreduce_chunked,
                                 BROADCAST: kernels.broadcast,
                                 ONE_WAY: kernels.broadcast_one_way, SETTLE: kernels.settle,
                                 SINGLE_COPY: kernels.broadcast_cma,
                                 DIRECT: kernels.allreduce_cma}
            spec = (self.ops.reduce_spec(rop, dtype, self.size, wide=fold == "fp32")
                    if rop is not None else None)
            kind = self.kind_of(collective, count * itemsize)
            assert kind is not None, (collective, count * itemsize)   # callers checked
            found = FastCall(collective, dtype, count, itemsize, rop, root, spec,
                             self.execution.comm_id, kind, self.chunk, fold)
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
        return self.run_generic(call, arr, timeout, async_op, output)

    def bind(self, call: FastCall) -> None:
        """Make ``call.run``: ``call`` run inline through the execution's contract
        (``begin_inline``, ``finish_inline``, ``fail_inline``) for the common case (a
        synchronous call without its own timeout, nothing queued), everything else through
        ``Execution.execute`` (``callpath.BoundCall``, compiled where built).

        What never changes for the call or the communicator is decided once, here: whether
        the single-slot kernel is called through its entry point for exactly these argument
        types (``bound``: skipping the dispatcher's type check), with the call's constants
        in one array (``kernels.allreduce_bound``; docs/algorithms.md#the-fast-path-one-host),
        and whether it takes the array or its bytes."""
        execution = self.execution
        if call.prepare or execution.detail:     # premul factors, DETAIL's checks
            run_generic = self.run_generic
            call.run = lambda arr, timeout, async_op, output: run_generic(
                call, arr, timeout, async_op, output)
            return
        # the bytes go through as bytes: exchange-only calls (Python reduces) and barriers
        raw = call.op_code < 0 and call.dtype != "uint8"
        one_way = call.one_way
        # what the bound kernel takes: the array itself, or its bytes. A one-way broadcast
        # of a dtype the kernels know gets an entry point for that dtype (it copies bytes
        # either way): ``arr.view(np.uint8)`` is a measurable part of a small call. Its
        # resumption (``_complete``) still runs the uint8 kernel that ``warm`` compiled
        entry_raw = raw and not (one_way and call.dtype in NATIVE_DTYPES)
        bound = (call.kind is SMALL or one_way) and self.slots is not None
        name = "broadcast_bound" if one_way else "allreduce_bound"
        entry_dtype = np.dtype("uint8" if (entry_raw if one_way else raw) else call.dtype)
        constants = 0
        if bound:
            assert self.slots is not None
            seg = self.slots.bytes
            # the call's constants (``kernels.allreduce_bound``, ``broadcast_bound``), passed
            # by address: the entry point unboxes an integer instead of an array. The call
            # keeps them alive
            words = [seg.ctypes.data, seg.size, self.rank, self.size, self.slots.stride,
                     call.code, call.root if one_way else call.op_code, self.spin,
                     self.slice_ns, self.pending.ctypes.data]
            call.constants = np.array(words, dtype=np.int64)
            constants = call.constants.ctypes.data
        call.run = callpath.bind(self, call, bound, raw, entry_raw, (name, entry_dtype),
                                 constants)

    def entry_point(self, dtype: np.dtype, name: str) -> Any:
        """The compiled entry point of the bound kernel ``name`` (``kernels.allreduce_bound``
        or ``broadcast_bound``) for a 1-D C-contiguous aligned writable array of ``dtype``
        (loaded from numba's cache, or compiled, now)."""
        from numba import types
        from numba.np.numpy_support import from_dtype

        from . import kernels
        data = types.Array(from_dtype(dtype), 1, "C")
        return getattr(kernels, name).compile((data, types.int64, types.int64, types.int64))

    def run_generic(self, call: FastCall, arr: np.ndarray, timeout: Any, async_op: bool,
                     output: Any, src: np.ndarray | None = None) -> Work | None:
        """The call as a body of the generic execution (queued, async, DETAIL, timeout=).
        ``src``: the input of an out-of-place call, copied into ``arr`` (its ``out``) only
        once the execution has claimed the call, so that a refused call (a failed or
        finalized communicator) leaves ``out`` untouched and a queued asynchronous one reads
        its input when it runs, as the generic path does."""
        execution = self.execution
        ops = self.ops

        def body(peers: Peers) -> None:
            if src is not None:
                ops.copy(arr, src)
            word = -peers.tag - 1
            self.execute(call, arr, word, peers.deadline)
            if execution.generic_ran:
                execution.generic_ran = False
                self.liveness.refuse_leftovers(word)

        return execution.execute(call.info, body, timeout, async_op, output, generic=False)

    def execute(self, call: FastCall, arr: np.ndarray, word: int, deadline: float) -> None:
        """The whole call, as the body of a call of the generic execution."""
        seq = (word >> SEQ_SHIFT) & SEQ_MASK
        self.open_slots(call, word)
        if call.prepare:
            prepare(call.rop, call.dtype, arr)      # type: ignore[arg-type]
        if self.unsettled and not call.one_way:
            self.settle(deadline)
        k = self.k + 1
        self.k += call.stages
        data = arr if call.op_code >= 0 else arr.view(np.uint8)
        state = self.launch(call, data, k, word, False, 0)
        self.complete(state, call, arr, data, seq, word, k, deadline)

    def launch(self, call: FastCall, data: np.ndarray, k: int, word: int, resume: bool,
               position: int) -> int:
        """Run ``call``'s kernel from stage ``k`` (``resume``: after a sleep, at
        ``position``); returns its status."""
        slots = self.open_slots(call, word)
        kind = call.kind
        kernel = self._kernels[kind]
        rank, size = self.rank, self.size
        if kind == SMALL:
            return kernel(slots.bytes, data, rank, size, slots.stride, k, word,
                          call.code, call.op_code, resume, self.spin, self.slice_ns)
        if kind == SINGLE_COPY:
            return kernel(slots.bytes, data, rank, size, slots.stride, k, word,
                          call.code, call.root, resume, position, self.spin, self.slice_ns,
                          self.iov)
        if kind == DIRECT:
            if not self.piece.size:
                self.piece = np.empty(2 * CHUNK_BYTES, dtype=np.uint8)
            return kernel(slots.bytes, data, rank, size, slots.stride, k, word,
                          call.code, call.op_code, call.fold is not None, resume, position,
                          self.spin, self.slice_ns, self.iov, self.piece)
        if call.one_way:
            if not resume:
                self.unsettled = True
                self.settling_call, self.pending_call = self.pending_call, call
            return self._kernels[ONE_WAY](slots.bytes, data, rank, size, slots.stride, k, word,
                                          call.code, call.root, position, self.spin,
                                          self.slice_ns, self.pending)
        if kind == BROADCAST:
            return kernel(slots.bytes, data, rank, size, slots.stride, self.chunk, k,
                          word, call.code, call.root, resume, position, self.spin,
                          self.slice_ns)
        return kernel(slots.bytes, data, rank, size, slots.stride, self.chunk, k, word,
                      call.code, call.op_code, call.fold is not None, resume, position,
                      self.spin, self.slice_ns)

    def complete(self, state: int, call: FastCall, arr: np.ndarray, data: np.ndarray,
                  seq: int, word: int, k: int, deadline: float) -> None:
        """Wait on in sleep slices until done, then what the kernel left to Python."""
        while state != 0:
            slots = self.open_slots(call, word)
            if state == CMA_REFUSED:        # the same on every rank: all go on this way
                call, k = self._without_cma(call)
                state = self.launch(call, data, k, word, False, 0)
                continue
            if state == CMA_BROKEN:
                self.liveness.broken_read(slots, call, seq)
            position = state - SLEPT_AT if state >= SLEPT_AT else 0   # kernels.SLEPT_AT
            if call.one_way and position == 0 and self.pending[0] not in (-1, k):
                # still settling the previous one-way broadcast
                self._between_settles(state, deadline, self.settling_call)
            else:
                offset, phase = call.waited(position)   # the stage and flag waited for
                self.liveness.between_slices(slots, state, call, seq, word, k + offset,
                                             2 * (k + offset) + phase, deadline,
                                             only=call.root if call.one_way else None)
            state = self.launch(call, data, k, word, True, position)
        if call.reduce_here:
            self._reduce_here(call, arr, k, word)
        if call.finish and call.spec is not None:
            call.spec.finish(arr)

    def settle(self, deadline: float) -> None:
        """Before a stage of any other kernel: wait until every rank has published the last
        one-way broadcast's stage (``kernels.settle``), in sleep slices with the liveness
        checks, as any wait."""
        settle = self._kernels[SETTLE]
        while True:
            slots = self.open_slots(self.pending_call, int(self.pending[1]))
            state = settle(slots.bytes, self.rank, self.size, slots.stride, self.pending,
                           self.spin, self.slice_ns)
            if state == 0:
                self.unsettled = False
                return
            self._between_settles(state, deadline, self.pending_call)

    def settle_after(self, state: int) -> None:
        """The rest of a settle that the compiled call path began (``settle_bound``) and
        that returned ``state`` instead of DONE: a sleep slice passed, or a rank disagreed."""
        execution = self.execution
        deadline = execution.started + execution.timeout
        self._between_settles(state, deadline, self.pending_call)
        self.settle(deadline)

    def settled_first(self, body: Any) -> Any:
        """``body`` (of a call of the generic path) that first settles a pending one-way
        broadcast: the disagreement it may hide is raised at the next call, whichever path
        that takes."""
        def run(peers: Peers) -> None:
            if self.unsettled:
                self.settle(peers.deadline)
            body(peers)
        return run

    def _between_settles(self, state: int, deadline: float, call: FastCall | None) -> None:
        """The liveness checks of a wait for a one-way broadcast's stage (``pending``):
        errors name that broadcast, ``call`` (a rank that published another call in its
        stage disagreed about it)."""
        assert call is not None
        stage, word = int(self.pending[0]), int(self.pending[1])
        slots = self.open_slots(call, word)
        self.liveness.between_slices(slots, state, call, (word >> SEQ_SHIFT) & SEQ_MASK, word,
                                     stage, 2 * stage, deadline)

    def _without_cma(self, call: FastCall) -> tuple[FastCall, int]:
        """Some rank may not read its peers' memory: no cross-memory attach on this
        communicator any more (the kernels found out before changing any buffer). Returns
        ``call`` through the slots, and its first stage."""
        debug.logger.info("rank %d: %s: a rank could not read a peer's memory with "
                          "process_vm_readv (ptrace rules: Yama's ptrace_scope, a container's "
                          "seccomp profile); broadcasts and allreduces go through the slots "
                          "from now on", self.rank, self.execution.name)
        self.cma_bytes = 0
        self._calls.clear()
        self.host_calls.clear()
        self.last_allreduce = self.last_broadcast = NO_CALL
        fallback = FastCall(call.collective, call.dtype, call.count, call.nbytes // call.count,
                            call.rop, call.root if call.root >= 0 else None, call.spec,
                            self.execution.comm_id,
                            BROADCAST if call.collective == "broadcast" else CHUNKED,
                            self.chunk, call.fold)
        k = self.k + 1
        self.k += fallback.stages
        return fallback, k

    def _reduce_here(self, call: FastCall, arr: np.ndarray, k: int, word: int) -> None:
        """The reduction for dtypes the kernels do not know: the rank-order fold of the
        slots (``folding.Fold``; accumulated in float32 where the call says so), finished."""
        assert call.spec is not None and call.spec.fold is not None
        slots = self.open_slots(call, word)
        fold = call.spec.fold
        sources = [slots.payload(r, k, call.nbytes).view(arr.dtype) for r in range(self.size)]
        acc = np.empty(arr.size, dtype=fold.acc_dtype) if fold.acc_dtype is not None else None
        fold(arr, sources, acc)

    def open_slots(self, call: FastCall | None, word: int) -> SharedSlots:
        """The segment, while it is mapped. A finalize on another thread can close it between
        two waits of a call (``SharedSlots.close``): no kernel may run on it then, and the call
        (``word``: its sequence word) says why it failed."""
        slots = self.slots
        if slots is None or slots.bytes is None:
            name = call.collective if call is not None else "a call"
            raise PycollError(f"rank {self.rank}: {name} #{(word >> SEQ_SHIFT) & SEQ_MASK}: "
                              "the fast path's segment is closed (communicator finalized)")
        return slots

    # -- teardown ----------------------------------------------------------------------------
    def segment_bytes(self) -> int:
        """Bytes of the shared segment (0 once closed)."""
        return self.slots.segment.size if self.slots is not None else 0

    def close(self) -> None:
        if self.slots is not None:
            self.slots.close()
            self.slots = None
