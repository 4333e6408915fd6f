"""torch ``Work`` objects for pycoll collectives.

Facts this relies on (measured on torch 2.13; tests/torch_backend/test_torch_backend.py checks the
failure path, ``test_peer_death_mid_training_raises_from_backward``):

* C++ callers (the DDP reducer, functional collectives) reach only ``wait(timeout)`` and
  ``get_future()``; ``timeout=timedelta(0)`` means "no limit". DDP never calls ``wait``: it
  waits on the future with no limit, so the collective's own deadline is what bounds it.
* Profilers: Gloo's works show up in ``torch.profiler`` and the autograd profiler as
  ``gloo:<op>`` events with the input shapes, spanning the operation. A ``PycollWork`` opens a
  ``pycoll:<op>`` record function (with the inputs, for ``record_shapes``) when it is issued and
  closes it when it completes, on whichever thread that happens, as Gloo's do. Nothing is
  recorded, and almost nothing spent, while no profiler runs. torch 2.11's profiler drops a
  Python record function that ends on another thread (Gloo's, in C++, are kept): there an
  asynchronous work's event closes where it is issued, so it is seen, with its shapes, but
  does not span the operation.
* ``Future.set_exception`` is not seen as an error by C++. So the raw future is always
  completed with ``set_result`` (the output tensors, or a ``_Failure`` marker) and callers get
  ``raw.then(_unwrap)``, which raises on the marker: C++ then sees a failed future, and
  ``loss.backward()``, ``work.wait()`` and ``get_future().wait()`` all raise RuntimeError.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..errors import CollectiveTimeout, PycollError


class _Failure:
    """The value a failed collective's raw future carries."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _unwrap(fut: torch.futures.Future) -> Any:
    value = fut.value()
    if isinstance(value, _Failure):
        raise value.error
    return value


def _seconds(timeout: Any) -> float | None:
    """None for "no limit" (None, timedelta(0) from C++, negative), else seconds.

    Runs on every torch call (every options object holds a timedelta): that case first."""
    if type(timeout) is timedelta:
        seconds = timeout.total_seconds()
    elif timeout is None:
        return None
    else:
        seconds = float(timeout.total_seconds() if isinstance(timeout, timedelta) else timeout)
    return seconds if seconds > 0 else None


_Record: Any
try:   # a record function that carries input shapes and may end on another thread
    from torch._C._profiler import _RecordFunctionFast as _Record
except ImportError:  # pragma: no cover - older torch: events without shapes
    _Record = None


#: whether the profiler keeps an event that ends on another thread than the one that opened
#: it: torch 2.13 does, 2.11 does not (2.12 was not tried, so it is taken as 2.11)
_ENDS_ELSEWHERE = torch.torch_version.TorchVersion(torch.__version__) >= "2.13"


#: the profiler event (``pycoll:<name>``) of each op whose method name is not the event's:
#: Gloo's event name wherever torch.distributed runs the same collective on both
EVENT_NAMES = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "sparse_allreduce": "sparse_all_reduce", "allgather": "all_gather",
    "all_gather_into_tensor": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
    "allgather_coalesced": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter", "all_to_all_single": "all_to_all",
    "recv_anysource": "recv",
}


def begin_record(title: str, inputs: Any) -> Any:
    """Open the profiler event ``pycoll:<title>`` (None while no profiler is running)."""
    if not torch.autograd._profiler_enabled():
        return None
    name = "pycoll:" + title
    if _Record is not None:
        rec = _Record(name, [t for t in inputs if isinstance(t, torch.Tensor)])
        rec.__enter__()
        return rec
    return torch.autograd.profiler.record_function(name).__enter__()


def end_record(rec: Any) -> None:
    if rec is not None:
        rec.__exit__(None, None, None)


