"""The shm channel: messages to one same-host peer through two inbox segments.

Each ordered pair of ranks has one *inbox* segment (``segment.py``), created by the receiver
and mapped by the sender: a control page (head/tail counters, flags, rendezvous completion
words) followed by a ring of fixed-size slots. The sender fills a slot and then bumps
``head``; the receiver copies it out and bumps ``tail``. Each counter has one writer, and x86
keeps stores in order, so no lock is needed.

Three message protocols, by size:

* eager: the message fits in one slot (copied in, copied out);
* rendezvous (large messages, the default when the kernel allows it): the slot carries only
  the sender's pid and buffer address, and the receiver pulls the bytes straight out of the
  sender's memory with ``process_vm_readv`` (cross-memory attach, ``cma.py``, as MPICH and
  Open MPI do): one copy instead of two, and no bounce buffer that grows with the message;
* fragmented: where cross-memory attach is not permitted (containers that forbid ptrace),
  the message streams through the slot ring in pieces.

The channel moves host memory. ``cuda_ipc.CudaIpcChannel`` extends it with device memory
through its hooks (``_send_unaddressable``, ``_memory_fits``, ``_start_message``,
``_deliver_held``, ``message_kinds``).

Waking: whatever a peer may wait for (a published slot, a freed slot, a completion word, a
close) is followed by a ring of the peer's doorbell (``doorbell.py``), which costs one read
of shared memory unless the peer sleeps on it; ``RINGS`` in an inbox says its sender rings.

Memory ordering: every control word has one writer and is written after the data it
publishes; that is enough on x86-64 (total store order). Weakly ordered CPUs need fences
this transport does not issue, so its probe refuses them (tcp is used instead).
"""
from __future__ import annotations

import os
import select
from collections import deque
from typing import Any, Protocol

from ...buffers.memory import MemRef
from ...errors import TransportError
from ..base import ActiveSet, Channel, Request, peer_left_over, peer_lost
from ..matching import TagMatcher
from ..windows import RemoteWindow
from .cma import cma_read, process_exited
from .doorbell import Doorbell
from .segment import (
    ATTACHED,
    CMA_STATE,
    CONT,
    DONE_BASE,
    EAGER,
    FIRST,
    HEAD,
    NOTIFY,
    PAGE,
    RECEIVER_CLOSED,
    RINGS,
    RNDV,
    RNDV_BODY,
    RNDV_WINDOW,
    SENDER_CLOSED,
    SLOT_HEADER,
    TAIL,
    CmaNotice,
    Segment,
    ShmSettings,
    seq_span,
)
from .window import ShmRemoteWindow, check_path


class ShmOwner(Protocol):
    """What a channel uses of its transport (``ShmTransport``)."""

    name: str
    rank: int
    farewell: int | None
    settings: ShmSettings
    size: int
    active: ActiveSet
    linked: set[str]
    notices: list[tuple[int, int]]

    def unlink(self, path: str) -> None: ...


