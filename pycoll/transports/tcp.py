"""TCP transport: one connection per peer pair, works between hosts.

Frames are a 16-byte header (tag, payload length) followed by the payload. Sends go out with
``sendmsg([header, payload])`` straight from the user's memory; a receive reads the header and
then ``recv_into`` the posted buffer, so large messages are never copied in user space. All
sockets are non-blocking and progress is driven by the engine, which reads and writes in the
same loop: both peers can send large messages to each other at once without deadlock.

Connections are lazy (Gloo's lazy mode): a channel exists from the first time an algorithm
uses that peer; the higher rank of the pair dials, on its own first use (every message has a
sender and a receiver, so both ends use the pair), and proves membership of the job with
``HMAC(token, listener nonce : rank)``. Dials and handshakes are non-blocking and progress
with everything else, so connections open in parallel, never rank after rank. Anything else
that connects to the data port (a stranger, a flood of silent sockets) is dropped at a short
handshake deadline without disturbing the job.
"""
from __future__ import annotations

import select
import socket
import struct
from collections import deque
from typing import Any

from ..errors import TransportError
from ..memory import MemRef
from .base import (ActiveSet, Capabilities, Channel, OpenContext, PeerInfo, Request, Transport,
                   peer_left_over, peer_lost)
from .matching import TagMatcher
from .tcp_setup import Connector, choose_bind_address

HEADER = struct.Struct("<qq")            # tag, payload bytes
#: the last frame of a channel whose rank leaves because it lost another rank: this tag (no
#: message tag is this low) and, as the length, -(2 + that rank)
FAREWELL_TAG = -(1 << 63)
class TcpChannel(Channel):
    """Messages to and from one peer over one TCP connection (attached once connected)."""

    transport: "TcpTransport"

    def __init__(self, transport: "TcpTransport", peer: int) -> None:
        self.transport = transport
        self.peer = peer
        self._active = transport._active.channels    # join it when work arrives
        self._sock: socket.socket | None = None
        self._fd = -1
        self._sends: deque[Request] = deque()
        self._send_header: bytes | None = None   # header of the head send, until written
        self._send_offset = 0
        self._match = TagMatcher(peer)
        self._header = bytearray(HEADER.size)
        self._header_got = 0
        self._current: tuple[Any, int, memoryview] | None = None  # (request|bytearray, tag, view)
        self._current_got = 0
        self._broken: BaseException | None = None

    def attach(self, sock: socket.socket) -> None:
        """The connection is up: start moving what was queued meanwhile."""
        sock.setblocking(False)
        self._sock = sock
        self._fd = sock.fileno()
        if self._sends:
            self._send_header = HEADER.pack(self._sends[0].tag, self._sends[0].nbytes)
            self._send_offset = 0
        self._active[self.peer] = self

    @property
    def connected(self) -> bool:
        return self._sock is not None

    # -- sending -------------------------------------------------------------------------
    def isend(self, mem: MemRef, tag: int = 0) -> Request:
        req = Request(self, mem, tag, "send")
        if self._broken is not None:
            req.fail(self._broken)
            return req
        self._sends.append(req)
        self._active[self.peer] = self
        if len(self._sends) == 1 and self._sock is not None:
            self._send_header = HEADER.pack(tag, req.nbytes)
            self._send_offset = 0
            self._progress_send()
        return req

    def _progress_send(self) -> bool:
        moved = False
        sock = self._sock
        while self._sends:
            req = self._sends[0]
            try:
                if self._send_header is not None:
                    hdr = self._send_header
                    n = sock.sendmsg([hdr, req.view] if req.nbytes else [hdr])  # type: ignore[union-attr]
                    if n < len(hdr):
                        self._send_header = hdr[n:]
                        return True
                    self._send_header = None
                    self._send_offset = n - len(hdr)
                else:
                    n = sock.send(req.view[self._send_offset:])  # type: ignore[union-attr]
                    self._send_offset += n
            except (BlockingIOError, InterruptedError):
                return moved
            except OSError as e:
                self._break(peer_lost(self.peer, f"connection failed while sending: {e}"))
                return True
            moved = True
            req.bytes_done = self._send_offset
            if self._send_offset < req.nbytes:
                return moved
            self._sends.popleft()
            req.complete()
            if self._sends:
                self._send_header = HEADER.pack(self._sends[0].tag, self._sends[0].nbytes)
                self._send_offset = 0
        return moved

    # -- receiving -----------------------------------------------------------------------
    def irecv(self, mem: MemRef, tag: int = 0) -> Request:
        req = Request(self, mem, tag, "recv")
        if self._post_receive(req) and self._sock is not None:
            self._progress_recv()
        return req

    def _recv_into(self, view: memoryview) -> int:
        n = self._sock.recv_into(view)  # type: ignore[union-attr]
        if n == 0:
            raise ConnectionResetError("connection closed by peer")
        return n

    def _progress_recv(self) -> bool:
        moved = False
        match = self._match
        try:
            while match.posted or self._current is not None:
                if self._current is None:
                    n = self._recv_into(memoryview(self._header)[self._header_got:])
                    moved = True
                    self._header_got += n
                    if self._header_got < HEADER.size:
                        return moved
                    self._header_got = 0
                    tag, nbytes = HEADER.unpack(self._header)
                    if nbytes < 0 and tag == FAREWELL_TAG and \
                            0 <= -nbytes - 2 < self.transport._size:
                        self._break(peer_left_over(self.peer, -nbytes - 2))
                        return True
                    if nbytes < 0:
                        self._break(TransportError(f"peer rank {self.peer} sent a malformed "
                                                   f"frame (length {nbytes})", peer=self.peer))
                        return True
                    req = match.take(tag)
                    if req is None:   # for another tag: set it aside
                        body = bytearray(nbytes)
                        self._current = (body, tag, memoryview(body))
                    else:
                        if not self._size_ok(req, nbytes):
                            return True
                        self._current = (req, tag, req.view)
                    self._current_got = 0
                target, tag, view = self._current
                if self._current_got < view.nbytes:
                    n = self._recv_into(view[self._current_got:])
                    moved = True
                    self._current_got += n
                    if isinstance(target, Request):
                        target.bytes_done = self._current_got
                    if self._current_got < view.nbytes:
                        return moved
                self._current = None
                if isinstance(target, Request):
                    target.complete()
                else:
                    # A receive for this tag may have been posted while the message was
                    # being set aside: it takes the message now, in order.
                    late = match.take(tag)
                    if late is None:
                        match.hold(tag, len(target), bytes(target))
                    elif self._size_ok(late, len(target)):
                        late.view[:] = target
                        late.complete()
        except (BlockingIOError, InterruptedError):
            return moved
        except OSError as e:
            self._break(peer_lost(self.peer, f"connection failed while receiving: {e}"))
            return True
        return moved

    # -- progress, liveness, teardown ------------------------------------------------------
    def progress(self) -> bool:
        if self._sock is None:
            return False
        moved = False
        if self._sends:
            moved = self._progress_send()
        if self._match.posted or self._current is not None:
            moved = self._progress_recv() or moved
        return moved

    def busy(self) -> bool:
        return bool(self._sends or self._match.posted or self._current is not None)

    def events(self) -> int:
        events = select.EPOLLIN if (self._match.posted or self._current is not None) else 0
        if self._sends:
            events |= select.EPOLLOUT
        return events | select.EPOLLERR

    def check_alive(self) -> None:
        if self._broken is not None:
            raise self._broken

    def _break(self, error: BaseException) -> None:
        if self._broken is None:
            self._broken = error
        for req in list(self._sends):
            req.fail(error)
        self._match.fail_all(error)
        if self._current is not None and isinstance(self._current[0], Request):
            self._current[0].fail(error)
        self._sends.clear()
        self._current = None

    def close(self) -> None:
        # at a frame boundary (no message half written), a rank leaving over a lost peer
        # says so in a last frame: the peer then blames the rank that died, not this one
        boundary = not self._sends or self._send_header is not None and len(
            self._send_header) == HEADER.size
        self._break(TransportError(f"channel to peer rank {self.peer} was closed", peer=self.peer))
        if self._sock is not None:
            lost = self.transport.farewell
            if lost is not None and boundary:
                try:
                    self._sock.send(HEADER.pack(FAREWELL_TAG, -2 - lost))
                except OSError:
                    pass
            try:
                self._sock.close()
            except OSError:
                pass


