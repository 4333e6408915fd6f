"""Several sockets per tcp pair (``PYCOLL_SOCKET_NSOCKS``): every pair opens the smaller of
its two ranks' counts, large messages arrive intact whichever lanes their stripes took, and
the sockets are really there (counted from the kernel's tables, not pycoll's bookkeeping).
"""
from __future__ import annotations

import numpy as np
import pytest
from test_connections import _store_barrier, data_sockets

from pycoll.testing import run_ranks

pytestmark = pytest.mark.timeout(120)

#: sockets per pair each rank asks for
ASKED = {0: "1", 1: "2", 2: "4", 3: "4"}


def _mixed_counts(comm):
    rng = np.random.default_rng(comm.rank)
    out = {}
    # every pair talks: alltoall of 3 MiB blocks (striped where both sides have lanes),
    # then sizes around the striping threshold, tags interleaved with small messages
    send = rng.integers(0, 1 << 30, size=comm.size * (3 << 18), dtype=np.int32)
    recv = np.empty_like(send)
    comm.alltoall(recv, send)
    everyone = [np.random.default_rng(r).integers(0, 1 << 30, size=send.size, dtype=np.int32)
                for r in range(comm.size)]
    block = send.size // comm.size
    expect = np.concatenate([e[comm.rank * block:(comm.rank + 1) * block] for e in everyone])
    out["alltoall_ok"] = bool(np.array_equal(recv, expect))
    for n in (1, (256 << 10) // 4, (512 << 10) // 4 + 3, (1 << 20) // 4 + 1, 5 << 20):
        x = np.full(n, comm.rank + 1, dtype=np.int32)
        comm.allreduce(x)
        out[f"allreduce_{n}"] = bool((x == sum(range(1, comm.size + 1))).all())
    _store_barrier(comm, "counted")
    out["sockets"] = data_sockets(comm._store.port)
    _store_barrier(comm, "done")
    return out


def test_pairs_open_the_smaller_count_and_stripe_large_messages():
    results = run_ranks(_mixed_counts, 4, env={"PYCOLL_TRANSPORTS": "tcp"},
                        rank_env={r: {"PYCOLL_SOCKET_NSOCKS": v} for r, v in ASKED.items()})
    for rank, res in enumerate(results):
        assert all(v for k, v in res.items() if k != "sockets"), (rank, res)
        expected = sum(min(int(ASKED[rank]), int(ASKED[p])) for p in ASKED if p != rank)
        assert res["sockets"] == expected, (rank, res["sockets"], expected)


def _bad(comm):
    return None


def test_too_many_sockets_is_refused_on_every_rank():
    outcomes = run_ranks(_bad, 2, env={"PYCOLL_TRANSPORTS": "tcp", "PYCOLL_SOCKET_NSOCKS": "17"},
                         expect_failure=True)
    for kind, text in outcomes:
        assert kind == "InvalidArgument" and "PYCOLL_SOCKET_NSOCKS=17" in text, (kind, text)
