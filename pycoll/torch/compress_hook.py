"""A DistributedDataParallel communication hook that averages gradients with pycoll's
compressed allreduce (``compress=``, docs/numerics.md), with or without error feedback::

    state = pycoll.torch.CompressHookState("fp8", error_feedback=True)
    model.register_comm_hook(state, pycoll.torch.compressed_allreduce_hook)

Unlike torch's ``bf16_compress_hook`` (which casts the bucket to bfloat16, allreduces in
bfloat16 and casts back, so every ring step rounds again), the bucket stays float32: only the
wire is compressed, sums accumulate in float32, and every rank gets the same bits.

This module deliberately has no ``from __future__ import annotations``: DDP compares the
hook's annotations with the real ``GradBucket`` and ``Future`` classes, not with strings.
"""
import torch
import torch.distributed as dist

from ..buffers.compression import codec
from ..comm.communicator import Communicator
from ..compress import ErrorFeedback
from ..errors import InvalidArgument
from .process_group import ProcessGroupPycoll
from .work import _Failure, _unwrap


class CompressHookState:
    """What ``compressed_allreduce_hook`` needs: the wire format, the group (default: torch's
    default group, which must be pycoll's), and the error feedback (``error_feedback=True``:
    a ``pycoll.compress.ErrorFeedback`` of the same format, one residual per gradient bucket:
    one float32 copy of the model's gradients on each rank)."""

    def __init__(self, compress: str = "bf16", group: dist.ProcessGroup | None = None,
                 error_feedback: bool = False) -> None:
        codec(compress)                      # an unknown format: refused here, not at step 1
        self.compress = compress
        self.error_feedback = ErrorFeedback(compress) if error_feedback else None
        pg = group if group is not None else dist.GroupMember.WORLD
        if not isinstance(pg, ProcessGroupPycoll):
            backend = getattr(pg, "_get_backend", None)
            pg = backend(torch.device("cpu")) if backend is not None else pg
        if not isinstance(pg, ProcessGroupPycoll):
            raise InvalidArgument("CompressHookState: the group is not a \"pycoll\" process "
                                  f"group ({type(pg).__name__}); init_process_group(\"pycoll\")"
                                  " or pass a pycoll group")
        self.comm: Communicator = pg.comm


def compressed_allreduce_hook(state: CompressHookState,
                              bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average ``bucket``'s gradients over the group with ``compress=state.compress``."""
    tensor = bucket.buffer()
    comm = state.comm
    if state.error_feedback is not None and comm.size > 1:
        # the residual is of this rank's own quantisation, which a world of one never does
        if tensor.device.type != "cpu":
            raise InvalidArgument(f"rank {comm.rank}: compressed_allreduce_hook with error "
                                  f"feedback needs CPU gradient buckets, not {tensor.device}")
        state.error_feedback.compensate(bucket.index(), tensor.detach().numpy())
    raw: torch.futures.Future = torch.futures.Future()
    work = comm.allreduce(tensor, "avg", compress=state.compress, async_op=True)
    assert work is not None

    def done(w: object) -> None:
        try:
            work.wait(0)
        except BaseException as e:  # delivered through the future (torch.work: why a marker)
            raw.set_result(_Failure(e))
            return
        raw.set_result(tensor)

    work.add_done_callback(done)
    return raw.then(_unwrap)
