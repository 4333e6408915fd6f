"""One conformance suite, run against every transport (and every shm protocol path).

Each test runs real rank processes through ``pycoll.testing.run_ranks`` and talks to the
transport's channels directly (``comm._channels``), below any algorithm.
"""
from __future__ import annotations

import os
import socket
import time

import numpy as np
import pytest

from pycoll.errors import MessageSizeMismatch, PeerLost
from pycoll.testing import run_ranks
from pycoll.transports.base import WaitTimeout, wait_all


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


TRANSPORTS = {
    "shm": {"PYCOLL_TRANSPORT": "shm"},                       # eager + cross-memory attach
    "shm-copy": {"PYCOLL_TRANSPORT": "shm", "PYCOLL_SHM_CMA": "0"},   # fragments through slots
    "shm-tiny": {"PYCOLL_TRANSPORT": "shm", "PYCOLL_SHM_CMA": "0",
                 "PYCOLL_SHM_SLOT_BYTES": "96", "PYCOLL_SHM_SLOTS": "2"},
    "tcp": {"PYCOLL_TRANSPORT": "tcp"},
    "tcp-ipv6": {"PYCOLL_TRANSPORT": "tcp", "PYCOLL_SOCKET_FAMILY": "ipv6"},
    "tcp-ifname": {"PYCOLL_TRANSPORT": "tcp", "PYCOLL_SOCKET_IFNAME": "lo"},
}


@pytest.fixture(params=list(TRANSPORTS))
def transport_env(request):
    if request.param == "tcp-ipv6" and not _ipv6_loopback():
        pytest.skip("no IPv6 loopback (::1) on this machine")
    return request.param, TRANSPORTS[request.param]


