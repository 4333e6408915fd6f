"""In-process transport: ranks are threads of one process.

It exists so that algorithms, selection, lazy connections and the bootstrap can run at
hundreds or thousands of ranks in CI (``pycoll.testing.run_threads``), where a process per
rank would not fit. It is a real transport with the same shape as the others: a mailbox per
ordered pair, the shared tag matcher, eager copies for small messages and a single copy
straight from the sender's memory into the posted receive for large ones (the in-process
equivalent of shm's cross-memory attach), and an eventfd per rank that the progress engine
blocks on, so thousands of waiting threads sleep in ``epoll`` instead of spinning.

Only ranks of the same process connect (``can_connect`` compares a per-process token), and
it is never chosen unless named in ``PYCOLL_TRANSPORTS``.
"""
from __future__ import annotations

import ctypes
import os
import secrets
import select
import threading
from collections import deque
from typing import Any

from ..buffers.memory import MemRef
from ..errors import TransportError
from .base import (
    ActiveSet,
    Capabilities,
    Channel,
    OpenContext,
    PeerInfo,
    Request,
    Transport,
    peer_lost,
    size_mismatch,
)
from .matching import TagMatcher

EAGER_BYTES = 64 * 1024

#: every open in-process transport of this process, by the key it publishes
_ENDPOINTS: dict[str, InprocTransport] = {}
_ENDPOINTS_LOCK = threading.Lock()
_PROCESS: tuple[int, str] = (-1, "")


def process_token() -> str:
    """A token naming this process (a forked child gets its own)."""
    global _PROCESS
    pid = os.getpid()
    with _ENDPOINTS_LOCK:
        if _PROCESS[0] != pid:
            _PROCESS = (pid, f"{pid}-{secrets.token_hex(8)}")
        return _PROCESS[1]


class _Message:
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


class InprocChannel(Channel):
    """Messages to and from a rank in another thread of this process."""

    transport: InprocTransport

    def __init__(self, transport: InprocTransport, peer: int,
                 remote: InprocTransport | None) -> None:
        self.transport = transport
        self.peer = peer
        self._active = transport._active.channels    # join it when work arrives
        self._remote = remote
        self._match = TagMatcher(peer)
        self._sent: deque[Request] = deque()      # large sends waiting for the peer to read
        self._broken: BaseException | None = None

    # -- sending -------------------------------------------------------------------------
    def isend(self, mem: MemRef, tag: int = 0) -> Request:
        req = Request(self, mem, tag, "send")
        if self._broken is not None:
            req.fail(self._broken)
            return req
        remote = self._remote
        if remote is None or remote.closed:
            req.fail(peer_lost(self.peer, "it closed its communicator"))
            return req
        if req.nbytes <= EAGER_BYTES:
            msg = _Message(tag, req.nbytes, bytes(req.view), None)
            req.complete()
        else:
            msg = _Message(tag, req.nbytes, None, req)
            self._sent.append(req)
            self._active[self.peer] = self
        remote.deliver(self.transport.rank, msg)
        return req

    # -- receiving -----------------------------------------------------------------------
    def irecv(self, mem: MemRef, tag: int = 0) -> Request:
        req = self._recv_request(self, mem, tag, "recv")
        if self._broken is None:
            self._drain()
        held = self._match.take_held(req)   # delivered even if the peer went away since
        if held is not None:
            self._copy(req, held[1])
        elif self._broken is not None:
            req.fail(self._broken)
        else:
            self._match.posted.append(req)
            self._active[self.peer] = self
        return req

    def _copy(self, req: Request, msg: _Message) -> None:
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

    def _drain(self) -> bool:
        """Match what the peer delivered since the last look."""
        box = self.transport.mailbox(self.peer)
        if not box:
            return False
        match = self._match
        while box:
            msg = box.popleft()
            if msg.notice:
                self.transport._notices.append((self.peer, msg.tag))
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
        region = peer._registered.get(int(remote.get("addr", -1))) if peer is not None else None
        if (peer is None or remote.get("key") != peer.key or region is None or offset < 0
                or offset + src.nbytes > region.nbytes):
            req.fail(TransportError(f"inproc: put of {src.nbytes} bytes at offset {offset} "
                                    f"does not fit a region peer rank {self.peer} registered",
                                    peer=self.peer))
            return req
        if src.nbytes:
            ctypes.memmove(region.ptr + offset, src.ptr, src.nbytes)
        peer.deliver(self.transport.rank, _Message(notify, 0, None, None, notice=True))
        req.complete()
        return req

    # -- progress, liveness, teardown ------------------------------------------------------
    def progress(self) -> bool:
        moved = self._drain() if self._match.posted else False
        if self._sent:
            while self._sent and self._sent[0].done:
                self._sent.popleft()
                moved = True
        return moved

    def busy(self) -> bool:
        return bool(self._match.posted or self._sent)

    @property
    def ready(self) -> bool:
        return self._remote is not None

    def has_news(self) -> bool:
        """Whether progress would move something now (mail for a posted receive, or a
        large send the peer has read)."""
        return bool((self._match.posted and self.transport._mail.get(self.peer))
                    or (self._sent and self._sent[0].done))

    def check_alive(self) -> None:
        if self._broken is not None:
            raise self._broken
        if (self._remote is None or self._remote.closed) and self.busy():
            self._drain()
            if self.busy():
                self._break(peer_lost(self.peer, "it closed its communicator while this rank "
                                                 "still expected data"))
                raise self._broken  # type: ignore[misc]

    def _break(self, error: BaseException) -> None:
        if self._broken is None:
            self._broken = error
        self._match.fail_all(error)
        for req in self._sent:
            req.fail(error)
        self._sent.clear()

    def close(self) -> None:
        self._break(TransportError(f"channel to peer rank {self.peer} was closed", peer=self.peer))


