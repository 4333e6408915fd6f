"""The one interface every transport implements, and the wait loop that drives them.

Shape (mirrors Gloo's Pair/UnboundBuffer and UCX's capability query):

* ``Transport``: opened once per communicator for the peers it serves. ``address()`` is a
  small JSON-able record published through the rendezvous store; ``connect()`` takes the
  peers' records and returns one ``Channel`` per peer.
* ``Channel``: ordered, tagged, non-blocking ``isend(buf, tag)`` / ``irecv(buf, tag)`` to one
  peer, returning ``Request`` objects. Messages with the same tag are matched in order; a
  receive must be posted with exactly the size that was sent (a mismatch raises
  ``MessageSizeMismatch``, never truncates silently).
* Progress is driven by the caller: ``wait_all`` calls ``Channel.progress()`` until every
  request is done, the deadline passes, or a peer is lost. There is no progress thread, so no
  lock is taken on the hot path; a communicator serialises its collectives instead.

Buffers are ``memoryview`` objects of unsigned bytes that alias the user's memory; a
transport copies as little as it can (zero copies on TCP, one on shared memory).
"""
from __future__ import annotations

import os
import select
import time
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from ..errors import MessageSizeMismatch, PeerLost, TransportError


@dataclass(frozen=True)
class Capabilities:
    """What a transport can do, as declared numbers the cost model consumes."""

    name: str
    latency_us: float          # one small message, one way
    bandwidth_gbps: float      # one direction, large messages (GB/s, 10^9 bytes)
    same_host_only: bool       # True for shm and CUDA IPC
    one_sided: bool = False    # can a peer read/write our memory without our CPU
    device_memory: bool = False
    segment_bytes: int = 1 << 20   # pipelining granularity that suits this transport


class Request:
    """One posted send or receive. ``done`` flips once; ``error`` is set on failure."""

    __slots__ = ("channel", "view", "tag", "nbytes", "done", "error", "bytes_done", "kind")

    def __init__(self, channel: "Channel", view: memoryview, tag: int, kind: str) -> None:
        self.channel = channel
        self.view = view
        self.tag = tag
        self.nbytes = view.nbytes
        self.done = False
        self.error: BaseException | None = None
        self.bytes_done = 0
        self.kind = kind  # "send" or "recv"

    def fail(self, error: BaseException) -> None:
        if not self.done:
            self.error = error
            self.done = True

    def complete(self) -> None:
        self.bytes_done = self.nbytes
        self.done = True

    def __repr__(self) -> str:
        return (f"<{self.kind} peer={self.channel.peer} tag={self.tag} "
                f"{self.bytes_done}/{self.nbytes}B {'done' if self.done else 'pending'}>")


class Channel(ABC):
    """Ordered, tagged, non-blocking byte messages to one peer."""

    #: rank of the peer (in the communicator that opened the transport)
    peer: int
    #: the transport that made this channel
    transport: "Transport"

    @abstractmethod
    def isend(self, view: memoryview, tag: int = 0) -> Request:
        """Queue ``view`` for the peer; the buffer must stay untouched until the request is done."""

    @abstractmethod
    def irecv(self, view: memoryview, tag: int = 0) -> Request:
        """Post a receive of exactly ``len(view)`` bytes for the next message with ``tag``."""

    @abstractmethod
    def progress(self) -> bool:
        """Move whatever can move without blocking; return True if anything moved."""

    def poll_fd(self) -> tuple[int, int] | None:
        """(fd, select.POLL* events) to block on while idle, or None if not pollable."""
        return None

    def check_alive(self) -> None:
        """Raise PeerLost if the peer is known to be gone (called while idle)."""

    @abstractmethod
    def close(self) -> None:
        """Release the channel; pending requests fail."""


class Transport(ABC):
    """A way of moving bytes between this rank and a set of peers."""

    capabilities: Capabilities

    @abstractmethod
    def address(self) -> dict[str, Any]:
        """A JSON-able record the peers need to connect (published through the store)."""

    @abstractmethod
    def connect(self, addresses: dict[int, dict[str, Any]], deadline: float) -> dict[int, Channel]:
        """Open one channel per peer in ``addresses`` before ``deadline`` (time.monotonic)."""

    @abstractmethod
    def close(self) -> None:
        """Close every channel and release sockets and memory segments."""


class WaitTimeout(TransportError):
    """``wait_all`` reached its deadline; ``pending`` lists the requests still open."""

    def __init__(self, pending: Sequence[Request]) -> None:
        super().__init__("deadline passed with %d request(s) pending" % len(pending))
        self.pending = list(pending)


# How long a waiter spins (calling progress) before it starts yielding the CPU, and when it
# escalates from yielding to short sleeps. Ranks may outnumber cores: spinning without
# yielding then costs whole scheduler ticks (see docs/architecture.md).
YIELD_SECONDS = 2e-3
MAX_SLEEP_SECONDS = 1e-3


