"""Lazy, shared connections: a rank holds sockets to the peers its algorithms talk to, groups
reuse their parent's channels, and nothing breaks above 1024 open file descriptors.

Sockets are counted from the kernel's side (``/proc/net/tcp*`` against this process's
descriptors), not from pycoll's own bookkeeping.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import pycoll
from pycoll.testing import run_ranks, tcp_connections


def data_sockets(store_port: int) -> int:
    """Established TCP connections of this process, except those to or from the store."""
    return sum(store_port not in (local, remote)
               for _, local, _, remote in tcp_connections())


def settled_sockets(store_port: int, quiet: float = 0.1, limit: float = 3.0) -> int:
    """``data_sockets`` once it has stayed the same for ``quiet`` seconds (at most ``limit``):
    a socket a peer is still opening or closing has settled one way or the other."""
    deadline = time.monotonic() + limit
    last = data_sockets(store_port)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = data_sockets(store_port)
        if now == last:
            return now
        last = now
    return last


def _store_barrier(comm, key):
    """Wait for every rank through the store: a collective would open channels itself."""
    comm._store.add(f"test/{key}", 1)
    while int(comm._store.add(f"test/{key}", 0)) < comm.size:
        time.sleep(0.005)


def _ring_and_groups(comm):
    port = comm._store.port
    counts = {"after_init": data_sockets(port)}
    a = np.full(1 << 18, comm.rank, dtype=np.float32)           # 1 MiB
    comm.allreduce(a, algo="ring")
    assert a[0] == sum(range(comm.size))
    _store_barrier(comm, "ring-done")    # every rank is out of the ring: its sockets are open
    counts["after_ring"] = settled_sockets(port)
    evens = comm.new_group([r for r in range(comm.size) if r % 2 == 0])
    odds = comm.new_group([r for r in range(comm.size) if r % 2 == 1])
    halves = comm.split(comm.rank // (comm.size // 2), key=comm.rank)
    counts["after_groups"] = settled_sockets(port)
    # nobody opens a group's channel (below) before every rank counted: a faster peer's
    # first group collective would connect to a rank that has not counted yet
    _store_barrier(comm, "groups-counted")
    mine = evens if comm.rank % 2 == 0 else odds
    b = np.ones(4, dtype=np.int64)
    mine.allreduce(b, algo="ring")                   # neighbours in the group: 2 apart
    c = np.ones(4, dtype=np.int64)
    halves.allreduce(c, algo="ring")                 # neighbours already connected (mostly)
    counts["group_sums"] = (int(b[0]), int(c[0]))
    _store_barrier(comm, "counted")      # every rank is done: no socket is still opening
    counts["after_group_collectives"] = data_sockets(port)
    counts["reported"] = comm.open_channels()["tcp"]
    _store_barrier(comm, "leaving")      # nobody closes its sockets before all counted
    return counts


def _ring_partners(rank: int, size: int) -> set[int]:
    """Peers a world ring, an evens/odds ring and a halves ring give ``rank``."""
    def ring(members):
        i = members.index(rank)
        return {members[(i + 1) % len(members)], members[(i - 1) % len(members)]} - {rank}
    parity = [r for r in range(size) if r % 2 == rank % 2]
    half = [r for r in range(size) if r // (size // 2) == rank // (size // 2)]
    return ring(list(range(size))) | ring(parity) | ring(half)


def test_ring_opens_only_neighbour_sockets_and_groups_open_none():
    results = run_ranks(_ring_and_groups, 8, env={"PYCOLL_TRANSPORTS": "tcp"})
    for rank, c in enumerate(results):
        assert c["after_init"] == 0, (rank, c)                  # lazy: nothing before use
        assert c["after_ring"] <= 4, (rank, c)                  # the bound
        assert c["after_ring"] == 2, (rank, c)                  # left and right neighbour
        assert c["after_groups"] == c["after_ring"], (rank, c)  # split/new_group: none
        assert c["group_sums"] == (4, 4), (rank, c)
        # group collectives open exactly the pairs their rings add: in evens/odds the
        # neighbours 2 apart, in the halves the one neighbour not already adjacent
        assert c["after_group_collectives"] == len(_ring_partners(rank, 8)), (rank, c)
        assert c["reported"] == c["after_group_collectives"], (rank, c)


SCRIPT = textwrap.dedent("""
    import os, numpy as np, pycoll
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]   # a data loader's worth
    assert max(held) > 1024
    comm = pycoll.init(timeout=30)
    a = np.full(1 << 20, comm.rank + 1, dtype=np.float32)
    pycoll.allreduce(a)
    b = np.arange(10, dtype=np.int64)
    pycoll.broadcast(b, root=comm.size - 1)
    pycoll.barrier()
    os.write(1, f"RESULT rank={comm.rank} sum={a[0]:g} {comm.transport_summary()}\\n".encode())
    pycoll.finalize()
""")


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_more_than_1024_open_files(tmp_path, transport):
    script = tmp_path / "fds.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYCOLL_")}
    env["PYCOLL_TRANSPORTS"] = transport
    proc = subprocess.run([sys.executable, "-m", "pycoll.run", "-n", "3", str(script)],
                          capture_output=True, text=True, timeout=90, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = sorted(line for line in proc.stdout.splitlines() if line.startswith("RESULT"))
    assert lines == [f"RESULT rank={r} sum=6 {transport}" for r in range(3)], proc.stdout


def _dial_a_dead_peer(comm):
    """Rank 0 dies before rank 1 ever talked to it: rank 1's first dial is refused, and a
    refused dial means the peer is gone (its port existed before its address was published),
    so rank 1 raises PeerLost at once instead of retrying until the deadline."""
    import os
    import signal
    import time as clock

    comm._store.add("test/ready", 1)
    if comm.rank == 0:
        while int(comm._store.add("test/ready", 0)) < 2:
            clock.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)
    while int(comm._store.add("test/ready", 0)) < 2:
        clock.sleep(0.01)
    clock.sleep(0.5)                  # rank 0 is dead by now
    start = clock.monotonic()
    try:
        comm.recv(np.empty(4), src=0)
    except pycoll.PeerLost as e:
        return clock.monotonic() - start, str(e)
    return None


def test_refused_dial_is_a_lost_peer():
    outcomes = run_ranks(_dial_a_dead_peer, 2, env={"PYCOLL_TRANSPORTS": "tcp"},
                         expect_failure=True, collective_timeout=20)
    kind, value = outcomes[1]
    assert kind == "ok", value
    elapsed, message = value
    assert elapsed < 5 and "refused the connection" in message, value
