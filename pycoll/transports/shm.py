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

Segments are unlinked as soon as both sides have mapped them, so nothing is left in /dev/shm
even if a process is killed; the mappings die with the processes. Peer death is noticed
through a pidfd (readable once the peer has exited) while waiting.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import secrets
import select
import struct
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from ..errors import TransportError
from .base import (Capabilities, Channel, Request, Transport, peer_lost, size_mismatch,
                   take_posted)

PAGE = 4096
# Control words (uint64 indices into the control page). Writers: S = sender, R = receiver.
HEAD = 0            # S: slots published
TAIL = 8            # R: slots consumed (own cache line)
ATTACHED = 16       # S: sender has mapped the segment
SENDER_CLOSED = 24  # S
RECEIVER_CLOSED = 32  # R
CMA_STATE = 40      # R: 1 = receiver can read sender's memory, 2 = it cannot
DONE_BASE = 64      # R: rendezvous completion words, RNDV_WINDOW of them
RNDV_WINDOW = 64

SLOT_HEADER = struct.Struct("<qqqq")   # tag, total message bytes, kind, aux
RNDV_BODY = struct.Struct("<qq")       # sender pid, sender address
EAGER, FIRST, CONT, RNDV = 0, 1, 2, 3

PROBE_MAGIC = 0x5059434F4C4C3031  # "PYCOLL01"

_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class ShmSettings:
    """Tunables, read from the environment when a transport is opened."""

    # 8 x 256 KiB: messages up to 256 KiB go eager. Cross-memory attach pins the peer's
    # pages on every call (~10 us for 64 KiB here, against ~2 us for two cached copies), so
    # it only pays once messages are large enough to come from DRAM.
    slot_bytes: int = 256 * 1024
    num_slots: int = 8
    cma: bool = True                 # use process_vm_readv for large messages when permitted
    # Below ~2 MiB, streaming through the (cache-resident) slots beats one cross-memory copy:
    # measured here, a 2-rank ring allreduce of 1-4 MiB ran ~2x faster with fragments. Above
    # it, one copy instead of two wins (a 2-rank broadcast: ~11 GB/s against 3-8). When ranks
    # outnumber cores, CPU time is what runs out, so the copy saved wins from 1 MiB (4 ranks
    # on 2 cores: ~3.2 GB/s against ~2.3 for a 256 MiB allreduce).
    cma_threshold: int = 2 << 20

    @classmethod
    def from_env(cls, crowded: bool = False) -> "ShmSettings":
        env = os.environ
        threshold = (1 << 20) if crowded else cls.cma_threshold
        settings = cls(int(env.get("PYCOLL_SHM_SLOT_BYTES", cls.slot_bytes)),
                       int(env.get("PYCOLL_SHM_SLOTS", cls.num_slots)),
                       env.get("PYCOLL_SHM_CMA", "1") != "0",
                       int(env.get("PYCOLL_SHM_CMA_THRESHOLD", threshold)))
        if settings.slot_bytes < 64 or settings.num_slots < 1:
            raise ValueError("PYCOLL_SHM_SLOT_BYTES must be >= 64 and PYCOLL_SHM_SLOTS >= 1")
        return settings


def seq_span(next_seq: int, pending: dict[int, Any]) -> int:
    """How far the next rendezvous sequence number is from the oldest pending one."""
    return next_seq - min(pending)


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def buffer_address(view: memoryview) -> int:
    """The address of a buffer's first byte (any buffer, read-only ones too)."""
    if view.readonly:
        import numpy as np
        return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def cma_read(pid: int, remote_address: int, view: memoryview, peer: int) -> None:
    """Copy ``len(view)`` bytes from ``remote_address`` in process ``pid`` into ``view``."""
    total = view.nbytes
    if total == 0:
        return
    local = buffer_address(view)
    done = 0
    while done < total:
        liov = _IoVec(local + done, total - done)
        riov = _IoVec(remote_address + done, total - done)
        n = _libc.process_vm_readv(pid, ctypes.byref(liov), 1, ctypes.byref(riov), 1, 0)
        if n <= 0:
            err = ctypes.get_errno()
            if err == 3:  # ESRCH
                raise peer_lost(peer, f"process {pid} exited during a shared-memory read")
            raise TransportError(f"process_vm_readv from peer rank {peer} (pid {pid}) failed: "
                                 f"{os.strerror(err)}", peer=peer)
        done += n