def _pattern(nbytes: int, seed: int) -> np.ndarray:
    """Bytes that differ from any shifted copy of themselves (catches offset bugs)."""
    words = np.arange((nbytes + 3) // 4, dtype=np.uint32)
    words *= np.uint32(2654435761)
    words += np.uint32(seed * 7919 + 1)
    return words.view(np.uint8)[:nbytes]


def _exchange_sizes(comm, sizes):
    """Both ranks send every size to each other at once; check every byte."""
    peer = 1 - comm.rank
    ch = comm._channels[peer]
    for nbytes in sizes:
        out = _pattern(nbytes, comm.rank)
        into = np.empty(nbytes, dtype=np.uint8)
        r = ch.irecv(memoryview(into), tag=7)
        s = ch.isend(memoryview(out), tag=7)
        wait_all([r, s], time.monotonic() + 60)
        if not np.array_equal(into, _pattern(nbytes, peer)):
            bad = int(np.flatnonzero(into != _pattern(nbytes, peer))[0])
            raise AssertionError(f"{nbytes} B: first wrong byte at {bad}")
    return comm._peer_transport[peer]


SIZES = [0, 1, 7, 95, 96, 4096, 65_503, 65_536, 1 << 20, (1 << 20) + 3, 16 << 20]


def test_sizes_both_directions(transport_env):
    name, env = transport_env
    sizes = SIZES if name != "shm-tiny" else [s for s in SIZES if s <= 1 << 20]
    used = run_ranks(_exchange_sizes, 2, sizes, env=env)
    assert used == [env["PYCOLL_TRANSPORT"]] * 2


@pytest.mark.parametrize("name", ["shm", "tcp"])
def test_256_mib_full_duplex(name):
    run_ranks(_exchange_sizes, 2, [256 << 20], env=TRANSPORTS[name], timeout=120)


def _ordering_and_tags(comm):
    peer = 1 - comm.rank
    ch = comm._channels[peer]
    deadline = time.monotonic() + 30
    if comm.rank == 0:
        # Many messages per tag, tags interleaved; large and small mixed.
        reqs = []
        for i in range(40):
            for tag in (1, 2, 3):
                n = 10 + i * 1000 * tag
                reqs.append(ch.isend(memoryview(_pattern(n, i * 10 + tag)), tag=tag))
        wait_all(reqs, deadline)
        return None
    # Receive tag 3 first, then 1, then 2: messages of one tag arrive in order.
    got = {}
    for tag in (3, 1, 2):
        for i in range(40):
            n = 10 + i * 1000 * tag
            buf = np.empty(n, dtype=np.uint8)
            wait_all([ch.irecv(memoryview(buf), tag=tag)], deadline)
            got[(tag, i)] = bool(np.array_equal(buf, _pattern(n, i * 10 + tag)))
    assert all(got.values()), [k for k, v in got.items() if not v]
    return len(got)


def test_ordering_and_tags(transport_env):
    _, env = transport_env
    assert run_ranks(_ordering_and_tags, 2, env=env)[1] == 120


def _many_in_flight(comm):
    """Post many receives before any send: all complete, each into its own buffer."""
    peer = 1 - comm.rank
    ch = comm._channels[peer]
    bufs = [np.empty(1000 + i, dtype=np.uint8) for i in range(64)]
    recvs = [ch.irecv(memoryview(b), tag=5) for b in bufs]
    srcs = [_pattern(1000 + i, comm.rank + i) for i in range(64)]
    sends = [ch.isend(memoryview(s), tag=5) for s in srcs]
    wait_all(recvs + sends, time.monotonic() + 30)
    return all(np.array_equal(b, _pattern(1000 + i, peer + i)) for i, b in enumerate(bufs))


def test_many_messages_in_flight(transport_env):
    _, env = transport_env
    assert run_ranks(_many_in_flight, 2, env=env) == [True, True]


def _deadline(comm):
    ch = comm._channels[1 - comm.rank]
    buf = np.empty(16, dtype=np.uint8)
    start = time.monotonic()
    try:
        wait_all([ch.irecv(memoryview(buf), tag=99)], time.monotonic() + 0.5)
    except WaitTimeout as e:
        result = (time.monotonic() - start, len(e.pending))
    else:
        return None
    _store_barrier(comm, "deadline")   # neither rank may close before the other timed out
    return result


def _store_barrier(comm, key):
    comm._store.add(f"test/{key}", 1)
    comm._store.wait([f"test/{key}"])
    limit = time.monotonic() + 10
    while comm._store.add(f"test/{key}", 0) < comm.size and time.monotonic() < limit:
        time.sleep(0.01)


def test_deadline_expires(transport_env):
    _, env = transport_env
    for elapsed, pending in run_ranks(_deadline, 2, env=env):
        assert pending == 1
        assert 0.5 <= elapsed < 10


def _size_mismatch(comm):
    peer = 1 - comm.rank
    ch = comm._channels[peer]
    out = np.zeros(100 + comm.rank * 100_000, dtype=np.uint8)
    into = np.empty(100 + peer * 100_000 + 1, dtype=np.uint8)   # one byte too many, both sides
    s = ch.isend(memoryview(out))
    r = ch.irecv(memoryview(into))
    try:
        wait_all([r, s], time.monotonic() + 10)
    except MessageSizeMismatch as e:
        return str(e)
    except PeerLost:
        return "peer-lost"   # the other side broke the connection first
    return None


def test_size_mismatch_raises(transport_env):
    _, env = transport_env
    results = run_ranks(_size_mismatch, 2, env=env)
    assert any(r and "posted a receive of" in r for r in results), results
    assert all(r is not None for r in results)


def _peer_dies(comm):
    peer = 1 - comm.rank
    ch = comm._channels[peer]
    if comm.rank == 1:
        time.sleep(0.3)
        os._exit(3)   # vanish without finalize
    buf = np.empty(1 << 20, dtype=np.uint8)
    start = time.monotonic()
    try:
        wait_all([ch.irecv(memoryview(buf))], time.monotonic() + 30)
    except PeerLost as e:
        return (time.monotonic() - start, e.peer, str(e))
    return None


def test_peer_death_raises_peer_lost(transport_env):
    _, env = transport_env
    outcomes = run_ranks(_peer_dies, 2, env=env, expect_failure=True)
    kind, value = outcomes[0]
    assert kind == "ok", value
    elapsed, peer, message = value
    assert peer == 1 and "peer rank 1" in message
    assert elapsed < 10   # noticed long before the 30 s deadline


def _late_receive_for_set_aside_message(comm):
    """A large tag-0 message is being set aside (no receive for it yet) when its receive is
    posted: that receive must get it, in order (regression: it used to be stranded)."""
    peer = 1 - comm.rank
    ch = comm._channels[peer]
    big = 8 << 20
    if comm.rank == 0:
        reqs = [ch.isend(memoryview(_pattern(big, 1)), tag=0),
                ch.isend(memoryview(_pattern(16, 2)), tag=1)]
        wait_all(reqs, time.monotonic() + 30)
        return True
    time.sleep(0.3)
    first, second = np.empty(16, np.uint8), np.empty(big, np.uint8)
    r1 = ch.irecv(memoryview(first), tag=1)       # the tag-0 message is read aside meanwhile
    ch.progress()
    r0 = ch.irecv(memoryview(second), tag=0)      # posted while it is still arriving
    wait_all([r1, r0], time.monotonic() + 30)
    return bool(np.array_equal(second, _pattern(big, 1)) and np.array_equal(first, _pattern(16, 2)))


@pytest.mark.parametrize("name", ["shm-copy", "tcp"])
def test_receive_posted_while_message_is_set_aside(name):
    assert run_ranks(_late_receive_for_set_aside_message, 2, env=TRANSPORTS[name]) == [True, True]
