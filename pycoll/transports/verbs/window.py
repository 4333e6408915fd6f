"""Windows over verbs: ``put`` and ``get`` are RDMA WRITE and READ on the target's registered
window (zero copy, no work for the target's CPU); ``signal`` is an RDMA fetch-and-add on an
8-byte counter word the target registered beside its window (it reads the word in
``wait_signal``); ``accumulate`` is served by the target's progress, as over tcp
(``tcp/window.py``'s requests, carried in this channel's eager messages).

Why accumulates are served: RDMA has no floating-point atomics, and its integer atomics
(compare-and-swap, fetch-and-add on 8 bytes) are atomic only with respect to other RDMA
atomics, not to the target's own CPU or to shm origins in the same window. Serving them
puts every accumulate into a target through one lock (the window's own, or shm's byte-range
locks via ``apply_through``), whichever transport it came over. A request is at most
``eager_max`` bytes, so a large accumulate is sent in pieces of whole elements, each atomic
(MPI's accumulate is atomic per element). The signal word is written only by RDMA atomics
(the target's own signals and other transports' go to counters of their own; ``signals()``
sums them), so the adapter's atomicity is all it needs.

The window's memory is registered once at creation (remote read and write) and its address
and rkey go to the peers in the creation's exchange; the origin's buffer goes through the
registration cache. Bounds and dtypes were checked by the ``Window`` before any byte moves;
a remote access outside the region fails at the adapter (the channel breaks with a remote
access error), never writing elsewhere. A target whose process died fails the RDMA with
retries exceeded: ``PeerLost``.

A target that releases its window alone (an exception leaving the ``with`` block, finalize,
shrink: no barrier) must neither be written into afterwards nor break the pair: an RDMA
access to a deregistered region is a remote access error, which moves the queue pair to
the error state and takes every later message of the pair with it. So the counter word has
two neighbours, registered with it and never deregistered while the transport lives: an
*in-use* count, changed only by origins' RDMA fetch-and-adds, and a *closed* word, written
by the target. An origin's put, get or signal adds 1 to in-use, reads closed, and, if it is
set, subtracts 1 again and refuses (``TransportError``, nothing moved, the pair intact);
otherwise it does its RDMA and then subtracts 1. The release sets closed, then waits until
in-use is 0 before it deregisters the window: an origin either saw closed set, or its
increment came first and the release waits for its operation (the same handshake as shm's
closed word and locks). The price is three small RDMA round trips per put, get or signal.
"""
from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from ... import debug
from ...buffers.memory import MemRef
from ...errors import CollectiveTimeout, TransportError
from ..base import WindowProgress
from ..tcp.window import HEAD, TcpExposedWindow, TcpRemoteWindow
from ..windows import Update, wait_until
from .wire import CHUNK_BYTES, HDR, WindowRdma

#: the control words beside the window (``CONTROL_WORDS`` uint64, registered together):
#: the signal counter, the in-use count, the closed word
COUNTER, IN_USE, CLOSED = 0, 1, 2
CONTROL_WORDS = 3
#: how long a release waits for origins' operations in flight (each is a few RDMA round
#: trips; only a stopped origin process takes longer)
RELEASE_WAIT_SECONDS = 30.0


class VerbsExposedWindow(TcpExposedWindow):
    """This rank's window for verbs origins: registered for their RDMA reads and writes,
    served (accumulates) like tcp's. ``control`` (``CONTROL_WORDS`` words, registered as
    ``control_mr``) belongs to the transport, which keeps it registered after the window is
    released, so that a late origin reads the closed word instead of breaking the pair."""

    def __init__(self, wid: int, view: memoryview, rank: int, dtype: str, np_dtype: Any,
                 table: dict[int, TcpExposedWindow], mr: Any, addr: int,
                 control: np.ndarray, control_mr: Any) -> None:
        super().__init__(wid, view, rank, dtype, np_dtype, table)
        self._mr = mr
        #: the counter verbs origins' signals fetch-and-add into (only RDMA atomics write
        #: it), the in-use count and the closed word (module docstring)
        self.control = control
        self.record.update({"dtype": dtype, "addr": addr, "rkey": mr.rkey,
                            "nbytes": view.nbytes, "counter": int(control.ctypes.data),
                            "counter_rkey": control_mr.rkey})

    def signals(self) -> int:
        return (super().signals() + int(self.control[COUNTER])) % (1 << 64)

    def close(self) -> None:
        """Refuse served requests and set the closed word, wait for the origins' operations
        that saw it open (the in-use count back to 0), then deregister the window's memory:
        once this returns, no origin reaches the buffer."""
        super().close()
        mr, self._mr = self._mr, None
        if mr is None:
            return
        self.control[CLOSED] = 1
        _full_barrier()        # the closed word is visible before in-use is read
        try:
            wait_until(lambda: int(self.control[IN_USE]) == 0,
                       time.monotonic() + RELEASE_WAIT_SECONDS, "origins' operations")
        except CollectiveTimeout:
            debug.logger.warning(
                "verbs window of rank %d: an origin's operation stayed in flight past %.0f s "
                "while the window was released (a stopped process?): its access fails at the "
                "adapter and breaks that pair", self.rank, RELEASE_WAIT_SECONDS)
        try:
            mr.close()
        except Exception:   # noqa: BLE001 - teardown must not fail
            pass


