"""Groups: new_group and split give independent communicators with their own channels."""
from __future__ import annotations

import numpy as np

from pycoll.testing import run_ranks


def _groups(comm):
    out = {}
    evens = comm.new_group([r for r in range(comm.size) if r % 2 == 0])
    odds = comm.new_group([r for r in range(comm.size) if r % 2 == 1])
    mine = evens if comm.rank % 2 == 0 else odds
    assert (evens is None) != (odds is None)
    # Interleave collectives on the group and on the world: they must not interfere.
    a = np.full(1000, comm.rank, dtype=np.int64)
    w = mine.allreduce(a, async_op=True)
    b = np.ones(10, dtype=np.int64)
    comm.allreduce(b)
    w.wait(timeout=30)
    out["group_sum"] = int(a[0])
    out["world_sum"] = int(b[0])
    out["group"] = (mine.rank, mine.size)
    rev = comm.split(color=0, key=-comm.rank)      # same members, reversed order
    out["reversed_rank"] = rev.rank
    x = np.full(3, rev.rank, dtype=np.float32)
    rev.broadcast(x, root=0)                        # root 0 of rev is world rank size-1
    out["bcast_from_last"] = float(x[0]) if comm.rank != comm.size - 1 else None
    none = comm.split(color=None)
    out["opt_out"] = none is None
    for g in (mine, rev):
        g.finalize()
    return out


def test_new_group_and_split():
    size = 5
    results = run_ranks(_groups, size)
    for rank, out in enumerate(results):
        group = [r for r in range(size) if r % 2 == rank % 2]
        assert out["group_sum"] == sum(group)
        assert out["world_sum"] == size
        assert out["group"] == (group.index(rank), len(group))
        assert out["reversed_rank"] == size - 1 - rank
        assert out["opt_out"]
        if rank != size - 1:
            assert out["bcast_from_last"] == 0.0   # rev.rank of world rank size-1 is 0


def _inplace_alltoall(comm):
    buf = np.arange(comm.size * 3, dtype=np.int64) + 100 * comm.rank
    comm.alltoall(buf, buf)          # the same buffer in and out
    return buf.tolist()


def test_alltoall_in_place():
    size = 3
    for rank, got in enumerate(run_ranks(_inplace_alltoall, size)):
        assert got == [100 * src + 3 * rank + k for src in range(size) for k in range(3)]
