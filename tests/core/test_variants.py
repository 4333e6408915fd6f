"""The MPI/NCCL variants (issue 43, part 4): out-of-place allreduce/reduce/broadcast,
reduce_scatter_v, gatherv, scatterv and persistent plans of every collective, each against a
numpy reference, with real ranks over shm and tcp; bad arguments refused on every rank before
a sequence number is taken (nothing sent), disagreeing counts raised as CollectiveMismatch."""
from __future__ import annotations

import numpy as np
import pytest

import pycoll
from pycoll.testing import run_ranks

pytestmark = pytest.mark.timeout(120)
F32 = np.float32
TRANSPORTS = ["shm", "tcp"]


def _inputs(rank, n, dtype=F32):
    return (np.arange(n, dtype=dtype) + 10 * rank).astype(dtype)


def _out_of_place(comm):
    n, me, p = 1000, comm.rank, comm.size
    ref = sum(_inputs(r, n) for r in range(p))
    got = {}
    for algo in (None, "ring"):                  # the fast path (shm) and an algorithm
        t = _inputs(me, n)
        o = np.full(n, -1, F32)
        comm.allreduce(t, out=o, algo=algo)
        got[f"allreduce {algo}"] = (np.array_equal(o, ref), np.array_equal(t, _inputs(me, n)))
    # out= on a kind the fast path has bound (by the in-place call before it): the method's
    # front (fastpath/callpath.py) hands it to the classifying call, never the bound one
    comm.allreduce(_inputs(me, n))
    t, o = _inputs(me, n), np.full(n, -1, F32)
    comm.allreduce(t, out=o)
    got["allreduce bound kind"] = (np.array_equal(o, ref), np.array_equal(t, _inputs(me, n)))
    t, o = _inputs(me, n), np.full(n, -1, F32)
    w = comm.allreduce(t, "max", out=o, async_op=True)
    got["allreduce async"] = (w.result(30) is o and np.array_equal(o, _inputs(p - 1, n)),
                              np.array_equal(t, _inputs(me, n)))
    t = _inputs(me, n)
    comm.allreduce(t, out=t)                                 # out=tensor: in place
    got["allreduce in place"] = (np.array_equal(t, ref), True)
    t, o = _inputs(me, 7), np.full(7, -1, F32)
    comm.allreduce(t, out=o, deterministic=True)
    got["allreduce deterministic"] = (np.array_equal(o, sum(_inputs(r, 7) for r in range(p))),
                                      np.array_equal(t, _inputs(me, 7)))
    # reduce: the root's out holds the result; every rank's tensor is unchanged
    root = p - 1
    t, o = _inputs(me, n), np.full(n, -1, F32)
    comm.reduce(t, root, out=o)
    got["reduce"] = (me != root or np.array_equal(o, ref), np.array_equal(t, _inputs(me, n)))
    t = _inputs(me, n)
    comm.reduce(t, 0, out=None if me else np.zeros(n, F32))  # a non-root may pass None
    got["reduce none elsewhere"] = (True, me != 0 or np.array_equal(t, _inputs(me, n)))
    # broadcast: data into out on every rank; the root's tensor unchanged
    for algo in (None, "binomial"):
        t, o = _inputs(me, n), np.full(n, -1, F32)
        comm.broadcast(t if me == 1 else (None if me == 2 else t), 1, out=o, algo=algo)
        got[f"broadcast {algo}"] = (np.array_equal(o, _inputs(1, n)),
                                    np.array_equal(t, _inputs(me, n)))
    comm.broadcast(_inputs(me, n), 1)                        # the kind bound, as above
    t, o = _inputs(me, n), np.full(n, -1, F32)
    comm.broadcast(t, 1, out=o)
    got["broadcast bound kind"] = (np.array_equal(o, _inputs(1, n)),
                                   np.array_equal(t, _inputs(me, n)))
    e = np.zeros(0, F32)
    comm.allreduce(e, out=np.zeros(0, F32))
    return got


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("size", [2, 3])
def test_out_of_place_against_numpy(size, transport):
    for rank, got in enumerate(run_ranks(_out_of_place, size,
                                         env={"PYCOLL_TRANSPORTS": transport})):
        for name, (result_ok, input_kept) in got.items():
            assert result_ok and input_kept, (rank, name, result_ok, input_kept)


