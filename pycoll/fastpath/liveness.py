"""What a fast call checks while it waits: between the kernel's sleep slices
(``WaitPolicy.liveness_seconds``), back in Python, a waiting rank looks at

* the job's abort records (another rank failed: ``Aborted``, naming the root cause);
* the processes of the ranks that have not published yet (one exited: ``PeerLost``);
* its channels, for a message of the generic path for the same call from a rank that has
  not published (the ranks disagree about the call: ``CollectiveMismatch`` at once, not a
  timeout);
* the deadline (``CollectiveTimeout`` naming the ranks that never published).

And after the first fast call that follows a call of the generic path, once, for messages
of that call that nobody received (``refuse_leftovers``).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from ..algorithms.primitives import Peers
from ..errors import CollectiveMismatch, PycollError, describe
from ..tags import describe_tag
from ..transports.base import Channel, peer_lost
from ..transports.progress import WaitTimeout
from ..transports.shm.cma import process_exited
from .calls import FastCall
from .segment import SharedSlots


class Liveness:
    """The checks of one communicator's fast path (rank ``rank`` of ``size``; ``members``
    numbers its ranks as the channels do: world ranks; ``check`` polls the abort record)."""

    def __init__(self, rank: int, size: int, members: Sequence[int], peers: Peers,
                 check: Callable[[], None] | None) -> None:
        self.rank = rank
        self.size = size
        self.members = list(members)
        self.peers = peers
        self.check = check

    def between_slices(self, slots: SharedSlots, state: int, call: FastCall, seq: int,
                       word: int, stage: int, flag: int, deadline: float,
                       only: int | None = None) -> None:
        """Raise if the call cannot complete; return to sleep another slice otherwise.
        ``state`` < 0 is the kernel's report of a peer that published another call; ``only``:
        the one rank waited for (a one-way broadcast's root), else every other."""
        if state < 0:
            peer = -state - 1
            theirs, their_bytes = slots.call_of(peer, stage)
            peer = self.members[peer]
            raise CollectiveMismatch(
                f"peer rank {peer} published {describe_tag(-theirs - 1)} ({their_bytes} bytes) "
                f"in the fast path's slot where this rank is in {describe_tag(-word - 1)} "
                f"({call.nbytes} bytes): the two ranks disagree on the collective or on its "
                "arguments (dtype, element count, op, root or premul factor), or one of them "
                "skipped a call. Hint: PYCOLL_DEBUG=DETAIL reports who called what", peer=peer)
        if self.check is not None:
            self.check()            # an abort record first: it names the root cause
        missing = [r for r in (range(self.size) if only is None else (only,))
                   if r != self.rank and not slots.published(r, stage, flag)]
        self.raise_if_exited(slots, missing)
        self.refuse_generic(missing, word)
        if time.monotonic() >= deadline:
            # reported like the generic path's timeout (which names world ranks too)
            raise WaitTimeout([], [self.members[r] for r in missing])

    def raise_if_exited(self, slots: SharedSlots, ranks: Sequence[int]) -> None:
        """PeerLost for the first of ``ranks`` whose process has exited (named as the
        channels name ranks: world ranks)."""
        for r in ranks:
            pid = slots.pid(r)
            if pid and process_exited(pid):
                raise peer_lost(self.members[r], f"process {pid} exited")

    def broken_read(self, slots: SharedSlots, call: FastCall, seq: int) -> None:
        """A read of a peer's buffer failed mid-call: a peer that exited is PeerLost, else
        the OS refused after allowing it (the call cannot be redone: buffers changed)."""
        self.raise_if_exited(slots, [r for r in range(self.size) if r != self.rank])
        raise PycollError(f"{describe(self.rank, call.collective, seq)}: reading a peer's "
                          "buffer with process_vm_readv failed after the call had started "
                          "(it worked a moment before); set PYCOLL_SHM_CMA=0 to avoid "
                          "cross-memory attach")

    def refuse_generic(self, missing: Sequence[int], word: int) -> None:
        """A missing rank that sent this rank a message of the generic path for this very
        call (or an earlier one) disagrees about the call: its count, dtype or op took it
        off the fast path. Its channel is opened here if it was not yet (the generic path
        opens channels lazily, from both sides), so that its message can arrive at all."""
        channels = self.peers.channels
        opened = []
        for r in missing:
            try:
                opened.append(channels[r])
            except PycollError:
                continue         # unreachable: the liveness checks will say why
        self._read_and_check(opened, -word - 1)

    def refuse_leftovers(self, word: int) -> None:
        """After the first fast call that follows a call of the generic path: a message of
        that call (or an earlier one) still held, or still unread in an inbox, was sent for a
        receive that was never posted: the ranks disagreed about that call (two that both
        believed they were a scatter's root, say). The generic path finds these when its
        next receive is posted; fast calls post none, so they look once here. Every peer
        has entered this fast call, so its messages of earlier calls have been sent."""
        channels = list(self.peers.channels.values())
        if channels:
            self._read_and_check(channels, -word - 1)

    def _read_and_check(self, channels: list[Channel], tag: int) -> None:
        """Raise ``CollectiveMismatch`` for a message on ``channels``, held or still unread,
        that disagrees with call ``tag``."""
        with self.peers.engine.lock:
            for ch in channels:
                ch.progress()
                ch.check_leftovers(tag)

