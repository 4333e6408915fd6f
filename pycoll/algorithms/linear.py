"""Linear (flat) algorithms: the root talks to every rank directly.

Right for gather and scatter at small world sizes and for anything where the root's link is
not the bottleneck; they also serve as the simplest correct reference.
"""
from __future__ import annotations

import numpy as np

from .cost import PER_MESSAGE_US, Algorithm, Network, alpha, bound
from .primitives import Peers, chunk_bounds


def gather_linear(peers: Peers, inp: np.ndarray, out: np.ndarray | None, root: int,
                  bounds: list[tuple[int, int]] | None = None) -> None:
    """Rank i's ``inp`` lands in block i of ``out`` at ``root``: ``bounds[i]`` (gatherv's
    uneven blocks; default ``size`` equal ones)."""
    n, r = peers.size, peers.rank
    if r != root:
        peers.wait([peers.isend(root, inp)])
        return
    assert out is not None
    bounds = bounds or chunk_bounds(out.size, n)
    reqs = [peers.irecv(i, out[a:b]) for i, (a, b) in enumerate(bounds) if i != root]
    a, b = bounds[root]
    peers.copy(out[a:b], inp)
    peers.wait(reqs)


def scatter_linear(peers: Peers, inp: np.ndarray | None, out: np.ndarray, root: int,
                   bounds: list[tuple[int, int]] | None = None) -> None:
    """Block i of ``inp`` at ``root`` (``bounds[i]``, as in ``gather_linear``) lands in rank
    i's ``out``."""
    n, r = peers.size, peers.rank
    if r != root:
        peers.wait([peers.irecv(root, out)])
        return
    assert inp is not None
    bounds = bounds or chunk_bounds(inp.size, n)
    reqs = [peers.isend(i, inp[a:b]) for i, (a, b) in enumerate(bounds) if i != root]
    a, b = bounds[root]
    peers.copy(out, inp[a:b])
    peers.wait(reqs)


def _cost(nbytes: int, p: int, net: Network) -> float:
    """Gather and scatter (the same messages, the other way): the root posts every message
    at once and waits once."""
    link = net.link
    critical = (alpha(p, link, False) + (p - 2) * PER_MESSAGE_US * 1e-6
                + (p - 1) / p * nbytes * link.beta)
    return bound(critical, (p - 1) / p * nbytes * link.beta, p, link, False)


GATHER = Algorithm("gather", "linear", gather_linear, _cost)
SCATTER = Algorithm("scatter", "linear", scatter_linear, _cost)
