"""The uneven ("v") variants of the rooted and reduce-scatter collectives: MPI's
``MPI_Reduce_scatter``, ``MPI_Gatherv`` and ``MPI_Scatterv``, torch's uneven split lists.

``counts`` follows alltoall's ``in_splits``: one row count per rank along the first
dimension of the buffer that holds every rank's block (a 1-D buffer's rows are its
elements), zeros allowed. Unlike MPI, where the counts matter at the root only, every rank
passes the same ``counts``: they are part of the call's signature (``CallInfo.count``), so
ranks that disagree about them raise ``CollectiveMismatch`` instead of moving blocks of the
wrong sizes, and each rank checks its own block against them before anything moves.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..algorithms import ALGORITHMS
from ..algorithms.primitives import Peers
from ..buffers.memops import HostOps
from ..buffers.reduction import OpLike, check_op_dtype, parse_op
from ..buffers.tensors import Buffer
from ..errors import InvalidArgument
from ..runtime.calls import CallInfo
from ..runtime.execution import Body
from ..runtime.work import Work
from .integrity import Check, MoveCheck, SumCheck
from .planning import Planner


def _rows(obj: Any, buf: Buffer) -> int:
    """The length of the first dimension of a per-rank buffer (its elements if it has no
    shape)."""
    shape = getattr(obj, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) else buf.count


class VariantCollectives:
    """reduce_scatter_v, gatherv and scatterv (see the module docstring): like
    ``Collectives``, a stateless part of ``Communicator``, written against the parts listed
    here."""

    rank: int
    size: int
    _plan: Planner
    _ops: HostOps
    #: ``Collectives._submit``: run a planned call (and raise its integrity verdict)
    _submit: Callable[[CallInfo, Body, float | None, bool, Any, Check | None], Work | None]
    #: ``Collectives._reduce_scatter``: the body of reduce_scatter and reduce_scatter_v
    _reduce_scatter: Callable[..., Work | None]
    #: ``Collectives._move_check`` / ``_sum_check``: the integrity check of a call, if any
    _move_check: Callable[..., MoveCheck | None]
    _sum_check: Callable[..., SumCheck | None]

    def _counts(self, collective: str, counts: Any) -> tuple[int, ...]:
        """``counts`` as plain ints (what the signature compares), checked: one
        non-negative row count per rank."""
        try:
            values = list(counts)
            valid = len(values) == self.size and all(
                not isinstance(c, bool) and isinstance(c, (int, np.integer)) and c >= 0
                for c in values)
        except TypeError:
            valid = False
        if not valid:
            raise InvalidArgument(f"rank {self.rank}: {collective}: counts must be a sequence "
                                  f"of {self.size} non-negative row counts (one per rank), "
                                  f"not {counts!r}; nothing was sent")
        return tuple(int(c) for c in values)

    def _own_block(self, collective: str, name: str, obj: Any, buf: Buffer,
                   counts: tuple[int, ...]) -> None:
        """This rank's own buffer holds the block ``counts`` gives it."""
        rows = _rows(obj, buf)
        if rows != counts[self.rank]:
            raise InvalidArgument(
                f"rank {self.rank}: {collective}: {name} has {rows} rows but "
                f"counts[{self.rank}] = {counts[self.rank]}; every rank passes the same counts "
                f"and a {name} of its own count (nothing was sent)")

    def reduce_scatter_v(self, output: Any, input: Any, counts: Sequence[int],
                         op: OpLike = "sum", *, algo: str | None = None,
                         timeout: float | None = None, async_op: bool = False,
                         deterministic: bool | None = None, accumulate: str | None = None,
                         integrity: bool | None = None, compress: str | None = None
                         ) -> Work | None:
        """Reduce ``input`` across ranks and leave rank r's block of the result, ``counts[r]``
        rows of it (zeros allowed), in rank r's ``output`` (MPI_Reduce_scatter).

        ``input`` holds ``sum(counts)`` rows on every rank and is left unchanged. Each block
        is padded to the largest one and reduced by the reduce_scatter algorithms (one
        implementation: ``Collectives._reduce_scatter``), so every option of
        ``reduce_scatter`` (``algo``, ``deterministic``, ``accumulate``, ``integrity``,
        ``compress``) holds; the padding costs ``size * max(counts)`` rows on the wire
        instead of ``sum(counts)``.
        """
        plan = self._plan
        plan.begin()
        what = "reduce_scatter_v"
        inp = plan.buffer(input, what, name="input", writable=False)
        out = plan.buffer(output, what, name="output", reads=False)
        plan.same_dtype(out, inp, what)
        rop = parse_op(op)
        check_op_dtype(rop, out.dtype)
        counts = self._counts(what, counts)
        bounds = plan.split_bounds(input, inp, counts, "counts", what)
        mine = bounds[self.rank][1] - bounds[self.rank][0]
        if out.count != mine:
            raise InvalidArgument(
                f"rank {self.rank}: {what}: output has {out.count} elements but counts"
                f"[{self.rank}] gives this rank {mine} (nothing was sent)")
        return self._reduce_scatter(what, output, out, [(inp, a, b) for a, b in bounds],
                                    inp.count, counts, rop, algo, timeout, async_op,
                                    deterministic, accumulate, integrity, compress)

    def gatherv(self, output: Any, input: Any, counts: Sequence[int], root: int = 0, *,
                timeout: float | None = None, async_op: bool = False,
                integrity: bool | None = None) -> Work | None:
        """Collect rank r's ``input`` (``counts[r]`` rows, zeros allowed) into rows
        ``sum(counts[:r])`` onwards of ``output`` on ``root`` (MPI_Gatherv, displacements
        packed). ``output`` is not used elsewhere (may be None)."""
        plan = self._plan
        plan.begin()
        what = "gatherv"
        inp = plan.buffer(input, what, name="input", writable=False)
        root = plan.check_rank(root, "root", what)
        counts = self._counts(what, counts)
        self._own_block(what, "input", input, inp, counts)
        out = bounds = None
        if self.rank == root:
            out, bounds = self._root_rows(what, output, "output", inp, "input", counts, root)
        fn = ALGORITHMS["gather"]["linear"].run
        check = self._move_check(what, integrity, inp.mem_type,
                                 *((out.mem_type,) if out is not None else ()))
        size = self.size

        def body(peers: Peers) -> None:
            if check is not None:
                check.sent(root, inp.array)
            if size == 1:
                out.array[...] = inp.array  # type: ignore[union-attr]
            else:
                fn(peers, inp.array, None if out is None else out.array, root, bounds)
            if check is not None:
                if out is not None and bounds is not None:
                    for r, (a, b) in enumerate(bounds):
                        check.got(r, out.array[a:b])
                check.finish(peers)

        return self._submit(CallInfo(what, inp.nbytes, inp.dtype, counts, root=root,
                                     algorithm="linear"),
                            body, timeout, async_op, output if self.rank == root else None,
                            check)

    def _root_rows(self, what: str, whole: Any, whole_name: str, own: Any, own_name: str,
                   counts: Sequence[int], root: int) -> tuple[Any, Any]:
        """The root's buffer of every rank's rows (gatherv's output, scatterv's input), checked
        against ``own`` (the root's own block): same dtype, rows split by ``counts``, the
        root's rows the size of its block. Returns the buffer and each rank's bounds."""
        plan = self._plan
        buf = (plan.buffer(whole, what, name=whole_name, reads=False) if whole_name == "output"
               else plan.buffer(whole, what, name=whole_name, writable=False))
        plan.same_dtype(buf if whole_name == "output" else own,
                        own if whole_name == "output" else buf, what)
        bounds = plan.split_bounds(whole, buf, counts, "counts", what)
        a, b = bounds[root]
        if b - a != own.count:
            raise InvalidArgument(
                f"rank {self.rank}: {what}: {whole_name} rows hold {b - a} elements for "
                f"counts[{root}] but {own_name} has {own.count}: {whole_name} and {own_name} "
                "rows differ in size (nothing was sent)")
        return buf, bounds

    def scatterv(self, output: Any, input: Any, counts: Sequence[int], root: int = 0, *,
                 timeout: float | None = None, async_op: bool = False,
                 integrity: bool | None = None) -> Work | None:
        """Send rows ``sum(counts[:r])`` onwards of ``input`` on ``root`` (``counts[r]`` of
        them, zeros allowed) to rank r's ``output`` (MPI_Scatterv, displacements packed).
        ``input`` is not used elsewhere (may be None)."""
        plan = self._plan
        plan.begin()
        what = "scatterv"
        out = plan.buffer(output, what, name="output", reads=False)
        root = plan.check_rank(root, "root", what)
        counts = self._counts(what, counts)
        self._own_block(what, "output", output, out, counts)
        inp = bounds = None
        if self.rank == root:
            inp, bounds = self._root_rows(what, input, "input", out, "output", counts, root)
        fn = ALGORITHMS["scatter"]["linear"].run
        check = self._move_check(what, integrity, out.mem_type,
                                 *((inp.mem_type,) if inp is not None else ()))
        size = self.size

        def body(peers: Peers) -> None:
            if check is not None and inp is not None and bounds is not None:
                check.sent_blocks(inp.array, bounds)
            if size == 1:
                out.array[...] = inp.array  # type: ignore[union-attr]
            else:
                fn(peers, None if inp is None else inp.array, out.array, root, bounds)
            if check is not None:
                check.got(root, out.array)
                check.finish(peers)

        return self._submit(CallInfo(what, out.nbytes, out.dtype, counts, root=root,
                                     algorithm="linear"),
                            body, timeout, async_op, output, check)
