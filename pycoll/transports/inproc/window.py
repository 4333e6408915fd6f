"""Windows between threads of one process: origins copy straight into the target's memory.

The window is the target's own buffer in this address space; a lock per window makes
accumulates (and signals) atomic with respect to each other. A target whose transport has
closed (its rank finalized or died) is a lost peer.
"""
from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from typing import Any

from ...buffers.memory import view_address
from ...errors import CollectiveTimeout, TransportError
from ..base import peer_lost
from ..windows import ExposedWindow, RemoteWindow


class InprocExposedWindow(ExposedWindow):
    def __init__(self, key: str, wid: int, ptr: int, nbytes: int, rank: int,
                 table: dict[int, InprocExposedWindow]) -> None:
        """``table``: the transport's open windows, which this one leaves when closed."""
        self.ptr, self.nbytes, self.rank = ptr, nbytes, rank
        self._table = table
        self.lock = threading.Lock()
        self.count = 0
        self.closed = False
        self.record = {"key": key, "id": wid}

    def signals(self) -> int:
        return self.count

    def local(self) -> RemoteWindow:
        return InprocRemoteWindow(self.rank, self, None)

    def close(self) -> None:
        self.closed = True
        self._table.pop(int(self.record["id"]), None)


class InprocRemoteWindow(RemoteWindow):
    def __init__(self, peer: int, target: InprocExposedWindow, endpoint: Any) -> None:
        """``endpoint``: the target's transport (None: this rank's own window)."""
        self.peer = peer
        self.target = target
        self.endpoint = endpoint

    def _check(self, offset: int, nbytes: int) -> int:
        if self.endpoint is not None and self.endpoint.closed:
            raise peer_lost(self.peer, "its transport closed (the rank finalized or failed)")
        if self.target.closed:
            raise TransportError(f"inproc: peer rank {self.peer} closed this window",
                                 peer=self.peer)
        if offset < 0 or offset + nbytes > self.target.nbytes:
            raise TransportError(f"inproc: {nbytes} bytes at offset {offset} outside peer rank "
                                 f"{self.peer}'s window of {self.target.nbytes} bytes",
                                 peer=self.peer)
        return self.target.ptr + offset

    def write(self, offset: int, view: memoryview) -> None:
        there = self._check(offset, view.nbytes)
        if view.nbytes:
            ctypes.memmove(there, view_address(view), view.nbytes)

    def read(self, offset: int, view: memoryview) -> None:
        there = self._check(offset, view.nbytes)
        if view.nbytes:
            ctypes.memmove(view_address(view), there, view.nbytes)

    def _locked(self, deadline: float) -> threading.Lock:
        lock = self.target.lock
        if not lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise CollectiveTimeout(f"deadline passed waiting for peer rank {self.peer}'s "
                                    "window lock (another rank holds it)")
        return lock

    def update(self, offset: int, nbytes: int, fn: Callable[[memoryview], None],
               deadline: float) -> None:
        self._check(offset, nbytes)
        scratch = memoryview(bytearray(nbytes))
        lock = self._locked(deadline)
        try:
            self.read(offset, scratch)
            fn(scratch)
            self.write(offset, scratch)
        finally:
            lock.release()

    def add_signal(self, value: int, deadline: float) -> None:
        self._check(0, 0)
        lock = self._locked(deadline)
        try:
            self.target.count = (self.target.count + value) % (1 << 64)
        finally:
            lock.release()

    def close(self) -> None:
        pass


def attach(peer: int, endpoint: Any, record: dict[str, Any]) -> InprocRemoteWindow:
    """The handle on window ``record`` of the peer whose transport is ``endpoint``."""
    target = None
    if endpoint is not None and record.get("key") == endpoint.key:
        target = endpoint.windows.get(int(record.get("id", -1)))
    if target is None:
        raise TransportError(f"inproc: peer rank {peer}'s window is not open in this process",
                             peer=peer)
    return InprocRemoteWindow(peer, target, endpoint)
