"""Revoke, agree, shrink and grow: a job that survives a lost rank (docs/elastic.md).

``Elastic`` is the communicator's part for them. It is given what it needs: the
communicator's rank, size and name, its execution (to mark it revoked), its failures (the
abort record, where a revocation is posted, and the store client), the membership (who is
gone), and callables of the communicator: ``make(rank, size, name, watch, extra)`` builds the
communicator of the survivors (``watch`` raising if one of them dies meanwhile),
``release(successor)`` lets the old one go, ``quiet()`` says whether this rank's
communicator (and its groups) never failed and has no call in flight, and ``draw_id()``
draws a fresh message id.

``shrink`` is two agreements around one build:

1. *who*: every surviving rank votes (with its ``exclude`` and whether it is quiet); the
   decision names the gone ranks, the new communicator's name, and whether it *shares* the
   old channels: only when nobody is gone and every survivor was quiet (then every pair's
   channel is in step: no message of an interrupted call is half-sent or unread; NCCL
   likewise shares a parent's resources only in a shrink without ``NCCL_SHRINK_ABORT``). A
   shared successor gets a fresh message id (drawn here), so that an unreceived message of
   the old communicator can never match one of its calls. A rank in the decision's gone
   set that is alive learns ``Excluded``.
2. *build*: the survivors make the new communicator: over the old channels when shared
   (its own fast path and cost model; no new socket or channel segment), else a fresh
   bootstrap (new channels too), watching the others' leases: a survivor that dies now
   fails the build at once.
3. *commit*: the survivors vote whether the build worked; if it failed anywhere or a
   survivor died meanwhile, every survivor drops what it built and the next attempt starts
   from 1 with the deaths now known. So either every survivor returns the same new
   communicator, or none does.

``grow`` is the same with newcomers: processes that called ``Communicator.join`` wait in the
*lobby* (a ticket, a lease, a queue in the store); the members' first round picks the
waiting ones, each gets its admission (the plan: name, its rank, every participant's lease
key), and members and joiners build and commit together.
"""
from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from rendezvous import Store, StoreError

from .. import debug
from ..errors import CollectiveTimeout, Excluded, InvalidArgument, PeerLost, PycollError, Revoked
from ..runtime.abort import AbortSignal
from .consensus import agree
from .membership import Lease, Membership, gone_keys, watch_keys

if TYPE_CHECKING:
    from ..runtime.execution import Execution
    from ..runtime.failures import Failures


class _Finalizable(Protocol):
    previous_ranks: list[int | None] | None

    def finalize(self, timeout: float = ...) -> None: ...


#: the communicator class (a type parameter: this module does not import it)
Communicator = TypeVar("Communicator", bound=_Finalizable)

T = TypeVar("T")

#: ``make(rank, size, name, watch, extra)``: the communicator a shrink or grow builds
Make = Callable[[int, int, str, Callable[[], None], dict[str, Any]], Communicator]

#: pause between two looks at the lobby (joiners waiting, an admission)
LOBBY_POLL_SECONDS = 0.005
#: a joiner not admitted this long says once on stderr what it waits for, and where (its
#: job may have ended: then it would wait out its deadline in silence)
JOIN_NOTICE_SECONDS = 5.0

#: the failures a shrink attempt's build may meet when a survivor dies meanwhile
BUILD_FAILURES = (PycollError, StoreError, OSError)


def base_name(name: str) -> str:
    """A communicator's name without its shrink generation ("world~2" -> "world")."""
    return name.split("~", 1)[0]


