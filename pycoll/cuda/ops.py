"""Device memory for the algorithms: the ``MemoryOps`` of CUDA buffers (``pycoll.buffers.memops``).

Used when every transport of a communicator moves device memory (cuda_ipc): the algorithms
then run unchanged on CuPy arrays, their sends and receives are device-to-device copies, and
their reductions are the kernels of ``pycoll.cuda.kernels``, all queued on pycoll's stream
(the call runs inside ``with stream``). Scratch space is kept per device and slot and reused,
as on the host, so memory does not grow with the number of calls.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..buffers.memops import MemoryOps, ReduceSpec, register_ops
from ..buffers.memory import CUDA, DeviceMemRef, MemRef
from ..buffers.reduction import ReduceOp, needs_finish
from . import kernels
from .runtime import cupy


def _unchanged(_: Any) -> None:
    """The finishing step of every op but avg: nothing to do."""


class CudaOps(MemoryOps):
    """CuPy arrays on one device; scratch reused across calls."""

    mem_type = CUDA

    def __init__(self) -> None:
        self._buffers: dict[tuple[int, int], Any] = {}
        self._specs: dict[tuple[Any, str, int], ReduceSpec] = {}

    def ref(self, arr: Any) -> MemRef:
        return DeviceMemRef(int(arr.data.ptr), int(arr.nbytes), CUDA, int(arr.device.id), arr)

    def scratch(self, count: int, dtype: np.dtype, slot: int = 0) -> Any:
        cp = cupy()
        device = cp.cuda.Device().id
        nbytes = count * np.dtype(dtype).itemsize
        buf = self._buffers.get((device, slot))
        if buf is None or buf.nbytes < nbytes:
            buf = self._buffers[(device, slot)] = cp.empty(max(nbytes, 256), dtype=cp.uint8)
        return buf[:nbytes].view(dtype)

    def copy(self, dst: Any, src: Any) -> None:
        dst[...] = src

    def reduce_spec(self, op: ReduceOp, dtype: str, world_size: int,
                    wide: bool = False) -> ReduceSpec:
        # no rank-order fold on the device (``fold`` None): ordered calls stage device
        # buffers through host memory (``comm.planning``)
        key = (op, dtype, world_size)
        spec = self._specs.get(key)
        if spec is None:
            spec = ReduceSpec(kernels.reducer(op, dtype),
                              (lambda a: kernels.finish(op, dtype, a, world_size))
                              if needs_finish(op, world_size) else _unchanged,
                              prepare=(lambda a: kernels.prepare(op, dtype, a))
                              if op.name == "premul_sum" else _unchanged)
            self._specs[key] = spec
        return spec


register_ops(CUDA, CudaOps)