_barrier_lock = threading.Lock()


def _full_barrier() -> None:
    """A full memory barrier (taking a lock is one: an atomic read-modify-write)."""
    with _barrier_lock:
        pass


class VerbsRemoteWindow(TcpRemoteWindow):
    """An origin's handle on a peer's window over verbs (see the module docstring)."""

    def __init__(self, channel: Any, record: dict[str, Any], progress: WindowProgress,
                 dtype: str) -> None:
        super().__init__(channel, record, progress, dtype)
        try:
            self._base, self._rkey = int(record["addr"]), int(record["rkey"])
            self._size = int(record["nbytes"])
            self._control = (int(record["counter"]), int(record["counter_rkey"]))
        except (KeyError, TypeError, ValueError):
            raise TransportError(f"verbs: peer rank {self.peer} sent a malformed window "
                                 f"record {record}", peer=self.peer) from None
        #: where the adapter puts a fetch-and-add's old value and the closed word read
        #: (registered once, by the cache)
        self._old = np.zeros(2, dtype=np.uint64)
        # one request in one eager message: the channel's header, the request's, the bytes
        self._piece = channel.transport.eager_max - HDR.size - HEAD.size

    def _post(self, opcode: int, addr: int, rkey: int, mem: MemRef, deadline: float,
              add: int | None = None) -> None:
        ch = self.channel
        self._progress(lambda: ([r := ch.window_rdma(opcode, addr, rkey, mem, add)], [r]),
                       deadline)

    def _word(self, index: int) -> int:
        return self._control[0] + 8 * index

    def _guarded(self, opcode: int, addr: int, rkey: int, mem: MemRef, deadline: float,
                 add: int | None = None) -> None:
        """One RDMA operation, between an increment and a decrement of the target's in-use
        count, after reading its closed word (module docstring)."""
        from .device import E

        faa, rkey_control = E.IBV_WR_ATOMIC_FETCH_AND_ADD, self._control[1]
        old, closed = MemRef.of(self._old[:1]), MemRef.of(self._old[1:])
        self._post(faa, self._word(IN_USE), rkey_control, old, deadline, 1)
        try:
            self._post(E.IBV_WR_RDMA_READ, self._word(CLOSED), rkey_control, closed, deadline)
            if self._old[1]:
                raise TransportError(f"verbs: peer rank {self.peer} released its window "
                                     "(closed, left by an exception, finalized or shrunk): "
                                     "nothing was moved; close the window on every rank",
                                     peer=self.peer)
            self._post(opcode, addr, rkey, mem, deadline, add)
        finally:
            if self.channel.broken is None:
                self._post(faa, self._word(IN_USE), rkey_control, old, deadline, (1 << 64) - 1)

    def _rdma(self, opcode: int, offset: int, view: memoryview, deadline: float) -> None:
        if offset < 0 or offset + view.nbytes > self._size:
            raise TransportError(f"verbs: {view.nbytes} bytes at offset {offset} outside peer "
                                 f"rank {self.peer}'s window of {self._size} bytes",
                                 peer=self.peer)
        if not view.nbytes:
            return
        self._guarded(opcode, self._base + offset, self._rkey, MemRef.of(view), deadline)

    def write(self, offset: int, view: memoryview, deadline: float = 0.0) -> None:
        from .device import E

        self._rdma(E.IBV_WR_RDMA_WRITE, offset, view.cast("B"), deadline)

    def read(self, offset: int, view: memoryview, deadline: float = 0.0) -> None:
        from .device import E

        self._rdma(E.IBV_WR_RDMA_READ, offset, view.cast("B"), deadline)

    def add_signal(self, value: int, deadline: float) -> None:
        """An RDMA fetch-and-add on the target's counter word: no work for its CPU (it
        reads the word in ``wait_signal``)."""
        from .device import E

        self._guarded(E.IBV_WR_ATOMIC_FETCH_AND_ADD, self._word(COUNTER), self._control[1],
                      MemRef.of(self._old[:1]), deadline, value % (1 << 64))

    def update(self, offset: int, nbytes: int, fn: Any, deadline: float) -> None:
        if not isinstance(fn, Update):
            super().update(offset, nbytes, fn, deadline)     # refuses it
            return
        src = np.ascontiguousarray(fn.src).reshape(-1)
        per = max(1, self._piece // max(1, src.itemsize))
        if per * src.itemsize > self._piece:
            raise TransportError(f"verbs: an element of {src.itemsize} bytes does not fit one "
                                 f"window request (PYCOLL_IB_EAGER_MAX is too small)",
                                 peer=self.peer)
        for start in range(0, src.size, per):
            part = src[start:start + per]
            super().update(offset + start * src.itemsize, part.nbytes,
                           Update(fn.op, fn.dtype, part, fn.combine), deadline)


def window_rdma_pieces(opcode: int, remote_addr: int, rkey: int, local_addr: int, nbytes: int,
                       lkey: int, op_id: int, add: int | None = None) -> list[WindowRdma]:
    """The work requests of one window put or get: at most ``CHUNK_BYTES`` each (a signal's
    fetch-and-add is one)."""
    return [WindowRdma(opcode, (remote_addr + pos, rkey), local_addr + pos,
                       min(CHUNK_BYTES, nbytes - pos), lkey, op_id, add)
            for pos in range(0, nbytes, CHUNK_BYTES)]

