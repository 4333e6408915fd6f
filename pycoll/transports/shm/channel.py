"""Shared-memory transport: same-host peers talk through /dev/shm segments.

Each ordered pair of ranks has one *inbox* segment, created by the receiver and mapped by the
sender: a control page (head/tail counters, flags, rendezvous completion words) followed by a
ring of fixed-size slots. The sender fills a slot and then bumps ``head``; the receiver copies
it out and bumps ``tail``. Each counter has one writer, and x86 keeps stores in order, so no
lock is needed.

Three message protocols, by size:

* eager: the message fits in one slot (copied in, copied out);
* rendezvous (large messages, the default when the kernel allows it): the slot carries only
  the sender's pid and buffer address, and the receiver pulls the bytes straight out of the
  sender's memory with ``process_vm_readv`` (cross-memory attach, as MPICH and Open MPI do):
  one copy instead of two, and no bounce buffer that grows with the message;
* fragmented: where cross-memory attach is not permitted (containers that forbid ptrace),
  the message streams through the slot ring in pieces.

Inboxes are created lazily, the first time an algorithm uses the peer (64 ranks on one host
reserve memory only for the pairs that talk). Each rank publishes an unguessable path prefix
through the authenticated store; the inbox from peer P is ``<prefix>-from<P>``, created under
a temporary name, sized with ``posix_fallocate`` (a full /dev/shm is an exception here, not a
SIGBUS later) and renamed into place, so a peer never maps a half-made segment. Each side
opens its peer's inbox in the background of progress, so neither waits for the other.
Segments are unlinked as soon as both sides have mapped them, so nothing is left in /dev/shm
even if a process is killed afterwards. Peer death is noticed through a pidfd.

Memory ordering: every control word has one writer and is written after the data it
publishes; that is enough on x86-64 (total store order). Weakly ordered CPUs need fences
this transport does not issue, so its probe refuses them (tcp is used instead).
"""
from __future__ import annotations

import ctypes
import os
import platform
import secrets
import select
import time
from collections import deque
from typing import Any

from ... import debug
from ...errors import TransportError
from ...buffers.memory import MemRef
from ..base import (ActiveSet, Capabilities, Channel, OpenContext, PeerInfo, Request, Transport,
                    peer_left_over, peer_lost)
from ..matching import TagMatcher
from .cma import cma_read, process_exited
from .segment import (ATTACHED, CMA_STATE, CONT, DEVICE, DEVICE_BODY_BYTES, DONE_BASE, EAGER,
                      FIRST, HEAD, NOTIFY, PAGE, PROBE_MAGIC, RECEIVER_CLOSED, RNDV, RNDV_BODY,
                      RNDV_WINDOW, SENDER_CLOSED, SHM_DIR, SLOT_HEADER, TAIL, DeviceNotice,
                      RndvNotice, Segment, ShmSettings, segment_prefix,
                      seq_span, sweep)

