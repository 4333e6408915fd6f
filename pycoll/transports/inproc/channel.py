"""The in-process channel: messages to a rank in another thread of this process.

A mailbox per ordered pair (the receiving transport's), the shared tag matcher, eager copies
for small messages and a single copy straight from the sender's memory into the posted
receive for large ones (the in-process equivalent of shm's cross-memory attach).
"""
from __future__ import annotations

import ctypes
from collections import deque
from typing import Any, Protocol

from ...buffers.memory import MemRef
from ...errors import TransportError
from ..base import ActiveSet, Channel, Request, peer_lost, size_mismatch
from ..matching import TagMatcher
from ..windows import RemoteWindow
from .window import attach as attach_window

EAGER_BYTES = 64 * 1024


class Message:
    """A message in flight: eager bytes, the sender's request (read in place), or the
    notice of a one-sided put (``notice``: the tag is the notify value)."""

    __slots__ = ("tag", "nbytes", "body", "send", "notice")

    def __init__(self, tag: int, nbytes: int, body: bytes | None, send: Request | None,
                 notice: bool = False) -> None:
        self.tag = tag
        self.nbytes = nbytes
        self.body = body
        self.send = send
        self.notice = notice


class InprocOwner(Protocol):
    """What a channel uses of its transport and of the peer's (``InprocTransport``)."""

    name: str
    rank: int
    key: str
    closed: bool
    active: ActiveSet
    notices: list[tuple[int, int]]

    def deliver(self, src: int, msg: Message) -> None: ...

    def signal(self) -> None: ...

    def wake(self) -> None: ...

    def has_mail(self, src: int) -> bool: ...

    def mailbox(self, src: int) -> deque[Message]: ...

    def region(self, addr: int) -> MemRef | None: ...


class InprocChannel(Channel):
    """Messages to and from a rank in another thread of this process."""

    transport: InprocOwner  # type: ignore[assignment]

    def __init__(self, transport: InprocOwner, peer: int,
                 remote: InprocOwner | None) -> None:
        self.transport = transport
        self.peer = peer
        self.active = transport.active.channels    # join it when work arrives
        self._remote = remote
        self.matcher = TagMatcher(peer)
        self._sent: deque[Request] = deque()      # large sends waiting for the peer to read
        self.broken: BaseException | None = None

    # -- sending -------------------------------------------------------------------------
    def isend(self, mem: MemRef, tag: int = 0) -> Request:
        req = Request(self, mem, tag, "send")
        if self.broken is not None:
            req.fail(self.broken)
            return req
        remote = self._remote
        if remote is None or remote.closed:
            req.fail(peer_lost(self.peer, "it closed its communicator"))
            return req
        if req.nbytes <= EAGER_BYTES:
            msg = Message(tag, req.nbytes, bytes(req.view), None)
            req.complete()
        else:
            msg = Message(tag, req.nbytes, None, req)
            self._sent.append(req)
            self.active[self.peer] = self
        remote.deliver(self.transport.rank, msg)
        return req

    # -- receiving -----------------------------------------------------------------------
    def irecv(self, mem: MemRef, tag: int = 0) -> Request:
        req = self.recv_request(self, mem, tag, "recv")
        if self.broken is None:
            self.drain()
        held = self.matcher.take_held(req)   # delivered even if the peer went away since
        if held is not None:
            self._copy(req, held[1])
        elif self.broken is not None:
            req.fail(self.broken)
        else:
            self.matcher.posted.append(req)
            self.active[self.peer] = self
        return req

    def _copy(self, req: Request, msg: Message) -> None:
        if not self._size_ok(req, msg.nbytes):
            if msg.send is not None:
                msg.send.fail(size_mismatch(self.transport.rank, msg.tag, msg.nbytes, req.nbytes))
                self._signal_peer()
            return
        if msg.body is not None:
            req.view[:] = msg.body
        else:
            send = msg.send
            assert send is not None
            if send.error is not None:     # the sender gave up: its buffer is the user's again
                req.fail(send.error)
                return
            req.view[:] = send.view
            send.complete()
            self._signal_peer()
        req.complete()

    def _signal_peer(self) -> None:
        if self._remote is not None:
            self._remote.signal()

    def drain(self) -> bool:
        """Match what the peer delivered since the last look (also the transport's
        ``notifications``, which looks for one-sided notices)."""
        box = self.transport.mailbox(self.peer)
        if not box:
            return False
        match = self.matcher
        while box:
            msg = box.popleft()
            if msg.notice:
                self.transport.notices.append((self.peer, msg.tag))
                continue
            req = match.take(msg.tag)
            if req is None:
                match.hold(msg.tag, msg.nbytes, msg)
            else:
                self._copy(req, msg)
        return True

    def put(self, src: MemRef, remote: dict[str, Any], offset: int, notify: int) -> Request:
        """A copy straight into the peer's registered memory (same process), then a notice
        through the mailbox, behind every message sent before it."""
        req = Request(self, src, notify, "put")
        peer = self._remote
        region = peer.region(int(remote.get("addr", -1))) if peer is not None else None
        if (peer is None or remote.get("key") != peer.key or region is None or offset < 0
                or offset + src.nbytes > region.nbytes):
            req.fail(TransportError(f"inproc: put of {src.nbytes} bytes at offset {offset} "
                                    f"does not fit a region peer rank {self.peer} registered",
                                    peer=self.peer))
            return req
        if src.nbytes:
            ctypes.memmove(region.ptr + offset, src.ptr, src.nbytes)
        peer.deliver(self.transport.rank, Message(notify, 0, None, None, notice=True))
        req.complete()
        return req

    def attach_window(self, record: dict[str, Any], progress: Any = None) -> RemoteWindow:
        """The peer's window: copies straight into its memory (``window.py``)."""
        return attach_window(self.peer, self._remote, record)

    # -- progress, liveness, teardown ------------------------------------------------------
    def progress(self) -> bool:
        moved = self.drain() if self.matcher.posted else False
        if self._sent:
            while self._sent and self._sent[0].done:
                self._sent.popleft()
                moved = True
        return moved

    def busy(self) -> bool:
        return bool(self.matcher.posted or self._sent)

    @property
    def ready(self) -> bool:
        return self._remote is not None

    def has_news(self) -> bool:
        """Whether progress would move something now (mail for a posted receive, or a
        large send the peer has read)."""
        return bool((self.matcher.posted and self.transport.has_mail(self.peer))
                    or (self._sent and self._sent[0].done))

    def check_alive(self) -> None:
        if self.broken is not None:
            raise self.broken
        if (self._remote is None or self._remote.closed) and self.busy():
            self.drain()
            if self.busy():
                self.break_with(peer_lost(self.peer, "it closed its communicator while this rank "
                                                 "still expected data"))
                raise self.broken  # type: ignore[misc]

    def break_with(self, error: BaseException) -> None:
        if self.broken is None:
            self.broken = error
        self.matcher.fail_all(error)
        for req in self._sent:
            req.fail(error)
        self._sent.clear()

    def close(self) -> None:
        self.break_with(TransportError(f"channel to peer rank {self.peer} was closed",
                                       peer=self.peer))
        if self._remote is not None:
            self._remote.wake()     # a peer waiting on us notices at once
