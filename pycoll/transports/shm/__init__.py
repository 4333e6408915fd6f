"""Shared-memory transport (same host): an inbox segment per ordered pair, eager slots,
cross-memory attach for large messages.

* ``transport``: ``ShmTransport``: probe, lazy inboxes, unlinking, progress;
* ``channel``: ``ShmChannel``: the slot protocols (eager, rendezvous, fragments, puts);
* ``segment``: the inbox layout, settings, and the files in /dev/shm;
* ``cma``: cross-memory attach and whether a peer process has exited.
"""
from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """``from pycoll.transports.shm import ShmTransport``, the path of the module this package
    replaced, still works (loaded on first use: importing the package stays free)."""
    if name == "ShmTransport":
        from .transport import ShmTransport
        return ShmTransport
    if name == "ShmChannel":
        from .channel import ShmChannel
        return ShmChannel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
