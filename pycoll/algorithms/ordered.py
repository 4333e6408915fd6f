"""Reductions in rank order: the algorithms of ``deterministic=True``.

Every other reduction algorithm combines partial results in an order of its own (a ring
starts chunk c at rank c + 1, recursive doubling pairs ranks by bits, a tree by subtrees), so
the bits of a floating-point sum depend on which algorithm ran, on the chunking and on the
placement. Here each chunk's owner receives every rank's piece of its chunk and folds them
in rank order, ``((x0 op x1) op x2) op ...`` (``folding.Fold``: the contract of
docs/numerics.md, accumulated in float32 for half-precision sums), then the owners'
results are gathered. The bytes on the wire are a ring reduce-scatter's: every rank sends
(p - 1) / p of its buffer and receives as much; the owner's receives arrive all at once
instead of one neighbour at a time.

For small messages, where rounds cost more than bytes, the ``*_ordered_gather`` variants
send every rank's whole buffer to every rank that needs it (one round) and fold there.

Pipelining: the owner folds its chunk segment by segment (``ORDERED_SEGMENT_BYTES``, the
same on every rank whatever the transports, so that every source cuts its piece where the
owner folds), with the next segment's receives posted while the current one is folded.
"""
from __future__ import annotations

import numpy as np

from ..transports.base import Request
from .cost import PER_MESSAGE_US, Algorithm, LinkModel, Network, alpha, bound, gamma, lg, pof2
from .halving_doubling import allgather_recursive_doubling
from .primitives import Peers, ReduceSpec, chunk_bounds
from .ring import allgather_ring

#: elements of a fold segment, in bytes: every source's piece of it is one message
ORDERED_SEGMENT_BYTES = 512 * 1024


