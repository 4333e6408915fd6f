"""TCP transport: one or more sockets per pair, works between hosts.

* ``transport``: ``TcpTransport``: probe, lazy connections, progress, the engine's fds;
* ``channel``: ``TcpChannel``: frames, striping over the pair's sockets, farewells.

The dials and handshake are ``transports.wireup``'s, the interface choice
``transports.netif``'s (verbs uses both too).
"""
from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """``from pycoll.transports.tcp import TcpTransport``, the path of the module this package
    replaced, still works (loaded on first use: importing the package stays free)."""
    if name == "TcpTransport":
        from .transport import TcpTransport
        return TcpTransport
    if name == "TcpChannel":
        from .channel import TcpChannel
        return TcpChannel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
