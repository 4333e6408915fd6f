"""A shrink among quiet ranks shares the old channels; a shrink after a failure builds new
ones (docs/elastic.md, "Shrink"). Counted by the kernel (``pycoll.testing.held_counts``:
sockets from /proc/self/fd, segments from /proc/self/maps), on real processes."""
from __future__ import annotations

import os
import signal

import numpy as np
import pytest

import pycoll
from pycoll.testing import held_counts, mapped_segments, run_ranks, tcp_connections

pytestmark = pytest.mark.timeout(120)
TRANSPORTS = ["tcp", "shm"]


def _every_pair(comm: pycoll.Communicator) -> None:
    """Open every pair's channel (connections are lazy)."""
    for peer in range(comm.size):
        if peer != comm.rank:
            buf = np.zeros(1)
            if comm.rank < peer:
                comm.send(np.ones(1), peer)
                comm.recv(buf, peer)
            else:
                comm.recv(buf, peer)
                comm.send(np.ones(1), peer)


def _links(comm: pycoll.Communicator) -> dict:
    """This process's TCP connections (but those to the store) and channel segments, by
    identity."""
    port = comm._store.port
    return {"tcp": sorted(list(c) for c in tcp_connections() if port not in (c[1], c[3])),
            "segments": sorted(p for p in mapped_segments() if not p.endswith("-fast"))}


def _quiet_shrink(comm: pycoll.Communicator) -> dict:
    _every_pair(comm)
    comm.allreduce(np.ones(1 << 16))                  # the fast path / large path too
    if comm.rank == 0:                                # never received on the old one
        comm.send(np.full(4, 99.0), 1)
    if comm.rank == 3:                                # excluded: leaves after the others
        return {"excluded": True}
    before, links_before = held_counts(comm), _links(comm)
    new = comm.shrink(exclude=[3])
    after_shrink = held_counts(new)
    x = np.full(1000, float(new.rank + 1))
    new.allreduce(x)
    got = np.zeros(4)
    if new.rank == 0:
        new.send(np.full(4, 7.0), 1)
    elif new.rank == 1:
        new.recv(got, 0)                              # the new message, not the stale 99s
    _every_pair(new)
    links_after = _links(comm)
    again = new.shrink(exclude=[2]) if new.rank < 2 else None   # a shared one shrinks too
    result = {"before": before, "after": after_shrink, "after_use": held_counts(new),
              "sum": float(x[0]), "got": got.tolist(), "name": new.name,
              "shared": new._conn is comm._conn, "links_before": links_before,
              "links_after": links_after}
    if again is not None:
        y = np.ones(3)
        again.allreduce(y)
        result.update(again_sum=y.tolist(), again_shared=again._conn is comm._conn,
                      again_sockets=held_counts(again)["sockets"])
        again.finalize()
    else:
        new.finalize()
    return result


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_quiet_shrink_opens_no_new_channel(transport: str) -> None:
    """4 ranks, every pair connected; rank 3 is excluded (alive). The survivors' new
    communicator uses the same channels: no new socket, no new channel segment, only its own
    fast-path segment; its results are right, and a message sent on the old communicator
    that nobody received never reaches a receive on the new one. Shrinking that one again
    shares the channels too."""
    out = run_ranks(_quiet_shrink, 4, env={"PYCOLL_TRANSPORTS": transport})
    assert out[3] == {"excluded": True}
    for r in range(3):
        res = out[r]
        # the same sockets and segments (a new connection would have a new port)
        tcp_before = [tuple(c) for c in res["links_before"]["tcp"]]
        assert all(tuple(c) in tcp_before for c in res["links_after"]["tcp"]), res
        assert set(res["links_after"]["segments"]) <= set(res["links_before"]["segments"])
        assert res["shared"], res
        before, after = res["before"], res["after_use"]
        assert after["sockets"] <= before["sockets"], res
        assert after["channel segments"] <= before["channel segments"], res
        assert after["channels"] == before["channels"], res
        assert res["sum"] == 6.0, res
        assert res["name"] != "world"
    assert out[1]["got"] == [7.0] * 4
    for r in range(2):
        assert out[r]["again_sum"] == [2.0] * 3 and out[r]["again_shared"], out[r]
        assert out[r]["again_sockets"] <= out[r]["before"]["sockets"], out[r]


def _shrink_after_a_death(comm: pycoll.Communicator) -> dict:
    _every_pair(comm)
    if comm.rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        comm.allreduce(np.ones(8))
    except pycoll.PycollError:
        pass
    new = comm.shrink()
    x = np.ones(8)
    new.allreduce(x)
    return {"shared": new._conn is comm._conn, "sum": float(x[0]), "size": new.size}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_shrink_after_a_failure_builds_new_channels(transport: str) -> None:
    """After a rank's death the pairs may be out of step (a call was cut off): the
    survivors' communicator gets channels of its own."""
    out = run_ranks(_shrink_after_a_death, 3, env={"PYCOLL_TRANSPORTS": transport},
                    expect_failure=True)
    assert out[2][0] == "missing"
    for r in (0, 1):
        assert out[r] == ("ok", {"shared": False, "sum": 2.0, "size": 2}), out[r]


def _quiet_shrink_then_grow(comm: pycoll.Communicator) -> tuple:
    if os.environ.get("PYCOLL_JOIN") != "1":          # the original ranks, not the joiner
        if comm.rank == 2:
            return ("left",)
        shared = comm.shrink(exclude=[2])
        comm = shared.grow(1, timeout=60)            # a grow builds anew, and lets go of
        assert shared.closed                          # the shared channels it replaced
    x = np.full(2, float(comm.rank + 1))
    comm.allreduce(x)
    return comm.size, float(x[0])


def test_a_shared_communicator_grows() -> None:
    out = run_ranks(_quiet_shrink_then_grow, 3, joiners=1)
    assert out[2] == ("left",)
    for k in (0, 1, 3):
        assert out[k] == (3, 6.0), out
