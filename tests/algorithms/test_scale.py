"""Algorithms, selection and the bootstrap at 256 and 1024 ranks (threads, in-process transport).

Each rank checks its own result against the closed-form answer; the algorithm the cost model
picked is returned so the test also shows that every rank chose the same one.

Every collective runs at 256 ranks, alltoall both with the cost model's choice (pairwise or
scattered: p - 1 messages per rank) and with Bruck's algorithm (log2 p rounds, equal blocks,
opt-in). At 1024 ranks, allreduce alone: it proves the bootstrap and the agreement on the
chosen algorithm at that size, and 1024 threads share one interpreter lock, so each further
collective there would cost the suite minutes without exercising another code path.
"""
from __future__ import annotations

import numpy as np
import pytest

from pycoll.testing import run_threads

COUNT = 2   # elements per rank block: latency-bound, as a 1024-rank small collective is


def _collective(comm, name, algo=None):
    r, p, n = comm.rank, comm.size, COUNT
    if name == "allreduce":
        a = np.full(n, r, np.int64)
        comm.allreduce(a)
        ok = bool((a == p * (p - 1) // 2).all())
        nbytes = a.nbytes
    elif name == "broadcast":
        a = np.full(n, r, np.int64)
        comm.broadcast(a, root=p - 1)
        ok = bool((a == p - 1).all())
        nbytes = a.nbytes
    elif name == "allgather":
        out = np.empty(n * p, np.int64)
        comm.allgather(out, np.full(n, r, np.int64))
        ok = bool((out == np.repeat(np.arange(p), n)).all())
        nbytes = out.nbytes
    elif name == "reduce_scatter":
        out = np.empty(n, np.int64)
        comm.reduce_scatter(out, np.arange(n * p, dtype=np.int64))
        ok = bool((out == p * np.arange(r * n, (r + 1) * n)).all())
        nbytes = out.nbytes * p
    else:
        out = np.empty(n * p, np.int64)
        comm.alltoall(out, np.arange(n * p, dtype=np.int64) + 1_000_000 * r, algo=algo)
        expect = np.concatenate([1_000_000 * s + np.arange(r * n, (r + 1) * n) for s in range(p)])
        ok = bool((out == expect).all())
        nbytes = out.nbytes
    return ok, comm.selected_algorithm(name, nbytes, algo)


CASES = [(name, 256, None) for name in ("allreduce", "broadcast", "allgather", "reduce_scatter",
                                        "alltoall")]
CASES += [("alltoall", 256, "bruck"), ("allreduce", 1024, None)]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name,size,algo", CASES)
def test_collectives_at_scale(name, size, algo):
    results = run_threads(_collective, size, name, algo, timeout=500, collective_timeout=400)
    assert all(ok for ok, _ in results), [r for r, (ok, _) in enumerate(results) if not ok][:10]
    assert len({chosen for _, chosen in results}) == 1, "ranks chose different algorithms"


def _uneven_alltoall(comm):
    """Uneven splits: rank r sends r + 1 rows to everyone. Ranks force different algorithms
    (pairwise, scattered): they send the same messages, so they still match; Bruck is
    refused before anything moves, because the blocks are not equal."""
    r, p = comm.rank, comm.size
    inp = np.full(p * (r + 1), r, dtype=np.int32)
    out = np.empty(sum(s + 1 for s in range(p)), dtype=np.int32)
    refused = False
    try:
        comm.alltoall(out, inp, [s + 1 for s in range(p)], [r + 1] * p, algo="bruck")
    except Exception as e:   # noqa: BLE001 - checked below
        refused = "equal blocks" in str(e)
    comm.alltoall(out, inp, [s + 1 for s in range(p)], [r + 1] * p,
                  algo="pairwise" if r % 2 else "scattered")
    return refused, out.tolist() == [s for s in range(p) for _ in range(s + 1)]


def test_mixed_alltoall_algorithms_match_and_bruck_refuses_uneven_blocks():
    assert run_threads(_uneven_alltoall, 5) == [(True, True)] * 5
