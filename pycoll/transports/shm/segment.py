"""The shared-memory transport's memory: segment layout, settings, and the files in /dev/shm.

An inbox segment is a control page (head/tail counters, flags, rendezvous completion words;
each word has one writer) followed by a ring of fixed-size slots.
"""
from __future__ import annotations

import mmap
import os
import re
import secrets
import shutil
import struct
from dataclasses import dataclass
from typing import Any, NamedTuple

from ...envvars import env_bool, env_int, env_text
from ...errors import InvalidArgument, TransportError
from .cma import process_exited

SHM_DIR = "/dev/shm"
PAGE = 4096
# Control words (uint64 indices into the control page). Writers: S = sender, R = receiver.
HEAD = 0            # S: slots published
TAIL = 8            # R: slots consumed (own cache line)
ATTACHED = 16       # S: sender has mapped the segment
SENDER_CLOSED = 24  # S
RECEIVER_CLOSED = 32  # R
CMA_STATE = 40      # R: 1 = receiver can read sender's memory, 2 = it cannot
RINGS = 48          # S: 1 = the sender rings the receiver's doorbell (``doorbell.py``)
DONE_BASE = 64      # R: rendezvous completion words, RNDV_WINDOW of them
RNDV_WINDOW = 64

SLOT_HEADER = struct.Struct("<qqqq")   # tag, total message bytes, kind, aux
RNDV_BODY = struct.Struct("<qq")       # sender pid, sender address
EAGER, FIRST, CONT, RNDV, NOTIFY = 0, 1, 2, 3, 4
#: kinds from here on belong to channels built on shm's (cuda_ipc.py's DEVICE is 5)
FIRST_EXTENSION_KIND = 5

PROBE_MAGIC = 0x5059434F4C4C3031  # "PYCOLL01"


@dataclass(frozen=True)
class ShmSettings:
    """Tunables, read from the environment when a transport is opened."""

    # 8 x 256 KiB: messages up to 256 KiB go eager. Cross-memory attach pins the peer's
    # pages on every call, which costs more than two cached copies of a small message, so
    # it only pays once messages are large enough to come from DRAM.
    slot_bytes: int = 256 * 1024
    num_slots: int = 8
    cma: bool = True                 # use process_vm_readv for large messages when permitted
    # Below ~2 MiB, streaming through the (cache-resident) slots beats one cross-memory copy
    # (a 2-rank ring allreduce of 1-4 MiB ran faster with fragments). Above it, one copy
    # instead of two wins. When ranks outnumber cores, CPU time is what runs out, so the copy
    # saved wins from 1 MiB.
    cma_threshold: int = 2 << 20

    @classmethod
    def from_env(cls, crowded: bool = False) -> ShmSettings:
        threshold = (1 << 20) if crowded else cls.cma_threshold
        return cls(env_int("PYCOLL_SHM_SLOT_BYTES", cls.slot_bytes, minimum=64),
                   env_int("PYCOLL_SHM_SLOTS", cls.num_slots, minimum=1),
                   env_bool("PYCOLL_SHM_CMA", True),
                   env_int("PYCOLL_SHM_CMA_THRESHOLD", threshold, minimum=0))


def seq_span(next_seq: int, pending: dict[int, Any]) -> int:
    """How far the next rendezvous sequence number is from the oldest pending one."""
    return next_seq - min(pending)


