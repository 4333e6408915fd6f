"""pycoll: fast, debuggable collective communication for Python.

    import pycoll
    pycoll.init()                      # rank/world size from the launcher's environment
    pycoll.allreduce(array, op="sum")  # numpy arrays and torch CPU tensors, in place
    pycoll.finalize()
"""
from ._version import __version__ as __version__
from .buffers.reduction import OP_NAMES, ReduceOp
from .comm.communicator import Communicator
from .comm.persistent import AllreducePlan
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
                     allgatherv,
                     allreduce,
                     allreduce_coalesced,
                     allreduce_init,
                     alltoall,
                     barrier,
                     broadcast,
                     finalize,
                     gather,
                     get_rank,
                     get_world_size,
                     grow,
                     init,
                     is_initialized,
                     new_group,
                     recv,
                     reduce,
                     reduce_scatter,
                     scatter,
                     send,
                     shrink,
                     window,
                     world,
)

__all__ = [
    "init", "finalize", "is_initialized", "world", "get_rank", "get_world_size",
    "allreduce", "allreduce_init", "barrier", "broadcast", "reduce", "allgather",
    "reduce_scatter", "alltoall",
    "gather", "scatter", "send", "recv", "allreduce_coalesced", "allgather_coalesced",
    "allgatherv", "new_group", "shrink", "grow", "window",
    "Communicator", "Work", "Window", "WindowError", "AllreducePlan", "ReduceOp", "OP_NAMES",
    "PycollError", "InvalidArgument", "InvalidDtype", "TransportError", "PeerLost",
    "MessageSizeMismatch", "CollectiveTimeout", "CollectiveMismatch", "Aborted",
    "DataCorruption", "Revoked", "Excluded",
]
