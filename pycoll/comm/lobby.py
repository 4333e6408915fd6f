"""The lobby: where processes wait to join a running job, and ``grow``, which admits them
(docs/elastic.md).

A process that calls ``Communicator.join`` (``pycoll.init(join=True)``) waits in the *lobby*
of the communicators named like the one it joins: it takes a ticket, holds a lease on its
joiner key and queues up in the store. ``grow`` is ``shrink``'s agreement
(``recovery.py``) with newcomers: the members' first round picks the waiting ones, each
gets its admission (the plan: name, its rank, every participant's lease key), and members
and joiners build and commit together (``build_and_commit``), so either all of them hold the
grown communicator or none does. The launcher counts the same lobby
(``launch/joiners.py``).
"""
from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar

from rendezvous import Store

from .. import debug
from ..errors import CollectiveTimeout, InvalidArgument, PeerLost, PycollError
from .membership import Lease, gone_keys
from .recovery import Communicator, Elastic, Make, Plan, base_name, best_effort, build_and_commit

T = TypeVar("T")

#: pause between two looks at the lobby (joiners waiting, an admission)
LOBBY_POLL_SECONDS = 0.005
#: a joiner not admitted this long says once on stderr what it waits for, and where (its
#: job may have ended: then it would wait out its deadline in silence)
JOIN_NOTICE_SECONDS = 5.0


def grow(elastic: Elastic[Communicator], count: int | None,
         timeout: float) -> Communicator | None:
    """``Communicator.grow``; None when nobody was admitted (nobody waiting)."""
    with elastic.store_reached("grow"):
        return _grow(elastic, count, timeout)


def _grow(elastic: Elastic[Communicator], count: int | None,
          timeout: float) -> Communicator | None:
    if count is not None and (isinstance(count, bool) or not isinstance(count, int)
                              or count < 1):
        raise InvalidArgument(f"rank {elastic.rank}: grow: count must be an int >= 1 or "
                              f"None (whoever is waiting), not {count!r}")
    elastic.needs_store("grow")
    assert elastic.membership is not None
    if elastic.execution.failed is not None:
        raise PycollError(f"rank {elastic.rank}: grow: communicator {elastic.name} failed "
                          f"({elastic.execution.failed}); shrink it first, then grow the "
                          "shrunk one")
    deadline = time.monotonic() + timeout
    lobby = Lobby(elastic.failures_client(), base_name(elastic.name))
    while True:
        elastic.attempts += 1
        where = (f"rank {elastic.rank}: grow (attempt {elastic.attempts}) of communicator "
                 f"{elastic.name}")
        scope = f"pycoll/{elastic.name}/grow/{elastic.attempts}"
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
            return {"tickets": tickets, "name": elastic.next_name() if tickets else ""}

        who = elastic.round(scope, range(elastic.size), {"late": late}, decide, deadline,
                            where, elastic.interruption(),
                            previous=f"pycoll/{elastic.name}/grow/{elastic.attempts - 2}")
        elastic.raise_if_interrupted(who, where)
        if who.get("late"):
            raise CollectiveTimeout(who["late"])
        if who.get("error"):
            elastic.revoke(who["error"])
            raise PeerLost(f"{where}: {who['error']}", peer=None)
        tickets = who["tickets"]
        if not tickets:
            return None
        plan = Plan(scope, who["name"], elastic.rank,
                    elastic.membership.keys(range(elastic.size)) + lobby.keys(tickets),
                    [f"rank {r}" for r in range(elastic.size)]
                    + [f"joiner {t}" for t in tickets],
                    {"previous": list(range(elastic.size)) + [None] * len(tickets),
                     "numerics": elastic.numerics})
        lobby.admit(tickets, plan, elastic.size)
        built = elastic.build(plan, deadline, where, partial(lobby.joined, tickets))
        if built is not None:
            return built


def waiting(elastic: Elastic[Any]) -> int:
    """How many processes wait in the lobby of ``elastic``'s communicator (not collective)."""
    if elastic.store is None or elastic.failures.abort is None:
        return 0
    return len(Lobby(elastic.failures_client(), base_name(elastic.name)).waiting())


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
            best_effort(partial(self.client.set, f"{self.prefix}/joined/{t}", "1"))
        best_effort(self.trim)

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
