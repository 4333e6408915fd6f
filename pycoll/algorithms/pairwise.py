"""Pairwise exchange: alltoall in p - 1 rounds, and the dissemination barrier.

In round k of alltoall every rank sends its block for ``rank + k`` and receives the block
from ``rank - k``, so each round is a permutation and no link carries two messages at once.
The dissemination barrier (Hensgen, Finkel and Manber 1988) needs ceil(log2 p) rounds of
empty messages for any p.
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
