"""The collectives: what each call computes, written as a body over an algorithm.

Each method validates its input completely (``planning.Planner``: shapes, dtypes, ranks,
memory types) before any byte moves, picks an algorithm (or the fast path), describes the
call (``CallInfo``) and hands a body ``body(peers)`` to the communicator's ``Execution``,
which numbers, records and runs it.

``Collectives`` holds no state: it is the part of ``Communicator`` that says what each call
computes, written against the parts the communicator owns (listed on the class).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import debug
from ..algorithms import ALGORITHMS
from ..algorithms.primitives import Peers
from ..buffers.compression import Compression
from ..buffers.memops import HostOps
from ..buffers.memory import HOST
from ..buffers.reduction import OpLike, check_op_dtype, parse_op
from ..buffers.tensors import Buffer
from ..errors import InvalidArgument
from ..fastpath.compiled import callpath
from ..fastpath.runner import FastPath
from ..runtime.calls import CallInfo
from ..runtime.execution import Body, Execution
from ..runtime.work import Outcome, Work
from ..tags import P2P_TAG_LIMIT, p2p_tag
from .integrity import Check, MoveCheck, SumCheck, p2p_sum, p2p_verdict, refuse, sum_check
from .persistent import Planned
from .planning import Planner

#: the collectives that take ``compress=``
COMPRESSIBLE = frozenset({"allreduce", "reduce_scatter", "allgather", "broadcast"})


class Collectives:
    """allreduce, broadcast, reduce, allgather, reduce_scatter, alltoall, gather, scatter,
    barrier, send/recv and batched point-to-point (the fused ones: ``fused.py``)."""

    # the parts of the communicator the collectives are written against
    rank: int
    size: int
    name: str
    _comm_id: int
    _plan: Planner
    _exec: Execution
    _fast: FastPath | None
    _ops: HostOps
    #: ``PYCOLL_INTEGRITY``: check every N-th collective (0: only calls given integrity=True)
    _integrity_every: int
    #: set only on a copy that plans a call (``PersistentCollectives._planning_copy``):
    #: ``_submit`` raises ``Planned`` instead of running it
    _planning = False

    def _submit(self, info: CallInfo, body: Body, timeout: float | None, async_op: bool,
                output: Any = None, check: Check | None = None) -> Work | None:
        """Run the planned call: its device buffers (if any) wrap the body, staging them
        through host memory or ordering it after their streams (``planning``). A checked
        call raises its integrity verdict once it completed (``integrity.Check.verdict``)."""
        if self._planning:
            raise Planned(info)
        if self._plan.device_buffers:
            body = self._plan.take_device_call().wrap(body)
        if self._fast is not None:          # (a one-way broadcast may be queued before it)
            body = self._fast.settled_first(body)
        return self._exec.execute(info, body, timeout, async_op, output,
                                  then=check.verdict if check is not None else None)

    def _checked(self, integrity: bool | None) -> bool:
        """Whether the collective about to be numbered gets an integrity check: as asked, or
        every N-th by its sequence number (the same calls on every rank)."""
        if integrity is not None:
            return bool(integrity)
        every = self._integrity_every
        return every > 0 and (self._exec.seq + 1) % every == 0

    def _out_of_place(self, tensor: Any, out: Any, collective: str, direct: bool = True,
                      reads: bool = True) -> tuple[Any, Any]:
        """``(source, target)`` of a call given ``out=``: the input's buffer (staged for
        reading only) and ``out``, which the call then runs on in place once the body has
        copied the input into it; ``(None, tensor)`` for the in-place call (``out`` None or
        the tensor's own memory). ``reads=False``: the input is checked but not read (a
        broadcast's non-root)."""
        if out is None or not self._plan.out_of_place(tensor, out, collective):
            return None, tensor
        if not reads:
            return None, out
        return self._plan.buffer(tensor, collective, writable=False, direct=direct), out

    def compression_pays(self, collective: str, nbytes: int, compress: str,
                         dtype: str = "float32") -> bool:
        """Whether pycoll's cost model expects ``compress=`` to make ``collective`` on
        ``nbytes`` (of ``dtype``) faster on this communicator's links: the wire bytes saved
        against the codec's passes (docs/numerics.md#what-it-costs). Advice only: compression
        changes the result, so pycoll never switches it on by itself."""
        if collective not in COMPRESSIBLE:
            raise InvalidArgument(f"compression_pays: compress= applies to "
                                  f"{', '.join(sorted(COMPRESSIBLE))}, not {collective!r}")
        return self._plan.compression_pays(collective, int(nbytes), compress, dtype)

    def selected_algorithm(self, collective: str, nbytes: int, algo: str | None = None) -> str:
        """The algorithm this communicator would run for ``collective`` on ``nbytes``
        ("fastpath..." for the one-host fast path; allreduce: of a native dtype; with a
        ``compress`` default, "compressed" for the collectives it applies to, of floats)."""
        if algo is None and self._plan.compress is not None and collective in COMPRESSIBLE:
            return "compressed"
        fast = self._fast
        if fast is not None and algo is None:
            found = fast.kind_of(collective, nbytes)
            if found is not None:
                return found
        return self._plan.select(collective, nbytes, algo)

    # allreduce, broadcast and barrier: the calls of kinds the fast path has bound run from
    # ``fastpath.callpath`` (compiled where built); it hands every other call (``out=``,
    # ``compress=``, anything not of a bound kind) to the method that classifies it
    # (``_allreduce``, ``_broadcast``, ``_barrier``)
    allreduce = callpath.allreduce
    broadcast = callpath.broadcast
    barrier = callpath.barrier

    def _allreduce(self, tensor: Any, op: OpLike, algo: str | None, timeout: float | None,
                   async_op: bool, deterministic: bool | None = None,
                   accumulate: str | None = None, integrity: bool | None = None,
                   compress: str | None = None, *, out: Any = None) -> Work | None:
        """allreduce, classified: the fast path's first call of a kind, or an algorithm
        (``allreduce``, ``fastpath.callpath``'s, runs the calls of kinds already bound)."""
        fast = self._fast
        plan = self._plan
        plan.begin()
        direct = not (plan.is_deterministic(deterministic) or plan.wants_compress(compress))
        src, tensor = self._out_of_place(tensor, out, "allreduce", direct)
        buf = plan.buffer(tensor, "allreduce", direct=direct, reads=src is None)
        rop = parse_op(op)
        check_op_dtype(rop, buf.dtype)
        comp = plan.compression("allreduce", compress, buf.dtype, rop, accumulate=accumulate,
                                integrity=integrity)
        if comp is not None:
            return self._compressed_allreduce(buf, tensor, rop, comp, algo, timeout, async_op,
                                              src)
        fold = plan.fold_mode("allreduce", rop, buf, deterministic, accumulate, algo)
        check = self._sum_check("allreduce", integrity, rop, buf.dtype, buf.count, buf.mem_type)
        if (fast is not None and algo is None and not plan.device_buffers and check is None
                and fast.takes(buf.nbytes, buf.dtype, rop, fold)):   # (host memory only)
            call = fast.call("allreduce", buf.dtype, buf.count, buf.itemsize, rop, fold=fold)
            # the communicator's defaults only: a kind bound by ``compress="none"`` would
            # take the later calls that leave it out past the default compression
            if deterministic is None and accumulate is None and compress is None:
                fast.remember(("allreduce", op), buf.array, call)
            if src is not None:     # copied once the call is claimed (``run_generic``)
                return fast.run_generic(call, buf.array, timeout, async_op, tensor,
                                        src.array)
            return fast.run(call, buf.array, timeout, async_op, tensor)
        name = plan.select("allreduce", buf.nbytes, algo, ordered=fold is not None)
        algorithm = ALGORITHMS["allreduce"][name].run
        arr = buf.array
        ops = self._ops if buf.mem_type == HOST else plan.device_ops()
        spec = ops.reduce_spec(rop, buf.dtype, self.size, wide=fold == "fp32")
        size = self.size
        if self._exec.detail:
            debug.logger.debug("allreduce #%d: %d bytes %s op=%s algo=%s", self._exec.seq + 1,
                               buf.nbytes, buf.dtype, rop, name)

        def body(peers: Peers) -> None:
            if src is not None:
                ops.copy(arr, src.array)
            spec.prepare(arr)
            if check is not None:
                check.before(arr)
            if size == 1 or arr.size == 0:
                spec.finish(arr)
            else:
                algorithm(peers, arr, spec)
            if check is not None:
                check.after(arr)
                check.finish(peers)

        return self._submit(CallInfo("allreduce", buf.nbytes, buf.dtype, buf.count, rop,
                                     algorithm=name, fold=fold), body, timeout, async_op, tensor,
                            check)

    def _compressed_allreduce(self, buf: Any, tensor: Any, rop: Any, comp: Compression,
                              algo: str | None, timeout: float | None, async_op: bool,
                              src: Any = None) -> Work | None:
        """allreduce with ``compress=`` (``algorithms/compressed.py``): the generic path
        (the fast path's kernels add the buffers' own bytes). ``src``: the input of an
        out-of-place call, copied into ``buf`` (``out``) first."""
        name = self._plan.select("allreduce", buf.nbytes, algo, compressed=comp,
                                 itemsize=buf.itemsize)
        algorithm = ALGORITHMS["allreduce"][name].run
        arr = buf.array
        spec = self._ops.reduce_spec(rop, buf.dtype, self.size)
        size = self.size
        ops = self._ops

        def body(peers: Peers) -> None:
            if src is not None:
                ops.copy(arr, src.array)
            spec.prepare(arr)
            if size == 1 or arr.size == 0:
                spec.finish(arr)
            else:
                algorithm(peers, arr, spec, comp)

        return self._submit(CallInfo("allreduce", buf.nbytes, buf.dtype, buf.count, rop,
                                     algorithm=name, compress=comp.codec.name), body, timeout,
                            async_op, tensor)

    def _barrier(self, algo: str | None, timeout: float | None, async_op: bool
                 ) -> Work | None:
        """barrier by an algorithm (see ``_allreduce``)."""
        self._plan.begin()
        name = self._plan.select("barrier", 0, algo)
        fn = ALGORITHMS["barrier"][name].run

        def body(peers: Peers) -> None:
            if self.size > 1:
                fn(peers)

        return self._submit(CallInfo("barrier", 0, algorithm=name), body, timeout, async_op)

    def _broadcast(self, tensor: Any, root: int, algo: str | None, timeout: float | None,
                   async_op: bool, integrity: bool | None = None,
                   compress: str | None = None, *, out: Any = None) -> Work | None:
        """broadcast, classified (see ``_allreduce``)."""
        fast = self._fast
        self._plan.begin()
        root = self._plan.check_rank(root, "root", "broadcast")
        direct = not self._plan.wants_compress(compress)
        src = None
        if out is not None and tensor is None and self.rank != root:
            tensor = out                # a non-root's tensor is not read: it may be None
        else:
            src, tensor = self._out_of_place(tensor, out, "broadcast", direct,
                                             reads=self.rank == root)
        buf = self._plan.buffer(tensor, "broadcast", direct=direct, reads=src is None)
        comp = self._plan.compression("broadcast", compress, buf.dtype, None,
                                      integrity=integrity)
        if comp is not None:
            name = self._plan.select("broadcast", buf.nbytes, algo, compressed=comp,
                                     itemsize=buf.itemsize)
            run = ALGORITHMS["broadcast"][name].run
            data = buf.array
            ops = self._ops

            def squeezed(peers: Peers) -> None:
                if src is not None:
                    ops.copy(data, src.array)
                if self.size > 1 and data.size:
                    run(peers, data, root, comp)

            return self._submit(CallInfo("broadcast", buf.nbytes, buf.dtype, buf.count,
                                         root=root, algorithm=name,
                                         compress=comp.codec.name),
                                squeezed, timeout, async_op, tensor)
        check = self._move_check("broadcast", integrity, buf.mem_type)
        if (fast is not None and algo is None and not self._plan.device_buffers
                and check is None and fast.broadcast_kind(buf.nbytes)):
            call = fast.call("broadcast", buf.dtype, buf.count, buf.itemsize, None, root)
            if compress is None:        # (as in ``_allreduce``)
                fast.remember(("broadcast", root), buf.array, call)
            if src is not None:     # copied once the call is claimed (``run_generic``)
                return fast.run_generic(call, buf.array, timeout, async_op, tensor,
                                        src.array)
            return fast.run(call, buf.array, timeout, async_op, tensor)
        name = self._plan.select("broadcast", buf.nbytes, algo)
        fn = ALGORITHMS["broadcast"][name].run
        arr = buf.array
        ops = self._ops if buf.mem_type == HOST else self._plan.device_ops()

        def body(peers: Peers) -> None:
            if src is not None:
                ops.copy(arr, src.array)
            if check is not None and self.rank == root:
                check.sent_to_all(arr)
            if self.size > 1 and arr.size:
                fn(peers, arr, root)
            if check is not None:
                check.got(root, arr)
                check.finish(peers)

        return self._submit(CallInfo("broadcast", buf.nbytes, buf.dtype, buf.count, root=root,
                                     algorithm=name), body, timeout, async_op, tensor, check)

    def _move_check(self, collective: str, integrity: bool | None, *mem_types: Any
                    ) -> MoveCheck | None:
        """The integrity check of a call that moves host buffers, if it gets one."""
        if not self._checked(integrity) or any(m != HOST for m in mem_types):
            return None
        return MoveCheck(self.rank, self.size, collective)

    def _sum_check(self, collective: str, integrity: bool | None, rop: Any, dtype: str,
                   count: int, *mem_types: Any, root: int | None = None, blocks: bool = False
                   ) -> SumCheck | None:
        """The integrity check of a reduction of host buffers, if it gets one."""
        if not self._checked(integrity) or any(m != HOST for m in mem_types):
            return None
        return sum_check(self.rank, self.size, collective, rop, dtype, count, integrity,
                         root=root, blocks=blocks)

    def reduce(self, tensor: Any, root: int = 0, op: OpLike = "sum", *, algo: str | None = None,
               timeout: float | None = None, async_op: bool = False,
               deterministic: bool | None = None, accumulate: str | None = None,
               integrity: bool | None = None, out: Any = None) -> Work | None:
        """Reduce ``tensor`` into ``tensor`` on ``root``.

        As in Gloo, the other ranks' buffers serve as workspace: after the call they may hold
        partial results. ``deterministic``, ``accumulate``, ``integrity``: as for
        ``allreduce`` (only the root's result is checked, against every rank's input).
        ``out``: the result goes into the root's ``out`` and ``tensor`` is left unchanged on
        every rank that passes one; another rank's ``out`` is its workspace instead of
        ``tensor`` (a rank may pass None: its ``tensor`` is then the workspace).
        """
        plan = self._plan
        plan.begin()
        direct = not plan.is_deterministic(deterministic)
        src, tensor = self._out_of_place(tensor, out, "reduce", direct)
        buf = plan.buffer(tensor, "reduce", direct=direct, reads=src is None)
        rop = parse_op(op)
        check_op_dtype(rop, buf.dtype)
        root = plan.check_rank(root, "root", "reduce")
        fold = plan.fold_mode("reduce", rop, buf, deterministic, accumulate, algo)
        name = plan.select("reduce", buf.nbytes, algo, ordered=fold is not None)
        fn = ALGORITHMS["reduce"][name].run
        ops = self._ops if buf.mem_type == HOST else plan.device_ops()
        arr, spec = buf.array, ops.reduce_spec(rop, buf.dtype, self.size, wide=fold == "fp32")
        check = self._sum_check("reduce", integrity, rop, buf.dtype, buf.count, buf.mem_type,
                                root=root)

        def body(peers: Peers) -> None:
            if src is not None:
                ops.copy(arr, src.array)
            spec.prepare(arr)
            if check is not None:
                check.before(arr)
            if self.size == 1 or arr.size == 0:
                spec.finish(arr)
            else:
                fn(peers, arr, root, spec)
            if check is not None:
                check.after(arr)       # (a no-op but on the root)
                check.finish(peers)

        return self._submit(CallInfo("reduce", buf.nbytes, buf.dtype, buf.count, rop, root,
                                     name, fold), body, timeout, async_op, tensor, check)

    def allgather(self, output: Any, input: Any, *, algo: str | None = None,
                  timeout: float | None = None, async_op: bool = False,
                  integrity: bool | None = None, compress: str | None = None
                  ) -> Work | None:
        """Concatenate every rank's ``input`` into ``output`` (rank order).

        ``output`` is one tensor with ``world_size`` times the elements of ``input``, or a
        list of ``world_size`` tensors shaped like ``input``. ``compress``: the wire format
        of float buffers (as for ``allreduce``); every rank, the block's owner too, gets the
        values the bytes decode to.
        """
        self._plan.begin()
        inp = self._plan.buffer(input, "allgather", name="input", writable=False)
        outs = self._plan.output_list(output, inp, "allgather")
        out = outs[0] if len(outs) == 1 else None
        fused = out.array if out is not None else np.empty(inp.count * self.size,
                                                           dtype=inp.array.dtype)
        bounds = [(i * inp.count, (i + 1) * inp.count) for i in range(self.size)]
        comp = self._plan.compression("allgather", compress, inp.dtype, None,
                                      integrity=integrity)
        name = self._plan.select("allgather", fused.nbytes, algo, compressed=comp,
                                 itemsize=inp.itemsize)
        fn = ALGORITHMS["allgather"][name].run
        check = None if comp is not None else self._move_check(
            "allgather", integrity, inp.mem_type, *(o.mem_type for o in outs))
        extra = () if comp is None else (comp,)

        def body(peers: Peers) -> None:
            a, b = bounds[self.rank]
            if check is not None:
                check.sent_to_all(inp.array)
            fused[a:b] = inp.array
            if self.size > 1 and inp.count:
                fn(peers, fused, bounds, *extra)
            if out is None:
                for i, o in enumerate(outs):
                    o.array[...] = fused[bounds[i][0]:bounds[i][1]]
            if check is not None:
                for i in range(self.size):
                    check.got(i, outs[i].array if out is None else fused[slice(*bounds[i])])
                check.finish(peers)

        return self._submit(CallInfo("allgather", fused.nbytes, inp.dtype, inp.count,
                                     algorithm=name,
                                     compress=comp.codec.name if comp is not None else None),
                            body, timeout, async_op, output, check)

    def reduce_scatter(self, output: Any, input: Any, op: OpLike = "sum", *,
                       algo: str | None = None, timeout: float | None = None,
                       async_op: bool = False, deterministic: bool | None = None,
                       accumulate: str | None = None, integrity: bool | None = None,
                       compress: str | None = None) -> Work | None:
        """Reduce ``input`` across ranks and leave block ``rank`` of the result in ``output``.

        ``input`` has ``world_size`` times the elements of ``output`` (or is a list of
        ``world_size`` tensors shaped like ``output``); it is left unchanged.
        ``deterministic``, ``accumulate``, ``integrity``, ``compress``: as for ``allreduce``
        (each rank's block is checked against every rank's input of that block; compressed,
        the owner keeps its float32 sum: only the inputs are quantised).
        """
        plan = self._plan
        plan.begin()
        out = plan.buffer(output, "reduce_scatter", name="output", reads=False)
        rop = parse_op(op)
        check_op_dtype(rop, out.dtype)
        ins = plan.output_list(input, out, "reduce_scatter", writable=False, name="input")
        count = out.count
        if len(ins) == 1:
            sources = [(ins[0], r * count, (r + 1) * count) for r in range(self.size)]
        else:
            sources = [(b, 0, count) for b in ins]
        return self._reduce_scatter("reduce_scatter", output, out, sources, count * self.size,
                                    out.count, rop, algo, timeout, async_op, deterministic,
                                    accumulate, integrity, compress)

    def _reduce_scatter(self, what: str, output: Any, out: Buffer,
                        sources: list[tuple[Buffer, int, int]], elements: int, count: Any,
                        rop: Any, algo: str | None, timeout: float | None, async_op: bool,
                        deterministic: bool | None, accumulate: str | None,
                        integrity: bool | None, compress: str | None) -> Work | None:
        """The one body of ``reduce_scatter`` and ``reduce_scatter_v`` (checked by them):
        rank r's block is elements ``a:b`` of ``sources[r] = (buffer, a, b)``. Every block
        is padded with zeros to the largest one (nothing to pad for ``reduce_scatter``) and
        reduced by a reduce_scatter algorithm; rank r keeps its block's first ``b - a``
        elements. ``elements``: the input's elements per rank (the call's bytes);
        ``count``: what every rank must agree on (the element count, or the v-call's
        counts)."""
        plan = self._plan
        size, rank = self.size, self.rank
        sizes = [b - a for _, a, b in sources]
        block = max(sizes)
        padded = any(n != block for n in sizes)
        comp = plan.compression(what, compress, out.dtype, rop, accumulate=accumulate,
                                integrity=integrity)
        fold = (None if comp is not None else
                plan.fold_mode(what, rop, out, deterministic, accumulate, algo))
        name = plan.select("reduce_scatter", block * size * out.itemsize, algo,
                           ordered=fold is not None, compressed=comp, itemsize=out.itemsize)
        fn = ALGORITHMS["reduce_scatter"][name].run
        extra = () if comp is None else (comp,)
        spec = self._ops.reduce_spec(rop, out.dtype, size, wide=fold == "fp32")
        check = None if comp is not None else self._sum_check(
            what, integrity, rop, out.dtype, block * size, out.mem_type,
            *(b.mem_type for b, _, _ in sources), blocks=True)
        mine = slice(rank * block, rank * block + sizes[rank])
        dtype = out.array.dtype

        def body(peers: Peers) -> None:
            work = (np.zeros if padded else np.empty)(block * size, dtype=dtype)
            for r, (b, lo, hi) in enumerate(sources):
                work[r * block:r * block + hi - lo] = b.array[lo:hi]
            spec.prepare(work)
            if check is not None:
                check.before(work)
            if size == 1 or block == 0:
                spec.finish(work)
            else:
                fn(peers, work, spec, *extra)
            out.array[...] = work[mine]
            if check is not None:
                check.after(work[rank * block:(rank + 1) * block])
                check.finish(peers)

        return self._submit(CallInfo(what, elements * out.itemsize, out.dtype, count, rop,
                                     algorithm=name, fold=fold,
                                     compress=comp.codec.name if comp is not None else None),
                            body, timeout, async_op, output, check)

    def alltoall(self, output: Any, input: Any, out_splits: Sequence[int] | None = None,
                 in_splits: Sequence[int] | None = None, *, algo: str | None = None,
                 timeout: float | None = None, async_op: bool = False,
                 integrity: bool | None = None) -> Work | None:
        """Send block i of ``input`` to rank i; block j of ``output`` comes from rank j.

        Blocks are cut along the first dimension: equal blocks by default, or
        ``in_splits`` / ``out_splits`` rows per rank (as torch's ``all_to_all_single``).
        """
        self._plan.begin()
        out = self._plan.buffer(output, "alltoall", name="output", reads=False)
        inp = self._plan.buffer(input, "alltoall", name="input", writable=False)
        self._plan.same_dtype(out, inp, "alltoall")
        out_bounds = self._plan.split_bounds(output, out, out_splits, "out_splits")
        in_bounds = self._plan.split_bounds(input, inp, in_splits, "in_splits")
        mine_in, mine_out = in_bounds[self.rank], out_bounds[self.rank]
        if mine_in[1] - mine_in[0] != mine_out[1] - mine_out[0]:
            raise InvalidArgument(
                f"rank {self.rank}: alltoall: the block this rank keeps differs in size: "
                f"in_splits gives it {mine_in[1] - mine_in[0]} elements, out_splits "
                f"{mine_out[1] - mine_out[0]}; entry {self.rank} of both must agree")
        name = self._plan.select("alltoall", inp.nbytes, algo)
        if name == "bruck" and len({b - a for a, b in in_bounds + out_bounds}) > 1:
            raise InvalidArgument(f"rank {self.rank}: alltoall: algo 'bruck' needs equal "
                                  "blocks for every rank (in_splits and out_splits); use "
                                  "'pairwise' or 'scattered' for uneven splits")
        fn = ALGORITHMS["alltoall"][name].run
        check = self._move_check("alltoall", integrity, inp.mem_type, out.mem_type)

        def body(peers: Peers) -> None:
            src = inp.array
            if check is not None:
                check.sent_blocks(src, in_bounds)
            if self.size > 1 and np.may_share_memory(out.array, src):
                src = src.copy()   # in place: blocks still to be sent would be overwritten
            if self.size == 1:
                out.array[...] = src
            else:
                fn(peers, out.array, src, out_bounds, in_bounds)
            if check is not None:
                check.got_blocks(out.array, out_bounds)
                check.finish(peers)

        return self._submit(CallInfo("alltoall", inp.nbytes, inp.dtype, algorithm=name),
                            body, timeout, async_op, output, check)

    def gather(self, output: Any, input: Any, root: int = 0, *, algo: str | None = None,
               timeout: float | None = None, async_op: bool = False,
               integrity: bool | None = None) -> Work | None:
        """Collect every rank's ``input`` into ``output`` on ``root`` (ignored elsewhere)."""
        self._plan.begin()
        inp = self._plan.buffer(input, "gather", name="input", writable=False)
        root = self._plan.check_rank(root, "root", "gather")
        out = None
        if self.rank == root:
            outs = self._plan.output_list(output, inp, "gather")
            out = outs
        name = self._plan.select("gather", inp.nbytes * self.size, algo)
        fn = ALGORITHMS["gather"][name].run
        check = self._move_check("gather", integrity, inp.mem_type,
                                 *(o.mem_type for o in out or ()))

        def body(peers: Peers) -> None:
            if check is not None:
                check.sent(root, inp.array)
            fused = None
            if out is not None:
                fused = (out[0].array if len(out) == 1
                         else np.empty(inp.count * self.size, dtype=inp.array.dtype))
            if self.size == 1:
                fused[...] = inp.array  # type: ignore[index]
            else:
                fn(peers, inp.array, fused, root)
            if out is not None and len(out) > 1:
                for i, o in enumerate(out):
                    o.array[...] = fused[i * inp.count:(i + 1) * inp.count]  # type: ignore[index]
            if check is not None:
                if out is not None:
                    for i in range(self.size):
                        check.got(i, out[i].array if len(out) > 1
                                  else fused[i * inp.count:(i + 1) * inp.count])  # type: ignore[index]
                check.finish(peers)

        return self._submit(CallInfo("gather", inp.nbytes * self.size, inp.dtype, inp.count,
                                     root=root, algorithm=name),
                            body, timeout, async_op, output if self.rank == root else None,
                            check)

    def scatter(self, output: Any, input: Any, root: int = 0, *, algo: str | None = None,
                timeout: float | None = None, async_op: bool = False,
                integrity: bool | None = None) -> Work | None:
        """Send block i of ``input`` on ``root`` (ignored elsewhere) to rank i's ``output``."""
        self._plan.begin()
        out = self._plan.buffer(output, "scatter", name="output", reads=False)
        root = self._plan.check_rank(root, "root", "scatter")
        ins = None
        if self.rank == root:
            ins = self._plan.output_list(input, out, "scatter", writable=False, name="input")
        name = self._plan.select("scatter", out.nbytes * self.size, algo)
        fn = ALGORITHMS["scatter"][name].run
        check = self._move_check("scatter", integrity, out.mem_type,
                                 *(b.mem_type for b in ins or ()))

        def body(peers: Peers) -> None:
            fused = None
            if ins is not None:
                fused = ins[0].array if len(ins) == 1 else np.concatenate([b.array for b in ins])
                if check is not None:
                    check.sent_blocks(fused, [(d * out.count, (d + 1) * out.count)
                                              for d in range(self.size)])
            if self.size == 1:
                out.array[...] = fused
            else:
                fn(peers, fused, out.array, root)
            if check is not None:
                check.got(root, out.array)
                check.finish(peers)

        return self._submit(CallInfo("scatter", out.nbytes * self.size, out.dtype, out.count,
                                     root=root, algorithm=name), body, timeout, async_op, output,
                            check)

    def send(self, tensor: Any, dst: int, tag: int = 0, *, timeout: float | None = None,
             async_op: bool = False, integrity: bool = False) -> Work | None:
        """Send ``tensor`` to rank ``dst``; it must post a matching ``recv`` (same size, tag).

        ``integrity=True`` sends the data's checksum after it; the matching ``recv`` must
        pass ``integrity=True`` too, and raises ``DataCorruption`` if what it got differs
        (``PYCOLL_INTEGRITY`` does not apply: the two sides count their calls apart)."""
        self._plan.begin()
        buf = self._plan.buffer(tensor, "send", writable=False)
        self._plan.check_peer(dst, "dst", "send", tag, P2P_TAG_LIMIT)
        arr, wire = buf.array, p2p_tag(int(tag), self._comm_id, buf.dtype)
        checked = bool(integrity) and buf.mem_type == HOST

        def body(peers: Peers) -> None:
            if checked:
                peers.wait([peers.isend(dst, arr, wire), peers.isend(dst, p2p_sum(arr), wire)])
            else:
                peers.wait([peers.isend(dst, arr, wire)])

        return self._submit(CallInfo("send", buf.nbytes, buf.dtype), body, timeout, async_op)

    def recv(self, tensor: Any, src: int | None = None, tag: int = 0, *,
             timeout: float | None = None, async_op: bool = False,
             integrity: bool = False) -> Work | int | None:
        """Receive into ``tensor`` the next message from rank ``src`` with ``tag``.

        ``src=None`` receives from any source (MPI_ANY_SOURCE, torch's ``recv`` without
        ``src``): the first message with ``tag`` from whichever rank, one message only;
        each source's messages still arrive in the order it sent them. The synchronous call
        returns the sender's rank; ``Work.source_rank()`` tells it for ``async_op=True``.
        ``integrity=True``: the matching ``send`` was checked too (see ``send``).
        """
        self._plan.begin()
        buf = self._plan.buffer(tensor, "recv", reads=False)
        self._plan.check_peer(src, "src", "recv", tag, P2P_TAG_LIMIT)
        arr, wire = buf.array, p2p_tag(int(tag), self._comm_id, buf.dtype)
        outcome = Outcome(tensor, None if src is None else int(src))
        check = (Check(self.rank, self.size, "recv")
                 if integrity and buf.mem_type == HOST else None)

        def verify(peers: Peers, source: int, sent: np.ndarray | None = None) -> None:
            """The sender's checksum (read now unless given) against this rank's copy."""
            if sent is None:
                sent = np.zeros(2, dtype=np.uint64)
                peers.wait([peers.irecv(source, sent, wire)])
            p2p_verdict(check, source, self.rank, sent, p2p_sum(arr))  # type: ignore[arg-type]

        if src is not None:
            def body(peers: Peers) -> None:
                if check is None:
                    peers.wait([peers.irecv(src, arr, wire)])
                    return
                sent = np.zeros(2, dtype=np.uint64)
                peers.wait([peers.irecv(src, arr, wire), peers.irecv(src, sent, wire)])
                verify(peers, src, sent)
        else:
            size, rank = self.size, self.rank
            start = self._exec.p2p_seq      # rotate who is asked first: no source is starved

            def body(peers: Peers) -> None:
                others = [(rank + 1 + (start + i) % (size - 1)) % size for i in range(size - 1)]
                reqs, group = peers.irecv_any(others, arr, wire)
                peers.wait_any(reqs, group)
                won = group.matched
                assert won is not None       # wait_any returns only once a message landed
                outcome.source = others[reqs.index(won)]
                if check is not None:
                    verify(peers, outcome.source)

        work = self._submit(CallInfo("recv", buf.nbytes, buf.dtype), body, timeout, async_op,
                            outcome, check)
        return work if async_op else outcome.source

    def batch_p2p(self, ops: Sequence[tuple[str, Any, int, int]], *,
                  timeout: float | None = None, async_op: bool = False,
                  integrity: bool | None = None) -> Work | None:
        """Post several sends and receives together, then wait for all of them.

        ``ops`` are ``("send" | "recv", tensor, peer, tag)`` tuples (like torch's
        ``batch_isend_irecv``): the order of sends against receives does not matter, so a
        batch ``[send to 1, recv from 1]`` on both ranks cannot deadlock, whatever the size.
        ``integrity=True`` is refused (``InvalidArgument``): batches are not checked
        (docs/integrity.md).
        """
        refuse(self.rank, "batch_p2p", integrity)
        plan = []
        total = 0
        self._plan.begin()
        for i, (kind, tensor, peer, tag) in enumerate(ops):
            if kind not in ("send", "recv"):
                raise InvalidArgument(f"rank {self.rank}: batch_p2p: ops[{i}] kind {kind!r} "
                                      "is not 'send' or 'recv'")
            buf = self._plan.buffer(tensor, "batch_p2p", name=f"ops[{i}]",
                                    writable=kind == "recv", reads=kind == "send")
            self._plan.check_peer(peer, "peer", f"batch_p2p {kind}", tag, P2P_TAG_LIMIT)
            wire = p2p_tag(int(tag), self._comm_id, buf.dtype)
            plan.append((kind == "send", buf.array, int(peer), wire))
            total += buf.nbytes

        def body(peers: Peers) -> None:
            peers.wait([peers.isend(p, a, t) if is_send else peers.irecv(p, a, t)
                        for is_send, a, p, t in plan])

        return self._submit(CallInfo("batch_p2p", total), body, timeout, async_op)
