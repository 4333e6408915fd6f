"""The one interface every transport implements.

Shape (Gloo's Device/Pair/UnboundBuffer, UCX's md/iface/ep, NCCL's ``ncclTransport``):

* ``Transport`` (one per rank and communicator tree): ``probe()`` says whether it is usable
  here and what it publishes in the bootstrap record; ``can_connect(a, b)`` is a symmetric
  rule on two ranks' published records, so every rank computes the same transport for every
  pair (and therefore the same algorithms); ``address()`` is what a peer needs to connect
  (fetched by that peer on first use); ``connect(peer, address, deadline)`` returns a channel
  at once, which finishes connecting in the background of ``progress()`` (lazy and parallel:
  no rank waits for another to connect first); ``progress()`` moves every channel that has
  work; ``wait_fds()`` gives the file descriptors the progress engine may block on (None when
  the transport can only be polled: shared memory); ``doorbell()`` what a transport without
  descriptors offers instead (shm: a futex word its peers ring).
* ``Channel``: ordered, tagged, non-blocking ``isend(mem, tag)`` / ``irecv(mem, tag)`` of a
  ``MemRef`` to one peer, returning ``Request`` objects. Messages with the same tag match in
  order (``matching.TagMatcher``); a receive must be posted with exactly the size that was
  sent (``MessageSizeMismatch`` otherwise, never a silent truncation). Transports that
  declare ``one_sided`` also offer ``put``.
* ``Capabilities``: declared numbers for the cost model, the memory types moved, and what
  the rest of pycoll may do around the transport (the one-host fast path, threads as
  ranks). pycoll decides from these, never from a transport's name.

Progress is driven by ``progress.ProgressEngine``: whoever waits progresses every transport,
so a send queued on any channel moves while any wait runs.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..buffers.memory import HOST, MemoryType, MemRef
from ..errors import MessageSizeMismatch, PeerLost, TransportError
from .matching import AnySource, Request, TagMatcher

if TYPE_CHECKING:
    from .windows import ExposedWindow, RemoteWindow

#: ``Channel.attach_window``'s ``progress(post, deadline)``: ``post()`` posts requests and
#: returns (all of them, those to wait for); progress until those are done or ``deadline``
#: (``time.monotonic``) passes; then withdraw whatever of the others is still pending
WindowProgress = Callable[[Callable[[], tuple[list[Request], list[Request]]], float], None]


@dataclass(frozen=True)
class Capabilities:
    """What a transport can do: declared numbers the cost model consumes, and the facts the
    rest of pycoll decides from (so no module outside the transport names it)."""

    name: str
    latency_us: float          # one small message, one way
    bandwidth_gbps: float      # one direction, large messages (GB/s, 10^9 bytes)
    same_host_only: bool       # True for shm and CUDA IPC
    one_sided: bool = False    # can write into a peer's registered memory (``put``)
    memory_types: frozenset = frozenset({HOST})
    segment_bytes: int = 1 << 20   # pipelining granularity that suits this transport
    #: ranks that talk only over this transport may use the compiled one-host path
    #: (``fastpath/``: its own /dev/shm segment and cross-memory attach, the same means as
    #: shm's), so the communicator builds it for them
    fast_path: bool = False
    #: connects only threads of one process: never chosen unless ``PYCOLL_TRANSPORTS``
    #: names it (``registry.allowed_transports``), and what ``testing.run_threads`` uses
    in_process: bool = False
    #: offers one-sided windows (``Transport.expose_window``, ``Channel.attach_window``;
    #: ``windows.py``), so ``Communicator.window`` may use it between a pair
    windows: bool = False
    #: allocates window memory that its peers map (``Transport.allocate_window``): the
    #: memory of ``Communicator.allocate_window`` where a pair uses this transport
    window_memory: bool = False

    def moves(self, mem_type: MemoryType) -> bool:
        return mem_type in self.memory_types


class Doorbell(Protocol):
    """What a waiter sleeps on when a transport's work cannot be waited for with ``epoll``
    (``Transport.doorbell``): announce, re-check the condition, sleep, withdraw. A peer that
    gives this rank work after the announcement wakes the sleep (or keeps it from starting)."""

    def announce(self) -> int: ...

    def sleep(self, sequence: int, timeout: float) -> None: ...

    def withdraw(self) -> None: ...


class Channel(ABC):
    """Ordered, tagged, non-blocking messages to one peer.

    Lifecycle, the same words for every transport: ``Transport.connect`` makes the channel at
    once; it connects in the background of progress (``Transport.setup_pending`` while it
    does) until it is ``ready``; messages queued before that move then. ``peer_joined`` says
    whether the peer has started its side at all. A channel that fails is broken for good
    (``broken``: every request after that fails with it), and ``close`` ends it.
    """

    #: rank of the peer (in the root communicator that opened the transport)
    peer: int
    #: the transport that made this channel
    transport: Transport
    #: the channel's posted receives and held (unexpected) messages: every transport
    #: matches through one. Public because the progress engine reads it too: a wait that
    #: goes idle looks at the matcher of each of its requests' channels for held messages
    #: that prove a receive wrong (``progress.ProgressEngine``), and an any-source receive
    #: enlists in it (``irecv_any``)
    matcher: TagMatcher
    #: why the channel broke (None while it works); every request after that fails with it.
    #: Read by the transport's helpers that run the channel's connection (``wireup``'s
    #: dials and handshakes, verbs' ``QueuePairs``) to stop work on a broken channel
    broken: BaseException | None
    #: the transport's active set (``ActiveSet.channels``): joined when work arrives
    _active: dict[int, Channel]
    #: what receives are made of: ``Request``, or the bit-flip test hook's subclass when
    #: ``PYCOLL_TEST_FLIP`` is set (``bitflip.py``). Set on this class by the registry
    #: (``registry.transport_class``), once, before any transport is made
    recv_request: type[Request] = Request

    @abstractmethod
    def isend(self, mem: MemRef, tag: int = 0) -> Request:
        """Queue ``mem`` for the peer; the memory must stay untouched until the request is done."""

    @abstractmethod
    def irecv(self, mem: MemRef, tag: int = 0) -> Request:
        """Post a receive of exactly ``mem.nbytes`` bytes for the next message with ``tag``."""

    @abstractmethod
    def progress(self) -> bool:
        """Move whatever can move without blocking; return True if anything moved."""

    @abstractmethod
    def busy(self) -> bool:
        """Whether anything is queued, posted or connecting (the engine keeps progressing)."""

    @property
    @abstractmethod
    def ready(self) -> bool:
        """Whether connecting is over: the channel can carry messages both ways (tcp: every
        socket of the pair is up; shm: both inboxes are mapped; verbs: the queue pairs are
        connected; inproc: the peer's endpoint was found). Not a liveness test: a ready
        channel can still break."""

    def irecv_any(self, mem: MemRef, tag: int, group: AnySource) -> Request:
        """Post a receive that is one alternative of ``group`` (a receive from any source):
        the first of the group's receives that a message matches wins, and the others are
        withdrawn at that moment, before any byte lands (``matching.AnySource``)."""
        req = self.irecv(mem, tag)
        group.enlist(self.matcher, req)
        return req

    def _post_receive(self, req: Request) -> bool:
        """The start of every ``irecv``: a held message first (one that arrived before the
        peer went away is still delivered, through ``_deliver_held``), else a broken channel
        fails the receive, else it is posted and the channel joins the active set. True when
        posted (the caller may then progress at once)."""
        match = self.matcher
        if match.unexpected:
            held = match.take_held(req)
            if held is not None:
                self._deliver_held(req, *held)
                return False
        broken = self.broken
        if broken is not None:
            req.fail(broken)
            return False
        match.posted.append(req)
        self._active[self.peer] = self
        return True

    def _deliver_held(self, req: Request, nbytes: int, body: Any) -> None:
        """Deliver a held message (bytes: copied) to the receive ``req``."""
        if self._size_ok(req, nbytes):
            req.view[:] = body
            req.complete()

    def put(self, src: MemRef, remote: dict[str, Any], offset: int, notify: int) -> Request:
        """One-sided write of ``src`` into the peer's registered region ``remote`` (what
        ``Transport.register`` returned on the peer) at ``offset``. Once the bytes are in
        place the peer's ``notifications()`` yields ``(this rank, notify)``; the request
        completes when the write is done. Only transports whose capabilities say
        ``one_sided``; others raise ``TransportError``."""
        raise TransportError(f"{self.transport.name}: one-sided put is not supported",
                             peer=self.peer)

    def attach_window(self, record: dict[str, Any], progress: WindowProgress) -> RemoteWindow:
        """This rank's handle on the peer's window, from the record the peer's
        ``Transport.expose_window`` made. ``progress(post, deadline)`` (``WindowProgress``): the
        communicator's way to post requests on channels and progress until they are done,
        serialised with its calls (tcp's operations are requests; shm and inproc copy
        and ignore it). Only transports whose capabilities say ``windows``."""
        raise TransportError(f"{self.transport.name}: one-sided windows are not supported over "
                             "this transport yet", peer=self.peer)

    def check_alive(self) -> None:
        """Raise PeerLost if the peer is known to be gone (called while idle)."""

    def refuse_conflicts(self) -> bool:
        """Fail posted receives that a held message proves wrong (``CollectiveMismatch``);
        the progress engine calls it when a wait goes idle."""
        return self.matcher.refuse_conflicts()

    def check_leftovers(self, tag: int, unread: bool = True) -> None:
        """Raise ``CollectiveMismatch`` for a message that arrived (held, or with ``unread``
        not yet read either) for call ``tag`` or an earlier one of its communicator and that
        no receive took (``TagMatcher.check_leftovers``). A call that posted receives on
        this channel has read what came before them (``unread=False``); the fast path posts
        none."""
        if unread:
            self.matcher.check_leftovers(tag, self.unread_tags())
        elif self.matcher.unexpected:
            self.matcher.check_leftovers(tag)

    def unread_tags(self) -> list[int]:
        """Tags of messages that arrived but were not read yet (read only for a receive)."""
        return []

    def peer_joined(self) -> bool:
        """Whether the peer has opened its side of this channel (False: lazy connections
        whose peer never used the pair, e.g. because it runs a different call)."""
        return True

    def _size_ok(self, req: Request, nbytes: int) -> bool:
        """Whether a message of ``nbytes`` fits the matched receive ``req``. If not, the
        ranks disagree on sizes or on the collective: the channel breaks and ``req``, which
        matching already took off the posted receives, fails with it."""
        if nbytes == req.nbytes:
            return True
        error = size_mismatch(self.peer, req.tag, nbytes, req.nbytes)
        self.break_with(error)
        req.fail(error)
        return False

    @abstractmethod
    def break_with(self, error: BaseException) -> None:
        """Fail every pending request with ``error``; the channel stays broken (``broken``).
        Called by the channel itself, and by the helpers that run its connection
        (``wireup``'s dials and handshakes, verbs' ``QueuePairs``) when the connection
        fails under them; a failed call breaks a channel through ``abandon``."""

    def abandon(self, error: BaseException) -> None:
        """A call that had requests here failed: the pair is out of step (a late message
        could land in a buffer the user got back with an error), so break it."""
        self.break_with(error)

    @abstractmethod
    def close(self) -> None:
        """Release the channel; pending requests fail."""


class Transport(ABC):
    """A way of moving bytes between this rank and some of its peers."""

    #: the registry name (``PYCOLL_TRANSPORTS`` uses it)
    name: str = ""
    capabilities: Capabilities
    #: set before ``close`` when this rank leaves because of a lost peer: every channel tells
    #: its peer "I leave because rank N is gone", so a survivor waiting on this rank blames
    #: rank N, not this rank (NCCL and Gloo report only the neighbour that vanished)
    farewell: int | None = None

    @abstractmethod
    def __init__(self, ctx: OpenContext) -> None:
        """Open (cheaply: a listener, a path prefix); channels come later, on first use."""

    def configure(self, crowded: bool) -> None:
        """Adopt the job's rank layout, known after the bootstrap (``crowded``: more ranks
        on this machine than cores)."""

    @classmethod
    @abstractmethod
    def probe(cls) -> tuple[dict[str, Any] | None, str]:
        """(record, reason): the small record this rank publishes when the transport is
        usable here, or (None, why not)."""

    @staticmethod
    @abstractmethod
    def can_connect(a: PeerInfo, b: PeerInfo) -> bool:
        """Whether two ranks can talk over this transport; must be symmetric."""

    @classmethod
    def details(cls) -> dict[str, Any] | None:
        """What ``python -m pycoll.info`` shows of this transport beyond its probe (shm: its
        directory's free space; tcp: the interfaces); None when there is nothing more."""
        return None

    @classmethod
    def sweep_leftovers(cls, pids: Iterable[int] | None = None) -> list[str]:
        """Remove what dead processes of this user left behind (files in /dev/shm for shm):
        given ``pids``, what those reaped processes made; otherwise what any process that no
        longer exists made. Returns what was removed. The launcher calls it through
        ``registry.sweep_leftovers`` once it has reaped its ranks."""
        return []

    @abstractmethod
    def address(self) -> dict[str, Any]:
        """A JSON-able record a peer needs to connect (published through the store)."""

    @abstractmethod
    def connect(self, peer: int, address: dict[str, Any], deadline: float) -> Channel:
        """The channel to ``peer`` (created on first call; connects in the background)."""

    @abstractmethod
    def progress(self) -> bool:
        """Progress every channel that has work (and accept connecting peers)."""

    def wait_fds(self) -> list[tuple[int, int]] | None:
        """(fd, select.EPOLL* events) the engine may block on (``pollable`` transports)."""
        return None

    def doorbell(self) -> Doorbell | None:
        """For a transport that is not ``pollable``: a doorbell that every channel with work
        rings whenever it moves (so the engine may sleep on it instead of polling while this
        transport alone has work), or None: the engine polls."""
        return None

    def register(self, mem: MemRef) -> dict[str, Any]:
        """Expose ``mem`` for one-sided ``put`` by peers; returns the JSON-able record a peer
        passes to ``Channel.put``. The transport keeps ``mem`` alive until ``deregister``."""
        raise TransportError(f"{self.name}: memory registration is not supported")

    def deregister(self, record: dict[str, Any]) -> None:
        """Withdraw a registration (peers' later puts into it fail)."""

    def expose_window(self, mem: MemRef, dtype: str = "", np_dtype: Any = None
                      ) -> ExposedWindow:
        """Expose host memory ``mem`` (elements of ``dtype``, pycoll's name, which are
        ``np_dtype`` in numpy) as this rank's window to peers of this transport
        (``windows.py``). Only transports whose capabilities say ``windows``."""
        raise TransportError(f"{self.name}: one-sided windows are not supported over this "
                             "transport yet")

    def allocate_window(self, nbytes: int) -> ExposedWindow:
        """Allocate ``nbytes`` of window memory that this transport's peers map directly
        and expose it: the returned window's ``memory`` (a uint8 array) is it. Only
        transports whose capabilities say ``window_memory``."""
        raise TransportError(f"{self.name}: cannot allocate window memory")

    def notifications(self) -> list[tuple[int, int]]:
        """``(peer, notify)`` of every put completed into this rank's memory since the last
        call, in the order each peer made them (progresses the channels to find them)."""
        return []

    #: the channels with work (every transport keeps one; see ``ActiveSet``): its channels
    #: join it when work arrives, and the progress engine walks it
    active: ActiveSet
    #: connection setup in progress (dials, handshakes, segments to map): progress me even
    #: when no channel has work
    setup_pending: bool = False
    #: ``wait_fds`` gives descriptors the engine can block on (False: poll only, e.g. shm)
    pollable: bool = True

    def connections(self) -> int:
        """Channels opened so far (tcp: connected sockets)."""
        return len(getattr(self, "_channels", ()))

    def held_memory(self) -> dict[str, int]:
        """Bytes this rank holds for talking to its peers: ``segment``, shared memory it has
        mapped for its channels; ``registered``, memory registered with a NIC or exposed to
        peers' one-sided puts. Kernel socket buffers are not counted (tcp holds neither)."""
        return {"segment": 0, "registered": 0}

    def check_alive(self) -> None:
        """Raise PeerLost for a channel whose peer is known to be gone (called while idle)."""
        self.active.check_alive()

    @abstractmethod
    def close(self) -> None:
        """Close every channel and release sockets and memory segments."""


def _anyone(name: str, peer: int) -> bool:
    return True


@dataclass(frozen=True)
class OpenContext:
    """What every transport is opened with (one constructor shape for all of them)."""

    rank: int
    size: int
    token: str | None = None           # the job secret (tcp proves membership with it)
    master_addr: str | None = None     # where the store is (tcp binds the interface reaching it)
    #: ``accepts(transport name, peer)``: may this peer connect to us over that transport
    #: (the registry's choice for the pair, so a peer cannot use an unchosen transport)
    accepts: Callable[[str, int], bool] = _anyone


@dataclass(frozen=True)
class PeerInfo:
    """What every rank knows about a rank after the bootstrap exchange."""

    rank: int
    host: str            # node identity (virtual layouts included)
    machine: str         # the real machine
    records: dict        # transport name -> its probe record


class ActiveSet:
    """The channels of one transport that have work: what ``progress`` walks.

    A channel joins when it gets work (a send queued, a receive posted, a connection to
    finish) and leaves once idle, so progress never scans idle channels of a large job.
    """

    __slots__ = ("channels",)

    def __init__(self) -> None:
        self.channels: dict[int, Channel] = {}

    def add(self, ch: Channel) -> None:
        self.channels[ch.peer] = ch

    def progress(self) -> bool:
        moved = False
        chans = self.channels
        for ch in tuple(chans.values()):
            if ch.progress():
                moved = True
            elif not ch.busy():       # idle: leave until it gets work again
                chans.pop(ch.peer, None)
        return moved

    def check_alive(self) -> None:
        for ch in tuple(self.channels.values()):
            ch.check_alive()


def size_mismatch(peer: int, tag: int, sent: int, posted: int) -> MessageSizeMismatch:
    return MessageSizeMismatch(
        f"peer rank {peer} sent {sent} bytes (tag {tag}) but this rank posted a receive of "
        f"{posted} bytes: the ranks disagree on the tensor size or on which collective runs",
        peer=peer)


def peer_lost(peer: int, why: str) -> PeerLost:
    return PeerLost(f"peer rank {peer} is gone: {why}", peer=peer)


def peer_left_over(peer: int, lost: int) -> PeerLost:
    """The peer closed its side and said why: it lost rank ``lost`` (the root cause, which
    this error names as its ``peer``, so survivors all blame the rank that died)."""
    return PeerLost(f"peer rank {lost} is gone: peer rank {peer} left the job because it lost "
                    f"rank {lost}", peer=lost)


#: striping a message over several lanes (tcp sockets, verbs queue pairs) only pays off
#: above this many bytes per lane
STRIPE_MIN = 256 << 10


def stripes(nbytes: int, lanes: int) -> list[tuple[int, int, int]]:
    """(lane, offset, length) of each stripe of a message: contiguous stripes over up to
    ``lanes`` lanes, each at least ``STRIPE_MIN`` bytes. Both ends compute it from the size
    alone, so the receiver knows which bytes each lane brings without any header."""
    used = max(1, min(lanes, nbytes // STRIPE_MIN))
    per = -(-nbytes // used)
    return [(i, i * per, min(per, nbytes - i * per)) for i in range(used)]
