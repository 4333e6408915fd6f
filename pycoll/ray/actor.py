"""Inside each actor of ``pycoll.ray.run``: one rank's life, and rank 0's meeting point.

``RankActor`` is the actor class (``ray.remote`` wraps it on the driver; Ray's workers import
this module by name, so pycoll must be installed where the actors run). Rank 0's actor also
holds the ``Mailbox`` where the bootstrap's allgathers meet: the other ranks call its
``gather`` method (``ActorComm``), and it answers on its own threads while its rank runs.
"""
from __future__ import annotations

import math
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import PeerLost, PycollError
from ..hosted import blame, describe_error, init_over
from ..launch.mpi import GatherComm


class Mailbox:
    """Rank 0's end of the bootstrap's allgathers: every rank's message of one round, handed
    back to each rank once all ``size`` have arrived (or an error naming who did not)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._cond = threading.Condition()
        self._rounds: dict[int, dict[int, Any]] = {}

    def gather(self, round_: int, rank: int, message: Any, timeout: float) -> list[Any]:
        deadline = time.monotonic() + timeout
        with self._cond:
            box = self._rounds.setdefault(round_, {})
            box[rank] = message
            self._cond.notify_all()
            while len(box) < self._size:
                left = None if math.isinf(timeout) else deadline - time.monotonic()
                if left is not None and left <= 0:
                    missing = [r for r in range(self._size) if r not in box]
                    raise PycollError(
                        f"rank 0: pycoll's bootstrap over Ray: ranks {missing} did not reach "
                        f"round {round_} of the bootstrap within {timeout:g} s (their actors "
                        "are stuck before it, or too slow to start: raise timeout=)")
                self._cond.wait(left)
            return [box[r] for r in range(self._size)]


class ActorComm(GatherComm):
    """The bootstrap's allgathers over Ray: rank 0 gathers in its own mailbox, every other
    rank calls rank 0's actor (``head``), bounded by ``timeout``."""

    def __init__(self, rank: int, size: int, timeout: float, mailbox: Mailbox | None,
                 head: Any) -> None:
        super().__init__(rank, size)
        self._timeout = timeout
        self._mailbox = mailbox
        self._head = head
        self._round = 0

    def allgather(self, obj: Any) -> list[Any]:
        round_, self._round = self._round, self._round + 1
        if self._mailbox is not None:
            return self._mailbox.gather(round_, self._rank, obj, self._timeout)
        import ray

        ref = self._head.gather.remote(round_, self._rank, obj, self._timeout)
        limit = None if math.isinf(self._timeout) else self._timeout + 10.0
        try:
            return list(ray.get(ref, timeout=limit))
        except ray.exceptions.RayActorError as e:
            raise PeerLost(f"rank {self._rank}: pycoll's bootstrap over Ray: rank 0's actor "
                           f"died: {death(e)}", peer=0) from None
        except ray.exceptions.RayTaskError as e:     # the mailbox's own error, on rank 0
            raise PycollError(str(e.cause)) from None
        except ray.exceptions.GetTimeoutError:
            raise PycollError(f"rank {self._rank}: pycoll's bootstrap over Ray: rank 0's actor "
                              f"did not answer within {limit:g} s") from None


@dataclass(frozen=True)
class Failure:
    """What went wrong on one rank: ``cause`` is the other rank it blames (or None)."""
    rank: int
    cause: int | None
    verb: str
    what: str


class RankActor:
    """One rank of the job (a Ray actor: ``ray.remote`` wraps it in ``run``; workers import
    this module by name, so pycoll must be installed where the actors run)."""

    def __init__(self, rank: int, size: int) -> None:
        self._rank = rank
        self._size = size
        self._mailbox = Mailbox(size) if rank == 0 else None

    def place(self) -> dict[str, Any]:
        """Where this rank runs: Ray's node address, the hostname, the process id."""
        import ray

        return {"node": ray.util.get_node_ip_address(), "host": socket.gethostname(),
                "pid": os.getpid()}

    def gather(self, round_: int, rank: int, message: Any, timeout: float) -> list[Any]:
        if self._mailbox is None:
            raise PycollError(f"rank {self._rank}: only rank 0's actor gathers the bootstrap")
        return self._mailbox.gather(round_, rank, message, timeout)

    def run(self, job: tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]],
            timeout: float, head: Any) -> tuple[str, Any]:
        """("ok", fn's value) or ("failed", a Failure): this rank's whole life in the job."""
        import ray

        import pycoll

        fn, args, kwargs = job
        channel = ActorComm(self._rank, self._size, timeout, self._mailbox, head)
        try:
            comm = init_over(channel, timeout, ray.util.get_node_ip_address())
            try:
                with comm:          # an exception here is posted: the others stop at once
                    value = fn(comm, *args, **kwargs)
            finally:
                pycoll.finalize()
        except Exception as e:  # noqa: BLE001 - reported to the driver, which names the rank
            cause, verb = blame(e, self._rank)
            return "failed", Failure(self._rank, cause, verb, describe_error(e))
        return "ok", value



def first_line(err: BaseException) -> str:
    """Ray's errors run to many lines (tracebacks, advice): the first with content."""
    text = str(err)
    return next((line.strip() for line in text.splitlines() if line.strip()), "")[:500]


def death(err: BaseException) -> str:
    """Why Ray says an actor died, in one sentence or two (its error runs to a paragraph of
    advice): "its worker process has died. Worker exit type: ...", "it was killed by
    `ray.kill`"."""
    for line in str(err).splitlines():
        if line.startswith("The actor is dead because "):
            reason = line[len("The actor is dead because "):].split(" Some common causes")[0]
            return reason.strip().rstrip(".")[:500]
    return first_line(err).rstrip(".")