class PycollWork(dist._Work):
    """One torch-level operation: one or more pycoll collectives plus the copy-back after."""

    # What most works never change, as class defaults: a synchronous op's work is made on
    # every dist.* call, and each attribute set in __init__ adds to it (docs/torch.md)
    _flush: Callable[[], None] | None = None    # p2p: post the deferred batch this op is in
    _record: Any = None                 # the open profiler event, closed on completion
    _event: threading.Event | None = None   # made only if somebody has to block
    _error: BaseException | None = None
    _raw: torch.futures.Future | None = None
    _future: torch.futures.Future | None = None
    _source = -1

    def __init__(self, op: str, outputs: Any, rank: int,
                 flush: Callable[[], None] | None = None, record: Any = None,
                 finished: bool = False) -> None:
        super().__init__()
        if record is not None:
            if _ENDS_ELSEWHERE:
                self._record = record
            else:        # it would end on another thread, and be lost (module docstring)
                end_record(record)
        if flush is not None:
            self._flush = flush
        self._op = op
        self._outputs = outputs
        self._rank = rank
        self._lock = threading.Lock()
        self._finished = finished      # ``finished=True``: an inline op that already succeeded

    # -- completion (pycoll's worker thread, or the caller for inline ops) --------------------
    def finish(self, error: BaseException | None) -> None:
        """The op ended (``error``: how it failed): wake waiters, complete the future.
        Called by whoever issued its pycoll calls (``issue_parts``, ``p2p.DeferredP2P``)."""
        with self._lock:
            if self._finished:
                return
            self._error = error
            self._finished = True
            raw, event = self._raw, self._event
            record, self._record = self._record, None
        if event is not None:
            event.set()
        end_record(record)
        if raw is not None:
            raw.set_result(self._outputs if error is None else _Failure(error))

    def finish_after(self, error: BaseException | None,
                     then: Callable[[], None] | None) -> None:
        """Complete once the op's pycoll calls are done: ``then`` first (``post`` and the
        copy-back) if they succeeded; an error it raises fails the work instead."""
        if error is None and then is not None:
            try:
                then()
            except BaseException as e:  # delivered through the work
                error = e
        self.finish(error)

    def _wait_finished(self, limit: float | None) -> bool:
        if self._finished:
            return True
        with self._lock:
            if self._finished:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(limit)

    def _post(self) -> None:
        if self._flush is not None:
            flush, self._flush = self._flush, None
            flush()

    # -- the torch Work API -------------------------------------------------------------------
    def wait(self, timeout: Any = None) -> bool:
        self._post()
        limit = _seconds(timeout)
        if not self._finished and threading.current_thread().name.startswith("pycoll-"):
            raise PycollError(
                f"rank {self._rank}: waiting on {self._op} from inside a pycoll completion "
                "callback (e.g. a Future.then callback) would deadlock: the callback runs on "
                "the thread that executes the collectives. Chain with .then() instead of "
                "waiting there.")
        if not self._wait_finished(limit):
            raise CollectiveTimeout(
                f"rank {self._rank}: {self._op} did not complete within the {limit:g} s given to "
                "Work.wait(); it keeps running under the process group's timeout")
        if self._error is not None:
            raise self._error
        return True

    def get_future(self) -> torch.futures.Future:
        self._post()
        with self._lock:
            if self._future is None:
                raw: torch.futures.Future = torch.futures.Future()
                self._future = raw.then(_unwrap)
                if self._finished:
                    done_now = True
                else:
                    self._raw = raw
                    done_now = False
            else:
                return self._future
        if done_now:
            raw.set_result(self._outputs if self._error is None else _Failure(self._error))
        return self._future

    def is_completed(self) -> bool:
        self._post()
        return self._finished

    def is_success(self) -> bool:
        return self._finished and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> Any:
        self.wait()
        return self._outputs

    def source_rank(self) -> int:
        return self._source

    def set_source(self, rank: int) -> None:
        """The rank a receive's message came from (``source_rank``); the deferred
        point-to-point batch (``p2p.DeferredP2P``) sets it."""
        self._source = rank

    _source_rank = source_rank

    def synchronize(self) -> None:
        self.wait()

    def block_current_stream(self) -> None:
        self.wait()

    def __repr__(self) -> str:
        state = ("failed" if self._error is not None else "done") if self._finished \
            else "pending"
        return f"<pycoll.torch.PycollWork {self._op} {state}>"


