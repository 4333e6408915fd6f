"""A rank's doorbell: a futex word its same-host peers ring when they give it something to do.

Why: shared memory cannot be waited on with ``epoll``, so a waiter without a doorbell can
only poll: spin, ``sched_yield`` and timer sleeps. When ranks share cores with other busy
processes, a ``sched_yield`` hands the core to them for the rest of their time slice and a
timer sleep lasts its whole length, so every slot hand-off of a message streamed through
small slots cost up to a time slice. Blocked on a futex instead, the waiter is woken the
moment a peer publishes, and the scheduler runs a task that just woke ahead of busy loops.

Protocol (one page: a wake sequence word and a waiter count, both 32-bit):

* the waiter (only the owner of the bell) announces itself (``announce``: the count goes up
  and it reads the sequence), *then* re-checks its condition (a progress pass), and only if
  nothing moved sleeps with ``sleep(sequence, timeout)``, which returns at once if the
  sequence changed since ``announce``; ``withdraw`` ends the announcement;
* a ringer (a peer's channel) that published something (a slot, a freed slot, a completion
  word, its close) calls ``ring``: only when the count says someone waits does it bump the
  sequence and ``FUTEX_WAKE``, so the path without a waiter costs one read of shared memory.

A ring that lands between the announcement and the sleep changes the sequence, so the
``FUTEX_WAIT`` (which compares it in the kernel) does not sleep; a ring before the
announcement comes after the publication the re-check then sees. ``ring`` fences between
the publication and its read of the count (a lock's locked instruction), so that the read
cannot pass the store still in the CPU's store buffer. Every sleep has a timeout (the
caller's liveness and deadline checks): a wake-up lost anyway costs one sleep, never a hang.
The bump is not atomic: a ringer descheduled between its read and its write writes a value
from the past. Each mapping bumps by a random odd step of its own, so that value is not
the one a waiter announced after another ringer's bump (unless two steps are equal).

The page is a ``memfd`` of the owner; peers map it through ``/proc/<pid>/fd/<fd>`` (the
same-user access cross-memory attach needs, so nothing is ever left in /dev/shm). A peer
maps it only if that link names a pycoll doorbell memfd and the page holds the random token
the owner published with the fd (``token``): a reused pid, or a pid of another namespace,
may name any file of the same user there, and ``ring`` writes into what it maps. Not the
``FUTEX_PRIVATE`` operations: the word is shared between processes. Where futexes, memfd or
that access are missing, ``create``/``attach`` return None and waiting polls as before.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import platform
import sys
import threading

from ...buffers.memory import view_address

#: futex(2) system call numbers (the shm transport runs on x86 only, see its probe)
SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98}.get(platform.machine().lower(), -1)
FUTEX_WAIT = 0
FUTEX_WAKE = 1
SEQUENCE, WAITERS = 0, 1        # uint32 indices into the page
TOKEN = slice(16, 32)           # the bytes of the owner's random token
PAGE = 4096
NAME = "pycoll-doorbell"

SUPPORTED = sys.platform == "linux" and SYS_FUTEX > 0 and hasattr(os, "memfd_create")
_libc = ctypes.CDLL(None, use_errno=True) if SUPPORTED else None


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_SYS_FUTEX = ctypes.c_long(SYS_FUTEX)
#: acquired and released in ``ring`` for its locked instruction (a full memory barrier)
_FENCE = threading.Lock()
_WAIT, _WAKE, _ALL = ctypes.c_int(FUTEX_WAIT), ctypes.c_int(FUTEX_WAKE), ctypes.c_uint32(0x7FFFFFFF)


class Doorbell:
    """One mapping of a rank's doorbell page: the owner's (``create``: it waits) or a
    peer's (``attach``: it rings)."""

    def __init__(self, mm: mmap.mmap, fd: int | None) -> None:
        self._mm = mm
        self.fd = fd                       # the owner's memfd (peers reach it through /proc)
        self.words = memoryview(mm).cast("I")
        #: the futex word's address, as the system call takes it
        self._futex = ctypes.c_void_p(view_address(self.words) + 4 * SEQUENCE)
        self._lock = threading.Lock()      # the owner's threads announce one at a time
        #: this mapping's sequence step (``ring``; see the module docstring)
        self._step = int.from_bytes(os.urandom(4), "little") | 1

    @property
    def token(self) -> str:
        """The page's random token (hex), published with the owner's fd: what ``attach``
        checks it mapped."""
        return bytes(self._mm[TOKEN]).hex()

    @classmethod
    def create(cls) -> Doorbell | None:
        """The owner's bell, or None where futexes or memfd are missing."""
        if not SUPPORTED:
            return None
        try:
            fd = os.memfd_create(NAME, os.MFD_CLOEXEC)
        except OSError:
            return None
        try:
            os.ftruncate(fd, PAGE)
            mm = mmap.mmap(fd, PAGE)
            mm[TOKEN] = os.urandom(TOKEN.stop - TOKEN.start)
            return cls(mm, fd)
        except OSError:
            os.close(fd)
            return None

    @classmethod
    def attach(cls, pid: int, fd: int, token: str) -> Doorbell | None:
        """A peer's bell, to ring; None where it cannot be mapped (another user, ptrace
        forbidden, not Linux): that peer then polls for this rank's work. Also None where
        ``/proc/<pid>/fd/<fd>`` is not a pycoll doorbell memfd or its page does not hold
        ``token``: not the bell the peer published (see the module docstring)."""
        if not SUPPORTED or fd < 0 or not token:
            return None
        path = f"/proc/{pid}/fd/{fd}"
        try:
            if not os.readlink(path).startswith(f"/memfd:{NAME}"):
                return None
            own = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            if os.fstat(own).st_size != PAGE:
                return None
            bell = cls(mmap.mmap(own, PAGE), None)
        except OSError:
            return None
        finally:
            os.close(own)
        if bell.token != token:
            bell.close()
            return None
        return bell

    # -- the owner ---------------------------------------------------------------------------
    def announce(self) -> int:
        """Say a waiter is about to sleep; returns the sequence to pass to ``sleep``. The
        caller re-checks its condition after this and before sleeping."""
        with self._lock:
            self.words[WAITERS] += 1
        return self.words[SEQUENCE]

    def sleep(self, sequence: int, timeout: float) -> None:
        """Sleep until a ring after ``announce`` (at once if one came already), ``timeout``
        seconds at most (the GIL is released meanwhile)."""
        timeout = max(0.0, timeout)
        ts = _Timespec(int(timeout), int((timeout % 1.0) * 1e9))
        assert _libc is not None
        _libc.syscall(_SYS_FUTEX, self._futex, _WAIT, ctypes.c_uint32(sequence),
                      ctypes.byref(ts), None, 0)

    def withdraw(self) -> None:
        with self._lock:
            self.words[WAITERS] -= 1

    # -- a peer ------------------------------------------------------------------------------
    def ring(self) -> None:
        """Wake the owner if it waits (called after publishing what it waits for)."""
        words = self.words
        # a full fence between the caller's publication and the read of the count: x86 may
        # let that load pass the store, read a stale zero, and lose the wake (one sleep)
        with _FENCE:
            pass
        if words[WAITERS]:
            words[SEQUENCE] = (words[SEQUENCE] + self._step) & 0xFFFFFFFF
            _libc.syscall(_SYS_FUTEX, self._futex, _WAKE, _ALL, None, None, 0)  # type: ignore[union-attr]

    def close(self) -> None:
        self.words.release()
        try:
            self._mm.close()
        except BufferError:
            pass   # a view is still exported; the mapping goes with the process
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
