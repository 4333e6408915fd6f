"""The tcp channel: messages to one peer over one or more TCP connections.

Frames are a 16-byte header (tag, payload length) followed by the payload. Sends go out with
``sendmsg([header, payload])`` straight from the user's memory; a receive reads the header
and then ``recv_into`` the posted buffer, so large messages are never copied in user space.
With ``PYCOLL_SOCKET_NSOCKS`` > 1 a pair has that many connections and a large message's
stripes travel on all of them at once (``TcpChannel``). All sockets are non-blocking and
progress is driven by the engine, which reads and writes in the same loop: both peers can
send large messages to each other at once without deadlock.

The sockets come from the transport's lazy dials and handshake (``transport.py``,
``wireup``), one ``attach`` per socket.
"""
from __future__ import annotations

import select
import socket
import struct
from collections import deque
from typing import Any, Protocol

from ...buffers.memory import MemRef
from ...errors import TransportError
from ...tags import WINDOW_TAG
from ..base import ActiveSet, Channel, Request, peer_left_over, peer_lost, stripes
from ..matching import TagMatcher
from ..windows import RemoteWindow
from .window import HEAD as WINDOW_HEAD
from .window import TcpRemoteWindow, serve_request

HEADER = struct.Struct("<qq")            # tag, payload bytes
#: the last frame of a channel whose rank leaves because it lost another rank: this tag (no
#: message tag is this low) and, as the length, -(2 + that rank)
FAREWELL_TAG = -(1 << 63)


class TcpOwner(Protocol):
    """What a channel uses of its transport (``TcpTransport``)."""

    name: str
    farewell: int | None
    size: int
    active: ActiveSet
    #: this rank's open windows by id: while there are any, every channel reads whatever
    #: arrives (origins' requests come unasked) and serves them (``window.py``)
    windows: dict[int, Any]
    #: the largest window exposed so far: the longest well-formed request frame's data
    window_bytes: int


class Lane:
    """One socket of a channel: the pieces it still has to write (in message order, each
    with its header on lane 0) and the piece it is reading."""

    __slots__ = ("sock", "fd", "out", "header", "offset", "piece", "got")

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.fd = -1
        self.out: deque[tuple[Request, bytes | None, memoryview]] = deque()
        self.header: bytes | None = None    # unwritten header bytes of the head piece
        self.offset = 0                     # payload bytes of the head piece written
        self.piece: memoryview | None = None  # where the bytes being read go
        self.got = 0

    def queue(self, req: Request, header: bytes | None, view: memoryview) -> None:
        self.out.append((req, header, view))
        if len(self.out) == 1:
            self.header, self.offset = header, 0

    def recv_into(self, view: memoryview) -> int:
        n = self.sock.recv_into(view)  # type: ignore[union-attr]
        if n == 0:
            raise ConnectionResetError("connection closed by peer")
        return n


