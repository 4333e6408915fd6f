"""Halving and doubling: Rabenseifner allreduce, recursive-halving reduce-scatter and
recursive-doubling allgather (Thakur, Rabenseifner and Gropp 2005).

Among a power-of-two number of ranks, *recursive halving* reduces a buffer so that each
rank ends with one fully reduced block: in each round a rank keeps half of its current range,
sends the other half to the rank whose number differs in one bit, and reduces what that rank
sends back. ``log2 p`` rounds move ``(p - 1) / p`` of the buffer, like the ring, but with
``log2 p`` instead of ``p - 1`` latencies. *Recursive doubling* is the inverse and gathers the
blocks again. Rabenseifner's allreduce is the two back to back.

World sizes that are not a power of two are folded first, as in ``recursive_doubling.py``:
of the first ``2 * rem`` ranks (``rem = p - pof2``) each even one hands its whole buffer to the
odd one above it and sits the exchange out; the ``pof2`` ranks that remain get *virtual
ranks*. Each virtual rank's block covers the blocks of the real ranks it represents, so the
blocks stay contiguous and in order. Every block is reduced by exactly one rank and then
copied, so all ranks end with identical bits.
"""
from __future__ import annotations

import numpy as np

from .cost import Algorithm, Network, alpha, bound, fold_cost, gamma, lg, pof2
from .pairwise import allgather_bruck, allgather_bruck_cost
from .primitives import (
    Peers,
    ReduceSpec,
    chunk_bounds,
    recv,
    recv_reduce,
    send,
    send_segmented,
    sendrecv,
    sendrecv_reduce,
)

Bounds = list[tuple[int, int]]


