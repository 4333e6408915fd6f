"""Scratch, copy, reduce and the transport reference, per memory type.

Algorithms are loops over primitives; the primitives need four things from the memory
they move: a ``MemRef`` for the transport (``ref``), scratch space of the same kind
(``scratch``), a copy (``copy``) and an element-wise reduction (``reduce_spec``). This
module is the one place where those depend on the memory type, so an algorithm never knows
whether its arrays live in host memory or on a GPU.

Host memory is served by numpy (and torch's vectorised half-precision kernels where the
program imported torch, see ``reduction``). Device memory is served by ``pycoll.cuda.ops``,
which registers its ops (``register_ops``) when CUDA buffers are first used; without it
``ops_for`` raises a clear error naming what is missing instead of silently staging through
the host.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidArgument
from .folding import Fold
from .memory import HOST, MemoryType, MemRef
from .reduction import ReduceOp, finish, needs_finish, prepare, reducer

Reduce = Callable[[Any, Any], None]


def _unchanged(_: Any) -> None:
    """The finishing step of every op but avg: nothing to do."""


@dataclass
class ReduceSpec:
    """How to combine (``reduce(dst, src)``) and finish (``finish(chunk)``, e.g. avg's
    divide), and how to fold the ranks' inputs in rank order (``fold``: the contract of
    ``deterministic=True``, accumulated in float32 for halves where asked; ``folding.Fold``).
    ``prepare(input)`` runs on each rank's input first (premul_sum's multiply), with the
    kernels of the memory it is in.
    """

    reduce: Reduce
    finish: Callable[[Any], None]
    fold: Fold | None = None
    prepare: Callable[[Any], None] = _unchanged


class MemoryOps:
    """What algorithms may do with memory of one type (the interface)."""

    mem_type: MemoryType = HOST

    def ref(self, arr: Any) -> MemRef:
        """The transport's view of ``arr`` (no copy)."""
        raise NotImplementedError

    def scratch(self, count: int, dtype: Any, slot: int = 0) -> Any:
        """``count`` elements of ``dtype`` of reusable scratch space in ``slot``."""
        raise NotImplementedError

    def copy(self, dst: Any, src: Any) -> None:
        """``dst[...] = src`` (same length and dtype)."""
        raise NotImplementedError

    def reduce_spec(self, op: ReduceOp, dtype: str, world_size: int,
                    wide: bool = False) -> ReduceSpec:
        """The reduction (and its finishing step) of ``op`` on ``dtype``; ``wide``: its
        rank-order fold accumulates in float32 (float16/bfloat16 sums)."""
        raise NotImplementedError


class HostOps(MemoryOps):
    """Host memory: numpy arrays; scratch reused across calls (memory does not grow)."""

    mem_type = HOST

    def __init__(self) -> None:
        self._buffers: dict[int, np.ndarray] = {}
        self._views: dict[tuple[int, np.dtype, int], np.ndarray] = {}
        self._specs: dict[tuple[Any, str, int, bool], ReduceSpec] = {}

    def ref(self, arr: np.ndarray) -> MemRef:
        return MemRef(arr.data.cast("B"))  # the view keeps ``arr`` alive

    def _raw(self, nbytes: int, slot: int) -> np.ndarray:
        buf = self._buffers.get(slot)
        if buf is None or buf.nbytes < nbytes:
            buf = np.empty(max(nbytes, 64), dtype=np.uint8)
            self._buffers[slot] = buf
            self._views.clear()
        return buf[:nbytes]

    def scratch(self, count: int, dtype: np.dtype, slot: int = 0) -> np.ndarray:
        key = (count, dtype, slot)
        view = self._views.get(key)
        if view is None:
            view = self._raw(count * dtype.itemsize, slot).view(dtype)[:count]
            if count <= 4096 and len(self._views) < 256:   # small views cached: hot path
                self._views[key] = view
        return view

    def copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        dst[...] = src

    def reduce_spec(self, op: ReduceOp, dtype: str, world_size: int,
                    wide: bool = False) -> ReduceSpec:
        key = (op, dtype, world_size, wide)
        spec = self._specs.get(key)
        if spec is None:
            spec = ReduceSpec(reducer(op, dtype),
                              (lambda a: finish(op, dtype, a, world_size))
                              if needs_finish(op, world_size) else _unchanged,
                              Fold(op, dtype, world_size, wide),
                              (lambda a: prepare(op, dtype, a))
                              if op.name == "premul_sum" else _unchanged)
            self._specs[key] = spec
        return spec


_OPS_FACTORIES: dict[MemoryType, Callable[[], MemoryOps]] = {HOST: HostOps}


def register_ops(mem_type: MemoryType, factory: Callable[[], MemoryOps]) -> None:
    """Install the ops of a memory type (the CUDA support calls this)."""
    _OPS_FACTORIES[mem_type] = factory


def ops_for(mem_type: MemoryType, device: int | None = None) -> MemoryOps:
    """A fresh ops object for ``mem_type`` (each communicator keeps its own scratch)."""
    factory = _OPS_FACTORIES.get(mem_type)
    if factory is None:
        raise InvalidArgument(
            f"{mem_type.label(device)} memory cannot be reduced or copied by this pycoll build: "
            "device-memory kernels come with pycoll's CUDA support; move the tensor to the host "
            "(.cpu()) or use the torch backend, which stages CUDA tensors explicitly")
    return factory()
