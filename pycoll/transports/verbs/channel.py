"""InfiniBand verbs transport (pyverbs): RC queue pairs per peer, eager and rendezvous.

Each peer pair has one control queue pair and ``PYCOLL_IB_QPS_PER_PEER`` data queue pairs
(RC, reliable and in order), created on first use (lazily, like the tcp channels), all
completing into one completion queue per channel whose completion-channel descriptor the
progress engine blocks on when idle (it polls while busy).

Protocols, chosen by message size (AR-gRPC's adaptive protocols, MPI's eager/rendezvous):

* **eager** (``nbytes <= PYCOLL_IB_EAGER_MAX``): the message is copied behind a header into a
  registered send slot and SENT into one of the receiver's pre-posted, registered ring
  buffers; the receiver copies it out and re-posts the buffer. Tiny messages go *inline*
  (the adapter copies them at post time: no slot held). Flow control is by credits: the
  sender may have at most as many messages outstanding as the receiver has ring buffers;
  the receiver returns credits by RDMA-writing its running count of re-posted buffers into
  a word of the sender's memory (no receive consumed, so credits can never deadlock), and a
  sender without credits waits, never overruns.
* **rendezvous** (larger): the sender SENDs a ready-to-send notice (tag, size); when it
  matches a posted receive, the receiver registers the user's buffer (registration cache),
  posts one receive per data queue pair it expects data on, and answers clear-to-send with
  the buffer's address and rkey; the sender RDMA-writes the user's bytes straight into it,
  striped over the data queue pairs, the last write on each with immediate data naming the
  receive (Gloo's ibverbs pair: write-with-immediate as the completion notice). Zero copy at
  both ends. Algorithms pipeline by splitting large tensors into segments, each its own
  message, so the first segments are reduced while later ones arrive.
* **put** (one-sided, ``Capabilities.one_sided``): an RDMA write into a region the peer
  registered, followed on the same queue pair by a notice the peer's ``notifications()``
  yields (RC order: the bytes are in place before the notice arrives).

Setup and liveness use a TCP socket per pair (the same dial and job-membership handshake as
the tcp transport, ``wireup``): it carries the queue-pair addresses (GID/LID, QPNs, PSN,
credit word) and then nothing but, when a rank leaves over a lost peer, a farewell. Its
closing is how a dead peer is noticed while this rank only waits to receive (an RDMA send to
a dead peer fails on its own: retry count exceeded). Error completions (retries exceeded,
remote access error, flushed work) break the channel with ``PeerLost``/``TransportError``
naming the peer; the communicator adds the collective and its call number.
"""
from __future__ import annotations

import os
import secrets
import select
import socket
import struct
from collections import deque
from typing import Any

import numpy as np

from ... import debug
from ...envvars import env_int
from ...errors import TransportError
from ...buffers.memory import MemRef
from ..base import (ActiveSet, Capabilities, Channel, OpenContext, PeerInfo, Request, Transport,
                    peer_left_over, peer_lost, stripes)
from ..matching import TagMatcher
from ..wireup import Connector, ConnectorTransport
from ..netif import choose_bind_address
from .device import (E, Device, Registration, RegistrationCache, access_flags, connect_qp,
                     create_qp, exporter_range, probe)

#: a message between channels: kind, aux (rkey / notify), tag, nbytes, ident, address
HDR = struct.Struct("<IIqqqQ")
EAGER, RTS, CTS, PUT = 1, 2, 3, 4
#: queue-pair addresses exchanged over the setup socket
MAX_QPS = 8
INFO = struct.Struct(f"<8s40sHIIBIIQI{MAX_QPS}I")
INFO_MAGIC = b"PCVERBS1"
#: the only thing the setup socket carries after the exchange: "I leave because rank N died"
FAREWELL = struct.Struct("<8sq")
FAREWELL_MAGIC = b"PCLEAVE1"

# work request ids: kind << 48 | queue pair << 40 | index
WR_SLOT, WR_INLINE, WR_CREDIT, WR_RNDV, WR_PUT, WR_RING, WR_DATA, WR_PUTDATA = range(1, 9)
INDEX_MASK = (1 << 40) - 1

#: the default eager limit, measured (benchmarks/verbs_lab.sh, section 3): in the Soft-RoCE VM
#: eager beats rendezvous at every size up to 256 KiB (one round trip less; the copies are
#: cheap next to it), so the limit is set by memory instead: 16 ring buffers of 64 KiB per
#: peer and direction (2 MiB per peer with the send slots)
EAGER_MAX = 64 << 10
#: rendezvous writes: at most this many bytes per work request
CHUNK_BYTES = 1 << 20
SQ_DEPTH = 256
DATA_RQ_DEPTH = 128
INLINE_BYTES = 128

READY, EXCHANGING, CONNECTING = "ready", "exchanging", "connecting"