def fold(n: int, rank: int) -> tuple[int, int, int]:
    """Return (pof2, rem, virtual rank) for ``rank``; the virtual rank is -1 if it sits out."""
    pof2 = 1 << (n.bit_length() - 1)
    rem = n - pof2
    if rank < 2 * rem:
        return pof2, rem, (rank // 2 if rank % 2 else -1)
    return pof2, rem, rank - rem


def real_rank(vrank: int, rem: int) -> int:
    """The real rank behind a virtual one (inverse of ``fold``)."""
    return 2 * vrank + 1 if vrank < rem else vrank + rem


def _span(arr: np.ndarray, bounds: Bounds, lo: int, hi: int) -> np.ndarray:
    """Blocks ``lo .. hi-1`` of ``arr`` (contiguous) as one view."""
    return arr[bounds[lo][0]:bounds[hi - 1][1]]


def halve(peers: Peers, arr: np.ndarray, vbounds: Bounds, vrank: int, rem: int,
          spec: ReduceSpec) -> None:
    """Recursive halving among ``len(vbounds)`` (a power of two) virtual ranks.

    Afterwards virtual rank v holds the reduced (unfinished) block ``vbounds[v]``. The
    partners first differ in the highest bit, so the largest exchange happens first and each
    later round touches half as much data.
    """
    lo, mask = 0, len(vbounds) >> 1
    while mask:
        partner = real_rank(vrank ^ mask, rem)
        if vrank & mask:
            keep, give = lo + mask, lo
        else:
            keep, give = lo, lo + mask
        sendrecv_reduce(peers, partner, _span(arr, vbounds, give, give + mask), partner,
                        _span(arr, vbounds, keep, keep + mask), spec)
        lo = keep
        mask >>= 1


def double(peers: Peers, arr: np.ndarray, vbounds: Bounds, vrank: int, rem: int) -> None:
    """Recursive doubling among ``len(vbounds)`` virtual ranks: v starts owning block v and
    every rank ends with all blocks; each round swaps the ranges two partners hold."""
    mask = 1
    while mask < len(vbounds):
        partner = real_rank(vrank ^ mask, rem)
        mine = vrank & ~(mask - 1)
        theirs = mine ^ mask
        sendrecv(peers, partner, _span(arr, vbounds, mine, mine + mask), partner,
                 _span(arr, vbounds, theirs, theirs + mask))
        mask <<= 1


def _fold_in(peers: Peers, arr: np.ndarray, rem: int, spec: ReduceSpec) -> None:
    """The first 2*rem ranks pair up: the even one's buffer is reduced into the odd one's
    (streamed segment by segment, so no full-size scratch is needed)."""
    r = peers.rank
    if r < 2 * rem:
        if r % 2 == 0:
            send_segmented(peers, r + 1, arr)
        else:
            recv_reduce(peers, r - 1, arr, spec)


def allreduce_rabenseifner(peers: Peers, arr: np.ndarray, spec: ReduceSpec) -> None:
    """Reduce-scatter by recursive halving, then allgather by recursive doubling.

    Bandwidth-optimal like the ring with logarithmic latency; on non-powers of two it pays
    one extra full-buffer transfer in and one out for the folded ranks.
    """
    n, r = peers.size, peers.rank
    pof2, rem, vrank = fold(n, r)
    _fold_in(peers, arr, rem, spec)
    if vrank >= 0:
        vbounds = chunk_bounds(arr.size, pof2)
        halve(peers, arr, vbounds, vrank, rem, spec)
        a, b = vbounds[vrank]
        spec.finish(arr[a:b])
        double(peers, arr, vbounds, vrank, rem)
    if r < 2 * rem:  # hand the result to the rank that sat out
        if vrank < 0:
            recv(peers, r + 1, arr)
        else:
            send(peers, r - 1, arr)


def reduce_scatter_recursive_halving(peers: Peers, work: np.ndarray, spec: ReduceSpec) -> None:
    """reduce_scatter registry entry: rank r ends with the reduced, finished block r.

    After folding, virtual rank v's block is the union of its real ranks' blocks; the odd
    rank of a folded pair passes the even one its block at the end.
    """
    n, r = peers.size, peers.rank
    pof2, rem, vrank = fold(n, r)
    bounds = chunk_bounds(work.size, n)
    _fold_in(peers, work, rem, spec)
    if vrank >= 0:
        vbounds = [(bounds[2 * v][0], bounds[2 * v + 1][1]) if v < rem else bounds[v + rem]
                   for v in range(pof2)]
        halve(peers, work, vbounds, vrank, rem, spec)
    if r < 2 * rem:
        if vrank < 0:
            a, b = bounds[r]
            recv(peers, r + 1, work[a:b])
        else:
            a, b = bounds[r - 1]
            send(peers, r - 1, work[a:b])
    a, b = bounds[r]
    spec.finish(work[a:b])


def allgather_recursive_doubling(peers: Peers, out: np.ndarray, bounds: Bounds) -> None:
    """allgather registry entry: recursive doubling for power-of-two world sizes.

    Other sizes run Bruck's algorithm (``pairwise.allgather_bruck``), which has the same
    cost, ceil(log2 p) rounds and (p - 1) / p of the data, without a power-of-two shape;
    folding would cost an extra full-buffer transfer instead.
    """
    n = peers.size
    if n & (n - 1):
        allgather_bruck(peers, out, bounds)
    else:
        double(peers, out, bounds, peers.rank, 0)


def _allreduce_cost(nbytes: int, p: int, net: Network) -> float:
    """Rabenseifner: halving then doubling among q = pof2(p) ranks, 2 lg(q) steps moving
    (q - 1) / q of the buffer each way, after the fold."""
    link = net.link
    a, b, g = alpha(p, link, True), link.beta, gamma()
    q = pof2(p)
    folding = fold_cost(nbytes, p, link)
    per_rank = (q - 1) / q * nbytes * (2 * b + g)
    return bound(2 * lg(q) * a + per_rank + folding, q * per_rank + folding, p, link)


def _reduce_scatter_cost(nbytes: int, p: int, net: Network) -> float:
    link = net.link
    a, b, g = alpha(p, link, True), link.beta, gamma()
    q = pof2(p)
    folding = 0.0 if q == p else fold_cost(nbytes, p, link) / 2 + nbytes / p * b
    per_rank = (q - 1) / q * nbytes * (b + g)
    return bound(lg(q) * a + per_rank + folding, q * per_rank + folding, p, link)


def _allgather_cost(nbytes: int, p: int, net: Network) -> float:
    """Bruck's when p is not a power of two (``allgather_bruck_cost``)."""
    if pof2(p) != p:
        return allgather_bruck_cost(nbytes, p, net)
    link = net.link
    a, b = alpha(p, link, True), link.beta
    return bound(lg(p) * a + (p - 1) / p * nbytes * b, (p - 1) * nbytes * b, p, link)


ALLREDUCE = Algorithm("allreduce", "rabenseifner", allreduce_rabenseifner, _allreduce_cost)
REDUCE_SCATTER = Algorithm("reduce_scatter", "recursive_halving",
                           reduce_scatter_recursive_halving, _reduce_scatter_cost)
ALLGATHER = Algorithm("allgather", "recursive_doubling", allgather_recursive_doubling,
                      _allgather_cost)