class ShmChannel(Channel):
    """Messages to and from one same-host peer through two inbox segments."""

    transport: "ShmTransport"

    def __init__(self, transport: "ShmTransport", peer: int, inbox: Segment,
                 address: dict[str, Any]) -> None:
        self.transport = transport
        self.peer = peer
        self._active = transport._active.channels    # join it when work arrives
        self._in = inbox
        self._out: Segment | None = None          # the peer's inbox, once it exists
        self._out_path = f"{address['prefix']}-from{transport.rank}"
        self._out_geometry = (int(address["slots"]), int(address["slot_bytes"]))
        self._peer_pid = int(address["pid"])
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
        self._device_reads: deque[tuple[Any, int]] = deque()   # (copy-done event, seq)
        self._tail = 0
        self._match = TagMatcher(peer)
        self._assembling: tuple[Any, int, int] | None = None     # (target request|bytearray, tag, offset)
        self._broken: BaseException | None = None
        self._cma_threshold = transport.settings.cma_threshold
        self._settling = True          # until both inboxes are mapped and ours unlinked
        self._payload = 0

    def _open_outbox(self) -> bool:
        """Map the peer's inbox for us once it exists; True when the channel can send."""
        try:
            out = Segment.open(self._out_path, *self._out_geometry)
        except (OSError, TransportError) as e:
            self._break(TransportError(f"shm: cannot map peer rank {self.peer}'s segment: {e}",
                                       peer=self.peer))
            return False
        if out is None:
            return False
        out.ctrl[ATTACHED] = 1
        self._use_cma = out.ctrl[CMA_STATE] == 1
        self._payload = out.slot_bytes - SLOT_HEADER.size
        self._out = out
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
        if self._out is None and self._broken is None:
            self._open_outbox()
        if self.mapped_by_peer():
            self.transport._unlink(self._in.path)
        self._settling = self._broken is None and (
            self._out is None or self._in.path in self.transport._linked)
        return not self._settling

    def isend(self, mem: MemRef, tag: int = 0) -> Request:
        if self._settling:
            self.settle()
        req = Request(self, mem, tag, "send")
        if self._broken is not None:
            req.fail(self._broken)
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
            elif req.view is None:      # device memory: a rendezvous (cuda_ipc.py)
                if self._window_full():
                    break
                self._sends.popleft()
                try:
                    body = self._device().export(req.mem, self.peer)
                except TransportError as err:
                    req.fail(err)       # nothing was announced: the pair stays in step
                    continue
                self._announce(req, out, off, DEVICE, body)
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
                SLOT_HEADER.pack_into(out.data, off, req.tag, n, FIRST if start == 0 else CONT, chunk)
                out.data[off + SLOT_HEADER.size: off + SLOT_HEADER.size + chunk] = req.view[start:start + chunk]
                self._publish()
                self._send_offset = start + chunk
                req.bytes_done = self._send_offset
                if self._send_offset == n:
                    self._send_offset = 0
                    self._sends.popleft()
                    req.complete()
            moved = True
        return moved

    def _window_full(self) -> bool:
        """Completion words are indexed seq % RNDV_WINDOW: never reuse one whose send is
        still pending (the receiver may complete them out of order)."""
        return bool(self._rndv_pending) and seq_span(self._rndv_seq,
                                                     self._rndv_pending) >= RNDV_WINDOW

    def _announce(self, req: Request, out: Segment, off: int, kind: int, body: bytes) -> None:
        """Publish a rendezvous (``kind`` RNDV or DEVICE, ``body`` saying where the bytes
        are); ``req`` completes when the receiver sets its completion word."""
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
        if self._broken is not None:
            req.fail(self._broken)
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

    def _publish(self) -> None:
        self._head += 1
        self._out.ctrl[HEAD] = self._head   # type: ignore[union-attr]  # after the slot's bytes: x86 store order

    # -- receiving -----------------------------------------------------------------------
    def irecv(self, mem: MemRef, tag: int = 0) -> Request:
        if self._settling:
            self.settle()
        req = Request(self, mem, tag, "recv")
        if self._post_receive(req) and self._tail < self._in.ctrl[HEAD]:
            self._progress_recv()
        return req

    def _deliver_held(self, req: Request, nbytes: int, body: Any) -> None:
        if (req.view is None) != isinstance(body, DeviceNotice):
            self._memory_mismatch(req, isinstance(body, DeviceNotice))
        elif isinstance(body, DeviceNotice):
            if self._size_ok(req, nbytes):
                self._device_read(req, body.body, body.seq)
        elif not isinstance(body, RndvNotice):
            super()._deliver_held(req, nbytes, body)
        elif self._size_ok(req, nbytes):
            if self._broken is not None:   # the sender's buffer may be its user's again:
                req.fail(self._broken)     # only copies (eager messages) outlive the pair
                return
            self._rndv_read(req, body.pid, body.address, body.seq)

    def _rndv_read(self, req: Request, pid: int, address: int, seq: int) -> None:
        try:
            cma_read(pid, address, req.view, self.peer)
        except TransportError as err:
            self._break(err)
            req.fail(err)       # already matched, so no longer among the posted receives
            return
        self._in.ctrl[DONE_BASE + seq % RNDV_WINDOW] = seq + 1
        req.complete()

    # -- device memory (the cuda_ipc transport) ---------------------------------------------
    def _device(self) -> Any:
        device = self.transport.device
        if device is None:
            raise TransportError(f"shm: device memory for rank {self.peer} reached a channel "
                                 "that moves host memory only", peer=self.peer)
        return device

    def _device_read(self, req: Request, body: bytes, seq: int) -> None:
        """Queue the copy out of the peer's device memory; the receive is complete at once
        (whatever reads it is queued behind the copy), the sender once the copy has run."""
        try:
            done = self._device().read(req.mem, body, self.peer)
        except TransportError as err:
            self._break(err)
            req.fail(err)
            return
        self._device_reads.append((done, seq))
        self._active[self.peer] = self
        req.complete()

    def _finish_device_reads(self) -> bool:
        reads, moved = self._device_reads, False
        finished = self._device().finished
        while reads and finished(reads[0][0]):
            _, seq = reads.popleft()
            self._in.ctrl[DONE_BASE + seq % RNDV_WINDOW] = seq + 1
            moved = True
        return moved

    def _memory_mismatch(self, req: Request, device_sent: bool) -> None:
        sent, posted = ("device", "host") if device_sent else ("host", "device")
        err = TransportError(
            f"rank {self.peer} sent {sent} memory where this rank receives into {posted} "
            f"memory (tag {req.tag}): every rank must pass device buffers, or every rank host "
            "buffers, to one call", peer=self.peer)
        self._break(err)
        req.fail(err)

    def unread_tags(self) -> list[int]:
        seg = self._in
        tags = []
        for index in range(self._tail, seg.ctrl[HEAD]):
            tag, _total, kind, _aux = SLOT_HEADER.unpack_from(seg.data,
                                                              self._slot_offset(seg, index))
            if kind in (EAGER, FIRST, RNDV, DEVICE):
                tags.append(tag)
        return tags

    def _progress_recv(self, drain: bool = False) -> bool:
        """Consume arrived slots while a receive waits for them (``drain``: all of them,
        holding unexpected messages, to find one-sided notices)."""
        moved = False
        seg = self._in
        data = seg.data
        hs = SLOT_HEADER.size
        match = self._match
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
                self.transport._notices.append((self.peer, aux))
            else:
                req = match.take(tag)
                if req is not None:
                    if not self._size_ok(req, total):
                        return True
                    if (req.view is None) != (kind == DEVICE):
                        self._memory_mismatch(req, kind == DEVICE)
                        return True
                if kind == EAGER:
                    if req is None:
                        match.hold(tag, total, bytes(data[off + hs: off + hs + total]))
                    else:
                        if total:
                            req.view[:] = data[off + hs: off + hs + total]
                        req.complete()
                elif kind == DEVICE:
                    body = bytes(data[off + hs: off + hs + DEVICE_BODY_BYTES])
                    if req is None:
                        match.hold(tag, total, DeviceNotice(body, aux))
                    else:
                        self._device_read(req, body, aux)
                elif kind == RNDV:
                    pid, address = RNDV_BODY.unpack_from(data, off + hs)
                    if req is None:
                        match.hold(tag, total, RndvNotice(pid, address, aux))
                    else:
                        self._rndv_read(req, pid, address, aux)
                else:  # FIRST fragment
                    target = req if req is not None else bytearray(total)
                    dst = req.view if req is not None else memoryview(target)  # type: ignore[arg-type]
                    dst[0:aux] = data[off + hs: off + hs + aux]
                    self._assembling = (target, tag, aux)
            self._tail += 1
            seg.ctrl[TAIL] = self._tail
            moved = True
        return moved

    # -- progress, liveness, teardown ------------------------------------------------------
    def progress(self) -> bool:
        moved = False
        if self._sends or self._rndv_pending:
            moved = self._progress_send()
        if self._match.posted or self._assembling is not None:
            moved = self._progress_recv() or moved
        if self._device_reads:
            moved = self._finish_device_reads() or moved
        return moved

    def busy(self) -> bool:
        return bool(self._sends or self._rndv_pending or self._match.posted or self._assembling
                    or self._device_reads)

    def mapped_by_peer(self) -> bool:
        return bool(self._in.ctrl[ATTACHED])

    def peer_joined(self) -> bool:
        return self._out is not None or self.mapped_by_peer()

    def check_alive(self) -> None:
        if self._broken is not None:
            raise self._broken
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
        # Whatever the peer wrote before closing or exiting is visible now: deliver it first,
        # and blame the peer only for what is still missing after that.
        self.progress()
        if self.busy():
            lost = closed - 2      # the peer left because it lost that rank (see close)
            self._break(peer_left_over(self.peer, lost)
                        if 0 <= lost < self.transport._size else peer_lost(self.peer, gone))
            raise self._broken  # type: ignore[misc]

    def _break(self, error: BaseException) -> None:
        if self._broken is None:
            self._broken = error
        for req in list(self._sends) + list(self._rndv_pending.values()):
            req.fail(error)
        self._match.fail_all(error)
        if isinstance(self._assembling, tuple) and isinstance(self._assembling[0], Request):
            self._assembling[0].fail(error)
        self._sends.clear()
        self._rndv_pending.clear()
        self._assembling = None

    def close(self) -> None:
        if self._out is None and self._broken is None:
            self._open_outbox()     # so the peer learns we closed (if it made its inbox)
        lost = self.transport.farewell     # "closed because rank N is gone": 2 + N
        flag = 1 if lost is None else 2 + lost
        try:
            self._in.ctrl[RECEIVER_CLOSED] = flag
            if self._out is not None:
                self._out.ctrl[SENDER_CLOSED] = flag
        except ValueError:
            pass  # already released
        self._break(TransportError(f"channel to peer rank {self.peer} was closed", peer=self.peer))
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
            self._pid_poll = None




