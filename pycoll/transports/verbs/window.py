"""Windows over verbs: ``put`` and ``get`` are RDMA WRITE and READ on the target's registered
window (zero copy, no work for the target's CPU); ``accumulate`` and ``signal`` are served by
the target's progress, as over tcp (``tcp/window.py``'s requests, carried in this channel's
eager messages).

Why accumulates are served: RDMA has no floating-point atomics, and its integer atomics
(compare-and-swap, fetch-and-add on 8 bytes) are atomic only with respect to other RDMA
atomics, not to the target's own CPU or to shm origins in the same window. Serving them
puts every accumulate into a target through one lock (the window's own, or shm's byte-range
locks via ``apply_through``), whichever transport it came over. A request is at most
``eager_max`` bytes, so a large accumulate is sent in pieces of whole elements, each atomic
(MPI's accumulate is atomic per element). Signals travel the same way (a counter the
target reads without locks of its own).

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
                 table: dict[int, TcpExposedWindow], mr: Any, addr: int) -> None:
        super().__init__(wid, view, rank, dtype, np_dtype, table)
        self._mr = mr
        self.record.update({"dtype": dtype, "addr": addr, "rkey": mr.rkey,
                            "nbytes": view.nbytes})

    def close(self) -> None:
        super().close()
        mr, self._mr = self._mr, None
        if mr is not None:          # peers' later reads and writes fail at their adapter
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
        except (KeyError, TypeError, ValueError):
            raise TransportError(f"verbs: peer rank {self.peer} sent a malformed window "
                                 f"record {record}", peer=self.peer) from None
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
                       lkey: int, op_id: int) -> list[WindowRdma]:
    """The work requests of one window put or get: at most ``CHUNK_BYTES`` each."""
    return [WindowRdma(opcode, (remote_addr + pos, rkey), local_addr + pos,
                       min(CHUNK_BYTES, nbytes - pos), lkey, op_id)
            for pos in range(0, nbytes, CHUNK_BYTES)]

