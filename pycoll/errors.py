"""One exception hierarchy for everything pycoll raises.

Users of NCCL and Gloo mostly complain that a failure says "internal error" or nothing at all.
Every error here therefore carries the context a person needs to act: this rank, the peer
involved, the collective and its sequence number, how far it got, and a hint.
"""
from __future__ import annotations


class PycollError(RuntimeError):
    """Base class of every error pycoll raises on purpose."""


class InvalidArgument(PycollError, ValueError):
    """The caller passed something pycoll cannot work with; raised before any byte moves."""


class InvalidDtype(InvalidArgument, TypeError):
    """The buffer's dtype is not supported for this collective or reduction op."""


class TransportError(PycollError):
    """A transport failed to move bytes (connection error, protocol violation, size mismatch)."""

    def __init__(self, message: str, *, peer: int | None = None) -> None:
        super().__init__(message)
        self.peer = peer


class PeerLost(TransportError):
    """A peer process died or closed its connection while we depended on it."""


class MessageSizeMismatch(TransportError):
    """The peer sent a message of a different length than this rank posted to receive.

    Almost always the sign of ranks calling different collectives or passing tensors of
    different sizes.
    """


class CollectiveTimeout(PycollError, TimeoutError):
    """A collective or point-to-point operation did not finish by its deadline."""


class CollectiveMismatch(PycollError):
    """Ranks called different collectives (or the same with different arguments).

    ``peer`` is the rank whose message proved it (None for DETAIL's cross-rank report)."""

    def __init__(self, message: str, *, peer: int | None = None) -> None:
        super().__init__(message)
        self.peer = peer


class DataCorruption(PycollError):
    """An integrity check (``integrity=True`` or ``PYCOLL_INTEGRITY``) found that the data a
    collective delivered is not what the ranks sent (docs/integrity.md).

    Every rank of the call raises it with the same findings: ``collective`` and ``seq`` name
    the call, ``suspects`` the ranks whose received data is wrong (the links into them or
    their memory are suspect), ``links`` the ``(source, receiver)`` pairs whose block
    differs (moves), ``where`` what differed and by how much. The communicator stays usable:
    the call completed on every rank, only its result is wrong.
    """

    def __init__(self, message: str, *, collective: str = "", seq: int = 0,
                 suspects: list[int] | None = None,
                 links: list[tuple[int, int]] | None = None, where: str = "") -> None:
        super().__init__(message)
        self.collective = collective
        self.seq = seq
        self.suspects = suspects or []
        self.links = links or []
        self.where = where


class Aborted(PycollError):
    """Another rank failed and told everyone to stop (abort through the store).

    ``failed_rank`` is the rank that posted the abort record (the first to fail),
    ``lost_rank`` the rank that died or vanished when that was the cause (else None), both
    numbered as in the communicator the tree grew from (a group's failure names the same
    process as its parent's would), and
    ``record`` the abort record itself (rank, collective, seq, error, ...).
    """

    def __init__(self, message: str, *, failed_rank: int | None = None,
                 lost_rank: int | None = None, record: dict | None = None) -> None:
        super().__init__(message)
        self.failed_rank = failed_rank
        self.lost_rank = lost_rank
        self.record = record


class PeerLostAbort(Aborted, PeerLost):
    """An abort whose root cause is a lost peer (``lost_rank``, also ``peer``).

    The rank that noticed the death aborted the job; every other rank raises this, which a
    program catching ``PeerLost`` catches too, naming the rank that actually died.
    """

    def __init__(self, message: str, *, failed_rank: int | None = None,
                 lost_rank: int | None = None, record: dict | None = None) -> None:
        super().__init__(message, failed_rank=failed_rank, lost_rank=lost_rank, record=record)
        self.peer = lost_rank


class Revoked(Aborted):
    """The communicator was revoked (``Communicator.revoke``, or ``shrink`` by the others):
    every call on it is refused on every rank that can still be reached. ``revoked_by``
    names the revoking rank (numbered as ``failed_rank``) and ``reason`` says why. What to
    do: ``comm.shrink()`` (docs/elastic.md), or finalize and leave."""

    def __init__(self, message: str, *, failed_rank: int | None = None,
                 lost_rank: int | None = None, record: dict | None = None) -> None:
        super().__init__(message, failed_rank=failed_rank, lost_rank=lost_rank, record=record)
        self.revoked_by = failed_rank
        self.reason = str((record or {}).get("reason", ""))


class Excluded(Revoked):
    """This rank is not in the communicator the others agreed on (``shrink``): they found
    it gone (its store lease was lost: the store cannot reach it) or excluded it. It must
    leave the job: finalize and exit (an elastic launcher may start a replacement)."""


def describe(rank: int, collective: str, seq: int, *, peer: int | None = None,
             done: int | None = None, total: int | None = None) -> str:
    """The common prefix of error messages: who, what, which one, how far."""
    parts = [f"rank {rank}: {collective} #{seq}"]
    if peer is not None:
        parts.append(f"peer rank {peer}")
    if total is not None:
        parts.append(f"{done or 0} of {total} bytes done")
    return ", ".join(parts)
