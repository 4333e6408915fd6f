"""A fault-tolerant agreement through the store (ULFM's ``MPIX_Comm_agree``; the protocol and
why it is correct: docs/elastic.md, "Agreement").

1. Every participant appends its vote to one key of the round (``votes``; ``append`` is
   atomic at the server, so one read returns every vote so far).
2. It then loops: if the round's ``decision`` key exists, that is the answer. Otherwise, once
   every participant has voted or is gone (``Membership.gone``: its store lease was lost),
   it computes a decision from the votes it read and the gone set it saw, and offers it with
   ``compare_set(decision, "", proposal)``: the store keeps the first offer, and every
   participant returns the value the store kept.

So every participant that returns, returns the same decision (one key, written once); the
loop ends as soon as every participant has voted or died (a dead rank's lease goes to "0"
within milliseconds on one host, a few seconds behind a pulled cable), or at the deadline,
naming the ranks that neither voted nor died (a live rank that never called): the timeout is
offered as the decision too, so that a participant that arrives later gets the same
``CollectiveTimeout`` and every participant has consumed the round alike; or when
``interrupted`` says so: a rank failed elsewhere meanwhile (its failure, not this round, is
what the participants that have not voted are busy with), decided as such for everyone.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import CollectiveTimeout

#: pauses between two looks at a round that is not decided yet: from the first (a local
#: store round trip costs ~50 µs; ranks arrive within milliseconds of each other) growing to
#: the last, so that many waiting ranks do not flood the store
POLL_SECONDS = 0.002
POLL_MAX_SECONDS = 0.02

Decide = Callable[[dict[int, dict[str, Any]], set[int]], dict[str, Any]]


def agree(client: Any, scope: str, rank: int, participants: Sequence[int],
          vote: dict[str, Any], gone: Callable[[Sequence[int]], set[int]], decide: Decide,
          deadline: float, where: str,
          interrupted: Callable[[], dict[str, Any] | None] | None = None) -> dict[str, Any]:
    """Run one round named ``scope`` (unique per round) as participant ``rank``; the decision.

    ``client``: a store with ``append`` (pycoll's stores have it). ``gone(ranks)``: which
    of ``ranks`` are gone now. ``decide(votes, gone)``: the proposal from the votes of the
    participants (participant -> vote; a vote from anyone else is ignored) and the gone
    participants; every participant must pass the same function, since any of them may be
    the one whose offer is kept. ``interrupted()``: a reason to give the round up while some
    participant has not voted (another rank failed meanwhile: it handles that failure
    instead of voting); it is offered as the decision ``{"interrupted": reason}``, so that
    every participant, late ones included, gets the same answer. A decided timeout raises
    ``CollectiveTimeout`` on every participant. A store call that fails for a moment (a slow
    or crowded store) is retried until the deadline: one rank must not leave a round alone.
    """
    decision_key = f"{scope}/decision"
    members = set(participants)
    _retrying(lambda: client.append(f"{scope}/votes", json.dumps(dict(vote, rank=rank)) + "\n"),
              deadline)
    pause = POLL_SECONDS
    while True:
        decision = _retrying(lambda: _look(client, scope, decision_key, participants, members,
                                           gone, decide, interrupted, deadline), deadline)
        if decision is not None:
            if "timeout" in decision:
                raise timed_out(where, decision["timeout"])
            return decision
        time.sleep(pause)
        pause = min(POLL_MAX_SECONDS, pause * 1.5)


def _look(client: Any, scope: str, decision_key: str, participants: Sequence[int],
          members: set[int], gone: Callable[[Sequence[int]], set[int]], decide: Decide,
          interrupted: Callable[[], dict[str, Any] | None] | None,
          deadline: float) -> dict[str, Any] | None:
    """One look at the round: its decision, one offered now, or None (not decided yet)."""
    if client.check([decision_key]):
        return json.loads(client.get(decision_key))
    votes = {r: v for r, v in _votes(client.get(f"{scope}/votes")).items() if r in members}
    silent = [r for r in participants if r not in votes]
    dead = gone(silent) if silent else set()
    missing = [r for r in silent if r not in dead]
    if not missing:
        dead |= gone([r for r in participants if r in votes])
        proposal = decide(votes, dead)
    elif interrupted is not None and (reason := interrupted()) is not None:
        proposal = {"interrupted": reason, "missing": missing}
    elif time.monotonic() >= deadline:          # decided as timed out for everyone alike
        proposal = {"timeout": missing}
    else:
        return None
    return json.loads(client.compare_set(decision_key, "", json.dumps(proposal)))


def _retrying(call: Callable[[], Any], deadline: float) -> Any:
    """``call()``, retried on a store error that is not the store's end until ``deadline``."""
    from rendezvous import StoreConnectError, StoreError

    while True:
        try:
            return call()
        except StoreConnectError:
            raise                            # refused: the store is gone
        except StoreError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(POLL_SECONDS)


def timed_out(where: str, missing: list[int]) -> CollectiveTimeout:
    """The error every participant of a round decided as timed out raises."""
    return CollectiveTimeout(
        f"{where}: rank(s) {missing} neither took part nor died before the deadline (decided "
        "for every participant). Hint: every surviving rank must call it (after catching "
        "the error of the failed collective); a rank busy elsewhere holds everyone up")


def _votes(raw: bytes) -> dict[int, dict[str, Any]]:
    votes: dict[int, dict[str, Any]] = {}
    for line in bytes(raw).decode().splitlines():
        try:
            vote = json.loads(line)
        except ValueError:
            continue
        if isinstance(vote, dict) and isinstance(vote.get("rank"), int):
            votes.setdefault(vote["rank"], vote)
    return votes
