"""Point-to-point receives from any source (``recv(t, src=None)``), in real rank processes."""
from __future__ import annotations

import numpy as np
import pytest

from pycoll.errors import InvalidArgument
from pycoll.testing import run_ranks, run_threads


def _fan_in(comm, per_source):
    """Every rank but 0 sends ``per_source`` numbered messages to rank 0, which receives them
    all from any source; a second tag (another size) interleaves to check matching."""
    rank, size = comm.rank, comm.size
    if rank != 0:
        for k in range(per_source):
            comm.send(np.full(3, 1000 * rank + k, dtype=np.int64), 0, tag=1)
            comm.send(np.full(2, -rank, dtype=np.int32), 0, tag=2)
        return None
    seen: dict[int, list[int]] = {}
    for _ in range((size - 1) * per_source):
        buf = np.zeros(3, dtype=np.int64)
        w = comm.recv(buf, None, tag=1, async_op=True)
        w.wait(30)
        src = w.source_rank()
        assert src is not None and 1 <= src < size, src
        assert (buf == buf[0]).all() and int(buf[0]) // 1000 == src, (src, buf)
        seen.setdefault(src, []).append(int(buf[0]) % 1000)
    tag2 = []
    for _ in range((size - 1) * per_source):
        small = np.zeros(2, dtype=np.int32)
        src = comm.recv(small, tag=2)           # synchronous: returns the source
        assert int(small[0]) == -src
        tag2.append(src)
    return seen, sorted(tag2)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("size", [3, 4])
def test_recv_from_any_source_keeps_each_sources_order(transport, size):
    """Nothing lost, nothing twice, each source's messages in its order, sources right."""
    per_source = 5
    seen, tag2 = run_ranks(_fan_in, size, per_source, env={"PYCOLL_TRANSPORTS": transport})[0]
    assert seen == {r: list(range(per_source)) for r in range(1, size)}
    assert tag2 == sorted(list(range(1, size)) * per_source)


def test_recv_from_any_source_many_threads():
    seen, _ = run_threads(_fan_in, 8, 3)[0]
    assert seen == {r: [0, 1, 2] for r in range(1, 8)}


def _large_any_source(comm):
    """Large messages (shm cross-memory attach / tcp streaming) from any source."""
    n = 3 << 20
    if comm.rank != 0:
        comm.send(np.full(n, comm.rank, dtype=np.uint8), 0, tag=9)
        return None
    got = []
    for _ in range(comm.size - 1):
        buf = np.zeros(n, dtype=np.uint8)
        src = comm.recv(buf, tag=9)
        assert (buf == src).all()
        got.append(src)
    return sorted(got)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_recv_from_any_source_large(transport):
    assert run_ranks(_large_any_source, 3, env={"PYCOLL_TRANSPORTS": transport})[0] == [1, 2]


def _alone(comm):
    with pytest.raises(InvalidArgument, match="any source"):
        comm.recv(np.zeros(1), None)
    return "ok"


def test_any_source_in_a_world_of_one_is_refused():
    assert run_ranks(_alone, 1) == ["ok"]


def _failed_any_source_leaves_pairs_usable(comm):
    """A receive from any source that times out withdraws its alternatives: the pairs it
    was posted on stay usable (only a half-received message would put a pair out of step),
    also for the parent communicator sharing those channels."""
    from pycoll.errors import CollectiveTimeout
    group = comm.new_group(list(range(comm.size)))
    if comm.rank == 0:
        try:
            group.recv(np.zeros(2), None, timeout=0.3)
            return "no error"
        except CollectiveTimeout:
            pass
    comm.barrier()
    buf = np.zeros(2)
    if comm.rank == 0:
        srcs = sorted(comm.recv(buf, None, tag=4) for _ in range(comm.size - 1))
        comm.recv(buf, 2, tag=5)
        return srcs, buf.tolist()
    comm.send(np.full(2, float(comm.rank)), 0, tag=4)
    if comm.rank == 2:
        comm.send(np.full(2, 7.0), 0, tag=5)
    return None


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_failed_any_source_receive_leaves_pairs_usable(transport):
    got = run_ranks(_failed_any_source_leaves_pairs_usable, 3,
                    env={"PYCOLL_TRANSPORTS": transport})[0]
    assert got == ([1, 2], [7.0, 7.0]), got


def _p2p_between_collectives(comm):
    """Point-to-point calls count separately from collectives; a collective message held
    while many sends run (a peer already in its next collective) is not a leftover."""
    a = np.ones(4)
    for i in range(30):
        if comm.rank == 0:
            comm.send(np.full(2, float(i)), 1, tag=1)
        elif comm.rank == 1:
            comm.recv(np.zeros(2), 0, tag=1)
        if i % 10 == 0:
            comm.allreduce(a)
    return a.tolist()


def test_point_to_point_between_collectives_is_not_a_mismatch():
    results = run_ranks(_p2p_between_collectives, 3)
    assert results[0] == results[1] == results[2] == [27.0] * 4