class RndvNotice:
    """A held ready-to-send: the bytes are still at the sender, waiting for a grant."""

    __slots__ = ("send_id",)

    def __init__(self, send_id: int) -> None:
        self.send_id = send_id


class VerbsChannel(Channel):
    """Messages to and from one peer over RC queue pairs (see the module docstring)."""

    transport: "VerbsTransport"

    def __init__(self, transport: "VerbsTransport", peer: int) -> None:
        self.transport = transport
        self.peer = peer
        self._active = transport._active.channels
        self._match = TagMatcher(peer)
        self._broken: BaseException | None = None
        self._state = CONNECTING
        self._sock: socket.socket | None = None
        self._info_in = bytearray()
        self._cq: Any = None
        self._cc: Any = None
        self.cc_fd = -1
        self._armed = False
        self._qps: list[Any] = []
        self._sq_free: list[int] = []
        self._rq_free: list[int] = []
        # eager rings and credits
        self._ring: np.ndarray | None = None
        self._ring_mr: Any = None
        self._slots: np.ndarray | None = None
        self._slots_mr: Any = None
        self._free_slots: list[int] = []
        self._peer_slots = 0
        self._sent = 0              # messages sent into the peer's ring
        self._consumed = 0          # ring buffers this side re-posted
        self._reported = 0          # ... of which the peer was told
        self._peer_credit: tuple[int, int] = (0, 0)   # (address, rkey) of our word there
        self._eager_max = transport.eager_max
        self._stride = HDR.size + self._eager_max     # of a ring buffer and a send slot
        # work
        self._outbox: deque[tuple] = deque()          # control messages and put writes
        self._writes: deque[tuple] = deque()          # rendezvous writes waiting for room
        self._rndv_sends: dict[int, tuple[Request, int]] = {}   # send id -> (req, WRs left)
        self._rndv_recvs: dict[int, list] = {}        # recv id -> [req, notices left, reg]
        self._grants: deque[tuple[Request, int]] = deque()      # waiting for data RQ room
        self._puts: dict[int, Request] = {}
        self._next_id = 1
        self._held_regs: dict[int, Registration] = {}  # registrations of sends and puts
        self._slot_of_put: dict[int, int | None] = {}   # put id -> send slot of its notice

    # -- setup -----------------------------------------------------------------------------
    #: one setup socket per pair (it carries no data, so striping over several buys nothing)
    streams = 1

    def attach(self, sock: socket.socket, stream: int = 0) -> None:
        """The setup socket is up (dialed or accepted): create the queue pairs, post the
        ring, and send this side's addresses; the peer's complete the connection."""
        sock.setblocking(False)
        self._sock = sock
        self._active[self.peer] = self
        try:
            info = self._create()
            sock.send(info)
        except Exception as e:   # noqa: BLE001 - any device failure breaks this pair only
            self._break(TransportError(f"verbs: cannot set up queue pairs to peer rank "
                                       f"{self.peer}: {e}", peer=self.peer))
            return
        self._state = EXCHANGING
        self.transport.exchanging += 1

    def _create(self) -> bytes:
        from pyverbs.cq import CQ  # type: ignore[import-not-found]

        t = self.transport
        dev = t.device
        nq = 1 + t.qps_per_peer
        self._cc, self.cc_fd = dev.comp_channel()
        depth = nq * SQ_DEPTH + t.ring_slots + t.qps_per_peer * DATA_RQ_DEPTH + 16
        self._cq = CQ(dev.ctx, depth, None, self._cc, 0)
        for i in range(nq):
            rq = t.ring_slots if i == 0 else DATA_RQ_DEPTH
            qp, inline = create_qp(dev, self._cq, SQ_DEPTH, rq, INLINE_BYTES)
            t.inline = min(t.inline, inline)
            self._qps.append(qp)
            self._sq_free.append(SQ_DEPTH)
            self._rq_free.append(rq)
        self._ring = np.zeros(t.ring_slots * self._stride, dtype=np.uint8)
        self._ring_mr = t.register_own(self._ring)
        self._slots = np.zeros(t.ring_slots * self._stride, dtype=np.uint8)
        self._slots_mr = t.register_own(self._slots)
        self._free_slots = list(range(t.ring_slots - 1, -1, -1))
        for i in range(t.ring_slots):
            self._post_ring(i)
        self._psn = secrets.randbelow(1 << 24)
        qpns = [qp.qp_num for qp in self._qps] + [0] * (MAX_QPS - nq)
        ch = dev.choice
        return INFO.pack(INFO_MAGIC, ch.gid.encode(), ch.lid, self._psn, t.ring_slots, nq,
                         self._eager_max, t.credit_mr.rkey,
                         t.credit_addr + 8 * self.peer, ch.mtu, *qpns)

    def _finish_exchange(self) -> bool:
        """Read the peer's addresses; once complete, bring every queue pair to RTS."""
        try:
            chunk = self._sock.recv(INFO.size - len(self._info_in))  # type: ignore[union-attr]
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as e:
            self._break(peer_lost(self.peer, f"setup connection failed: {e}"))
            return True
        if not chunk:
            self._break(peer_lost(self.peer, "it closed the setup connection"))
            return True
        self._info_in += chunk
        if len(self._info_in) < INFO.size:
            return True
        fields = INFO.unpack(bytes(self._info_in))
        magic, gid, lid, psn, slots, nq, eager_max, rkey, credit_addr, mtu = fields[:10]
        qpns = fields[10:10 + nq]
        if (magic != INFO_MAGIC or nq != len(self._qps) or not 0 < slots < 1 << 20
                or eager_max != self._eager_max):
            self._break(TransportError(
                f"verbs: peer rank {self.peer} sent queue-pair addresses this rank cannot use "
                f"({nq} queue pairs and eager limit {eager_max} where this rank has "
                f"{len(self._qps)} and {self._eager_max}): set PYCOLL_IB_QPS_PER_PEER and "
                "PYCOLL_IB_EAGER_MAX alike on every rank", peer=self.peer))
            return True
        try:
            t = self.transport
            for qp, qpn in zip(self._qps, qpns):
                connect_qp(qp, t.device.choice, gid.rstrip(b"\0").decode(), lid, qpn, psn,
                           self._psn, min(mtu, t.device.choice.mtu), t.ack_timeout, t.retry_cnt)
        except Exception as e:   # noqa: BLE001
            self._break(TransportError(f"verbs: cannot connect queue pairs to peer rank "
                                       f"{self.peer}: {e}", peer=self.peer))
            return True
        self._peer_slots = slots
        self._peer_credit = (credit_addr, rkey)
        self._state = READY
        self.transport.exchanging -= 1
        debug.logger.info("verbs: queue pairs to rank %d ready (%d data QPs, eager <= %d B)",
                          self.peer, self._ndata, self._eager_max)
        return True

    @property
    def _ndata(self) -> int:
        """Data queue pairs (every queue pair but the control one)."""
        return len(self._qps) - 1

    @property
    def connected(self) -> bool:
        return self._state == READY

    # -- posting ---------------------------------------------------------------------------
    def _post_ring(self, i: int) -> None:
        from pyverbs.wr import SGE, RecvWR  # type: ignore[import-not-found]

        sge = SGE(self._ring_mr.buf + i * self._stride, self._stride, self._ring_mr.lkey)
        self._qps[0].post_recv(RecvWR(wr_id=(WR_RING << 48) | i, num_sge=1, sg=[sge]))

    def _post_send(self, q: int, kind: int, index: int, opcode: int, addr: int, length: int,
                   lkey: int, imm: int = 0, remote: tuple[int, int] | None = None,
                   inline: bool = False) -> None:
        from pyverbs.wr import SGE, SendWR  # type: ignore[import-not-found]

        flags = E.IBV_SEND_SIGNALED | (E.IBV_SEND_INLINE if inline else 0)
        wr = SendWR(wr_id=(kind << 48) | (q << 40) | index, opcode=opcode, num_sge=1,
                    sg=[SGE(addr, length, lkey)], send_flags=flags, imm_data=imm)
        if remote is not None:
            wr.set_wr_rdma(remote[1], remote[0])
        self._qps[q].post_send(wr)
        self._sq_free[q] -= 1

    def _send_control(self, kind: int, aux: int, tag: int, nbytes: int, ident: int,
                      addr: int, payload: memoryview | None, wr_kind: int, wr_index: int) -> bool:
        """Post one message into the peer's ring if a credit, a slot and send-queue room are
        there; False to keep it queued."""
        if self._sent - self._credits_back() >= self._peer_slots or self._sq_free[0] <= 1:
            return False
        n = HDR.size + (payload.nbytes if payload is not None else 0)
        inline = n <= self.transport.inline
        if not self._free_slots:
            return False
        slots = self._slots
        assert slots is not None
        index = self._free_slots.pop()
        off = index * self._stride
        HDR.pack_into(slots.data, off, kind, aux, tag, nbytes, ident, addr)
        if payload is not None and payload.nbytes:
            slots[off + HDR.size: off + n] = np.frombuffer(payload, dtype=np.uint8)
        if inline:             # copied at post time: the slot is free again at once
            self._free_slots.append(index)
            if wr_kind == WR_SLOT:
                wr_kind = WR_INLINE
        self._post_send(0, wr_kind, index if wr_kind in (WR_SLOT, WR_INLINE) else wr_index,
                        E.IBV_WR_SEND, self._slots_mr.buf + off, n, self._slots_mr.lkey,
                        inline=inline)
        if wr_kind not in (WR_SLOT, WR_INLINE):
            self._slot_of_put[wr_index] = None if inline else index
        self._sent += 1
        return True

    def _credits_back(self) -> int:
        return int(self.transport.credit_words[self.peer])

    def _flush_outbox(self) -> bool:
        moved = False
        out = self._outbox
        while out:
            item = out[0]
            if item[0] == "write":          # a put's data, ahead of its notice
                _, remote, addr, length, lkey, put_id = item
                if self._sq_free[0] <= 1:
                    break
                self._post_send(0, WR_PUTDATA, put_id, E.IBV_WR_RDMA_WRITE, addr, length, lkey,
                                remote=remote)
            else:
                _, kind, aux, tag, nbytes, ident, addr, payload, req, wr_kind, wr_index = item
                if not self._send_control(kind, aux, tag, nbytes, ident, addr, payload,
                                          wr_kind, wr_index):
                    break
                if req is not None:         # eager: complete once copied
                    req.complete()
            out.popleft()
            moved = True
        return moved

    def _report_credits(self) -> None:
        """Tell the peer how many ring buffers were re-posted (an RDMA write of a word)."""
        if self._consumed - self._reported < max(1, self.transport.ring_slots // 4):
            return
        if self._sq_free[0] <= 1:
            return
        t = self.transport
        word = t.credit_out
        word[self.peer] = self._consumed
        self._post_send(0, WR_CREDIT, 0, E.IBV_WR_RDMA_WRITE, t.credit_out_addr + 8 * self.peer,
                        8, t.credit_out_mr.lkey, remote=self._peer_credit,
                        inline=t.inline >= 8)
        self._reported = self._consumed

    # -- sending ---------------------------------------------------------------------------
    def isend(self, mem: MemRef, tag: int = 0) -> Request:
        req = Request(self, mem, tag, "send")
        if self._broken is not None:
            req.fail(self._broken)
            return req
        if mem.nbytes <= self._eager_max:
            self._outbox.append(("send", EAGER, 0, tag, mem.nbytes, 0, 0, req.view, req,
                                 WR_SLOT, 0))
        else:
            send_id = self._new_id()
            self._rndv_sends[send_id] = (req, -1)
            self._outbox.append(("send", RTS, 0, tag, mem.nbytes, send_id, 0, None, None,
                                 WR_SLOT, 0))
        self._active[self.peer] = self
        if self._state == READY:
            self._flush_outbox()
        return req

    def _new_id(self) -> int:
        ident = self._next_id
        self._next_id = (ident % 0x3FFFFFFF) + 1
        return ident

    def _clear_to_send(self, send_id: int, recv_id: int, addr: int, rkey: int,
                       nbytes: int) -> None:
        found = self._rndv_sends.get(send_id)
        if found is None or found[0].nbytes != nbytes:
            self._break(TransportError(f"verbs: peer rank {self.peer} granted an unknown "
                                       f"message ({send_id})", peer=self.peer))
            return
        req = found[0]
        try:
            reg, src = self.transport.cache.register(req.view)
        except TransportError as e:
            self._break(e)
            return
        self._held_regs[send_id] = reg
        wrs = []
        for q, off, length in stripes(nbytes, self._ndata):
            pos, end = off, off + length
            while pos < end:
                n = min(CHUNK_BYTES, end - pos)
                wrs.append((q + 1, src + pos, n, reg.lkey, (addr + pos, rkey),
                            recv_id if pos + n == end else None, send_id))
                pos += n
        # interleave the stripes so every queue pair starts at once
        by_qp: dict[int, deque] = {}
        for w in wrs:
            by_qp.setdefault(w[0], deque()).append(w)
        while by_qp:
            for q in list(by_qp):
                self._writes.append(by_qp[q].popleft())
                if not by_qp[q]:
                    del by_qp[q]
        self._rndv_sends[send_id] = (req, len(wrs))
        self._post_writes()

    def _post_writes(self) -> bool:
        moved = False
        writes = self._writes
        while writes:
            q, src, n, lkey, remote, imm, send_id = writes[0]
            if self._sq_free[q] <= 0:
                break       # that queue pair is full: keep order, wait for completions
            if imm is None:
                self._post_send(q, WR_RNDV, send_id, E.IBV_WR_RDMA_WRITE, src, n, lkey,
                                remote=remote)
            else:
                self._post_send(q, WR_RNDV, send_id, E.IBV_WR_RDMA_WRITE_WITH_IMM, src, n,
                                lkey, imm=imm, remote=remote)
            writes.popleft()
            moved = True
        return moved

    def put(self, src: MemRef, remote: dict[str, Any], offset: int, notify: int) -> Request:
        req = Request(self, src, notify, "put")
        if self._broken is not None:
            req.fail(self._broken)
            return req
        try:
            base, rkey, size = int(remote["addr"]), int(remote["rkey"]), int(remote["nbytes"])
        except (KeyError, TypeError, ValueError):
            base, rkey, size = 0, 0, -1
        if offset < 0 or offset + src.nbytes > size or not 0 <= notify < 1 << 62:
            req.fail(TransportError(
                f"verbs: put of {src.nbytes} bytes at offset {offset} does not fit peer rank "
                f"{self.peer}'s registered region {remote}", peer=self.peer))
            return req
        put_id = self._new_id()
        self._puts[put_id] = req
        if src.nbytes:
            try:
                reg, at = self.transport.cache.register(req.view)
            except TransportError as e:
                del self._puts[put_id]
                req.fail(e)
                return req
            self._held_regs[-put_id] = reg
            pos = 0
            while pos < src.nbytes:
                n = min(CHUNK_BYTES, src.nbytes - pos)
                self._outbox.append(("write", (base + offset + pos, rkey), at + pos, n,
                                     reg.lkey, put_id))
                pos += n
        self._outbox.append(("send", PUT, 0, notify, 0, put_id, 0, None, None, WR_PUT, put_id))
        self._active[self.peer] = self
        if self._state == READY:
            self._flush_outbox()
        return req

    # -- receiving -------------------------------------------------------------------------
    def irecv(self, mem: MemRef, tag: int = 0) -> Request:
        req = Request(self, mem, tag, "recv")
        self._post_receive(req)
        return req

    def _deliver_held(self, req: Request, nbytes: int, payload: Any) -> None:
        if not isinstance(payload, RndvNotice):
            super()._deliver_held(req, nbytes, payload)
        elif self._size_ok(req, nbytes):
            if self._broken is not None:      # its bytes are still at the (gone) sender
                req.fail(self._broken)
                return
            self._grant(req, payload.send_id)
            self._active[self.peer] = self

    def _grant(self, req: Request, send_id: int) -> None:
        """Expose the receive buffer to the sender: data receives first, then clear-to-send."""
        from pyverbs.wr import SGE, RecvWR  # type: ignore[import-not-found]

        plan = stripes(req.nbytes, self._ndata)
        if any(self._rq_free[q + 1] <= 0 for q, _, _ in plan):
            self._grants.append((req, send_id))
            return
        try:
            reg, at = self.transport.cache.register(req.view)
        except TransportError as e:
            req.fail(e)
            self._break(e)          # the sender waits for this grant: the pair is out of step
            return
        recv_id = self._new_id()
        scratch = self.transport.scratch_mr
        for q, _, _ in plan:
            self._qps[q + 1].post_recv(RecvWR(wr_id=(WR_DATA << 48) | ((q + 1) << 40) | recv_id,
                                              num_sge=1, sg=[SGE(scratch.buf, 0, scratch.lkey)]))
            self._rq_free[q + 1] -= 1
        self._rndv_recvs[recv_id] = [req, len(plan), reg]
        self._outbox.append(("send", CTS, reg.rkey, recv_id, req.nbytes, send_id, at, None,
                             None, WR_SLOT, 0))

    def _on_message(self, i: int, length: int) -> None:
        """A message landed in ring buffer ``i``."""
        ring = self._ring
        assert ring is not None
        off = i * self._stride
        if length < HDR.size:
            self._break(TransportError(f"verbs: peer rank {self.peer} sent a malformed message "
                                       f"({length} bytes)", peer=self.peer))
            return
        kind, aux, tag, nbytes, ident, addr = HDR.unpack_from(ring.data, off)
        match = self._match
        if kind == EAGER:
            if nbytes != length - HDR.size:
                self._break(TransportError(f"verbs: peer rank {self.peer} sent a malformed "
                                           f"message ({nbytes} bytes announced, {length} came)",
                                           peer=self.peer))
                return
            body = ring[off + HDR.size: off + HDR.size + nbytes]
            req = match.take(tag)
            if req is None:
                match.hold(tag, nbytes, body.tobytes())
            elif self._size_ok(req, nbytes):
                if nbytes:
                    np.frombuffer(req.view, dtype=np.uint8)[:] = body
                req.complete()
        elif kind == RTS and nbytes > 0:
            req = match.take(tag)
            if req is None:
                match.hold(tag, nbytes, RndvNotice(ident))
            elif self._size_ok(req, nbytes):
                self._grant(req, ident)
        elif kind == CTS:
            self._clear_to_send(ident, tag, addr, aux, nbytes)
        elif kind == PUT:
            self.transport.notices.append((self.peer, tag))
        else:
            self._break(TransportError(f"verbs: peer rank {self.peer} sent a message of unknown "
                                       f"kind {kind}", peer=self.peer))

    # -- completions -------------------------------------------------------------------------
    def _poll(self) -> bool:
        moved = False
        cq = self._cq
        while True:
            n, wcs = cq.poll(32)
            if not n:
                return moved
            moved = True
            for wc in wcs:
                self._complete(wc)
                if self._broken is not None:
                    return True
            if n < 32:
                return moved

    def _complete(self, wc: Any) -> None:
        wr = wc.wr_id
        kind, q, index = wr >> 48, (wr >> 40) & 0xFF, wr & INDEX_MASK
        if wc.status != E.IBV_WC_SUCCESS:
            self._on_error(wc, kind)
            return
        if kind == WR_RING:
            self._on_message(index, wc.byte_len)
            if self._broken is None:
                self._post_ring(index)
                self._consumed += 1
            return
        if kind == WR_DATA:
            self._rq_free[q] += 1
            entry = self._rndv_recvs.get(wc.imm_data)
            if entry is None:
                self._break(TransportError(f"verbs: peer rank {self.peer} wrote data for an "
                                           f"unknown receive ({wc.imm_data})", peer=self.peer))
                return
            entry[1] -= 1
            if entry[1] == 0:
                del self._rndv_recvs[wc.imm_data]
                self.transport.cache.release(entry[2])
                entry[0].complete()
            return
        self._sq_free[q] += 1
        if kind == WR_SLOT:
            self._free_slots.append(index)
        elif kind == WR_RNDV:
            req, left = self._rndv_sends.get(index, (None, 0))
            if req is None:
                return
            if left <= 1:
                del self._rndv_sends[index]
                self._release_held(index)
                req.complete()
            else:
                self._rndv_sends[index] = (req, left - 1)
        elif kind == WR_PUT:
            slot = self._slot_of_put.pop(index, None)
            if slot is not None:
                self._free_slots.append(slot)
            req = self._puts.pop(index, None)
            self._release_held(-index)
            if req is not None:
                req.complete()

    def _on_error(self, wc: Any, kind: int) -> None:
        if self._broken is not None:
            return
        status = wc.status
        if self._peer_exited():
            # a dead process's queue pairs and memory go first, its sockets a moment later:
            # an access error or a flush then means "the peer is gone", and says so
            err: BaseException = peer_lost(self.peer, "its process exited while RDMA "
                                           f"traffic to it was in flight (status {status})")
        elif status in (E.IBV_WC_RETRY_EXC_ERR, E.IBV_WC_RNR_RETRY_EXC_ERR):
            err = peer_lost(self.peer, "it stopped acknowledging RDMA traffic "
                            f"(retry count exceeded, status {status})")
        elif status == E.IBV_WC_WR_FLUSH_ERR:
            err = peer_lost(self.peer, "the queue pair to it went into the error state")
        else:
            what = {getattr(E, "IBV_WC_REM_ACCESS_ERR", -1): "remote access error",
                    getattr(E, "IBV_WC_LOC_PROT_ERR", -1): "local protection error",
                    getattr(E, "IBV_WC_REM_INV_REQ_ERR", -1): "remote invalid request",
                    getattr(E, "IBV_WC_LOC_LEN_ERR", -1): "local length error",
                    }.get(status, f"completion status {status}")
            err = TransportError(f"verbs: RDMA to peer rank {self.peer} failed: {what} "
                                 f"(vendor error {wc.vendor_err})", peer=self.peer)
        self._break(err)

    def _peer_exited(self, grace: float = 1.0) -> bool:
        """Whether the peer's setup socket closes within ``grace`` seconds (its process
        exited); used only on an error completion, to name the cause."""
        sock = self._sock
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

    # -- progress, liveness, teardown ------------------------------------------------------
    def progress(self) -> bool:
        if self._broken is not None:
            return False
        if self._state != READY:
            if self._state == EXCHANGING and self._broken is None:
                moved = self._finish_exchange()
                if self._state == READY:
                    self.progress()
                return moved
            return False
        moved = False
        if self._armed:
            self._drain_events()
        if self._poll():
            moved = True
        if self._broken is not None:
            return True
        if self._grants and all(f > 0 for f in self._rq_free[1:]):
            for _ in range(len(self._grants)):
                self._grant(*self._grants.popleft())
        if self._outbox and self._flush_outbox():
            moved = True
        if self._writes and self._post_writes():
            moved = True
        self._report_credits()
        return moved

    def _drain_events(self) -> None:
        got = 0
        while True:
            try:
                self._cc.get_cq_event(self._cq)
            except Exception:   # noqa: BLE001 - EAGAIN: no (more) event
                break
            got += 1
        if got:
            self._cq.ack_events(got)
            self._armed = False

    def arm(self) -> bool:
        """Before the engine blocks: ask for an event on the next completion; True if a
        completion slipped in meanwhile (then do not block)."""
        if self._state != READY or self._broken is not None:
            return False
        if not self._armed:
            self._cq.req_notify()
            self._armed = True
            if self._poll():
                return True
        # a returned credit is an RDMA write into our memory: no completion, no event. A
        # sender waiting for credits polls instead of blocking
        return bool(self._outbox) and self._outbox[0][0] == "send" and \
            self._sent - self._credits_back() >= self._peer_slots

    def busy(self) -> bool:
        if self._broken is not None:
            return False
        return bool(self._outbox or self._match.posted or self._rndv_sends or self._rndv_recvs
                    or self._writes or self._grants or self._puts or self._state == EXCHANGING
                    or any(f < SQ_DEPTH for f in self._sq_free))

    def check_alive(self) -> None:
        if self._broken is None and self._sock is not None:
            self._read_sentinel()
        if self._broken is not None:
            raise self._broken

    def _read_sentinel(self) -> None:
        """The setup socket after the exchange: closed means the peer process is gone; a
        farewell names the rank it left over."""
        if self._state != READY:
            return
        try:
            data = self._sock.recv(FAREWELL.size, socket.MSG_PEEK)  # type: ignore[union-attr]
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._break(peer_lost(self.peer, f"its setup connection failed ({e})"))
            return
        if not data:
            self._poll()      # deliver what arrived before it left
            self._break(peer_lost(self.peer, "its process exited or closed the communicator "
                                  "(setup connection closed)"))
        elif len(data) == FAREWELL.size:
            magic, lost = FAREWELL.unpack(data)
            if magic == FAREWELL_MAGIC and 0 <= lost < self.transport.size:
                self._poll()
                self._break(peer_left_over(self.peer, lost))
            else:
                self._break(TransportError(f"verbs: peer rank {self.peer} sent bytes on the "
                                           "setup connection", peer=self.peer))

    def _break(self, error: BaseException) -> None:
        if self._broken is None:
            self._broken = error
            if self._state == EXCHANGING:
                self.transport.exchanging -= 1
                self._state = CONNECTING
        self._match.fail_all(error)
        for req in [i[8] for i in self._outbox if i[0] == "send" and i[8] is not None]:
            req.fail(error)
        for req, _ in list(self._rndv_sends.values()):
            req.fail(error)
        for entry in list(self._rndv_recvs.values()):
            entry[0].fail(error)
            self.transport.cache.release(entry[2])
        for ident in list(self._held_regs):
            self._release_held(ident)
        for req, _ in self._grants:
            req.fail(error)
        for req in list(self._puts.values()):
            req.fail(error)
        self._outbox.clear()
        self._writes.clear()
        self._stop_qps()
        self._rndv_sends.clear()
        self._rndv_recvs.clear()
        self._grants.clear()
        self._puts.clear()

    def _release_held(self, ident: int) -> None:
        reg = self._held_regs.pop(ident, None)
        if reg is not None:
            self.transport.cache.release(reg)

    def _stop_qps(self) -> None:
        """A broken pair takes no more RDMA: move its queue pairs to the error state, so no
        late write lands in a buffer the user got back with an error."""
        if not self._qps:
            return
        from pyverbs.qp import QPAttr  # type: ignore[import-not-found]

        for qp in self._qps:
            try:
                attr = QPAttr()
                attr.qp_state = E.IBV_QPS_ERR
                qp.modify(attr, E.IBV_QP_STATE)
            except Exception:   # noqa: BLE001 - already in error, or gone
                pass

    def _drain_sends(self, seconds: float) -> None:
        """Before destroying the queue pairs: let sent messages reach the peer (an eager send
        completes when copied; its bytes may still be in the send queue)."""
        import time

        deadline = time.monotonic() + seconds
        while (self._qps and self._broken is None and time.monotonic() < deadline
               and (self._outbox or self._writes or any(
                   f < SQ_DEPTH for f in self._sq_free))):
            if not self.progress():
                time.sleep(0.0005)

    def close(self) -> None:
        if self._state == READY and self._broken is None:
            self._drain_sends(2.0)
        self._break(TransportError(f"channel to peer rank {self.peer} was closed",
                                   peer=self.peer))
        if self._sock is not None:
            lost = self.transport.farewell
            if lost is not None:
                try:
                    self._sock.send(FAREWELL.pack(FAREWELL_MAGIC, lost))
                except OSError:
                    pass
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None
        if self._armed and self._cq is not None:
            self._drain_events()
        for obj in [*self._qps, self._ring_mr, self._slots_mr, self._cq, self._cc]:
            if obj is None:
                continue
            try:
                obj.close()
            except Exception:   # noqa: BLE001 - teardown must not fail
                pass
        self._qps = []



class VerbsTransport(ConnectorTransport, Transport):
    """RDMA over InfiniBand or RoCE through pyverbs (see the module docstring)."""

    name = "verbs"
    capabilities = Capabilities("verbs", latency_us=3.0, bandwidth_gbps=12.0,
                                same_host_only=False, one_sided=True, segment_bytes=1 << 20)

    def __init__(self, ctx: OpenContext) -> None:
        self.rank = ctx.rank
        self.size = ctx.size
        self._token = ctx.token
        self.eager_max = env_int("PYCOLL_IB_EAGER_MAX", EAGER_MAX, minimum=0)
        self.qps_per_peer = env_int("PYCOLL_IB_QPS_PER_PEER", 1, minimum=1)
        if self.qps_per_peer > MAX_QPS - 1:
            raise TransportError(f"PYCOLL_IB_QPS_PER_PEER={self.qps_per_peer}: at most "
                                 f"{MAX_QPS - 1}")
        self.ring_slots = env_int("PYCOLL_IB_EAGER_SLOTS", 16, minimum=2)   # and send slots
        self.ack_timeout = env_int("PYCOLL_IB_TIMEOUT", 14, minimum=1)
        self.retry_cnt = min(7, env_int("PYCOLL_IB_RETRY_CNT", 7, minimum=1))
        self.inline = INLINE_BYTES
        self.device = Device()
        self.cache = RegistrationCache(self.device.pd)
        # credit words: the peers write theirs into ``credit_words`` (one per rank); this
        # rank writes from ``credit_out``
        self.credit_words = np.zeros(self.size, dtype=np.uint64)
        self.credit_mr = self.register_own(self.credit_words)
        self.credit_addr = self.credit_mr.buf
        self.credit_out = np.zeros(self.size, dtype=np.uint64)
        self.credit_out_mr = self.register_own(self.credit_out)
        self.credit_out_addr = self.credit_out_mr.buf
        self._scratch = np.zeros(64, dtype=np.uint8)
        self.scratch_mr = self.register_own(self._scratch)
        self.notices: list[tuple[int, int]] = []
        self._exposed: dict[int, tuple[Any, MemRef]] = {}
        host, family = choose_bind_address(ctx.master_addr)
        self._setup = Connector(self, ctx.size, ctx.accepts, host, family,
                                lambda peer, streams: VerbsChannel(self, peer))
        self._channels: dict[int, VerbsChannel] = self._setup.channels
        self._active = ActiveSet()
        self.exchanging = 0
        self._kick_fd = os.eventfd(0, os.EFD_NONBLOCK)
        self._kicked = False

    def register_own(self, array: np.ndarray) -> Any:
        """Register memory this transport owns (rings, slots, credit words)."""
        from pyverbs.mr import MR  # type: ignore[import-not-found]

        return MR(self.device.pd, array.nbytes, access_flags(True), address=array.ctypes.data)

    # -- registry ------------------------------------------------------------------------
    @classmethod
    def probe(cls) -> tuple[dict[str, Any] | None, str]:
        return probe()

    @staticmethod
    def can_connect(a: PeerInfo, b: PeerInfo) -> bool:
        return a.records["verbs"]["fabric"] == b.records["verbs"]["fabric"]

    # -- progress --------------------------------------------------------------------------
    def progress(self) -> bool:
        moved = self._setup.progress(self._active.channels.values())
        if self._kicked:
            self._kicked = False
            try:
                os.eventfd_read(self._kick_fd)
            except BlockingIOError:
                pass
        if self._active.channels:
            moved = self._active.progress() or moved
        self.setup_pending = self._setup.pending or bool(self.exchanging)
        return moved

    def wait_fds(self) -> list[tuple[int, int]] | None:
        fds = self._setup.fds()
        slipped = False
        for ch in self._working():
            if ch._sock is not None:
                fds.append((ch._sock.fileno(), select.EPOLLIN))
            if ch._state == READY and ch._broken is None:
                slipped = ch.arm() or slipped
                fds.append((ch.cc_fd, select.EPOLLIN))
        if slipped and not self._kicked:      # a completion came while arming: wake at once
            os.eventfd_write(self._kick_fd, 1)
            self._kicked = True
        fds.append((self._kick_fd, select.EPOLLIN))
        return fds

    def _working(self) -> list[VerbsChannel]:
        return list(self._active.channels.values())  # type: ignore[arg-type]

    # -- one-sided ---------------------------------------------------------------------------
    def register(self, mem: MemRef) -> dict[str, Any]:
        from pyverbs.mr import MR  # type: ignore[import-not-found]

        _owner, _base, _n, at = exporter_range(mem._view)
        mr = MR(self.device.pd, max(mem.nbytes, 1), access_flags(True), address=at or None)
        self._exposed[mr.rkey] = (mr, mem)
        return {"addr": at, "rkey": mr.rkey, "nbytes": mem.nbytes}

    def deregister(self, record: dict[str, Any]) -> None:
        found = self._exposed.pop(int(record["rkey"]), None)
        if found is not None:
            found[0].close()

    def notifications(self) -> list[tuple[int, int]]:
        for ch in self._channels.values():
            if ch._state == READY or ch._state == EXCHANGING:
                ch.progress()
        notices, self.notices = self.notices, []
        return notices

    def stats(self) -> dict[str, Any]:
        """Registration cache counters (the bench reports them)."""
        return self.cache.stats()

    def close(self) -> None:
        self._setup.close()
        self._active.channels.clear()
        for mr, _ in self._exposed.values():
            try:
                mr.close()
            except Exception:   # noqa: BLE001
                pass
        self._exposed.clear()
        self.cache.close()
        for mr in (self.credit_mr, self.credit_out_mr, self.scratch_mr):
            try:
                mr.close()
            except Exception:   # noqa: BLE001
                pass
        os.close(self._kick_fd)
        self.device.close()
