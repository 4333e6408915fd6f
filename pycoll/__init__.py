"""pycoll: fast, debuggable collective communication for Python.

    import pycoll
    pycoll.init()                      # rank/world size from the launcher's environment
    pycoll.allreduce(array, op="sum")  # numpy arrays and torch CPU tensors, in place
    pycoll.finalize()
"""
from ._version import __version__ as __version__
from .buffers.reduction import OP_NAMES, ReduceOp
from .comm.communicator import Communicator
from .comm.persistent import AllreducePlan, Plan
from .comm.windows import Window, WindowError
from .errors import (
                     Aborted,
                     CollectiveMismatch,
                     CollectiveTimeout,
                     DataCorruption,
                     Excluded,
                     InvalidArgument,
                     InvalidDtype,
                     MessageSizeMismatch,
                     PeerLost,
                     PycollError,
                     Revoked,
                     TransportError,
)
from .runtime.work import Work
from .world import (
                     allgather,
                     allgather_coalesced,
                     allgather_init,
                     allgatherv,
                     allocate_window,
                     allreduce,
                     allreduce_coalesced,
                     allreduce_init,
                     alltoall,
                     alltoall_init,
                     barrier,
                     barrier_init,
                     broadcast,
                     broadcast_init,
                     finalize,
                     gather,
                     gather_init,
                     gatherv,
                     gatherv_init,
                     get_rank,
                     get_world_size,
                     grow,
                     init,
                     is_initialized,
                     new_group,
                     recv,
                     reduce,
                     reduce_init,
                     reduce_scatter,
                     reduce_scatter_init,
                     reduce_scatter_v,
                     reduce_scatter_v_init,
                     scatter,
                     scatter_init,
                     scatterv,
                     scatterv_init,
                     send,
                     shrink,
                     window,
                     world,
)

__all__ = [
    "init", "finalize", "is_initialized", "world", "get_rank", "get_world_size",
    "allreduce", "allreduce_init", "barrier", "broadcast", "reduce", "allgather",
    "reduce_scatter", "alltoall",
    "gather", "scatter", "reduce_scatter_v", "gatherv", "scatterv", "send", "recv",
    "allreduce_coalesced", "allgather_coalesced",
    "allgatherv", "new_group", "shrink", "grow", "window", "allocate_window", "broadcast_init",
    "reduce_init",
    "allgather_init", "reduce_scatter_init", "alltoall_init", "gather_init", "scatter_init",
    "barrier_init", "reduce_scatter_v_init", "gatherv_init", "scatterv_init",
    "Communicator", "Work", "Window", "WindowError", "Plan", "AllreducePlan", "ReduceOp",
    "OP_NAMES",
    "PycollError", "InvalidArgument", "InvalidDtype", "TransportError", "PeerLost",
    "MessageSizeMismatch", "CollectiveTimeout", "CollectiveMismatch", "Aborted",
    "DataCorruption", "Revoked", "Excluded",
]
