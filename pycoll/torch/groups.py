"""How torch's groups become pycoll communicators: the creator torch calls, and registration.

torch calls a backend's creator on the members of a new group only (non-members return
before it). The default group (``init_process_group``) bootstraps a communicator of its own
over torch's store; every later group (``new_group``, ``new_subgroups``, ``init_device_mesh``'s
dimensions) is a ``Communicator.subgroup`` of the default group's communicator when the
default group is pycoll's: it shares its channels (no new sockets; shared memory only for the
one-host fast path's slots) and is finalized with it. Under another default backend (e.g.
``new_group(backend="pycoll")`` under gloo) there are no channels to share, and the group
bootstraps its own communicator, as the default group does.
"""
from __future__ import annotations

from typing import Any

import torch.distributed as dist

from ..comm.communicator import Communicator
from ..errors import InvalidArgument
from .arguments import group_timeout
from .group_resize import adopt_shrink_group
from .process_group import BACKEND_NAME, ProcessGroupPycoll


def world_communicator() -> Communicator | None:
    """The communicator of torch's default group when that group is pycoll's (a failed one
    too: ``Communicator.subgroup`` then refuses, rather than groups quietly bootstrapping
    channels of their own beside it)."""
    default = dist.GroupMember.WORLD
    return default.comm if isinstance(default, ProcessGroupPycoll) else None


def create_process_group(opts: Any, pg_options: Any = None) -> ProcessGroupPycoll:
    """The creator torch calls (``extended_api=True``) on each member of a new group.

    ``opts`` is torch's ``_DistributedBackendOptions``: store, group_rank, group_size,
    timeout, group_id (torch's group name, the same on every member) and
    global_ranks_in_group (empty for the default group)."""
    rank, size = opts.group_rank, opts.group_size
    timeout = group_timeout(opts.timeout, pg_options)
    ranks = list(opts.global_ranks_in_group)
    world = world_communicator() if ranks else None
    if world is None:
        return ProcessGroupPycoll(opts.store, rank, size, timeout)
    if world.rank not in ranks or ranks.index(world.rank) != rank or len(ranks) != size:
        raise InvalidArgument(f"rank {world.rank}: torch made group {opts.group_id!r} with "
                              f"rank {rank} of {size} from global ranks {ranks}; pycoll's "
                              "default group disagrees (was the default group replaced?)")
    seconds = timeout.total_seconds()       # 0 or less: the default group's deadline
    comm = world.subgroup(ranks, name=f"torch/{opts.group_id}",
                          timeout=seconds if seconds > 0 else None)
    return ProcessGroupPycoll(opts.store, rank, size, timeout, comm=comm)


def register() -> None:
    """Register the "pycoll" backend with torch.distributed, and let ``dist.shrink_group``
    finish a pycoll group's shrink (``elastic.adopt_shrink_group``); idempotent."""
    adopt_shrink_group()
    if BACKEND_NAME in getattr(dist.Backend, "backend_list", []) or hasattr(dist.Backend,
                                                                           "PYCOLL"):
        return
    dist.Backend.register_backend(BACKEND_NAME, create_process_group, extended_api=True,
                                  devices=["cpu", "cuda"])
