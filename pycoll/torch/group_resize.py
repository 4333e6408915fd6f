"""Elastic torch groups: ``torch.distributed.shrink_group`` for pycoll's groups, and
``grow_group`` and ``join_group`` (docs/elastic.md).

torch 2.13's ``shrink_group`` checks its arguments, asks the group's backend
(``pg._get_backend(device)``: a pycoll group answers with itself) whether it
``supports_shrinking``, calls its ``shrink``, and hands the result to
``_finalize_shrunk_group``, which wraps it in a new C++ ``ProcessGroup`` with
``_register_backend``. That step takes a C++ ``Backend`` only, and a Python backend cannot be
one (torch's ``Backend`` has no Python constructor). For backends whose creator returns a
``ProcessGroup``, ``init_process_group`` and ``new_group`` take that group as it is; the
finishing step has no such branch. ``adopt_shrink_group`` adds it: when the shrunk backend is a
pycoll group, the same bookkeeping (destroy the other groups when the default group shrinks,
destroy the old group, register the new one, make it the default group when the old one was)
runs with the pycoll group itself as the new group; any other backend goes to torch's own
step. ``grow_group`` and ``join_group`` do the same bookkeeping around ``Communicator.grow``
and ``Communicator.join`` (torch has no grow).
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch import __version__ as torch_version
from torch.distributed import distributed_c10d as c10d

from ..comm.communicator import DEFAULT_TIMEOUT, Communicator
from ..launch.join import join as join_job
from .process_group import BACKEND_NAME, ProcessGroupPycoll

#: torch's step that enters a group in its world's tables (``pg_map``, names, ranks, tags):
#: ``_register_pg_in_world`` in torch 2.13, ``_update_process_group_global_state`` (the same
#: arguments) in torch 2.11
_register_in_world: Any = (getattr(c10d, "_register_pg_in_world", None)
                           or getattr(c10d, "_update_process_group_global_state", None))


def adopt_shrink_group() -> bool:
    """Teach ``torch.distributed.shrink_group`` to finish a pycoll group's shrink (module
    docstring); idempotent. False when this torch has no such step (the groups then report
    ``supports_shrinking`` False and torch refuses before anything happens)."""
    global _torch_finish
    if _torch_finish is not None:
        return True
    finish = getattr(c10d, "_finalize_shrunk_group", None)
    if finish is None or not hasattr(dist, "shrink_group") or _register_in_world is None:
        return False
    _torch_finish = finish
    ProcessGroupPycoll.supports_shrinking = True

    def finalize_shrunk_group(group_info: dict, excluded_ranks_set: set,
                              new_backend: Any) -> Any:
        if not isinstance(new_backend, ProcessGroupPycoll):
            return finish(group_info, excluded_ranks_set, new_backend)
        target = group_info["process_group"]
        # the agreed survivors: the excluded ranks and any other rank found dead meanwhile
        survivors = new_backend.comm.previous_ranks or []
        remaining = [dist.get_global_rank(target, r) for r in survivors if r is not None]
        return _replace(target, new_backend, remaining, group_info["is_default_group"],
                        "shrunken" if group_info["is_default_group"] else "shrunk")

    c10d._finalize_shrunk_group = finalize_shrunk_group
    return True


#: torch's own finishing step, once ``adopt_shrink_group`` wrapped it
_torch_finish: Any = None


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
    new.adapter, target.adapter = target.adapter, None
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
    group.adapter = store
    name = c10d._process_group_name(list(range(comm.size)), use_hashed_name=True)
    group.setGroupName(name)
    group.setGroupDesc("default:grown")
    c10d._update_default_pg(group)
    _register(pg=group, backend_name=BACKEND_NAME, store=dist.HashStore(),
                               group_name=name, backend_config=f"cpu:{BACKEND_NAME}",
                               rank_mapping={r: r for r in range(comm.size)})
    return group


def _register(**how: Any) -> None:
    if _register_in_world is None:
        raise RuntimeError(f"torch {torch_version} has no step to enter a new group in its "
                           "tables (torch 2.11 and later have one): upgrade torch to resize "
                           "groups")
    _register_in_world(**how)


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
    _register(
        pg=new, backend_name=metadata["backend_name"], store=metadata["store"],
        group_name=name, backend_config=metadata["backend_config"],
        rank_mapping={g: r for r, g in enumerate(ranks)})
    return new
