"""Collective algorithms, each a short loop over the primitives in ``primitives.py``.

``ALGORITHMS[collective][name]`` is the registry that selection (``pycoll.tuning``) and the
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

from typing import Callable

from .linear import gather_linear, scatter_linear
from .pairwise import alltoall_pairwise, barrier_dissemination
from .recursive_doubling import allreduce_recursive_doubling
from .ring import allgather_ring, allreduce_ring, reduce_scatter_ring_owned
from .tree import broadcast_binomial, reduce_binomial


def _allgather_ring(peers, out, bounds) -> None:  # registry signature
    allgather_ring(peers, out, bounds=bounds)


ALGORITHMS: dict[str, dict[str, Callable]] = {
    "allreduce": {
        "ring": allreduce_ring,
        "recursive_doubling": allreduce_recursive_doubling,
    },
    "broadcast": {"binomial": broadcast_binomial},
    "reduce": {"binomial": reduce_binomial},
    "allgather": {"ring": _allgather_ring},
    "reduce_scatter": {"ring": reduce_scatter_ring_owned},
    "alltoall": {"pairwise": alltoall_pairwise},
    "gather": {"linear": gather_linear},
    "scatter": {"linear": scatter_linear},
    "barrier": {"dissemination": barrier_dissemination},
}
