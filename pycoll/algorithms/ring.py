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

from .cost import Algorithm, Network, alpha, bound, crowd, gamma
from .primitives import Peers, ReduceSpec, chunk_bounds, send, sendrecv, sendrecv_reduce


def reduce_scatter_ring(peers: Peers, arr: np.ndarray, spec: ReduceSpec, shift: int = 0) -> int:
    """Reduce ``arr`` across ranks so this rank owns chunk ``(rank + shift) % size``.

    Returns the index of the owned chunk. ``shift=1`` lets the allgather phase of allreduce
    start without a detour; reduce_scatter uses ``shift=0`` (rank r owns chunk r).
    """
    n, r = peers.size, peers.rank
    chunks = [arr[a:b] for a, b in chunk_bounds(arr.size, n)]
    right, left = (r + 1) % n, (r - 1) % n
    for step in range(n - 1):
        send_idx, recv_idx = (r + shift - 1 - step) % n, (r + shift - 2 - step) % n
        sendrecv_reduce(peers, right, chunks[send_idx], left, chunks[recv_idx], spec)
    return (r + shift) % n


def allgather_ring(peers: Peers, arr: np.ndarray, owned: int | None = None,
                   bounds: list[tuple[int, int]] | None = None) -> None:
    """Circulate each rank's chunk (``owned`` is this rank's, default its rank) to every rank.

    ``bounds`` gives each chunk's (start, stop); default: ``size`` nearly equal chunks.
    """
    n, r = peers.size, peers.rank
    owned = r if owned is None else owned
    chunks = [arr[a:b] for a, b in (bounds or chunk_bounds(arr.size, n))]
    right, left = (r + 1) % n, (r - 1) % n
    for step in range(n - 1):
        send_idx, recv_idx = (owned - step) % n, (owned - step - 1) % n
        sendrecv(peers, right, chunks[send_idx], left, chunks[recv_idx])


def reduce_scatter_ring_owned(peers: Peers, arr: np.ndarray, spec: ReduceSpec) -> None:
    """reduce_scatter registry entry: rank r ends with the reduced (and finished) chunk r."""
    owned = reduce_scatter_ring(peers, arr, spec, shift=0)
    a, b = chunk_bounds(arr.size, peers.size)[owned]
    spec.finish(arr[a:b])


def allreduce_ring(peers: Peers, arr: np.ndarray, spec: ReduceSpec) -> None:
    owned = reduce_scatter_ring(peers, arr, spec, shift=1)
    a, b = chunk_bounds(arr.size, peers.size)[owned]
    spec.finish(arr[a:b])
    allgather_ring(peers, arr, owned)


def reduce_ring(peers: Peers, arr: np.ndarray, root: int, spec: ReduceSpec) -> None:
    """Reduce for large messages: ring reduce-scatter, then every rank sends its chunk to root.

    Rabenseifner's reduce (reduce-scatter + gather), with the ring's reduce-scatter so any
    world size works: (p - 1) / p of the buffer is reduced per rank instead of all of it
    at each tree level. The root finishes the whole buffer once, after the gather; other
    ranks' buffers are workspace.
    """
    n, r = peers.size, peers.rank
    owned = reduce_scatter_ring(peers, arr, spec, shift=0)
    bounds = chunk_bounds(arr.size, n)
    if r != root:
        a, b = bounds[owned]
        send(peers, root, arr[a:b])
        return
    peers.wait([peers.irecv(i, arr[a:b]) for i, (a, b) in enumerate(bounds) if i != root])
    spec.finish(arr)


def _allgather_ring(peers: Peers, out: np.ndarray, bounds: list[tuple[int, int]]) -> None:
    allgather_ring(peers, out, bounds=bounds)      # the registry's signature


# -- costs: (p - 1) steps of 1/p of the buffer each way --------------------------------------
def _allreduce_cost(nbytes: int, p: int, net: Network) -> float:
    link = net.link
    a, b, g = alpha(p, link, True), link.beta, gamma()
    per_rank = (p - 1) / p * nbytes * (2 * b + g)
    return bound(2 * (p - 1) * a + per_rank, p * per_rank, p, link)


def _reduce_cost(nbytes: int, p: int, net: Network) -> float:
    """The ring reduce-scatter (every rank at once), then the root gathers p - 1 chunks."""
    link = net.link
    a, b, g = alpha(p, link, True), link.beta, gamma()
    critical = (p * a + crowd(p, link) * (p - 1) / p * nbytes * (b + g)
                + (p - 1) / p * nbytes * b)
    # the contention is in the critical path already: no thrash factor on the work
    return bound(critical, (p - 1) * nbytes * (b + g) + (p - 1) / p * nbytes * b, p, link,
                 False)


def _allgather_cost(nbytes: int, p: int, net: Network) -> float:
    link = net.link
    a, b = alpha(p, link, True), link.beta
    return bound((p - 1) * a + (p - 1) / p * nbytes * b, (p - 1) * nbytes * b, p, link)


def _reduce_scatter_cost(nbytes: int, p: int, net: Network) -> float:
    link = net.link
    a, b, g = alpha(p, link, True), link.beta, gamma()
    per_rank = (p - 1) / p * nbytes * (b + g)
    return bound((p - 1) * a + per_rank, p * per_rank, p, link)


ALLREDUCE = Algorithm("allreduce", "ring", allreduce_ring, _allreduce_cost)
REDUCE = Algorithm("reduce", "ring", reduce_ring, _reduce_cost)
ALLGATHER = Algorithm("allgather", "ring", _allgather_ring, _allgather_cost)
REDUCE_SCATTER = Algorithm("reduce_scatter", "ring", reduce_scatter_ring_owned,
                           _reduce_scatter_cost)