class ShmChannel(Channel):
    """Messages to and from one same-host peer through two inbox segments."""

    transport: ShmOwner  # type: ignore[assignment]
    #: the slot kinds that start a message (a subclass may add its own)
    message_kinds: tuple[int, ...] = (EAGER, FIRST, RNDV)

    def __init__(self, transport: ShmOwner, peer: int, inbox: Segment,
                 address: dict[str, Any]) -> None:
        self.transport = transport
        self.peer = peer
        self._active = transport.active.channels    # join it when work arrives
        self._in = inbox
        self._out: Segment | None = None          # the peer's inbox, once it exists
        self._out_path = f"{address['prefix']}-from{transport.rank}"
        self._out_geometry = (int(address["slots"]), int(address["slot_bytes"]))
        self._peer_pid = int(address["pid"])
        self._peer_prefix = str(address["prefix"])
        self._peer_bell_fd = int(address.get("bell", -1))
        self._peer_bell_token = str(address.get("bell_token", ""))
        #: the peer's doorbell, rung after anything it may wait for (None: it polls)
        self._bell: Doorbell | None = None
        self._use_cma = False
        self._pidfd: int | None = None
        self._pid_poll: select.poll | None = None
        try:
            self._pidfd = os.pidfd_open(self._peer_pid)
            self._pid_poll = select.poll()
            self._pid_poll.register(self._pidfd, select.POLLIN)
        except (AttributeError, OSError):
            pass
        # sender state
        self._sends: deque[Request] = deque()
        self._send_offset = 0          # bytes of the head send already written (fragments)
        self._head = 0                 # slots published to the peer
        self._rndv_seq = 0
        self._rndv_pending: dict[int, Request] = {}
        # receiver state
        self._tail = 0
        self.matcher = TagMatcher(peer)
        #: the fragmented message being read: (target request|bytearray, tag, offset)
        self._assembling: tuple[Any, int, int] | None = None
        self.broken: BaseException | None = None
        self._cma_threshold = transport.settings.cma_threshold
        #: until both inboxes are mapped and ours unlinked: the transport settles such
        #: channels (``settle``) while it has any
        self.settling = True
        self._payload = 0

    def _open_outbox(self) -> bool:
        """Map the peer's inbox for us once it exists; True when the channel can send."""
        try:
            out = Segment.open(self._out_path, *self._out_geometry)
        except (OSError, TransportError) as e:
            self.break_with(TransportError(f"shm: cannot map peer rank {self.peer}'s segment: {e}",
                                           peer=self.peer))
            return False
        if out is None:
            return False
        out.ctrl[ATTACHED] = 1
        self._use_cma = out.ctrl[CMA_STATE] == 1
        self._payload = out.slot_bytes - SLOT_HEADER.size
        self._out = out
        self._bell = Doorbell.attach(self._peer_pid, self._peer_bell_fd,
                                     self._peer_bell_token)
        if self._bell is not None:
            out.ctrl[RINGS] = 1
            self._bell.ring()       # the peer may wait for this channel to become ready
        try:   # both sides have it mapped now: drop the name (a crash leaves nothing behind)
            os.unlink(self._out_path)
        except OSError:
            pass   # the creator did already (or another user owns it: it will, at close)
        return True

    # -- sending -------------------------------------------------------------------------
    def settle(self) -> bool:
        """Finish connecting: map the peer's inbox as soon as it exists (even before
        sending: then the peer can unlink it) and unlink ours once the peer has mapped it,
        so that a crash leaves nothing in /dev/shm. Tried on every use of the channel until
        done (a rank whose messages always arrive before it waits never runs a progress
        pass) and by the transport's progress; True once settled."""
        if self._out is None and self.broken is None:
            self._open_outbox()
        if self.mapped_by_peer():
            self.transport.unlink(self._in.path)
        self.settling = self.broken is None and (
            self._out is None or self._in.path in self.transport.linked)
        return not self.settling

    def isend(self, mem: MemRef, tag: int = 0) -> Request:
        if self.settling:
            self.settle()
        req = Request(self, mem, tag, "send")
        if self.broken is not None:
            req.fail(self.broken)
        else:
            self._sends.append(req)
            self._active[self.peer] = self
            if self._out is not None:
                self._progress_send()
        return req

    @staticmethod
    def _slot_offset(seg: Segment, index: int) -> int:
        return PAGE + (index % seg.num_slots) * seg.slot_bytes

    def _progress_send(self) -> bool:
        moved = False
        out = self._out
        if out is None:
            if not self._open_outbox():
                return False
            out = self._out
            assert out is not None
        ctrl = out.ctrl
        if self._rndv_pending:
            for seq in [s for s, r in self._rndv_pending.items()
                        if ctrl[DONE_BASE + s % RNDV_WINDOW] == s + 1]:
                self._rndv_pending.pop(seq).complete()
                moved = True
        while self._sends:
            free = out.num_slots - (self._head - ctrl[TAIL])
            if free <= 0:
                break
            req = self._sends[0]
            n = req.nbytes
            off = self._slot_offset(out, self._head)
            if req.kind == "put":     # the notice of a completed one-sided write
                SLOT_HEADER.pack_into(out.data, off, 0, 0, NOTIFY, req.tag)
                self._publish()
                self._sends.popleft()
                req.complete()
            elif req.view is None:      # memory without a host address (device memory)
                if not self._send_unaddressable(req, out, off):
                    break
            elif n <= self._payload:
                SLOT_HEADER.pack_into(out.data, off, req.tag, n, EAGER, 0)
                if n:
                    out.data[off + SLOT_HEADER.size: off + SLOT_HEADER.size + n] = req.view
                self._publish()
                self._sends.popleft()
                req.complete()
            elif self._use_cma and n >= self._cma_threshold:
                if self._window_full():
                    break
                self._sends.popleft()
                self._announce(req, out, off, RNDV, RNDV_BODY.pack(os.getpid(), req.mem.ptr))
            else:
                start = self._send_offset
                chunk = min(self._payload, n - start)
                SLOT_HEADER.pack_into(out.data, off, req.tag, n, FIRST if start == 0 else CONT,
                                      chunk)
                body_at = off + SLOT_HEADER.size
                out.data[body_at: body_at + chunk] = req.view[start:start + chunk]
                self._publish()
                self._send_offset = start + chunk
                req.bytes_done = self._send_offset
                if self._send_offset == n:
                    self._send_offset = 0
                    self._sends.popleft()
                    req.complete()
            moved = True
        if moved and self._bell is not None:
            self._bell.ring()
        return moved

    def _send_unaddressable(self, req: Request, out: Segment, off: int) -> bool:
        """A send of memory without a host address (device memory): this channel moves host
        memory only, so it fails (nothing was announced: the pair stays in step). The cuda_ipc
        channel announces it instead. False keeps it queued (no room yet)."""
        self._sends.popleft()
        req.fail(self._host_only())
        return True

    def _host_only(self) -> TransportError:
        return TransportError(f"shm: device memory for rank {self.peer} reached a channel "
                              "that moves host memory only", peer=self.peer)

    def _window_full(self) -> bool:
        """Completion words are indexed seq % RNDV_WINDOW: never reuse one whose send is
        still pending (the receiver may complete them out of order)."""
        return bool(self._rndv_pending) and seq_span(self._rndv_seq,
                                                     self._rndv_pending) >= RNDV_WINDOW

    def _announce(self, req: Request, out: Segment, off: int, kind: int, body: bytes) -> None:
        """Publish a rendezvous (``kind`` RNDV, or a subclass's, ``body`` saying where the
        bytes are); ``req`` completes when the receiver sets its completion word."""
        seq = self._rndv_seq
        self._rndv_seq += 1
        SLOT_HEADER.pack_into(out.data, off, req.tag, req.nbytes, kind, seq)
        out.data[off + SLOT_HEADER.size: off + SLOT_HEADER.size + len(body)] = body
        self._publish()
        self._rndv_pending[seq] = req

    def put(self, src: MemRef, remote: dict[str, Any], offset: int, notify: int) -> Request:
        """Cross-memory write into the peer's registered region, then a notice slot (the
        slot is published after the write returned, so the peer sees the bytes first)."""
        req = Request(self, src, notify, "put")
        if self.broken is not None:
            req.fail(self.broken)
            return req
        if req.view is None:
            req.fail(TransportError(f"{self.transport.name}: put of device memory is not "
                                    "supported (one-sided writes move host memory only)",
                                    peer=self.peer))
            return req
        if (int(remote.get("pid", -1)) != self._peer_pid or offset < 0
                or offset + src.nbytes > int(remote.get("nbytes", -1))):
            req.fail(TransportError(
                f"shm: put of {src.nbytes} bytes at offset {offset} does not fit peer rank "
                f"{self.peer}'s registered region {remote}", peer=self.peer))
            return req
        if self._in.ctrl[CMA_STATE] != 1:
            req.fail(TransportError(f"shm: this rank may not write into peer rank {self.peer}'s "
                                    "memory (cross-memory attach is not permitted here)",
                                    peer=self.peer))
            return req
        try:
            cma_read(self._peer_pid, int(remote["addr"]) + offset, req.view, self.peer,
                     write=True)
        except TransportError as err:
            req.fail(err)
            return req
        req.bytes_done = req.nbytes
        self._sends.append(req)          # the notice travels in order with other messages
        self._active[self.peer] = self
        if self._out is not None:
            self._progress_send()
        return req

    def attach_window(self, record: dict[str, Any], progress: Any = None) -> RemoteWindow:
        """The peer's window, reached with cross-memory attach (``window.py``)."""
        if int(record.get("pid", -1)) != self._peer_pid:
            raise TransportError(f"shm: peer rank {self.peer}'s window record names another "
                                 "process", peer=self.peer)
        if self._in.ctrl[CMA_STATE] != 1:
            raise TransportError(
                f"shm: windows need cross-memory attach to peer rank {self.peer}, which this "
                "host does not permit (ptrace restrictions: a container's seccomp profile or "
                "kernel.yama.ptrace_scope); use PYCOLL_TRANSPORTS=tcp for windows here",
                peer=self.peer)
        check_path(str(record.get("path", "")), self._peer_prefix, self.peer)
        return ShmRemoteWindow(self.peer, record, cma=True)

    def _publish(self) -> None:
        self._head += 1
        # after the slot's bytes: x86 store order
        self._out.ctrl[HEAD] = self._head   # type: ignore[union-attr]

    # -- receiving -----------------------------------------------------------------------
    def irecv(self, mem: MemRef, tag: int = 0) -> Request:
        if self.settling:
            self.settle()
        req = self.recv_request(self, mem, tag, "recv")
        if self._post_receive(req) and self._tail < self._in.ctrl[HEAD]:
            self.progress_recv()
        return req

    def _deliver_held(self, req: Request, nbytes: int, body: Any) -> None:
        if req.view is None:
            self._refuse(req, self._host_only())
        elif not isinstance(body, CmaNotice):
            super()._deliver_held(req, nbytes, body)
        elif self._size_ok(req, nbytes):
            if self.broken is not None:   # the sender's buffer may be its user's again:
                req.fail(self.broken)     # only copies (eager messages) outlive the pair
                return
            self._rndv_read(req, body.pid, body.address, body.seq)

    def _rndv_read(self, req: Request, pid: int, address: int, seq: int) -> None:
        try:
            cma_read(pid, address, req.view, self.peer)
        except TransportError as err:
            self.break_with(err)
            req.fail(err)       # already matched, so no longer among the posted receives
            return
        self._read_done(seq)
        req.complete()

    def _read_done(self, seq: int) -> None:
        """Tell the sender that rendezvous ``seq`` was read: its send completes."""
        self._in.ctrl[DONE_BASE + seq % RNDV_WINDOW] = seq + 1
        if self._bell is not None:
            self._bell.ring()

    def _refuse(self, req: Request, err: TransportError) -> None:
        """The matched receive ``req`` cannot take its message: the pair is out of step."""
        self.break_with(err)
        req.fail(err)

    def _memory_fits(self, req: Request, kind: int) -> bool:
        """Whether the matched receive ``req`` can take a message of slot ``kind``: here only
        a receive into host memory can (the cuda_ipc channel adds device memory)."""
        if req.view is not None:
            return True
        self._refuse(req, self._host_only())
        return False

    def unread_tags(self) -> list[int]:
        seg = self._in
        tags = []
        for index in range(self._tail, seg.ctrl[HEAD]):
            tag, _total, kind, _aux = SLOT_HEADER.unpack_from(seg.data,
                                                              self._slot_offset(seg, index))
            if kind in self.message_kinds:
                tags.append(tag)
        return tags

    def progress_recv(self, drain: bool = False) -> bool:
        """Consume arrived slots while a receive waits for them (``drain``: all of them,
        holding unexpected messages, to find one-sided notices: the transport's
        ``notifications`` drains every channel so)."""
        moved = False
        seg = self._in
        data = seg.data
        hs = SLOT_HEADER.size
        match = self.matcher
        while ((drain or match.posted or self._assembling is not None)
               and self._tail < seg.ctrl[HEAD]):
            off = self._slot_offset(seg, self._tail)
            tag, total, kind, aux = SLOT_HEADER.unpack_from(data, off)
            if kind == CONT:
                target, atag, start = self._assembling  # type: ignore[misc]
                dst = target.view if isinstance(target, Request) else memoryview(target)
                dst[start:start + aux] = data[off + hs: off + hs + aux]
                start += aux
                if start == total:
                    self._assembling = None
                    if isinstance(target, Request):
                        target.complete()
                    else:
                        # A receive posted while this message was being set aside takes it.
                        late = match.take(atag)
                        if late is None:
                            match.hold(atag, len(target), target)
                        elif self._size_ok(late, len(target)):
                            late.view[:] = target
                            late.complete()
                else:
                    self._assembling = (target, atag, start)
                    if isinstance(target, Request):
                        target.bytes_done = start
            elif kind == NOTIFY:
                self.transport.notices.append((self.peer, aux))
            else:
                req = match.take(tag)
                if req is not None and not (self._size_ok(req, total)
                                            and self._memory_fits(req, kind)):
                    return True
                self._start_message(req, tag, total, kind, aux, off + hs)
            self._tail += 1
            seg.ctrl[TAIL] = self._tail
            moved = True
        if moved and self._bell is not None:
            self._bell.ring()       # slots are free again
        return moved

    def _start_message(self, req: Request | None, tag: int, total: int, kind: int, aux: int,
                       at: int) -> None:
        """The first slot of a message (its body at ``at``): into the matched receive ``req``,
        or held for one not yet posted (``req`` None)."""
        match = self.matcher
        data = self._in.data
        if kind == EAGER:
            if req is None:
                match.hold(tag, total, bytes(data[at: at + total]))
            else:
                if total:
                    req.view[:] = data[at: at + total]
                req.complete()
        elif kind == RNDV:
            pid, address = RNDV_BODY.unpack_from(data, at)
            if req is None:
                match.hold(tag, total, CmaNotice(pid, address, aux))
            else:
                self._rndv_read(req, pid, address, aux)
        else:  # FIRST fragment
            target = req if req is not None else bytearray(total)
            dst = req.view if req is not None else memoryview(target)  # type: ignore[arg-type]
            dst[0:aux] = data[at: at + aux]
            self._assembling = (target, tag, aux)

    # -- progress, liveness, teardown ------------------------------------------------------
    def progress(self) -> bool:
        moved = False
        if self._sends or self._rndv_pending:
            moved = self._progress_send()
        if self.matcher.posted or self._assembling is not None:
            moved = self.progress_recv() or moved
        return moved

    def busy(self) -> bool:
        return bool(self._sends or self._rndv_pending or self.matcher.posted or self._assembling)

    def rings_me(self) -> bool:
        """Whether the peer rings this rank's doorbell after whatever it does for us."""
        return bool(self._in.ctrl[RINGS])

    def mapped_by_peer(self) -> bool:
        return bool(self._in.ctrl[ATTACHED])

    def mapped_bytes(self) -> int:
        """Bytes of the segments this channel has mapped: its inbox, and the peer's once
        it exists."""
        return sum(seg.size for seg in (self._in, self._out) if seg is not None)

    def unmap(self) -> None:
        """Release the mappings of both segments (and of the peer's doorbell); the
        transport's ``close`` calls it last, once every channel is closed and every path
        unlinked."""
        if self._bell is not None:
            self._bell.close()
            self._bell = None
        for seg in (self._in, self._out):
            if seg is None:
                continue
            try:
                seg.close()
            except BufferError:
                pass  # a request still references it; the mapping goes with the process

    @property
    def ready(self) -> bool:
        return self._out is not None and self.mapped_by_peer()

    def peer_joined(self) -> bool:
        return self._out is not None or self.mapped_by_peer()

    def check_alive(self) -> None:
        if self.broken is not None:
            raise self.broken
        if not self.busy():
            return   # nothing expected from this peer: its exit is not our problem (yet)
        gone = None
        closed = max(self._in.ctrl[SENDER_CLOSED],
                     self._out.ctrl[RECEIVER_CLOSED] if self._out is not None else 0)
        if closed:
            gone = "it closed its communicator (finalize) while this rank still expected data"
        elif self._pid_poll is not None:
            if self._pid_poll.poll(0):
                gone = f"process {self._peer_pid} exited"
        elif process_exited(self._peer_pid):
            gone = f"process {self._peer_pid} exited"
        if gone is None:
            return
        # Whatever the peer wrote before closing or exiting is visible now: deliver it first
        # (a delivered message that proves a receive wrong fails it as a mismatch), and blame
        # the peer only for what is still missing after that.
        self.progress()
        self.refuse_conflicts()
        if self.busy():
            lost = closed - 2      # the peer left because it lost that rank (see close)
            self.break_with(peer_left_over(self.peer, lost)
                            if 0 <= lost < self.transport.size else peer_lost(self.peer, gone))
            raise self.broken  # type: ignore[misc]

    def break_with(self, error: BaseException) -> None:
        if self.broken is None:
            self.broken = error
        for req in list(self._sends) + list(self._rndv_pending.values()):
            req.fail(error)
        self.matcher.fail_all(error)
        if isinstance(self._assembling, tuple) and isinstance(self._assembling[0], Request):
            self._assembling[0].fail(error)
        self._sends.clear()
        self._rndv_pending.clear()
        self._assembling = None

    def close(self) -> None:
        if self._out is None and self.broken is None:
            self._open_outbox()     # so the peer learns we closed (if it made its inbox)
        lost = self.transport.farewell     # "closed because rank N is gone": 2 + N
        flag = 1 if lost is None else 2 + lost
        try:
            self._in.ctrl[RECEIVER_CLOSED] = flag
            if self._out is not None:
                self._out.ctrl[SENDER_CLOSED] = flag
        except ValueError:
            pass  # already released
        if self._bell is not None:
            self._bell.ring()          # a peer waiting on us learns it at once
        self.break_with(TransportError(f"channel to peer rank {self.peer} was closed",
                                       peer=self.peer))
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
            self._pid_poll = None
