"""The device buffers of a call: moved directly (cuda_ipc) or staged through host memory.

Directly: when every transport of the communicator moves device memory (one host, cuda_ipc),
allreduce, broadcast, reduce, send and recv run their algorithms on the device buffers
themselves (``pycoll.cuda.ops``), on pycoll's stream, ordered after the caller's stream and
released to it at the end. The other collectives, and every collective over transports that
move host memory only, are staged as follows.

tcp (across hosts), shm and verbs move host bytes. A collective on CUDA buffers over them is
the host collective on page-locked copies: every device buffer the call reads is copied to
the host on pycoll's stream (after the caller's queued work), the host collective runs on
those copies with every algorithm and every transport unchanged, and every buffer the call
writes is copied back, after which the caller's stream is made to wait. Gloo's CUDA
collectives work the same way; NCCL's network transports stage through host memory too
when GPUDirect RDMA is not there.

The page-locked buffers come from a pool: a call takes what it needs when it is planned and
gives it back when it ends, so memory grows to what the calls in flight need at once and is
then reused, never allocated per call. The pool's sizes are powers of two, so one buffer
serves every size up to it.

Errors come before any byte moves: the copies are only queued once the call passed every
check and runs (``wrap``); a call refused while being planned gives its buffers back
(``begin``). Calls on one buffer see each other's results in submission order: each copies
in when it runs, after the call before it copied back.
"""
from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ..buffers.memory import CUDA, HOST
from ..buffers.tensors import Buffer
from ..errors import InvalidArgument
from . import runtime


class StagedCopy(NamedTuple):
    """One device buffer of a call and its page-locked twin."""

    obj: Any            # the user's object (kept alive until the call ends)
    source: str
    device_ptr: int
    host: np.ndarray | None   # the pool's uint8 buffer (at least ``nbytes``); None: direct
    nbytes: int
    reads: bool         # the call reads it: copied to the host before the call
    writes: bool        # the call writes it: copied back after the call


def _address(host: np.ndarray | None) -> int:
    assert host is not None          # staged copies always have their host twin
    return int(host.ctypes.data)


class PinnedPool:
    """Page-locked buffers by power-of-two size, shared by the calls of one communicator."""

    def __init__(self) -> None:
        self._free: dict[int, list[np.ndarray]] = {}
        self._lock = threading.Lock()
        self.allocated = 0          # bytes, for tests and the memory benchmark

    @staticmethod
    def _size(nbytes: int) -> int:
        return 1 << max(12, (max(nbytes, 1) - 1).bit_length())

    def take(self, nbytes: int) -> np.ndarray:
        size = self._size(nbytes)
        with self._lock:
            free = self._free.get(size)
            if free:
                return free.pop()
            self.allocated += size
        return runtime.pinned(size)

    def give(self, buf: np.ndarray) -> None:
        with self._lock:
            self._free.setdefault(buf.nbytes, []).append(buf)


class DirectCall:
    """A call whose algorithm runs on the device buffers themselves."""

    def __init__(self, device: int, caller: int, users: list[Any], ops: Any) -> None:
        self.device = device
        self.caller = caller
        self.users = users
        self.ops = ops

    def start(self) -> None:
        """Order pycoll's stream after the work queued on the caller's stream."""
        runtime.order_after_caller(self.device, self.caller)

    def wrap(self, body: Callable[[Any], None]) -> Callable[[Any], None]:
        """``body`` with the device ops, on pycoll's stream; then the caller's stream waits
        for it (no host wait: a synchronous call returns with the result usable on the
        caller's stream, as with NCCL)."""
        def direct(peers: Any) -> None:
            host_ops = peers.use_ops(self.ops)
            cp = runtime.cupy()
            try:
                with cp.cuda.Device(self.device), runtime.pycoll_stream(self.device):
                    body(peers)
                runtime.release_to_caller(self.device, self.caller, self.users)
            finally:
                peers.use_ops(host_ops)
        return direct


