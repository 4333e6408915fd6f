"""Execution: number every call, record it, run it under a deadline, report its failure.

A collective is a closure (``body(peers)``) built by the communicator after planning. This
module gives it a sequence number (collectives and point-to-point calls count separately:
point-to-point involves only some ranks), a message tag derived from that number, the
collective and the communicator, a flight-recorder entry, a deadline, and a place to run:
inline in the caller's thread when nothing is queued (a thread hand-off costs more than a
small allreduce), else on the communicator's worker thread, strictly in issue order, which is
what keeps ranks matched without negotiation. Failures go through ``faults.FaultHandling``.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from .algorithms.primitives import Peers
from .errors import PycollError, TransportError
from .faults import P2P, FaultHandling
from .tags import SEQ_MASK, SEQ_SHIFT, SIG_SHIFT, signature, tag_low_bits
from .timeouts import as_seconds
from .work import Executor, Work

if TYPE_CHECKING:
    from .planning import Planner

Body = Callable[[Peers], None]


class Execution(FaultHandling):
    """Sequencing and running of calls (the communicator's base class)."""

    rank: int
    size: int
    name: str
    timeout: float
    _peers: Peers
    _comm_id: int
    _plan: "Planner"

    def _init_execution(self) -> None:
        self._executor = Executor(self.name)
        self._seq = 0
        self._p2p_seq = 0
        self._failed = None
        self._closed = False
        self._tag_low: dict[str, int] = {}
        self._last_sig: tuple = ("", None, 0)
        #: a collective ran on the generic path since the last fast call (see
        #: ``fastpath.runner.FastPath._refuse_leftovers``)
        self._generic_ran = False

    def _execute(self, collective: str, nbytes: int, body: Body, timeout: Any,
                 async_op: bool, sig: tuple = (None, None, None, None),
                 output: Any = None) -> Work | None:
        """Number, record and run one operation (inline when idle, else queued).

        ``sig`` is (dtype, element count, op, root): what DETAIL compares across ranks.
        ``output`` is what ``Work.result()`` returns (an ``Outcome`` when the body fills it).
        """
        if self._closed:
            raise PycollError(f"rank {self.rank}: {collective} called after finalize()")
        if self._failed is not None:
            raise PycollError(f"rank {self.rank}: {collective} refused: this communicator failed "
                              f"earlier ({self._failed}); create a new one (re-init)")
        limit = self.timeout if timeout is None else (as_seconds(timeout) or self.timeout)
        if self._plan.device_buffers:        # CUDA buffers: used directly or staged
            body = self._plan.take_device_call().wrap(body)
        if collective in P2P:
            self._p2p_seq += 1
            seq = self._p2p_seq
        else:
            self._seq += 1
            seq = self._seq
        fr = self._flight
        rec = None
        if fr is not None:   # flight recorder, inlined: a few stores (see flight_recorder.py)
            rec = [seq, collective, nbytes, 0, 0.0, 0.0, 0.0, body, None]
            i = fr.count
            fr.count = i + 1
            fr.ring[i % fr.capacity] = rec
        fp = (self._fingerprint(collective, nbytes, sig)
              if self._detail and collective not in P2P else None)

        if not async_op and self._executor.run_inline_if_idle():
            try:
                self._run(collective, seq, nbytes, body, limit, rec, fp, sig)
            finally:
                self._executor.release()
            return None

        def task() -> None:
            self._run(collective, seq, nbytes, body, limit, rec, fp, sig)

        work = Work(collective, seq, self.rank, output)
        if rec is not None:
            rec[4] = time.monotonic()   # scheduled (queued behind other collectives)
        self._executor.submit(task, work)
        if not async_op:
            work.wait()
            return None
        return work

    def _run(self, collective: str, seq: int, nbytes: int, body: Body, limit: float,
             rec: list | None = None, fp: dict | None = None,
             sig: tuple = (None, None, None, None)) -> None:
        if self._failed is not None:   # queued before an earlier collective failed
            raise PycollError(f"rank {self.rank}: {collective} #{seq} refused: this "
                              f"communicator failed earlier ({self._failed}); create a new one")
        start = time.monotonic()
        deadline = start + limit
        if rec is not None:
            rec[5] = start      # started
        # One Peers per communicator, re-armed for each call: tasks never overlap (the
        # executor runs one at a time), and building a fresh one costs more than a small
        # message takes.
        peers = self._peers
        peers.deadline = deadline
        peers.posted.clear()
        low = self._tag_low.get(collective)
        if low is None:
            low = self._tag_low[collective] = tag_low_bits(collective, self._comm_id)
        # the signature of what this rank believes the call is travels in every message's
        # tag: ranks that disagree never match, and the matcher reports it (tags.py)
        last = self._last_sig
        if sig == last[1] and collective == last[0]:
            sig16 = last[2]                 # the same call as last time: no hashing
        else:
            sig16 = 0 if collective in P2P else signature(collective, sig)
            self._last_sig = (collective, sig, sig16)
        peers.tag = -(((seq & SEQ_MASK) << SEQ_SHIFT) | (sig16 << SIG_SHIFT) | low) - 1  # tags.collective_tag
        try:
            if fp is not None:
                self._compare_fingerprints(collective, seq, fp, deadline, rec)
            if collective not in P2P and not getattr(body, "fast", False):
                self._generic_ran = True     # (the next fast call looks for leftovers)
            body(peers)
            if collective not in P2P:    # messages nobody will ever receive? (tags.py)
                for r in peers.posted:
                    if r.channel._match.unexpected:
                        r.channel._match.check_leftovers(peers.tag)
        except BaseException as e:  # noqa: BLE001 - every failure is reported, then re-raised
            waiting = sorted({r.channel.peer for r in peers.posted if not r.done})
            self._abandon(peers, collective, seq)
            err = self._collective_failed(collective, seq, limit, e, rec, sig, waiting)
            if err is e:
                raise
            raise err from None
        if rec is not None:
            rec[6] = time.monotonic()   # completed
            rec[7] = None       # drop the closure: never keep a user's tensor alive

    def _abandon(self, peers: Peers, collective: str, seq: int) -> None:
        """Break the channels that still carry requests of a failed call (see
        ``Channel.abandon``); other pairs stay usable."""
        pending = [r for r in peers.posted if not r.done]
        peers.posted.clear()
        if not pending:
            return
        error = TransportError(
            f"rank {self.rank}: this channel was closed after {collective} #{seq} failed with "
            f"messages still in flight on it (communicator {self.name}); the pair is out of "
            "step: create a new communicator", peer=None)
        with peers.engine.lock:
            for ch in {id(r.channel): r.channel for r in pending}.values():
                ch.abandon(error)

    def _stop_execution(self) -> None:
        self._closed = True
        self._executor.close()
