"""What an ``Execution`` and its ``FlightRecorder`` change on every call, and the two steps
of a call that touch only that: claiming and numbering an inline call (``begin_inline``) and
opening its flight record (``open``).

One source, two forms: setup.py compiles this module with Cython (``state.pxd`` types the
fields, so that the fast path's compiled call, ``fastpath/callpath.py``, reads and writes
them as C struct fields and calls these methods without Python in between); where it is not
built, or ``PYCOLL_FASTPATH_C=0``, it runs as the plain Python it is (``runtime.compiled``).
``Execution`` derives from ``ExecutionState`` and ``FlightRecorder`` from ``RecorderState``.
"""
from __future__ import annotations

import time
from typing import Any

try:
    import cython
except ImportError:         # interpreted, and Cython is not installed
    from . import nocython as cython

from .. import tags

#: whether this module runs compiled
COMPILED: bool = cython.compiled

#: a record's states (``flight_recorder`` names them): a call of the fast path is recorded
#: completed when it begins
SCHEDULED, STARTED, COMPLETED, FAILED = 0, 1, 2, 3

_monotonic = time.monotonic

if not cython.compiled:     # what state.pxd declares from libc (compiled only)
    CLOCK_MONOTONIC = timespec = None
    clock_gettime: Any = None


def _now() -> float:
    """``time.monotonic()``: read without a Python call where compiled (the same clock)."""
    if cython.compiled:
        ts = cython.declare(timespec)
        clock_gettime(CLOCK_MONOTONIC, cython.address(ts))
        return ts.tv_sec + ts.tv_nsec * 1e-9
    return _monotonic()
#: ``tags``' (typed where compiled: state.pxd)
_SEQ_MASK = tags.SEQ_MASK
_SEQ_SHIFT = tags.SEQ_SHIFT


class RecorderState:
    """A flight recorder's ring: ``capacity`` records, ``count`` ever opened."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.ring: list[list | None] = [None] * capacity
        self.count = 0

    def open(self, seq: int, info: Any, started: float = 0.0, state: int = SCHEDULED
             ) -> list:
        """Start the record of call ``seq`` (state ``scheduled``, or ``started`` at
        ``started``); its owner updates the times in place. A call run inline by the fast
        path is opened ``completed`` (``ExecutionState.begin_inline``). The one place a
        record is made (its fields: ``flight_recorder.SEQ`` ... ``NOTES``)."""
        rec = [seq, info, state, 0.0, started, 0.0, None]
        i = self.count
        self.count = i + 1
        self.ring[i % self.capacity] = rec
        return rec


class ExecutionState:
    """What ``Execution`` changes on every call (see there), and ``begin_inline``."""

    def __init__(self, recorder: RecorderState | None, idle: Any, queued: Any) -> None:
        #: collectives started so far (the last one's number)
        self.seq = 0
        #: when the call running inline started (``time.monotonic``) and its flight record
        self.started = 0.0
        self.current: list | None = None
        #: failed or closed: what ``begin_inline`` checks (``Execution.failed``, ``closed``)
        self._refusing = False
        #: a call sent messages through the channels since the fast path last looked for
        #: messages nobody received (``fastpath.liveness.refuse_leftovers``)
        self.generic_ran = False
        self.recorder = recorder
        #: held while a call runs (inline or on the worker); ``finish_inline()``: the
        #: inline call completed (its flight record was written as completed when it began:
        #: a fast call takes µs, no second clock read; a dump taken while it runs shows it
        #: running, ``Execution.running_inline``)
        self.idle = idle
        self._acquire = idle.acquire
        self.finish_inline = idle.release
        #: the asynchronous calls waiting for the worker: an inline call goes after them
        self.queued = queued

    def begin_inline(self, info: Any, bits: int) -> int:
        """Claim the execution for ``info``, run by the caller now, or return 0: the caller
        then goes through ``Execution.execute`` (an asynchronous call is queued, a call runs
        on another thread, or the communicator cannot take calls, which ``execute`` says).
        Returns the call's word (``tags.call_word`` of its sequence number and ``bits``);
        ``finish_inline`` or ``fail_inline`` must follow."""
        if self._refusing or not self._acquire(False):
            return 0
        if self.queued:                 # an asynchronous call goes first
            self.finish_inline()
            return 0
        try:
            seq = self.seq = self.seq + 1
            self.started = start = _now()
            fr = self.recorder
            if fr is not None:
                # a fast call takes µs: recorded completed now, no second clock read (a
                # dump taken while it runs shows it running: ``Execution.running_inline``)
                self.current = None
                self.current = fr.open(seq, info, start, COMPLETED)
            return ((seq & _SEQ_MASK) << _SEQ_SHIFT) | bits     # tags.call_word, written out
        except BaseException as e:  # noqa: BLE001 - claimed: ended as a failed call
            err = self.fail_inline(info, e)
            if err is e:
                raise
            raise err from None

    def fail_inline(self, info: Any, e: BaseException) -> BaseException:
        """The inline call failed with ``e``: the error to raise (``Execution``'s ends the
        call as failed, marks the communicator failed and tells the other ranks)."""
        self.finish_inline()
        return e
