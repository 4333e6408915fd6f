"""Groups: new_group and split make communicators that share their parent's channels
(renumbered), with ids that keep their messages apart."""
from __future__ import annotations

import time

import numpy as np
import pytest

import pycoll
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


def _async_then_split(comm):
    """A collective still running on the worker thread needs a new channel (its address
    comes from the store) while the caller's thread waits in split's store round: the two
    must not wait for each other (regression: they shared one store connection)."""
    a = np.full(1 << 10, float(comm.rank), dtype=np.float32)
    work = comm.broadcast(a, root=comm.size - 1, async_op=True)
    g = comm.split(comm.rank % 2)
    work.wait(timeout=30)
    b = np.ones(3)
    g.allreduce(b)
    return float(a[0]), float(b[0])


def test_async_collective_and_split_do_not_deadlock():
    for rank, (got, total) in enumerate(run_ranks(_async_then_split, 4, collective_timeout=20)):
        assert got == 3.0 and total == 2.0, rank


def _group_failure_breaks_the_pair(comm):
    """A group's collective fails with a message still in flight on a channel it shares
    with the world: that pair is broken, so the late message can never land in the user's
    buffer; the world says so instead of computing with it."""
    g = comm.new_group([0, 1])
    comm.barrier()
    a = np.full(4, 7.0 if comm.rank == 1 else 0.0)
    if comm.rank == 0:
        try:
            g.broadcast(a, root=1, timeout=0.3)
        except pycoll.PycollError:
            pass
        a[:] = 42.0
    else:
        time.sleep(1.0)
        g.broadcast(a, root=1)
    try:   # world calls over that pair
        comm.broadcast(np.zeros(4), root=1)
        comm.broadcast(np.zeros(4), root=1)
        return "no error", a.tolist()
    except pycoll.PycollError as e:
        return type(e).__name__, a.tolist()


@pytest.mark.parametrize("fastpath", ["0", "1"])
def test_failed_group_collective_never_leaks_late_data(fastpath):
    """Without the fast path both communicators share the channel, and the world must
    refuse the broken pair; with it (one host) the group's broadcast went through the
    group's own segment, which nothing reads again: the world may go on, and the late data
    still never lands."""
    env = {"PYCOLL_FASTPATH": fastpath}
    outcomes = run_ranks(_group_failure_breaks_the_pair, 2, expect_failure=True,
                         collective_timeout=10, rank_env={0: env, 1: env})
    kind, value = outcomes[0]
    assert kind == "ok", value
    error, buf = value
    if fastpath == "0":
        assert error != "no error"
    assert buf == [42.0] * 4          # the late broadcast data never arrived


def _group_ids(comm):
    groups = [comm.new_group(list(range(comm.size))) for _ in range(40)]
    ids = [g._comm_id for g in groups]
    try:
        comm.split(0, name="split3")           # the name of the third group above
        dup = None
    except pycoll.InvalidArgument as e:
        dup = str(e)
    return ids, dup


def test_group_ids_are_unique_and_names_cannot_repeat():
    for ids, dup in run_ranks(_group_ids, 2):
        assert len(set(ids)) == 40 and 0 not in ids
        assert dup is not None and "unique" in dup


def _member_only_subgroups(comm):
    """Only the members call subgroup (ranks 0 and 2 make one group, 3 and 1 another)."""
    comm.alltoall(np.zeros(comm.size * 2), np.ones(comm.size * 2))   # a channel to each peer
    opened = comm.open_channels()
    ranks = [0, 2] if comm.rank in (0, 2) else [3, 1]
    name = f"pair{ranks[0]}"
    g = comm.subgroup(ranks, name=name)
    a = np.full(4, comm.rank + 1.0)
    g.allreduce(a)
    out: dict = {"pair": (g.rank, g.size, float(a[0]))}
    errors = []
    for bad in (dict(ranks=[r for r in range(comm.size) if r != comm.rank], name="x"),
                dict(ranks=[comm.rank, comm.rank], name="y"),
                dict(ranks=[comm.rank], name=""),
                dict(ranks=ranks, name=name)):        # the same name while its group lives
        try:
            comm.subgroup(**bad)
        except pycoll.InvalidArgument as e:
            errors.append(str(e))
    g.finalize()
    reused = comm.subgroup(ranks, name=name)        # a name comes back once finalized
    b = np.ones(2)
    reused.allreduce(b)
    comm.allreduce(b)                               # the world still works over its channels
    out.update(errors=errors, opened_same=comm.open_channels() == opened,
               reused=(reused.name, reused._comm_id != g._comm_id, float(b[0])))
    reused.finalize()
    # a name back with other members: 0 reuses "pair0" with 1 (who never had it), 3 "pair3"
    # with 2: each pair must agree on its keys and id all the same
    other = [0, 1] if comm.rank in (0, 1) else [3, 2]
    moved = comm.subgroup(other, name=f"pair{other[0]}")
    c = np.full(3, comm.rank + 1.0)
    moved.allreduce(c)
    out["moved"] = float(c[0])
    return out


def test_subgroup_is_called_by_members_only_and_shares_channels():
    for rank, out in enumerate(run_ranks(_member_only_subgroups, 4)):
        members = [0, 2] if rank in (0, 2) else [3, 1]
        assert out["pair"][:3] == (members.index(rank), 2, float(sum(m + 1 for m in members)))
        assert out["opened_same"]
        assert len(out["errors"]) == 4, out["errors"]
        assert "not in ranks" in out["errors"][0] and "duplicates" in out["errors"][1]
        assert "non-empty" in out["errors"][2] and "live subgroup" in out["errors"][3]
        name, fresh_id, total = out["reused"]
        assert name.endswith("#1") and fresh_id and total == 4.0 * 2
        assert out["moved"] == (3.0 if rank in (0, 1) else 7.0)
