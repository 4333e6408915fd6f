"""``ProcessGroupPycoll``: a torch.distributed process group whose collectives run on pycoll.

Each torch call maps to one or a few calls on a ``pycoll.Communicator``. Ordering: every
collective (sync or async) goes through the communicator's executor, which runs them in
issue order on one thread per group; that is what keeps ranks matched. Tensors that pycoll
cannot use in place (non-contiguous ones) get contiguous stand-ins, copied back before the
work completes (``contiguous.py``).

Sends and receives are *deferred*: they collect into a batch, posted as one pycoll
``batch_p2p`` when any work of it is waited on or the next collective is issued (``p2p.py``).
"""
from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

from ..comm.communicator import Communicator
from ..envvars import env_bool
from ..errors import InvalidArgument, PycollError
from ..launch.join import join as join_job
from ..launch.torch_store import TorchStoreAdapter
from . import sparse
from .arguments import (
    deterministic,
    group_timeout,
    one_tensor,
    op_timeout,
    reduce_op,
    tensor_list,
)
from .contiguous import ContiguousStandIns
from .debug import track
from .p2p import DeferredP2P
from .views import HostViews
from .work import (
    EVENT_NAMES,
    PycollWork,
    _disable_compile,
    begin_record,
    done,
    end_record,
    issue_parts,
)

BACKEND_NAME = "pycoll"

_SUM = dist.ReduceOp.SUM
#: the timeout of options nobody set one on (C++'s kUnsetTimeout): the group's applies
_UNSET_TIMEOUT = _c10d.AllreduceOptions().timeout
_profiling = torch.autograd._profiler_enabled
_deterministic_on = torch.are_deterministic_algorithms_enabled


def elastic_job() -> bool:
    """Whether this process runs under ``pycoll.run --elastic`` (pycoll's store at hand)."""
    return env_bool("PYCOLL_ELASTIC", False) and bool(os.environ.get("PYCOLL_MASTER_PORT"))


def _after_calls(post: Callable[[], None] | None,
                 stand_ins: ContiguousStandIns | None) -> Callable[[], None] | None:
    """What runs once a call's pycoll parts have succeeded: ``post``, then the copy-back."""
    if stand_ins is None or not stand_ins.copies:
        return post
    if post is None:
        return stand_ins.copy_back

    def both() -> None:
        post()
        stand_ins.copy_back()

    return both


