"""A torch process group's sends and receives, deferred into batches.

``send``/``recv`` (and so ``isend``/``irecv``) collect into a batch that is posted as one
pycoll ``batch_p2p`` when any work of the batch is waited on or queried, or when the next
collective is issued on the group. All requests of a batch are in flight together, so
``[send to 1, recv from 1]`` on both ranks cannot deadlock, as ``batch_isend_irecv`` promises:
pycoll's shared-memory transport sends large messages by rendezvous, so a lone send would wait
for its receive.
"""
from __future__ import annotations

import threading
from typing import Any, cast

import torch

from ..comm.communicator import Communicator
from ..errors import InvalidArgument, PycollError
from ..runtime.work import Work
from .contiguous import ContiguousStandIns
from .work import PycollWork, begin_record

#: one deferred request: kind ("send" | "recv"), the tensor pycoll uses, peer, tag, the torch
#: work that completes with it, and the stand-ins to copy back
_Request = tuple[str, torch.Tensor, int, int, PycollWork, ContiguousStandIns]


class DeferredP2P:
    """The sends and receives issued on one group and not posted yet.

    The group calls ``flush`` before each collective (when ``batch`` is not empty), so the
    batch reaches the communicator before the collective does, in issue order."""

    def __init__(self, comm: Communicator, rank: int, size: int) -> None:
        self._comm = comm
        self._rank = rank
        self._size = size
        self.batch: list[_Request] = []
        self._lock = threading.Lock()

    def defer(self, kind: str, t: torch.Tensor, peer: int, tag: int) -> PycollWork:
        """Add a send or a receive to the batch; its work posts the batch when touched."""
        peer, tag = int(peer), int(tag)
        if not 0 <= peer < self._size or peer == self._rank:
            raise InvalidArgument(f"rank {self._rank}: {kind}: peer {peer} is not another rank "
                                  f"of this group (0..{self._size - 1})")
        if tag < 0:
            raise InvalidArgument(f"rank {self._rank}: {kind}: tag must be >= 0, not {tag}")
        st = ContiguousStandIns()
        h = st.inp(t) if kind == "send" else st.out(t)
        work = PycollWork(kind, [t], self._rank, flush=self.flush,
                          record=begin_record(kind, [t]))
        work.set_source(peer)
        with self._lock:
            self.batch.append((kind, h, peer, tag, work, st))
        return work

    def flush(self) -> None:
        """Post the batch as one ``batch_p2p`` (nothing if it is empty)."""
        with self._lock:
            batch, self.batch = self.batch, []
        if not batch:
            return
        try:
            pw = cast(Work, self._comm.batch_p2p([(k, h, p, t) for k, h, p, t, _, _ in batch],
                                                 async_op=True))
        except BaseException as e:
            for *_, work, _st in batch:
                work.finish(e)
            return

        def done(w: Any) -> None:
            for *_, work, st in batch:
                work.finish_after(w.exception(), st.copy_back)

        pw.add_done_callback(done)

    def recv_from_any(self, t: torch.Tensor, tag: int) -> PycollWork:
        """Post a receive from whichever rank sends first, after the batch so far."""
        if self.batch:
            self.flush()
        st = ContiguousStandIns()
        h = st.out(t)
        work = PycollWork("recv_anysource", [t], self._rank,
                          record=begin_record("recv", [t]))
        try:
            pw = cast(Work, self._comm.recv(h, None, int(tag), async_op=True))
        except BaseException as e:
            work.finish(e)
            raise

        def done(w: Any) -> None:
            work.set_source(w.source_rank() if w.exception() is None else -1)
            work.finish_after(w.exception(), st.copy_back)

        pw.add_done_callback(done)
        return work

    def fail_pending(self, message: str) -> None:
        """Fail every request not posted yet with ``PycollError(message)`` (group shutdown)."""
        with self._lock:
            batch, self.batch = self.batch, []
        for *_, work, _st in batch:
            work.finish(PycollError(message))
