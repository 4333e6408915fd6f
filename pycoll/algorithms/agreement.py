"""Agreement: a rooted collective completes on no rank until every rank has shown that it
runs the same call.

A rooted collective's data flows one way. A broadcast's or scatter's root only sends, and a
reduce's or gather's leaves only send: a rank that believes it is the root (or a leaf of a
root that nobody else named) hears from nobody, so the message tags' signatures
(``tags.py``), which every receive compares, never get a chance to tell it that the others
disagree. It would return its own data as the result. So beside the data, every rank
exchanges empty *agreement* messages in a dissemination pattern (Hensgen, Finkel and Manber's
barrier): in round k rank r sends to r + 2^k and receives from r - 2^k, and sends round k + 1
only once round k has arrived. After ceil(log2 p) rounds every rank has heard, directly or
through ranks that heard first, from every rank; each message carries the call's signature in
its tag (``tags.agreement_tag``: the data tag with the agreement bit), so it matches only a
rank that agrees. A rank whose call differs (another root, dtype, count...) sends messages
that nobody matches: the receiver sees the disagreement (``conflicts``) and raises
``CollectiveMismatch``, and every other rank, still waiting for an agreement message that
now never comes, stops at the abort record that error posts.

Round 0 is posted before the data moves and the rest after it, so the cost is the rounds
after the first: none with two ranks, where the two agreement messages cross the wire while
the data does. A rank that waits for data from a parent that disagrees (two ranks that each
name the other as root) would wait for its deadline; the agreement message it already holds
proves the disagreement, and ``Peers.watch`` finds it while the wait idles.
"""
from __future__ import annotations

import numpy as np

from ..tags import agreement_tag
from ..transports.base import Request
from .primitives import Peers

_EMPTY = np.empty(0, dtype=np.uint8)


def begin(peers: Peers) -> list[Request]:
    """Post round 0 (to rank + 1, from rank - 1); the data may move meanwhile."""
    n, r = peers.size, peers.rank
    tag = agreement_tag(peers.tag)
    return [peers.irecv((r - 1) % n, _EMPTY, tag), peers.isend((r + 1) % n, _EMPTY, tag)]


def finish(peers: Peers, first: list[Request]) -> None:
    """Wait for round 0, then run the other rounds: return only once every rank agreed."""
    n, r = peers.size, peers.rank
    tag = agreement_tag(peers.tag)
    peers.wait(first)
    dist = 2
    while dist < n:
        peers.wait([peers.irecv((r - dist) % n, _EMPTY, tag),
                    peers.isend((r + dist) % n, _EMPTY, tag)])
        dist <<= 1
