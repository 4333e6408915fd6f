"""Mismatched collectives: DETAIL names who called what; without it, no silent hang forever."""
from __future__ import annotations

import time

import numpy as np
import pytest

import pycoll
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
                        env={"PYCOLL_TRANSPORT": transport})
    kinds = {k for k, _ in results}
    assert "MessageSizeMismatch" in kinds and kinds <= {"MessageSizeMismatch", "Aborted",
                                                        "PeerLost"}, results
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
    collective call carries its own (sequence, collective) tag, so the messages never match
    and the ranks raise instead of returning wrong data, in time."""
    results = run_ranks(_different_collectives, 2, collective_timeout=2.0,
                        expect_failure=True, timeout=40)
    for kind, value in results:
        assert kind == "ok", value
        name, elapsed = value
        assert name in ("ok", "CollectiveTimeout", "Aborted", "PeerLost",
                        "MessageSizeMismatch"), results
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
