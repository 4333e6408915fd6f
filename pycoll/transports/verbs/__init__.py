"""InfiniBand/RoCE verbs transport (pyverbs): RC queue pairs per peer, eager with credits,
zero-copy rendezvous.

* ``transport``: ``VerbsTransport``: probe, shared registrations, lazy setup, progress;
* ``channel``: ``VerbsChannel``: the eager/rendezvous/put protocol and completion dispatch;
* ``queue_pairs``: ``QueuePairs``: queue pairs, rings, credits, the setup socket, teardown;
* ``wire``: message header and kinds, the address exchange, work-request ids, constants;
* ``device``: the device and port choice, queue-pair helpers, the registration cache.
"""
from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """``from pycoll.transports.verbs import VerbsTransport``, the path of the module this package
    replaced, still works (loaded on first use: importing the package stays free)."""
    if name == "VerbsTransport":
        from .transport import VerbsTransport
        return VerbsTransport
    if name == "VerbsChannel":
        from .channel import VerbsChannel
        return VerbsChannel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
