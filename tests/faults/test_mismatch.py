"""Mismatched collectives: DETAIL names who called what; without it, no silent hang forever."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

import pycoll
from pycoll import fastpath
from pycoll.testing import run_ranks

pytestmark = pytest.mark.timeout(60)
F32 = np.float32

MISMATCHES = {
    "collective": lambda c: (c.broadcast(np.ones(8, F32), 0) if c.rank == 1
                             else c.allreduce(np.ones(8, F32))),
    "count": lambda c: c.allreduce(np.ones(8 + (c.rank == 2), F32)),
    "dtype": lambda c: c.allreduce(np.ones(8, np.float64 if c.rank == 0 else F32)),
    "op": lambda c: c.allreduce(np.ones(8, F32), "max" if c.rank == 0 else "sum"),
    "root": lambda c: c.broadcast(np.ones(8, F32), c.rank % 2),
    "one rank one call ahead": lambda c: ([c.barrier()] if c.rank == 2 else []) and None
    or c.allreduce(np.ones(8, F32)),
}


def _detail_cases(comm):
    out = {}
    for name, call in MISMATCHES.items():
        sub = comm.new_group(list(range(comm.size)))     # a fresh communicator per case
        try:
            call(sub)
            out[name] = "no error"
        except pycoll.PycollError as e:
            out[name] = f"{type(e).__name__}: {e}"
        sub.finalize()
    sub = comm.new_group(list(range(comm.size)))
    a = np.ones(4, F32)
    sub.allreduce(a)              # matching calls pass the check
    sub.broadcast(a, 1)
    sub.send(a, (comm.rank + 1) % comm.size) if comm.rank == 0 else None   # p2p: not compared
    if comm.rank == 1:
        sub.recv(a, 0)
    sub.allreduce(a)
    out["matching"] = a.tolist()
    return out


def test_detail_names_ranks_and_calls(tmp_path):
    results = run_ranks(_detail_cases, 3, collective_timeout=20,
                        env={"PYCOLL_DEBUG": "DETAIL", "PYCOLL_TRACE_DIR": str(tmp_path)})
    for rank, out in enumerate(results):
        assert out.pop("matching") == [9.0] * 4
        for name, msg in out.items():
            assert msg.startswith("CollectiveMismatch:"), (rank, name, msg)
        assert ("ranks 0,2 called allreduce(dtype=float32, count=8, op=sum)" in out["collective"]
                and "rank 1 called broadcast(dtype=float32, count=8, root=0)" in out["collective"])
        assert "differ in: count (8 vs 9)" in out["count"]
        assert "differ in: dtype (float32 vs float64)" in out["dtype"]
        assert "differ in: op (max vs sum)" in out["op"]
        assert "differ in: root (0 vs 1)" in out["root"]
        assert "rank 2 called barrier" in out["one rank one call ahead"]


def _size_mismatch(comm):
    a = np.ones(1 << 10 if comm.rank else 1 << 11, dtype=F32)
    start = time.monotonic()
    try:
        comm.allreduce(a)
    except pycoll.PycollError as e:
        return type(e).__name__, time.monotonic() - start
    return "ok", 0.0


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_size_disagreement_raises_without_detail(transport):
    results = run_ranks(_size_mismatch, 3, collective_timeout=30,
                        env={"PYCOLL_TRANSPORTS": transport})
    kinds = {k for k, _ in results}
    # the element count is part of every message's signature: a CollectiveMismatch now,
    # before any size comparison
    assert "CollectiveMismatch" in kinds and kinds <= {"CollectiveMismatch", "Aborted",
                                                       "MessageSizeMismatch", "PeerLost"}, results
    assert all(t < 15 for _, t in results), results


def _different_collectives(comm):
    a = np.ones(64, dtype=F32)
    start = time.monotonic()
    try:
        if comm.rank == 0:
            comm.broadcast(a, 0)
        else:
            comm.allreduce(a)
        comm.allreduce(a)
        return "ok", time.monotonic() - start
    except pycoll.PycollError as e:
        return type(e).__name__, time.monotonic() - start


def test_different_collectives_never_hang_forever():
    """Without DETAIL, broadcast against a 2-rank allreduce moves the same bytes; every
    collective call's tag names the collective and its signature, so the messages never
    match and the ranks raise CollectiveMismatch instead of returning wrong data."""
    results = run_ranks(_different_collectives, 2, collective_timeout=2.0,
                        expect_failure=True, timeout=40)
    for kind, value in results:
        assert kind == "ok", value
        name, elapsed = value
        assert name in ("CollectiveMismatch", "Aborted"), results
        assert elapsed < 10, results
    assert all(v[0] != "ok" for _, v in results), results


def _different_collectives_4(comm):
    return _different_collectives(comm)


def test_different_collectives_on_4_ranks_end_with_an_error():
    results = run_ranks(_different_collectives_4, 4, collective_timeout=2.0,
                        expect_failure=True, timeout=40)
    names = [v[0] for _, v in results]
    assert all(t < 10 for _, (_, t) in results), results
    assert any(n != "ok" for n in names), results


# -- without DETAIL: the signature in every message's tag -----------------------------------
SILENT_BEFORE = {
    # each of these returned different, wrong answers on every rank, exit code 0, before
    # messages carried their call's signature (issue: hardening, item 1)
    "dtype float32 vs int32": lambda c: c.allreduce(np.ones(8, np.int32 if c.rank else F32)),
    "op sum vs max": lambda c: c.allreduce(np.ones(8, F32), "max" if c.rank == 0 else "sum"),
    "premul factor": lambda c: c.allreduce(np.ones(8, F32),
                                           pycoll.ReduceOp.premul_sum(1.0 + c.rank)),
    "float16[8] vs float32[4]": lambda c: c.allreduce(np.ones(8, np.float16) if c.rank
                                                      else np.ones(4, F32)),
    "broadcast roots": lambda c: (c.broadcast(np.full(8, c.rank, F32), c.rank % 2),
                                  c.allreduce(np.ones(2, F32))),
    "scatter roots": lambda c: (c.scatter(np.zeros(2, F32), np.ones(2 * c.size, F32),
                                          c.rank % 2), c.allreduce(np.ones(2, F32))),
    "alltoall float32 vs int32": lambda c: c.alltoall(
        np.zeros(4 * c.size, np.int32 if c.rank else F32),
        np.ones(4 * c.size, np.int32 if c.rank else F32)),
    "reduce roots": lambda c: (c.reduce(np.ones(8, F32), c.rank % 2),
                               c.allreduce(np.ones(2, F32))),
}


def _silent_case(comm, name):
    start = time.monotonic()
    try:
        SILENT_BEFORE[name](comm)
        return "no error", "", 0.0
    except pycoll.PycollError as e:
        return type(e).__name__, str(e), time.monotonic() - start


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("name", list(SILENT_BEFORE))
def test_disagreeing_arguments_raise_collective_mismatch(name, size, transport):
    results = run_ranks(_silent_case, size, name, collective_timeout=5, timeout=50,
                        env={"PYCOLL_TRANSPORTS": transport})
    kinds = [k for k, _, _ in results]
    # roots too: a rooted call returns on no rank before every rank agreed (agreement.py);
    # reduce roots (both only receive) and shm broadcast/scatter roots timed out before
    assert "CollectiveMismatch" in kinds, results
    for kind, message, elapsed in results:
        assert kind in ("CollectiveMismatch", "Aborted"), results
        assert "CollectiveMismatch" in message or kind == "CollectiveMismatch", results
        assert "disagree" in message and elapsed < 10, results
    seen = [m for k, m, _ in results if k == "CollectiveMismatch"][0]
    assert "This rank called" in seen and "signature" in seen, seen


def _agreeing_calls(comm):
    """Calls that agree, in every form the signature covers, never raise."""
    a = np.ones(8, F32)
    comm.allreduce(a, pycoll.ReduceOp.premul_sum(0.5))
    comm.broadcast(a, 1)
    comm.reduce(a, 1, "max")
    comm.alltoall(np.zeros(2 * comm.size, F32), np.ones(2 * comm.size, F32))
    comm.allreduce_coalesced([np.ones(3, F32), np.ones(2, np.int64)])
    comm.allgatherv(np.ones(comm.rank, F32))
    return a.tolist()


def test_agreeing_calls_pass():
    results = run_ranks(_agreeing_calls, 3)
    assert results[0] == results[1] == results[2]


def test_launcher_exits_nonzero_on_a_mismatch(tmp_path):
    import subprocess
    import sys
    script = tmp_path / "mm.py"
    script.write_text("import numpy as np, pycoll\n"
                      "c = pycoll.init()\n"
                      "a = np.ones(8, np.int32 if c.rank else np.float32)\n"
                      "c.allreduce(a)\n"
                      "print('result', a[:2])\n")
    proc = subprocess.run([sys.executable, "-m", "pycoll.run", "-n", "2", "--timeout", "30",
                           str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "CollectiveMismatch" in proc.stdout + proc.stderr
    assert "result" not in proc.stdout


_LAST_BROADCAST = ("import numpy as np, pycoll\n"
                   "c = pycoll.init()\n"
                   "a = np.full(8, float(c.rank))\n"
                   "c.broadcast(a, {root})\n"
                   "print('returned', c.rank, a[0], flush=True)\n")


@pytest.mark.skipif(not fastpath.probe_limit(), reason="needs the fast path (numba)")
@pytest.mark.parametrize("agree", [False, True])
def test_a_disagreement_found_by_the_finalize_at_exit_fails_the_job(tmp_path, agree):
    """The last call, a one-way broadcast (shm's fast path), returns on both ranks before
    any rank can see that each named itself the root; the program never calls finalize, so
    the one at interpreter exit finds it. That used to end as Python's "Exception ignored in
    atexit callback" with exit code 0, and the launcher reported success. A broadcast the
    ranks agree about still exits 0."""
    import subprocess
    import sys
    script = tmp_path / "last.py"
    script.write_text(_LAST_BROADCAST.format(root="0" if agree else "c.rank"))
    proc = subprocess.run([sys.executable, "-m", "pycoll.run", "-n", "2", "--timeout", "30",
                           str(script)], capture_output=True, text=True, timeout=90,
                          env={**os.environ, "PYCOLL_TRANSPORTS": "shm"})
    out = proc.stdout + proc.stderr
    assert out.count("returned") == 2, out      # the calls themselves returned
    if agree:
        assert proc.returncode == 0, out
        assert "Error" not in out, out
        return
    assert proc.returncode != 0, out
    assert "CollectiveMismatch" in out and "broadcast #1" in out, out
    assert "finalize at exit failed" in out, out


# -- an empty buffer against a non-empty one ---------------------------------------------------
def _one_rank_empty(comm, name):
    """Rank 0 passes empty buffers, the others 8 elements. ``algo="ring"`` keeps the
    allreduce off shm's fast path (which compares its slots' signatures itself)."""
    n = 0 if comm.rank == 0 else 8
    calls = {
        "allreduce": lambda: comm.allreduce(np.ones(n, F32)),
        "allreduce ring": lambda: comm.allreduce(np.ones(n, F32), algo="ring"),
        "allgather": lambda: comm.allgather(np.zeros(n * comm.size, F32), np.ones(n, F32)),
        "reduce_scatter": lambda: comm.reduce_scatter(np.zeros(n, F32),
                                                      np.ones(n * comm.size, F32)),
        "allreduce_coalesced": lambda: comm.allreduce_coalesced([np.ones(n, F32)]),
    }
    try:
        calls[name]()
        return "no error", ""
    except pycoll.PycollError as e:
        return type(e).__name__, str(e)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("name", ["allreduce", "allreduce ring", "allgather", "reduce_scatter",
                                  "allreduce_coalesced"])
def test_an_empty_buffer_against_a_non_empty_one_is_a_mismatch_on_every_rank(name, transport):
    """An empty call's body moves nothing: the rank with the empty buffer returned at once
    and exited, and over tcp the rank with data reported that peer lost (PeerLost), not the
    disagreement. Every rank now takes part in an agreement round and names it."""
    results = run_ranks(_one_rank_empty, 2, name, collective_timeout=10, timeout=50,
                        env={"PYCOLL_TRANSPORTS": transport})
    for kind, message in results:
        assert kind == "CollectiveMismatch", results
        assert name.split()[0] in message and "disagree" in message, results


def _empty_everywhere(comm):
    """Calls that agree on moving nothing, and an alltoall where one rank sends nothing
    (its ranks may move different amounts), still pass."""
    e = np.zeros(0, F32)
    comm.allreduce(e, algo="ring")
    comm.allgather(np.zeros(0, F32), e)
    comm.reduce_scatter(np.zeros(0, F32), e)
    comm.allreduce_coalesced([np.zeros(0, F32)])
    comm.broadcast(e, 1)
    moved = comm.size - 1 if comm.rank else 0
    out, inp = np.zeros(moved, F32), np.full(moved, comm.rank, F32)
    splits = [0] + [1] * (comm.size - 1) if comm.rank else [0] * comm.size
    comm.alltoall(out, inp, splits, splits)
    a = np.ones(2, F32)
    comm.allreduce(a)
    return out.tolist(), a.tolist()


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_calls_that_agree_on_moving_nothing_pass(transport):
    results = run_ranks(_empty_everywhere, 3, collective_timeout=20,
                        env={"PYCOLL_TRANSPORTS": transport})
    assert results[0] == ([], [3.0, 3.0])
    assert results[1] == results[2] == ([1.0, 2.0], [3.0, 3.0])
