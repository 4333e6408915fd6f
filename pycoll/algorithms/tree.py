"""Binomial trees: broadcast, reduce, gather and scatter in ceil(log2 p) rounds.

Ranks are renumbered relative to the root (``vrank = (rank - root) mod p``). Virtual rank v
with lowest set bit m has parent v - m and owns the subtree v .. v + m - 1 (clipped to p);
its children are v + m/2, v + m/4, ..., 1. In broadcast a rank first receives from its
parent, then sends to its children; reduce runs the same tree upwards. Large reduces stream
through ``recv_reduce`` segment by segment, so scratch stays a few segments.

Gather and scatter move a subtree's blocks as one range in virtual-rank order. In the
output (real rank order) that range may wrap past the last rank, so a range is sent as at
most two messages, split where the real rank wraps to 0; both ends compute the same split.
The root reads and writes the user's buffer directly; inner ranks stage their subtree's
blocks in scratch. ``scatter_allgather`` (van de Geijn) broadcasts by a binomial scatter of
p chunks followed by a ring allgather: 2 (p - 1) / p of the buffer per rank instead of
log2 p whole buffers, at the price of p - 1 + log2 p latencies.
"""
from __future__ import annotations

import numpy as np

from .cost import Algorithm, Network, alpha, bound, crowd, gamma, lg
from .primitives import Peers, ReduceSpec, chunk_bounds, recv, recv_reduce, send, send_segmented
from .ring import allgather_ring


def broadcast_binomial(peers: Peers, arr: np.ndarray, root: int) -> None:
    n = peers.size
    vrank = (peers.rank - root) % n
    mask = 1
    while mask < n:
        if vrank & mask:
            recv(peers, (vrank - mask + root) % n, arr)
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:
        if vrank + mask < n:
            send(peers, (vrank + mask + root) % n, arr)
        mask >>= 1


def reduce_binomial(peers: Peers, arr: np.ndarray, root: int, spec: ReduceSpec) -> None:
    """Reduce into ``arr`` at ``root``; other ranks' ``arr`` may hold partial results after."""
    n = peers.size
    vrank = (peers.rank - root) % n
    mask = 1
    while mask < n:
        if vrank & mask == 0:
            child = vrank | mask
            if child < n:
                recv_reduce(peers, (child + root) % n, arr, spec)
        else:
            send_segmented(peers, (vrank - mask + root) % n, arr)
            return
        mask <<= 1
    spec.finish(arr)


def _subtree(vrank: int, n: int) -> tuple[int, list[tuple[int, int]]]:
    """(parent mask m, children as (first, stop) virtual-rank ranges) of ``vrank``.

    ``m`` is the lowest set bit of ``vrank`` (for the root: the power of two >= n), so the
    subtree is ``vrank .. min(vrank + m, n) - 1``.
    """
    m = vrank & -vrank if vrank else 1 << (n - 1).bit_length()
    children = []
    mask = m >> 1
    while mask:
        if vrank + mask < n:
            children.append((vrank + mask, min(vrank + 2 * mask, n)))
        mask >>= 1
    return m, children


def _pieces(lo: int, hi: int, n: int, root: int) -> list[tuple[int, int]]:
    """Virtual ranks lo .. hi-1 cut where their real ranks wrap from p-1 to 0."""
    wrap = n - root
    return [(a, b) for a, b in ((lo, min(hi, wrap)), (max(lo, wrap), hi)) if a < b]


def gather_binomial(peers: Peers, inp: np.ndarray, out: np.ndarray | None, root: int) -> None:
    """Rank i's ``inp`` lands in block i of ``out`` at ``root`` (``out`` is None elsewhere)."""
    n, r = peers.size, peers.rank
    vrank, blk = (r - root) % n, inp.size
    m, children = _subtree(vrank, n)
    if vrank == 0:
        assert out is not None
        peers.copy(out[r * blk:(r + 1) * blk], inp)

        def place(a: int, b: int) -> np.ndarray:
            start = (a + root) % n
            return out[start * blk:(start + b - a) * blk]
    else:
        stop = min(vrank + m, n)
        stage = peers.scratch((stop - vrank) * blk, inp.dtype, slot=2) if children else inp
        if children:
            peers.copy(stage[:blk], inp)

        def place(a: int, b: int) -> np.ndarray:
            return stage[(a - vrank) * blk:(b - vrank) * blk]
    peers.wait([peers.irecv((c + root) % n, place(a, b))
                for c, c_stop in children for a, b in _pieces(c, c_stop, n, root)])
    if vrank:
        parent = (vrank - m + root) % n
        peers.wait([peers.isend(parent, place(a, b))
                    for a, b in _pieces(vrank, min(vrank + m, n), n, root)])


