"""The tcp transport: peers anywhere on the network, one or more sockets per pair.

Connections are lazy (Gloo's lazy mode): a channel exists from the first time an algorithm
uses that peer; the higher rank of the pair dials, on its own first use (every message has a
sender and a receiver, so both ends use the pair), and proves membership of the job with
``HMAC(token, listener nonce : rank : socket)``. Dials and handshakes are non-blocking and
progress with everything else, so connections open in parallel, never rank after rank.
Anything else that connects to the data port (a stranger, a flood of silent sockets) is
dropped at a short handshake deadline without disturbing the job, by a thread that accepts
and judges connections even while the rank is busy elsewhere. The dials, the handshake
and the acceptor are ``wireup``'s (verbs uses them too), the interface choice ``netif``'s,
the frames ``channel.py``'s. With ``PYCOLL_TLS_CERT/KEY/CA`` every socket is TLS 1.3 with
mutual authentication (``tls.py``), the HMAC proof inside it.
"""
from __future__ import annotations

import socket
from typing import Any

from ...buffers.memory import MemRef
from ...envvars import env_text, env_tls
from ..base import ActiveSet, Capabilities, OpenContext, PeerInfo, Transport
from ..netif import choose_bind_address, interface_address, socket_streams
from ..wireup import Connector, ConnectorTransport
from .channel import TcpChannel
from .tls import TlsChannel
from .window import TcpExposedWindow


class TcpTransport(ConnectorTransport, Transport):
    """TCP transport for peers anywhere on the network."""

    name = "tcp"
    capabilities = Capabilities("tcp", latency_us=25.0, bandwidth_gbps=3.0, same_host_only=False,
                                segment_bytes=1 << 20, windows=True)

    def __init__(self, ctx: OpenContext) -> None:
        self.rank = ctx.rank
        self.size = ctx.size
        self.token = ctx.token
        host, family = choose_bind_address(ctx.master_addr)
        tls = env_tls()
        channel = TcpChannel if tls is None else TlsChannel   # chosen once: no TLS branch
        self._setup = Connector(self, ctx.size, ctx.accepts, host, family,
                                lambda peer, streams: channel(self, peer, streams),
                                streams=socket_streams(), tls=tls)
        self._channels: dict[int, TcpChannel] = self._setup.channels
        self.active = ActiveSet()
        #: open windows by id (``window.py``); while any is, every channel reads and serves
        self.windows: dict[int, TcpExposedWindow] = {}
        #: the largest window exposed so far: a request up to it is well-formed even after
        #: the window closed (an origin whose target released its window alone gets a
        #: refusal, not a broken pair)
        self.window_bytes = 0
        self._windows_made = 0

    # -- registry ------------------------------------------------------------------------
    @classmethod
    def probe(cls) -> tuple[dict[str, Any] | None, str]:
        return {}, ""

    @staticmethod
    def can_connect(a: PeerInfo, b: PeerInfo) -> bool:
        return True

    @classmethod
    def details(cls) -> dict[str, Any] | None:
        interfaces = {}
        for _index, name in socket.if_nameindex():
            interfaces[name] = interface_address(name, socket.AF_INET)
        try:
            bind = choose_bind_address(env_text("PYCOLL_MASTER_ADDR"))[0]
        except Exception as e:  # noqa: BLE001 - a bad PYCOLL_SOCKET_* or no route: say so
            bind = f"none ({e})"
        return {"interfaces": interfaces, "bind_address": bind}

    # -- progress --------------------------------------------------------------------------
    def progress(self) -> bool:
        moved = self._setup.progress(self.active.channels.values())
        self.setup_pending = self._setup.pending
        if self.active.channels:
            moved = self.active.progress() or moved
        return moved

    # -- windows (served by this rank's progress: window.py) -------------------------------
    def expose_window(self, mem: MemRef, dtype: str = "", np_dtype: Any = None
                      ) -> TcpExposedWindow:
        self._windows_made += 1
        wid = self._windows_made
        win = self.windows[wid] = TcpExposedWindow(wid, mem.view, self.rank, dtype, np_dtype,
                                                   self.windows)
        win.record["dtype"] = dtype
        self.window_bytes = max(self.window_bytes, win.nbytes)
        for ch in self._channels.values():      # requests arrive unasked: read every pair
            if ch.broken is None:
                self.active.channels[ch.peer] = ch
        return win

    def wait_fds(self) -> list[tuple[int, int]] | None:
        fds = self._setup.fds()
        for ch in self.active.channels.values():
            fds += ch.fds()  # type: ignore[attr-defined]
        return fds

    def close(self) -> None:
        self._setup.close()
        self.active.channels.clear()
