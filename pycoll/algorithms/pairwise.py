"""Pairwise exchange and dissemination: alltoall, the barrier, and Bruck's allgather.

In round k of alltoall every rank sends its block for ``rank + k`` and receives the block
from ``rank - k``, so each round is a permutation and no link carries two messages at once.
The dissemination barrier (Hensgen, Finkel and Manber 1988) needs ceil(log2 p) rounds of
empty messages for any p. Bruck's allgather (Bruck et al. 1997) follows the same pattern
with data: ceil(log2 p) rounds for any p, the latency-optimal allgather for small messages.
"""
from __future__ import annotations

import math

import numpy as np

from .cost import PER_MESSAGE_US, Algorithm, Network, alpha, bound, lg
from .primitives import Peers, sendrecv


def alltoall_pairwise(peers: Peers, out: np.ndarray, inp: np.ndarray,
                      out_bounds: list[tuple[int, int]], in_bounds: list[tuple[int, int]]) -> None:
    """Block ``in_bounds[i]`` of ``inp`` goes to rank i, landing at its ``out_bounds[rank]``."""
    n, r = peers.size, peers.rank
    a, b = in_bounds[r]
    c, d = out_bounds[r]
    peers.copy(out[c:d], inp[a:b])
    for k in range(1, n):
        dst, src = (r + k) % n, (r - k) % n
        a, b = in_bounds[dst]
        c, d = out_bounds[src]
        rreq = peers.irecv(src, out[c:d])
        sreq = peers.isend(dst, inp[a:b])
        peers.wait([rreq, sreq])


#: partners posted at once by the scattered alltoall (MPICH's bblock): bounds the requests
#: and unexpected messages in flight
SCATTER_BLOCK = 32


def alltoall_scattered(peers: Peers, out: np.ndarray, inp: np.ndarray,
                       out_bounds: list[tuple[int, int]],
                       in_bounds: list[tuple[int, int]]) -> None:
    """All partners of a block of ``SCATTER_BLOCK`` rounds at once (MPICH's "scattered").

    Latency-bound alltoalls (small blocks, many ranks) pay one wait per block of partners
    instead of one per partner. The messages are those of the pairwise exchange (one per
    ordered pair, same tag), so ranks that chose differently still match.
    """
    n, r = peers.size, peers.rank
    a, b = in_bounds[r]
    c, d = out_bounds[r]
    peers.copy(out[c:d], inp[a:b])
    for first in range(1, n, SCATTER_BLOCK):
        ks = range(first, min(first + SCATTER_BLOCK, n))
        reqs = [peers.irecv((r - k) % n, out[out_bounds[(r - k) % n][0]:out_bounds[(r - k) % n][1]])
                for k in ks]
        reqs += [peers.isend((r + k) % n, inp[in_bounds[(r + k) % n][0]:in_bounds[(r + k) % n][1]])
                 for k in ks]
        peers.wait(reqs)


def alltoall_bruck(peers: Peers, out: np.ndarray, inp: np.ndarray,
                   out_bounds: list[tuple[int, int]], in_bounds: list[tuple[int, int]]) -> None:
    """Bruck's alltoall (Bruck et al. 1997): ceil(log2 p) rounds instead of p - 1.

    Blocks are first rotated so that block i is the one for rank + i ("distance" i); in the
    round with bit k, every block whose distance has bit k set moves k ranks forward, packed
    into one message; after the last round each block has travelled its distance, and an
    inverse rotation puts block i (from rank - i) in place. It moves each block up to log2 p
    times, so it pays for small blocks at large p only, and it needs equal blocks on every
    rank, which no rank can verify for the others: it is chosen only when asked for
    (``algo="bruck"``), never by the cost model.
    """
    n, r = peers.size, peers.rank
    blk = in_bounds[0][1] - in_bounds[0][0]
    rows = np.arange(n)
    table = peers.scratch(n * blk, inp.dtype, slot=2).reshape(n, blk)
    table[...] = inp.reshape(n, blk)[(rows + r) % n]
    half = (n + 1) // 2
    outgoing = peers.scratch(half * blk, inp.dtype, slot=3)
    incoming = peers.scratch(half * blk, inp.dtype, slot=4)
    k = 1
    while k < n:
        moving = rows[(rows & k) != 0]
        m = moving.size * blk
        outgoing[:m].reshape(moving.size, blk)[...] = table[moving]
        sendrecv(peers, (r + k) % n, outgoing[:m], (r - k) % n, incoming[:m])
        table[moving] = incoming[:m].reshape(moving.size, blk)
        k <<= 1
    out.reshape(n, blk)[(r - rows) % n] = table