class StagedCall:
    """The staged buffers of one call: copies in, the host body, copies back."""

    def __init__(self, pool: PinnedPool, device: int, caller: int,
                 copies: list[StagedCopy]) -> None:
        self.pool = pool
        self.device = device
        self.caller = caller
        self.copies = copies

    def start(self) -> None:
        """Order pycoll's stream after the work queued so far on the caller's stream."""
        runtime.order_after_caller(self.device, self.caller)

    def wrap(self, body: Callable[[Any], None]) -> Callable[[Any], None]:
        """``body`` between the copies: the copies in are queued and waited for, the host
        collective runs, the copies back are queued and waited for, so the result is in the
        device buffers when the call ends.

        The copies in are queued when the call runs, not when it is submitted: an earlier
        async call on the same buffer queues its copies back only when it runs, and a copy in
        queued at submit would read the buffer from before that call's result."""
        def staged(peers: Any) -> None:
            try:
                for c in self.copies:
                    if c.reads:
                        runtime.memcpy(_address(c.host), c.device_ptr, c.nbytes,
                                       runtime.DEVICE_TO_HOST, self.device)
                runtime.synchronize(self.device)
                body(peers)
                for c in self.copies:
                    if c.writes:
                        runtime.memcpy(c.device_ptr, _address(c.host), c.nbytes,
                                       runtime.HOST_TO_DEVICE, self.device)
                # the copies back are done when this returns: the caller's stream needs
                # no event, and no torch allocation is still in use on pycoll's stream
                runtime.synchronize(self.device)
            finally:
                self.release()
        return staged

    def release(self) -> None:
        copies, self.copies = self.copies, []
        for c in copies:
            if c.host is not None:
                self.pool.give(c.host)


class DeviceCalls:
    """Per communicator: the device buffers of the call being planned, the page-locked
    pool, and the device ops (scratch) of direct calls."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.pool = PinnedPool()
        #: the device buffers of the call being planned (``Execution`` takes them)
        self.pending: list[StagedCopy] = []
        self._device: int | None = None
        self._caller = 0
        self._ops: Any = None

    def twin(self) -> DeviceCalls:
        """A copy that plans one call beside the calls made on this one: its own pending
        buffers and device, the same page-locked pool (thread-safe) and device ops."""
        twin = copy.copy(self)
        twin.pending = []
        twin._device = None
        twin._caller = 0
        return twin

    def begin(self) -> None:
        """A new call is being planned: anything left from a refused one goes back."""
        if self.pending:
            for c in self.pending:
                if c.host is not None:
                    self.pool.give(c.host)
            self.pending.clear()
        self._device = None

    def _usable(self, buf: Buffer, collective: str, name: str) -> int:
        """The buffer's device (the call's first buffer names the call's device and stream)."""
        why = runtime.unavailable_reason()
        if why is not None:
            raise InvalidArgument(
                f"rank {self.rank}: {collective}: {name} is {buf.where} device memory "
                f"({buf.source}, dtype {buf.dtype}), which this process cannot move: {why}. "
                "Nothing was sent.")
        device = runtime.current_device_of(buf.array, buf.source, buf.device)
        if self._device is None:
            self._device = device
            self._caller = runtime.caller_stream(buf.array, buf.source, device)
        elif device != self._device:
            raise InvalidArgument(
                f"rank {self.rank}: {collective}: {name} is on cuda:{device} but another "
                f"buffer of this call is on cuda:{self._device}; the buffers of one call must "
                "be on one device")
        return device

    def ops(self) -> Any:
        """The device ``MemoryOps`` (one per communicator: its scratch is reused)."""
        if self._ops is None:
            import importlib

            from ..buffers import memops
            importlib.import_module("pycoll.cuda.ops")      # registers the CUDA ops
            self._ops = memops.ops_for(CUDA)
        return self._ops

    def direct(self, buf: Buffer, collective: str, name: str) -> Buffer:
        """The device buffer itself, as a CuPy array the algorithms work on."""
        device = self._usable(buf, collective, name)
        view = runtime.device_view(buf.array, buf.source, buf.dtype, buf.count, device)
        self.pending.append(StagedCopy(buf.array, buf.source, 0, None, buf.nbytes, True, True))
        return Buffer(view, buf.dtype, buf.source, CUDA, device, buf.count, buf.itemsize)

    def stage(self, buf: Buffer, collective: str, name: str, *, reads: bool,
              writes: bool) -> Buffer:
        """A host ``Buffer`` standing in for the device buffer ``buf`` in this call."""
        self._usable(buf, collective, name)
        host = self.pool.take(buf.nbytes)
        ptr = runtime.device_pointer(buf.array, buf.source) if buf.nbytes else 0
        self.pending.append(StagedCopy(buf.array, buf.source, ptr, host, buf.nbytes,
                                       reads, writes))
        arr = host[:buf.nbytes].view(runtime.storage_dtype(buf.dtype))
        return Buffer(arr, buf.dtype, buf.source, HOST)

    def take(self) -> StagedCall | DirectCall:
        """The planned call's device buffers, pycoll's stream ordered after the caller's."""
        assert self._device is not None
        if self.pending[0].host is None:
            call: StagedCall | DirectCall = DirectCall(
                self._device, self._caller, [c.obj for c in self.pending], self.ops())
        else:
            call = StagedCall(self.pool, self._device, self._caller, list(self.pending))
        self.pending.clear()
        self._device = None
        call.start()
        return call
