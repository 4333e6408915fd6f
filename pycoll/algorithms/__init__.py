"""Collective algorithms, each a short loop over the primitives in ``primitives.py``.

Each algorithm module declares, next to its code, one ``Algorithm`` record (``cost.py``) per
collective it serves: its run function, its cost, whether it folds in rank order, when the
model may pick it. ``ALGORITHMS[collective][name]`` lists them: the one table that the
selector (``selection.py``), the ``algo=`` / ``PYCOLL_ALGO`` overrides, the collectives that
run them (``record.run``) and ``python -m pycoll.info --algorithms`` read. Adding an
algorithm: write it and its record in its module, and add the record here. Signatures of
``run`` per collective:

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

The ``compressed`` records (``compressed.py``: ``compress=`` calls, and only they) take the
``Compression`` (wire format, dtype, finishing step) as one more argument.
"""
from __future__ import annotations

from . import (
    chain,
    compressed,
    halving_doubling,
    hierarchical,
    linear,
    ordered,
    pairwise,
    recursive_doubling,
    ring,
    tree,
)
from .cost import Algorithm

#: Every algorithm here is correct for every world size and element count; the order within
#: a collective is the selector's tie-break order.
ALGORITHMS: dict[str, dict[str, Algorithm]] = {}
for _algorithm in (
    ring.ALLREDUCE,
    recursive_doubling.ALLREDUCE,
    halving_doubling.ALLREDUCE,         # Rabenseifner
    hierarchical.ALLREDUCE,             # flat ring unless the layout is multi-node
    ordered.ALLREDUCE,                  # rank-order folds: deterministic=True
    ordered.ALLREDUCE_GATHER,
    tree.BROADCAST,
    chain.BROADCAST,
    tree.BROADCAST_SCATTER_ALLGATHER,
    hierarchical.BROADCAST,             # flat binomial unless multi-node
    tree.REDUCE,
    ring.REDUCE,
    ordered.REDUCE,
    ordered.REDUCE_GATHER,
    ring.ALLGATHER,
    halving_doubling.ALLGATHER,         # Bruck when p is not a power of 2
    pairwise.ALLGATHER_BRUCK,
    ring.REDUCE_SCATTER,
    halving_doubling.REDUCE_SCATTER,
    ordered.REDUCE_SCATTER,
    pairwise.ALLTOALL_PAIRWISE,
    pairwise.ALLTOALL_SCATTERED,
    pairwise.ALLTOALL_BRUCK,            # equal blocks only: on request
    linear.GATHER,
    tree.GATHER,
    linear.SCATTER,
    tree.SCATTER,
    pairwise.BARRIER,
    compressed.ALLREDUCE,               # compress=: these, and only these
    compressed.REDUCE_SCATTER,
    compressed.ALLGATHER,
    compressed.BROADCAST,
):
    ALGORITHMS.setdefault(_algorithm.collective, {})[_algorithm.name] = _algorithm
del _algorithm