class _Segment:
    """One mapped inbox: a control page plus a ring of slots."""

    def __init__(self, path: str, create: bool, num_slots: int, slot_bytes: int) -> None:
        self.path = path
        self.num_slots = num_slots
        self.slot_bytes = slot_bytes
        self.size = PAGE + num_slots * slot_bytes
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, self.size)
            self.mm = mmap.mmap(fd, self.size)
        finally:
            os.close(fd)
        self.ctrl = memoryview(self.mm)[:PAGE].cast("Q")
        self.data = memoryview(self.mm)

    def close(self) -> None:
        self.ctrl.release()
        self.data.release()
        self.mm.close()


class ShmChannel(Channel):
    """Messages to and from one same-host peer through two inbox segments."""

    def __init__(self, transport: "ShmTransport", peer: int, inbox: _Segment, outbox: _Segment,
                 peer_pid: int, use_cma: bool) -> None:
        self.transport = transport
        self.peer = peer
        self._in = inbox
        self._out = outbox
        self._peer_pid = peer_pid
        self._use_cma = use_cma
        self._pidfd: int | None = None
        try:
            self._pidfd = os.pidfd_open(peer_pid)
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
        self._posted: deque[Request] = deque()
        self._unexpected: deque[tuple[int, int, Any]] = deque()  # (tag, kind, bytes|descriptor)
        self._assembling: tuple[Any, int, int] | None = None     # (target request|bytearray, tag, offset)
        self._broken: BaseException | None = None
        # The receiver decides its inbox's geometry; the sender follows the peer's.
        self._cma_threshold = transport.settings.cma_threshold
        self._payload = outbox.slot_bytes - SLOT_HEADER.size

    # -- sending -------------------------------------------------------------------------
    def isend(self, view: memoryview, tag: int = 0) -> Request:
        req = Request(self, view, tag, "send")
        if self._broken is not None:
            req.fail(self._broken)
        else:
            self._sends.append(req)
            self._progress_send()
        return req

    @staticmethod
    def _slot_offset(seg: _Segment, index: int) -> int:
        return PAGE + (index % seg.num_slots) * seg.slot_bytes

    def _progress_send(self) -> bool:
        moved = False
        out = self._out
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
            if n <= self._payload:
                SLOT_HEADER.pack_into(out.data, off, req.tag, n, EAGER, 0)
                if n:
                    out.data[off + SLOT_HEADER.size: off + SLOT_HEADER.size + n] = req.view
                self._publish()
                self._sends.popleft()
                req.complete()
            elif self._use_cma and n >= self._cma_threshold:
                # Completion words are indexed seq % RNDV_WINDOW: never reuse one whose
                # send is still pending (the receiver may complete them out of order).
                if self._rndv_pending and seq_span(self._rndv_seq, self._rndv_pending) >= RNDV_WINDOW:
                    break
                seq = self._rndv_seq
                self._rndv_seq += 1
                SLOT_HEADER.pack_into(out.data, off, req.tag, n, RNDV, seq)
                RNDV_BODY.pack_into(out.data, off + SLOT_HEADER.size, os.getpid(),
                                    buffer_address(req.view))
                self._publish()
                self._sends.popleft()
                self._rndv_pending[seq] = req
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

    def _publish(self) -> None:
        self._head += 1
        self._out.ctrl[HEAD] = self._head   # after the slot's bytes: x86 keeps store order

    # -- receiving -----------------------------------------------------------------------
    def irecv(self, view: memoryview, tag: int = 0) -> Request:
        req = Request(self, view, tag, "recv")
        if self._broken is not None:
            req.fail(self._broken)
            return req
        for i, (utag, kind, body) in enumerate(self._unexpected):
            if utag == tag:
                del self._unexpected[i]
                self._deliver_unexpected(req, kind, body)
                return req
        self._posted.append(req)
        if self._tail < self._in.ctrl[HEAD]:
            self._progress_recv()
        return req

    def _deliver_unexpected(self, req: Request, kind: int, body: Any) -> None:
        if kind == RNDV:
            nbytes, pid, address, seq = body
            if self._size_ok(req, nbytes):
                self._rndv_read(req, pid, address, seq)
        elif self._size_ok(req, len(body)):
            req.view[:] = body
            req.complete()

    def _size_ok(self, req: Request, nbytes: int) -> bool:
        if nbytes == req.nbytes:
            return True
        self._break(size_mismatch(self.peer, req.tag, nbytes, req.nbytes))
        return False

    def _rndv_read(self, req: Request, pid: int, address: int, seq: int) -> None:
        try:
            cma_read(pid, address, req.view, self.peer)
        except TransportError as err:
            self._break(err)
            return
        self._in.ctrl[DONE_BASE + seq % RNDV_WINDOW] = seq + 1
        req.complete()

    def _progress_recv(self) -> bool:
        moved = False
        seg = self._in
        data = seg.data
        hs = SLOT_HEADER.size
        while (self._posted or self._assembling is not None) and self._tail < seg.ctrl[HEAD]:
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
                        late = take_posted(self._posted, atag)
                        if late is None:
                            self._unexpected.append((atag, EAGER, target))
                        elif self._size_ok(late, len(target)):
                            late.view[:] = target
                            late.complete()
                else:
                    self._assembling = (target, atag, start)
                    if isinstance(target, Request):
                        target.bytes_done = start
            else:
                req = take_posted(self._posted, tag)
                if req is not None and not self._size_ok(req, total):
                    return True
                if kind == EAGER:
                    if req is None:
                        self._unexpected.append((tag, EAGER, bytes(data[off + hs: off + hs + total])))
                    else:
                        if total:
                            req.view[:] = data[off + hs: off + hs + total]
                        req.complete()
                elif kind == RNDV:
                    pid, address = RNDV_BODY.unpack_from(data, off + hs)
                    if req is None:
                        self._unexpected.append((tag, RNDV, (total, pid, address, aux)))
                    else:
                        self._rndv_read(req, pid, address, aux)
                else:  # FIRST fragment
                    target = req if req is not None else bytearray(total)
                    dst = target.view if req is not None else memoryview(target)
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
        if self._posted or self._assembling is not None:
            moved = self._progress_recv() or moved
        return moved

    def check_alive(self) -> None:
        if self._broken is not None:
            raise self._broken
        if not self._pending():
            return   # nothing expected from this peer: its exit is not our problem (yet)
        gone = None
        if self._in.ctrl[SENDER_CLOSED] or self._out.ctrl[RECEIVER_CLOSED]:
            gone = "it closed its communicator (finalize) while this rank still expected data"
        elif self._pidfd is not None:
            if select.select([self._pidfd], [], [], 0)[0]:
                gone = f"process {self._peer_pid} exited"
        else:
            try:
                os.kill(self._peer_pid, 0)
            except ProcessLookupError:
                gone = f"process {self._peer_pid} exited"
        if gone is None:
            return
        # Whatever the peer wrote before closing or exiting is visible now: deliver it first,
        # and blame the peer only for what is still missing after that.
        self.progress()
        if self._pending():
            self._break(peer_lost(self.peer, gone))
            raise self._broken  # type: ignore[misc]

    def _pending(self) -> bool:
        return bool(self._sends or self._rndv_pending or self._posted or self._assembling)

    def _break(self, error: BaseException) -> None:
        if self._broken is None:
            self._broken = error
        for req in list(self._sends) + list(self._rndv_pending.values()) + list(self._posted):
            req.fail(error)
        if isinstance(self._assembling, tuple) and isinstance(self._assembling[0], Request):
            self._assembling[0].fail(error)
        self._sends.clear()
        self._rndv_pending.clear()
        self._posted.clear()
        self._assembling = None

    def close(self) -> None:
        try:
            self._in.ctrl[RECEIVER_CLOSED] = 1
            self._out.ctrl[SENDER_CLOSED] = 1
        except ValueError:
            pass  # already released
        self._break(TransportError(f"channel to peer rank {self.peer} was closed", peer=self.peer))
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


