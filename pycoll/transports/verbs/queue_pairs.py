"""The queue pairs to one peer: made and wired, posted to under credits, torn down.

A ``VerbsChannel`` (``channel.py``) owns one ``QueuePairs`` and runs its protocol on top.
This part holds what the RC connections to the peer need whatever the messages mean: one
control queue pair (the eager ring, control messages, credits) and the data queue pairs
(rendezvous writes), their completion queue and its completion channel, the registered
ring and send slots, the credit counts, the work waiting for room (the outbox, in order on
the control queue pair, and rendezvous writes), and the setup socket: it carries the
queue-pair addresses (``wire.QpAddresses``), then nothing but a farewell, and its closing is
how a dead peer is noticed while this rank only waits to receive.
"""
from __future__ import annotations

import secrets
import select
import socket
import time
from collections import deque
from typing import Any, Protocol

import numpy as np

from ... import debug
from ...errors import TransportError
from ..base import ActiveSet, peer_left_over, peer_lost
from .device import Device, E, RegistrationCache, connect_qp, create_qp
from .wire import (
    DATA_RQ_DEPTH,
    FAREWELL,
    FAREWELL_MAGIC,
    HDR,
    INFO,
    INFO_MAGIC,
    INLINE_BYTES,
    SQ_DEPTH,
    WR_CREDIT,
    WR_DATA,
    WR_INLINE,
    WR_PUT,
    WR_PUTDATA,
    WR_RING,
    WR_RNDV,
    WR_SLOT,
    WR_WINDOW,
    ControlMessage,
    PutWrite,
    QpAddresses,
    RndvWrite,
    WindowRdma,
    peer_addresses,
    wr_id,
)

#: the setup socket's progress: none yet, addresses in flight, queue pairs ready to send
CONNECTING, EXCHANGING, READY = "connecting", "exchanging", "ready"

#: send flags of a control message: signaled (its completion frees the send-queue room and
#: the send slot), and inline when the adapter copies the bytes at post time
_SEND = E.IBV_SEND_SIGNALED if E is not None else 0
_SEND_INLINE = _SEND | (E.IBV_SEND_INLINE if E is not None else 0)
_INLINE_UNSIGNALED = E.IBV_SEND_INLINE if E is not None else 0
#: at most this many unsignaled work requests in a row on the control queue pair: the next
#: is signaled, and its completion frees their send-queue room too (RC completes in order)
SIGNAL_EVERY = 32

_WR_CLASSES: tuple[Any, Any, Any] | None = None


def wr_classes() -> tuple[Any, Any, Any]:
    """pyverbs' ``(SGE, RecvWR, SendWR)``, imported once: this module must import on hosts
    without pyverbs, and an import statement on the per-message path costs a lookup each."""
    global _WR_CLASSES
    if _WR_CLASSES is None:
        from pyverbs.wr import SGE, RecvWR, SendWR
        _WR_CLASSES = (SGE, RecvWR, SendWR)
    return _WR_CLASSES


