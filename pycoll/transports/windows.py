"""One-sided windows at the transport level: how a transport exposes a rank's window memory
and how an origin reaches a peer's (``comm/windows.py`` builds the user's ``Window`` on these).

A transport whose ``Capabilities.windows`` is set implements ``Transport.expose_window`` (this
rank's memory, returning an ``ExposedWindow`` whose ``record`` peers attach with) and
``Channel.attach_window`` (an origin's ``RemoteWindow`` on the peer's). Every operation of a
``RemoteWindow`` is complete, locally and at the target, when it returns: the transports that
implement it so far move the bytes themselves (shared memory, one address space), so the
window's ``flush`` has nothing left to wait for. Bounds and dtypes are checked above (the
``Window`` knows every target's size before any byte moves); a transport checks again only
what a peer could lie about.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from ..errors import CollectiveTimeout


class ExposedWindow(ABC):
    """This rank's window memory as one transport exposes it to its peers."""

    #: the JSON-able record a peer's ``Channel.attach_window`` takes
    record: dict[str, Any]

    @abstractmethod
    def signals(self) -> int:
        """The sum of what peers of this transport have signalled this window so far."""

    @abstractmethod
    def local(self) -> RemoteWindow:
        """A handle on this rank's own window that takes the same locks as peers' handles
        (an accumulate into one's own window is atomic with respect to theirs)."""

    def seal(self) -> None:
        """Every peer has attached: drop what only attaching needed (shm: the file name)."""

    @abstractmethod
    def close(self) -> None:
        """Withdraw the window (peers that still hold handles fail or see no effect)."""


class RemoteWindow(ABC):
    """An origin's handle on one peer's window; offsets and lengths in bytes, already checked
    against the peer's window size."""

    @abstractmethod
    def write(self, offset: int, view: memoryview) -> None:
        """Copy ``view`` into the window at ``offset``."""

    @abstractmethod
    def read(self, offset: int, view: memoryview) -> None:
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
