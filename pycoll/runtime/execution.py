"""Execution: number every call, record it, run it under a deadline, report its failure.

A communicator owns one ``Execution``; the collectives, the fast path and persistent plans
run their calls through it and touch nothing else of it. A call arrives as a ``CallInfo``
(what it is) and a body (``body(peers)``: what it does). The execution gives it a sequence
number (collectives and point-to-point calls count separately: point-to-point involves only
some ranks), a message tag made of that number and the call's kind (``tags``), a
flight-recorder entry, a deadline, and a place to run: inline in the caller's thread when
nothing is queued (a thread hand-off costs more than a small allreduce), else on the
communicator's worker thread, strictly in issue order, which is what keeps ranks matched
without negotiation. A rooted call (``CallInfo.root`` set), and one with nothing to move,
runs its body beside an agreement round (``algorithms.agreement``, ``CallInfo.agrees_apart``):
it returns on no rank before every rank showed that it runs the same call. Failures go
through ``failures.Failures``.

A body that needs no channels (the fast path's compiled kernels) may run inline without a
``Peers``: ``begin_inline`` (``state.ExecutionState``, compiled with the fast path's call)
claims the execution and numbers the call, ``finish_inline`` (or ``fail_inline``) ends it.
Everything else goes through ``execute``.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..algorithms import agreement
from ..algorithms.primitives import Peers
from ..errors import PycollError, Revoked, TransportError
from ..tags import collective_tag, tag_low_bits
from ..timeouts import as_seconds
from .calls import CallInfo
from .compiled import load
from .failures import Failures
from .flight_recorder import T_ENDED, T_SCHEDULED, T_STARTED, FlightRecorder
from .work import Executor, Work

if TYPE_CHECKING:
    from .state import ExecutionState
else:
    ExecutionState = load("pycoll.runtime.state")[0].ExecutionState

Body = Callable[[Peers], None]


class Execution(ExecutionState):
    """Sequencing and running of one communicator's calls.

    ``peers`` is the communicator's one ``Peers`` (re-armed for each call: calls never
    overlap, and building a fresh one costs more than a small message takes).
    """

    #: the state's recorder is this communicator's ``FlightRecorder`` (what readers such as
    #: ``status`` and ``metrics`` use beyond ``RecorderState``)
    recorder: FlightRecorder | None

    def __init__(self, rank: int, size: int, name: str, timeout: float, comm_id: int,
                 peers: Peers, failures: Failures) -> None:
        self.executor = Executor(name)
        # the per-call fields, and ``begin_inline`` (``state.ExecutionState``): ``idle`` is
        # held while a call runs (inline or on the worker); ``queued``: the asynchronous
        # calls waiting for the worker, which a fast call runs after (the generic path)
        super().__init__(failures.recorder, self.executor.idle(), self.executor.pending)
        self.rank = rank
        self.size = size
        self.name = name
        #: the communicator's default deadline of a call, in seconds
        self.timeout = timeout
        self.comm_id = comm_id
        self.peers = peers
        self.failures = failures
        self.detail = failures.detail
        #: point-to-point calls started so far (collectives: ``seq``)
        self.p2p_seq = 0
        self._failed: BaseException | None = None
        self._closed = False
        self._low: dict[str, int] = {}

    @property
    def failed(self) -> BaseException | None:
        """Why this communicator failed (None while it works): every later call is refused."""
        return self._failed

    @failed.setter
    def failed(self, err: BaseException | None) -> None:
        self._failed = err
        self._refusing = err is not None or self._closed

    @property
    def closed(self) -> bool:
        """Finalized: every later call is refused."""
        return self._closed

    @closed.setter
    def closed(self, value: bool) -> None:
        self._closed = value
        self._refusing = value or self._failed is not None

    def refusal(self, collective: str, seq: int | None) -> PycollError:
        """The error of a call refused because the communicator failed or was revoked: a
        ``Revoked`` (the same type, so that elastic code catches it) or a ``PycollError``."""
        failed = self.failed
        call = collective if seq is None else f"{collective} #{seq}"
        if isinstance(failed, Revoked):
            return type(failed)(f"rank {self.rank}: {call} refused: {failed}",
                                failed_rank=failed.failed_rank, lost_rank=failed.lost_rank,
                                record=failed.record)
        return PycollError(f"rank {self.rank}: {call} refused: this communicator failed "
                           f"earlier ({failed}); shrink it (docs/elastic.md) or create a new "
                           "one (re-init)")

    def deadline_of(self, timeout: Any) -> float:
        """Seconds a call may take: ``timeout`` (seconds or a timedelta) or the default."""
        return self.timeout if timeout is None else (as_seconds(timeout) or self.timeout)

    def refuse_if_unusable(self, collective: str) -> None:
        if isinstance(self.failed, Revoked):    # also once a shrink let it go
            raise self.refusal(collective, None)
        if self.closed:
            raise PycollError(f"rank {self.rank}: {collective} called after finalize()")
        if self.failed is not None:
            raise self.refusal(collective, None)

    # -- calls with a body ---------------------------------------------------------------
    def execute(self, info: CallInfo, body: Body, timeout: Any, async_op: bool,
                output: Any = None, generic: bool = True,
                then: Callable[[int], None] | None = None) -> Work | None:
        """Number, record and run one call (inline when idle, else queued).

        ``output`` is what ``Work.result()`` returns (an ``Outcome`` when the body fills
        it). ``generic``: the body sends messages through the channels (the fast path's
        kernels run as a body too, and do not). ``then(seq)`` runs once the call completed
        on this rank; what it raises reaches the caller (or the work handle) without failing
        the communicator (the integrity check's verdict: the ranks are still in step).
        """
        self.refuse_if_unusable(info.collective)
        limit = self.deadline_of(timeout)
        if info.p2p:
            self.p2p_seq += 1
            seq = self.p2p_seq
        else:
            self.seq += 1
            seq = self.seq
        fr = self.recorder
        rec = fr.open(seq, info) if fr is not None else None
        fp = info.fingerprint() if self.detail and not info.p2p else None

        if not async_op and self.executor.run_inline_if_idle():
            try:
                self._run(info, seq, body, limit, rec, fp, generic)
            finally:
                self.executor.release()
            if then is not None:
                then(seq)
            return None

        def task() -> None:
            self._run(info, seq, body, limit, rec, fp, generic)
            if then is not None:
                then(seq)

        work = Work(info.collective, seq, self.rank, output)
        if rec is not None:
            rec[T_SCHEDULED] = time.monotonic()   # queued behind other calls
        self.executor.submit(task, work)
        if not async_op:
            work.wait()
            return None
        return work

    def _run(self, info: CallInfo, seq: int, body: Body, limit: float, rec: list | None,
             fp: dict | None, generic: bool) -> None:
        collective = info.collective
        if self.failed is not None:   # queued before an earlier call failed
            raise self.refusal(collective, seq)
        start = time.monotonic()
        deadline = start + limit
        self.current = None              # no call runs inline now (``running_inline``)
        if rec is not None:
            rec[T_STARTED] = start
        peers = self.peers
        peers.deadline = deadline
        peers.posted.clear()
        low = self._low.get(collective)
        if low is None:
            low = self._low[collective] = tag_low_bits(collective, self.comm_id)
        # what this rank believes the call is travels in every message's tag: ranks that
        # disagree never match, and the matcher reports it (tags.py)
        peers.tag = collective_tag(seq, low, info.signature())
        try:
            if fp is not None:
                self.failures.compare_fingerprints(info, seq, deadline, rec)
            if generic and not info.p2p:
                self.generic_ran = True
            if generic and info.agrees_apart and self.size > 1:
                # a rooted or empty call: no rank returns before every rank showed it agrees
                first = agreement.begin(peers)
                body(peers)
                agreement.finish(peers, first)
            else:
                body(peers)
            if not info.p2p:    # messages nobody will ever receive? (tags.py)
                for ch in {id(r.channel): r.channel for r in peers.posted}.values():
                    ch.check_leftovers(peers.tag, unread=False)
        except BaseException as e:  # noqa: BLE001 - every failure is reported, then re-raised
            waiting = sorted({r.channel.peer for r in peers.posted if not r.done})
            self._abandon(collective, seq)
            err = self.fail(info, seq, limit, e, rec, waiting)
            if err is e:
                raise
            raise err from None
        if rec is not None:
            rec[T_ENDED] = time.monotonic()

    def _abandon(self, collective: str, seq: int) -> None:
        """Break the channels that still carry requests of a failed call (see
        ``Channel.abandon``); other pairs stay usable."""
        peers = self.peers
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

    # -- calls without channels, inline (the fast path) ----------------------------------
    def fail_inline(self, info: CallInfo, e: BaseException) -> BaseException:
        """The inline call failed with ``e``: the error to raise (see ``fail``)."""
        try:
            return self.fail(info, self.seq, self.timeout, e, self.current, None)
        finally:
            self.idle.release()

    def running_inline(self) -> list | None:
        """The flight record of the call running inline now, if one does."""
        return self.current if self.idle.locked() else None

    def dump(self, reason: str) -> str | None:
        """Write the flight recorder's dump now; its path (None: recording is off)."""
        return self.failures.dump(reason, None, self.seq, self.running_inline())

    # -- failure -------------------------------------------------------------------------
    def fail(self, info: CallInfo, seq: int, limit: float, e: BaseException,
             rec: list | None, waiting: list[int] | None) -> BaseException:
        """Turn a failure inside call ``seq`` into the error to raise; tell the other ranks.

        Marks the communicator failed, posts the abort record (first failure wins),
        attributes a lost peer that merely left after failing to the rank that really
        failed, and dumps the flight recorder, naming the file in the message.
        """
        f = self.failures
        err, record, pending = f.explain(info, seq, limit, e, waiting)
        self.failed = err
        err = self.failed = f.publish(err, record, seq, e)
        if rec is not None:
            FlightRecorder.fail(rec, pending, err)
        f.attach_dump(err, self.seq)
        return err

    # -- the worker thread ----------------------------------------------------------------
    def on_worker(self) -> bool:
        """Whether the calling thread is this communicator's worker (a callback of a work
        handle runs there, and must not wait on a later call)."""
        return self.executor.thread is threading.current_thread()

    def close(self) -> None:
        self.closed = True
        self.executor.close()
