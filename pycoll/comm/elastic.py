"""Revoke, agree and shrink: a job that survives a lost rank (docs/elastic.md).

``Elastic`` is the communicator's part for them. It is given what it needs: the
communicator's rank, size and name, its execution (to mark it revoked), its failures (the
abort record, where a revocation is posted, and the store client), the membership (who is
gone), and two callables of the communicator: ``make(rank, size, name, watch)`` builds the
communicator of the survivors (a fresh bootstrap among them, ``watch`` raising if one of them
dies meanwhile) and ``release(successor)`` lets the old one go.

``shrink`` is two agreements around one build:

1. *who*: every surviving rank votes (with its ``exclude``); the decision names the gone
   ranks and the new communicator's name. A rank in it that is alive learns ``Excluded``.
2. *build*: the survivors bootstrap the new communicator (new channels, fast path, cost
   model), watching the others' leases: a survivor that dies now fails the build at once.
3. *commit*: the survivors vote whether the build worked; if it failed anywhere or a
   survivor died meanwhile, every survivor drops what it built and the next attempt starts
   from 1 with the deaths now known. So either every survivor returns the same new
   communicator, or none does.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from rendezvous import Store, StoreError

from ..errors import Excluded, InvalidArgument, PeerLost, PycollError, Revoked
from .consensus import agree
from .membership import Membership

if TYPE_CHECKING:
    from ..runtime.execution import Execution
    from ..runtime.failures import Failures


class _Finalizable(Protocol):
    def finalize(self, timeout: float = ...) -> None: ...


#: the communicator class (a type parameter: this module does not import it)
Communicator = TypeVar("Communicator", bound=_Finalizable)

Make = Callable[[int, int, str, Callable[[], None]], Communicator]

#: the failures a shrink attempt's build may meet when a survivor dies meanwhile
BUILD_FAILURES = (PycollError, StoreError, OSError)


def base_name(name: str) -> str:
    """A communicator's name without its shrink generation ("world~2" -> "world")."""
    return name.split("~", 1)[0]


