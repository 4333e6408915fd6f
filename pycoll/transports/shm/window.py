"""Windows over shared memory: origins copy straight into and out of the target's memory.

The target's window stays the user's own buffer; origins write and read it with
cross-memory attach (``cma.py``: one copy, no target CPU). What origins must share besides
the bytes lives in a one-page control file the target creates in /dev/shm, named like the
transport's segments (``<prefix>-win<n>``: the unguessable prefix published through the
authenticated store, mode 0600, swept by ``segment.sweep`` when its creator dies) and
unlinked once every peer has opened it:

* the signal counter (word 0), which origins add to under a lock and the target reads;
* the accumulate locks: open-file-description byte-range locks (``F_OFD_SETLK``) on the
  control file, over the very bytes of the window an accumulate changes. Overlapping
  accumulates serialise, disjoint ones run in parallel, and the kernel drops the locks of a
  process that dies, so a killed origin never leaves a window locked.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import struct
from collections.abc import Callable
from typing import Any

from ...buffers.memory import view_address
from ...errors import TransportError
from ..base import peer_lost
from ..windows import ExposedWindow, RemoteWindow, wait_until
from .cma import cma_read, process_exited
from .segment import PAGE

#: ``struct flock`` on x86-64 Linux: type, whence, start, len, pid (OFD locks need pid 0)
_FLOCK = struct.Struct("hhxxxxqqi4x")
#: the byte range locked while the signal counter changes: far beyond any window's bytes
_SIGNAL_LOCK = 1 << 62


def _lock(fd: int, start: int, length: int, deadline: float, peer: int) -> None:
    request = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, start, length, 0)

    def taken() -> bool:
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, request)
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
        return True
    wait_until(taken, deadline, f"peer rank {peer}'s window lock (another rank holds it)")


def _unlock(fd: int, start: int, length: int) -> None:
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_UNLCK, os.SEEK_SET, start, length, 0))


class _Control:
    """An open, mapped control file: the descriptor the locks are taken on, the counter."""

    def __init__(self, path: str, create: bool) -> None:
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        self.fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.posix_fallocate(self.fd, 0, PAGE)
            elif os.fstat(self.fd).st_size != PAGE:
                raise TransportError(f"shm: window control file {path} has the wrong size")
            self.mm = mmap.mmap(self.fd, PAGE)
        except BaseException:
            os.close(self.fd)
            raise
        self.words = memoryview(self.mm).cast("Q")

    def close(self) -> None:
        self.words.release()
        self.mm.close()
        os.close(self.fd)


class ShmExposedWindow(ExposedWindow):
    def __init__(self, path: str, ptr: int, nbytes: int, rank: int) -> None:
        self.path = path
        self.rank = rank
        self._ptr, self._nbytes = ptr, nbytes
        self._control = _Control(path, create=True)
        self.record = {"pid": os.getpid(), "addr": ptr, "nbytes": nbytes, "path": path}

    def signals(self) -> int:
        return int(self._control.words[0])    # an aligned 8-byte load: atomic on x86-64

    def local(self) -> RemoteWindow:
        return ShmRemoteWindow(self.rank, self.record, cma=False)

    def seal(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        self.seal()
        self._control.close()


class ShmRemoteWindow(RemoteWindow):
    """``cma``: copy with cross-memory attach (a peer); False: this process's own memory."""

    def __init__(self, peer: int, record: dict[str, Any], cma: bool) -> None:
        self.peer = peer
        self.pid = int(record["pid"])
        self.addr = int(record["addr"])
        self.nbytes = int(record["nbytes"])
        self.cma = cma
        try:
            self._control = _Control(str(record["path"]), create=False)
        except FileNotFoundError:
            raise TransportError(f"shm: peer rank {peer}'s window control file is gone: the "
                                 "peer closed the window or died while it was made",
                                 peer=peer) from None

    def _copy(self, offset: int, view: memoryview, write: bool) -> None:
        if offset < 0 or offset + view.nbytes > self.nbytes:   # a lying record: never copy
            raise TransportError(f"shm: {view.nbytes} bytes at offset {offset} outside peer "
                                 f"rank {self.peer}'s window of {self.nbytes} bytes",
                                 peer=self.peer)
        if not view.nbytes:
            return
        if self.cma:
            cma_read(self.pid, self.addr + offset, view, self.peer, write=write)
            return
        here, there = view_address(view), self.addr + offset
        if write:
            ctypes.memmove(there, here, view.nbytes)
        else:
            ctypes.memmove(here, there, view.nbytes)

    def write(self, offset: int, view: memoryview, deadline: float = 0.0) -> None:
        self._copy(offset, view, write=True)

    def read(self, offset: int, view: memoryview, deadline: float = 0.0) -> None:
        self._copy(offset, view, write=False)

    def update(self, offset: int, nbytes: int, fn: Callable[[memoryview], None],
               deadline: float) -> None:
        scratch = memoryview(bytearray(nbytes))
        fd = self._control.fd
        _lock(fd, offset, max(nbytes, 1), deadline, self.peer)
        try:
            self._copy(offset, scratch, write=False)
            fn(scratch)
            self._copy(offset, scratch, write=True)
        finally:
            _unlock(fd, offset, max(nbytes, 1))

    def add_signal(self, value: int, deadline: float) -> None:
        if self.cma and process_exited(self.pid):   # the counter would take it silently
            raise peer_lost(self.peer, f"process {self.pid} exited; its window is gone")
        fd = self._control.fd
        _lock(fd, _SIGNAL_LOCK, 1, deadline, self.peer)
        try:
            self._control.words[0] = (int(self._control.words[0]) + value) % (1 << 64)
        finally:
            _unlock(fd, _SIGNAL_LOCK, 1)

    def close(self) -> None:
        self._control.close()
