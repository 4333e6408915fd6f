"""Persistent collectives: validate and choose once, run many times (MPI-4's
``MPI_Allreduce_init``, mpi4py's ``Allreduce_init``).

A training loop or a benchmark calls the same collective on the same buffer again and again;
a plan does the argument checks, the classification of the buffer and the choice of the
path once, at ``comm.allreduce_init(tensor, op)``, so that each run costs only the
communication: on the fast path, one compiled call. The plan is bound to the tensor's
memory: write new values into it between runs, but do not reallocate it (``resize_``,
``set_``), as with MPI's persistent requests.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .memory import HOST
from .reduction import OpLike, check_op_dtype, parse_op
from .work import Work

if TYPE_CHECKING:
    from .communicator import Communicator


class AllreducePlan:
    """``comm.allreduce(tensor, op)`` prepared once; ``run()`` (or calling the plan) runs it,
    ``start()`` runs it asynchronously and returns a ``Work``. Every rank must run its plan
    where it would call ``allreduce``: a run is an ordinary collective call."""

    def __init__(self, comm: "Communicator", tensor: Any, op: OpLike = "sum", *,
                 algo: str | None = None, timeout: float | None = None) -> None:
        buf = comm._plan.buffer(tensor, "allreduce", stage=False)
        rop = parse_op(op)
        check_op_dtype(rop, buf.dtype)
        if algo is not None:
            comm._plan.select("allreduce", buf.nbytes, algo)     # an unknown name fails here
        self.comm = comm
        self.tensor = tensor
        self.op = rop
        self.algo = algo
        self.timeout = timeout
        self.nbytes = buf.nbytes
        fast = comm._fast
        self._array = buf.array
        self._fast_call = (fast.call("allreduce", buf.dtype, buf.count, buf.itemsize, rop)
                           if fast is not None and algo is None and buf.mem_type == HOST
                           and fast.takes(buf.nbytes, buf.dtype, rop)
                           else None)

    @property
    def path(self) -> str:
        """"fastpath" (one slot), "fastpath-chunked", "fastpath-cma" (reading the peers'
        buffers), or the generic path's algorithm."""
        if self._fast_call is not None:
            return self._fast_call.kind
        return self.comm._plan.select("allreduce", self.nbytes, self.algo)

    def run(self) -> None:
        """Run the allreduce once, synchronously (the result is in the tensor)."""
        call = self._fast_call
        if call is not None:
            self.comm._fast.run(call, self._array, self.timeout, False,  # type: ignore[union-attr]
                                self.tensor)
        else:
            self.comm.allreduce(self.tensor, self.op, algo=self.algo, timeout=self.timeout)

    __call__ = run

    def start(self) -> Work:
        """Run it asynchronously; ``wait()`` on the returned work."""
        call = self._fast_call
        if call is not None:
            work = self.comm._fast.run(call, self._array, self.timeout, True,  # type: ignore[union-attr]
                                       self.tensor)
        else:
            work = self.comm.allreduce(self.tensor, self.op, algo=self.algo,
                                       timeout=self.timeout, async_op=True)
        assert work is not None
        return work

    def __repr__(self) -> str:
        return (f"<pycoll.AllreducePlan {self.nbytes} bytes op={self.op} path={self.path} "
                f"on {self.comm.name}>")
