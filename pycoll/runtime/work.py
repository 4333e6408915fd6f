"""Work handles and the per-communicator executor that runs collectives in issue order.

A synchronous call runs inline in the caller's thread when nothing is queued (a thread
hand-off would cost more than a whole small allreduce); otherwise, and for every
``async_op=True`` call, the collective is queued for the communicator's one worker thread.
Either way collectives execute strictly in the order they were issued, which is what keeps
ranks matched without any negotiation.
"""
from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from ..errors import CollectiveTimeout, PycollError


class Outcome:
    """What a call hands back that is only known once it ran: the value (``allgatherv``'s
    list of arrays) and, for a receive from any source, the rank the message came from."""

    __slots__ = ("value", "source")

    def __init__(self, value: Any = None, source: int | None = None) -> None:
        self.value = value
        self.source = source


class Work:
    """The handle of an asynchronous collective (like torch's ``Work``).

    ``result()`` (and the value of ``get_future()``) is what the collective wrote: the output
    buffer as the caller passed it (the in-place tensor for allreduce and broadcast), a list
    for ``allgatherv``, None for calls that write nothing (barrier, send). For a receive,
    ``source_rank()`` tells who sent the message.
    """

    def __init__(self, collective: str, seq: int, rank: int, output: Any = None) -> None:
        self.collective = collective
        self.seq = seq
        self.rank = rank
        self._output = output
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Work], None]] = []
        self._lock = threading.Lock()
        self._future: concurrent.futures.Future | None = None

    def finish(self, error: BaseException | None) -> None:
        """The call ended (``error``: how it failed): wake waiters, run callbacks. Called by
        the ``Executor`` that ran it."""
        with self._lock:
            self._error = error
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            self._call(cb)

    def _call(self, fn: Callable[[Work], None]) -> None:
        try:
            fn(self)
        except Exception:  # a user's callback must never kill the worker thread
            logging.getLogger("pycoll").exception("done-callback of %r raised", self)

    def add_done_callback(self, fn: Callable[[Work], None]) -> None:
        """Call ``fn(work)`` once the collective finishes (immediately if it already has)."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(fn)
                return
        self._call(fn)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done; re-raise the collective's error. ``timeout`` bounds this wait only."""
        if not self._done.wait(timeout):
            raise CollectiveTimeout(
                f"rank {self.rank}: {self.collective} #{self.seq} did not complete within the "
                f"{timeout} s given to Work.wait(); it is still running under the communicator's "
                "own deadline")
        if self._error is not None:
            raise self._error
        return True

    def result(self, timeout: float | None = None) -> Any:
        """Wait (like ``wait``), then return what the collective wrote (see the class doc)."""
        self.wait(timeout)
        out = self._output
        return out.value if isinstance(out, Outcome) else out

    def source_rank(self) -> int | None:
        """The rank a completed receive got its message from (None for other calls)."""
        out = self._output
        return out.source if isinstance(out, Outcome) and self._done.is_set() else None

    def get_future(self) -> concurrent.futures.Future:
        """A ``concurrent.futures.Future`` completed with ``result()`` or the call's error.

        Callbacks chained on it run on the communicator's worker thread, as torch's do; a
        callback must not wait on a later collective of the same communicator (it could only
        run after the callback returns). ``asyncio.wrap_future`` makes it awaitable.
        """
        with self._lock:
            if self._future is not None:
                return self._future
            fut: concurrent.futures.Future = concurrent.futures.Future()
            fut.set_running_or_notify_cancel()
            self._future = fut

        def settle(work: Work) -> None:
            if self._error is not None:    # work is self
                fut.set_exception(self._error)
            else:
                out = self._output
                fut.set_result(out.value if isinstance(out, Outcome) else out)
        self.add_done_callback(settle)
        return fut

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def __repr__(self) -> str:
        state = "done" if self._done.is_set() else "pending"
        return f"<pycoll.Work {self.collective} #{self.seq} {state}>"


class Executor:
    """Runs tasks in submission order: inline when idle, else on one worker thread.

    ``_run_lock`` is held while any task runs, inline or on the worker. The worker takes it
    *before* popping the next task, and an inline run is allowed only while the queue is
    empty, so a synchronous call can never overtake a queued asynchronous one. The inline
    path costs one non-blocking lock acquire and release: no condition variable, no wake-up.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._cv = threading.Condition()
        self._run_lock = threading.Lock()
        #: tasks waiting for the worker (read-only outside this class: an inline run may
        #: start only while it is empty)
        self.pending: deque[tuple[Callable[[], None], Work]] = deque()
        #: the worker thread, once the first task was queued
        self.thread: threading.Thread | None = None
        self._closed = False

    def run_inline_if_idle(self) -> bool:
        """Claim the executor for an inline run; the caller must call ``release`` after."""
        if self._closed:
            raise PycollError(f"communicator {self._name} is finalized")
        if self.pending:
            return False
        return self._run_lock.acquire(blocking=False)

    def release(self) -> None:
        self._run_lock.release()

    def busy(self) -> bool:
        """A task runs or waits: an asynchronous call was issued and has not finished."""
        return bool(self.pending) or self._run_lock.locked()

    def idle(self) -> threading.Lock:
        """A context manager that waits until no task of this executor is running."""
        return self._run_lock

    def submit(self, task: Callable[[], None], work: Work) -> None:
        with self._cv:
            if self._closed:
                raise PycollError(f"communicator {self._name} is finalized")
            self.pending.append((task, work))
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, daemon=True,
                                                name=f"pycoll-{self._name}")
                self.thread.start()
            self._cv.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not self.pending:
                    self._cv.wait()
                if self._closed and not self.pending:
                    return
            with self._run_lock:
                with self._cv:
                    if not self.pending:    # close() failed the queue while this waited
                        continue
                    task, work = self.pending.popleft()
                error: BaseException | None = None
                try:
                    task()
                except BaseException as e:  # delivered through the work handle
                    error = e
            work.finish(error)

    def close(self, timeout: float = 5.0) -> None:
        """Stop taking work; fail what is still queued; let the running task finish."""
        with self._cv:
            self._closed = True
            dropped = list(self.pending)
            self.pending.clear()
            self._cv.notify_all()
            thread = self.thread
        for _task, work in dropped:
            work.finish(PycollError(f"{work.collective} #{work.seq} was still queued when "
                                     f"communicator {self._name} was finalized"))
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
