"""Hierarchical allreduce and broadcast on virtual node layouts (shm inside, tcp between)."""
from __future__ import annotations

import numpy as np
import pytest

from pycoll.testing import run_ranks

COUNTS = (0, 1, 13, 100_003, 1 << 20)


def _hierarchical(comm, dtype):
    out = []
    for n in COUNTS:
        a = (np.arange(n) % 11 + comm.rank).astype(dtype)
        comm.allreduce(a, "sum", algo="hierarchical")
        out.append(a.tobytes())
        b = np.full(n, comm.rank, dtype=dtype)
        comm.broadcast(b, root=comm.size - 1, algo="hierarchical")
        out.append(b.tobytes())
        c = np.full(n, comm.rank + 1, dtype=dtype)
        comm.allreduce(c, "avg", algo="hierarchical")
        out.append(c.tobytes())
    return comm.topology_summary(), comm.transport_summary(), out


@pytest.mark.parametrize("size,node_size,topology", [
    (4, 2, "2 nodes x 2 ranks"), (6, 3, "2 nodes x 3 ranks"), (6, 2, "3 nodes x 2 ranks"),
    (3, 2, "2 nodes (uneven)"),  # not uniform: falls back to the flat algorithms
])
@pytest.mark.parametrize("dtype", ["float64", "int32"])
def test_hierarchical_matches_reference(size, node_size, topology, dtype):
    results = run_ranks(_hierarchical, size, dtype,
                        env={"PYCOLL_VIRTUAL_NODE_SIZE": str(node_size)})
    for top, transports, out in results:
        assert top == topology
        assert out == results[0][2]              # identical bits everywhere
    assert "tcp" in results[0][1]
    got = iter(results[0][2])
    for n in COUNTS:
        expected = sum((np.arange(n) % 11 + k).astype(dtype) for k in range(size)) if n else \
            np.zeros(0, dtype)
        assert np.frombuffer(next(got), dtype).tolist() == np.asarray(expected, dtype).tolist()
        assert np.frombuffer(next(got), dtype).tolist() == [size - 1] * n
        avg = np.frombuffer(next(got), dtype)
        want = (size + 1) / 2 if dtype == "float64" else (size + 1) // 2
        assert avg.tolist() == [want] * n
