"""Spark barrier mode: run a pycoll job as the N tasks of one barrier stage.

Spark already starts processes on the cluster's hosts, so a pycoll job needs no launcher
there: ``run(fn, n)`` schedules ``n`` tasks with ``rdd.barrier().mapPartitions`` (Spark
starts barrier tasks all at once or not at all, which a job of ranks that wait for each other
needs), each task becomes rank ``partitionId()`` of a world of ``len(getTaskInfos())``, and
the results come back to the driver ordered by rank.

The bootstrap is the MPI one (``pycoll.launch.mpi``) over Spark's own channel instead of an
MPI communicator: ``BarrierTaskContext.allGather`` plays ``MPI_Allgather`` and ``MPI_Bcast``.
Rank 0 starts the job's store on its executor's address (as Spark's ``getTaskInfos()`` names
it; every executor can reach that address, Spark's shuffle depends on it), draws the job
secret, and the other tasks learn "address, port, secret" from the allGather. The secret so
never appears on a command line or in an environment: it travels over Spark's RPC (encrypt
that with ``spark.authenticate`` and ``spark.network.crypto.enabled`` on shared networks).

A failure in one task fails the whole barrier stage; the task's error says which rank, on
which host, failed and why (ranks stopped by another rank's failure name that rank), and the
driver raises :class:`SparkRankFailed` naming the rank that failed first. Spark does not
retry a failed barrier result stage part way: the job fails and ``run`` can simply be called
again.
"""
from __future__ import annotations

import json
import math
import re
import socket
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any

from .comm.communicator import DEFAULT_TIMEOUT, Communicator
from .errors import InvalidArgument, PycollError
from .hosted import failure_text, init_over
from .launch.mpi import GatherComm
from .timeouts import as_seconds

__all__ = ["run", "init_from_barrier_context", "barrier_conf", "SparkRankFailed", "SparkJobTimeout"]


class SparkRankFailed(PycollError):
    """A rank of a Spark barrier job failed; ``rank`` (None if no rank said) and ``host``.

    Raised inside the failing task (so Spark's stage failure carries this text) and again on
    the driver by :func:`run`, with Spark's own exception as ``__cause__``.
    """

    def __init__(self, message: str, *, rank: int | None = None,
                 host: str | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.host = host


class SparkJobTimeout(PycollError, TimeoutError):
    """The barrier job did not finish within ``run``'s ``job_timeout``; it was cancelled."""


# -- inside a barrier task ---------------------------------------------------------------------
class _BarrierComm(GatherComm):
    """The MPI calls ``pycoll.launch.mpi.bootstrap`` makes, over a Spark barrier context.

    Messages are JSON (the bootstrap sends names, numbers and strings), so nothing a task
    receives is unpickled. Each call is one ``allGather``, bounded by ``timeout``: Spark's own
    limit (``spark.barrier.sync.timeout``) defaults to a year.
    """

    def __init__(self, ctx: Any, timeout: float) -> None:
        super().__init__(int(ctx.partitionId()), len(ctx.getTaskInfos()))
        self._ctx = ctx
        self._timeout = timeout

    def allgather(self, obj: Any) -> list[Any]:
        message = json.dumps(obj)
        box: dict[str, Any] = {}

        def gather() -> None:
            try:
                box["messages"] = self._ctx.allGather(message)
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                box["error"] = e

        # allGather blocks in a socket read without a deadline: wait for it on a daemon
        # thread, so a task whose partners never arrive fails instead of hanging.
        thread = threading.Thread(target=gather, name="pycoll-spark-allgather", daemon=True)
        thread.start()
        thread.join(None if math.isinf(self._timeout) else self._timeout)
        if thread.is_alive():
            raise PycollError(
                f"rank {self._rank}: Spark's BarrierTaskContext.allGather did not complete "
                f"within {self._timeout:g} s: some barrier task of this stage never reached "
                "pycoll's bootstrap (stuck before it, or its executor is gone). Look at the "
                "other tasks' executor logs; raise timeout= if they are only slow to start.")
        if "error" in box:
            raise box["error"]
        return [self._parse(task, m) for task, m in enumerate(box["messages"])]

    def _parse(self, task: int, message: str) -> Any:
        try:
            return json.loads(message)
        except (TypeError, ValueError):
            raise PycollError(
                f"rank {self._rank}: pycoll's bootstrap got a message from barrier task {task} "
                f"that is not pycoll's ({len(str(message))} characters, not JSON): does that "
                "task call init_from_barrier_context (with the same pycoll version) where "
                "this one does, and nothing else call allGather in between?") from None


def _task_host(ctx: Any) -> str:
    """This task's executor host as Spark names it (``getTaskInfos()``: "host:port")."""
    address = ctx.getTaskInfos()[ctx.partitionId()].address
    host, sep, port = address.rpartition(":")
    host = host if sep and port.isdigit() else address
    return host.strip("[]")


def _routable(host: str) -> str | None:
    """``host`` as an address other hosts can reach, or None (a name that resolves to this
    machine's loopback, as Debian's 127.0.1.1 for the own hostname, or does not resolve)."""
    from .launch.environment import is_loopback

    try:
        addr = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]
    except (OSError, IndexError):
        return None
    return None if is_loopback(str(addr)) else str(addr)


