"""The verbs channel: messages to one peer over RC queue pairs, eager and rendezvous.

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

The queue pairs, rings, credits and the setup socket are the channel's ``QueuePairs``
(``queue_pairs.py``); this module is the protocol on top and the dispatch of completions.
Setup and liveness use a TCP socket per pair (the same dial and job-membership handshake as
the tcp transport, ``wireup``): it carries the queue-pair addresses and then nothing but,
when a rank leaves over a lost peer, a farewell. Its closing is how a dead peer is noticed
while this rank only waits to receive (an RDMA send to a dead peer fails on its own: retry
count exceeded). Error completions (retries exceeded,
remote access error, flushed work) break the channel with ``PeerLost``/``TransportError``
naming the peer; the communicator adds the collective and its call number.
"""
from __future__ import annotations

import socket
from collections import deque
from typing import Any

from ...buffers.memory import MemRef
from ...errors import TransportError
from ...tags import WINDOW_TAG
from ..base import Channel, Request, WindowProgress, peer_lost, stripes
from ..matching import TagMatcher
from ..tcp.window import serve_request
from ..windows import RemoteWindow
from .device import E, Registration
from .queue_pairs import EXCHANGING, QueuePairs, VerbsOwner
from .window import VerbsRemoteWindow, window_rdma_pieces
from .wire import (
    CHUNK_BYTES,
    CTS,
    EAGER,
    HDR,
    PUT,
    RTS,
    WR_DATA,
    WR_PUT,
    WR_RING,
    WR_RNDV,
    WR_WINDOW,
    ControlMessage,
    PutWrite,
    RndvWrite,
    wr_fields,
)


class ReadyToSend:
    """A ready-to-send held for a receive not yet posted: the bytes are still at the sender,
    waiting for a grant (clear-to-send)."""

    __slots__ = ("send_id",)

    def __init__(self, send_id: int) -> None:
        self.send_id = send_id