class Segment:
    """One mapped inbox: a control page plus a ring of slots."""

    def __init__(self, path: str, mm: mmap.mmap, num_slots: int, slot_bytes: int) -> None:
        self.path = path
        self.num_slots = num_slots
        self.slot_bytes = slot_bytes
        self.size = PAGE + num_slots * slot_bytes
        self.mm = mm
        self.ctrl = memoryview(mm)[:PAGE].cast("Q")
        self.data = memoryview(mm)

    @classmethod
    def create(cls, path: str, num_slots: int, slot_bytes: int, cma_state: int) -> Segment:
        """Create, size and initialise under a temporary name, then rename into place."""
        size = PAGE + num_slots * slot_bytes
        tmp = f"{path}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as e:
                free = shutil.disk_usage(os.path.dirname(path)).free
                raise TransportError(
                    f"shm: cannot reserve {size} bytes in {os.path.dirname(path)} ({e.strerror}; "
                    f"{free} bytes free): enlarge it (docker: --shm-size), free space, or use "
                    "PYCOLL_TRANSPORTS=tcp") from None
            mm = mmap.mmap(fd, size)
            seg = cls(path, mm, num_slots, slot_bytes)
            seg.ctrl[CMA_STATE] = cma_state
            os.rename(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        finally:
            os.close(fd)
        return seg

    @classmethod
    def open(cls, path: str, num_slots: int, slot_bytes: int) -> Segment | None:
        """Map a peer's inbox; None while the peer has not created it yet."""
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return None
        try:
            size = PAGE + num_slots * slot_bytes
            if os.fstat(fd).st_size != size:
                raise TransportError(f"shm: segment {path} has the wrong size (expected {size})")
            return cls(path, mmap.mmap(fd, size), num_slots, slot_bytes)
        finally:
            os.close(fd)

    def close(self) -> None:
        self.ctrl.release()
        self.data.release()
        self.mm.close()


class CmaNotice(NamedTuple):
    """A rendezvous held for a receive not yet posted: where to read the bytes with
    cross-memory attach, and the completion word to set after."""

    pid: int
    address: int
    seq: int


# -- leftovers of dead processes -------------------------------------------------------------
# A segment is normally unlinked as soon as both of its ends have mapped it. A job killed
# while setting up (a rank slow to map its peers, then SIGTERM or kill -9) leaves the rest
# behind. Segment names carry the creating process id and its pid namespace
# (``<prefix>-<pid>-n<namespace>-<rank>-<random>...``), so whoever comes later can tell
# leftovers from live segments without any timing: the launcher sweeps its ranks' segments
# once it has reaped them, and every shm transport sweeps the segments of dead processes when
# it opens. Only segments of this pid namespace are judged (containers sharing /dev/shm have
# their own pids), only this user's, and only those of this process's prefix
# (``PYCOLL_SHM_PREFIX``, default ``pycoll``): a test suite gives itself a private prefix so
# that other pycoll jobs on the host neither sweep its leftovers nor have theirs swept by it.

DEFAULT_PREFIX = "pycoll"
_PREFIX_SYNTAX = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def _pid_namespace() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "0"


_NAMESPACE = _pid_namespace()


def name_prefix() -> str:
    """``PYCOLL_SHM_PREFIX``: the first part of every segment's name, read when a transport
    opens (a file name in /dev/shm: letters, digits, ``_.-``, at most 64)."""
    prefix = env_text("PYCOLL_SHM_PREFIX") or DEFAULT_PREFIX
    if not _PREFIX_SYNTAX.fullmatch(prefix):
        raise InvalidArgument(f"PYCOLL_SHM_PREFIX={prefix!r}: use 1-64 letters, digits, '_', "
                              "'.' or '-', starting with a letter or digit")
    return prefix


def segment_prefix(pid: int) -> str:
    return f"{name_prefix()}-{pid}-n{_NAMESPACE}-"


def sweep(pids: Any = None) -> list[str]:
    """Unlink this user's segments of this prefix whose creator is dead (given ``pids``: and
    one of those reaped processes). Returns the names removed."""
    try:
        names = os.listdir(SHM_DIR)
        mine = f"{name_prefix()}-"
    except (OSError, InvalidArgument):    # an invalid prefix named no segment: init refused it
        return []
    wanted = None if pids is None else {int(p) for p in pids}
    uid = os.getuid()
    removed = []
    for name in names:
        if not name.startswith(mine):
            continue
        head = name[len(mine):].split("-", 2)
        if len(head) < 3 or not head[0].isdigit() or head[1] != f"n{_NAMESPACE}":
            continue
        pid = int(head[0])
        if wanted is not None and pid not in wanted:
            continue
        if not process_exited(pid):     # a reaped rank's pid may be a live process's now
            continue
        path = os.path.join(SHM_DIR, name)
        try:
            if os.stat(path).st_uid != uid:
                continue        # another user's: not ours to judge
            os.unlink(path)
            removed.append(name)
        except OSError:
            continue
    return removed
