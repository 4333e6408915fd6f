"""Collective algorithms, each a short loop over the primitives in ``primitives.py``.

``ALGORITHMS[collective][name]`` is the registry that selection (``selection.py``) and the
``algo=`` / ``PYCOLL_ALGO`` overrides draw from. Signatures per collective:

=============== =================================================================
allreduce       fn(peers, arr, spec)                      in place, every rank
broadcast       fn(peers, arr, root)                      in place
reduce          fn(peers, arr, root, spec)                result in ``arr`` at root
allgather       fn(peers, out, bounds)                    own block already in ``out``
reduce_scatter  fn(peers, work, spec)                     rank r ends with block r of ``work``
alltoall        fn(peers, out, inp, out_bounds, in_bounds)
gather          fn(peers, inp, out, root)                 ``out`` only at root
scatter         fn(peers, inp, out, root)                 ``inp`` only at root
barrier         fn(peers)
=============== =================================================================
"""
from __future__ import annotations

from collections.abc import Callable

from .chain import broadcast_pipeline
from .halving_doubling import (
    allgather_recursive_doubling,
    allreduce_rabenseifner,
    reduce_scatter_recursive_halving,
)
from .hierarchical import allreduce_hierarchical, broadcast_hierarchical
from .linear import gather_linear, scatter_linear
from .ordered import (
    allreduce_ordered,
    allreduce_ordered_gather,
    reduce_ordered,
    reduce_ordered_gather,
    reduce_scatter_ordered_owned,
)
from .pairwise import (
    allgather_bruck,
    alltoall_bruck,
    alltoall_pairwise,
    alltoall_scattered,
    barrier_dissemination,
)
from .recursive_doubling import allreduce_recursive_doubling
from .ring import allgather_ring, allreduce_ring, reduce_ring, reduce_scatter_ring_owned
from .tree import (
    broadcast_binomial,
    broadcast_scatter_allgather,
    gather_binomial,
    reduce_binomial,
    scatter_binomial,
)


def _allgather_ring(peers, out, bounds) -> None:  # registry signature
    allgather_ring(peers, out, bounds=bounds)


#: Every algorithm here is correct for every world size and element count, so selection
#: never has to ask whether one applies; the order is the tie-break order of the selector.
ALGORITHMS: dict[str, dict[str, Callable]] = {
    "allreduce": {
        "ring": allreduce_ring,
        "recursive_doubling": allreduce_recursive_doubling,
        "rabenseifner": allreduce_rabenseifner,
        "hierarchical": allreduce_hierarchical,   # flat ring unless the layout is multi-node
        "ordered": allreduce_ordered,             # rank-order folds: deterministic=True
        "ordered_gather": allreduce_ordered_gather,
    },
    "broadcast": {
        "binomial": broadcast_binomial,
        "pipeline": broadcast_pipeline,
        "scatter_allgather": broadcast_scatter_allgather,
        "hierarchical": broadcast_hierarchical,   # flat binomial unless multi-node
    },
    "reduce": {"binomial": reduce_binomial, "ring": reduce_ring, "ordered": reduce_ordered,
               "ordered_gather": reduce_ordered_gather},
    "allgather": {
        "ring": _allgather_ring,
        "recursive_doubling": allgather_recursive_doubling,  # Bruck when p is not a power of 2
        "bruck": allgather_bruck,
    },
    "reduce_scatter": {
        "ring": reduce_scatter_ring_owned,
        "recursive_halving": reduce_scatter_recursive_halving,
        "ordered": reduce_scatter_ordered_owned,
    },
    # bruck needs equal blocks on every rank: only on request (algo= / PYCOLL_ALGO)
    "alltoall": {"pairwise": alltoall_pairwise, "scattered": alltoall_scattered,
                 "bruck": alltoall_bruck},
    "gather": {"linear": gather_linear, "binomial": gather_binomial},
    "scatter": {"linear": scatter_linear, "binomial": scatter_binomial},
    "barrier": {"dissemination": barrier_dissemination},
}