def init_from_barrier_context(ctx: Any, *, timeout: float | timedelta = DEFAULT_TIMEOUT
                              ) -> Communicator:
    """Call ``pycoll.init()`` for the barrier task ``ctx`` (``BarrierTaskContext.get()``).

    Every task of the stage must call it (it is collective, like the allGathers inside).
    Rank = ``ctx.partitionId()``, world = ``len(ctx.getTaskInfos())``. Use it when writing
    the ``mapPartitions`` function yourself; :func:`run` does it for you. Call
    ``pycoll.finalize()`` before the task returns: Spark reuses Python workers, and the next
    task in this process must be able to ``init`` again.

    Rank 0's store listens on its executor's address, unless the executors' environment sets
    ``PYCOLL_MASTER_ADDR`` (an interface of that host) or every task runs on one host (then
    on loopback only); ``PYCOLL_MASTER_PORT`` picks its port (default: any free one).
    """
    seconds = as_seconds(timeout) or DEFAULT_TIMEOUT
    comm = _BarrierComm(ctx, seconds)
    # the executor's address is the one Spark proved reachable
    addr = _routable(_task_host(ctx)) if comm.Get_rank() == 0 else None
    return init_over(comm, seconds, addr)


#: the one line a failing task raises (``failure_text``), found again in Spark's error
_MARK = re.compile(r"pycoll\.spark: rank (\d+) of (\d+) \(host ([^)\s]*)\) "
                   r"(?:failed|stopped because rank (\d+) (failed|was lost)): ([^\n]*)")
#: how Spark names the barrier task that failed the stage: ResultTask(stage, partition)
_TASK = re.compile(r"barrier task ResultTask\(\d+, (\d+)\)")


class _BarrierTask:
    """The ``mapPartitions`` function of :func:`run` (a picklable callable: cloudpickle
    ships it to the executors, which import ``pycoll`` to run it)."""

    def __init__(self, fn: Callable[..., Any], args: Sequence[Any],
                 kwargs: Mapping[str, Any], timeout: float) -> None:
        self.fn, self.args, self.kwargs, self.timeout = fn, tuple(args), dict(kwargs), timeout

    def __call__(self, partition: Iterable[Any]) -> Iterator[tuple[int, Any]]:
        from pyspark import BarrierTaskContext

        import pycoll

        for _ in partition:     # one dummy element per task
            pass
        ctx = BarrierTaskContext.get()
        rank, size, host = int(ctx.partitionId()), len(ctx.getTaskInfos()), _task_host(ctx)
        try:
            comm = init_from_barrier_context(ctx, timeout=self.timeout)
            try:
                with comm:          # an exception here is posted: the others stop at once
                    value = self.fn(comm, *self.args, **self.kwargs)
            finally:
                pycoll.finalize()
        except Exception as e:  # noqa: BLE001 - named, so Spark's stage failure says who
            raise SparkRankFailed(failure_text("spark", rank, size, host, e), rank=rank,
                                  host=host) from e
        yield rank, value


