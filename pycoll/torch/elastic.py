"""Elastic torch groups: ``shrink_group`` (``torch.distributed.shrink_group`` for pycoll's
groups), ``grow_group`` and ``join_group`` (docs/elastic.md).

torch 2.13's ``shrink_group`` asks the group's backend to ``shrink`` and registers the result
with ``ProcessGroup._register_backend``, which takes a C++ ``Backend`` only; pycoll's process
group is a Python ``ProcessGroup`` (torch uses it as the group itself), which cannot be one.
``shrink_group`` here takes the same arguments and does the same steps around the backend's
``shrink``: checks, destroying the other groups when the default group changes, destroying the
old group, and registering the new one (as the default group when it was), through the same
torch helpers. ``grow_group`` and ``join_group`` do the same around ``Communicator.grow`` and
``Communicator.join``.
"""
from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from ..comm.communicator import DEFAULT_TIMEOUT, Communicator
from ..launch.join import join as join_job
from .process_group import BACKEND_NAME, ProcessGroupPycoll


def shrink_group(ranks_to_exclude: Sequence[int], group: Any = None,
                 shrink_flags: int = c10d.SHRINK_DEFAULT, pg_options: Any = None) -> Any:
    """``dist.shrink_group`` for a pycoll group: the group of the ranks not in
    ``ranks_to_exclude`` (pass every dead rank), called by those ranks only; shrinking the
    default group makes the result the default group and destroys the other groups, as
    torch does."""
    excluded_ranks = list(ranks_to_exclude)
    c10d._validate_shrink_inputs(excluded_ranks, shrink_flags)
    info = c10d._prepare_shrink_target_group(group)
    target = _pycoll_group(info)
    excluded = c10d._validate_and_process_excluded_ranks(excluded_ranks, info)
    new = target.shrink(sorted(excluded), shrink_flags, pg_options)
    # the agreed survivors: ranks_to_exclude and any other rank found dead meanwhile
    survivors = new.comm.previous_ranks or []
    remaining = [dist.get_global_rank(target, r) for r in survivors if r is not None]
    return _replace(target, new, remaining, info["is_default_group"], "shrunk")


def grow_group(count: int | None = None, group: Any = None,
               timeout: float | timedelta | None = None) -> Any:
    """``Communicator.grow`` for the default group, a pycoll group (every member calls it):
    the group of its members plus ``count`` processes waiting in ``join_group`` (None:
    whoever waits now; the group itself when nobody does). Members keep their ranks;
    joiners follow."""
    pg = group if group is not None else c10d._get_default_group()
    target = _pycoll_group({"process_group": pg,
                            "group_name": c10d._get_process_group_name(pg)})
    if pg is not c10d._get_default_group():
        raise ValueError("pycoll.torch.grow_group grows the default group only (joiners "
                         "become ranks of the default group: join_group)")
    grown = target.comm.grow(count, timeout=timeout)
    if grown is target.comm:
        return target
    new = _wrap(grown)
    new._adapter, target._adapter = target._adapter, None
    return _replace(target, new, list(range(grown.size)), True, "grown")


def join_group(timeout: float | timedelta = DEFAULT_TIMEOUT) -> Any:
    """In a new process of a job under ``pycoll.run --elastic`` (instead of
    ``init_process_group``): wait until the members call ``grow_group``, then make the grown
    group this process's default group and return it."""
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    store, _, _, token, addr = join_job(None, None, None, None, seconds, None, joining=True)
    assert store is not None
    try:
        comm = Communicator.join(store, name="torch", timeout=seconds, token=token,
                                 master_addr=addr)
    except BaseException:
        store.close()
        raise
    group = _wrap(comm)
    group._adapter = store
    name = c10d._process_group_name(list(range(comm.size)), use_hashed_name=True)
    group.setGroupName(name)
    group.setGroupDesc("default:grown")
    c10d._update_default_pg(group)
    c10d._register_pg_in_world(pg=group, backend_name=BACKEND_NAME, store=dist.HashStore(),
                               group_name=name, backend_config=f"cpu:{BACKEND_NAME}",
                               rank_mapping={r: r for r in range(comm.size)})
    return group


def _pycoll_group(info: dict) -> ProcessGroupPycoll:
    target = info["process_group"]
    if not isinstance(target, ProcessGroupPycoll):
        raise TypeError(f"group {info['group_name']!r} is not a pycoll group; use "
                        "torch.distributed's own calls")
    return target


def _wrap(comm: Communicator) -> ProcessGroupPycoll:
    return ProcessGroupPycoll(None, comm.rank, comm.size, timedelta(seconds=comm.timeout),
                              comm=comm)


def _replace(target: ProcessGroupPycoll, new: ProcessGroupPycoll, ranks: list[int],
             is_default: bool, how: str) -> ProcessGroupPycoll:
    """torch's bookkeeping when ``new`` (of global ``ranks``, in its rank order) replaces
    ``target``, as ``shrink_group`` does it."""
    if is_default:
        c10d._destroy_all_other_groups(exclude_group=target)
    metadata = c10d._extract_group_metadata(target)
    c10d._cleanup_original_group(target, is_default)
    name = c10d._process_group_name(ranks, use_hashed_name=True)
    new.setGroupName(name)
    new.setGroupDesc(f"default:{how}" if is_default else f"{metadata['original_group_name']}:{how}")
    if is_default:
        c10d._update_default_pg(new)
    c10d._register_pg_in_world(
        pg=new, backend_name=metadata["backend_name"], store=metadata["store"],
        group_name=name, backend_config=metadata["backend_config"],
        rank_mapping={g: r for r, g in enumerate(ranks)})
    return new
