"""Binomial trees: broadcast and reduce in ceil(log2 p) rounds (latency-optimal).

Ranks are renumbered relative to the root (``vrank = (rank - root) mod p``). In broadcast a
rank first receives from the rank that differs in its lowest set bit, then sends to
``vrank + mask`` for every smaller power of two; reduce runs the same tree upwards. Large
reduces stream through ``recv_reduce`` segment by segment, so scratch stays a few segments.
"""
from __future__ import annotations

import numpy as np

from .primitives import Peers, ReduceSpec, recv, recv_reduce, send, send_segmented


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
