"""The one-way broadcast of the fast path (``kernels.broadcast_one_way``).

A broadcast of one slot returns on the root as soon as the data is staged, and on a
receiver as soon as it has the root's bytes: nobody waits for the receivers. What protects
the root's slot is the next stage, which first waits until every rank has published the
broadcast's stage (``kernels.settle``). These tests check what that must keep true, with
real rank processes on one host: back-to-back broadcasts from rotating roots interleaved
with allreduces, barriers, chunked broadcasts and generic calls give exactly the root's bytes
on every rank; the root really does not wait (it finishes before a receiver has even entered
the call: that would deadlock a two-way broadcast); and a rank that disagrees about the
broadcast or dies after it is named, on the root too, at the root's next call.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import pycoll
from pycoll import fastpath
from pycoll.fastpath import compiled
from pycoll.testing import run_ranks

pytestmark = [pytest.mark.timeout(150),
              pytest.mark.skipif(not fastpath.probe_limit(),
                                 reason="the fast path needs numba on Linux x86-64/aarch64 "
                                        "(pip install numba)")]


def _value(root: int, i: int, count: int) -> np.ndarray:
    return (np.arange(count, dtype=np.int64) * 31 + root * 1000 + i * 7).astype(np.int64)


def _mixed(comm, n):
    """``n`` rounds: a small broadcast from a rotating root (the one-way kernel), and now and
    then an allreduce, a barrier, a chunked broadcast or a generic call; every result is
    checked at once."""
    fast = comm._fast
    bad = []
    for i in range(n):
        root = (i * 5 + i // 3) % comm.size
        count = (1, 4, 5, 33, 700)[i % 5]
        a = _value(comm.rank, i, count) if comm.rank == root else np.zeros(count, np.int64)
        assert fast.kind_of("broadcast", a.nbytes) == "fastpath-broadcast"
        comm.broadcast(a, root)
        if not np.array_equal(a, _value(root, i, count)):
            bad.append(("broadcast", i, root))
        if i % 4 == 1:
            s = np.full(3, comm.rank + i, dtype=np.int64)
            comm.allreduce(s)
            if s.tolist() != [sum(r + i for r in range(comm.size))] * 3:
                bad.append(("allreduce", i))
        if i % 11 == 2:
            comm.barrier()
        if i % 37 == 5:      # several stages: the chunked kernel, after a one-way one
            big = fast.chunk // 8 * 2 + 5
            b = _value(comm.rank, i, big) if comm.rank == root else np.zeros(big, np.int64)
            comm.broadcast(b, root)
            if not np.array_equal(b, _value(root, i, big)):
                bad.append(("chunked broadcast", i, root))
        if i % 53 == 7:      # the generic path between two one-way broadcasts
            g = np.full(6, float(comm.rank), dtype=np.float32)
            comm.allreduce(g, algo="ring")
            if g[0] != sum(range(comm.size)):
                bad.append(("generic", i))
    return bad


@pytest.mark.parametrize("size", [2, 3, 4])
def test_back_to_back_broadcasts_from_rotating_roots_give_the_roots_bytes(size):
    for bad in run_ranks(_mixed, size, 400, timeout=140, collective_timeout=60):
        assert bad == []


def _root_runs_ahead(comm):
    """The root finishes a broadcast and says so in the store before rank 1 enters it: with a
    root that waited for its receivers this would hang until the deadline. (One call ahead
    at most: the root's next stage settles this one, which needs every rank's flag.)"""
    store = comm._store
    out = []
    for i in range(3):
        if comm.rank == 1 and i == 0:
            store.get("test/root-done", timeout=20)
        a = np.full(4, 10.0 + i) if comm.rank == 0 else np.zeros(4)
        comm.broadcast(a, 0)
        if comm.rank == 0 and i == 0:
            store.set("test/root-done", b"1")
        out.append(a.tolist())
    s = np.ones(2)
    comm.allreduce(s)                 # settles the last broadcast on every rank
    return out, s.tolist()


@pytest.mark.parametrize("size", [2, 3])
def test_the_root_does_not_wait_for_its_receivers(size):
    results = run_ranks(_root_runs_ahead, size, timeout=60, collective_timeout=30)
    for rank in range(size):
        assert results[rank] == ([[10.0] * 4, [11.0] * 4, [12.0] * 4], [float(size)] * 2)


def _outcome(call):
    try:
        call()
        return "no error", ""
    except pycoll.PycollError as e:
        return type(e).__name__, str(e)


def _bound_barrier(comm, warm: bool) -> bool:
    """With ``warm``, barriers until the barrier's call is bound (its later calls settle a
    pending broadcast in the compiled call path where that is built); whether it is."""
    if warm:
        for _ in range(3):
            comm.barrier()
    call = comm._fast.barrier_call
    return call is not None and type(call.run).__name__ == "BoundCall"


def _disagreeing_receiver(comm, warm):
    """Rank 1 calls an allreduce of the same bytes where the others broadcast from 0."""
    bound = _bound_barrier(comm, warm)
    a = np.full(8, float(comm.rank))
    if comm.rank == 1:
        first = _outcome(lambda: comm.allreduce(a))
    else:
        first = _outcome(lambda: comm.broadcast(a, 0))
    second = _outcome(lambda: comm.barrier())
    return first, second, bound


@pytest.mark.parametrize("warm", [False, True])
def test_a_receiver_that_disagrees_is_named_on_the_root_at_its_next_call(warm):
    """Warm: the root's barrier is bound, and settles in C where the compiled call path is
    built: a disagreement there goes on in Python (``FastPath.settle_after``)."""
    (first0, second0, bound), (first1, _, _) = run_ranks(_disagreeing_receiver, 2, warm,
                                                         collective_timeout=20)
    assert bound == (warm and compiled.callpath.COMPILED)
    assert first1[0] == "CollectiveMismatch", first1
    assert first0 == ("no error", "")                 # the root did not wait
    kind, message = second0
    assert kind in ("CollectiveMismatch", "Aborted"), second0
    assert "broadcast" in message and "rank 1" in message, message


def _receiver_dies(comm, warm):
    bound = _bound_barrier(comm, warm)
    a = np.full(8, float(comm.rank))
    comm.broadcast(a, 0)
    if comm.rank == 1:
        os._exit(3)
    return _outcome(lambda: comm.barrier()), bound


@pytest.mark.parametrize("warm", [False, True])
def test_a_receiver_that_dies_after_the_broadcast_is_named_at_the_next_call(warm):
    outcomes = run_ranks(_receiver_dies, 2, warm, expect_failure=True, collective_timeout=30)
    kind, value = outcomes[0]
    assert kind == "ok", value
    (name, message), bound = value
    assert bound == (warm and compiled.callpath.COMPILED)
    assert name == "PeerLost" and "peer rank 1" in message, value


def _own_root_then(comm, then):
    """Every rank names itself root (each returns its own buffer), then ``then``; with
    "group finalize" the broadcast is a group's, and its parent's finalize finds it. Also
    what is left after: the channels still open, and what a second shrink (of a
    communicator that failed) makes."""
    on = comm.new_group(list(range(comm.size))) if then == "group finalize" else comm
    a = np.full(8, float(comm.rank))
    first = _outcome(lambda: on.broadcast(a, comm.rank))
    after = None
    if then == "generic":
        second = _outcome(lambda: comm.allreduce(np.ones(4), algo="ring"))
    elif then == "one-way":         # another one-way broadcast, of another size
        second = _outcome(lambda: comm.broadcast(np.zeros(100), 0))
    elif then == "split":
        second = _outcome(lambda: comm.split(0))
    elif then == "shrink":
        second = _outcome(lambda: comm.shrink())
        if comm.failed is not None:    # the broadcast failed it: a shrink now goes on
            shrunk = comm.shrink()
            b = np.full(8, float(shrunk.rank))
            shrunk.broadcast(b, 1)
            shrunk.finalize()
            after = b.tolist()
    else:
        second = _outcome(comm.finalize)
        after = comm.open_channels()
    return first, second, after


@pytest.mark.parametrize("then", ["generic", "one-way", "finalize", "split", "shrink",
                                  "group finalize"])
def test_own_roots_raise_at_the_next_call_whatever_it_is(then):
    """The disagreement a one-way broadcast cannot see is raised by the next call on the
    communicator, fast or generic, or, when there is none, by whatever ends it or makes
    another from it: its finalize (a group's: its parent's finalize, which still releases
    everything), a split, a shrink (a second one then goes on, the communicator having
    failed). The error names this rank and that broadcast (#1, 64 bytes)."""
    results = run_ranks(_own_root_then, 2, then, collective_timeout=20)
    for rank, (first, (kind, message), after) in enumerate(results):
        assert first == ("no error", "")
        assert kind in ("CollectiveMismatch", "Aborted"), (kind, message)
        if kind == "CollectiveMismatch":
            assert message.startswith(f"rank {rank}: ") and "broadcast #1" in message, message
            assert "(64 bytes)" in message and "disagree" in message, message
        if then == "shrink":
            assert after == [1.0] * 8
        elif "finalize" in then:
            assert not any(after.values()), after


def _late_broadcast(comm, dies):
    """The root's last call is a one-way broadcast; rank 1 calls it (``dies``: it exits
    before the call instead). The root's finalize waits for rank 1 to publish it, no
    longer than it lives."""
    a = np.full(8, 5.0) if comm.rank == 0 else np.zeros(8)
    if comm.rank == 1:
        comm._store.get("test/root-done", timeout=20)
        if dies:
            os._exit(0)
    comm.broadcast(a, 0)
    if comm.rank == 0:
        comm._store.set("test/root-done", b"1")
    return a.tolist(), _outcome(comm.finalize)


@pytest.mark.parametrize("dies", [False, True])
def test_finalize_after_a_broadcast_the_ranks_agree_on(dies):
    """A last broadcast that every rank called alike finalizes cleanly on every rank, the
    root's finalize having waited for a receiver that entered the call after it returned;
    a receiver that died before the call leaves the root's finalize to return, not to wait
    (the liveness checks of any wait)."""
    results = run_ranks(_late_broadcast, 2, dies, collective_timeout=20, timeout=60,
                        expect_failure=dies)
    if dies:
        kind, value = results[0]
        assert kind == "ok", value
        assert value == ([5.0] * 8, ("no error", "")), value
        return
    assert results == [([5.0] * 8, ("no error", ""))] * 2
