"""Ring algorithms: bandwidth-optimal reduce-scatter, allgather and allreduce.

The buffer is split into ``size`` chunks. In the reduce-scatter phase each rank sends one
chunk to its right neighbour and reduces the chunk arriving from its left neighbour into its
own copy, ``size - 1`` times; afterwards rank r holds the fully reduced chunk (r + 1) % size.
The allgather phase passes the reduced chunks around the ring the same way, copying instead
of reducing. Every rank sends and receives 2 (size - 1) / size of the buffer in total, the
minimum possible (Patarasuk and Yuan 2009; Baidu's ring allreduce). Each reduction is done
once and then copied, so every rank ends with bit-identical results.
"""
from __future__ import annotations

import numpy as np

from .primitives import Peers, ReduceSpec, chunk_bounds, sendrecv, sendrecv_reduce


def reduce_scatter_ring(peers: Peers, arr: np.ndarray, spec: ReduceSpec) -> int:
    """Reduce ``arr`` across ranks so this rank owns one reduced chunk; return its index."""
    n, r = peers.size, peers.rank
    chunks = [arr[a:b] for a, b in chunk_bounds(arr.size, n)]
    right, left = (r + 1) % n, (r - 1) % n
    for step in range(n - 1):
        send_idx, recv_idx = (r - step) % n, (r - step - 1) % n
        sendrecv_reduce(peers, right, chunks[send_idx], left, chunks[recv_idx], spec)
    return (r + 1) % n


def allgather_ring(peers: Peers, arr: np.ndarray, owned: int) -> None:
    """Circulate each rank's chunk (``owned`` is this rank's) until every rank has all."""
    n, r = peers.size, peers.rank
    chunks = [arr[a:b] for a, b in chunk_bounds(arr.size, n)]
    right, left = (r + 1) % n, (r - 1) % n
    for step in range(n - 1):
        send_idx, recv_idx = (owned - step) % n, (owned - step - 1) % n
        sendrecv(peers, right, chunks[send_idx], left, chunks[recv_idx])


def allreduce_ring(peers: Peers, arr: np.ndarray, spec: ReduceSpec) -> None:
    owned = reduce_scatter_ring(peers, arr, spec)
    a, b = chunk_bounds(arr.size, peers.size)[owned]
    spec.finish(arr[a:b])
    allgather_ring(peers, arr, owned)