class InprocTransport(Transport):
    """Transport between threads of one process (for tests at large rank counts)."""

    name = "inproc"
    capabilities = Capabilities("inproc", latency_us=5.0, bandwidth_gbps=5.0,
                                same_host_only=True, one_sided=True, segment_bytes=1 << 20)

    def __init__(self, ctx: OpenContext) -> None:
        self.rank = rank = ctx.rank
        self.key = f"{process_token()}/{secrets.token_hex(8)}/{rank}"
        self.closed = False
        self._lock = threading.Lock()
        self._mail: dict[int, deque[_Message]] = {}
        self._channels: dict[int, InprocChannel] = {}
        self._active = ActiveSet()
        self._registered: dict[int, MemRef] = {}
        self._notices: list[tuple[int, int]] = []
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._sleeping = False
        with _ENDPOINTS_LOCK:
            _ENDPOINTS[self.key] = self

    # -- registry ------------------------------------------------------------------------
    @classmethod
    def probe(cls) -> tuple[dict[str, Any] | None, str]:
        if not hasattr(os, "eventfd"):
            return None, "os.eventfd is missing (Linux, Python >= 3.10 needed)"
        return {"process": process_token()}, ""

    @staticmethod
    def can_connect(a: PeerInfo, b: PeerInfo) -> bool:
        return a.records["inproc"]["process"] == b.records["inproc"]["process"]

    def address(self) -> dict[str, Any]:
        return {"key": self.key}

    # -- connections -----------------------------------------------------------------------
    def connect(self, peer: int, address: dict[str, Any], deadline: float) -> Channel:
        ch = self._channels.get(peer)
        if ch is None:
            # A peer that already finished (and closed) may have left messages in our
            # mailbox: the channel still delivers them, and only then reports the peer gone.
            remote = _ENDPOINTS.get(address["key"])     # an atomic dict read: no lock
            ch = self._channels[peer] = InprocChannel(self, peer, remote)
        return ch

    # -- delivery (called from the sender's thread) -----------------------------------------
    def deliver(self, src: int, msg: _Message) -> None:
        with self._lock:
            box = self._mail.get(src)
            if box is None:
                box = self._mail[src] = deque()
            box.append(msg)
        self.signal()

    def mailbox(self, src: int) -> deque[_Message]:
        box = self._mail.get(src)
        if box is None:
            with self._lock:
                box = self._mail.setdefault(src, deque())
        return box

    def signal(self) -> None:
        """Wake this rank's engine if it sleeps (a syscall and a thread switch otherwise
        spent on every message)."""
        if self._sleeping:
            self.wake()

    def wake(self) -> None:
        try:
            os.eventfd_write(self._efd, 1)
        except OSError:
            pass    # closed meanwhile

    # -- one-sided ---------------------------------------------------------------------------
    def register(self, mem: MemRef) -> dict[str, Any]:
        self._registered[mem.ptr] = mem
        return {"key": self.key, "addr": mem.ptr, "nbytes": mem.nbytes}

    def deregister(self, record: dict[str, Any]) -> None:
        self._registered.pop(int(record["addr"]), None)

    def held_memory(self) -> dict[str, int]:
        return {"segment": 0, "registered": sum(m.nbytes for m in self._registered.values())}

    def notifications(self) -> list[tuple[int, int]]:
        for src in list(self._mail):
            ch = self._channels.get(src)
            if ch is not None:
                ch._drain()
        notices, self._notices = self._notices, []
        return notices

    # -- progress --------------------------------------------------------------------------
    def progress(self) -> bool:
        if self._sleeping:
            self._sleeping = self.setup_pending = False
            try:
                os.eventfd_read(self._efd)
            except (BlockingIOError, OSError):
                pass
        return self._active.progress() if self._active.channels else False

    def wait_fds(self) -> list[tuple[int, int]] | None:
        # Called right before the engine blocks. Senders signal only a sleeping rank, so
        # say we sleep first, then look once more: mail that arrived in between wakes us.
        self._sleeping = self.setup_pending = True   # the next pass resets the eventfd
        for ch in self._active.channels.values():
            if ch.has_news():   # type: ignore[attr-defined]
                self.wake()
                break
        return [(self._efd, select.EPOLLIN)]

    def close(self) -> None:
        self.closed = True
        with _ENDPOINTS_LOCK:
            _ENDPOINTS.pop(self.key, None)
        for ch in self._channels.values():
            ch.close()
            if ch._remote is not None:
                ch._remote.wake()     # a peer waiting on us notices at once
        self._channels.clear()
        self._active.channels.clear()
        try:
            os.close(self._efd)
        except OSError:
            pass