def scatter_binomial(peers: Peers, inp: np.ndarray | None, out: np.ndarray, root: int) -> None:
    """Block i of ``inp`` at ``root`` (None elsewhere) lands in rank i's ``out``."""
    n, r = peers.size, peers.rank
    vrank, blk = (r - root) % n, out.size
    m, children = _subtree(vrank, n)
    if vrank == 0:
        assert inp is not None
        peers.copy(out, inp[r * blk:(r + 1) * blk])

        def place(a: int, b: int) -> np.ndarray:
            start = (a + root) % n
            return inp[start * blk:(start + b - a) * blk]
    else:
        stop = min(vrank + m, n)
        stage = peers.scratch((stop - vrank) * blk, out.dtype, slot=2) if children else out

        def place(a: int, b: int) -> np.ndarray:
            return stage[(a - vrank) * blk:(b - vrank) * blk]
        parent = (vrank - m + root) % n
        peers.wait([peers.irecv(parent, place(a, b)) for a, b in _pieces(vrank, stop, n, root)])
        if children:
            peers.copy(out, stage[:blk])
    peers.wait([peers.isend((c + root) % n, place(a, b))
                for c, c_stop in children for a, b in _pieces(c, c_stop, n, root)])


def broadcast_scatter_allgather(peers: Peers, arr: np.ndarray, root: int) -> None:
    """van de Geijn broadcast: binomial scatter of p chunks, then ring allgather.

    Chunk j (of ``chunk_bounds``) belongs to virtual rank j, so every subtree's chunks are
    one contiguous range of ``arr`` and nothing is staged: ranks receive in place.
    """
    n = peers.size
    vrank = (peers.rank - root) % n
    bounds = chunk_bounds(arr.size, n)
    m, children = _subtree(vrank, n)
    if vrank:
        stop = min(vrank + m, n)
        recv(peers, (vrank - m + root) % n, arr[bounds[vrank][0]:bounds[stop - 1][1]])
    peers.wait([peers.isend((c + root) % n, arr[bounds[c][0]:bounds[c_stop - 1][1]])
                for c, c_stop in children])
    allgather_ring(peers, arr, owned=vrank, bounds=bounds)


# -- costs -----------------------------------------------------------------------------------
def _broadcast_cost(nbytes: int, p: int, net: Network) -> float:
    link = net.link
    return bound(lg(p) * (alpha(p, link, False) + nbytes * link.beta),
                 (p - 1) * nbytes * link.beta, p, link, False)


def _reduce_cost(nbytes: int, p: int, net: Network) -> float:
    """Round k has p / 2**(k+1) reductions at once, contending on one host (``crowd``)."""
    link = net.link
    a, b, g = alpha(p, link, False), link.beta, gamma()
    rounds = [max(1, p >> (k + 1)) for k in range(lg(p))]
    critical = sum(a + crowd(t, link) * nbytes * (b + g) for t in rounds)
    return bound(critical, (p - 1) * nbytes * (b + g), p, link, False)


def _gather_cost(nbytes: int, p: int, net: Network) -> float:
    """Gather and scatter (the same messages, the other way). Store and forward: the half of
    the data bound for the far subtree crosses the root's link and then, once staged whole,
    the next level's (measured: linear wins from a few KiB with 4 ranks); blocks are copied
    lg(p)/2 times on average."""
    link = net.link
    a, b = alpha(p, link, False), link.beta
    work = (p - 1) / p * nbytes * b * max(1.0, lg(p) / 2)
    critical = lg(p) * a + (p - 1) / p * nbytes * b + nbytes / 2 * b
    return bound(critical, work, p, link, False)


def _scatter_allgather_cost(nbytes: int, p: int, net: Network) -> float:
    link = net.link
    a, b = alpha(p, link, True), link.beta
    critical = (lg(p) + p - 1) * a + 2 * (p - 1) / p * nbytes * b
    return bound(critical, (p - 1 + lg(p) / 2) * nbytes * b, p, link)


BROADCAST = Algorithm("broadcast", "binomial", broadcast_binomial, _broadcast_cost)
BROADCAST_SCATTER_ALLGATHER = Algorithm("broadcast", "scatter_allgather",
                                        broadcast_scatter_allgather, _scatter_allgather_cost)
REDUCE = Algorithm("reduce", "binomial", reduce_binomial, _reduce_cost)
GATHER = Algorithm("gather", "binomial", gather_binomial, _gather_cost)
SCATTER = Algorithm("scatter", "binomial", scatter_binomial, _gather_cost)
