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
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ...buffers.memory import MemRef
from ...errors import TransportError
from ..base import WindowProgress
from ..tcp.window import HEAD, TcpExposedWindow, TcpRemoteWindow
from ..windows import Update
from .wire import CHUNK_BYTES, HDR, WindowRdma


class VerbsExposedWindow(TcpExposedWindow):
    """This rank's window for verbs origins: registered for their RDMA reads and writes,
    served (accumulates, signals) like tcp's."""

    def __init__(self, wid: int, view: memoryview, rank: int, dtype: str, np_dtype: Any,
                 table: dict[int, TcpExposedWindow], mr: Any, addr: int,
                 counter: np.ndarray, counter_mr: Any) -> None:
        super().__init__(wid, view, rank, dtype, np_dtype, table)
        self._mrs = [mr, counter_mr]
        #: the word verbs origins' signals fetch-and-add into (only RDMA atomics write it)
        self.counter = counter
        self.record.update({"dtype": dtype, "addr": addr, "rkey": mr.rkey,
                            "nbytes": view.nbytes, "counter": int(counter.ctypes.data),
                            "counter_rkey": counter_mr.rkey})

    def signals(self) -> int:
        return (super().signals() + int(self.counter[0])) % (1 << 64)

    def close(self) -> None:
        super().close()
        mrs, self._mrs = self._mrs, []
        for mr in mrs:              # peers' later reads, writes, signals fail at their adapter
            try:
                mr.close()
            except Exception:   # noqa: BLE001 - teardown must not fail
                pass


class VerbsRemoteWindow(TcpRemoteWindow):
    """An origin's handle on a peer's window over verbs (see the module docstring)."""

    def __init__(self, channel: Any, record: dict[str, Any], progress: WindowProgress,
                 dtype: str) -> None:
        super().__init__(channel, record, progress, dtype)
        try:
            self._base, self._rkey = int(record["addr"]), int(record["rkey"])
            self._size = int(record["nbytes"])
            self._counter = (int(record["counter"]), int(record["counter_rkey"]))
        except (KeyError, TypeError, ValueError):
            raise TransportError(f"verbs: peer rank {self.peer} sent a malformed window "
                                 f"record {record}", peer=self.peer) from None
        #: where the adapter puts the counter's old value (registered once, by the cache)
        self._old = np.zeros(1, dtype=np.uint64)
        # one request in one eager message: the channel's header, the request's, the bytes
        self._piece = channel.transport.eager_max - HDR.size - HEAD.size

    def _rdma(self, opcode: int, offset: int, view: memoryview, deadline: float) -> None:
        if offset < 0 or offset + view.nbytes > self._size:
            raise TransportError(f"verbs: {view.nbytes} bytes at offset {offset} outside peer "
                                 f"rank {self.peer}'s window of {self._size} bytes",
                                 peer=self.peer)
        if not view.nbytes:
            return
        ch = self.channel
        self._progress(lambda: ([r := ch.window_rdma(opcode, self._base + offset, self._rkey,
                                                     MemRef.of(view))], [r]), deadline)

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

        old = self._old
        ch = self.channel
        addr, rkey = self._counter
        self._progress(lambda: ([r := ch.window_rdma(E.IBV_WR_ATOMIC_FETCH_AND_ADD, addr, rkey,
                                                     MemRef.of(old), value % (1 << 64))], [r]),
                       deadline)

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