_EMPTY = np.zeros(0, dtype=np.uint8)


def barrier_dissemination(peers: Peers) -> None:
    n, r = peers.size, peers.rank
    dist = 1
    while dist < n:
        rreq = peers.irecv((r - dist) % n, _EMPTY)
        sreq = peers.isend((r + dist) % n, _EMPTY)
        peers.wait([rreq, sreq])
        dist <<= 1


def allgather_bruck(peers: Peers, out: np.ndarray, bounds: list[tuple[int, int]]) -> None:
    """Bruck's allgather, written without its usual temporary buffer and final rotation.

    After round k rank r holds blocks r .. r + 2^k - 1 (mod p). In the round with distance
    d it sends its first min(d, p - d) blocks to rank r - d and receives as many from rank
    r + d. Seen in rank order those blocks are one range of ``out`` that may wrap past the
    end; a wrapping range goes as two messages, split where the block index wraps. Sender
    and receiver compute the same split, so message sizes always match.
    """
    n, r = peers.size, peers.rank

    def pieces(first: int, count: int) -> list[np.ndarray]:
        end = first + count
        if end <= n:
            return [out[bounds[first][0]:bounds[end - 1][1]]]
        return [out[bounds[first][0]:bounds[n - 1][1]], out[bounds[0][0]:bounds[end - n - 1][1]]]

    dist = 1
    while dist < n:
        count = min(dist, n - dist)
        src, dst = (r + dist) % n, (r - dist) % n
        reqs = [peers.irecv(src, view) for view in pieces(src, count)]
        reqs += [peers.isend(dst, view) for view in pieces(r, count)]
        peers.wait(reqs)
        dist <<= 1


# -- costs -----------------------------------------------------------------------------------
def _alltoall_pairwise_cost(nbytes: int, p: int, net: Network) -> float:
    return (p - 1) * (alpha(p, net.link, True) + nbytes / p * net.link.beta)


def _alltoall_scattered_cost(nbytes: int, p: int, net: Network) -> float:
    """Blocks of ``SCATTER_BLOCK`` messages posted at once: one wait per block, and
    ``PER_MESSAGE_US`` per message (measured no slower per byte than the pairwise rounds)."""
    blocks = -(-(p - 1) // SCATTER_BLOCK)
    return (blocks * alpha(p, net.link, True)
            + (p - 1) * (PER_MESSAGE_US * 1e-6 + nbytes / p * net.link.beta))


def _unmodelled(nbytes: int, p: int, net: Network) -> float:
    return math.inf


def _on_request_only(net: Network) -> bool:
    """Bruck's alltoall needs equal blocks on every rank, which no rank can know: it runs
    only when forced (``algo=`` / ``PYCOLL_ALGO``)."""
    return False


def _barrier_cost(nbytes: int, p: int, net: Network) -> float:
    return lg(p) * alpha(p, net.link, True)


def allgather_bruck_cost(nbytes: int, p: int, net: Network) -> float:
    """lg(p) rounds; the ranges wrap in some of them, which costs a second message there
    (half a step more per round on average)."""
    link = net.link
    a, b = alpha(p, link, True), link.beta
    return bound((lg(p) + 0.5 * lg(p)) * a + (p - 1) / p * nbytes * b, (p - 1) * nbytes * b,
                 p, link)


ALLTOALL_PAIRWISE = Algorithm("alltoall", "pairwise", alltoall_pairwise, _alltoall_pairwise_cost)
ALLTOALL_SCATTERED = Algorithm("alltoall", "scattered", alltoall_scattered,
                               _alltoall_scattered_cost)
ALLTOALL_BRUCK = Algorithm("alltoall", "bruck", alltoall_bruck, _unmodelled,
                           applies=_on_request_only)
BARRIER = Algorithm("barrier", "dissemination", barrier_dissemination, _barrier_cost)
ALLGATHER_BRUCK = Algorithm("allgather", "bruck", allgather_bruck, allgather_bruck_cost)
