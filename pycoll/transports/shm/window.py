"""Windows over shared memory: origins copy straight into and out of the target's memory.

The target's window stays the user's own buffer; origins write and read it with
cross-memory attach (``cma.py``: one copy, no target CPU). What origins must share besides
the bytes lives in a one-page control file the target creates in /dev/shm, named like the
transport's segments (``<prefix>-win<n>``: the unguessable prefix published through the
authenticated store, mode 0600, swept by ``segment.sweep`` when its creator dies) and
unlinked once every peer has opened it:

* the signal counter (word 0), which origins add to under a lock and the target reads;
* the closed word (word 1): the target sets it when it releases the window, collectively
  or not (an exception leaving the ``with`` block, finalize, shrink). Origins check it under
  a lock before every copy, so an origin never writes into memory that is the user's again
  (or freed): a put or get holds a shared lock over its bytes while it checks and copies,
  an accumulate its exclusive one, and the target, after setting the word, takes an
  exclusive lock over everything before its release returns: a copy that saw the window
  open has finished by then, and every later one sees it closed. The price per put or get
  is two ``fcntl`` calls and one load;
* the accumulate locks: open-file-description byte-range locks (``F_OFD_SETLK``) on the
  control file, over the very bytes of the window an accumulate changes. Overlapping
  accumulates serialise, disjoint ones run in parallel, and the kernel drops the locks of a
  process that dies, so a killed origin never leaves a window locked.

A window that pycoll allocates (``Communicator.allocate_window``, MPI's ``Win_allocate``)
lives in the control file itself, after the control page, and every origin maps it: a put
or get is then one ``memcpy`` in the origin's own address space, with no system call and no
lock. The closed word is still checked before each copy, but a copy that races with the
target's release needs no lock: its bytes land in the window's own pages, which stay mapped
as long as anyone maps them and are never anyone else's memory.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import re
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ... import debug
from ...buffers.memory import view_address
from ...errors import CollectiveTimeout, TransportError
from ..base import peer_lost
from ..windows import ExposedWindow, RemoteWindow, wait_until
from .cma import cma_read, process_exited
from .segment import PAGE, SHM_DIR

#: ``struct flock`` on x86-64 Linux: type, whence, start, len, pid (OFD locks need pid 0)
_FLOCK = struct.Struct("hhxxxxqqi4x")
#: the byte range locked while the signal counter changes: far beyond any window's bytes
_SIGNAL_LOCK = 1 << 62
#: the control page's words: the signal counter, the closed word
_SIGNALS, _CLOSED = 0, 1
#: how long a target's release waits for origins' copies in flight (each holds its lock for
#: one copy; only a stopped origin process holds it longer)
RELEASE_WAIT_SECONDS = 30.0


def check_path(path: str, prefix: str, peer: int) -> str:
    """A peer's window record names its control file: accept only ``<prefix>-win<n>`` of the
    peer's own (store-published) prefix, directly under the shm directory, so that a lying
    record cannot make this rank map and write some other file of its user."""
    if (os.path.dirname(path) != SHM_DIR or os.path.normpath(path) != path
            or not prefix.startswith(SHM_DIR + "/")
            or re.fullmatch(re.escape(prefix) + r"-win[0-9]+", path) is None):
        raise TransportError(f"shm: peer rank {peer}'s window record names the control file "
                             f"{path!r}, not one of its own under {SHM_DIR} (prefix "
                             f"{prefix!r}): refused", peer=peer)
    return path


def _lock(fd: int, start: int, length: int, deadline: float, peer: int,
          kind: int = fcntl.F_WRLCK) -> None:
    request = _FLOCK.pack(kind, os.SEEK_SET, start, length, 0)

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
    """An open, mapped control file: the descriptor the locks are taken on, the counter, and
    (``data`` bytes after the control page) an allocated window's memory."""

    def __init__(self, path: str, create: bool, data: int = 0) -> None:
        size = PAGE + -(-data // PAGE) * PAGE
        flags = os.O_RDWR | os.O_NOFOLLOW | (os.O_CREAT | os.O_EXCL if create else 0)
        self.fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.posix_fallocate(self.fd, 0, size)
            elif os.fstat(self.fd).st_size != size:
                raise TransportError(f"shm: window control file {path} has the wrong size")
            self.mm = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise
        self.words = memoryview(self.mm)[:PAGE].cast("Q")
        #: the signal and closed words as an array (``direct``: kept by whoever copies)
        self.flags = np.frombuffer(self.mm, np.uint64, 2)
        #: an allocated window's bytes (empty otherwise)
        self.data = np.frombuffer(self.mm, np.uint8, data, PAGE)

    def close(self) -> None:
        """Idempotent: a window invalidated and then closed releases its handles twice. An
        allocated window's memory stays mapped while arrays of it live (the user's
        ``Window.local``): the mapping goes with the last of them."""
        if self.fd < 0:
            return
        self.words.release()
        self.data = np.empty(0, np.uint8)
        self.flags = np.zeros(2, np.uint64)
        try:
            self.mm.close()
        except BufferError:
            pass
        os.close(self.fd)
        self.fd = -1


class ShmExposedWindow(ExposedWindow):
    def __init__(self, path: str, ptr: int, nbytes: int, rank: int,
                 allocate: bool = False) -> None:
        """``allocate``: the window's memory is made here, in the control file (``memory``);
        ``ptr`` is ignored."""
        self.path = path
        self.rank = rank
        self._control = _Control(path, create=True, data=nbytes if allocate else 0)
        if allocate:
            self.memory = self._control.data
            ptr = self.memory.ctypes.data
        self._ptr, self._nbytes = ptr, nbytes
        self.record = {"pid": os.getpid(), "addr": ptr, "nbytes": nbytes, "path": path,
                       "mapped": allocate}

    def signals(self) -> int:
        return int(self._control.words[_SIGNALS])   # an aligned 8-byte load: atomic on x86-64

    def local(self) -> RemoteWindow:
        return ShmRemoteWindow(self.rank, self.record, cma=False)

    def seal(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        """Set the closed word, then wait for the copies that saw it open (their shared or
        exclusive locks) by taking an exclusive lock over every byte: once this returns, no
        origin reaches the buffer any more."""
        self.seal()
        if self._control.fd < 0:
            return
        fd = self._control.fd
        self._control.words[_CLOSED] = 1
        try:
            _lock(fd, 0, 0, time.monotonic() + RELEASE_WAIT_SECONDS, self.rank)
            _unlock(fd, 0, 0)
        except CollectiveTimeout:
            debug.logger.warning(
                "shm window of rank %d: an origin held its lock past %.0f s while the window "
                "was released (a stopped process?): its copy may still land in the buffer",
                self.rank, RELEASE_WAIT_SECONDS)
        self._control.close()


class ShmRemoteWindow(RemoteWindow):
    """``cma``: copy with cross-memory attach (a peer); False: this process's own memory."""

    def __init__(self, peer: int, record: dict[str, Any], cma: bool) -> None:
        self.peer = peer
        self.pid = int(record["pid"])
        self.addr = int(record["addr"])
        self.nbytes = int(record["nbytes"])
        self.cma = cma
        #: OFD locks belong to the open file description, which this handle's threads share:
        #: they take their locks (and change the counter) one at a time
        self._mutex = threading.Lock()
        #: an allocated window: mapped here too, so copies need neither CMA nor a lock
        self.mapped = bool(record.get("mapped"))
        try:
            self._control = _Control(str(record["path"]), create=False,
                                     data=self.nbytes if self.mapped else 0)
        except FileNotFoundError:
            raise TransportError(f"shm: peer rank {peer}'s window control file is gone: the "
                                 "peer closed the window or died while it was made",
                                 peer=peer) from None

    def check_alive(self) -> None:
        """``PeerLost`` if the target process is gone: copies into a mapped window cannot
        tell (its pages outlive it), so ``flush`` and accumulates ask."""
        if self.cma and process_exited(self.pid):
            raise peer_lost(self.peer, f"process {self.pid} exited; its window is gone")

    def direct(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(the window's bytes, the control words whose ``[1]`` says closed) where this
        process maps them (an allocated window), for ``Window``'s copies without a call
        down here; None otherwise."""
        return (self._control.data, self._control.flags) if self.mapped else None

    def _check(self, offset: int, nbytes: int) -> None:
        if offset < 0 or offset + nbytes > self.nbytes:   # a lying record: never copy
            raise TransportError(f"shm: {nbytes} bytes at offset {offset} outside peer "
                                 f"rank {self.peer}'s window of {self.nbytes} bytes",
                                 peer=self.peer)

    def _open(self) -> None:
        """Under a lock: refuse if the target released its window (nothing moves)."""
        if self._control.words[_CLOSED]:
            raise TransportError(f"shm: peer rank {self.peer} released its window (closed, "
                                 "left by an exception, finalized or shrunk): nothing was "
                                 "moved; close the window on every rank", peer=self.peer)

    def _copy(self, offset: int, view: memoryview, write: bool) -> None:
        if not view.nbytes:
            return
        if self.mapped:
            mapped = self._control.data[offset:offset + view.nbytes]
            if write:
                mapped[:] = np.frombuffer(view, np.uint8)
            else:
                np.frombuffer(view, np.uint8)[:] = mapped
            return
        if self.cma:
            cma_read(self.pid, self.addr + offset, view, self.peer, write=write)
            return
        here, there = view_address(view), self.addr + offset
        if write:
            ctypes.memmove(there, here, view.nbytes)
        else:
            ctypes.memmove(here, there, view.nbytes)

    def _held(self, start: int, length: int, deadline: float, kind: int) -> None:
        """Take this handle's mutex and the byte-range lock (``_release`` gives both back)."""
        if not self._mutex.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise CollectiveTimeout(f"deadline passed waiting for peer rank {self.peer}'s "
                                    "window lock (another thread of this rank holds it)")
        try:
            _lock(self._control.fd, start, length, deadline, self.peer, kind)
        except BaseException:
            self._mutex.release()
            raise

    def _release(self, start: int, length: int) -> None:
        try:
            _unlock(self._control.fd, start, length)
        finally:
            self._mutex.release()

    def _locked_copy(self, offset: int, view: memoryview, deadline: float,
                     write: bool) -> None:
        self._check(offset, view.nbytes)
        if self.mapped:         # the window's own pages: nothing else to guard (see above)
            self._open()
            self._copy(offset, view, write)
            return
        length = max(view.nbytes, 1)
        self._held(offset, length, deadline, fcntl.F_RDLCK)
        try:
            self._open()
            self._copy(offset, view, write)
        finally:
            self._release(offset, length)

    def write(self, offset: int, view: memoryview, deadline: float = 0.0) -> None:
        self._locked_copy(offset, view, deadline, write=True)

    def read(self, offset: int, view: memoryview, deadline: float = 0.0) -> None:
        self._locked_copy(offset, view, deadline, write=False)

    def update(self, offset: int, nbytes: int, fn: Callable[[memoryview], None],
               deadline: float) -> None:
        self._check(offset, nbytes)
        if self.mapped:
            self.check_alive()
        scratch = memoryview(bytearray(nbytes))
        length = max(nbytes, 1)
        self._held(offset, length, deadline, fcntl.F_WRLCK)
        try:
            self._open()
            self._copy(offset, scratch, write=False)
            fn(scratch)
            self._copy(offset, scratch, write=True)
        finally:
            self._release(offset, length)

    def add_signal(self, value: int, deadline: float) -> None:
        self.check_alive()                           # the counter would take it silently
        self._held(_SIGNAL_LOCK, 1, deadline, fcntl.F_WRLCK)
        try:
            self._open()
            words = self._control.words
            words[_SIGNALS] = (int(words[_SIGNALS]) + value) % (1 << 64)
        finally:
            self._release(_SIGNAL_LOCK, 1)

    def close(self) -> None:
        self._control.close()
