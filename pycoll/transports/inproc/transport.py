"""The in-process transport: ranks are threads of one process (``channel.py``).

Only ranks of the same process connect (``can_connect`` compares a per-process token), and
it is never chosen unless named in ``PYCOLL_TRANSPORTS``. An eventfd per rank is what the
progress engine blocks on, so thousands of waiting threads sleep in ``epoll`` instead of
spinning; senders signal it only while its rank sleeps.
"""
from __future__ import annotations

import os
import secrets
import select
import threading
from collections import deque
from typing import Any

from ...buffers.memory import MemRef
from ..base import ActiveSet, Capabilities, Channel, OpenContext, PeerInfo, Transport
from ..windows import ExposedWindow
from .channel import InprocChannel, Message
from .window import InprocExposedWindow

#: every open in-process transport of this process, by the key it publishes
_ENDPOINTS: dict[str, InprocTransport] = {}
_ENDPOINTS_LOCK = threading.Lock()
_PROCESS: tuple[int, str] = (-1, "")


def process_token() -> str:
    """A token naming this process (a forked child gets its own)."""
    global _PROCESS
    pid = os.getpid()
    with _ENDPOINTS_LOCK:
        if _PROCESS[0] != pid:
            _PROCESS = (pid, f"{pid}-{secrets.token_hex(8)}")
        return _PROCESS[1]


class InprocTransport(Transport):
    """Transport between threads of one process (for tests at large rank counts)."""

    name = "inproc"
    capabilities = Capabilities("inproc", latency_us=5.0, bandwidth_gbps=5.0,
                                same_host_only=True, one_sided=True, segment_bytes=1 << 20,
                                in_process=True, windows=True)

    def __init__(self, ctx: OpenContext) -> None:
        self.rank = rank = ctx.rank
        self.key = f"{process_token()}/{secrets.token_hex(8)}/{rank}"
        self.closed = False
        self._lock = threading.Lock()
        self._mail: dict[int, deque[Message]] = {}
        self._channels: dict[int, InprocChannel] = {}
        self.active = ActiveSet()
        self._registered: dict[int, MemRef] = {}
        self.notices: list[tuple[int, int]] = []
        #: this rank's open windows by id (peers' ``attach_window`` look them up)
        self.windows: dict[int, InprocExposedWindow] = {}
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._sleeping = False
        with _ENDPOINTS_LOCK:
            _ENDPOINTS[self.key] = self

    # -- registry ------------------------------------------------------------------------
    @classmethod
    def probe(cls) -> tuple[dict[str, Any] | None, str]:
        if not hasattr(os, "eventfd"):
            return None, "os.eventfd is missing (Linux, Python >= 3.10 needed)"
        return {"process": process_token()}, ""

    @staticmethod
    def can_connect(a: PeerInfo, b: PeerInfo) -> bool:
        return a.records["inproc"]["process"] == b.records["inproc"]["process"]

    def address(self) -> dict[str, Any]:
        return {"key": self.key}

    # -- connections -----------------------------------------------------------------------
    def connect(self, peer: int, address: dict[str, Any], deadline: float) -> Channel:
        ch = self._channels.get(peer)
        if ch is None:
            # A peer that already finished (and closed) may have left messages in our
            # mailbox: the channel still delivers them, and only then reports the peer gone.
            remote = _ENDPOINTS.get(address["key"])     # an atomic dict read: no lock
            ch = self._channels[peer] = InprocChannel(self, peer, remote)
        return ch

    # -- delivery (called from the sender's thread) -----------------------------------------
    def deliver(self, src: int, msg: Message) -> None:
        with self._lock:
            box = self._mail.get(src)
            if box is None:
                box = self._mail[src] = deque()
            box.append(msg)
        self.signal()

    def has_mail(self, src: int) -> bool:
        """Whether rank ``src`` delivered messages not matched yet."""
        return bool(self._mail.get(src))

    def mailbox(self, src: int) -> deque[Message]:
        box = self._mail.get(src)
        if box is None:
            with self._lock:
                box = self._mail.setdefault(src, deque())
        return box

    def signal(self) -> None:
        """Wake this rank's engine if it sleeps (a syscall and a thread switch otherwise
        spent on every message)."""
        if self._sleeping:
            self.wake()

    def wake(self) -> None:
        try:
            os.eventfd_write(self._efd, 1)
        except OSError:
            pass    # closed meanwhile

    # -- one-sided ---------------------------------------------------------------------------
    def register(self, mem: MemRef) -> dict[str, Any]:
        self._registered[mem.ptr] = mem
        return {"key": self.key, "addr": mem.ptr, "nbytes": mem.nbytes}

    def region(self, addr: int) -> MemRef | None:
        """The memory registered at ``addr`` (a peer's ``put`` copies into it)."""
        return self._registered.get(addr)

    def deregister(self, record: dict[str, Any]) -> None:
        self._registered.pop(int(record["addr"]), None)

    def expose_window(self, mem: MemRef, dtype: str = "", np_dtype: Any = None
                      ) -> ExposedWindow:
        wid = self._next_window = getattr(self, "_next_window", 0) + 1
        win = self.windows[wid] = InprocExposedWindow(self.key, wid, mem.view, self.rank,
                                                      self.windows)
        return win

    def held_memory(self) -> dict[str, int]:
        return {"segment": 0, "registered": sum(m.nbytes for m in self._registered.values())}

    def notifications(self) -> list[tuple[int, int]]:
        for src in list(self._mail):
            ch = self._channels.get(src)
            if ch is not None:
                ch.drain()
        notices, self.notices = self.notices, []
        return notices

    # -- progress --------------------------------------------------------------------------
    def progress(self) -> bool:
        if self._sleeping:
            self._sleeping = self.setup_pending = False
            try:
                os.eventfd_read(self._efd)
            except (BlockingIOError, OSError):
                pass
        return self.active.progress() if self.active.channels else False

    def wait_fds(self) -> list[tuple[int, int]] | None:
        # Called right before the engine blocks. Senders signal only a sleeping rank, so
        # say we sleep first, then look once more: mail that arrived in between wakes us.
        self._sleeping = self.setup_pending = True   # the next pass resets the eventfd
        for ch in self.active.channels.values():
            if ch.has_news():   # type: ignore[attr-defined]
                self.wake()
                break
        return [(self._efd, select.EPOLLIN)]

    def close(self) -> None:
        self.closed = True
        with _ENDPOINTS_LOCK:
            _ENDPOINTS.pop(self.key, None)
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
        self.active.channels.clear()
        try:
            os.close(self._efd)
        except OSError:
            pass