class Elastic(Generic[Communicator]):
    """The elastic calls of one communicator (see the module docstring)."""

    def __init__(self, rank: int, size: int, name: str, store: Store | None,
                 execution: Execution, failures: Failures, membership: Membership | None,
                 make: Make, release: Callable[[Communicator], None],
                 numerics: dict[str, Any] | None = None,
                 quiet: Callable[[], bool] = lambda: False,
                 draw_id: Callable[[], int] | None = None) -> None:
        self.rank, self.size, self.name = rank, size, name
        self.store = store
        self.execution = execution
        self.failures = failures
        self.membership = membership
        self.make = make
        self.release = release
        #: the reductions' defaults a joiner must take (``deterministic``, ``accumulate``)
        self.numerics = numerics or {}
        self.quiet = quiet
        self.draw_id = draw_id
        self.agreements = 0          # agree() calls so far (the same count on every rank)
        self.attempts = 0            # shrink attempts so far (likewise)

    # -- the calls: a store that cannot be reached fences this rank out ----------------------
    def agree(self, flag: int, timeout: float) -> tuple[int, frozenset[int]]:
        """``Communicator.agree``."""
        with self._store_reached("agree"):
            return self._agree(flag, timeout)

    def shrink(self, exclude: Sequence[int], timeout: float) -> Communicator:
        """``Communicator.shrink``."""
        with self._store_reached("shrink"):
            return self._shrink(exclude, timeout)

    def grow(self, count: int | None, timeout: float) -> Communicator | None:
        """``Communicator.grow``; None when nobody was admitted (nobody waiting)."""
        with self._store_reached("grow"):
            return self._grow(count, timeout)

    @contextmanager
    def _store_reached(self, what: str) -> Iterator[None]:
        """A store this rank cannot reach (a pulled cable, a partition): the others go on
        without it (its lease is lost), so it is ``Excluded``, a ``PycollError`` like every
        failure of the elastic calls, and the communicator counts as failed (finalize then
        does not wait long for the store)."""
        try:
            yield
        except (StoreError, AbortSignal) as e:
            why = (f"{type(e).__name__}: {e}" if isinstance(e, StoreError)
                   else str(e.record.get("error")))
            err = Excluded(f"rank {self.rank}: {what} of communicator {self.name}: the store "
                           f"cannot be reached ({why[:300]}); the other ranks go on without "
                           "this rank. Hint: finalize and exit; an elastic launcher may start "
                           "a replacement")
            if self.execution.failed is None:
                self.execution.failed = err
            raise err from None

    # -- revoke ------------------------------------------------------------------------------
    def revoke(self, reason: str) -> None:
        """Refuse every later call here and tell every rank (the abort record)."""
        if isinstance(self.execution.failed, Revoked):
            return
        self.execution.failed = self.failures.revoke(reason, self.execution.seq)

    # -- agree -------------------------------------------------------------------------------
    def _agree(self, flag: int, timeout: float) -> tuple[int, frozenset[int]]:
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

        decision = self._round(f"pycoll/{self.name}/agree/{self.agreements}",
                               range(self.size), {"flag": flag}, decide,
                               time.monotonic() + timeout, where, self._interruption(),
                               previous=f"pycoll/{self.name}/agree/{self.agreements - 2}")
        self._raise_if_interrupted(decision, where)
        return int(decision["flag"]), frozenset(decision["gone"])

    def _interruption(self) -> Callable[[], dict[str, Any] | None]:
        """The ``interrupted`` hook of a round of the normal flow (agree, grow): on a
        communicator this rank still takes for healthy, another rank's failure (its abort
        record) means that the ranks that have not voted are busy with that failure and will
        not vote here, so the round is given up, for everyone alike. On a failed or revoked
        communicator (a recovery's agree) this rank never gives a round up itself."""
        abort = self.failures.abort
        healthy = self.execution.failed is None

        def interrupted() -> dict[str, Any] | None:
            if not healthy or abort is None:
                return None
            try:
                record = abort.fetch()
            except AbortSignal as e:        # the store itself is gone
                return e.record
            return record if record is not None and record.get("rank") != self.rank else None
        return interrupted

    def _raise_if_interrupted(self, decision: dict[str, Any], where: str) -> None:
        if "interrupted" in decision:
            err = self.failures.aborted(where, decision["interrupted"])
            if self.execution.failed is None:
                self.execution.failed = err
            raise err

    # -- shrink ------------------------------------------------------------------------------
    def _shrink(self, exclude: Sequence[int], timeout: float) -> Communicator:
        """``Communicator.shrink``."""
        excluded = self._check_exclude(exclude)
        if self.size == 1:
            raise InvalidArgument(f"rank {self.rank}: shrink: a communicator of one rank "
                                  "has nobody to lose")
        self._needs_store("shrink")
        assert self.membership is not None
        quiet = self.quiet()           # before the revoke below, which ends any call
        self.revoke(f"rank {self.rank} shrinks it")
        deadline = time.monotonic() + timeout
        while True:
            self.attempts += 1
            where = (f"rank {self.rank}: shrink (attempt {self.attempts}) of communicator "
                     f"{self.name}")
            scope = f"pycoll/{self.name}/shrink/{self.attempts}"
            members = [r for r in range(self.size) if r not in excluded]
            who = self._round(scope, members, {"exclude": sorted(excluded),
                                               "quiet": int(quiet)},
                              self._decide_who, deadline, where)
            if who.get("error"):
                raise InvalidArgument(f"{where}: {who['error']}")
            survivors = who["survivors"]
            if self.rank not in survivors:      # a late rank the others did not count
                raise self._excluded(where)
            plan = Plan(scope, who["name"], survivors.index(self.rank),
                        self.membership.keys(survivors), [f"rank {r}" for r in survivors],
                        {"previous": survivors, "share": who.get("share", 0),
                         "comm_id": who.get("comm_id", 0)})
            built = self._build(plan, deadline, where)
            if built is not None:
                return built

    def _decide_who(self, votes: dict[int, dict[str, Any]], gone: set[int]) -> dict[str, Any]:
        """The first round's decision: the survivors (in order), the new communicator's
        name (drawn from a counter, so that every generation has its own keys), and whether
        it shares the old channels (nobody gone, every voter quiet: module docstring), with
        its fresh message id."""
        excludes = {tuple(v.get("exclude", ())) for v in votes.values()}
        if len(excludes) > 1:
            return {"error": "the ranks passed different exclude lists "
                             f"({sorted(excludes)}); pass the same list on every rank"}
        excluded = set(next(iter(excludes), ()))
        survivors = [r for r in range(self.size) if r not in gone and r not in excluded]
        decision: dict[str, Any] = {"gone": sorted(gone), "survivors": survivors,
                                    "name": self._next_name()}
        if (not gone and self.draw_id is not None
                and all(int(v.get("quiet", 0)) for v in votes.values())):
            decision.update(share=1, comm_id=self.draw_id())
        return decision

    def _next_name(self) -> str:
        assert self.store is not None
        base = base_name(self.name)
        return f"{base}~{int(self.store.add(f'pycoll/{base}/generations', 1))}"

    # -- grow --------------------------------------------------------------------------------
    def _grow(self, count: int | None, timeout: float) -> Communicator | None:
        """``Communicator.grow``; None when nobody was admitted (nobody waiting)."""
        if count is not None and (isinstance(count, bool) or not isinstance(count, int)
                                  or count < 1):
            raise InvalidArgument(f"rank {self.rank}: grow: count must be an int >= 1 or "
                                  f"None (whoever is waiting), not {count!r}")
        self._needs_store("grow")
        assert self.membership is not None
        if self.execution.failed is not None:
            raise PycollError(f"rank {self.rank}: grow: communicator {self.name} failed "
                              f"({self.execution.failed}); shrink it first, then grow the "
                              "shrunk one")
        deadline = time.monotonic() + timeout
        lobby = Lobby(self.failures_client(), base_name(self.name))
        while True:
            self.attempts += 1
            where = (f"rank {self.rank}: grow (attempt {self.attempts}) of communicator "
                     f"{self.name}")
            scope = f"pycoll/{self.name}/grow/{self.attempts}"
            late = ""
            if count is not None:
                try:
                    lobby.wait_for(count, deadline, where)
                except CollectiveTimeout as e:    # said in the round: everyone raises it
                    late = str(e)

            def decide(votes: dict[int, dict[str, Any]], gone: set[int]) -> dict[str, Any]:
                if gone:
                    return {"error": f"ranks {sorted(gone)} are gone: shrink first"}
                waited = [v["late"] for v in votes.values() if v.get("late")]
                if waited:
                    return {"late": waited[0]}
                tickets = lobby.waiting()[:count]
                return {"tickets": tickets, "name": self._next_name() if tickets else ""}

            who = self._round(scope, range(self.size), {"late": late}, decide, deadline, where,
                              self._interruption(),
                              previous=f"pycoll/{self.name}/grow/{self.attempts - 2}")
            self._raise_if_interrupted(who, where)
            if who.get("late"):
                raise CollectiveTimeout(who["late"])
            if who.get("error"):
                self.revoke(who["error"])
                raise PeerLost(f"{where}: {who['error']}", peer=None)
            tickets = who["tickets"]
            if not tickets:
                return None
            plan = Plan(scope, who["name"], self.rank,
                        self.membership.keys(range(self.size)) + lobby.keys(tickets),
                        [f"rank {r}" for r in range(self.size)]
                        + [f"joiner {t}" for t in tickets],
                        {"previous": list(range(self.size)) + [None] * len(tickets),
                         "numerics": self.numerics})
            lobby.admit(tickets, plan, self.size)
            built = self._build(plan, deadline, where, partial(lobby.joined, tickets))
            if built is not None:
                return built

    def waiting(self) -> int:
        """How many processes wait in this communicator's lobby (not collective)."""
        if self.store is None or self.failures.abort is None:
            return 0
        return len(Lobby(self.failures_client(), base_name(self.name)).waiting())

    def _build(self, plan: Plan, deadline: float, where: str,
               committed: Callable[[], None] | None = None) -> Communicator | None:
        """Build the planned communicator and commit it (``build_and_commit``); on success
        ``committed`` runs (bookkeeping over this communicator's store client), then this
        communicator is revoked, marked replaced in the store (a late rank's round on it
        then raises ``Excluded`` instead of deciding among "gone" ranks whose leases were
        only released) and let go. None: a participant died meanwhile, try again."""
        client = self.failures_client()
        built = build_and_commit(client, self.make, plan, deadline, where)
        if built is None:
            return None
        if committed is not None:
            committed()
        self.revoke(f"replaced by {plan.name}")
        _best_effort(lambda: client.set(f"pycoll/{self.name}/replaced", plan.name))
        self.release(built)
        return built

    def _needs_store(self, what: str) -> None:
        if self.store is None or self.membership is None or self.failures.abort is None:
            raise InvalidArgument(f"rank {self.rank}: {what}: communicator {self.name} has no "
                                  "store to agree through (made without one)")

    def _excluded(self, where: str) -> Excluded:
        return Excluded(f"{where}: the other ranks found this rank gone (its connection to "
                        "the store was lost, or it came too late) and go on without it. Hint: "
                        "finalize and exit; an elastic launcher may start a replacement")

    # -- the rounds --------------------------------------------------------------------------
    def failures_client(self) -> Store:
        abort = self.failures.abort
        if abort is None:
            raise InvalidArgument(f"rank {self.rank}: communicator {self.name} has no store "
                                  "to agree through")
        return abort.client()

    def _round(self, scope: str, participants: Sequence[int], vote: dict[str, Any],
               decide: Callable[[dict[int, dict[str, Any]], set[int]], dict[str, Any]],
               deadline: float, where: str,
               interrupted: Callable[[], dict[str, Any] | None] | None = None,
               previous: str = "") -> dict[str, Any]:
        """One agreement among ``participants`` (ranks of this communicator), gone ones found
        by the membership; raises ``Excluded`` when the decision counts this rank as gone or
        the communicator was replaced without it. ``previous``: a round of the same kind two
        rounds back, whose keys nobody reads any more (every participant of this one has
        finished the one before)."""
        assert self.membership is not None
        client = self.failures_client()
        if client.check([f"pycoll/{self.name}/replaced"]):
            raise self._excluded(where)
        membership = self.membership
        decision = agree(client, scope, self.rank, list(participants), vote,
                         lambda ranks: membership.gone(client, ranks), decide, deadline, where,
                         interrupted)
        if self.rank in decision.get("gone", ()):
            raise self._excluded(where)
        if previous:
            for key in (f"{previous}/votes", f"{previous}/decision"):
                _best_effort(partial(client.delete, key))
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