def _segment(peers: Peers, itemsize: int) -> int:
    return max(1, (peers.segment_bytes or ORDERED_SEGMENT_BYTES) // itemsize)


def reduce_scatter_ordered(peers: Peers, arr: np.ndarray, spec: ReduceSpec,
                           bounds: list[tuple[int, int]] | None = None) -> None:
    """Rank r ends with chunk r of ``arr`` (``bounds``; default nearly equal chunks) folded
    in rank order over every rank's ``arr`` and finished (avg's scale)."""
    fold = spec.fold
    if fold is None:
        raise TypeError("the ordered algorithms need a rank-order fold for this memory")
    n, r = peers.size, peers.rank
    bounds = bounds or chunk_bounds(arr.size, n)
    seg = _segment(peers, arr.itemsize)
    sends: list[Request] = []
    for step in range(1, n):            # my pieces of every other owner's chunk
        owner = (r + step) % n          # (each owner hears from its ranks in turn)
        lo, hi = bounds[owner]
        sends += [peers.isend(owner, arr[s:min(hi, s + seg)]) for s in range(lo, hi, seg)]
    a, b = bounds[r]
    mine = arr[a:b]
    starts = list(range(0, b - a, seg))
    others = [q for q in range(n) if q != r]
    m = len(others)
    space = peers.scratch(2 * m * seg, arr.dtype, slot=2) if starts else arr[:0]
    acc = (peers.scratch(seg, fold.acc_dtype or arr.dtype, slot=3)
           if starts and (fold.wide or r != 0) else None)

    def pieces(k: int) -> list[np.ndarray]:
        size = min(seg, mine.size - starts[k])
        base = (k % 2) * m
        return [space[(base + i) * seg:(base + i) * seg + size] for i in range(m)]

    def post(k: int) -> list[Request]:
        return [peers.irecv(q, piece) for q, piece in zip(others, pieces(k))]

    pending = [post(k) for k in range(min(2, len(starts)))]
    for k, start in enumerate(starts):
        peers.wait(pending[k])
        size = min(seg, mine.size - start)
        own = mine[start:start + size]
        received = pieces(k)
        sources = received[:r] + [own] + received[r:]
        fold(own, sources, acc[:size] if acc is not None else None)
        if k + 2 < len(starts):
            pending.append(post(k + 2))
    peers.wait(sends)


def allreduce_ordered(peers: Peers, arr: np.ndarray, spec: ReduceSpec) -> None:
    """Ordered reduce-scatter, then an allgather of the owners' chunks: recursive doubling
    where the world is a power of two (lg p rounds), a ring otherwise (the same bytes)."""
    n = peers.size
    bounds = chunk_bounds(arr.size, n)
    reduce_scatter_ordered(peers, arr, spec, bounds)
    if n > 2 and not n & (n - 1):
        allgather_recursive_doubling(peers, arr, bounds)
    else:
        allgather_ring(peers, arr, bounds=bounds)


def reduce_ordered(peers: Peers, arr: np.ndarray, root: int, spec: ReduceSpec) -> None:
    """Ordered reduce-scatter, then every owner sends its chunk to ``root``."""
    n, r = peers.size, peers.rank
    bounds = chunk_bounds(arr.size, n)
    reduce_scatter_ordered(peers, arr, spec, bounds)
    if r != root:
        a, b = bounds[r]
        peers.wait([peers.isend(root, arr[a:b])])
        return
    peers.wait([peers.irecv(q, arr[a:b]) for q, (a, b) in enumerate(bounds) if q != root])


def reduce_scatter_ordered_owned(peers: Peers, work: np.ndarray, spec: ReduceSpec) -> None:
    """reduce_scatter registry entry: rank r ends with the folded (and finished) block r."""
    reduce_scatter_ordered(peers, work, spec)


def allreduce_ordered_gather(peers: Peers, arr: np.ndarray, spec: ReduceSpec) -> None:
    """Every rank sends its whole buffer to every other and folds all of them in rank order:
    one round instead of the reduce-scatter's and the allgather's, for the small messages
    where rounds cost more than bytes ((p - 1) buffers in and out per rank)."""
    fold = spec.fold
    if fold is None:
        raise TypeError("the ordered algorithms need a rank-order fold for this memory")
    n, r = peers.size, peers.rank
    others = [q for q in range(n) if q != r]
    space = peers.scratch((n - 1) * arr.size, arr.dtype, slot=2)
    pieces = [space[i * arr.size:(i + 1) * arr.size] for i in range(n - 1)]
    requests = [peers.irecv(q, piece) for q, piece in zip(others, pieces)]
    requests += [peers.isend(q, arr) for q in others]
    peers.wait(requests)
    acc = (peers.scratch(arr.size, fold.acc_dtype or arr.dtype, slot=3)
           if fold.wide or r >= 2 else None)
    fold(arr, pieces[:r] + [arr] + pieces[r:], acc)


def reduce_ordered_gather(peers: Peers, arr: np.ndarray, root: int, spec: ReduceSpec) -> None:
    """Every rank sends its buffer to ``root``, which folds them in rank order (one round)."""
    fold = spec.fold
    if fold is None:
        raise TypeError("the ordered algorithms need a rank-order fold for this memory")
    n, r = peers.size, peers.rank
    if r != root:
        peers.wait([peers.isend(root, arr)])
        return
    others = [q for q in range(n) if q != r]
    space = peers.scratch((n - 1) * arr.size, arr.dtype, slot=2)
    pieces = [space[i * arr.size:(i + 1) * arr.size] for i in range(n - 1)]
    peers.wait([peers.irecv(q, piece) for q, piece in zip(others, pieces)])
    acc = (peers.scratch(arr.size, fold.acc_dtype or arr.dtype, slot=3)
           if fold.wide or r >= 2 else None)
    fold(arr, pieces[:r] + [arr] + pieces[r:], acc)


# -- costs -----------------------------------------------------------------------------------
def _reduce_scatter_time(nbytes: int, p: int, link: LinkModel) -> float:
    """The ordered reduce-scatter: one round in which every rank posts its p - 1 pieces at
    once, the owner's link bringing in (p - 1) / p of the buffer, and the owner's fold of p
    pieces of 1/p of it (p - 1 passes, segment by segment)."""
    a, b, g = alpha(p, link, True), link.beta, gamma()
    return (a + (p - 2) * PER_MESSAGE_US * 1e-6 + (p - 1) / p * nbytes * b
            + (p - 1) / p * nbytes * g)


def _allreduce_cost(nbytes: int, p: int, net: Network) -> float:
    link = net.link
    a, b, g = alpha(p, link, True), link.beta, gamma()
    rs = _reduce_scatter_time(nbytes, p, link)
    rounds = lg(p) if p > 2 and pof2(p) == p else p - 1     # the allgather's
    ag = rounds * a + (p - 1) / p * nbytes * b
    return bound(rs + ag, p * (p - 1) / p * nbytes * (2 * b + 2 * g), p, link)


def _allreduce_gather_cost(nbytes: int, p: int, net: Network) -> float:
    """One round: every buffer to every rank, folded there."""
    link = net.link
    a, b, g = alpha(p, link, True), link.beta, gamma()
    critical = a + (p - 2) * PER_MESSAGE_US * 1e-6 + (p - 1) * nbytes * (b + g)
    return bound(critical, p * (p - 1) * nbytes * (b + g), p, link)


def _reduce_cost(nbytes: int, p: int, net: Network) -> float:
    """The ordered reduce-scatter, then the root gathers p - 1 chunks at once."""
    link = net.link
    b, g = link.beta, gamma()
    critical = (_reduce_scatter_time(nbytes, p, link) + alpha(p, link, False)
                + (p - 1) / p * nbytes * b)
    return bound(critical, (p - 1) * nbytes * (b + g) + (p - 1) / p * nbytes * b, p,
                 link, False)


def _reduce_gather_cost(nbytes: int, p: int, net: Network) -> float:
    """Every buffer to the root, folded there (one round)."""
    link = net.link
    b, g = link.beta, gamma()
    critical = (alpha(p, link, False) + (p - 2) * PER_MESSAGE_US * 1e-6
                + (p - 1) * nbytes * (b + g))
    return bound(critical, (p - 1) * nbytes * (b + g), p, link, False)


def _reduce_scatter_cost(nbytes: int, p: int, net: Network) -> float:
    link = net.link
    return bound(_reduce_scatter_time(nbytes, p, link),
                 (p - 1) * nbytes * (link.beta + gamma()), p, link)


ALLREDUCE = Algorithm("allreduce", "ordered", allreduce_ordered, _allreduce_cost, ordered=True)
ALLREDUCE_GATHER = Algorithm("allreduce", "ordered_gather", allreduce_ordered_gather,
                             _allreduce_gather_cost, ordered=True)
REDUCE = Algorithm("reduce", "ordered", reduce_ordered, _reduce_cost, ordered=True)
REDUCE_GATHER = Algorithm("reduce", "ordered_gather", reduce_ordered_gather,
                          _reduce_gather_cost, ordered=True)
REDUCE_SCATTER = Algorithm("reduce_scatter", "ordered", reduce_scatter_ordered_owned,
                           _reduce_scatter_cost, ordered=True)
