"""Collective algorithms, each a short loop over the primitives in ``primitives.py``.

``ALGORITHMS[collective][name]`` is the registry that selection (``pycoll.tuning``) and the
``algo=`` / ``PYCOLL_ALGO`` overrides draw from.
"""
from __future__ import annotations

from typing import Callable

from .recursive_doubling import allreduce_recursive_doubling
from .ring import allreduce_ring

ALGORITHMS: dict[str, dict[str, Callable]] = {
    "allreduce": {
        "ring": allreduce_ring,
        "recursive_doubling": allreduce_recursive_doubling,
    },
}