@dataclass
class Plan:
    """A communicator to build: the round's ``scope``, its ``name``, this participant's
    ``rank`` in it, every participant's lease key (in rank order) with a name for messages,
    and ``extra``: ``previous`` (each rank's number in the communicator it replaces, None
    for a joiner) and, for joiners, the members' ``numerics``. It travels to joiners as JSON
    (their admission)."""
    scope: str
    name: str
    rank: int
    keys: list[str]
    names: list[str]
    extra: dict[str, Any] = field(default_factory=dict)


class BuildFailed(Exception):
    """A participant's build failed without anyone dying (raised inside ``watch``)."""


def build_and_commit(client: Any, make: Make, plan: Plan, deadline: float,
                     where: str) -> Any:
    """Build ``plan``'s communicator, then the commit round: the communicator, or None on
    every participant when a participant died meanwhile (the next attempt starts over).

    While the build waits on the store it watches the other participants' leases, the
    deadline, and the commit votes: a participant whose build failed votes at once, so the
    others stop waiting for it. A build that failed without a death, or a deadline passed,
    is decided as such and raised on every participant alike (naming the rank and its
    error), never retried: the same failure would come back."""
    size = len(plan.keys)
    commit_scope = f"{plan.scope}/commit"
    lease_watch = watch_keys(client, plan.keys, plan.names, f"{where}: building {plan.name}")

    def watch() -> None:
        lease_watch()
        if time.monotonic() >= deadline:
            raise CollectiveTimeout(f"{where}: building {plan.name} took past the deadline")
        if client.check([f"{commit_scope}/votes"]):
            for line in bytes(client.get(f"{commit_scope}/votes")).decode().splitlines():
                if '"ok": 0' in line:
                    raise BuildFailed(line)

    error = ""
    try:
        built = make(plan.rank, size, plan.name, watch, plan.extra)
    except (*BUILD_FAILURES, BuildFailed) as e:
        built, error = None, f"{type(e).__name__}: {e}"[:500]

    def gone(ranks: Sequence[int]) -> set[int]:
        found = gone_keys(client, [plan.keys[r] for r in ranks])
        return {ranks[i] for i in found}

    def decide(votes: dict[int, dict[str, Any]], dead: set[int]) -> dict[str, Any]:
        return {"ok": int(all(int(v["ok"]) for v in votes.values())), "gone": sorted(dead),
                "errors": {r: v["error"] for r, v in votes.items()
                           if v.get("error") and not v["error"].startswith("BuildFailed")},
                "expired": any(v.get("expired") for v in votes.values())}

    vote = {"ok": int(built is not None), "error": error,
            "expired": int(time.monotonic() >= deadline)}
    commit = agree(client, commit_scope, plan.rank, range(size), vote, gone, decide, deadline,
                   where)
    if commit["ok"] and not commit["gone"]:
        if built is not None:
            built.previous_ranks = plan.extra.get("previous")
        return built
    if built is not None:
        built.finalize(timeout=1.0)
    if commit["gone"]:
        return None              # a participant died: the next attempt leaves it out
    if commit["expired"]:
        raise CollectiveTimeout(f"{where}: building {plan.name} went past the deadline on "
                                "some participant; every participant stops here")
    failed = sorted(commit["errors"].items()) or [("?", "a build failed")]
    rank, why = failed[0]
    raise PycollError(f"{where}: building {plan.name} failed on rank {rank} of it ({why}); "
                      "every participant stops here. Hint: look at that rank's output")


