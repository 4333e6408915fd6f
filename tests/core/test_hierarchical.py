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
    for top, _transports, out in results:
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


def _links(comm):
    sel = comm._plan.selector
    h = sel.hierarchy
    return (None if h is None else (h.intra.alpha, h.intra.beta, h.inter.alpha, h.inter.beta),
            sel.link.beta, [sel.choose("allreduce", n, comm.size) for n in (64, 1 << 26)])


@pytest.mark.parametrize("env,declared", [
    ({}, False),                                              # measured
    ({"PYCOLL_INTER_NODE_GBPS": "0.05", "PYCOLL_INTER_NODE_LATENCY_US": "80"}, True),
])
def test_links_measured_at_init_agree_on_every_rank(env, declared):
    """Several equal nodes: the cost model gets measured (or declared) links, the same on
    every rank (they must all choose the same algorithm), and a slow network between nodes
    makes hierarchical allreduce the choice for large messages."""
    results = run_ranks(_links, 4, env={"PYCOLL_VIRTUAL_NODE_SIZE": "2", **env})
    assert all(r == results[0] for r in results), results
    (intra_a, intra_b, inter_a, inter_b), flat_beta, choices = results[0]
    assert 0 < intra_a < 0.05 and 0 < inter_a < 0.05 and intra_b > 0 and inter_b > 0
    assert flat_beta == max(intra_b, inter_b)     # block placement: one crossing per node
    if declared:
        assert (inter_a, inter_b) == pytest.approx((80e-6, 1 / 0.05e9))
        assert choices[1] == "hierarchical"


def test_probe_off_keeps_the_declared_links():
    on = run_ranks(_links, 4, env={"PYCOLL_VIRTUAL_NODE_SIZE": "2"})[0]
    off = run_ranks(_links, 4, env={"PYCOLL_VIRTUAL_NODE_SIZE": "2",
                                    "PYCOLL_LINK_PROBE": "0"})[0]
    from pycoll.transports.tcp.transport import TcpTransport
    assert off[0][3] == 1 / (TcpTransport.capabilities.bandwidth_gbps * 1e9)
    assert on[0] != off[0]


def test_ring_crossings_count_a_nodes_shared_link():
    from pycoll.comm.topology import node_layout, ring_crossings
    assert ring_crossings(node_layout(["a", "a", "b", "b", "c", "c"])) == 1      # block
    assert ring_crossings(node_layout(["a", "b", "c", "a", "b", "c"])) == 2      # cyclic
    assert ring_crossings(node_layout(["a", "a", "a"])) == 1
