"""The fast path's shared segment: layout, creation by rank 0, mapping by the others.

Layout (``kernels.py`` reads it): a 4 KiB header page (futex word, sleeper count, each
rank's pid, each rank's private futex timeout), then two slots per rank, each one header
line (flag, sequence word, signature, length, and the first payload bytes) followed by the
payload, padded to 128 bytes so that no two ranks' flags share a cache line (or the pair the
adjacent-line prefetcher fetches together).

The segment is made like the shm transport's inboxes (``transports.shm.segment.Segment``): a
name with the creator's pid (swept if it dies), an unguessable suffix, mode 0600, sized with
``posix_fallocate`` and renamed into place; rank 0 publishes the name through the job's
authenticated store, and the last rank to map it unlinks it, so nothing is left in /dev/shm.
Rank 0 returns only once that rank has said so: a creator that went on, finished and exited
while a slow rank had not mapped the segment yet left it to the sweep of dead processes'
segments (``transports.shm.segment.sweep``), which a finished peer runs at its close, and the
slow rank found it gone.
"""
from __future__ import annotations

import os
import secrets
from collections.abc import Callable

import numpy as np

from rendezvous import Store

from .. import debug
from ..errors import PycollError, TransportError
from ..timeouts import watched_multi_get
from ..transports.shm.segment import SHM_DIR, Segment, segment_prefix

# layout (byte offsets; the kernels index the header as uint32 or uint64 words)
HEADER_BYTES = 4096          # the header page (a PAGE, as transports.shm.segment.Segment lays out)
FUTEX_WORD = 256 // 4        # uint32 index: bumped on every wake
SLEEPERS = 384 // 4          # uint32 index: ranks inside futex_wait (or about to be)
PID_BASE = 512 // 8          # uint64 index: each rank's pid (MAX_RANKS of them)
TIMESPEC_BASE = 1536 // 8    # uint64 index: one 16-byte timespec per rank, private to it
FLAG, SEQ, SIG, NBYTES = 0, 1, 2, 3     # uint64 words of a slot's header line
DATA = 32                    # payload offset inside a slot


def slot_offset(rank: int, parity: int, stride: int) -> int:
    """Byte offset of ``rank``'s slot ``parity`` (the kernels run this compiled)."""
    return HEADER_BYTES + (rank * 2 + parity) * stride


def stride_for(limit: int) -> int:
    """Bytes per slot: the header line plus the payload, rounded up to 128."""
    return -(-(DATA + limit) // 128) * 128


class SharedSlots:
    """One communicator's mapped segment, as the numpy arrays the kernels take."""

    def __init__(self, segment: Segment, rank: int, size: int, stride: int) -> None:
        self.segment = segment
        self.rank = rank
        self.size = size
        self.stride = stride
        self.bytes = np.frombuffer(segment.mm, dtype=np.uint8)
        self.words = self.bytes.view(np.uint64)
        self.words[PID_BASE + rank] = os.getpid()

    @classmethod
    def setup(cls, store: Store, rank: int, size: int, limit: int, timeout: float,
              watch: Callable[[], None] | None = None) -> SharedSlots | None:
        """Rank 0 creates and names the segment, the others map it (collective: every
        member calls this while the communicator is made). None on every rank when rank 0
        cannot make it (/dev/shm full): the fast path is an optimisation, the generic path
        still works (or, if shared memory is short for it too, says so when it is used).
        ``watch``: see ``timeouts.watched_multi_get``."""
        stride = stride_for(limit)
        slots = 2 * size
        if rank == 0:
            path = os.path.join(SHM_DIR, f"{segment_prefix(os.getpid())}0-"
                                         f"{secrets.token_hex(8)}-fast")
            try:
                seg = Segment.create(path, slots, stride, 0)
            except TransportError as e:
                debug.logger.info("fast path off for this communicator: %s", e)
                store.set("path", "")
                return None
            store.set("path", path)
            try:      # alive, and so not swept, until every rank has mapped it (see above)
                watched_multi_get(store, ["mapped"], timeout, watch)
            except BaseException:
                seg.close()
                try:
                    os.unlink(path)
                except OSError:
                    pass      # the last rank to map it did, after saying so
                raise
        else:
            path = watched_multi_get(store, ["path"], timeout, watch)[0].decode()
            if not path:
                return None
            try:
                opened = Segment.open(path, slots, stride)
            finally:
                last = int(store.add("attached", 1)) == size - 1
            if last:
                store.set("mapped", b"1")    # rank 0 may go on
            if opened is None:
                raise PycollError(f"rank {rank}: the fast path's shared segment {path} "
                                  "vanished before this rank mapped it")
            seg = opened
            if last:
                os.unlink(path)       # every rank has it mapped: drop the name
        return cls(seg, rank, size, stride)

    def pid(self, rank: int) -> int:
        return int(self.words[PID_BASE + rank])

    def published(self, rank: int, stage: int, flag: int) -> bool:
        """Whether ``rank``'s flag of ``stage`` has reached ``flag`` (``kernels._missing``)."""
        return int(self.words[slot_offset(rank, stage & 1, self.stride) // 8 + FLAG]) >= flag

    def call_of(self, rank: int, stage: int) -> tuple[int, int]:
        """The sequence word and length ``rank`` published in its slot for ``stage``."""
        w = slot_offset(rank, stage & 1, self.stride) // 8
        return int(self.words[w + SEQ]), int(self.words[w + NBYTES])

    def payload(self, rank: int, stage: int, nbytes: int) -> np.ndarray:
        start = slot_offset(rank, stage & 1, self.stride) + DATA
        return self.bytes[start:start + nbytes]

    def close(self) -> None:
        self.words = self.bytes = None     # type: ignore[assignment]
        try:
            self.segment.close()
        except BufferError:
            pass        # a view is still alive somewhere: the mapping goes with the process