class Elastic(Generic[Communicator]):
    """The elastic calls of one communicator (see the module docstring)."""

    def __init__(self, rank: int, size: int, name: str, store: Store | None,
                 execution: Execution, failures: Failures, membership: Membership | None,
                 make: Make, release: Callable[[Communicator], None]) -> None:
        self.rank, self.size, self.name = rank, size, name
        self.store = store
        self.execution = execution
        self.failures = failures
        self.membership = membership
        self.make = make
        self.release = release
        self.agreements = 0          # agree() calls so far (the same count on every rank)
        self.attempts = 0            # shrink attempts so far (likewise)

    # -- revoke ------------------------------------------------------------------------------
    def revoke(self, reason: str) -> None:
        """Refuse every later call here and tell every rank (the abort record)."""
        if isinstance(self.execution.failed, Revoked):
            return
        self.execution.failed = self.failures.revoke(reason, self.execution.seq)

    # -- agree -------------------------------------------------------------------------------
    def agree(self, flag: int, timeout: float) -> tuple[int, frozenset[int]]:
        """``Communicator.agree``."""
        if isinstance(flag, bool) or not isinstance(flag, int):
            raise InvalidArgument(f"rank {self.rank}: agree: flag must be an int, not "
                                  f"{flag!r}")
        if self.size == 1:
            return flag, frozenset()
        self.agreements += 1
        where = f"rank {self.rank}: agree #{self.agreements} of communicator {self.name}"

        def decide(votes: dict[int, dict[str, Any]], gone: set[int]) -> dict[str, Any]:
            value = -1
            for vote in votes.values():
                value &= int(vote["flag"])
            return {"flag": value, "gone": sorted(gone)}

        decision = self._round(f"agree/{self.agreements}", range(self.size), {"flag": flag},
                               decide, timeout, where)
        return int(decision["flag"]), frozenset(decision["gone"])

    # -- shrink ------------------------------------------------------------------------------
    def shrink(self, exclude: Sequence[int], timeout: float) -> Communicator:
        """``Communicator.shrink``."""
        excluded = self._check_exclude(exclude)
        if self.size == 1 or self.store is None:
            raise InvalidArgument(f"rank {self.rank}: shrink: a communicator of one rank "
                                  "has nobody to lose")
        self.revoke(f"rank {self.rank} shrinks it")
        deadline = time.monotonic() + timeout
        while True:
            self.attempts += 1
            where = (f"rank {self.rank}: shrink (attempt {self.attempts}) of communicator "
                     f"{self.name}")
            members = [r for r in range(self.size) if r not in excluded]
            who = self._round(f"shrink/{self.attempts}", members,
                              {"exclude": sorted(excluded)}, self._decide_who, deadline, where,
                              absolute=True)
            if who.get("error"):
                raise InvalidArgument(f"{where}: {who['error']}")
            survivors = [r for r in members if r not in set(who["gone"])]
            built: Communicator | None = None
            try:
                assert self.membership is not None
                watch = self.membership.watch(self.failures_client(), survivors,
                                              f"{where}: building the new communicator")
                built = self.make(survivors.index(self.rank), len(survivors), who["name"],
                                  watch)
            except BUILD_FAILURES:
                built = None     # a survivor died meanwhile: the commit round says so
            commit = self._round(f"shrink/{self.attempts}/commit", survivors,
                                 {"ok": int(built is not None)}, _decide_commit, deadline,
                                 where, absolute=True)
            if commit["ok"] and not commit["gone"]:
                assert built is not None
                self.release(built)
                return built
            if built is not None:
                built.finalize(timeout=1.0)
            if time.monotonic() >= deadline:
                raise PeerLost(f"{where}: survivors kept dying or failing to connect until "
                               "the deadline", peer=None)

    def _decide_who(self, votes: dict[int, dict[str, Any]], gone: set[int]) -> dict[str, Any]:
        """The first round's decision: who is gone, and the new communicator's name
        (drawn from a counter, so that every generation has its own keys)."""
        excludes = {tuple(v.get("exclude", ())) for v in votes.values()}
        if len(excludes) > 1:
            return {"error": "the ranks passed different exclude lists "
                             f"({sorted(excludes)}); pass the same list on every rank"}
        assert self.store is not None
        base = base_name(self.name)
        generation = int(self.store.add(f"pycoll/{base}/generations", 1))
        return {"gone": sorted(gone), "name": f"{base}~{generation}"}

    # -- the rounds --------------------------------------------------------------------------
    def failures_client(self) -> Store:
        abort = self.failures.abort
        if abort is None:
            raise InvalidArgument(f"rank {self.rank}: communicator {self.name} has no store "
                                  "to agree through")
        return abort.client()

    def _round(self, label: str, participants: Sequence[int], vote: dict[str, Any],
               decide: Callable[[dict[int, dict[str, Any]], set[int]], dict[str, Any]],
               timeout: float, where: str, absolute: bool = False) -> dict[str, Any]:
        """One agreement among ``participants`` (``timeout``: seconds, or with ``absolute``
        a deadline); raises ``Excluded`` when the decision counts this rank as gone."""
        if self.membership is None:
            raise InvalidArgument(f"{where}: needs a store (a communicator of one has none)")
        client = self.failures_client()
        deadline = timeout if absolute else time.monotonic() + timeout
        membership = self.membership
        decision = agree(client, f"pycoll/{self.name}/{label}", self.rank, list(participants),
                         vote, lambda ranks: membership.gone(client, ranks), decide, deadline,
                         where)
        if self.rank in decision.get("gone", ()):
            raise Excluded(f"{where}: the other ranks found this rank gone (its connection to "
                           "the store was lost) and go on without it. Hint: finalize and exit; "
                           "an elastic launcher may start a replacement")
        return decision

    def _check_exclude(self, exclude: Sequence[int]) -> set[int]:
        where = f"rank {self.rank}: shrink of communicator {self.name}"
        try:
            excluded = {int(r) for r in exclude}
        except (TypeError, ValueError):
            raise InvalidArgument(f"{where}: exclude must be a list of ranks, not "
                                  f"{exclude!r}") from None
        bad = sorted(r for r in excluded if not 0 <= r < self.size)
        if bad:
            raise InvalidArgument(f"{where}: exclude names ranks {bad} outside 0..{self.size - 1}")
        if self.rank in excluded:
            raise InvalidArgument(f"{where}: this rank is in exclude; excluded ranks do not "
                                  "call shrink (they get Revoked at their next call)")
        return excluded


def _decide_commit(votes: dict[int, dict[str, Any]], gone: set[int]) -> dict[str, Any]:
    return {"ok": int(all(int(v["ok"]) for v in votes.values())), "gone": sorted(gone)}
