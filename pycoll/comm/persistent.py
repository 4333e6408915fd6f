"""Persistent collectives: validate and choose once, run many times (MPI-4's ``*_init``:
``MPI_Allreduce_init``, ``MPI_Bcast_init``...; mpi4py's ``Allreduce_init``).

A training loop or a benchmark calls the same collective on the same buffers again and
again. ``comm.allreduce_init(tensor, op)``, ``comm.broadcast_init(tensor, root)`` and the
other ``*_init`` make a ``Plan``: the call is planned once, at the ``*_init``, as a real call
would be (every argument checked, the algorithm chosen: ``PersistentCollectives._planned``
runs the collective's own planning and stops where the call would be numbered), so a plan
that would be refused is refused there, on every rank, with nothing sent. Each run is then an
ordinary collective call, with the same arguments. For allreduce the plan binds the fast
path's compiled call once, so that a run costs only the communication; the others go through
their method, whose checks run again (a share of a small call's cost only).

A plan is bound to its buffers' memory: write new values into them between runs, but do not
reallocate them (``resize_``, ``set_``), as with MPI's persistent requests. Each run checks
that every buffer still holds that memory (``_binding``) and raises before any byte moves if
not: the plan would otherwise move data into memory the tensor no longer shows (a silently
stale result) or that was freed.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ..buffers.reduction import OpLike
from ..buffers.tensors import is_torch_tensor
from ..errors import InvalidArgument, InvalidDtype
from ..fastpath.runner import FastPath
from ..runtime.calls import CallInfo
from ..runtime.execution import Execution
from ..runtime.work import Work
from .planning import Planner


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

    Made by ``PersistentCollectives._persistent``: ``call`` is the communicator's method,
    ``info`` the description its planning made, ``path`` what runs; ``fast_run(async_op)``,
    where given, runs the fast path's call bound once (allreduce).
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

    def generic_run(self, async_op: bool) -> Work | None:
        """The call made through the communicator's method (as the user would make it)."""
        return self._call(*self.args, async_op=async_op, **self.options)

    def run(self) -> None:
        """Run the call once, synchronously."""
        self._check_binding()
        if self.fast_run is not None:
            self.fast_run(False)
        else:
            self.generic_run(False)

    __call__ = run

    def start(self) -> Work:
        """Run it asynchronously; ``wait()`` on the returned work."""
        self._check_binding()
        if self.fast_run is not None:
            work = self.fast_run(True)
        else:
            work = self.generic_run(True)
        assert work is not None
        return work

    def __repr__(self) -> str:
        op = f" op={self.info.op}" if self.info.op is not None else ""
        return (f"<pycoll.Plan {self.collective} {self.nbytes} bytes{op} path={self.path} "
                f"on {self._name}>")


#: the name persistent allreduces had before every collective got a plan
AllreducePlan = Plan


