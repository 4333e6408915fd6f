"""One-sided windows at the transport level: how a transport exposes a rank's window memory
and how an origin reaches a peer's (``comm/windows.py`` builds the user's ``Window`` on these).

A transport whose ``Capabilities.windows`` is set implements ``Transport.expose_window`` (this
rank's memory, returning an ``ExposedWindow`` whose ``record`` peers attach with) and
``Channel.attach_window`` (an origin's ``RemoteWindow`` on the peer's). Every operation of a
``RemoteWindow`` is complete, locally and at the target, when it returns: shm and inproc move
the bytes themselves (shared memory, one address space); tcp waits for the target's reply
(its progress engine applies the operation), so the window's ``flush`` has nothing left to
wait for. ``MemoryWindow``/``MemoryHandle`` are a window that this process reaches directly
(inproc's peers; tcp's target applying what origins sent). Bounds and dtypes are checked above (the
``Window`` knows every target's size before any byte moves); a transport checks again only
what a peer could lie about.
"""
from __future__ import annotations

import ctypes
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..buffers.memory import view_address
from ..errors import CollectiveTimeout, PeerLost, TransportError

#: operations an accumulate may apply: those whose result is one element-wise step
#: (``avg`` and ``premul_sum`` need the count of contributions or a factor). Their index
#: here is their code on tcp's wire.
ACCUMULATE_OPS = ("sum", "prod", "min", "max", "band", "bor", "bxor")


@dataclass(frozen=True)
class Update:
    """An accumulate's change of the target's bytes: ``combine(window elements, src)``.
    Callable on the scratch bytes (shm, inproc apply it themselves); a transport that ships
    it to the target (tcp) sends ``op``, ``dtype`` and ``src`` instead."""

    op: str
    dtype: str
    src: np.ndarray
    combine: Callable[[np.ndarray, np.ndarray], Any]

    def __call__(self, scratch: memoryview) -> None:
        self.combine(np.frombuffer(scratch, dtype=self.src.dtype), self.src)


class ExposedWindow(ABC):
    """This rank's window memory as one transport exposes it to its peers."""

    #: the JSON-able record a peer's ``Channel.attach_window`` takes
    record: dict[str, Any]
    #: the window's memory where the transport allocated it (``Transport.allocate_window``)
    memory: np.ndarray | None = None
    #: origins' operations are applied by this rank's progress (tcp), not by the origins:
    #: the window's own accumulates then use another transport's handle, if there is one
    served = False

    @abstractmethod
    def signals(self) -> int:
        """The sum of what peers of this transport have signalled this window so far."""

    @abstractmethod
    def local(self) -> RemoteWindow:
        """A handle on this rank's own window that takes the same locks as peers' handles
        (an accumulate into one's own window is atomic with respect to theirs)."""

    def seal(self) -> None:
        """Every peer has attached: drop what only attaching needed (shm: the file name)."""

    def apply_through(self, local: RemoteWindow) -> None:
        """Operations that this transport applies on the target's side (tcp's emulation) go
        through ``local``, the handle this rank's own accumulates use: then they take the
        same locks as every other transport's origins (a job over shm and tcp)."""

    @abstractmethod
    def close(self) -> None:
        """Withdraw the window (peers that still hold handles fail or see no effect)."""


class RemoteWindow(ABC):
    """An origin's handle on one peer's window; offsets and lengths in bytes, already checked
    against the peer's window size."""

    @abstractmethod
    def write(self, offset: int, view: memoryview, deadline: float = 0.0) -> None:
        """Copy ``view`` into the window at ``offset`` (a transport that waits for the
        target, tcp, waits until ``deadline``)."""

    @abstractmethod
    def read(self, offset: int, view: memoryview, deadline: float = 0.0) -> None:
        """Copy ``len(view)`` bytes of the window at ``offset`` into ``view``."""

    @abstractmethod
    def update(self, offset: int, nbytes: int, fn: Callable[[memoryview], None],
               deadline: float) -> None:
        """Atomically with respect to every other ``update`` of overlapping bytes: read the
        ``nbytes`` at ``offset`` into a scratch buffer, let ``fn`` change it, write it back.
        Waits for a conflicting update at most until ``deadline`` (``time.monotonic``)."""

    @abstractmethod
    def add_signal(self, value: int, deadline: float) -> None:
        """Add ``value`` to the peer's signal counter of this window."""

    def check_alive(self) -> None:
        """``PeerLost`` if the target is known to be gone (where operations alone cannot
        tell: a window this process maps, ``direct``)."""

    def direct(self) -> tuple[np.ndarray, Any] | None:
        """(the target window's bytes, a sequence whose ``[1]`` is non-zero once the target
        released it) where this process maps them, so that ``Window`` may copy without a
        call down here; None (the default) where it does not."""
        return None

    @abstractmethod
    def close(self) -> None:
        """Release what the handle holds (mappings, descriptors)."""


def wait_until(ready: Callable[[], bool], deadline: float, what: str) -> None:
    """Poll ``ready`` until it holds, with sleeps growing to 1 ms (the holder of a lock or
    the signaller may be a process waiting for a core); at ``deadline``, ``CollectiveTimeout``
    saying it waited for ``what``."""
    sleep = 10e-6
    while not ready():
        now = time.monotonic()
        if now >= deadline:
            raise CollectiveTimeout(f"deadline passed waiting for {what}")
        time.sleep(min(sleep, max(0.0, deadline - now)))
        sleep = min(sleep * 2, 1e-3)


class MemoryWindow(ExposedWindow):
    """A window this process reaches directly: ``nbytes`` at ``ptr`` (``view``), one lock
    that makes accumulates and signals atomic with respect to each other, the counter."""

    def __init__(self, view: memoryview, rank: int) -> None:
        self.view = view
        self.ptr, self.nbytes, self.rank = view_address(view), view.nbytes, rank
        self.lock = threading.Lock()
        self.count = 0
        self.closed = False
        self.record = {}

    def signals(self) -> int:
        return self.count

    def local(self) -> RemoteWindow:
        return MemoryHandle(self.rank, self)

    def close(self) -> None:
        self.closed = True


class MemoryHandle(RemoteWindow):
    """Copies straight into a ``MemoryWindow`` of this process; ``gone()`` (None: never)
    says why the target counts as lost (inproc: its rank's transport closed)."""

    def __init__(self, peer: int, target: MemoryWindow,
                 gone: Callable[[], str | None] | None = None) -> None:
        self.peer = peer
        self.target = target
        self.gone = gone

    def _check(self, offset: int, nbytes: int) -> int:
        why = self.gone() if self.gone is not None else None
        if why:
            raise PeerLost(f"peer rank {self.peer} is gone: {why}", peer=self.peer)
        if self.target.closed:
            raise TransportError(f"peer rank {self.peer} closed this window", peer=self.peer)
        if offset < 0 or offset + nbytes > self.target.nbytes:
            raise TransportError(f"{nbytes} bytes at offset {offset} outside peer rank "
                                 f"{self.peer}'s window of {self.target.nbytes} bytes",
                                 peer=self.peer)
        return self.target.ptr + offset

    def write(self, offset: int, view: memoryview, deadline: float = 0.0) -> None:
        there = self._check(offset, view.nbytes)
        if view.nbytes:
            ctypes.memmove(there, view_address(view), view.nbytes)

    def read(self, offset: int, view: memoryview, deadline: float = 0.0) -> None:
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
