"""The PyTorch distributed backend "pycoll".

    import pycoll.torch                      # registers the backend
    import torch.distributed as dist
    dist.init_process_group("pycoll")        # under torchrun or python -m pycoll.run

Every ``torch.distributed`` collective runs on a ``pycoll.Communicator`` bootstrapped over
torch's own store; DistributedDataParallel works unchanged. See docs/torch.md.
"""
from ..launch.torch_store import TorchStoreAdapter
from .compress_hook import CompressHookState, compressed_allreduce_hook
from .group_resize import grow_group, join_group
from .groups import create_process_group, register
from .process_group import BACKEND_NAME, ProcessGroupPycoll
from .work import PycollWork

register()

__all__ = ["BACKEND_NAME", "CompressHookState", "ProcessGroupPycoll", "PycollWork",
           "TorchStoreAdapter", "compressed_allreduce_hook", "create_process_group", "grow_group",
           "join_group", "register"]