class PersistentCollectives:
    """The ``*_init`` of every collective: like ``Collectives``, a stateless part of
    ``Communicator``, written against the parts listed here."""

    rank: int
    name: str
    _plan: Planner
    _fast: FastPath | None
    #: ``Collectives._planning``: while set, ``_submit`` raises ``Planned``
    _planning: bool
    _exec: Execution
    #: ``PYCOLL_INTEGRITY``'s sampling (``Collectives._checked``)
    _integrity_every: int

    def allreduce_init(self, tensor: Any, op: OpLike = "sum", *, algo: str | None = None,
                       timeout: float | None = None, deterministic: bool | None = None,
                       accumulate: str | None = None, **options: Any) -> Plan:
        """A persistent allreduce of ``tensor`` (see the module docstring): checked and planned
        once, then ``plan.run()`` / ``plan.start()`` as often as needed. Not a collective
        itself (no communication until a run). Where the fast path takes the call, its
        compiled call is bound once and each run is that call alone."""
        options.update(algo=algo, timeout=timeout, deterministic=deterministic,
                       accumulate=accumulate)
        plan = self._persistent("allreduce", tensor, op, **options)
        fast, info = self._fast, plan.info
        if (fast is not None and algo is None and plan.path.startswith("fastpath")
                and options.get("out") is None and not options.get("integrity")):
            buf = self._plan.buffer(tensor, "allreduce", stage=False)
            call = fast.call("allreduce", buf.dtype, buf.count, buf.itemsize, info.op,
                             fold=info.fold)
            arr = buf.array
            # ``PYCOLL_INTEGRITY=sample:N`` checks every N-th call by sequence number on every
            # rank: a run numbered so goes through the method (which checks it), as a direct
            # call would on a rank that makes it without the plan (``fastpath.callpath``)
            every = self._integrity_every if options.get("integrity") is None else 0
            execution = self._exec
            generic = plan.generic_run

            def fast_run(async_op: bool) -> Work | None:
                if every and (execution.seq + 1) % every == 0:
                    return generic(async_op)
                return fast.run(call, arr, timeout, async_op, tensor)

            plan.fast_run = fast_run
        return plan

    def _persistent(self, collective: str, *args: Any, **options: Any) -> Plan:
        """The ``Plan`` of ``comm.<collective>(*args, **options)``."""
        if "async_op" in options:
            raise InvalidArgument(f"rank {self.rank}: {collective}_init: async_op is not an "
                                  "option of a plan: plan.start() runs it asynchronously")
        call = getattr(self, collective)
        try:
            info, device = self._planned(collective, args, options)
        except (InvalidArgument, InvalidDtype) as e:
            if str(e).startswith(f"rank {self.rank}"):
                raise
            raise type(e)(f"rank {self.rank}: {collective}_init: {e}") from None
        path = info.algorithm or ""
        fast = self._fast
        if (fast is not None and not device and options.get("algo") is None
                and not options.get("integrity") and options.get("out") is None
                and info.compress is None):     # (compressed: the generic path only)
            if collective == "allreduce":
                fold = info.fold
                if info.dtype is not None and fast.takes(info.nbytes, info.dtype, info.op,
                                                         fold):
                    path = fast.kind_of(collective, info.nbytes) or path
            elif collective in ("broadcast", "barrier"):
                path = fast.kind_of(collective, info.nbytes) or path
        return Plan(collective, call, args, options, info, path, self.rank, self.name)

    def _planned(self, collective: str, args: tuple, options: dict[str, Any]
                 ) -> tuple[CallInfo, bool]:
        """Plan ``comm.<collective>(*args, **options)`` as a call would be (every check, the
        choice of algorithm) and stop where it would be numbered: its ``CallInfo``, and
        whether it passed device buffers. The method runs on a planning copy of this
        communicator (``_planning_copy``), never on the communicator itself, so that a call
        another thread makes on it meanwhile runs as usual."""
        planning = self._planning_copy()
        planner = planning._plan
        try:
            getattr(planning, collective)(*args, **options)
        except Planned as planned:
            return planned.info, bool(planner.device_buffers)
        finally:
            planner.begin()             # what was staged for the planned call, given back
        raise AssertionError(f"{collective} returned without reaching _submit")

    def _planning_copy(self) -> Any:
        """A shallow copy of this communicator that plans one call: the same parts (execution,
        transports), a twin of the planner with its own staging (``Planner.twin``: what the
        planned call stages, and gives back, is never another thread's call's), and its own
        two flags: ``_fast`` None, so that the call is
        planned by the method's generic half, which checks everything (the fast lanes run
        calls of kinds they already know), and ``_planning`` set, so that ``_submit`` raises
        ``Planned`` instead of running it. The flags travel with the copy the method runs
        on: nothing on the shared communicator changes."""
        copy = object.__new__(type(self))
        copy.__dict__.update(self.__dict__)
        copy._fast = None
        copy._planning = True
        copy._plan = self._plan.twin()
        return copy

    def broadcast_init(self, tensor: Any, root: int = 0, **options: Any) -> Plan:
        """A persistent ``broadcast`` (``allreduce_init``'s plans, for every collective)."""
        return self._persistent("broadcast", tensor, root, **options)

    def reduce_init(self, tensor: Any, root: int = 0, op: OpLike = "sum", **options: Any
                    ) -> Plan:
        """A persistent ``reduce``."""
        return self._persistent("reduce", tensor, root, op, **options)

    def allgather_init(self, output: Any, input: Any, **options: Any) -> Plan:
        """A persistent ``allgather``."""
        return self._persistent("allgather", output, input, **options)

    def reduce_scatter_init(self, output: Any, input: Any, op: OpLike = "sum",
                            **options: Any) -> Plan:
        """A persistent ``reduce_scatter``."""
        return self._persistent("reduce_scatter", output, input, op, **options)

    def alltoall_init(self, output: Any, input: Any, out_splits: Sequence[int] | None = None,
                      in_splits: Sequence[int] | None = None, **options: Any) -> Plan:
        """A persistent ``alltoall``."""
        return self._persistent("alltoall", output, input, out_splits, in_splits, **options)

    def gather_init(self, output: Any, input: Any, root: int = 0, **options: Any) -> Plan:
        """A persistent ``gather``."""
        return self._persistent("gather", output, input, root, **options)

    def scatter_init(self, output: Any, input: Any, root: int = 0, **options: Any) -> Plan:
        """A persistent ``scatter``."""
        return self._persistent("scatter", output, input, root, **options)

    def barrier_init(self, **options: Any) -> Plan:
        """A persistent ``barrier``."""
        return self._persistent("barrier", **options)

    def reduce_scatter_v_init(self, output: Any, input: Any, counts: Sequence[int],
                              op: OpLike = "sum", **options: Any) -> Plan:
        """A persistent ``reduce_scatter_v``."""
        return self._persistent("reduce_scatter_v", output, input, counts, op, **options)

    def gatherv_init(self, output: Any, input: Any, counts: Sequence[int], root: int = 0,
                     **options: Any) -> Plan:
        """A persistent ``gatherv``."""
        return self._persistent("gatherv", output, input, counts, root, **options)

    def scatterv_init(self, output: Any, input: Any, counts: Sequence[int], root: int = 0,
                      **options: Any) -> Plan:
        """A persistent ``scatterv``."""
        return self._persistent("scatterv", output, input, counts, root, **options)