class ProcessGroupPycoll(dist.ProcessGroup):
    """A torch process group backed by a ``pycoll.Communicator``.

    torch calls the methods below from C++ in one form, (tensors, options); its type stubs
    describe the Python-facing overloads of the C++ class instead, hence the
    ``type: ignore[override]`` and ``[assignment]`` on them."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta, *,
                 comm: Communicator | None = None) -> None:
        """A group of its own (a communicator bootstrapped over ``store``), or, given
        ``comm``, a group over that communicator (a subgroup of the default group's, whose
        channels and store belong to the default group: ``groups.create_process_group``)."""
        super().__init__(rank, size)  # type: ignore[call-arg]  # the (rank, size) form
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
        if seconds <= 0:
            seconds = 1800.0
        self._timeout = seconds
        #: the store client this group owns and closes (torch's store adapted, or pycoll's)
        self.adapter: Any = None
        if comm is None and size > 1 and elastic_job() and not dist.is_initialized():
            # the default group under pycoll.run --elastic: pycoll's store, which lives in
            # the launcher (rank 0 may die too) and has the leases that find dead ranks
            # (docs/elastic.md); other groups share its channels or use torch's store
            own, _, _, token, addr = join_job(rank, size, None, None, seconds, None)
            self.adapter = own
            comm = Communicator.create(own, rank, size, timeout=seconds, name="torch",
                                       token=token, master_addr=addr)
        if comm is None:
            adapter = TorchStoreAdapter(store, seconds)
            token = None
            if size > 1:  # authenticates tcp peers; the store is the trust root, as pycoll.run
                token = adapter.compare_set("pycoll/token", "", secrets.token_hex(16)).decode()
            self.adapter = adapter
            comm = Communicator.create(adapter, rank, size, timeout=seconds, name="torch",
                                       token=token, master_addr=os.environ.get("MASTER_ADDR"))
        self.comm = comm
        self._timeout = comm.timeout
        self._rank = rank
        self._size = size
        self._group_name = ""
        self._group_desc = ""
        self._p2p = DeferredP2P(self.comm, rank, size)
        #: the numpy view of the tensor synchronous calls keep passing (``views.py``)
        self._views = HostViews()
        self._shut = False
        track(self)          # its state on torch's debug server (torch/debug.py)

    # -- identity -----------------------------------------------------------------------------
    def getBackendName(self) -> str:
        return BACKEND_NAME

    def getRank(self) -> int:
        return self._rank

    def getSize(self) -> int:
        return self._size

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupDesc(self) -> str:
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    @property
    def options(self) -> Any:
        """torch's ``Backend.Options`` of this group: backend name and timeout (what torch's
        C++ backends expose as ``options``)."""
        return _c10d.Backend.Options(BACKEND_NAME, timedelta(seconds=self._timeout))

    # torch asks ``pg._get_backend(device)`` what the group's backend can do; a pycoll group
    # is its own backend for every device it serves (below), and answers what pycoll
    # implements of torch's contract (docs/torch.md).
    #: no ``_start_coalescing``/``_end_coalescing``: torch's coalescing manager falls back to
    #: the coalesced ops, each one fused call in pycoll (torch asks this of C++ groups only)
    supports_coalescing = False
    #: no ``split_group``/``perform_nocolor_split``; ``new_group`` shares channels instead
    supports_splitting = False
    #: ``dist.shrink_group`` works (``shrink`` below); set True by
    #: ``elastic.adopt_shrink_group`` when this torch has the step it extends
    supports_shrinking = False
    #: no collective time estimates (``dist._time_estimator``)
    supports_time_estimate = False

    def _get_backend(self, device: Any) -> ProcessGroupPycoll:  # type: ignore[override]
        """The group itself: torch keeps a C++ backend per device in its own groups, and asks
        it for capabilities (``supports_shrinking``) and calls (``shrink``). Devices other
        than cpu and cuda raise as torch's own groups do for a device they lack."""
        kind = torch.device(device).type
        if kind not in ("cpu", "cuda"):
            raise RuntimeError(f"No backend type associated with device type {kind}")
        return self

    def _get_sequence_number_for_group(self) -> int:
        """The number of collectives this group has started: the same on every member while
        they are in step (torch compares it to find desynchronised ranks)."""
        return self.comm.seq

    def _set_sequence_number_for_group(self) -> None:
        """torch's "agree on a starting number": every member's count starts at 0 when its
        communicator is made, so there is nothing to agree on."""

    def __repr__(self) -> str:
        return (f"<ProcessGroupPycoll {self._group_name or '?'} rank {self._rank}/{self._size} "
                f"{self.comm.transport_summary()}>")

    # -- the one way every collective is issued ----------------------------------------------
    def _issue_pairs(self, op: str, outputs: Sequence[torch.Tensor],
                     inputs: Sequence[torch.Tensor], async_op: bool,
                     call: Callable[[Any, Any, bool], Any]) -> PycollWork:
        """The coalesced ops: ``call(output, input, async_op)`` once per pair, as one work."""
        outputs, inputs = list(outputs), list(inputs)
        if len(outputs) != len(inputs):
            raise InvalidArgument(f"{op}: {len(outputs)} outputs for {len(inputs)} inputs")
        st = ContiguousStandIns()
        pairs = [(st.out(o), st.inp(i)) for o, i in zip(outputs, inputs)]
        calls = [(lambda a, ho=ho, hi=hi: call(ho, hi, a)) for ho, hi in pairs]
        return self._issue(op, calls, outputs, st, async_op, inputs=inputs)

    def _issue(self, op: str, calls: Sequence[Callable[[bool], Any]], outputs: Any,
               stand_ins: ContiguousStandIns | None, async_op: bool,
               post: Callable[[], None] | None = None,
               inputs: Sequence[torch.Tensor] = ()) -> PycollWork:
        """Run ``calls`` (each ``f(async_op) -> pycoll Work | None``) in order, then
        ``post`` and the stand-ins' copy-back; return a torch Work for the whole.

        ``inputs`` are what the profiler event of the work shows (``record_shapes``)."""
        if self._p2p.batch:
            self._p2p.flush()
        record = begin_record(EVENT_NAMES.get(op, op), inputs)
        then = _after_calls(post, stand_ins)
        if not async_op and not self._on_worker():
            # dist.* with async_op=False waits right away: run inline (no thread hand-off).
            # An error raises from here, before torch ever sees the work. The work is made
            # finished, after the call: the fewer steps after a large collective (which has
            # flushed the CPU caches) the better (docs/torch.md, Performance)
            try:
                for call in calls:
                    call(False)
                if then is not None:
                    then()
            finally:
                end_record(record)
            return done(op, outputs)
        return issue_parts(PycollWork(op, outputs, self._rank, record=record), calls, then)

    def _inline_now(self) -> bool:
        """Whether a synchronous call may run inline as a plain pycoll call: nothing deferred
        to post first, no profiler event or deterministic mode to pass on, and not on the
        worker thread (see ``_issue``)."""
        return (not self._p2p.batch and not _profiling() and not _deterministic_on()
                and not self.comm.on_worker_thread())

    def _on_worker(self) -> bool:
        """True on this group's own pycoll worker thread (completion callbacks run there):
        blocking there on a queued collective would deadlock, so such calls go async."""
        return self.comm.on_worker_thread()

    # -- collectives --------------------------------------------------------------------------
    def allreduce(self, tensors: Any, opts: Any = None) -> PycollWork:  # type: ignore[override]
        """``dist.all_reduce``; its most common form (synchronous, one plain CPU tensor, SUM,
        no timeout of its own, nothing else going on) takes a lane of its own: this is the
        call whose fixed cost people measure (docs/torch.md, Performance)."""
        if (opts is not None and type(tensors) is list and len(tensors) == 1
                and not opts.asyncOp and opts.reduceOp == _SUM
                and opts.timeout == _UNSET_TIMEOUT and self._inline_now()):
            arr = self._views.get(tensors[0])
            if arr is not None:
                self.comm.allreduce(arr)
                return done("allreduce", tensors)
        opts = opts if opts is not None else _c10d.AllreduceOptions()
        tensors = tensor_list(tensors)
        t = one_tensor(tensors, "allreduce")
        op, timeout = reduce_op(opts.reduceOp), op_timeout(opts)
        if t.layout == torch.sparse_coo:
            return self._sparse_allreduce(t, op, timeout, opts.asyncOp)
        st = ContiguousStandIns()
        h = st.io(t)
        det = deterministic()
        return self._issue("allreduce", [
            lambda a: self.comm.allreduce(h, op, timeout=timeout, async_op=a,
                                          deterministic=det)],
            tensors, st, opts.asyncOp, inputs=tensors)

    def _sparse_allreduce(self, t: torch.Tensor, op: Any, timeout: float | None,
                          async_op: bool) -> PycollWork:
        """SUM of sparse COO tensors, as Gloo computes it (see ``sparse.py``)."""
        if op != "sum":
            raise InvalidArgument(f"rank {self._rank}: all_reduce of a sparse tensor supports "
                                  f"SUM only (as Gloo), not {op}")
        packed = sparse.pack(t)
        got: list[Any] = []

        def call(a: bool) -> Any:
            r = self.comm.allgatherv(packed, timeout=timeout, async_op=a)
            got.append(r)
            return r

        def post() -> None:
            r = got[0]
            blobs = r if isinstance(r, list) else r.result()
            sparse.deliver(t, sparse.total(blobs))

        return self._issue("sparse_allreduce", [call], [t], None, async_op, post, inputs=[t])

    def allreduce_coalesced(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> PycollWork:
        opts = opts if opts is not None else _c10d.AllreduceCoalescedOptions()
        tensors = tensor_list(tensors)
        op, timeout = reduce_op(opts.reduceOp), op_timeout(opts)
        st = ContiguousStandIns()
        hs = [st.io(t) for t in tensors]
        det = deterministic()
        return self._issue("allreduce_coalesced", [
            lambda a: self.comm.allreduce_coalesced(hs, op, timeout=timeout, async_op=a,
                                                    deterministic=det)],
            tensors, st, opts.asyncOp, inputs=tensors)

    def broadcast(self, tensors: Any, opts: Any = None) -> PycollWork:  # type: ignore[override]
        """``dist.broadcast``; its common synchronous form takes a lane as ``allreduce``'s."""
        if (opts is not None and type(tensors) is list and len(tensors) == 1
                and not opts.asyncOp and opts.timeout == _UNSET_TIMEOUT
                and self._inline_now()):
            arr = self._views.get(tensors[0])
            if arr is not None:
                self.comm.broadcast(arr, opts.rootRank)
                return done("broadcast", tensors)
        opts = opts if opts is not None else _c10d.BroadcastOptions()
        tensors = tensor_list(tensors)
        t = one_tensor(tensors, "broadcast")
        root, timeout = opts.rootRank, op_timeout(opts)
        st = ContiguousStandIns()
        h = st.io(t)
        return self._issue("broadcast", [
            lambda a: self.comm.broadcast(h, root, timeout=timeout, async_op=a)],
            tensors, st, opts.asyncOp, inputs=tensors)

    def reduce(self, tensors: Any, opts: Any = None) -> PycollWork:  # type: ignore[override]
        opts = opts if opts is not None else _c10d.ReduceOptions()
        t = one_tensor(tensors, "reduce")
        root, timeout = opts.rootRank, op_timeout(opts)
        op = reduce_op(opts.reduceOp)
        st = ContiguousStandIns()
        # pycoll uses non-root buffers as workspace; torch users expect them unchanged.
        h = st.io(t) if self._rank == root else st.inp(t).clone()
        det = deterministic()
        return self._issue("reduce", [
            lambda a: self.comm.reduce(h, root, op, timeout=timeout, async_op=a,
                                       deterministic=det)],
            tensor_list(tensors), st, opts.asyncOp, inputs=[t])

    def allgather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> PycollWork:
        opts = opts if opts is not None else _c10d.AllgatherOptions()
        inp = one_tensor(input_tensors, "allgather")
        outs = list(output_tensors[0]) if output_tensors and isinstance(
            output_tensors[0], (list, tuple)) else list(output_tensors)
        timeout = op_timeout(opts)
        st = ContiguousStandIns()
        hi = st.inp(inp)
        hos = [st.out(o) for o in outs]
        if len({o.numel() for o in outs}) > 1:      # uneven output lists (NCCL's allgather_v)
            return self._allgather_uneven(hos, hi, outs, inp, timeout, st, opts.asyncOp)
        return self._issue("allgather", [
            lambda a: self.comm.allgather(hos, hi, timeout=timeout, async_op=a)],
            [outs], st, opts.asyncOp, inputs=[inp])

    def _allgather_uneven(self, hos: list, hi: Any, outs: list, inp: Any,
                          timeout: Any, st: ContiguousStandIns, async_op: bool) -> PycollWork:
        """``all_gather`` into tensors of different sizes: ``allgatherv`` (each rank's
        length travels with its data), each rank's block then copied into its tensor; a block
        whose size is not its tensor's (ranks that disagree about the sizes) raises on the
        rank that sees it."""
        got: list = []

        def call(a: bool) -> Any:
            got.append(self.comm.allgatherv(hi, timeout=timeout, async_op=a))
            return got[-1]

        def post() -> None:
            parts = got[0] if isinstance(got[0], list) else got[0].result()
            for r, (h, part) in enumerate(zip(hos, parts)):
                if part.nbytes != h.numel() * h.element_size():
                    raise InvalidArgument(
                        f"rank {self._rank}: all_gather: rank {r} sent {part.nbytes} bytes "
                        f"for an output tensor of {h.numel() * h.element_size()}: the ranks "
                        "disagree about the output sizes")
                h.reshape(-1).view(torch.uint8).copy_(torch.from_numpy(part.view("uint8")))

        return self._issue("allgather", [call], [outs], st, async_op, post, inputs=[inp])

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor,
                        opts: Any = None) -> PycollWork:
        opts = opts if opts is not None else _c10d.AllgatherOptions()
        timeout = op_timeout(opts)
        st = ContiguousStandIns()
        hi, ho = st.inp(input), st.out(output)
        return self._issue("all_gather_into_tensor", [
            lambda a: self.comm.allgather(ho, hi, timeout=timeout, async_op=a)],
            [output], st, opts.asyncOp, inputs=[input])

    all_gather_single = _allgather_base

    def allgather_into_tensor_coalesced(self, outputs: Sequence[torch.Tensor],
                                        inputs: Sequence[torch.Tensor],
                                        opts: Any = None) -> PycollWork:
        opts = opts if opts is not None else _c10d.AllgatherOptions()
        timeout = op_timeout(opts)
        return self._issue_pairs(
            "allgather_into_tensor_coalesced", outputs, inputs, opts.asyncOp,
            lambda ho, hi, a: self.comm.allgather(ho, hi, timeout=timeout, async_op=a))

    all_gather_single_coalesced = allgather_into_tensor_coalesced  # type: ignore[assignment]

    def allgather_coalesced(self, output_lists: Sequence[Sequence[torch.Tensor]],
                            input_list: Sequence[torch.Tensor], opts: Any = None) -> PycollWork:
        """torch's layout: ``output_lists[r][i]`` receives rank ``r``'s ``input_list[i]``;
        one fused transfer (``Communicator.allgather_coalesced``)."""
        opts = opts if opts is not None else _c10d.AllgatherOptions()
        timeout = op_timeout(opts)
        st = ContiguousStandIns()
        ins = [st.inp(i) for i in input_list]
        outs = [[st.out(o) for o in row] for row in output_lists]
        return self._issue("allgather_coalesced", [
            lambda a: self.comm.allgather_coalesced(outs, ins, timeout=timeout, async_op=a)],
            [list(o) for o in output_lists], st, opts.asyncOp, inputs=list(input_list))

    def reduce_scatter(self, output_tensors: Any, input_tensors: Any,  # type: ignore[override]
                       opts: Any = None) -> PycollWork:
        opts = opts if opts is not None else _c10d.ReduceScatterOptions()
        out = one_tensor(output_tensors, "reduce_scatter")
        ins = list(input_tensors[0]) if input_tensors and isinstance(
            input_tensors[0], (list, tuple)) else list(input_tensors)
        op, timeout = reduce_op(opts.reduceOp), op_timeout(opts)
        st = ContiguousStandIns()
        ho = st.out(out)
        his = [st.inp(i) for i in ins]
        det = deterministic()
        counts = [i.numel() for i in ins]
        if len(set(counts)) > 1:        # uneven input lists (NCCL's reduce_scatter_v)
            flat = torch.cat([h.reshape(-1) for h in his])
            return self._issue("reduce_scatter", [
                lambda a: self.comm.reduce_scatter_v(ho, flat, counts, op, timeout=timeout,
                                                     async_op=a, deterministic=det)],
                [out], st, opts.asyncOp, inputs=ins)
        return self._issue("reduce_scatter", [
            lambda a: self.comm.reduce_scatter(ho, his, op, timeout=timeout, async_op=a,
                                               deterministic=det)],
            [out], st, opts.asyncOp, inputs=ins)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor,
                             opts: Any = None) -> PycollWork:
        opts = opts if opts is not None else _c10d.ReduceScatterOptions()
        op, timeout = reduce_op(opts.reduceOp), op_timeout(opts)
        st = ContiguousStandIns()
        ho, hi = st.out(output), st.inp(input)
        det = deterministic()
        return self._issue("reduce_scatter_tensor", [
            lambda a: self.comm.reduce_scatter(ho, hi, op, timeout=timeout, async_op=a,
                                               deterministic=det)],
            [output], st, opts.asyncOp, inputs=[input])

    reduce_scatter_single = _reduce_scatter_base  # type: ignore[assignment]

    def reduce_scatter_tensor_coalesced(self, outputs: Sequence[torch.Tensor],
                                        inputs: Sequence[torch.Tensor],
                                        opts: Any = None) -> PycollWork:
        opts = opts if opts is not None else _c10d.ReduceScatterOptions()
        op, timeout = reduce_op(opts.reduceOp), op_timeout(opts)
        det = deterministic()
        return self._issue_pairs(
            "reduce_scatter_tensor_coalesced", outputs, inputs, opts.asyncOp,
            lambda ho, hi, a: self.comm.reduce_scatter(ho, hi, op, timeout=timeout, async_op=a,
                                                       deterministic=det))

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced  # type: ignore[assignment]

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor,
                      output_split_sizes: Sequence[int], input_split_sizes: Sequence[int],
                      opts: Any = None) -> PycollWork:
        opts = opts if opts is not None else _c10d.AllToAllOptions()
        timeout = op_timeout(opts)
        out_splits = list(output_split_sizes) or None
        in_splits = list(input_split_sizes) or None
        st = ContiguousStandIns()
        ho, hi = st.out(output), st.inp(input)
        if ho.dim() == 0:
            ho, hi = ho.reshape(1), hi.reshape(1)
        return self._issue("all_to_all_single", [
            lambda a: self.comm.alltoall(ho, hi, out_splits, in_splits, timeout=timeout,
                                         async_op=a)],
            [output], st, opts.asyncOp, inputs=[input])

    all_to_all_single = alltoall_base  # type: ignore[assignment]

    def alltoall(self, output_tensors: Sequence[torch.Tensor],
                 input_tensors: Sequence[torch.Tensor], opts: Any = None) -> PycollWork:
        opts = opts if opts is not None else _c10d.AllToAllOptions()
        timeout = op_timeout(opts)
        outs, ins = list(output_tensors), list(input_tensors)
        if len(outs) != self._size or len(ins) != self._size:
            raise InvalidArgument(f"all_to_all: needs {self._size} input and output tensors, "
                                  f"got {len(ins)} and {len(outs)}")
        dtypes = {t.dtype for t in outs + ins}
        if len(dtypes) != 1:
            raise InvalidArgument(f"all_to_all: tensors must share one dtype, got {dtypes}")
        st = ContiguousStandIns()
        hos = [st.out(o) for o in outs]
        flat_in = torch.cat([st.inp(i).reshape(-1) for i in ins])
        flat_out = torch.empty(sum(o.numel() for o in outs), dtype=outs[0].dtype)
        in_splits = [i.numel() for i in ins]
        out_splits = [o.numel() for o in outs]

        def post() -> None:
            for h, piece in zip(hos, torch.split(flat_out, out_splits)):
                h.copy_(piece.view(h.shape))

        return self._issue("all_to_all", [
            lambda a: self.comm.alltoall(flat_out, flat_in, out_splits, in_splits,
                                         timeout=timeout, async_op=a)],
            outs, st, opts.asyncOp, post, inputs=ins)

    def gather(self, output_tensors: Any, input_tensors: Any,  # type: ignore[override]
               opts: Any = None) -> PycollWork:
        opts = opts if opts is not None else _c10d.GatherOptions()
        inp = one_tensor(input_tensors, "gather")
        root, timeout = opts.rootRank, op_timeout(opts)
        st = ContiguousStandIns()
        hi = st.inp(inp)
        outs: list = []
        hos = None
        if self._rank == root:
            outs = list(output_tensors[0]) if output_tensors and isinstance(
                output_tensors[0], (list, tuple)) else list(output_tensors)
            hos = [st.out(o) for o in outs]
        return self._issue("gather", [
            lambda a: self.comm.gather(hos, hi, root, timeout=timeout, async_op=a)],
            [outs], st, opts.asyncOp, inputs=[inp])

    def scatter(self, output_tensors: Any, input_tensors: Any,  # type: ignore[override]
                opts: Any = None) -> PycollWork:
        opts = opts if opts is not None else _c10d.ScatterOptions()
        out = one_tensor(output_tensors, "scatter")
        root, timeout = opts.rootRank, op_timeout(opts)
        st = ContiguousStandIns()
        ho = st.out(out)
        his = None
        ins: list = []             # as Gloo: the profiler shows the root's inputs only
        if self._rank == root:
            ins = list(input_tensors[0]) if input_tensors and isinstance(
                input_tensors[0], (list, tuple)) else list(input_tensors)
            his = [st.inp(i) for i in ins]
        return self._issue("scatter", [
            lambda a: self.comm.scatter(ho, his, root, timeout=timeout, async_op=a)],
            [out], st, opts.asyncOp, inputs=ins)

    def barrier(self, opts: Any = None) -> PycollWork:
        opts = opts if opts is not None else _c10d.BarrierOptions()
        timeout = op_timeout(opts)
        return self._issue("barrier", [
            lambda a: self.comm.barrier(timeout=timeout, async_op=a)], [], None,
            getattr(opts, "asyncOp", True))

    # -- point to point (deferred into batches: p2p.py) ---------------------------------------
    def send(self, tensors: Any, dstRank: int, tag: int = 0) -> PycollWork:
        t = one_tensor(tensors, "send")
        self._refuse_if_shut("send")
        return self._p2p.defer("send", t, dstRank, tag)

    def recv(self, tensors: Any, srcRank: int, tag: int = 0) -> PycollWork:
        t = one_tensor(tensors, "recv")
        self._refuse_if_shut("recv")
        return self._p2p.defer("recv", t, srcRank, tag)

    def recv_anysource(self, tensors: Any, tag: int = 0) -> PycollWork:
        """A receive from whichever rank sends first (``Communicator.recv(src=None)``);
        ``work._source_rank()`` tells who. Sends and receives deferred before it are posted
        first, so each source's messages still arrive in order."""
        t = one_tensor(tensors, "recv")
        self._refuse_if_shut("recv")
        return self._p2p.recv_from_any(t, tag)

    recvAnysource = recv_anysource

    def _refuse_if_shut(self, kind: str) -> None:
        if self._shut:
            raise PycollError(f"rank {self._rank}: {kind} on a process group that was shut down")

    # -- elastic ------------------------------------------------------------------------------
    def shrink(self, ranks_to_exclude: Sequence[int], shrink_flags: int = 0,
               pg_options: Any = None) -> ProcessGroupPycoll:
        """A backend's ``shrink`` as torch defines it (``torch.distributed.shrink_group`` calls
        it on the survivors): the group of this group's ranks but ``ranks_to_exclude`` (group
        ranks), from ``Communicator.shrink``. ``SHRINK_DEFAULT``: the new group shares this
        one's channels when no rank failed and no call is in flight anywhere (else it gets
        new ones). ``SHRINK_ABORT`` ("terminate ongoing operations") revokes this group
        first, so that a call still pending on it raises ``pycoll.Revoked``, and the new
        group gets new channels (as NCCL shares a parent's resources only without the abort
        flag). ``pg_options``: a ``Backend.Options`` whose timeout the new group takes. The
        new group owns the store adapter from now on (torch destroys this group next). More
        ranks than ``ranks_to_exclude`` may be gone (a second death during the shrink): the
        new group is of the agreed survivors (its communicator's ``previous_ranks``)."""
        timeout = group_timeout(timedelta(seconds=self._timeout), pg_options).total_seconds()
        excluded = sorted(int(r) for r in ranks_to_exclude)
        if shrink_flags == getattr(dist.distributed_c10d, "SHRINK_ABORT", 1):
            self.comm.revoke(f"rank {self._rank}: shrink_group with SHRINK_ABORT")
        comm = self.comm.shrink(excluded, timeout=timeout)
        group = ProcessGroupPycoll(None, comm.rank, comm.size, timedelta(seconds=timeout),
                                   comm=comm)
        group.adapter, self.adapter = self.adapter, None
        return group

    # -- teardown -----------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Release threads, sockets and shared memory (called by destroy_process_group)."""
        if self._shut:
            return
        self._shut = True
        self._views.clear()
        self._p2p.fail_pending(f"rank {self._rank}: process group shut down before this "
                               "send/recv was waited on")
        if self.adapter is not None:      # a subgroup's store is the default group's
            self.adapter.close()
        self.comm.finalize()

    def abort(self) -> None:
        self.shutdown()

    def _abort(self) -> None:
        self.shutdown()


_disable_compile(ProcessGroupPycoll, [
    "allreduce", "allreduce_coalesced", "broadcast", "reduce", "allgather", "_allgather_base",
    "all_gather_single", "allgather_into_tensor_coalesced", "all_gather_single_coalesced",
    "allgather_coalesced", "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_single",
    "reduce_scatter_tensor_coalesced", "reduce_scatter_single_coalesced", "alltoall_base",
    "all_to_all_single", "alltoall", "gather", "scatter", "barrier", "send", "recv",
    "recv_anysource", "recvAnysource", "shutdown", "abort", "getBackendName", "getGroupName",
    "setGroupName", "getGroupDesc", "setGroupDesc", "getRank", "getSize",
    "_get_sequence_number_for_group", "_set_sequence_number_for_group"])
