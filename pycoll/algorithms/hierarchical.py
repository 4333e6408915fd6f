"""Hierarchical (two-level) compositions: inside each node over shm, across nodes over tcp.

allreduce (as in Horovod's hierarchical allreduce and NCCL's tree/ring split): reduce-scatter
inside each node, so local rank l holds the node's partial sum of chunk l; allreduce chunk l
across the nodes, all l in parallel on separate links; allgather inside each node. The slow
inter-node links then carry 1/local_size of the data each, in parallel.

broadcast: across nodes among the ranks with the root's local index, then inside each node.

Both need a uniform layout (several nodes, equally many ranks each); otherwise they run the
flat algorithm, so forcing ``algo="hierarchical"`` is always safe.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from . import recursive_doubling, ring
from .cost import Algorithm, Hierarchy, Network, gamma
from .primitives import Peers, ReduceSpec, chunk_bounds
from .recursive_doubling import allreduce_recursive_doubling
from .ring import allgather_ring, allreduce_ring, reduce_scatter_ring
from .tree import broadcast_binomial

_SMALL = 64 * 1024   # below this the cross-node step uses recursive doubling


def _no_finish(_: np.ndarray) -> None:
    pass


def allreduce_hierarchical(peers: Peers, arr: np.ndarray, spec: ReduceSpec) -> None:
    node, cross = peers.subgroup("node"), peers.subgroup("cross")
    if node is None or cross is None:
        allreduce_ring(peers, arr, spec)
        return
    owned = reduce_scatter_ring(node, arr, ReduceSpec(spec.reduce, _no_finish), shift=0)
    a, b = chunk_bounds(arr.size, node.size)[owned]
    chunk = arr[a:b]
    if chunk.nbytes < _SMALL:
        allreduce_recursive_doubling(cross, chunk, spec)
    else:
        allreduce_ring(cross, chunk, spec)
    allgather_ring(node, arr, owned)


def broadcast_hierarchical(peers: Peers, arr: np.ndarray, root: int) -> None:
    node, cross = peers.subgroup("node"), peers.subgroup("cross")
    if node is None or cross is None:
        broadcast_binomial(peers, arr, root)
        return
    root_node, root_local = peers.layout[root]
    if peers.layout[peers.rank][1] == root_local:
        broadcast_binomial(cross, arr, root_node)
    broadcast_binomial(node, arr, root_local)


# -- costs: on the two levels' own links (``Hierarchy``) ---------------------------------------
def _two_levels(net: Network) -> bool:
    """Only a uniform multi-node layout has a two-level model: elsewhere the hierarchical
    algorithms run the flat one, which the model already weighs under its own name."""
    return net.hierarchy is not None


def _levels(net: Network) -> Hierarchy:
    assert net.hierarchy is not None, "applies() admits only layouts with a hierarchy"
    return net.hierarchy


def _allreduce_cost(nbytes: int, p: int, net: Network) -> float:
    """The intra-node reduce-scatter and allgather on the node link; the cross-node
    allreduce of each shard (ring or recursive doubling, the cheaper) on the network link
    shared by the node's ranks (they run at the same time over one NIC)."""
    h = _levels(net)
    local, a, b, g = h.local, h.intra.alpha, h.intra.beta, gamma()
    inside = 2 * (local - 1) * a + (local - 1) / local * nbytes * (2 * b + g)
    shard = nbytes / local
    shared = Network(replace(h.inter, beta=h.inter.beta * local))
    across = min(flat.cost(int(shard), h.nodes, shared)
                 for flat in (ring.ALLREDUCE, recursive_doubling.ALLREDUCE))
    return inside + across


def _broadcast_cost(nbytes: int, p: int, net: Network) -> float:
    h = _levels(net)
    inter = h.inter.alpha + nbytes * h.inter.beta
    intra = h.intra.alpha + nbytes * h.intra.beta
    return math.ceil(math.log2(h.nodes)) * inter + math.ceil(math.log2(h.local)) * intra


ALLREDUCE = Algorithm("allreduce", "hierarchical", allreduce_hierarchical, _allreduce_cost,
                      applies=_two_levels)
BROADCAST = Algorithm("broadcast", "hierarchical", broadcast_hierarchical, _broadcast_cost,
                      applies=_two_levels)
