"""Agreement: a rooted collective completes on no rank until every rank has shown that it
runs the same call.

A rooted collective's data flows one way. A broadcast's or scatter's root only sends, and a
reduce's or gather's leaves only send: a rank that believes it is the root (or a leaf of a
root that nobody else named) hears from nobody, so the message tags' signatures
(``tags.py``), which every receive compares, never get a chance to tell it that the others
disagree. It would return its own data as the result. So beside the data, every rank
exchanges empty *agreement* messages whose tags carry the call's signature
(``tags.agreement_tag``: the data tag with the agreement bit), so that each matches only a
rank that agrees, and returns only once it has heard, directly or through ranks that heard
first, from every rank:

* up to ``DIRECT_MAX`` ranks, directly: every rank sends one to every other rank and
  receives one from each, all posted before the data moves, so they cross the wire while
  the data does and add no round trip (with 2 or 3 ranks as few messages as below);
* beyond, in a dissemination pattern (Hensgen, Finkel and Manber's barrier): in round k
  rank r sends to r + 2^k and receives from r - 2^k, and sends round k + 1 only once round k
  has arrived; round 0 is posted before the data moves, the other ceil(log2 p) - 1 rounds
  after it.

A rank whose call differs (another root, dtype, count...) sends messages that nobody
matches: the receiver sees the disagreement (``conflicts``) and raises ``CollectiveMismatch``,
and every other rank, still waiting for an agreement message that now never comes, stops at
the abort record that error posts. A rank that waits for data from a parent that disagrees
(two ranks that each name the other as root) would wait for its deadline; the agreement
message it already holds proves the disagreement, and ``Peers.watch`` finds it while the
wait idles.
"""
from __future__ import annotations

import numpy as np

from ..tags import agreement_tag
from ..transports.base import Request
from .primitives import Peers

#: the most ranks that exchange agreement messages directly (p - 1 messages each way per
#: rank, one round); larger communicators use the dissemination pattern (ceil(log2 p)
#: messages each way, as many rounds). Every message costs CPU time on both ends: with 4
#: ranks on 2 cores the direct exchange's 12 messages per call measured slower than the
#: dissemination's 8 (docs/performance.md, agreement on rooted collectives)
DIRECT_MAX = 3
_EMPTY = np.empty(0, dtype=np.uint8)


def begin(peers: Peers) -> list[Request]:
    """Post what can go before the data: every message (direct), or round 0."""
    n, r = peers.size, peers.rank
    tag = agreement_tag(peers.tag)
    dists = range(1, n) if n <= DIRECT_MAX else (1,)
    reqs = [peers.irecv((r - d) % n, _EMPTY, tag) for d in dists]
    return reqs + [peers.isend((r + d) % n, _EMPTY, tag) for d in dists]


def finish(peers: Peers, first: list[Request]) -> None:
    """Wait for what ``begin`` posted, then run the other rounds: return only once every
    rank agreed."""
    n, r = peers.size, peers.rank
    peers.wait(first)
    if n <= DIRECT_MAX:
        return
    tag = agreement_tag(peers.tag)
    dist = 2
    while dist < n:
        peers.wait([peers.irecv((r - dist) % n, _EMPTY, tag),
                    peers.isend((r + dist) % n, _EMPTY, tag)])
        dist <<= 1