class TcpTransport(Transport):
    """TCP transport for peers anywhere on the network."""

    name = "tcp"
    capabilities = Capabilities("tcp", latency_us=25.0, bandwidth_gbps=3.0, same_host_only=False,
                                segment_bytes=1 << 20)

    def __init__(self, ctx: OpenContext) -> None:
        self.rank = ctx.rank
        self._size = ctx.size
        self._token = ctx.token
        host, family = choose_bind_address(ctx.master_addr)
        self._setup = Connector(self, ctx.size, ctx.accepts, host, family,
                                lambda peer: TcpChannel(self, peer))
        self._channels: dict[int, TcpChannel] = self._setup.channels
        self._active = ActiveSet()

    # -- registry ------------------------------------------------------------------------
    @classmethod
    def probe(cls) -> tuple[dict[str, Any] | None, str]:
        return {}, ""

    @staticmethod
    def can_connect(a: PeerInfo, b: PeerInfo) -> bool:
        return True

    def address(self) -> dict[str, Any]:
        return self._setup.address()

    # -- connections -----------------------------------------------------------------------
    def connect(self, peer: int, address: dict[str, Any], deadline: float) -> Channel:
        ch = self._setup.connect(peer, address, deadline)
        self.setup_pending = self._setup.pending
        return ch

    def connections(self) -> int:
        """Open data connections (for tests and diagnostics)."""
        return self._setup.connections()

    # -- progress --------------------------------------------------------------------------
    def progress(self) -> bool:
        moved = self._setup.progress(self._active.channels.values())
        self.setup_pending = self._setup.pending
        if self._active.channels:
            moved = self._active.progress() or moved
        return moved

    def wait_fds(self) -> list[tuple[int, int]] | None:
        fds = self._setup.fds()
        fds += [(ch._fd, ch.events()) for ch in self._active.channels.values()  # type: ignore[attr-defined]
                if ch._sock is not None]  # type: ignore[attr-defined]
        return fds

    def close(self) -> None:
        self._setup.close()
        self._active.channels.clear()