class TcpChannel(Channel):
    """Messages to and from one peer over one or more TCP connections (``streams``).

    Every message starts on lane 0 with its header; a message of at least two stripes
    (``base.stripes``) sends its other stripes, bare, on lanes 1.. at the same time. Both
    ends know the plan from the size alone. The receiver reads one message at a time (the
    next header only once every stripe of the current one is in), so messages still match
    in the order they were sent.
    """

    transport: TcpOwner  # type: ignore[assignment]
    #: the lanes' class (``tls.TlsLane`` for TLS sockets)
    lane_class: type[Lane] = Lane

    def __init__(self, transport: TcpOwner, peer: int, streams: int = 1) -> None:
        self.transport = transport
        self.peer = peer
        self.streams = streams
        self._active = transport.active.channels    # join it when work arrives
        self._lanes = [self.lane_class() for _ in range(streams)]
        self._attached = 0
        self._sends: deque[Request] = deque()    # in flight, oldest first
        self.matcher = TagMatcher(peer)
        self._header = bytearray(HEADER.size)
        self._header_got = 0
        self._current: tuple[Any, int, memoryview] | None = None  # (request|bytearray, tag, view)
        self._left = 0                           # bytes of the current message still to read
        self.broken: BaseException | None = None

    def attach(self, sock: socket.socket, stream: int = 0) -> None:
        """A socket of the pair is up: start moving what was queued for it meanwhile."""
        sock.setblocking(False)
        lane = self._lanes[stream]
        if lane.sock is None:
            self._attached += 1
        lane.sock, lane.fd = sock, sock.fileno()
        self._active[self.peer] = self

    @property
    def ready(self) -> bool:
        return self._attached == self.streams

    def peer_joined(self) -> bool:
        """Whether a socket of the pair is up (False: the peer, which dials this rank, has
        not yet: it runs other code, or it died before it did)."""
        return self._attached > 0

    # -- sending -------------------------------------------------------------------------
    def isend(self, mem: MemRef, tag: int = 0) -> Request:
        req = Request(self, mem, tag, "send")
        if self.broken is not None:
            req.fail(self.broken)
            return req
        self._sends.append(req)
        self._active[self.peer] = self
        lanes = self._lanes
        header = HEADER.pack(tag, req.nbytes)
        if self.streams == 1:
            lanes[0].queue(req, header, req.view)
        else:
            for i, off, length in stripes(req.nbytes, self.streams):
                lanes[i].queue(req, header if i == 0 else None, req.view[off:off + length])
        if lanes[0].sock is not None and len(lanes[0].out) == 1:
            self._progress_send(lanes[0])
        return req

    def _progress_send(self, lane: Lane) -> bool:
        moved = False
        sock = lane.sock
        while lane.out:
            req, _, view = lane.out[0]
            try:
                if lane.header is not None:
                    hdr = lane.header
                    n = sock.sendmsg([hdr, view] if view.nbytes else [hdr])  # type: ignore[union-attr]
                    if n < len(hdr):
                        lane.header = hdr[n:]
                        return True
                    lane.header = None
                    n -= len(hdr)
                else:
                    n = sock.send(view[lane.offset:])  # type: ignore[union-attr]
            except (BlockingIOError, InterruptedError):
                return moved
            except OSError as e:
                self.break_with(peer_lost(self.peer, f"connection failed while sending: {e}"))
                return True
            moved = True
            if not self._wrote(lane, req, view, n):
                return moved
        return moved

    def _wrote(self, lane: Lane, req: Request, view: memoryview, n: int) -> bool:
        """Count ``n`` more bytes of the head piece ``view`` of ``lane`` (of ``req``) as
        written; once all are, go on with the next piece, complete ``req`` once every stripe
        of it is, and return True."""
        lane.offset += n
        req.bytes_done += n
        if lane.offset < view.nbytes:
            return False
        lane.out.popleft()
        if lane.out:
            lane.header, lane.offset = lane.out[0][1], 0
        if req.bytes_done == req.nbytes and not req.done:
            req.complete()
            self._sends.remove(req)
        return True

    # -- receiving -----------------------------------------------------------------------
    def irecv(self, mem: MemRef, tag: int = 0) -> Request:
        req = self.recv_request(self, mem, tag, "recv")
        if self._post_receive(req) and self._lanes[0].sock is not None:
            self._progress_recv()
        return req

    def _read_header(self) -> bool:
        """Read the next message's header and choose where its bytes go (a posted receive,
        or a buffer set aside); False if the header is not complete yet or the frame broke
        the channel."""
        lane = self._lanes[0]
        n = lane.recv_into(memoryview(self._header)[self._header_got:])
        self._header_got += n
        if self._header_got < HEADER.size:
            return False
        self._header_got = 0
        tag, nbytes = HEADER.unpack(self._header)
        if nbytes < 0 and tag == FAREWELL_TAG and 0 <= -nbytes - 2 < self.transport.size:
            self.break_with(peer_left_over(self.peer, -nbytes - 2))
            return False
        if nbytes < 0 or tag == WINDOW_TAG and not (
                WINDOW_HEAD.size <= nbytes <= WINDOW_HEAD.size + self.transport.window_bytes):
            self.break_with(TransportError(f"peer rank {self.peer} sent a malformed "
                                           f"frame (tag {tag}, length {nbytes})",
                                           peer=self.peer))
            return False
        req = self.matcher.take(tag) if tag != WINDOW_TAG else None
        if req is None:   # for another tag: set it aside
            body = bytearray(nbytes)
            self._current = (body, tag, memoryview(body))
        else:
            if not self._size_ok(req, nbytes):
                return False
            self._current = (req, tag, req.view)
        view = self._current[2]
        self._left = nbytes
        for i, off, length in stripes(nbytes, self.streams):
            self._lanes[i].piece, self._lanes[i].got = view[off:off + length], 0
        return True

    def _read_piece(self, lane: Lane) -> bool:
        """Read what has arrived of ``lane``'s piece; True if any bytes moved."""
        piece = lane.piece
        assert piece is not None
        target = self._current[0]  # type: ignore[index]
        start = lane.got
        try:
            while lane.got < piece.nbytes:
                lane.got += lane.recv_into(piece[lane.got:])
        except (BlockingIOError, InterruptedError):
            pass
        n = lane.got - start
        self._left -= n
        if isinstance(target, Request):
            target.bytes_done += n
        if lane.got < piece.nbytes:
            return n > 0
        lane.piece = None
        return True

    def _progress_recv(self) -> bool:
        moved = False
        match = self.matcher
        lanes = self._lanes
        try:
            while match.posted or self._current is not None or self.transport.windows:
                if self._current is None:
                    complete = self._read_header()   # raises BlockingIOError if nothing came
                    moved = True
                    if not complete:
                        return moved
                for lane in lanes:
                    if lane.piece is not None and lane.sock is not None:
                        moved = self._read_piece(lane) or moved
                if self._left:
                    return moved
                self._finish_message()
        except (BlockingIOError, InterruptedError):
            return moved
        except OSError as e:
            self.break_with(peer_lost(self.peer, f"connection failed while receiving: {e}"))
            return True
        return moved

    def _finish_message(self) -> None:
        target, tag, _ = self._current  # type: ignore[misc]
        self._current = None
        for lane in self._lanes:
            lane.piece = None
        if isinstance(target, Request):
            target.complete()
            return
        if tag >= WINDOW_TAG:
            if tag == WINDOW_TAG:  # an origin's window request: serve it now
                serve_request(self.transport.windows, target, self)
            # else a reply whose operation ended (timed out) before it came, its receive
            # withdrawn (an origin posts it before sending the request): dropped
            return
        # A receive for this tag may have been posted while the message was being set
        # aside: it takes the message now, in order.
        late = self.matcher.take(tag)
        if late is None:
            self.matcher.hold(tag, len(target), bytes(target))
        elif self._size_ok(late, len(target)):
            late.view[:] = target
            late.complete()

    # -- progress, liveness, teardown ------------------------------------------------------
    def progress(self) -> bool:
        if not self._attached:
            return False
        moved = False
        if self._sends:
            for lane in self._lanes:
                if lane.out and lane.sock is not None:
                    moved = self._progress_send(lane) or moved
        if self._reading() and self._lanes[0].sock is not None:
            moved = self._progress_recv() or moved
        return moved

    def _reading(self) -> bool:
        """Whether to read what arrives: a receive is posted, a message is half read, or
        this rank has windows open (origins' requests arrive unasked)."""
        return bool(self.matcher.posted or self._current is not None or self.transport.windows)

    def busy(self) -> bool:
        # a pair with windows open stays in the active set: its requests must be read
        return bool(self._sends or self.matcher.posted or self._current is not None
                    or self.transport.windows and self._attached and self.broken is None)

    def attach_window(self, record: dict[str, Any], progress: Any = None) -> RemoteWindow:
        """The peer's window: requests on this channel that its progress serves
        (``window.py``)."""
        return TcpRemoteWindow(self, record, progress, str(record.get("dtype", "")))

    def fds(self) -> list[tuple[int, int]]:
        """(descriptor, epoll events) of each connected socket, for the engine's waits."""
        reading = self._reading()
        fds = []
        for i, lane in enumerate(self._lanes):
            if lane.sock is None:
                continue
            events = select.EPOLLERR
            if lane.piece is not None or (i == 0 and reading):
                events |= select.EPOLLIN
            if lane.out:
                events |= select.EPOLLOUT
            fds.append((lane.fd, events))
        return fds

    def check_alive(self) -> None:
        if self.broken is not None:
            raise self.broken

    def break_with(self, error: BaseException) -> None:
        if self.broken is None:
            self.broken = error
        for req in list(self._sends):
            req.fail(error)
        self.matcher.fail_all(error)
        if self._current is not None and isinstance(self._current[0], Request):
            self._current[0].fail(error)
        self._sends.clear()
        for lane in self._lanes:
            lane.out.clear()
            lane.header, lane.piece = None, None
        self._current = None

    def close(self) -> None:
        # at a frame boundary (no message half written), a rank leaving over a lost peer
        # says so in a last frame: the peer then blames the rank that died, not this one
        first = self._lanes[0]
        boundary = not first.out or first.header is not None and len(first.header) == HEADER.size
        self.break_with(TransportError(f"channel to peer rank {self.peer} was closed",
                                       peer=self.peer))
        lost = self.transport.farewell
        if first.sock is not None and lost is not None and boundary:
            try:
                first.sock.send(HEADER.pack(FAREWELL_TAG, -2 - lost))
            except OSError:
                pass
        for lane in self._lanes:
            if lane.sock is not None:
                try:
                    lane.sock.close()
                except OSError:
                    pass