# -- on the driver -----------------------------------------------------------------------------
def _spark_context(sc: Any) -> Any:
    """The SparkContext of ``sc`` (a SparkContext, a SparkSession, or None: the active one)."""
    if sc is None:
        from pyspark import SparkContext
        return SparkContext.getOrCreate()
    if hasattr(sc, "parallelize"):
        return sc
    try:
        context = sc.sparkContext       # a classic SparkSession
    except Exception:  # noqa: BLE001 - Spark Connect raises its own "not implemented"
        context = None
    if context is None or not hasattr(context, "parallelize"):
        raise InvalidArgument(
            f"pycoll.spark.run: sc={type(sc).__name__} has no SparkContext: barrier stages "
            "need classic Spark (a SparkContext, or a SparkSession not using Spark Connect)")
    return context


def _spark_reason(text: str) -> tuple[str, bool]:
    """(the line of Spark's error that says what went wrong, whether it is a Python error).

    A Python error: the last line of the worker's traceback (e.g. a result that does not
    pickle); else the first Java exception's line (a crashed Python worker: "Python worker
    exited unexpectedly (crashed)"), else the "failure reason" line."""
    lines = [line.strip() for line in text.splitlines()]
    for i, line in enumerate(lines):
        if "PythonException: " in line:
            last = ""
            for after in lines[i + 1:]:
                if after.startswith(("at ", "SQLSTATE")):
                    break
                last = after or last
            return last[:500], True
        if "Exception: " in line and "Job aborted" not in line and not line.startswith("at "):
            return line.rstrip(".")[:500], False
    return next((line.lstrip(": ").rstrip(".") for line in lines
                 if "failure reason" in line), "")[:500], False


def _driver_error(err: BaseException, size: int) -> PycollError:
    text = str(err)
    found = _MARK.search(text)
    if found is None:
        reason, python = _spark_reason(text)
        task = _TASK.search(text)       # partition id = rank
        if task is not None:            # failed outside the code that names the rank
            partition = int(task.group(1))
            why = ("a Python error after fn returned: does its result pickle?" if python
                   else "its Python worker crashed, exited or was killed")
            return SparkRankFailed(
                f"pycoll.spark: rank {partition} of {size} failed ({why}): {reason}. Its "
                "executor's log says more; Spark aborted the barrier stage.", rank=partition)
        return SparkRankFailed(
            f"pycoll.spark: the barrier stage of {size} tasks failed and no rank reported an "
            f"error (an executor lost, a task that could not start, too few free slots?): "
            f"{type(err).__name__}: {reason}. See Spark's error (the cause of this one) and "
            "the executor logs.")
    rank, _, host, cause, verb, detail = found.groups()
    if cause is not None:           # the first task to fail was stopped by another rank
        return SparkRankFailed(
            f"pycoll.spark: rank {cause} of {size} {verb} (reported by rank {rank} on {host}: "
            f"{detail}); Spark aborted the barrier stage. That rank's executor log has its "
            "traceback; fix it and call run() again.", rank=int(cause))
    return SparkRankFailed(
        f"pycoll.spark: rank {rank} of {size} on host {host} failed: {detail}; Spark aborted "
        "the barrier stage (the traceback is in Spark's error, the cause of this one). Fix it "
        "and call run() again.", rank=int(rank), host=host)


