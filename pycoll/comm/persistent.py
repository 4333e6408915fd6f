"""Persistent collectives: validate and choose once, run many times (MPI-4's
``MPI_Allreduce_init``, mpi4py's ``Allreduce_init``).

A training loop or a benchmark calls the same collective on the same buffer again and again;
a plan does the argument checks, the classification of the buffer and the choice of the
path once, at ``comm.allreduce_init(tensor, op)``, so that each run costs only the
communication: on the fast path, one compiled call. The plan is bound to the tensor's
memory: write new values into it between runs, but do not reallocate it (``resize_``,
``set_``), as with MPI's persistent requests. Each run checks that the tensor still holds that
memory (``_binding``) and raises before any byte moves if not: the plan would otherwise
reduce into memory the tensor no longer shows (a silently stale result) or that was freed.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..buffers.memory import HOST
from ..buffers.reduction import OpLike, check_op_dtype, parse_op
from ..buffers.tensors import is_torch_tensor
from ..errors import InvalidArgument
from ..fastpath.runner import FastPath
from ..runtime.work import Work
from .planning import Planner


def _binding(tensor: Any) -> tuple[int, ...] | None:
    """What changes when ``tensor``'s memory is replaced: a torch tensor's data pointer and
    size (``set_``, ``resize_``), a numpy array's element count (``ndarray.resize`` is the only
    way to reallocate one, and it reallocates only when the count changes). None for other
    objects, whose memory cannot be swapped under the same object."""
    if type(tensor) is np.ndarray:
        return (tensor.size,)
    if is_torch_tensor(tensor):
        return (tensor.data_ptr(), tensor.numel(), tensor.element_size())
    return None


class AllreducePlan:
    """``comm.allreduce(tensor, op)`` prepared once; ``run()`` (or calling the plan) runs it,
    ``start()`` runs it asynchronously and returns a ``Work``. Every rank must run its plan
    where it would call ``allreduce``: a run is an ordinary collective call.

    Made by ``Communicator.allreduce_init`` from the communicator's planner, its fast path
    (None where it has none) and its ``allreduce`` (what a run that is not a fast call calls).
    """

    def __init__(self, planner: Planner, fast: FastPath | None,
                 allreduce: Callable[..., Work | None], name: str, tensor: Any,
                 op: OpLike = "sum", *, algo: str | None = None,
                 timeout: float | None = None, deterministic: bool | None = None,
                 accumulate: str | None = None) -> None:
        buf = planner.buffer(tensor, "allreduce", stage=False)
        rop = parse_op(op)
        check_op_dtype(rop, buf.dtype)
        fold = planner.fold_mode("allreduce", rop, buf, deterministic, accumulate, algo)
        if algo is not None:            # an unknown name (or one that cannot fold) fails here
            planner.select("allreduce", buf.nbytes, algo, ordered=fold is not None)
        self._planner = planner
        self._fast = fast
        self._allreduce = allreduce
        self._name = name
        self.tensor = tensor
        self.op = rop
        self.algo = algo
        self.timeout = timeout
        self.deterministic = deterministic
        self.accumulate = accumulate
        self.fold = fold
        self.nbytes = buf.nbytes
        self._array = buf.array
        self._binding = _binding(tensor)
        # the communicator's compress= default applies to each run (the generic path)
        self._compressed = planner.compression("allreduce", None, buf.dtype, rop,
                                               accumulate=accumulate) is not None
        self._fast_call = (fast.call("allreduce", buf.dtype, buf.count, buf.itemsize, rop,
                                     fold=fold)
                           if fast is not None and algo is None and buf.mem_type == HOST
                           and not self._compressed
                           and fast.takes(buf.nbytes, buf.dtype, rop, fold)
                           else None)

    @property
    def path(self) -> str:
        """"fastpath" (one slot), "fastpath-chunked", "fastpath-cma" (reading the peers'
        buffers), or the generic path's algorithm."""
        if self._fast_call is not None:
            return self._fast_call.kind
        if self._compressed:
            return "compressed"
        return self._planner.select("allreduce", self.nbytes, self.algo,
                                    ordered=self.fold is not None)

    def _check_binding(self) -> None:
        if self._binding is not None and _binding(self.tensor) != self._binding:
            raise InvalidArgument(
                f"rank {self._planner.rank}: allreduce plan on {self._name}: the tensor no "
                "longer holds the memory the plan was made for (its storage was replaced or "
                "reallocated: resize_, set_, ndarray.resize); nothing was sent. A plan is "
                "bound to its buffer: make a new one with allreduce_init(tensor) on every rank")

    def run(self) -> None:
        """Run the allreduce once, synchronously (the result is in the tensor)."""
        self._check_binding()
        call, fast = self._fast_call, self._fast
        if call is not None and fast is not None:
            fast.run(call, self._array, self.timeout, False, self.tensor)
        else:
            self._allreduce(self.tensor, self.op, algo=self.algo, timeout=self.timeout,
                            deterministic=self.deterministic, accumulate=self.accumulate)

    __call__ = run

    def start(self) -> Work:
        """Run it asynchronously; ``wait()`` on the returned work."""
        self._check_binding()
        call, fast = self._fast_call, self._fast
        if call is not None and fast is not None:
            work = fast.run(call, self._array, self.timeout, True, self.tensor)
        else:
            work = self._allreduce(self.tensor, self.op, algo=self.algo, timeout=self.timeout,
                                   async_op=True, deterministic=self.deterministic,
                                   accumulate=self.accumulate)
        assert work is not None
        return work

    def __repr__(self) -> str:
        return (f"<pycoll.AllreducePlan {self.nbytes} bytes op={self.op} path={self.path} "
                f"on {self._name}>")