class WaitPolicy:
    """How eagerly a waiter spins before yielding; process-wide, set from the rank layout.

    With a core per rank, spinning (``hot_spins`` polls without reading the clock, then up to
    ``spin_seconds``) wins: a shared-memory message arrives in about a microsecond. With more
    ranks on this host than cores, the peer we wait for may not even be running: every
    microsecond of spinning is stolen from it, so an oversubscribed waiter yields at once.
    ``PYCOLL_SPIN_US`` overrides the spin time either way.
    """

    spin_seconds = 50e-6
    hot_spins = 64
    crowded = False       # more ranks on this machine than cores: CPU time is the bottleneck
    _most_ranks = 0       # the most ranks per machine any communicator of this process saw

    @classmethod
    def configure(cls, ranks_on_host: int) -> None:
        """Called by every communicator's setup; a sub-group never relaxes the policy a
        larger communicator of the same process needed."""
        cls._most_ranks = max(cls._most_ranks, ranks_on_host)
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
        oversubscribed = cls.crowded = cls._most_ranks > cores
        cls.spin_seconds = 0.0 if oversubscribed else 50e-6
        cls.hot_spins = 1 if oversubscribed else 64
        override = os.environ.get("PYCOLL_SPIN_US")
        if override:
            cls.spin_seconds = float(override) * 1e-6
            cls.hot_spins = 64 if cls.spin_seconds > 0 else 1


LIVENESS_INTERVAL = 0.05


def wait_all(requests: Sequence[Request], deadline: float,
             check: Callable[[], None] | None = None, extra: Iterable[Channel] = ()) -> None:
    """Drive progress until every request is done.

    ``extra`` channels are progressed too (their sends feed peers we wait on) but not waited
    for. Raises the first request's error (``PeerLost``, ``MessageSizeMismatch``, ...),
    ``WaitTimeout`` at ``deadline`` (a ``time.monotonic()`` value), or whatever ``check``
    raises (the communicator uses it to notice aborts from other ranks).

    Waiting escalates: spin on progress first (a shared-memory round trip is about a
    microsecond), then yield the CPU between polls, then sleep in growing steps; when every
    channel involved is a socket it blocks in ``poll`` instead, with the GIL released.
    """
    for r in requests:          # fast path: often everything finished while being posted
        if not r.done:
            break
    else:
        _raise_errors(requests)
        return
    requests = list(requests)
    channels = {id(r.channel): r.channel for r in requests if not r.done}
    for ch in extra:
        channels.setdefault(id(ch), ch)
    chans = tuple(channels.values())
    progress = [ch.progress for ch in chans]
    spins = 0
    idle_since = 0.0
    next_liveness = 0.0
    sleep = 20e-6
    while True:
        moved = False
        for step in progress:
            if step():
                moved = True
        for r in requests:
            if not r.done:
                break
        else:
            _raise_errors(requests)
            return
        for r in requests:
            if r.error is not None:
                raise r.error
        if moved:
            spins = 0
            idle_since = 0.0
            sleep = 20e-6
            continue
        spins += 1
        if spins < WaitPolicy.hot_spins:
            continue       # hot spin: no clock reads
        now = time.monotonic()
        if idle_since == 0.0:
            idle_since = now
        idle = now - idle_since
        if idle < WaitPolicy.spin_seconds:
            continue
        if now >= deadline:
            raise WaitTimeout([r for r in requests if not r.done])
        if now >= next_liveness:
            next_liveness = now + LIVENESS_INTERVAL
            for ch in chans:
                ch.check_alive()
            if check is not None:
                check()
        fds = [ch.poll_fd() for ch in chans]
        if all(fd is not None for fd in fds):
            # Every channel is a socket: block in the kernel, GIL released.
            poller = select.poll()
            for fd, events in fds:  # type: ignore[misc]
                poller.register(fd, events)
            poller.poll(max(0.0, min(deadline - now, LIVENESS_INTERVAL)) * 1000.0)
        elif idle < YIELD_SECONDS:
            os.sched_yield()
        else:
            time.sleep(sleep)
            sleep = min(sleep * 2, MAX_SLEEP_SECONDS)


def _raise_errors(requests: Iterable[Request]) -> None:
    for r in requests:
        if r.error is not None:
            raise r.error


def take_posted(posted: "deque[Request]", tag: int) -> Request | None:
    """Remove and return the oldest posted receive with ``tag`` (usually the first)."""
    if posted and posted[0].tag == tag:
        return posted.popleft()
    for i, req in enumerate(posted):
        if req.tag == tag:
            del posted[i]
            return req
    return None


def size_mismatch(peer: int, tag: int, sent: int, posted: int) -> MessageSizeMismatch:
    return MessageSizeMismatch(
        f"peer rank {peer} sent {sent} bytes (tag {tag}) but this rank posted a receive of "
        f"{posted} bytes: the ranks disagree on the tensor size or on which collective runs",
        peer=peer)


def peer_lost(peer: int, why: str) -> PeerLost:
    return PeerLost(f"peer rank {peer} is gone: {why}", peer=peer)
