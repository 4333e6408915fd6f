"""Persistent collectives: validate and choose once, run many times (MPI-4's ``*_init``:
``MPI_Allreduce_init``, ``MPI_Bcast_init``...; mpi4py's ``Allreduce_init``).

A training loop or a benchmark calls the same collective on the same buffers again and
again. ``comm.allreduce_init(tensor, op)``, ``comm.broadcast_init(tensor, root)`` and the
other ``*_init`` make a ``Plan``: the call is planned once, at the ``*_init``, as a real call
would be (every argument checked, the algorithm chosen: ``Collectives._planned`` runs the
collective's own planning and stops where the call would be numbered), so a plan that would
be refused is refused there, on every rank, with nothing sent. Each run is then an ordinary
collective call, with the same arguments. For allreduce the plan binds the fast path's
compiled call once, so that a run costs only the communication; the others go through their
method (its checks cost microseconds, a share of a small call only).

A plan is bound to its buffers' memory: write new values into them between runs, but do not
reallocate them (``resize_``, ``set_``), as with MPI's persistent requests. Each run checks
that every buffer still holds that memory (``_binding``) and raises before any byte moves if
not: the plan would otherwise move data into memory the tensor no longer shows (a silently
stale result) or that was freed.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..buffers.tensors import is_torch_tensor
from ..errors import InvalidArgument
from ..runtime.calls import CallInfo
from ..runtime.work import Work


class Planned(Exception):  # noqa: N818 - not an error: how a planning-only call ends
    """Raised by ``Collectives._submit`` in place of running a call that was only being
    planned (``Collectives._planned``); carries its description."""

    def __init__(self, info: CallInfo) -> None:
        super().__init__(info.collective)
        self.info = info


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


def _buffers(args: tuple, kwargs: dict[str, Any]) -> Iterator[Any]:
    """The buffers among a call's arguments (lists of them too: allgather's output list)."""
    for value in (*args, kwargs.get("out")):
        if isinstance(value, (list, tuple)):
            yield from value
        elif value is not None:
            yield value


class Plan:
    """``comm.<collective>(*args, **options)`` prepared once; ``run()`` (or calling the plan)
    runs it, ``start()`` runs it asynchronously and returns a ``Work``. Every rank must run
    its plan where it would make that call: a run is an ordinary collective call.

    Made by ``Collectives._persistent``: ``call`` is the communicator's method, ``info`` the
    description its planning made, ``path`` what runs; ``fast_run(async_op)``, where given,
    runs the fast path's call bound once (allreduce).
    """

    def __init__(self, collective: str, call: Callable[..., Work | None], args: tuple,
                 options: dict[str, Any], info: CallInfo, path: str, rank: int, name: str,
                 fast_run: Callable[[bool], Work | None] | None = None) -> None:
        self.collective = collective
        self.args = args
        self.options = options
        self.info = info
        #: "fastpath", "fastpath-chunked", "fastpath-cma" (reading the peers' buffers), or
        #: the generic path's algorithm
        self.path = path
        self.nbytes = info.nbytes
        self._call = call
        #: the fast path's call bound once (allreduce), that a run makes instead of the
        #: method's; None where none was bound
        self.fast_run = fast_run
        self._rank = rank
        self._name = name
        self._bound = [(t, _binding(t)) for t in _buffers(args, options)]

    @property
    def tensor(self) -> Any:
        """The first buffer argument (allreduce's, broadcast's tensor)."""
        return self.args[0] if self.args else None

    @property
    def op(self) -> Any:
        return self.info.op

    def _check_binding(self) -> None:
        for t, bound in self._bound:
            if bound is not None and _binding(t) != bound:
                raise InvalidArgument(
                    f"rank {self._rank}: {self.collective} plan on {self._name}: a buffer "
                    "no longer holds the memory the plan was made for (its storage was "
                    "replaced or reallocated: resize_, set_, ndarray.resize); nothing was "
                    f"sent. A plan is bound to its buffers: make a new one with "
                    f"{self.collective}_init on every rank")

    def run(self) -> None:
        """Run the call once, synchronously."""
        self._check_binding()
        if self.fast_run is not None:
            self.fast_run(False)
        else:
            self._call(*self.args, **self.options)

    __call__ = run

    def start(self) -> Work:
        """Run it asynchronously; ``wait()`` on the returned work."""
        self._check_binding()
        if self.fast_run is not None:
            work = self.fast_run(True)
        else:
            work = self._call(*self.args, async_op=True, **self.options)
        assert work is not None
        return work

    def __repr__(self) -> str:
        op = f" op={self.info.op}" if self.info.op is not None else ""
        return (f"<pycoll.Plan {self.collective} {self.nbytes} bytes{op} path={self.path} "
                f"on {self._name}>")


#: the name persistent allreduces had before every collective got a plan
AllreducePlan = Plan