class VerbsChannel(Channel):
    """Messages to and from one peer over RC queue pairs (see the module docstring)."""

    transport: VerbsOwner  # type: ignore[assignment]

    def __init__(self, transport: VerbsOwner, peer: int) -> None:
        self.transport = transport
        self.peer = peer
        self._active = transport.active.channels
        self.matcher = TagMatcher(peer)
        self.broken: BaseException | None = None
        self.pairs = QueuePairs(transport, self)
        self._eager_max = transport.eager_max
        self._rndv_sends: dict[int, tuple[Request, int]] = {}   # send id -> (req, WRs left)
        self._rndv_recvs: dict[int, list] = {}        # recv id -> [req, notices left, reg]
        self._grants: deque[tuple[Request, int]] = deque()      # waiting for data RQ room
        self._puts: dict[int, Request] = {}
        self._window_ops: dict[int, list] = {}      # op id -> [req, pieces left, reg]
        self._next_id = 1
        self._held_regs: dict[int, Registration] = {}  # registrations of sends and puts

    # -- setup -----------------------------------------------------------------------------
    #: one setup socket per pair (it carries no data, so striping over several buys nothing)
    streams = 1

    def attach(self, sock: socket.socket, stream: int = 0) -> None:
        """The setup socket is up (dialed or accepted): create the queue pairs, post the
        ring, and send this side's addresses; the peer's complete the connection."""
        sock.setblocking(False)
        self._active[self.peer] = self
        self.pairs.start(sock)

    @property
    def ready(self) -> bool:
        return self.pairs.ready

    @property
    def _sock(self) -> socket.socket | None:
        """The setup socket (the queue pairs'; tests measure what it carried)."""
        return self.pairs.sock

    # -- sending ---------------------------------------------------------------------------
    def isend(self, mem: MemRef, tag: int = 0) -> Request:
        req = Request(self, mem, tag, "send")
        if self.broken is not None:
            req.fail(self.broken)
            return req
        pairs = self.pairs
        if mem.nbytes <= self._eager_max:
            pairs.outbox.append(ControlMessage(EAGER, 0, tag, mem.nbytes, 0, 0, req.view, req))
        else:
            send_id = self._new_id()
            self._rndv_sends[send_id] = (req, -1)
            pairs.outbox.append(ControlMessage(RTS, 0, tag, mem.nbytes, send_id, 0))
        self._active[self.peer] = self
        if pairs.ready:
            pairs.flush_outbox()
        return req

    def _new_id(self) -> int:
        ident = self._next_id
        self._next_id = (ident % 0x3FFFFFFF) + 1
        return ident

    def _clear_to_send(self, send_id: int, recv_id: int, addr: int, rkey: int,
                       nbytes: int) -> None:
        found = self._rndv_sends.get(send_id)
        if found is None or found[0].nbytes != nbytes:
            self.break_with(TransportError(f"verbs: peer rank {self.peer} granted an unknown "
                                           f"message ({send_id})", peer=self.peer))
            return
        req = found[0]
        try:
            reg, src = self.transport.cache.register(req.view)
        except TransportError as e:
            self.break_with(e)
            return
        self._held_regs[send_id] = reg
        wrs = []
        for q, off, length in stripes(nbytes, self.pairs.ndata):
            pos, end = off, off + length
            while pos < end:
                n = min(CHUNK_BYTES, end - pos)
                wrs.append(RndvWrite(q + 1, src + pos, n, reg.lkey, (addr + pos, rkey),
                                     recv_id if pos + n == end else None, send_id))
                pos += n
        # interleave the stripes so every queue pair starts at once
        by_qp: dict[int, deque[RndvWrite]] = {}
        for w in wrs:
            by_qp.setdefault(w.qp, deque()).append(w)
        writes = self.pairs.writes
        while by_qp:
            for q in list(by_qp):
                writes.append(by_qp[q].popleft())
                if not by_qp[q]:
                    del by_qp[q]
        self._rndv_sends[send_id] = (req, len(wrs))
        self.pairs.post_writes()

    def put(self, src: MemRef, remote: dict[str, Any], offset: int, notify: int) -> Request:
        req = Request(self, src, notify, "put")
        if self.broken is not None:
            req.fail(self.broken)
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
        pairs = self.pairs
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
                pairs.outbox.append(PutWrite((base + offset + pos, rkey), at + pos, n,
                                             reg.lkey, put_id))
                pos += n
        pairs.outbox.append(ControlMessage(PUT, 0, notify, 0, put_id, 0, wr_kind=WR_PUT,
                                           wr_index=put_id))
        self._active[self.peer] = self
        if pairs.ready:
            pairs.flush_outbox()
        return req

    # -- windows (window.py) -----------------------------------------------------------------
    def attach_window(self, record: dict[str, Any], progress: WindowProgress) -> RemoteWindow:
        return VerbsRemoteWindow(self, record, progress, str(record.get("dtype", "")))

    def window_rdma(self, opcode: int, remote_addr: int, rkey: int, mem: MemRef,
                    add: int | None = None) -> Request:
        """One window put (RDMA WRITE) or get (RDMA READ) of ``mem``'s bytes at the peer's
        ``remote_addr``, or a signal (``add``: a fetch-and-add into the peer's 8-byte word,
        whose old value lands in ``mem``); the request completes when the adapter says every
        piece did."""
        req = Request(self, mem, 0, "window")
        if self.broken is not None:
            req.fail(self.broken)
            return req
        try:
            reg, at = self.transport.cache.register(req.view)
        except TransportError as e:
            req.fail(e)
            return req
        op_id = self._new_id()
        pieces = window_rdma_pieces(opcode, remote_addr, rkey, at, mem.nbytes, reg.lkey, op_id,
                                    add)
        self._window_ops[op_id] = [req, len(pieces), reg]
        self.pairs.outbox.extend(pieces)
        self._active[self.peer] = self
        if self.pairs.ready:
            self.pairs.flush_outbox()
        return req

    # -- receiving -------------------------------------------------------------------------
    def irecv(self, mem: MemRef, tag: int = 0) -> Request:
        req = self.recv_request(self, mem, tag, "recv")
        self._post_receive(req)
        return req

    def _deliver_held(self, req: Request, nbytes: int, payload: Any) -> None:
        if not isinstance(payload, ReadyToSend):
            super()._deliver_held(req, nbytes, payload)
        elif self._size_ok(req, nbytes):
            if self.broken is not None:      # its bytes are still at the (gone) sender
                req.fail(self.broken)
                return
            self._grant(req, payload.send_id)
            self._active[self.peer] = self

    def _grant(self, req: Request, send_id: int) -> None:
        """Expose the receive buffer to the sender: data receives first, then clear-to-send."""
        pairs = self.pairs
        plan = stripes(req.nbytes, pairs.ndata)
        if any(pairs.rq_free[q + 1] <= 0 for q, _, _ in plan):
            self._grants.append((req, send_id))
            return
        try:
            reg, at = self.transport.cache.register(req.view)
        except TransportError as e:
            req.fail(e)
            self.break_with(e)          # the sender waits for this grant: the pair is out of step
            return
        recv_id = self._new_id()
        for q, _, _ in plan:
            pairs.post_data_recv(q + 1, recv_id)
        self._rndv_recvs[recv_id] = [req, len(plan), reg]
        pairs.outbox.append(ControlMessage(CTS, reg.rkey, recv_id, req.nbytes, send_id, at))

    def _on_message(self, i: int, length: int) -> None:
        """A message landed in ring buffer ``i``."""
        ring = self.pairs.ring_view
        off = i * self.pairs.stride
        if length < HDR.size:
            self.break_with(TransportError(f"verbs: peer rank {self.peer} sent a malformed message "
                                           f"({length} bytes)", peer=self.peer))
            return
        kind, aux, tag, nbytes, ident, addr = HDR.unpack_from(ring, off)
        match = self.matcher
        if kind == EAGER:
            if nbytes != length - HDR.size:
                self.break_with(TransportError(f"verbs: peer rank {self.peer} sent a malformed "
                                               f"message ({nbytes} bytes announced, {length} came)",
                                               peer=self.peer))
                return
            body = ring[off + HDR.size: off + HDR.size + nbytes]
            if tag == WINDOW_TAG:    # an origin's window request: serve it now
                serve_request(self.transport.windows, bytearray(body), self)
                return
            req = match.take(tag)
            if req is None:
                match.hold(tag, nbytes, bytes(body))
            elif self._size_ok(req, nbytes):
                if nbytes:
                    req.view[:] = body
                req.complete()
        elif kind == RTS:
            if tag == WINDOW_TAG:    # origins send requests eager (window.py): not a peer of ours
                self.break_with(TransportError(f"verbs: peer rank {self.peer} sent a window "
                                               f"request of {nbytes} bytes (over the eager "
                                               "limit)", peer=self.peer))
                return
            if nbytes <= 0:
                self.break_with(TransportError(f"verbs: peer rank {self.peer} announced a message "
                                               f"of {nbytes} bytes", peer=self.peer))
                return
            req = match.take(tag)
            if req is None:
                match.hold(tag, nbytes, ReadyToSend(ident))
            elif self._size_ok(req, nbytes):
                self._grant(req, ident)
        elif kind == CTS:
            self._clear_to_send(ident, tag, addr, aux, nbytes)
        elif kind == PUT:
            self.transport.notices.append((self.peer, tag))
        else:
            self.break_with(TransportError(f"verbs: peer rank {self.peer} sent a message of "
                                           f"unknown kind {kind}", peer=self.peer))

    # -- completions -------------------------------------------------------------------------
    def on_completion(self, wc: Any) -> None:
        """Act on one work completion of this channel's queue pairs (a ring buffer filled,
        a send or RDMA write done, an error); ``QueuePairs.poll`` hands each one here."""
        kind, q, index = wr_fields(wc.wr_id)
        if wc.status != E.IBV_WC_SUCCESS:
            self._on_error(wc, kind)
            return
        pairs = self.pairs
        if kind == WR_RING:
            self._on_message(index, wc.byte_len)
            if self.broken is None:
                pairs.repost_ring(index)
            return
        if kind == WR_DATA:
            pairs.rq_free[q] += 1
            entry = self._rndv_recvs.get(wc.imm_data)
            if entry is None:
                self.break_with(TransportError(f"verbs: peer rank {self.peer} wrote data for an "
                                               f"unknown receive ({wc.imm_data})", peer=self.peer))
                return
            entry[1] -= 1
            if entry[1] == 0:
                del self._rndv_recvs[wc.imm_data]
                self.transport.cache.release(entry[2])
                entry[0].complete()
            return
        pairs.send_done(kind, q, index)
        if kind == WR_RNDV:
            req, left = self._rndv_sends.get(index, (None, 0))
            if req is None:
                return
            if left <= 1:
                del self._rndv_sends[index]
                self._release_held(index)
                req.complete()
            else:
                self._rndv_sends[index] = (req, left - 1)
        elif kind == WR_WINDOW:
            entry = self._window_ops.get(index)
            if entry is not None:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._window_ops[index]
                    self.transport.cache.release(entry[2])
                    entry[0].complete()
        elif kind == WR_PUT:
            req = self._puts.pop(index, None)
            self._release_held(-index)
            if req is not None:
                req.complete()

    def _on_error(self, wc: Any, kind: int) -> None:
        if self.broken is not None:
            return
        status = wc.status
        if self.pairs.peer_exited():
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
        self.break_with(err)

    # -- progress, liveness, teardown ------------------------------------------------------
    def progress(self) -> bool:
        if self.broken is not None:
            return False
        pairs = self.pairs
        if not pairs.ready:
            if pairs.state == EXCHANGING:
                moved = pairs.finish_exchange()
                if pairs.ready:
                    self.progress()
                return moved
            return False
        moved = False
        if pairs.armed:
            pairs.drain_events()
        if pairs.poll():
            moved = True
        if self.broken is not None:
            return True
        if self._grants and all(f > 0 for f in pairs.rq_free[1:]):
            for _ in range(len(self._grants)):
                self._grant(*self._grants.popleft())
        if pairs.outbox and pairs.flush_outbox():
            moved = True
        if pairs.writes and pairs.post_writes():
            moved = True
        pairs.report_credits()
        return moved

    def busy(self) -> bool:
        if self.broken is not None:
            return False
        return bool(self.matcher.posted or self._rndv_sends or self._rndv_recvs or self._grants
                    or self._puts or self._window_ops or self.pairs.busy()
                    # a pair with windows open stays active: origins' requests come unasked
                    or bool(self.transport.windows) and self.pairs.ready)

    def check_alive(self) -> None:
        if self.broken is None and self.pairs.sock is not None:
            self.pairs.read_sentinel()
        if self.broken is not None:
            raise self.broken

    def break_with(self, error: BaseException) -> None:
        if self.broken is None:
            self.broken = error
            self.pairs.abort_exchange()
        self.matcher.fail_all(error)
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
        for entry in list(self._window_ops.values()):
            entry[0].fail(error)
            self.transport.cache.release(entry[2])
        self._window_ops.clear()
        self.pairs.stop(error)
        self._rndv_sends.clear()
        self._rndv_recvs.clear()
        self._grants.clear()
        self._puts.clear()

    def _release_held(self, ident: int) -> None:
        reg = self._held_regs.pop(ident, None)
        if reg is not None:
            self.transport.cache.release(reg)

    def close(self) -> None:
        if self.pairs.ready and self.broken is None:
            self.pairs.drain_sends(2.0)
        self.break_with(TransportError(f"channel to peer rank {self.peer} was closed",
                                       peer=self.peer))
        self.pairs.close()
