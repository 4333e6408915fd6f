"""The MPI/NCCL variants (issue 43, part 4): out-of-place allreduce/reduce/broadcast,
reduce_scatter_v, gatherv, scatterv and persistent plans of every collective, each against a
numpy reference, with real ranks over shm and tcp; bad arguments refused on every rank before
a sequence number is taken (nothing sent), disagreeing counts raised as CollectiveMismatch."""
from __future__ import annotations

import numpy as np
import pytest

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
