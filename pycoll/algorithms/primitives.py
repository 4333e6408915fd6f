"""The handful of primitives every algorithm is written with.

An algorithm sees only ``Peers`` (rank, size, a channel per peer, a deadline, scratch memory)
and calls ``send``, ``recv``, ``sendrecv`` and ``sendrecv_reduce``, the Python counterparts of
NCCL's send / recv / recv-reduce-send primitives. The primitives do the chunking and
pipelining: ``sendrecv_reduce`` cuts a chunk into segments and reduces segment k while segment
k+1 is still arriving, so the wire and the reduction overlap.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..buffers.memops import MemoryOps, ReduceSpec
from ..errors import CollectiveMismatch, TransportError
from ..transports.base import Channel, Request, peer_lost
from ..transports.matching import AnySource
from ..transports.progress import ProgressEngine, WaitTimeout

__all__ = ["Peers", "ReduceSpec", "chunk_bounds", "send", "recv",
           "sendrecv", "sendrecv_reduce", "recv_reduce", "send_segmented"]


class Peers:
    """What an algorithm may use: who we are, channels to the others, a deadline, memory ops.

    ``channels`` opens a channel on first lookup (lazy connections); ``wait`` runs the
    communicator tree's progress engine, which moves every queued send on any channel while
    it waits, so no algorithm has to say which channels feed the peers it waits on.
    """

    __slots__ = ("rank", "size", "channels", "deadline", "segment_bytes", "ops", "engine",
                 "check", "absent", "layout", "_subgroup", "tag", "_lock", "_ref", "posted")

    def __init__(self, rank: int, size: int, channels: dict[int, Channel], deadline: float,
                 segment_bytes: int, ops: MemoryOps, engine: ProgressEngine,
                 check: Callable[[], None] | None = None,
                 layout: Sequence[tuple[int, int]] = (),
                 subgroup: Callable[[str], Peers | None] | None = None,
                 tag: int | None = None,
                 absent: Callable[[list[int]], list[int]] | None = None) -> None:
        self.rank = rank
        self.size = size
        self.channels = channels
        self.deadline = deadline
        self.segment_bytes = segment_bytes    # 0: each transport's own choice
        self.ops = ops
        self._ref = ops.ref
        self.engine = engine
        self._lock = engine.lock
        self.check = check
        #: which of these peers (as the channels number them), which never opened their
        #: side of a channel this call waits on, are known gone (the store's leases): a
        #: peer that died before it connected is named at once, not at the deadline
        self.absent = absent
        self.layout = layout          # (node index, local index) of every rank
        self._subgroup = subgroup
        self.tag = tag or 0           # this call's tag; primitives use it unless told otherwise
        #: every request of the running call: if the call fails, their channels are broken,
        #: so that no late message lands in a user's buffer after the error was raised
        self.posted: list[Request] = []

    def use_ops(self, ops: MemoryOps) -> MemoryOps:
        """Switch to other memory ops (a direct device call runs on device memory); returns
        the ones in use before, to switch back to. ``isend``/``irecv`` follow."""
        before = self.ops
        self.ops = ops
        self._ref = ops.ref
        return before

    def subgroup(self, kind: str) -> Peers | None:
        """The ranks of this one's node (``"node"``) or of the same local index on every
        node (``"cross"``), for hierarchical algorithms; None unless the layout has several
        nodes with equally many ranks each."""
        return self._subgroup(kind) if self._subgroup is not None else None

    def isend(self, peer: int, arr: Any, tag: int | None = None) -> Request:
        ch = self.channels[peer]
        mem = self._ref(arr)
        if not self.engine.shared:
            req = ch.isend(mem, self.tag if tag is None else tag)
        else:
            with self._lock:
                req = ch.isend(mem, self.tag if tag is None else tag)
        self.posted.append(req)
        return req

    def irecv(self, peer: int, arr: Any, tag: int | None = None) -> Request:
        ch = self.channels[peer]
        mem = self._ref(arr)
        if not self.engine.shared:
            req = ch.irecv(mem, self.tag if tag is None else tag)
        else:
            with self._lock:
                req = ch.irecv(mem, self.tag if tag is None else tag)
        self.posted.append(req)
        return req

    def irecv_any(self, sources: Sequence[int], arr: Any, tag: int) -> tuple[list[Request],
                                                                              AnySource]:
        """Receive into ``arr`` the first message with ``tag`` from any of ``sources``.

        Returns the posted alternatives (wait for all of them: the losers complete empty the
        moment one wins) and the group, whose ``matched`` request names the winner.
        """
        group = AnySource()
        mem = self._ref(arr)
        reqs: list[Request] = []
        channels = [self.channels[peer] for peer in sources]   # opening one takes the lock
        with self._lock:
            for ch in channels:
                if group.matched is not None:
                    break
                req = ch.irecv_any(mem, tag, group)
                reqs.append(req)
                self.posted.append(req)
        return reqs, group

    def wait_any(self, requests: Sequence[Request], group: AnySource) -> None:
        """Wait for the alternatives of ``irecv_any`` until one message has landed.

        A channel that fails (its source finished and closed, died, or a call of another
        communicator broke the pair) only removes its alternative: the others may still
        deliver, as with MPI_ANY_SOURCE. Only when every alternative has failed does the
        receive fail; a source that dies while the message is still to come from it is
        noticed through the abort records or the deadline, like any wait. If the receive
        fails, the alternatives still waiting are withdrawn first: nothing landed in them, so
        their channels stay usable (only a half-received winner's pair is out of step).
        """
        live = [r for r in requests if r.error is None] or list(requests)
        try:
            while True:
                try:
                    self.engine.wait(live, self.deadline, self.check)
                    return
                except TransportError as e:
                    if isinstance(e, WaitTimeout):
                        raise
                    won = group.matched
                    if won is not None:      # the message is coming: wait for it alone
                        if won.error is not None:
                            raise won.error from None
                        if won.done:
                            return
                        live = [won]
                        continue
                    live = [r for r in live if r.error is None]
                    if not live:
                        raise                # every source is gone
        except BaseException:
            with self._lock:
                group.withdraw()
            raise

    def wait(self, requests: Sequence[Request]) -> None:
        """Wait for ``requests``; every channel with work progresses meanwhile."""
        self.engine.wait(requests, self.deadline, self.watch)

    def poke(self) -> None:
        """One progress pass without waiting: an algorithm that computes between posting and
        waiting (the compressed calls' codec passes) keeps its queued sends moving and its
        receives draining meanwhile."""
        self.engine.progress()

    def watch(self) -> None:
        """What a wait checks while it idles (every ``WaitPolicy.liveness_seconds``): the
        communicator's ``check`` (abort records), then every receive this call posted, not
        only the awaited ones: a held message that proves the ranks disagree about the call
        (``matching.TagMatcher.refuse_conflicts``) ends the call with ``CollectiveMismatch``
        even when it sits on a channel the call does not wait on now (the agreement round
        of rooted calls posts its first receive before the data moves: ``agreement.py``)."""
        if self.check is not None:
            self.check()
        if self.absent is not None:
            never = sorted({r.channel.peer for r in self.posted
                            if not r.done and not r.channel.peer_joined()})
            gone = self.absent(never) if never else []
            if gone:
                raise peer_lost(gone[0], "it died before it opened its side of the channel "
                                         "to this rank (its store lease was lost)")
        pending = [r for r in self.posted if not r.done and r.kind == "recv"]
        if pending:
            with self._lock:
                for ch in {id(r.channel): r.channel for r in pending}.values():
                    ch.refuse_conflicts()
        for r in self.posted:
            if isinstance(r.error, CollectiveMismatch):
                raise r.error

    def scratch(self, count: int, dtype: np.dtype, slot: int = 0) -> Any:
        return self.ops.scratch(count, dtype, slot)

    def copy(self, dst: Any, src: Any) -> None:
        """The local copy primitive (``dst[...] = src``) for this memory type."""
        self.ops.copy(dst, src)

    def segment_count(self, peer: int, itemsize: int) -> int:
        """Elements per pipelined segment on the channel to ``peer``.

        Both ends of a channel use the same transport, hence the same segment size, so a
        sender and its receiver always cut a chunk at the same places.
        """
        nbytes = self.segment_bytes or self.channels[peer].transport.capabilities.segment_bytes
        return max(1, nbytes // itemsize)


def chunk_bounds(count: int, parts: int) -> list[tuple[int, int]]:
    """Split ``count`` elements into ``parts`` nearly equal contiguous (start, stop) ranges."""
    base, extra = divmod(count, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def send(peers: Peers, dst: int, arr: np.ndarray, tag: int | None = None) -> None:
    peers.wait([peers.isend(dst, arr, tag)])


def recv(peers: Peers, src: int, arr: np.ndarray, tag: int | None = None) -> None:
    peers.wait([peers.irecv(src, arr, tag)])


def sendrecv(peers: Peers, dst: int, send_arr: np.ndarray, src: int, recv_arr: np.ndarray,
             tag: int | None = None) -> None:
    """Send to ``dst`` and receive from ``src`` at the same time (full duplex)."""
    rreq = peers.irecv(src, recv_arr, tag)
    sreq = peers.isend(dst, send_arr, tag)
    peers.wait([rreq, sreq])


def sendrecv_reduce(peers: Peers, dst: int | None, send_arr: np.ndarray | None, src: int,
                    acc: np.ndarray, spec: ReduceSpec, tag: int | None = None) -> None:
    """Send ``send_arr`` to ``dst``; receive ``src``'s matching data and reduce it into ``acc``.

    With ``dst=None`` it only receives and reduces (recv-reduce). Both sides cut their
    buffers into the same segments (the segment size is a job-wide setting), so every
    segment is one message. Two scratch segments alternate: while one is
    being reduced the next is arriving.
    """
    sends = []
    if dst is not None and send_arr is not None:
        out = peers.segment_count(dst, send_arr.itemsize)
        sends = [peers.isend(dst, send_arr[i:i + out], tag) for i in range(0, send_arr.size, out)]
    seg = peers.segment_count(src, acc.itemsize)
    starts = list(range(0, acc.size, seg))
    if starts:
        buffers = [peers.scratch(min(seg, acc.size), acc.dtype, slot) for slot in (0, 1)]
        pending: list[Request | None] = [None, None]

        def post(k: int) -> None:
            n = min(seg, acc.size - starts[k])
            pending[k % 2] = peers.irecv(src, buffers[k % 2][:n], tag)

        post(0)
        if len(starts) > 1:
            post(1)
        for k, start in enumerate(starts):
            req = pending[k % 2]
            peers.wait([req])  # type: ignore[list-item]
            n = min(seg, acc.size - start)
            spec.reduce(acc[start:start + n], buffers[k % 2][:n])
            if k + 2 < len(starts):
                post(k + 2)
    peers.wait(sends)


def recv_reduce(peers: Peers, src: int, acc: np.ndarray, spec: ReduceSpec,
                tag: int | None = None) -> None:
    """Receive ``src``'s data segment by segment and reduce it into ``acc``."""
    sendrecv_reduce(peers, None, None, src, acc, spec, tag)


def send_segmented(peers: Peers, dst: int, arr: np.ndarray, tag: int | None = None) -> None:
    """Send ``arr`` cut the way ``recv_reduce`` on the other side expects it."""
    seg = peers.segment_count(dst, arr.itemsize)
    peers.wait([peers.isend(dst, arr[i:i + seg], tag) for i in range(0, arr.size, seg)])