def _best_effort(call: Callable[[], Any]) -> None:
    """A store write that may fail without harm (bookkeeping, cleanup)."""
    try:
        call()
    except (StoreError, OSError) as e:
        from .. import debug
        debug.logger.info("elastic: a store write failed (%s); going on", e)


class Lobby:
    """Processes waiting to join the communicators named ``base`` ("world", "world~3", ...):
    each holds a ticket, a lease on its joiner key, and waits for its admission."""

    def __init__(self, client: Any, base: str) -> None:
        self.client = client
        self.prefix = f"pycoll/{base}/lobby"

    def key(self, ticket: int) -> str:
        return f"{self.prefix}/alive/{ticket}"

    def keys(self, tickets: Sequence[int]) -> list[str]:
        return [self.key(t) for t in tickets]

    # -- the members' side -------------------------------------------------------------------
    def waiting(self) -> list[int]:
        """Tickets of live joiners not admitted yet, in arrival order."""
        return self._live(self._queue()[1])

    def _queue(self) -> tuple[bytes, list[int]]:
        key = f"{self.prefix}/queue"
        raw = bytes(self.client.get(key)) if self.client.check([key]) else b""
        return raw, [int(t) for t in raw.split()]

    def _live(self, tickets: list[int]) -> list[int]:
        open_ = [t for t in tickets if not self.client.check([f"{self.prefix}/joined/{t}"])]
        dead = set(gone_keys(self.client, self.keys(open_)))
        return [t for i, t in enumerate(open_) if i not in dead]

    def trim(self) -> None:
        """Drop admitted and dead joiners' tickets from the queue, and their admissions and
        lease keys, so that ``waiting`` reads live tickets only. A compare-and-set: a joiner
        that queued meanwhile wins, and the next grow trims. The "joined" markers stay (a
        few bytes each): every member writes them, maybe after another member trimmed."""
        raw, tickets = self._queue()
        live = set(self._live(tickets))
        dropped = [t for t in tickets if t not in live]
        if not dropped:
            return
        kept = "".join(f"{t} " for t in tickets if t in live)
        if bytes(self.client.compare_set(f"{self.prefix}/queue", raw, kept)) != kept.encode():
            return
        for t in dropped:
            for key in (f"admit/{t}", f"alive/{t}"):
                self.client.delete(f"{self.prefix}/{key}")

    def wait_for(self, count: int, deadline: float, where: str) -> None:
        poll_until(lambda: len(self.waiting()) >= count or None, deadline, lambda: (
            f"{where}: {len(self.waiting())} of the {count} processes to admit are waiting "
            "at the deadline. Hint: start them with pycoll.init(join=True) (PYCOLL_JOIN=1), "
            "pointed at this job's store and secret"))

    def admit(self, tickets: Sequence[int], plan: Plan, size: int) -> None:
        """Tell each admitted joiner its plan (every member writes the same values)."""
        for i, t in enumerate(tickets):
            mine = Plan(plan.scope, plan.name, size + i, plan.keys, plan.names, plan.extra)
            self.client.set(f"{self.prefix}/admit/{t}", json.dumps(mine.__dict__))

    def joined(self, tickets: Sequence[int]) -> None:
        """Bookkeeping after a committed grow (best effort: the grow stands either way)."""
        for t in tickets:
            _best_effort(partial(self.client.set, f"{self.prefix}/joined/{t}", "1"))
        _best_effort(self.trim)

    # -- the joiner's side -------------------------------------------------------------------
    def enter(self, store: Store, timeout: float) -> tuple[int, Lease]:
        """Take a ticket, hold its lease, queue up."""
        ticket = int(self.client.add(f"{self.prefix}/tickets", 1))
        lease = Lease(store, self.key(ticket), timeout)
        self.client.append(f"{self.prefix}/queue", f"{ticket} ")
        return ticket, lease

    def admission(self, ticket: int, tried: str, deadline: float, store: str) -> Plan:
        """The next admission of ``ticket`` (one for another round than ``tried``). The
        first wait says once, after ``JOIN_NOTICE_SECONDS``, what it waits for at ``store``
        (its address)."""
        key = f"{self.prefix}/admit/{ticket}"
        quiet_until = time.monotonic() + JOIN_NOTICE_SECONDS if not tried else math.inf

        def admitted() -> Plan | None:
            nonlocal quiet_until
            if not self.client.check([key]):
                if time.monotonic() >= quiet_until:
                    quiet_until = math.inf
                    debug.logger.warning(
                        f"joiner {ticket}: waiting to be admitted to a running job: in the "
                        f"lobby {self.prefix} of the store at {store} (admission key {key}). "
                        "Its ranks admit joiners when they call grow() (pycoll.grow()); if "
                        "that job has ended or never grows, this process gives up at its "
                        f"join timeout, in {max(0.0, deadline - time.monotonic()):.0f} s")
                return None
            plan = Plan(**json.loads(self.client.get(key)))
            return plan if plan.scope != tried else None

        return poll_until(admitted, deadline, lambda: (
            f"joiner {ticket}: no running job admitted this process before the deadline. "
            "Hint: the job's ranks must call grow() (pycoll.grow()); is this process pointed "
            "at the job's store, with its secret?"))