class ShmTransport(Transport):
    """Shared-memory transport for the peers on this host."""

    name = "shm"
    pollable = False
    #: the device half (``cuda_ipc.DeviceIpc``) of the cuda_ipc transport built on this one
    device: Any = None
    capabilities = Capabilities("shm", latency_us=1.0, bandwidth_gbps=8.0, same_host_only=True,
                                one_sided=True, segment_bytes=1 << 20)

    def __init__(self, ctx: OpenContext) -> None:
        self.rank = rank = ctx.rank
        self._size = ctx.size
        self.settings = ShmSettings.from_env(crowded=False)   # see configure
        removed = sweep()          # leftovers of killed jobs (their creators are dead)
        if removed:
            debug.logger.info("shm: removed %d segment(s) left by dead processes",
                              len(removed))
        self._prefix = f"{SHM_DIR}/{segment_prefix(os.getpid())}{rank}-{secrets.token_hex(8)}"
        self._channels: dict[int, ShmChannel] = {}
        self._active = ActiveSet()
        self._linked: set[str] = set()
        self._probe = ctypes.c_uint64(PROBE_MAGIC ^ os.getpid())
        self._registered: dict[int, MemRef] = {}
        self._notices: list[tuple[int, int]] = []
        self._check_unlink = False
        self._next_finish = 0.0

    def configure(self, crowded: bool) -> None:
        """Adopt the job's rank layout (known after the bootstrap): with more ranks than
        cores, cross-memory attach pays from 1 MiB (see ``ShmSettings``)."""
        self.settings = ShmSettings.from_env(crowded)

    # -- registry ------------------------------------------------------------------------
    @classmethod
    def probe(cls) -> tuple[dict[str, Any] | None, str]:
        if platform.machine().lower() not in ("x86_64", "amd64", "i686", "i386"):
            return None, (f"shm relies on x86 store ordering; this CPU is {platform.machine()} "
                          "(weakly ordered), which it does not handle yet")
        if not os.access(SHM_DIR, os.W_OK):
            return None, f"{SHM_DIR} is missing or not writable"
        return {}, ""

    @staticmethod
    def can_connect(a: PeerInfo, b: PeerInfo) -> bool:
        return a.host == b.host and a.machine == b.machine

    def address(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "probe": ctypes.addressof(self._probe),
                "prefix": self._prefix, "slots": self.settings.num_slots,
                "slot_bytes": self.settings.slot_bytes}

    def _cma_works(self, pid: int, probe: int) -> bool:
        if not self.settings.cma:
            return False
        value = ctypes.c_uint64(0)
        try:
            cma_read(pid, probe, memoryview(value).cast("B"), -1)
        except TransportError:
            return False
        return value.value == PROBE_MAGIC ^ pid

    # -- connections -----------------------------------------------------------------------
    def connect(self, peer: int, address: dict[str, Any], deadline: float) -> Channel:
        ch = self._channels.get(peer)
        if ch is None:
            cma = 1 if self._cma_works(int(address["pid"]), int(address["probe"])) else 2
            path = f"{self._prefix}-from{peer}"
            inbox = Segment.create(path, self.settings.num_slots, self.settings.slot_bytes, cma)
            self._linked.add(path)
            ch = self._channels[peer] = ShmChannel(self, peer, inbox, address)
            self._check_unlink = self.setup_pending = True
            self._next_finish = 0.0
        return ch

    def _finish_connections(self) -> None:
        """Settle every channel still connecting (``ShmChannel.settle``); polled at most
        every millisecond while any is."""
        now = time.monotonic()
        if now < self._next_finish:
            return
        self._next_finish = now + 1e-3
        waiting = [ch for ch in self._channels.values() if ch._settling and not ch.settle()]
        self._check_unlink = self.setup_pending = bool(waiting)

    def _unlink(self, path: str) -> None:
        if path in self._linked:
            self._linked.discard(path)
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    # -- one-sided ---------------------------------------------------------------------------
    def register(self, mem: MemRef) -> dict[str, Any]:
        self._registered[mem.ptr] = mem
        return {"pid": os.getpid(), "addr": mem.ptr, "nbytes": mem.nbytes}

    def deregister(self, record: dict[str, Any]) -> None:
        self._registered.pop(int(record["addr"]), None)

    def notifications(self) -> list[tuple[int, int]]:
        for ch in self._channels.values():
            ch._progress_recv(drain=True)
        notices, self._notices = self._notices, []
        return notices

    # -- progress --------------------------------------------------------------------------
    def progress(self) -> bool:
        if self._check_unlink:
            self._finish_connections()
        return self._active.progress() if self._active.channels else False

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._active.channels.clear()
        for path in list(self._linked):
            self._unlink(path)
        for ch in self._channels.values():
            for seg in (ch._in, ch._out):
                if seg is None:
                    continue
                try:
                    seg.close()
                except BufferError:
                    pass  # a request still references it; the mapping goes with the process
        self._channels.clear()