def _out_after_finalize(comm):
    """out= of a kind the fast path runs, on a finalized communicator: refused, and out
    keeps its bytes (the input is copied into it only once the call is claimed)."""
    n = 64
    comm.allreduce(np.ones(n, F32))
    comm.broadcast(np.ones(n, F32), 0)
    comm.finalize()
    got = {}
    for name, call in (("allreduce", lambda t, o: comm.allreduce(t, out=o)),
                       ("broadcast", lambda t, o: comm.broadcast(t, 0, out=o))):
        t, o = _inputs(comm.rank, n), np.full(n, -1, F32)
        try:
            call(t, o)
            got[name] = "NO ERROR"
        except pycoll.PycollError as e:
            got[name] = "out kept" if (o == -1).all() else f"out overwritten ({e})"
    return got


def test_refused_out_of_place_call_leaves_out_untouched():
    for rank, got in enumerate(run_ranks(_out_after_finalize, 2,
                                         env={"PYCOLL_TRANSPORTS": "shm"})):
        assert got == {"allreduce": "out kept", "broadcast": "out kept"}, (rank, got)


def _bad_out(comm):
    """Every rank passes the same bad out: refused before a sequence number is taken."""
    n = 8
    t = _inputs(comm.rank, n)
    big = np.zeros(2 * n, F32)
    cases = {
        "shape": lambda: comm.allreduce(t, out=np.zeros(n + 1, F32)),
        "2-d shape": lambda: comm.allreduce(t, out=np.zeros((2, 4), F32)),
        "dtype": lambda: comm.allreduce(t, out=np.zeros(n, np.float64)),
        "read-only": lambda: comm.allreduce(t, out=np.frombuffer(b"\0" * 32, F32)),
        "overlap": lambda: comm.allreduce(big[:n], out=big[n // 2:n // 2 + n]),
        "not a buffer": lambda: comm.allreduce(t, out=[0.0] * n),
        "reduce shape": lambda: comm.reduce(t, 0, out=np.zeros(n - 1, F32)),
        "broadcast dtype": lambda: comm.broadcast(t, 0, out=np.zeros(n, np.int32)),
        "broadcast root without tensor": lambda: comm.broadcast(None, comm.rank,
                                                                out=np.zeros(n, F32)),
    }
    out = {}
    for name, call in cases.items():
        seq = comm.seq
        try:
            call()
            out[name] = "NO ERROR"
        except (ValueError, TypeError) as e:
            out[name] = f"{type(e).__name__}: {e}" + (" AFTER seq" if comm.seq != seq else "")
    a = np.ones(3, F32)
    comm.allreduce(a)
    out["after"] = a.tolist()
    return out


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_bad_out_refused_on_every_rank_before_anything_moves(transport):
    for rank, out in enumerate(run_ranks(_bad_out, 3, env={"PYCOLL_TRANSPORTS": transport})):
        assert out.pop("after") == [3.0] * 3
        for name, msg in out.items():
            assert msg.startswith(("InvalidArgument", "InvalidDtype")), (rank, name, msg)
            assert "AFTER" not in msg and f"rank {rank}" in msg, (rank, name, msg)
        assert "shape" in out["shape"] and "overlaps" in out["overlap"], out


# -- uneven counts --------------------------------------------------------------------------
def _counts(p):
    """Uneven, with zeros: rank 0 gets none, the last rank the most."""
    return [0 if r == 0 else 2 * r + 1 for r in range(p)]


def _uneven(comm):
    p, me = comm.size, comm.rank
    counts = _counts(p)
    starts = np.cumsum([0] + counts).tolist()
    total = starts[-1]
    got = {}
    # reduce_scatter_v: 1-D, and 2-D rows of 3; every option of reduce_scatter
    for name, kw in (("sum", {}), ("deterministic", {"deterministic": True}),
                     ("max ring", {"op": "max", "algo": "ring"}), ("async", {"async_op": True}),
                     ("checked", {"integrity": True})):
        op = kw.pop("op", "sum")
        inp = _inputs(me, total)
        out = np.full(counts[me], -1, F32)
        w = comm.reduce_scatter_v(out, inp, counts, op, **kw)
        if w is not None:
            assert w.result(30) is out
        full = (sum(_inputs(r, total) for r in range(p)) if op == "sum"
                else _inputs(p - 1, total))
        got[f"reduce_scatter_v {name}"] = (np.array_equal(out, full[starts[me]:starts[me + 1]])
                                           and np.array_equal(inp, _inputs(me, total)))
    inp = np.arange(total * 3, dtype=np.int64).reshape(total, 3) * (me + 1)
    out = np.zeros((counts[me], 3), np.int64)
    comm.reduce_scatter_v(out, inp, counts)
    want = np.arange(total * 3).reshape(total, 3) * sum(range(1, p + 1))
    got["reduce_scatter_v rows"] = np.array_equal(out, want[starts[me]:starts[me + 1]])
    zero = np.zeros(0, F32)
    comm.reduce_scatter_v(zero, np.zeros(0, F32), [0] * p)       # nothing anywhere
    # gatherv / scatterv at every root, 1-D and 2-D
    for root in range(p):
        mine = np.arange(counts[me], dtype=F32) + 100 * me
        out = np.full(total, -1, F32) if me == root else None
        comm.gatherv(out, mine, counts, root)
        if me == root:
            want = np.concatenate([np.arange(c, dtype=F32) + 100 * r
                                   for r, c in enumerate(counts)])
            got[f"gatherv root {root}"] = np.array_equal(out, want)
        big = np.arange(total * 2, dtype=np.int32).reshape(total, 2) if me == root else None
        part = np.full((counts[me], 2), -1, np.int32)
        comm.scatterv(part, big, counts, root, integrity=root == 0)
        got[f"scatterv root {root}"] = np.array_equal(
            part, np.arange(total * 2).reshape(total, 2)[starts[me]:starts[me + 1]])
    out = np.full(total, -1, F32) if me == 0 else None
    w = comm.gatherv(out, np.full(counts[me], me, F32), counts, 0, async_op=True,
                     integrity=True)
    w.wait(30)
    got["gatherv async checked"] = me != 0 or np.array_equal(
        out, np.repeat(np.arange(p, dtype=F32), counts))
    return got


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("size", [2, 4])
def test_uneven_variants_against_numpy(size, transport):
    for rank, got in enumerate(run_ranks(_uneven, size, env={"PYCOLL_TRANSPORTS": transport})):
        assert all(got.values()), (rank, {k: v for k, v in got.items() if not v})


def _bad_counts(comm):
    """Every rank passes the same bad arguments: refused before a sequence number."""
    p, me = comm.size, comm.rank
    counts = _counts(p)
    total = sum(counts)
    mine = np.zeros(counts[me], F32)
    big = np.zeros(total, F32)
    cases = {
        "rsv counts do not add up": lambda: comm.reduce_scatter_v(
            mine, np.zeros(total + 1, F32), counts),
        "rsv counts too short": lambda: comm.reduce_scatter_v(mine, big, counts[:-1]),
        "rsv negative count": lambda: comm.reduce_scatter_v(
            mine, big, [-1, counts[1] + 1] + counts[2:]),
        "rsv output not its count": lambda: comm.reduce_scatter_v(
            np.zeros(counts[me] + 1, F32), big, counts),
        "rsv dtype": lambda: comm.reduce_scatter_v(mine.astype(np.float64), big, counts),
        "gatherv input not its count": lambda: comm.gatherv(
            big, np.zeros(counts[me] + 1, F32), counts, 0),
        # a root's own buffer: every rank names itself root, so that every rank refuses
        "gatherv output too small": lambda: comm.gatherv(np.zeros(total - 1, F32), mine,
                                                         counts, me),
        "gatherv counts not ints": lambda: comm.gatherv(big, mine, [0.5] * p, 0),
        "gatherv root": lambda: comm.gatherv(big, mine, counts, p),
        "scatterv output not its count": lambda: comm.scatterv(
            np.zeros(counts[me] + 2, F32), big, counts, 0),
        "scatterv input dtype": lambda: comm.scatterv(mine, np.zeros(total, np.int32),
                                                      counts, me),
    }
    out = {}
    for name, call in cases.items():
        seq = comm.seq
        try:
            call()
            out[name] = "NO ERROR"
        except (ValueError, TypeError) as e:
            out[name] = f"{type(e).__name__}: {e}" + (" AFTER seq" if comm.seq != seq else "")
    a = np.ones(3, F32)
    comm.allreduce(a)
    out["after"] = a.tolist()
    return out


def test_bad_counts_refused_before_anything_moves():
    for rank, out in enumerate(run_ranks(_bad_counts, 3)):
        assert out.pop("after") == [3.0] * 3
        for name, msg in out.items():
            assert msg.startswith(("InvalidArgument", "InvalidDtype")), (rank, name, msg)
            assert "AFTER" not in msg and f"rank {rank}" in msg, (rank, name, msg)


DISAGREE = {
    # each rank's own buffers fit its own counts; the counts differ between ranks. Returns
    # the buffer the call writes on this rank
    "reduce_scatter_v": lambda c, counts, out: c.reduce_scatter_v(
        out[:counts[c.rank]], np.ones(sum(counts), F32), counts),
    "gatherv": lambda c, counts, out: c.gatherv(
        out[:sum(counts)], np.ones(counts[c.rank], F32), counts, 0),
    "scatterv": lambda c, counts, out: c.scatterv(
        out[:counts[c.rank]], np.ones(sum(counts), F32), counts, 0),
}


def _disagreeing_counts(comm, name):
    """Rank 1 moves one row between two other ranks' blocks: every rank raises, and rank
    1's output (whose messages nobody matches) is untouched."""
    p = comm.size
    counts = _counts(p)
    if comm.rank == 1:
        counts[0] += 1
        counts[2] -= 1
    out = np.full(64, -1, F32)
    try:
        DISAGREE[name](comm, counts, out)
        return "no error", "", True
    except pycoll.PycollError as e:
        return type(e).__name__, str(e), bool((out == -1).all())


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("name", list(DISAGREE))
def test_disagreeing_counts_raise_collective_mismatch(name, transport):
    results = run_ranks(_disagreeing_counts, 3, name, collective_timeout=10, timeout=60,
                        env={"PYCOLL_TRANSPORTS": transport})
    kinds = [k for k, _, _ in results]
    assert "CollectiveMismatch" in kinds, results
    assert set(kinds) <= {"CollectiveMismatch", "Aborted"}, results
    assert results[1][2], "the disagreeing rank's output was written"
    if name == "reduce_scatter_v":         # written only once the reduction completed
        assert all(untouched for _, _, untouched in results), results


# -- persistent plans of every collective ---------------------------------------------------
def _plans_of_every_collective(comm):
    p, me = comm.size, comm.rank
    n = 6
    t = np.zeros(n, F32)
    out = np.zeros(n, F32)
    big = np.zeros(n * p, F32)
    part = np.zeros(n, F32)
    a2a_in, a2a_out = np.zeros(n * p, F32), np.zeros(n * p, F32)
    g_out = np.zeros(n * p, F32)
    counts = _counts(p)
    v_in, v_out, v_all = np.zeros(sum(counts), F32), np.zeros(counts[me], F32), np.zeros(
        sum(counts), F32)
    starts = np.cumsum([0] + counts)
    plans = {
        "allreduce": comm.allreduce_init(t, "max"),
        "allreduce out": comm.allreduce_init(part, out=out),
        "broadcast": comm.broadcast_init(t, p - 1),
        "reduce": comm.reduce_init(t, 0, "sum", out=out),
        "allgather": comm.allgather_init(big, part),
        "reduce_scatter": comm.reduce_scatter_init(part, big),
        "alltoall": comm.alltoall_init(a2a_out, a2a_in),
        "gather": comm.gather_init(g_out, part, 1),
        "scatter": comm.scatter_init(part, big, 1),
        "barrier": pycoll.barrier_init(),
        "reduce_scatter_v": comm.reduce_scatter_v_init(v_out, v_in, counts),
        "gatherv": comm.gatherv_init(v_all, v_out, counts, 0),
        "scatterv": comm.scatterv_init(v_out, v_in, counts, p - 1),
    }
    assert comm.seq == 0, "a plan is not a call"
    ok = {name: True for name in plans}
    for step in range(3):
        def fill(x, r=me, step=step):
            x[:] = np.arange(x.size, dtype=F32) + 100 * r + step
            return x.copy()

        def expect(name, got, want, ok=ok):
            ok[name] = ok[name] and np.array_equal(got, want)

        mine = [fill(np.zeros(n, F32), r) for r in range(p)]
        fill(t)
        plans["allreduce"].run()
        expect("allreduce", t, mine[p - 1])
        fill(part)
        plans["allreduce out"]()                 # __call__
        expect("allreduce out", out, sum(mine))
        expect("allreduce out", part, mine[me])
        fill(t)
        plans["broadcast"].start().wait(30)
        expect("broadcast", t, mine[p - 1])
        fill(t)
        plans["reduce"].run()
        if me == 0:
            expect("reduce", out, sum(mine))
        expect("reduce", t, mine[me])
        fill(part)
        plans["allgather"].run()
        expect("allgather", big, np.concatenate(mine))
        big[:] = np.concatenate([mine[me]] * p)
        plans["reduce_scatter"].run()
        expect("reduce_scatter", part, sum(mine))
        a2a_in[:] = np.arange(n * p, dtype=F32) + 1000 * me + step
        plans["alltoall"].start().wait(30)
        expect("alltoall", a2a_out, np.concatenate(
            [(np.arange(n * p, dtype=F32) + 1000 * r + step)[me * n:(me + 1) * n]
             for r in range(p)]))
        fill(part)
        plans["gather"].run()
        if me == 1:
            expect("gather", g_out, np.concatenate(mine))
        big[:] = np.arange(n * p, dtype=F32) + step
        plans["scatter"].run()
        expect("scatter", part, (np.arange(n * p, dtype=F32) + step)[me * n:(me + 1) * n])
        plans["barrier"].run()
        v_in[:] = np.arange(v_in.size, dtype=F32) * (me + 1) + step
        plans["reduce_scatter_v"].run()
        full = sum(np.arange(v_in.size, dtype=F32) * (r + 1) + step for r in range(p))
        expect("reduce_scatter_v", v_out, full[starts[me]:starts[me + 1]])
        v_out[:] = me + step
        plans["gatherv"].start().wait(30)
        if me == 0:
            expect("gatherv", v_all, np.repeat(np.arange(p, dtype=F32) + step, counts))
        v_in[:] = np.arange(v_in.size, dtype=F32) + step
        plans["scatterv"].run()
        expect("scatterv", v_out, v_in[starts[me]:starts[me + 1]])
    paths = {name: plan.path for name, plan in plans.items()}
    return ok, paths, comm.seq


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("size", [2, 3])
def test_plans_of_every_collective(size, transport):
    for rank, (ok, paths, seq) in enumerate(run_ranks(
            _plans_of_every_collective, size, env={"PYCOLL_TRANSPORTS": transport})):
        assert all(ok.values()), (rank, ok)
        assert seq == 3 * 13, seq             # one call per run, nothing else
        assert all(isinstance(v, str) and v for v in paths.values()), paths
        if transport == "shm":
            assert paths["allreduce"] == "fastpath" and paths["barrier"] == "fastpath", paths


def _planning_beside_a_call(comm):
    """A plan made while another thread calls a collective on the same communicator: the
    planning must not change the communicator that thread uses. The plan's counts are read
    while it is planned; reading them runs an allreduce on a second thread (each rank the
    same, so it completes) and waits for it, in the middle of the planning."""
    import threading

    p, me = comm.size, comm.rank
    got = []

    def call():
        x = np.full(100, me + 1, F32)
        try:
            comm.allreduce(x)
            got.append(bool(np.all(x == p * (p + 1) / 2)))
        except BaseException as e:          # (Planned under the old flag on the communicator)
            got.append(repr(e))

    class Counts:
        def __iter__(self):
            t = threading.Thread(target=call)
            t.start()
            t.join(60)
            return iter([1] * p)

    v_in, v_out = np.arange(p, dtype=F32), np.zeros(1, F32)
    plan = comm.reduce_scatter_v_init(v_out, v_in, Counts())
    plan.run()                          # (the counts read again, the allreduce run again)
    return got, float(v_out[0]), comm.seq


def test_planning_leaves_the_communicator_to_other_threads():
    for rank, (ok, v, seq) in enumerate(run_ranks(_planning_beside_a_call, 2,
                                                  env={"PYCOLL_TRANSPORTS": "shm"})):
        assert ok == [True, True], (rank, ok)
        assert v == 2 * rank and seq == 3, (rank, v, seq)


def _plan_refusals(comm):
    """A plan that a call would refuse is refused at *_init, on every rank, nothing sent;
    a buffer replaced after *_init is refused at the run."""
    p = comm.size
    bad = {
        "broadcast root": lambda: comm.broadcast_init(np.zeros(4, F32), p),
        "allgather size": lambda: comm.allgather_init(np.zeros(4 * p + 1, F32),
                                                       np.zeros(4, F32)),
        "reduce_scatter op": lambda: comm.reduce_scatter_init(np.zeros(4, F32),
                                                               np.zeros(4 * p, F32), "band"),
        "alltoall splits": lambda: comm.alltoall_init(np.zeros(p, F32), np.zeros(p, F32),
                                                       [2] * p, [1] * p),
        "gather algo": lambda: comm.gather_init(np.zeros(4 * p, F32), np.zeros(4, F32),
                                                algo="magic"),
        "scatter async": lambda: comm.scatter_init(np.zeros(4, F32), np.zeros(4 * p, F32),
                                                   async_op=True),
        "reduce out": lambda: comm.reduce_init(np.zeros(4, F32), out=np.zeros(5, F32)),
    }
    got = {}
    for name, call in bad.items():
        try:
            call()
            got[name] = "NO ERROR"
        except (ValueError, TypeError) as e:
            got[name] = f"{type(e).__name__}: {e}"
    seq = comm.seq
    part = np.zeros(4, F32)
    big = np.zeros(4 * p, F32)
    plan = comm.allgather_init(big, part)
    plan.run()
    big.resize(8 * p, refcheck=False)            # reallocated: the plan must refuse
    try:
        plan.run()
        got["replaced"] = "NO ERROR"
    except pycoll.InvalidArgument as e:
        got["replaced"] = f"InvalidArgument: {e}"
    got["seq"] = comm.seq - seq
    return got


def test_plan_refusals_on_every_rank():
    for rank, got in enumerate(run_ranks(_plan_refusals, 3)):
        assert got.pop("seq") == 1, got             # only the one good run was numbered
        for name, msg in got.items():
            assert msg.startswith(("InvalidArgument", "InvalidDtype")), (rank, name, msg)
            assert f"rank {rank}" in msg, (rank, name, msg)
        assert "allgather plan" in got["replaced"] and "no longer holds" in got["replaced"]


def _flipped(comm, case):
    """One bit flipped in what rank 1 (reduce_scatter_v) or the root 0 (gatherv) receives
    from the other rank: integrity=True raises DataCorruption on both ranks."""
    from pycoll.transports import bitflip
    hook = bitflip.flipper()
    assert hook is not None
    counts = [3, 5]
    rng = np.random.default_rng(comm.rank)
    if case == "reduce_scatter_v":
        if comm.rank == 1:      # the ring's one message to rank 1 is its own block
            hook.arm(peer=0, nth=1, itemsize=4, bits=range(20, 32), seed=3)
        call = lambda: comm.reduce_scatter_v(  # noqa: E731
            np.zeros(counts[comm.rank], F32), rng.uniform(0.5, 2, 8).astype(F32), counts,
            algo="ring", integrity=True)
    else:
        if comm.rank == 0:
            hook.arm(peer=1, nth=1, itemsize=1, bits=range(8), seed=3)
        call = lambda: comm.gatherv(  # noqa: E731
            np.zeros(8, F32), rng.uniform(0.5, 2, counts[comm.rank]).astype(F32), counts, 0,
            integrity=True)
    try:
        call()
        return "ok", len(hook.fired)
    except pycoll.DataCorruption as e:
        return "DataCorruption " + e.collective, len(hook.fired)


@pytest.mark.parametrize("case", ["reduce_scatter_v", "gatherv"])
def test_integrity_catches_a_flipped_bit(case):
    results = run_ranks(_flipped, 2, case, env={"PYCOLL_TRANSPORTS": "tcp",
                                                "PYCOLL_TEST_FLIP": "1"})
    assert sum(fired for _, fired in results) == 1, results
    assert all(kind == f"DataCorruption {case}" for kind, _ in results), results


def test_disagreeing_counts_named_under_detail(tmp_path):
    results = run_ranks(_disagreeing_counts, 3, "reduce_scatter_v", collective_timeout=10,
                        timeout=60, env={"PYCOLL_DEBUG": "DETAIL",
                                         "PYCOLL_TRACE_DIR": str(tmp_path)})
    for kind, message, _ in results:
        assert kind == "CollectiveMismatch", results
        assert "differ in: count ([0, 3, 5] vs [1, 3, 4])" in message, message