def poll_until(look: Callable[[], T | None], deadline: float, why: Callable[[], str]) -> T:
    """``look()`` every ``LOBBY_POLL_SECONDS`` until it returns something;
    ``CollectiveTimeout(why())`` at the deadline."""
    while True:
        found = look()
        if found is not None:
            return found
        if time.monotonic() >= deadline:
            raise CollectiveTimeout(why())
        time.sleep(LOBBY_POLL_SECONDS)


def join(store: Store, base: str, make: Make, timeout: float) -> Any:
    """``Communicator.join``: wait in the lobby of ``base`` until the members' ``grow``
    admits this process, build the new communicator with them, and return it."""
    from .. import fastpath
    from ..runtime.abort import clone_client

    deadline = time.monotonic() + timeout
    if fastpath.probe_limit():
        # what a rank's first fast calls would load (numba, the kernels: about a second)
        # is loaded before this process queues up, not while the members wait for it
        fastpath.warm()
    client = clone_client(store, timeout)
    lobby = Lobby(client, base)
    ticket, lease = lobby.enter(store, timeout)
    where = str(getattr(store, "address", None) or f"the job's store ({type(store).__name__})")
    tried = ""
    try:
        while True:
            plan = lobby.admission(ticket, tried, deadline, where)
            tried = plan.scope
            built = build_and_commit(client, make, plan, deadline,
                                     f"joiner {ticket} (rank {plan.rank} of {plan.name})")
            if built is not None:
                return built
    finally:
        lease.close()
        if client is not store:
            client.close()
