"""Ranks that live inside another framework's workers: Spark's barrier tasks, Ray's actors.

Such a framework already started the processes and gives them a private channel (Spark's
``allGather``, Ray's actor calls), so the job needs no launcher: the ranks bootstrap the MPI
way (``pycoll.launch.mpi.bootstrap`` over a ``GatherComm``) and rank 0's store listens on the
address the framework proved reachable. When a rank fails, the framework reports it in its
own words; the line ``failure_text`` writes names the rank, its host and, for a rank stopped
by another's failure, the rank that caused it, so the driver can name the first to fail.
"""
from __future__ import annotations

import os

from .comm.communicator import Communicator
from .errors import Aborted, PeerLost
from .launch.mpi import GatherComm


def init_over(comm: GatherComm, timeout: float, store_addr: str | None) -> Communicator:
    """``pycoll.init`` over ``comm``; rank 0's store listens on ``store_addr`` when the ranks
    span several hosts (unless ``PYCOLL_MASTER_ADDR`` names an interface already).

    The bootstrap reads ``PYCOLL_MASTER_ADDR`` for that address; it is set for the bootstrap
    only, since a framework may reuse the process for other work (Spark reuses its Python
    workers).
    """
    import pycoll

    added = False
    if comm.Get_rank() == 0 and store_addr and not os.environ.get("PYCOLL_MASTER_ADDR"):
        os.environ["PYCOLL_MASTER_ADDR"] = store_addr
        added = True
    try:
        return pycoll.init(comm=comm, timeout=timeout)
    finally:
        if added:
            os.environ.pop("PYCOLL_MASTER_ADDR", None)


def blame(err: BaseException, rank: int) -> tuple[int | None, str]:
    """(the other rank ``err`` names as its cause or None, "failed" or "was lost").

    A rank's collective stopped by another rank's failure raises ``Aborted`` naming the rank
    that failed (or was lost), or ``PeerLost`` naming the peer that vanished: that rank, not
    this one, is the one to report."""
    cause: int | None = None
    verb = "failed"
    if isinstance(err, Aborted):
        cause = err.lost_rank if err.lost_rank is not None else err.failed_rank
        verb = "was lost" if err.lost_rank is not None else "failed"
    elif isinstance(err, PeerLost):
        cause, verb = err.peer, "was lost"
    if cause is None or cause == rank:
        return None, "failed"
    return cause, verb


def describe_error(err: BaseException) -> str:
    """``err`` on one line: its type and its message, whitespace folded."""
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


def failure_text(framework: str, rank: int, size: int, host: str, err: BaseException) -> str:
    """One line naming this rank and, for an echo of another rank's failure, that rank."""
    head = f"pycoll.{framework}: rank {rank} of {size} (host {host})"
    cause, verb = blame(err, rank)
    if cause is not None:
        return f"{head} stopped because rank {cause} {verb}: {describe_error(err)}"
    return f"{head} failed: {describe_error(err)}"