def barrier_conf(conf: Any, num_tasks: int, *, sync_timeout_s: int = 120) -> Any:
    """Set on a ``SparkConf`` what a barrier job of ``num_tasks`` needs, and return it.

    A barrier stage needs every slot at once. ``spark.cores.max`` keeps a standalone
    cluster from handing the application more executors than that. With
    ``minRegisteredResourcesRatio=1.0``, ``SparkContext()`` returns only when every
    executor has registered; otherwise Spark's slot check can fail the first job and
    retry it 15 s later. ``spark.barrier.sync.timeout`` bounds each ``allGather``
    (Spark's default is a year).
    """
    return (conf.set("spark.cores.max", str(num_tasks))
            .set("spark.scheduler.minRegisteredResourcesRatio", "1.0")
            .set("spark.scheduler.maxRegisteredResourcesWaitingTime", "60s")
            .set("spark.barrier.sync.timeout", str(sync_timeout_s)))


def run(fn: Callable[..., Any], num_tasks: int, *, sc: Any = None, args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        timeout: float | timedelta = DEFAULT_TIMEOUT,
        job_timeout: float | timedelta | None = None) -> list[Any]:
    """Run ``fn(comm, *args, **kwargs)`` as ranks 0..num_tasks-1 of one Spark barrier stage
    and return the ranks' return values, ordered by rank.

    ``sc``: a SparkContext or SparkSession (default: ``SparkContext.getOrCreate()``). The
    cluster needs ``num_tasks`` free task slots at once (barrier mode starts all or none;
    with fewer, Spark retries the slot check, by default 40 times 15 s, then fails) and
    dynamic allocation off. ``fn``, ``args`` and the results must pickle (cloudpickle; numpy
    arrays are fine); ``comm`` is also the default communicator, so ``pycoll.allreduce``
    works inside ``fn``. ``timeout``: pycoll's deadline for the bootstrap and for each
    collective. ``job_timeout``: cancel the whole job after this many seconds and raise
    :class:`SparkJobTimeout` (default None: no limit, since ``fn`` may train for days; every
    wait inside pycoll is still bounded by ``timeout``).

    A rank that raises fails the stage; this raises :class:`SparkRankFailed` naming it.
    """
    if isinstance(num_tasks, bool) or not isinstance(num_tasks, int) or num_tasks < 1:
        raise InvalidArgument(f"pycoll.spark.run: num_tasks must be a positive int, not "
                              f"{num_tasks!r}")
    seconds = as_seconds(timeout) or DEFAULT_TIMEOUT
    limit = as_seconds(job_timeout, "job_timeout")
    context = _spark_context(sc)
    task = _BarrierTask(fn, args, kwargs or {}, seconds)
    rdd = context.parallelize(range(num_tasks), num_tasks).barrier().mapPartitions(task)
    tag = f"pycoll-spark-{uuid.uuid4().hex}"
    expired = threading.Event()
    timer = None
    if limit is not None and not math.isinf(limit):
        def cancel() -> None:
            expired.set()
            context.cancelJobsWithTag(tag)
        timer = threading.Timer(limit, cancel)
        timer.daemon = True
    context.addJobTag(tag)
    try:
        if timer is not None:
            timer.start()
        pairs = rdd.collect()
    except Exception as e:
        if expired.is_set():
            raise SparkJobTimeout(
                f"pycoll.spark: the barrier job of {num_tasks} tasks did not finish within "
                f"job_timeout={limit:g} s and was cancelled; raise job_timeout if it "
                "was only slow, else look for the rank that hung in the executor logs") from e
        raise _driver_error(e, num_tasks) from e
    finally:
        if timer is not None:
            timer.cancel()
        context.removeJobTag(tag)
    results = dict(pairs)
    if sorted(results) != list(range(num_tasks)):
        raise PycollError(f"pycoll.spark: expected one result from each of ranks 0.."
                          f"{num_tasks - 1}, got ranks {sorted(results)}")
    return [results[r] for r in range(num_tasks)]