class ShmTransport(Transport):
    """Shared-memory transport for the peers on this host."""

    capabilities = Capabilities("shm", latency_us=1.0, bandwidth_gbps=8.0, same_host_only=True,
                                one_sided=True, segment_bytes=1 << 20)

    def __init__(self, rank: int, peers: list[int], *, crowded: bool = False) -> None:
        self.rank = rank
        self.peers = list(peers)
        self.settings = ShmSettings.from_env(crowded)
        self._inboxes: dict[int, _Segment] = {}
        self._outboxes: dict[int, _Segment] = {}
        self._linked: set[str] = set()
        self._channels: dict[int, ShmChannel] = {}
        self._probe = ctypes.c_uint64(PROBE_MAGIC ^ os.getpid())
        tag = secrets.token_hex(4)
        try:
            for peer in self.peers:
                path = f"/dev/shm/pycoll-{os.getpid()}-{rank}-from{peer}-{tag}"
                self._inboxes[peer] = _Segment(path, True, self.settings.num_slots,
                                               self.settings.slot_bytes)
                self._linked.add(path)
        except BaseException:
            self.close()
            raise

    def address(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "probe": ctypes.addressof(self._probe),
                "slots": self.settings.num_slots, "slot_bytes": self.settings.slot_bytes,
                "inbox": {str(p): seg.path for p, seg in self._inboxes.items()}}

    def _cma_works(self, pid: int, probe: int) -> bool:
        if not self.settings.cma:
            return False
        value = ctypes.c_uint64(0)
        try:
            cma_read(pid, probe, memoryview(value).cast("B"), -1)
        except TransportError:
            return False
        return value.value == PROBE_MAGIC ^ pid

    def connect(self, addresses: dict[int, dict[str, Any]], deadline: float) -> dict[int, Channel]:
        for peer in self.peers:
            a = addresses[peer]
            self._inboxes[peer].ctrl[CMA_STATE] = 1 if self._cma_works(a["pid"], a["probe"]) else 2
            out = _Segment(a["inbox"][str(self.rank)], False, a["slots"], a["slot_bytes"])
            out.ctrl[ATTACHED] = 1
            self._outboxes[peer] = out
        for peer in self.peers:
            _wait_word(self._inboxes[peer].ctrl, ATTACHED, deadline, peer, "map its segment")
            self._unlink(self._inboxes[peer].path)
            _wait_word(self._outboxes[peer].ctrl, CMA_STATE, deadline, peer, "answer the probe")
        for peer in self.peers:
            self._channels[peer] = ShmChannel(
                self, peer, self._inboxes[peer], self._outboxes[peer], addresses[peer]["pid"],
                use_cma=self._outboxes[peer].ctrl[CMA_STATE] == 1)
        return dict(self._channels)

    def _unlink(self, path: str) -> None:
        if path in self._linked:
            self._linked.discard(path)
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
        for path in list(self._linked):
            self._unlink(path)
        for seg in list(self._inboxes.values()) + list(self._outboxes.values()):
            try:
                seg.close()
            except BufferError:
                pass  # a request still references it; the mapping goes with the process
        self._inboxes.clear()
        self._outboxes.clear()


def _wait_word(ctrl: memoryview, index: int, deadline: float, peer: int, what: str) -> None:
    sleep = 1e-5
    while not ctrl[index]:
        if time.monotonic() > deadline:
            raise TransportError(f"shm: peer rank {peer} did not {what} before the deadline",
                                 peer=peer)
        time.sleep(sleep)
        sleep = min(sleep * 2, 1e-3)
