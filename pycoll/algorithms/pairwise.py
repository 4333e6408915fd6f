"""Pairwise exchange and dissemination: alltoall, the barrier, and Bruck's allgather.

In round k of alltoall every rank sends its block for ``rank + k`` and receives the block
from ``rank - k``, so each round is a permutation and no link carries two messages at once.
The dissemination barrier (Hensgen, Finkel and Manber 1988) needs ceil(log2 p) rounds of
empty messages for any p. Bruck's allgather (Bruck et al. 1997) follows the same pattern
with data: ceil(log2 p) rounds for any p, the latency-optimal allgather for small messages.
"""
from __future__ import annotations

import numpy as np

from .primitives import Peers


def alltoall_pairwise(peers: Peers, out: np.ndarray, inp: np.ndarray,
                      out_bounds: list[tuple[int, int]], in_bounds: list[tuple[int, int]]) -> None:
    """Block ``in_bounds[i]`` of ``inp`` goes to rank i, landing at its ``out_bounds[rank]``."""
    n, r = peers.size, peers.rank
    a, b = in_bounds[r]
    c, d = out_bounds[r]
    out[c:d] = inp[a:b]
    for k in range(1, n):
        dst, src = (r + k) % n, (r - k) % n
        a, b = in_bounds[dst]
        c, d = out_bounds[src]
        rreq = peers.irecv(src, out[c:d])
        sreq = peers.isend(dst, inp[a:b])
        peers.wait([rreq, sreq])


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
