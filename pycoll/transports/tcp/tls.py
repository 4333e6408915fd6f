"""The tcp channel over TLS sockets (``PYCOLL_TLS_*`` set): same frames, same lanes.

An ``ssl.SSLSocket`` has no ``sendmsg``, reports a non-blocking socket's "not now" as
``SSLWantReadError``/``SSLWantWriteError`` instead of ``BlockingIOError``, writes all or
nothing (a write that could not finish must be retried with the same bytes), and may hold
decrypted bytes that polling the descriptor does not show (``pending()``). ``TlsChannel``
differs from ``TcpChannel`` in exactly those places; the transport picks the class once, so
the plain channel's loop has no TLS branch at all.
"""
from __future__ import annotations

import ssl

from ..base import peer_lost
from .channel import Lane, TcpChannel

#: a header and a payload up to this size go out as one TLS write (one record)
JOIN_BYTES = 16 * 1024
#: payload bytes per TLS write: retried whole when the socket is full
WRITE_BYTES = 256 * 1024
_WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


class TlsLane(Lane):
    """A lane whose socket is an ``ssl.SSLSocket``."""

    __slots__ = ()

    def recv_into(self, view: memoryview) -> int:
        try:
            n = self.sock.recv_into(view)  # type: ignore[union-attr]
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            raise BlockingIOError from None
        if n == 0:
            raise ConnectionResetError("connection closed by peer")
        return n


class TlsChannel(TcpChannel):
    """``TcpChannel`` over TLS sockets: writes without ``sendmsg``, whole or retried, and
    reads that drain what TLS already decrypted."""

    lane_class = TlsLane

    def _progress_send(self, lane: Lane) -> bool:
        moved = False
        sock = lane.sock
        assert sock is not None
        while lane.out:
            req, _, view = lane.out[0]
            try:
                if lane.header is not None:
                    if view.nbytes <= JOIN_BYTES:
                        sock.send(lane.header + view)
                        n = view.nbytes
                    else:
                        sock.send(lane.header)
                        n = 0
                    lane.header = None
                else:
                    n = sock.send(view[lane.offset:lane.offset + WRITE_BYTES])
            except _WOULD_BLOCK:
                return moved
            except OSError as e:
                self.break_with(peer_lost(self.peer, f"TLS connection failed while sending: {e}"))
                return True
            moved = True
            self._wrote(lane, req, view, n)
        return moved

    def _progress_recv(self) -> bool:
        moved = super()._progress_recv()
        # bytes TLS decrypted already wake no poll: read them while a receive waits
        while (self.broken is None and self._reading()
               and any(lane.sock is not None and lane.sock.pending()  # type: ignore[attr-defined]
                       for lane in self._lanes)):
            if not super()._progress_recv():
                break
            moved = True
        return moved
