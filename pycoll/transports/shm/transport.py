"""The shm transport: same-host peers talk through /dev/shm segments (``channel.py``).

Inboxes are created lazily, the first time an algorithm uses the peer (64 ranks on one host
reserve memory only for the pairs that talk). Each rank publishes an unguessable path prefix
through the authenticated store; the inbox from peer P is ``<prefix>-from<P>``, created under
a temporary name, sized with ``posix_fallocate`` (a full /dev/shm is an exception here, not a
SIGBUS later) and renamed into place, so a peer never maps a half-made segment. Each side
opens its peer's inbox in the background of progress, so neither waits for the other.
Segments are unlinked as soon as both sides have mapped them, so nothing is left in /dev/shm
even if a process is killed afterwards. One killed before its peer mapped its inbox leaves
that inbox: ``open`` and ``close`` sweep the segments whose creator is dead (and the launcher
does once it has reaped its ranks). Peer death is noticed through a pidfd.

Each rank has a doorbell (``doorbell.py``) that its peers' channels ring when they publish
or free slots for it; the progress engine sleeps on it (``Transport.doorbell``) instead of
polling, once every channel with work is known to ring it.

The probe refuses weakly ordered CPUs: the channel relies on x86 store order (``channel.py``).
"""
from __future__ import annotations

import ctypes
import os
import platform
import secrets
import time
from collections.abc import Iterable
from typing import Any

from ... import debug
from ...buffers.memory import MemRef
from ...errors import TransportError
from ..base import ActiveSet, Capabilities, Channel, OpenContext, PeerInfo, Transport
from ..windows import ExposedWindow
from .channel import ShmChannel
from .cma import cma_read
from .doorbell import Doorbell
from .segment import PROBE_MAGIC, SHM_DIR, Segment, ShmSettings, segment_prefix, sweep
from .window import ShmExposedWindow


class ShmTransport(Transport):
    """Shared-memory transport for the peers on this host."""

    name = "shm"
    pollable = False
    #: what ``connect`` makes (the cuda_ipc transport built on this one makes its own)
    channel_class: type[ShmChannel] = ShmChannel
    capabilities = Capabilities("shm", latency_us=1.0, bandwidth_gbps=8.0, same_host_only=True,
                                one_sided=True, segment_bytes=1 << 20, fast_path=True,
                                windows=True, window_memory=True)

    def __init__(self, ctx: OpenContext) -> None:
        self.rank = rank = ctx.rank
        self.size = ctx.size
        self.settings = ShmSettings.from_env(crowded=False)   # see configure
        _sweep_dead("open")        # leftovers of killed jobs (their creators are dead)
        self._prefix = f"{SHM_DIR}/{segment_prefix(os.getpid())}{rank}-{secrets.token_hex(8)}"
        self._channels: dict[int, ShmChannel] = {}
        self.active = ActiveSet()
        self.linked: set[str] = set()
        self._probe = ctypes.c_uint64(PROBE_MAGIC ^ os.getpid())
        self._registered: dict[int, MemRef] = {}
        self.notices: list[tuple[int, int]] = []
        self._check_unlink = False
        self._next_finish = 0.0
        self._windows = 0
        self.bell = Doorbell.create()

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

    @classmethod
    def details(cls) -> dict[str, Any] | None:
        try:
            st = os.statvfs(SHM_DIR)
        except OSError as e:
            return {"dir": SHM_DIR, "error": str(e)}
        return {"dir": SHM_DIR, "size_bytes": st.f_blocks * st.f_frsize,
                "free_bytes": st.f_bavail * st.f_frsize}

    @classmethod
    def sweep_leftovers(cls, pids: Iterable[int] | None = None) -> list[str]:
        """The inboxes whose creator is dead (``segment.sweep``): a rank killed before its
        peer mapped its inbox leaves it in /dev/shm."""
        return sweep(pids)

    def address(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "probe": ctypes.addressof(self._probe),
                "prefix": self._prefix, "slots": self.settings.num_slots,
                "slot_bytes": self.settings.slot_bytes,
                "bell": -1 if self.bell is None or self.bell.fd is None else self.bell.fd,
                "bell_token": "" if self.bell is None else self.bell.token}

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
            self.linked.add(path)
            ch = self._channels[peer] = self.channel_class(self, peer, inbox, address)
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
        waiting = [ch for ch in self._channels.values() if ch.settling and not ch.settle()]
        self._check_unlink = self.setup_pending = bool(waiting)

    def unlink(self, path: str) -> None:
        if path in self.linked:
            self.linked.discard(path)
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

    def expose_window(self, mem: MemRef, dtype: str = "", np_dtype: Any = None
                      ) -> ExposedWindow:
        """A window's control file, named like this transport's segments (``window.py``)."""
        self._windows += 1
        return ShmExposedWindow(f"{self._prefix}-win{self._windows}", mem.ptr, mem.nbytes,
                                self.rank)

    def allocate_window(self, nbytes: int) -> ExposedWindow:
        """The window's memory in its control file, which every peer maps (``window.py``)."""
        self._windows += 1
        return ShmExposedWindow(f"{self._prefix}-win{self._windows}", 0, nbytes, self.rank,
                                allocate=True)

    def held_memory(self) -> dict[str, int]:
        return {"segment": sum(ch.mapped_bytes() for ch in self._channels.values()),
                "registered": sum(mem.nbytes for mem in self._registered.values())}

    def notifications(self) -> list[tuple[int, int]]:
        for ch in self._channels.values():
            ch.progress_recv(drain=True)
        notices, self.notices = self.notices, []
        return notices

    # -- progress --------------------------------------------------------------------------
    def progress(self) -> bool:
        if self._check_unlink:
            self._finish_connections()
        return self.active.progress() if self.active.channels else False

    def doorbell(self) -> Doorbell | None:
        """This rank's bell once every channel with work rings it (its peer mapped the bell
        and said so); None while a channel connects or a peer could not map it: poll."""
        bell = self.bell
        if bell is None or self.setup_pending:
            return None
        for ch in self.active.channels.values():
            if not ch.rings_me():   # type: ignore[attr-defined]
                return None
        return bell

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self.active.channels.clear()
        for path in list(self.linked):
            self.unlink(path)
        for ch in self._channels.values():
            ch.unmap()
        self._channels.clear()
        if self.bell is not None:
            self.bell.close()
            self.bell = None
        # A peer killed after it made its inbox for us, before we mapped it (and so before
        # anyone unlinked it), left that inbox behind; without a launcher to sweep (a fork
        # harness, an MPI job), the survivors are the last to know.
        _sweep_dead("close")


def _sweep_dead(when: str) -> None:
    """Unlink the segments of this namespace whose creator is dead (``segment.sweep``)."""
    removed = sweep()
    if removed:
        debug.logger.info("shm %s: removed %d segment(s) left by dead processes",
                          when, len(removed))
