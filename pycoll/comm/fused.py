"""Collectives over several tensors or sizes at once: one transfer instead of one per tensor.

* ``allreduce_coalesced``: many tensors reduced through one fused buffer per dtype (Horovod's
  tensor fusion, torch's ``all_reduce_coalesced``).
* ``allgather_coalesced``: every rank's list of tensors gathered in one transfer (torch's
  ``all_gather_coalesced``: ``outputs[r][i]`` receives rank ``r``'s ``inputs[i]``).
* ``allgatherv``: every rank contributes an array of its own length, and nobody has to know
  the lengths beforehand (what torch's sparse allreduce and object collectives need): the
  lengths travel first, then the data, inside one call, so the two steps can never be
  separated by another collective issued meanwhile.

Packing happens in the call's own body, on whichever thread runs it (the caller's, or the
worker's for ``async_op=True``), so an asynchronous call returns before any byte is copied.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..algorithms import ALGORITHMS
from ..algorithms.primitives import Peers
from ..buffers.memops import HostOps
from ..buffers.reduction import OpLike, check_op_dtype, parse_op, prepare
from ..errors import InvalidArgument
from ..runtime.calls import CallInfo
from ..runtime.execution import Body
from ..runtime.work import Outcome, Work
from .integrity import Check, CheckGroup, MoveCheck, SumCheck
from .planning import Planner


def _bytes(arr: np.ndarray) -> np.ndarray:
    """The bytes of a 1-D contiguous array, as a writable uint8 view (no copy)."""
    return arr.view(np.uint8)


class FusedCollectives:
    """The fused collectives (see the module docstring): like ``Collectives``, a stateless
    part of ``Communicator``, written against the parts listed here."""

    rank: int
    size: int
    _plan: Planner
    _ops: HostOps
    #: ``Collectives._submit``: run a planned call (and raise its integrity verdict)
    _submit: Callable[[CallInfo, Body, float | None, bool, Any, Check | None], Work | None]
    #: ``Collectives._move_check`` / ``_sum_check``: the integrity check of a call, if any
    _move_check: Callable[..., MoveCheck | None]
    _sum_check: Callable[..., SumCheck | None]

    def allreduce_coalesced(self, tensors: Sequence[Any], op: OpLike = "sum", *,
                            algo: str | None = None, timeout: float | None = None,
                            async_op: bool = False, deterministic: bool | None = None,
                            accumulate: str | None = None, integrity: bool | None = None
                            ) -> Work | None:
        """Allreduce many tensors through few transfers (Horovod's tensor fusion).

        Tensors are grouped by dtype, packed into one buffer per group, reduced together and
        unpacked: one collective's latency instead of one per tensor. ``deterministic``,
        ``accumulate``, ``integrity``: as for ``allreduce`` (each element's fold is the same
        as if its tensor were reduced alone; each dtype group is checked as one allreduce).
        """
        plan = self._plan
        plan.begin()
        bufs = [plan.buffer(t, "allreduce_coalesced", name=f"tensors[{i}]")
                for i, t in enumerate(tensors)]
        rop = parse_op(op)
        groups: dict[str, list] = {}
        for b in bufs:
            check_op_dtype(rop, b.dtype)
            groups.setdefault(b.dtype, []).append(b)
        plans = []
        names: list[str] = []
        folds: list[str | None] = []
        for dtype, members in groups.items():
            total = sum(b.nbytes for b in members)
            fold = plan.fold_mode("allreduce_coalesced", rop, members[0], deterministic,
                                  accumulate, algo)
            name = plan.select("allreduce", total, algo, ordered=fold is not None)
            check = self._sum_check("allreduce_coalesced", integrity, rop, dtype,
                                    sum(b.count for b in members),
                                    *(b.mem_type for b in members))
            plans.append((dtype, members, ALGORITHMS["allreduce"][name].run,
                          self._ops.reduce_spec(rop, dtype, self.size, wide=fold == "fp32"),
                          check))
            names.append(name)
            folds.append(fold)
        checks = [c for *_, c in plans if c is not None]
        group = (CheckGroup(self.rank, self.size, "allreduce_coalesced", checks) if checks
                 else None)

        def body(peers: Peers) -> None:
            for dtype, members, fn, spec, check in plans:
                fused = np.concatenate([b.array for b in members])
                prepare(rop, dtype, fused)
                if check is not None:
                    check.before(fused)
                if self.size == 1 or fused.size == 0:
                    spec.finish(fused)
                else:
                    fn(peers, fused, spec)
                start = 0
                for b in members:
                    b.array[...] = fused[start:start + b.count]
                    start += b.count
                if check is not None:
                    check.after(fused)
                    check.finish(peers)

        total = sum(b.nbytes for b in bufs)
        info = CallInfo("allreduce_coalesced", total, ",".join(sorted(groups)),
                        [b.count for b in bufs], rop, algorithm=",".join(names),
                        fold=",".join(f or "-" for f in folds) if any(folds) else None)
        return self._submit(info, body, timeout, async_op, tensors, group)

    def allgather_coalesced(self, outputs: Sequence[Sequence[Any]], inputs: Sequence[Any], *,
                            algo: str | None = None, timeout: float | None = None,
                            async_op: bool = False, integrity: bool | None = None
                            ) -> Work | None:
        """Gather a list of tensors from every rank in one transfer.

        ``outputs[r][i]`` receives rank ``r``'s ``inputs[i]`` (torch's
        ``all_gather_coalesced`` layout): ``outputs`` has one list per rank, each shaped like
        ``inputs`` (same element counts and dtypes; the dtypes may differ between tensors).
        ``integrity``: as for ``allgather`` (each rank's packed bytes are one block).
        """
        self._plan.begin()
        ins = [self._plan.buffer(t, "allgather_coalesced", name=f"inputs[{i}]", writable=False)
               for i, t in enumerate(inputs)]
        outputs = list(outputs)
        if len(outputs) != self.size:
            raise InvalidArgument(
                f"rank {self.rank}: allgather_coalesced: outputs has {len(outputs)} lists; it "
                f"needs one per rank ({self.size}), outputs[r][i] receiving rank r's inputs[i]")
        outs = []
        for r, row in enumerate(outputs):
            if not isinstance(row, (list, tuple)) or len(row) != len(ins):
                raise InvalidArgument(
                    f"rank {self.rank}: allgather_coalesced: outputs[{r}] must be a list of "
                    f"{len(ins)} tensors (one per input), got "
                    f"{len(row) if isinstance(row, (list, tuple)) else type(row).__name__}")
            bufs = [self._plan.buffer(t, "allgather_coalesced", name=f"outputs[{r}][{i}]",
                                      reads=False)
                    for i, t in enumerate(row)]
            for i, (o, inp) in enumerate(zip(bufs, ins)):
                self._plan.same_dtype(o, inp, "allgather_coalesced")
                if o.count != inp.count:
                    raise InvalidArgument(
                        f"rank {self.rank}: allgather_coalesced: outputs[{r}][{i}] has "
                        f"{o.count} elements but inputs[{i}] has {inp.count}")
            outs.append(bufs)
        offsets = np.cumsum([0] + [b.nbytes for b in ins]).tolist()
        total = offsets[-1]
        bounds = [(r * total, (r + 1) * total) for r in range(self.size)]
        name = self._plan.select("allgather", total * self.size, algo)
        fn = ALGORITHMS["allgather"][name].run
        rank, size = self.rank, self.size
        check = self._move_check("allgather_coalesced", integrity,
                                 *(b.mem_type for b in ins),
                                 *(b.mem_type for row in outs for b in row))

        def body(peers: Peers) -> None:
            fused = np.empty(total * size, dtype=np.uint8)
            base = rank * total
            for b, off in zip(ins, offsets):
                fused[base + off:base + off + b.nbytes] = _bytes(b.array)
            if check is not None:
                check.sent_to_all(fused[base:base + total])
            if size > 1 and total:
                fn(peers, fused, bounds)
            for r, row in enumerate(outs):
                for b, off in zip(row, offsets):
                    _bytes(b.array)[...] = fused[r * total + off:r * total + off + b.nbytes]
            if check is not None:
                for r, row in enumerate(outs):   # each rank's tensors, as unpacked here
                    check.got(r, np.concatenate([_bytes(b.array) for b in row])
                              if row else fused[:0])
                check.finish(peers)

        info = CallInfo("allgather_coalesced", total * size, ",".join(b.dtype for b in ins),
                        [b.count for b in ins], algorithm=name)
        return self._submit(info, body, timeout, async_op, outputs, check)

    def allgatherv(self, input: Any, *, timeout: float | None = None,
                   async_op: bool = False, integrity: bool | None = None
                   ) -> Work | list[np.ndarray]:
        """Gather arrays whose lengths differ between ranks and are not known in advance.

        Returns (or, with ``async_op=True``, ``Work.result()`` gives) one numpy array per rank
        with that rank's elements, in the input's element type (bfloat16 as its uint16 bits).
        Every rank must pass the same dtype. Unlike MPI_Allgatherv no counts are passed: they
        are exchanged first, in the same call. ``integrity``: as for ``allgather`` (the
        data is checked; the counts are checked by the data's checksums: a wrong count moves
        the blocks).
        """
        self._plan.begin()
        inp = self._plan.buffer(input, "allgatherv", name="input", writable=False)
        dtype = inp.array.dtype
        rank, size = self.rank, self.size
        outcome = Outcome()
        counts_fn = ALGORITHMS["allgather"][self._plan.select("allgather", 8 * size)].run
        ring = ALGORITHMS["allgather"]["ring"].run
        check = self._move_check("allgatherv", integrity, inp.mem_type)

        def body(peers: Peers) -> None:
            counts = np.zeros(size, dtype=np.int64)
            counts[rank] = inp.count
            if size > 1:
                counts_fn(peers, counts, [(r, r + 1) for r in range(size)])
            ends = np.cumsum(counts).tolist()
            bounds = [(e - int(c), e) for e, c in zip(ends, counts.tolist())]
            fused = np.empty(ends[-1], dtype=dtype)
            a, b = bounds[rank]
            fused[a:b] = inp.array
            if check is not None:
                check.sent_to_all(inp.array)
            if size > 1 and ends[-1]:
                ring(peers, fused, bounds)
            outcome.value = [fused[a:b] for a, b in bounds]
            if check is not None:
                for r, block in enumerate(outcome.value):
                    check.got(r, block)
                check.finish(peers)

        work = self._submit(CallInfo("allgatherv", inp.nbytes * size, inp.dtype,
                                     algorithm="ring"), body, timeout, async_op, outcome,
                            check)
        return work if async_op else outcome.value  # type: ignore[return-value]