def ring_group(ring_slots: int) -> int:
    """Ring buffers re-posted (and credited) together: a quarter of the ring. Coalescing
    re-posts into one chained ``post_recv`` and one credit write per group saves a verbs
    call and a completion-free RDMA write per message, and a quarter leaves the sender
    three quarters of its credits while the receiver waits to fill a group."""
    return max(1, ring_slots // 4)


class VerbsOwner(Protocol):
    """What a channel and its queue pairs use of their transport (``VerbsTransport``): the
    device and settings, and the per-rank registered memory every channel shares."""

    size: int
    farewell: int | None
    device: Device
    cache: RegistrationCache
    eager_max: int
    qps_per_peer: int
    ring_slots: int
    inline: int
    ack_timeout: int
    retry_cnt: int
    exchanging: int
    credit_words: np.ndarray
    credit_mr: Any
    credit_addr: int
    credit_out: np.ndarray
    credit_out_mr: Any
    credit_out_addr: int
    scratch_mr: Any
    notices: list[tuple[int, int]]
    active: ActiveSet
    windows: dict[int, Any]

    def register_own(self, array: np.ndarray) -> Any: ...


class PairsChannel(Protocol):
    """What the queue pairs call back on the channel that owns them."""

    peer: int
    broken: BaseException | None

    def break_with(self, error: BaseException) -> None: ...

    def on_completion(self, wc: Any) -> None: ...

    def progress(self) -> bool: ...


class QueuePairs:
    """The RC queue pairs, rings and credits of one channel (see the module docstring)."""

    def __init__(self, transport: VerbsOwner, channel: PairsChannel) -> None:
        self.transport = transport
        self.channel = channel
        self.peer = channel.peer
        self.state = CONNECTING
        self.sock: socket.socket | None = None
        self._info_in = bytearray()
        self._psn = 0
        self.cq: Any = None
        self._cc: Any = None
        self.cc_fd = -1
        self.armed = False
        self.qps: list[Any] = []
        self.sq_free: list[int] = []
        self.rq_free: list[int] = []
        # eager rings and credits
        self.ring: np.ndarray | None = None
        self.ring_view = memoryview(b"")   # of ``ring``: slicing a memoryview is cheaper
        self._slots_view = memoryview(b"")  # of ``_slots`` (than numpy's, per message)
        self._ring_mr: Any = None
        self._slots: np.ndarray | None = None
        self._slots_mr: Any = None
        self._free_slots: list[int] = []
        self._peer_slots = 0
        self._sent = 0              # messages sent into the peer's ring
        self._consumed = 0          # ring buffers this side re-posted (the peer's credits)
        self._next_ring = 0         # the ring buffer the next message lands in (RC: in order)
        self._group = 1             # ring buffers re-posted together (``ring_group``)
        # work requests built once and reused (``_prebuild``): a pyverbs SGE or WR costs an
        # object, a malloc and a logger lookup each, more than posting it
        self._ring_wrs: list[Any] = []       # RecvWR per ring buffer, chained per group
        self._slot_wrs: list[Any] = []       # SendWR per send slot (SEND from that slot)
        self._slot_sges: list[Any] = []      # ... and its SGE (its length set per message)
        self._data_wrs: list[Any] = []       # RecvWR per data queue pair (write-with-imm)
        self._credit_wr: Any = None          # the credit word's RDMA write
        # selective signaling on the control queue pair: inline messages and credit writes
        # hold no slot, so most go unsignaled (no completion to poll, no event to wake on)
        self._unsignaled = 0        # unsignaled work requests since the last signaled one
        self._covers: deque[int] = deque()   # per signaled WR in flight: entries it frees
        self._credit_flags = 0      # the credit write's flags when unsignaled
        self._reported = 0          # ... of which the peer was told
        self._peer_credit: tuple[int, int] = (0, 0)   # (address, rkey) of our word there
        self.eager_max = transport.eager_max
        self.stride = HDR.size + self.eager_max       # of a ring buffer and a send slot
        # work waiting for room
        self.outbox: deque[ControlMessage | PutWrite | WindowRdma] = deque()
        self.writes: deque[RndvWrite] = deque()
        self._slot_of_put: dict[int, int | None] = {}   # put id -> send slot of its notice

    # -- setup -----------------------------------------------------------------------------
    def start(self, sock: socket.socket) -> None:
        """The setup socket is up: create the queue pairs, post the ring, and send this
        side's addresses; the peer's complete the connection (``finish_exchange``)."""
        self.sock = sock
        try:
            sock.send(self._create().pack())
        except Exception as e:   # noqa: BLE001 - any device failure breaks this pair only
            self.channel.break_with(TransportError(f"verbs: cannot set up queue pairs to peer "
                                                   f"rank {self.peer}: {e}", peer=self.peer))
            return
        self.state = EXCHANGING
        self.transport.exchanging += 1

    def _create(self) -> QpAddresses:
        from pyverbs.cq import CQ

        t = self.transport
        dev = t.device
        nq = 1 + t.qps_per_peer
        self._cc, self.cc_fd = dev.comp_channel()
        depth = nq * SQ_DEPTH + t.ring_slots + t.qps_per_peer * DATA_RQ_DEPTH + 16
        self.cq = CQ(dev.ctx, depth, None, self._cc, 0)
        for i in range(nq):
            rq = t.ring_slots if i == 0 else DATA_RQ_DEPTH
            qp, inline = create_qp(dev, self.cq, SQ_DEPTH, rq, INLINE_BYTES)
            t.inline = min(t.inline, inline)
            self.qps.append(qp)
            self.sq_free.append(SQ_DEPTH)
            self.rq_free.append(rq)
        self.ring = np.zeros(t.ring_slots * self.stride, dtype=np.uint8)
        self._ring_mr = t.register_own(self.ring)
        self._slots = np.zeros(t.ring_slots * self.stride, dtype=np.uint8)
        self._slots_mr = t.register_own(self._slots)
        self.ring_view = self.ring.data
        self._slots_view = self._slots.data
        self._free_slots = list(range(t.ring_slots - 1, -1, -1))
        self._prebuild()
        for head in range(0, t.ring_slots, self._group):
            self.qps[0].post_recv(self._ring_wrs[head])
        self._psn = secrets.randbelow(1 << 24)
        ch = dev.choice
        return QpAddresses(INFO_MAGIC, ch.gid.encode(), ch.lid, self._psn, t.ring_slots, nq,
                           self.eager_max, t.credit_mr.rkey, t.credit_addr + 8 * self.peer,
                           ch.mtu, tuple(qp.qp_num for qp in self.qps))

    def _prebuild(self) -> None:
        """Build the work requests the per-message path posts, once per channel: a receive
        per ring buffer (each group of ``ring_group`` buffers chained, so one ``post_recv``
        re-posts a group), a SEND per send slot whose SGE length is set per message, a
        receive per data queue pair, and the credit write."""
        SGE, RecvWR, SendWR = wr_classes()
        t = self.transport
        n, stride, g = t.ring_slots, self.stride, ring_group(t.ring_slots)
        self._group = g
        ring, slots = self._ring_mr, self._slots_mr
        self._ring_wrs = [RecvWR(wr_id=wr_id(WR_RING, 0, i), num_sge=1,
                                 sg=[SGE(ring.buf + i * stride, stride, ring.lkey)])
                          for i in range(n)]
        for i in range(n - 1):
            if (i + 1) % g:                  # the last of a group ends its chain
                self._ring_wrs[i].next_wr = self._ring_wrs[i + 1]
        self._slot_sges = [SGE(slots.buf + i * stride, stride, slots.lkey) for i in range(n)]
        self._slot_wrs = []
        for sge in self._slot_sges:
            wr = SendWR(opcode=E.IBV_WR_SEND, num_sge=1, sg=[sge])
            wr.sg_list = sge     # point at the SGE itself: its length changes per message
            self._slot_wrs.append(wr)
        scratch = t.scratch_mr
        self._data_wrs = [None] + [RecvWR(wr_id=0, num_sge=1, sg=[SGE(scratch.buf, 0,
                                                                       scratch.lkey)])
                                   for _ in range(1, len(self.qps))]
        out = t.credit_out_mr
        self._credit_flags = _INLINE_UNSIGNALED if t.inline >= 8 else 0
        self._credit_wr = SendWR(
            wr_id=wr_id(WR_CREDIT, 0, 0), opcode=E.IBV_WR_RDMA_WRITE, num_sge=1,
            sg=[SGE(t.credit_out_addr + 8 * self.peer, 8, out.lkey)])

    def finish_exchange(self) -> bool:
        """Read the peer's addresses; once complete, bring every queue pair to RTS."""
        fail = self.channel.break_with
        try:
            chunk = self.sock.recv(INFO.size - len(self._info_in))  # type: ignore[union-attr]
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as e:
            fail(peer_lost(self.peer, f"setup connection failed: {e}"))
            return True
        if not chunk:
            fail(peer_lost(self.peer, "it closed the setup connection"))
            return True
        self._info_in += chunk
        if len(self._info_in) < INFO.size:
            return True
        try:
            theirs = peer_addresses(bytes(self._info_in), self.peer, len(self.qps),
                                    self.eager_max)
        except TransportError as e:
            fail(e)
            return True
        try:
            t = self.transport
            choice = t.device.choice
            for qp, qpn in zip(self.qps, theirs.qpns):
                connect_qp(qp, choice, theirs.gid.rstrip(b"\0").decode(), theirs.lid, qpn,
                           theirs.psn, self._psn, min(theirs.mtu, choice.mtu), t.ack_timeout,
                           t.retry_cnt)
        except Exception as e:   # noqa: BLE001
            fail(TransportError(f"verbs: cannot connect queue pairs to peer rank "
                                f"{self.peer}: {e}", peer=self.peer))
            return True
        self._peer_slots = theirs.ring_slots
        self._peer_credit = (theirs.credit_addr, theirs.credit_rkey)
        self._credit_wr.set_wr_rdma(theirs.credit_rkey, theirs.credit_addr)
        self.state = READY
        self.transport.exchanging -= 1
        debug.logger.info("verbs: queue pairs to rank %d ready (%d data QPs, eager <= %d B)",
                          self.peer, self.ndata, self.eager_max)
        return True

    def abort_exchange(self) -> None:
        """The channel broke: an exchange in flight no longer counts as setup pending."""
        if self.state == EXCHANGING:
            self.transport.exchanging -= 1
            self.state = CONNECTING

    @property
    def ready(self) -> bool:
        return self.state == READY

    @property
    def ndata(self) -> int:
        """Data queue pairs (every queue pair but the control one)."""
        return len(self.qps) - 1

    # -- posting ---------------------------------------------------------------------------
    def repost_ring(self, i: int) -> bool:
        """Ring buffer ``i`` was copied out. Buffers complete in the order they were posted
        (one RC receive queue), so a group is re-posted, as one chain, when its last buffer
        is done: credits for the peer. False (the channel broke) if ``i`` is out of order."""
        if i != self._next_ring:
            self.channel.break_with(TransportError(
                f"verbs: ring buffer {i} of peer rank {self.peer}'s messages completed out of "
                f"order (expected {self._next_ring})", peer=self.peer))
            return False
        n = len(self._ring_wrs)
        self._next_ring = 0 if i + 1 == n else i + 1
        g = self._group
        if (i + 1) % g == 0 or i + 1 == n:
            head = i - i % g
            self.qps[0].post_recv(self._ring_wrs[head])
            self._consumed += i + 1 - head
        return True

    def post_data_recv(self, q: int, recv_id: int) -> None:
        """Expect one write with immediate data (``recv_id``) on data queue pair ``q``."""
        wr = self._data_wrs[q]
        wr.wr_id = wr_id(WR_DATA, q, recv_id)
        self.qps[q].post_recv(wr)
        self.rq_free[q] -= 1

    def post_send(self, q: int, kind: int, index: int, opcode: int, addr: int, length: int,
                  lkey: int, imm: int = 0, remote: tuple[int, int] | None = None,
                  inline: bool = False, add: int | None = None) -> None:
        SGE, _, SendWR = wr_classes()
        flags = E.IBV_SEND_SIGNALED | (E.IBV_SEND_INLINE if inline else 0)
        wr = SendWR(wr_id=wr_id(kind, q, index), opcode=opcode, num_sge=1,
                    sg=[SGE(addr, length, lkey)], send_flags=flags, imm_data=imm)
        if remote is not None and add is not None:
            wr.set_wr_atomic(remote[1], remote[0], add)
        elif remote is not None:
            wr.set_wr_rdma(remote[1], remote[0])
        self.qps[q].post_send(wr)
        self.sq_free[q] -= 1
        if q == 0:
            self._signaled()

    def _signaled(self) -> None:
        """A signaled work request was posted on the control queue pair: its completion
        frees its own send-queue entry and those of the unsignaled ones before it."""
        self._covers.append(self._unsignaled + 1)
        self._unsignaled = 0

    def _may_skip_signal(self) -> bool:
        """Whether the next control-queue-pair work request that holds no slot may go
        unsignaled (counted; else the caller signals it and calls ``_signaled``)."""
        if self._unsignaled < SIGNAL_EVERY - 1:
            self._unsignaled += 1
            return True
        return False

    def send_control(self, msg: ControlMessage) -> bool:
        """Post one message into the peer's ring if a credit, a slot and send-queue room are
        there; False to keep it queued."""
        if self._sent - self._credits_back() >= self._peer_slots or self.sq_free[0] <= 1:
            return False
        payload = msg.payload
        n = HDR.size + (payload.nbytes if payload is not None else 0)
        inline = n <= self.transport.inline
        if not self._free_slots:
            return False
        index = self._free_slots.pop()
        off = index * self.stride
        HDR.pack_into(self._slots_view, off, msg.kind, msg.aux, msg.tag, msg.nbytes, msg.ident,
                      msg.addr)
        if payload is not None and payload.nbytes:
            self._slots_view[off + HDR.size: off + n] = payload
        wr_kind = msg.wr_kind
        if inline:             # copied at post time: the slot is free again at once
            self._free_slots.append(index)
            if wr_kind == WR_SLOT:
                wr_kind = WR_INLINE
        wr = self._slot_wrs[index]
        self._slot_sges[index].length = n
        wr.wr_id = wr_id(wr_kind, 0, index if wr_kind in (WR_SLOT, WR_INLINE)
                         else msg.wr_index)
        if not inline:
            wr.send_flags = _SEND
            self._signaled()
        elif wr_kind == WR_INLINE and self._may_skip_signal():
            wr.send_flags = _INLINE_UNSIGNALED
        else:
            wr.send_flags = _SEND_INLINE
            self._signaled()
        self.qps[0].post_send(wr)
        self.sq_free[0] -= 1
        if wr_kind not in (WR_SLOT, WR_INLINE):
            self._slot_of_put[msg.wr_index] = None if inline else index
        self._sent += 1
        return True

    def _credits_back(self) -> int:
        return int(self.transport.credit_words[self.peer])

    def out_of_credits(self) -> bool:
        """The next control message waits for the peer to return credits."""
        return bool(self.outbox) and isinstance(self.outbox[0], ControlMessage) and \
            self._sent - self._credits_back() >= self._peer_slots

    def flush_outbox(self) -> bool:
        moved = False
        out = self.outbox
        while out:
            item = out[0]
            if isinstance(item, PutWrite):          # a put's data, ahead of its notice
                if self.sq_free[0] <= 1:
                    break
                self.post_send(0, WR_PUTDATA, item.put_id, E.IBV_WR_RDMA_WRITE, item.addr,
                               item.length, item.lkey, remote=item.remote)
            elif isinstance(item, WindowRdma):      # a window's put or get: no notice
                if self.sq_free[0] <= 1:
                    break
                self.post_send(0, WR_WINDOW, item.op_id, item.opcode, item.addr,
                               item.length, item.lkey, remote=item.remote, add=item.add)
            else:
                if not self.send_control(item):
                    break
                if item.req is not None:         # eager: complete once copied
                    item.req.complete()
            out.popleft()
            moved = True
        return moved

    def post_writes(self) -> bool:
        moved = False
        writes = self.writes
        while writes:
            w = writes[0]
            if self.sq_free[w.qp] <= 0:
                break       # that queue pair is full: keep order, wait for completions
            if w.imm is None:
                self.post_send(w.qp, WR_RNDV, w.send_id, E.IBV_WR_RDMA_WRITE, w.src,
                               w.length, w.lkey, remote=w.remote)
            else:
                self.post_send(w.qp, WR_RNDV, w.send_id, E.IBV_WR_RDMA_WRITE_WITH_IMM,
                               w.src, w.length, w.lkey, imm=w.imm, remote=w.remote)
            writes.popleft()
            moved = True
        return moved

    def report_credits(self) -> None:
        """Tell the peer how many ring buffers were re-posted (an RDMA write of a word); they
        are re-posted a group at a time (``repost_ring``), so this writes once a group."""
        if self._consumed == self._reported or self.sq_free[0] <= 1:
            return
        self._write_credits(not self._may_skip_signal())

    def _write_credits(self, signaled: bool) -> None:
        self.transport.credit_out[self.peer] = self._consumed
        wr = self._credit_wr
        wr.send_flags = self._credit_flags | (_SEND if signaled else 0)
        self.qps[0].post_send(wr)
        self.sq_free[0] -= 1
        if signaled:
            self._signaled()
        self._reported = self._consumed

    def signal_tail(self) -> None:
        """Unsignaled work requests are the last on the control queue pair: post a signaled
        one behind them (the credit write again, harmless), so that their completion can be
        waited for before the queue pairs go (``drain_sends``)."""
        if self._unsignaled and self.sq_free[0] > 0 and self.state == READY:
            self._write_credits(True)

    def send_done(self, kind: int, q: int, index: int) -> None:
        """A signaled send-queue work request completed: its room (and that of the unsignaled
        ones before it), and its send slot, are free."""
        self.sq_free[q] += self._covers.popleft() if q == 0 else 1
        if kind == WR_SLOT:
            self._free_slots.append(index)
        elif kind == WR_PUT:
            slot = self._slot_of_put.pop(index, None)
            if slot is not None:
                self._free_slots.append(slot)

    # -- completions -------------------------------------------------------------------------
    def poll(self) -> bool:
        """Hand every completion to the channel (``on_completion``); True if any came."""
        moved = False
        cq = self.cq
        channel = self.channel
        while True:
            n, wcs = cq.poll(32)
            if not n:
                return moved
            moved = True
            for wc in wcs:
                channel.on_completion(wc)
                if channel.broken is not None:
                    return True
            if n < 32:
                return moved

    def drain_events(self) -> None:
        """Consume the completion event if it came. The queue was armed once (``arm``) and is
        re-armed only after its event is consumed, so at most one is pending: one try, not
        a loop that always ends in pyverbs raising for EAGAIN (an exception, with strerror,
        on every wake-up)."""
        try:
            self._cc.get_cq_event(self.cq)
        except Exception:   # noqa: BLE001 - EAGAIN: no event yet (still armed)
            return
        self.cq.ack_events(1)
        self.armed = False

    def arm(self) -> bool:
        """Before the engine blocks: ask for an event on the next completion; True if a
        completion slipped in meanwhile (then do not block)."""
        if self.state != READY or self.channel.broken is not None:
            return False
        if not self.armed:
            self.cq.req_notify()
            self.armed = True
            if self.poll():
                return True
        # a returned credit is an RDMA write into our memory: no completion, no event. A
        # sender waiting for credits polls instead of blocking
        return self.out_of_credits()

    def fds(self) -> list[tuple[int, int]]:
        """(descriptor, epoll events) for the engine's waits: the setup socket, and the
        completion channel once the queue pairs are ready."""
        fds = []
        if self.sock is not None:
            fds.append((self.sock.fileno(), select.EPOLLIN))
        if self.state == READY and self.channel.broken is None:
            fds.append((self.cc_fd, select.EPOLLIN))
        return fds

    def busy(self) -> bool:
        return bool(self.outbox or self.writes or self.state == EXCHANGING or self._covers
                    or any(f < SQ_DEPTH for f in self.sq_free[1:]))

    # -- liveness ----------------------------------------------------------------------------
    def read_sentinel(self) -> None:
        """The setup socket after the exchange: closed means the peer process is gone; a
        farewell names the rank it left over."""
        if self.state != READY:
            return
        fail = self.channel.break_with
        try:
            data = self.sock.recv(FAREWELL.size, socket.MSG_PEEK)  # type: ignore[union-attr]
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            fail(peer_lost(self.peer, f"its setup connection failed ({e})"))
            return
        if not data:
            self.poll()      # deliver what arrived before it left
            fail(peer_lost(self.peer, "its process exited or closed the communicator "
                           "(setup connection closed)"))
        elif len(data) == FAREWELL.size:
            magic, lost = FAREWELL.unpack(data)
            if magic == FAREWELL_MAGIC and 0 <= lost < self.transport.size:
                self.poll()
                fail(peer_left_over(self.peer, lost))
            else:
                fail(TransportError(f"verbs: peer rank {self.peer} sent bytes on the setup "
                                    "connection", peer=self.peer))

    def peer_exited(self, grace: float = 1.0) -> bool:
        """Whether the peer's setup socket closes within ``grace`` seconds (its process
        exited): on an error completion, to name the cause, and (grace 0) before draining
        sends at close."""
        sock = self.sock
        if sock is None:
            return False
        p = select.poll()
        p.register(sock.fileno(), select.POLLIN | select.POLLRDHUP)
        if not p.poll(int(grace * 1000)):
            return False
        try:
            return sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    # -- teardown ----------------------------------------------------------------------------
    def stop(self, error: BaseException) -> None:
        """The channel broke: fail the eager sends still queued, drop the queued work, and
        move the queue pairs to the error state, so no late write lands in a buffer the user
        got back with an error."""
        for item in self.outbox:
            if isinstance(item, ControlMessage) and item.req is not None:
                item.req.fail(error)
        self.outbox.clear()
        self.writes.clear()
        if not self.qps:
            return
        from pyverbs.qp import QPAttr

        for qp in self.qps:
            try:
                attr = QPAttr()
                attr.qp_state = E.IBV_QPS_ERR
                qp.modify(attr, E.IBV_QP_STATE)
            except Exception:   # noqa: BLE001 - already in error, or gone
                pass

    def drain_sends(self, seconds: float) -> None:
        """Before destroying the queue pairs: let sent messages reach the peer (an eager send
        completes when copied; its bytes may still be in the send queue)."""
        deadline = time.monotonic() + seconds
        channel = self.channel
        # unsignaled sends at the tail are confirmed by a signaled write behind them, but
        # only while the peer's queue pairs are there to acknowledge it: a peer closes its
        # setup socket before its queue pairs, and one already gone got what it waited for
        # (else a write into its destroyed queue pairs would wait out the retries)
        tail = bool(self.qps) and not self.peer_exited(0.0)
        while (self.qps and channel.broken is None and time.monotonic() < deadline
               and (self.outbox or self.writes or (tail and self._unsignaled) or self._covers
                    or any(f < SQ_DEPTH for f in self.sq_free[1:]))):
            if tail:
                self.signal_tail()
            if not channel.progress():
                time.sleep(0.0005)

    def registered_bytes(self) -> int:
        """Bytes of the eager ring and send slots registered for this peer (0 until the
        queue pairs are made)."""
        return sum(a.nbytes for a in (self.ring, self._slots) if a is not None)

    def close(self) -> None:
        """Say farewell (if this rank leaves over a lost peer), close the setup socket, and
        release the queue pairs, the completion queue and the ring's registrations."""
        if self.sock is not None:
            lost = self.transport.farewell
            if lost is not None:
                try:
                    self.sock.send(FAREWELL.pack(FAREWELL_MAGIC, lost))
                except OSError:
                    pass
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None
        if self.armed and self.cq is not None:
            self.drain_events()
        for obj in [*self.qps, self._ring_mr, self._slots_mr, self.cq, self._cc]:
            if obj is None:
                continue
            try:
                obj.close()
            except Exception:   # noqa: BLE001 - teardown must not fail
                pass
        self.qps = []