class DoneWork(PycollWork):
    """The work of a synchronous op that has already succeeded (it ran inline, on the
    caller's thread): nothing is left to wait for, lock or flush.

    Every synchronous ``dist.*`` call makes one, and torch calls its ``wait`` and drops it,
    so it is built with as few steps as possible (``done``): torch's own constructor only,
    then its op and outputs; no lock, since its state never changes (the future, if anybody
    asks for one, is made complete). An ``__init__`` of its own would add a third to it."""

    _finished = True
    _rank = -1        # named in errors only, and this work has none
    __init__ = dist._Work.__init__   # torch's constructor, not PycollWork's

    def wait(self, timeout: Any = None) -> bool:
        return True

    @classmethod
    def of(cls, op: str, outputs: Any) -> DoneWork:
        """A ``DoneWork`` of ``op`` whose results are ``outputs``."""
        work = cls()
        work._op = op
        work._outputs = outputs
        return work

    def get_future(self) -> torch.futures.Future:
        future = self._future
        if future is None:     # two threads racing here each get a completed future
            future = torch.futures.Future()
            future.set_result(self._outputs)
            self._future = future
        return future

    def is_completed(self) -> bool:
        return True




#: a ``DoneWork`` of ``op`` whose results are ``outputs`` (every synchronous ``dist.*`` call)
done = DoneWork.of


def issue_parts(work: PycollWork, calls: Sequence[Callable[[bool], Any]],
                then: Callable[[], None] | None) -> PycollWork:
    """Issue ``calls`` asynchronously (``call(True)`` returns a pycoll Work) and complete
    ``work``, one torch Work for them all, when the last is done: with the first error any
    part had, else after ``then``.

    A part refused while being issued raises at once if it is the first (nothing is in flight
    then); a later one fails the work once the parts already issued are done, since those
    cannot be withdrawn.
    """
    if not calls:
        work.finish_after(None, then)
        return work
    pending = [len(calls)]
    first_error: list[BaseException] = []
    lock = threading.Lock()

    def one_done(pw: Any) -> None:
        with lock:
            pending[0] -= 1
            e = pw.exception()
            if e is not None and not first_error:
                first_error.append(e)
            last = pending[0] == 0
        if last:
            work.finish_after(first_error[0] if first_error else None, then)

    issued = 0
    try:
        for call in calls:
            pw = call(True)
            issued += 1
            pw.add_done_callback(one_done)
    except BaseException as e:
        if issued == 0:
            work.finish(e)
            raise
        with lock:
            first_error.append(e)
            pending[0] -= len(calls) - issued
            last = pending[0] == 0
        if last:
            work.finish_after(first_error[0], then)
    return work


def _skip_recursively() -> Callable[[Callable[..., Any]], None] | None:
    """How to mark a function's code "Dynamo: skip this frame and every frame it calls", at
    no cost per call (torch's frame execution strategies); None where this torch lacks them.

    ``torch.compiler.disable`` does the same through a wrapper that switches Dynamo's frame
    hook off and on around every call, a tenth of a small call."""
    try:
        from torch._C._dynamo.eval_frame import (
            _FrameAction,
            _FrameExecStrategy,
            set_code_exec_strategy,
        )
        strategy = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)
    except (ImportError, AttributeError, TypeError):  # pragma: no cover - other torch
        return None

    def skip(fn: Callable[..., Any]) -> None:
        set_code_exec_strategy(fn.__code__, strategy)

    return skip


_SKIP = _skip_recursively()


def _disable_compile(cls: type, names: list[str]) -> None:
    """Keep Dynamo out of our Python when C++ calls back into it (UnsafeScriptObjectError):
    the methods' frames and all they call run untraced, as under ``torch.compiler.disable``.
    """
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    for name in names:
        fn = cls.__dict__.get(name)
        if fn is None:
            continue
        if _SKIP is not None and hasattr(fn, "__code__"):
            _SKIP(fn)
        elif disable is not None:
            setattr(cls, name, disable(fn))


_disable_compile(PycollWork, ["wait", "get_future", "is_completed", "is_success", "exception",
                              "result", "source_rank", "_source_rank", "synchronize",
                              "block_current_stream"])
_disable_compile(DoneWork, ["wait", "get_future", "is_completed"])
