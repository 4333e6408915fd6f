"""The driver's side of ``pycoll.ray.run``: the placement group, the actors, the waits, and
the error that names the rank that failed first (see ``pycoll/ray/__init__.py``)."""
from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from ..comm.communicator import DEFAULT_TIMEOUT
from ..errors import InvalidArgument, PycollError
from ..hosted import describe_error
from ..timeouts import as_seconds
from .actor import Failure, RankActor, death, first_line

#: Ray's placement strategies: PACK fills a node first, SPREAD prefers different nodes, the
#: STRICT forms insist (one node; every bundle on its own node)
STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
#: how often the driver's waits wake up (a KeyboardInterrupt is seen within this)
_POLL_S = 1.0
#: after the first failure, how long the driver waits for the other ranks' reports
_GRACE_S = 5.0
#: for a finished rank's result to reach the driver (a large one crosses the network)
_FETCH_S = 300.0


class RayRankFailed(PycollError):
    """A rank of a Ray job failed: ``rank`` (None if no rank can be named), its ``node``
    (Ray's address of it) and ``host`` (its hostname)."""

    def __init__(self, message: str, *, rank: int | None = None, node: str | None = None,
                 host: str | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.node = node
        self.host = host


class RayJobTimeout(PycollError, TimeoutError):
    """The job's actors could not be placed or started within ``start_timeout``, or the job
    did not finish within ``job_timeout``; every actor of it was killed."""


def _last_words(err: BaseException) -> str:
    """An error whose text carries a traceback (Ray's system errors): its last line, which
    names the exception; any other error on one line."""
    text = str(err)
    if "Traceback (most recent call last)" not in text:
        return describe_error(err)
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")


def _ray(address: str | None) -> Any:
    """The ``ray`` module, connected: to ``address`` ("auto", "ray://...", "host:port") or,
    with None, to ``RAY_ADDRESS`` or a new local cluster; a connection already made is kept."""
    try:
        import ray
    except ImportError:
        raise PycollError("pycoll.ray needs Ray on the driver and every node: "
                          "pip install 'pycoll[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=address)
    return ray


def _bundle(num_cpus: float, num_gpus: float, resources: Mapping[str, float] | None
            ) -> dict[str, float]:
    """One rank's placement-group bundle, checked before Ray sees it (Ray refuses a bundle
    of nothing, and a negative amount deep inside its scheduler)."""
    bundle: dict[str, float] = {}
    for name, amount in (("CPU", num_cpus), ("GPU", num_gpus), *(resources or {}).items()):
        if (isinstance(amount, bool) or not isinstance(amount, (int, float))
                or not math.isfinite(amount) or amount < 0):
            raise InvalidArgument(f"pycoll.ray.run: the amount of {name} per rank must be a "
                                  f"number >= 0, not {amount!r}")
        if amount > 0:
            bundle[name] = float(amount)
    if not bundle:
        raise InvalidArgument("pycoll.ray.run: each rank needs some resource (num_cpus > 0, "
                              "num_gpus or resources): Ray refuses an empty placement-group "
                              "bundle. On a small machine use a fraction, e.g. num_cpus=0.25")
    return bundle


def _wait(ray: Any, refs: list[Any], limit: float | None) -> tuple[list[Any], list[Any]]:
    """``ray.wait`` for all ``refs``, in steps of ``_POLL_S`` until ``limit`` seconds."""
    deadline = None if limit is None or math.isinf(limit) else time.monotonic() + limit
    pending = list(refs)
    ready: list[Any] = []
    while pending:
        left = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
        if left <= 0:
            break
        done, pending = ray.wait(pending, num_returns=len(pending), timeout=left)
        ready += done
    return ready, pending


def _places(ray: Any, actors: list[Any], limit: float) -> list[dict[str, Any]]:
    """Each actor's place, once all have started; an actor that could not start is named."""
    refs = [a.place.remote() for a in actors]
    _, pending = _wait(ray, refs, limit)
    if pending:
        late = [refs.index(p) for p in pending]
        raise RayJobTimeout(
            f"pycoll.ray: the actors of ranks {late} did not start within start_timeout="
            f"{limit:g} s (their placement group is reserved: the nodes are slow to start "
            "workers, or a runtime_env is still being installed); raise start_timeout")
    places = []
    for rank, ref in enumerate(refs):
        try:
            places.append(ray.get(ref, timeout=_FETCH_S))
        except ray.exceptions.RayError as e:
            raise RayRankFailed(
                f"pycoll.ray: the actor of rank {rank} of {len(actors)} could not start: "
                f"{first_line(e)}. Is pycoll installed on every node (and importable in its "
                "runtime_env)?", rank=rank) from e
    return places


def _outcome(ray: Any, ref: Any, rank: int) -> tuple[str, Any]:
    """A finished rank's ("ok", value) or ("failed", Failure), whatever Ray raised."""
    try:
        status, payload = ray.get(ref, timeout=_FETCH_S)
    except ray.exceptions.GetTimeoutError:
        return "failed", Failure(rank, None, "failed", f"its result (ready in Ray's object "
                                  f"store) could not be fetched within {_FETCH_S:g} s")
    except ray.exceptions.RayActorError as e:
        return "failed", Failure(rank, None, "was lost", f"its actor died: {death(e)}")
    except ray.exceptions.RayTaskError as e:
        return "failed", Failure(
            rank, None, "failed",
            f"outside fn (does fn with its arguments deserialize on the worker, does its "
            f"result serialize?): {_last_words(e.cause)}")
    except ray.exceptions.RayError as e:    # the object or its owner lost, Ray itself
        return "failed", Failure(rank, None, "failed",
                                 f"Ray could not return its result: {first_line(e)}")
    return status, payload


def _rank_failed(failures: dict[int, Failure], places: list[dict[str, Any]],
                 size: int) -> RayRankFailed:
    """The driver's error, naming the rank that failed first.

    ``failures``: every rank's report that reached the driver, in arrival order. An actor
    that died comes first: a death is never an echo of another rank's failure, while the
    ranks that lost it may fail in ways that name nobody (rank 0's store gone). Otherwise the
    first report names the culprit: itself, or the rank that stopped it.
    """
    reports = list(failures.values())
    deaths = [f for f in reports if f.verb == "was lost" and f.cause is None]
    first = deaths[0] if deaths else reports[0]
    culprit = first.cause if first.cause is not None else first.rank
    place = places[culprit]
    where = f"node {place['node']}, host {place['host']}, pid {place['pid']}"
    own = failures.get(culprit)
    if own is not None:
        why = f"{own.verb}: {own.what.rstrip('.')}"
        echo = next((f for f in reports if f.cause == culprit), None)
        if echo is not None:
            saw = echo.what.split(". Hint: ")[0].rstrip(".")     # its advice is for itself
            why += f" (rank {echo.rank} saw: {saw})"
    else:
        why = f"{first.verb} (reported by rank {first.rank}: {first.what.rstrip('.')})"
    return RayRankFailed(
        f"pycoll.ray: rank {culprit} of {size} ({where}) {why}. The other ranks were stopped "
        "and every actor of the job killed; fix it and call run() again.",
        rank=culprit, node=place["node"], host=place["host"])


def _collect(ray: Any, refs: list[Any], places: list[dict[str, Any]],
             limit: float | None) -> list[Any]:
    """The ranks' values in rank order, or the first failure named (see ``_rank_failed``)."""
    size = len(refs)
    rank_of = {ref: rank for rank, ref in enumerate(refs)}
    deadline = None if limit is None or math.isinf(limit) else time.monotonic() + limit
    values: dict[int, Any] = {}
    failures: dict[int, Failure] = {}
    pending = list(refs)

    def take(done: list[Any]) -> None:
        for ref in done:
            status, payload = _outcome(ray, ref, rank_of[ref])
            if status == "ok":
                values[rank_of[ref]] = payload
            else:
                failures[rank_of[ref]] = payload

    while pending and not failures:
        left = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
        if left <= 0:
            raise RayJobTimeout(
                f"pycoll.ray: the job of {size} ranks did not finish within job_timeout="
                f"{limit:g} s (ranks {sorted(rank_of[p] for p in pending)} still running); "
                "its actors were killed. Raise job_timeout if it was only slow")
        done, pending = ray.wait(pending, num_returns=1, timeout=left)
        take(done)
    if failures:
        if pending:     # the others' reports (who died, whom they blame), for a moment only
            done, _ = ray.wait(pending, num_returns=len(pending), timeout=_GRACE_S)
            take(done)
        raise _rank_failed(failures, places, size)
    return [values[rank] for rank in range(size)]


def _check(fn: Any, num_ranks: Any, strategy: Any, args: Any, kwargs: Any) -> None:
    if not callable(fn):
        raise InvalidArgument(f"pycoll.ray.run: fn must be callable, not {type(fn).__name__}")
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, int) or num_ranks < 1:
        raise InvalidArgument(f"pycoll.ray.run: num_ranks must be a positive int, not "
                              f"{num_ranks!r}")
    if strategy not in STRATEGIES:
        raise InvalidArgument(f"pycoll.ray.run: strategy must be one of {', '.join(STRATEGIES)}"
                              f", not {strategy!r}")
    if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
        raise InvalidArgument(f"pycoll.ray.run: args must be a sequence (a tuple), not "
                              f"{type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise InvalidArgument(f"pycoll.ray.run: kwargs must be a mapping, not "
                              f"{type(kwargs).__name__}")


def run(fn: Callable[..., Any], num_ranks: int, *, args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        timeout: float | timedelta = DEFAULT_TIMEOUT,
        job_timeout: float | timedelta | None = None,
        start_timeout: float | timedelta = 120.0,
        address: str | None = None, num_cpus: float = 1.0, num_gpus: float = 0.0,
        resources: Mapping[str, float] | None = None, strategy: str = "PACK",
        runtime_env: Mapping[str, Any] | None = None) -> list[Any]:
    """Run ``fn(comm, *args, **kwargs)`` as ranks 0..num_ranks-1, one Ray actor each, and
    return the ranks' return values, ordered by rank.

    ``address``: the cluster to connect to when Ray is not initialised yet ("auto", a
    "host:port" of the head, "ray://..."; None: ``RAY_ADDRESS`` or a new local cluster);
    when it is, the existing connection is used and kept. Each rank's actor takes one bundle
    of a placement group of ``num_cpus`` CPUs, ``num_gpus`` GPUs and ``resources`` (fractions
    are fine: ``num_cpus=0.25`` fits four ranks on one core), placed by ``strategy`` (one of
    :data:`STRATEGIES`), with ``runtime_env`` passed to every actor. ``fn``, ``args`` and the
    results must pickle (cloudpickle); ``comm`` is also the default communicator, so
    ``pycoll.allreduce`` works inside ``fn``, which runs on a thread of the actor.

    ``timeout``: pycoll's deadline for the bootstrap and each collective. ``start_timeout``:
    for the placement group to be placed and the actors to start. ``job_timeout``: kill the
    job after this many seconds (default None: no limit, since ``fn`` may train for days;
    every wait inside pycoll is still bounded by ``timeout``).

    Raises :class:`RayRankFailed` naming the rank that failed first (its ``fn`` raised, its
    actor died), :class:`RayJobTimeout`, or ``InvalidArgument`` before anything starts.
    """
    _check(fn, num_ranks, strategy, args, kwargs)
    bundle = _bundle(num_cpus, num_gpus, resources)
    seconds = as_seconds(timeout) or DEFAULT_TIMEOUT
    limit = as_seconds(job_timeout, "job_timeout")
    start_limit = as_seconds(start_timeout, "start_timeout") or 120.0
    ray = _ray(address)
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = placement_group([dict(bundle) for _ in range(num_ranks)], strategy=strategy,
                            name=f"pycoll-{uuid.uuid4().hex[:12]}")
    actors: list[Any] = []
    try:
        _, unplaced = _wait(ray, [group.ready()], start_limit)
        if unplaced:
            raise RayJobTimeout(
                f"pycoll.ray: a placement group of {num_ranks} bundles of {bundle} "
                f"({strategy}) was not placed within start_timeout={start_limit:g} s; the "
                f"cluster has {ray.available_resources()} free. Ask for less per rank "
                "(fractions work: num_cpus=0.25), add nodes, or use strategy='PACK'")
        actor_class = ray.remote(RankActor)
        options: dict[str, Any] = {
            "num_cpus": bundle.get("CPU", 0.0), "num_gpus": bundle.get("GPU", 0.0),
            "resources": {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")},
            "max_restarts": 0, "max_task_retries": 0}
        if runtime_env is not None:
            options["runtime_env"] = dict(runtime_env)
        for rank in range(num_ranks):
            place = PlacementGroupSchedulingStrategy(placement_group=group,
                                                     placement_group_bundle_index=rank)
            # threaded actors: rank 0 answers the others' gathers while its own rank runs
            threads = num_ranks + 1 if rank == 0 else 2
            actors.append(actor_class.options(scheduling_strategy=place, max_concurrency=threads,
                                              **options).remote(rank, num_ranks))
        places = _places(ray, actors, start_limit)
        job = ray.put((fn, tuple(args), dict(kwargs or {})))
        refs = [actor.run.remote(job, seconds, actors[0] if rank else None)
                for rank, actor in enumerate(actors)]
        return _collect(ray, refs, places, limit)
    finally:
        for actor in actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        try:
            remove_placement_group(group)
        except Exception:  # noqa: BLE001 - already removed, or the cluster is gone
            pass
