"""One conformance suite, run against every registered transport x every memory type it moves.

Each test talks to a transport's channels directly (``comm.channel(peer)``), below any
algorithm, with real ranks: processes (``run_ranks``), or threads for a transport whose
capabilities say ``in_process`` (``run_threads``). Every transport in the registry runs with
its defaults; extra variants exercise other protocol paths (shm fragments through tiny
slots; tcp over IPv6, a named interface, several sockets; verbs rendezvous and eager). Memory
types come from the transport's declared capabilities; the buffers of a type come from
``ALLOCATORS``, so a transport that declares device memory runs the same cases on device
buffers.
"""
from __future__ import annotations

import os
import socket
import time

import numpy as np
import pytest

from pycoll.buffers.memory import CUDA, HOST, MemRef
from pycoll.errors import MessageSizeMismatch, PeerLost
from pycoll.testing import cuda_env, run_ranks, run_threads
from pycoll.transports import registry
from pycoll.transports.progress import WaitTimeout


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


#: extra variants, each driving another protocol path of a transport: variant -> (registry
#: name, environment). Every registered transport also runs as itself with its defaults
#: (``VARIANTS``), so a new transport is covered by its line in the registry.
EXTRA_VARIANTS = {
    "shm-copy": ("shm", {"PYCOLL_SHM_CMA": "0"}),                  # fragments through slots
    "shm-tiny": ("shm", {"PYCOLL_SHM_CMA": "0", "PYCOLL_SHM_SLOT_BYTES": "96",
                         "PYCOLL_SHM_SLOTS": "2"}),
    "tcp-ipv6": ("tcp", {"PYCOLL_SOCKET_FAMILY": "ipv6"}),
    "tcp-ifname": ("tcp", {"PYCOLL_SOCKET_IFNAME": "lo"}),
    # 3 sockets per pair: messages of 512 KiB and up striped over 2 or 3 of them
    "tcp-nsocks": ("tcp", {"PYCOLL_SOCKET_NSOCKS": "3"}),
    # verbs (by default: eager + rendezvous): rendezvous for all but tiny messages over 4
    # queue pairs with a 4-buffer ring (credits run out constantly) and a 64 KiB
    # registration cache (larger buffers registered per message, the rest evicted
    # constantly, never while in use); everything up to 1 MiB eager, 1 queue pair
    "verbs-rndv": ("verbs", {"PYCOLL_IB_EAGER_MAX": "64", "PYCOLL_IB_QPS_PER_PEER": "4",
                             "PYCOLL_IB_EAGER_SLOTS": "4", "PYCOLL_IB_REG_CACHE_BYTES": "65536"}),
    "verbs-eager": ("verbs", {"PYCOLL_IB_EAGER_MAX": str(1 << 20), "PYCOLL_IB_QPS_PER_PEER": "1"}),
}
#: variant -> (registry name, environment): every registered transport (shm: eager + cross-
#: memory attach; cuda_ipc: skipped where CuPy sees no GPU), then the extras
VARIANTS = {**{name: (name, {}) for name in registry.REGISTRY}, **EXTRA_VARIANTS}
#: every registered transport with its defaults (the cases too heavy to run on every variant)
DEFAULTS = list(registry.REGISTRY)
#: the largest message of the shm-tiny variant: its ring holds 128 bytes (two slots of 64-byte
#: payload), so every 64 bytes is a hand-off that wakes the other rank, whose time is the
#: scheduler's once the ranks share cores with anything else (786,432 hand-offs of 48 MiB
#: took 30-60 s there: docs/performance.md#waiting-on-shared-memory-when-ranks-share-cores).
#: A message of this size is still 512 rings of fragments.
TINY_MAX = 64 << 10


def _sized(transport, nbytes):
    """``nbytes``, or ``TINY_MAX`` if smaller, for the shm-tiny variant."""
    return min(nbytes, TINY_MAX) if transport[0] == "shm-tiny" else nbytes


def _in_process(name):
    """Whether the transport's ranks are threads of one process (``run_threads``)."""
    return registry.transport_class(name).capabilities.in_process


#: memory type -> (name, allocate(nbytes) -> buffer, to_numpy(buffer) -> uint8 array)
def _cupy():
    """CuPy, or pycoll's CPU simulator of it where no GPU is (``cuda_env``)."""
    from pycoll.cuda import runtime
    return runtime.cupy()


def _cuda_alloc(nbytes):
    cupy = _cupy()
    return cupy.empty(nbytes, dtype=cupy.uint8)


def _cuda_to_host(buf):
    """The bytes of a device buffer, once pycoll's stream has run what was queued on it."""
    from pycoll.cuda import runtime
    runtime.synchronize(buf.device.id)
    return _cupy().asnumpy(buf)


ALLOCATORS = {
    HOST: ("host", lambda n: np.empty(n, dtype=np.uint8), lambda b: b),
    CUDA: ("cuda", _cuda_alloc, _cuda_to_host),
}


def _cases():
    for variant, (name, _env) in VARIANTS.items():
        for mem_type in sorted(registry.transport_class(name).capabilities.memory_types):
            yield pytest.param((variant, mem_type), id=f"{variant}-{ALLOCATORS[mem_type][0]}")


def test_every_variant_names_a_registered_transport():
    assert {name for name, _ in EXTRA_VARIANTS.values()} <= set(registry.REGISTRY)
    for name in registry.REGISTRY:
        assert registry.transport_class(name).capabilities.memory_types <= set(ALLOCATORS)


@pytest.fixture(params=list(_cases()))
def transport(request, monkeypatch):
    variant, mem_type = request.param
    return _usable(variant, mem_type, monkeypatch)


def _usable(variant, mem_type, monkeypatch):
    """(variant, registry name, environment, memory type); skips where it is not usable.
    cuda_ipc's probe reads the simulator's environment, so the test sets it (``monkeypatch``)."""
    name, env = VARIANTS[variant]
    if variant == "tcp-ipv6" and not _ipv6_loopback():
        pytest.skip("no IPv6 loopback (::1) on this machine")
    if name == "cuda_ipc":
        # the GPU where CuPy sees one, pycoll's CPU simulator of CUDA everywhere else
        env = dict(env, **cuda_env())
        for key, value in env.items():
            monkeypatch.setenv(key, value)
    record, why = registry.transport_class(name).probe()
    if record is None:
        pytest.skip(f"{name} is not usable here: {why}")
    return variant, name, dict(env, PYCOLL_TRANSPORTS=name), mem_type


def run(transport, fn, n, *args, **kw):
    """Run ``fn(comm, mem_type, *args)`` on ``n`` ranks over the transport under test."""
    _variant, name, env, mem_type = transport
    if _in_process(name):
        kw.pop("expect_failure", None)
        return run_threads(fn, n, mem_type, *args, env=env, **kw)
    return run_ranks(fn, n, mem_type, *args, env=env, **kw)


# -- helpers used inside the ranks -------------------------------------------------------------
def _alloc(mem_type, nbytes):
    return ALLOCATORS[mem_type][1](nbytes)


def _host(mem_type, buf):
    return ALLOCATORS[mem_type][2](buf)


def _ref(buf):
    if hasattr(buf, "__cuda_array_interface__"):
        return MemRef.device_memory(buf.data.ptr, buf.nbytes, buf.device.id, owner=buf)
    return MemRef.of(buf)


def _wait(comm, reqs, seconds):
    comm._peers.engine.wait(reqs, time.monotonic() + seconds)


def _pattern(nbytes: int, seed: int) -> np.ndarray:
    """Bytes that differ from any shifted copy of themselves (catches offset bugs)."""
    words = np.arange((nbytes + 3) // 4, dtype=np.uint32)
    words *= np.uint32(2654435761)
    words += np.uint32(seed * 7919 + 1)
    return words.view(np.uint8)[:nbytes]


def _filled(mem_type, nbytes, seed):
    if mem_type == CUDA:          # written on the default stream, done before it returns
        cupy = _cupy()
        buf = cupy.asarray(_pattern(nbytes, seed))
        cupy.cuda.Device(buf.device.id).synchronize()
        return buf
    buf = _alloc(mem_type, nbytes)
    _host(mem_type, buf)[...] = _pattern(nbytes, seed)
    return buf


def _store_barrier(comm, key):
    comm._store.add(f"test/{key}", 1)
    limit = time.monotonic() + 10
    while int(comm._store.add(f"test/{key}", 0)) < comm.size and time.monotonic() < limit:
        time.sleep(0.01)


# -- cases ---------------------------------------------------------------------------------------
def _exchange_sizes(comm, mem_type, sizes):
    """Both ranks send every size to each other at once; check every byte."""
    peer = 1 - comm.rank
    ch = comm.channel(peer)
    for nbytes in sizes:
        out = _filled(mem_type, nbytes, comm.rank)
        into = _alloc(mem_type, nbytes)
        r = ch.irecv(_ref(into), tag=7)
        s = ch.isend(_ref(out), tag=7)
        _wait(comm, [r, s], 60)
        got = _host(mem_type, into)
        if not np.array_equal(got, _pattern(nbytes, peer)):
            bad = int(np.flatnonzero(got != _pattern(nbytes, peer))[0])
            raise AssertionError(f"{nbytes} B: first wrong byte at {bad}")
    return comm.transport_of(peer)


SIZES = [0, 1, 7, 95, 96, 4096, 65_503, 65_536, 1 << 20, (1 << 20) + 3, 16 << 20]


def test_sizes_both_directions(transport):
    sizes = sorted({_sized(transport, s) for s in SIZES})
    assert run(transport, _exchange_sizes, 2, sizes) == [transport[1]] * 2


def _available_bytes() -> int:
    """MemAvailable of this host (or VM), from /proc/meminfo."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


#: what the 256 MiB exchange takes on two ranks: each holds its two buffers, the reference
#: pattern and the comparison's temporaries, about 1.7 GB of resident memory
FULL_DUPLEX_BYTES = 4 << 30


@pytest.mark.parametrize("variant", DEFAULTS)
def test_256_mib_full_duplex(variant, monkeypatch):
    t = _usable(variant, HOST, monkeypatch)
    if _available_bytes() < FULL_DUPLEX_BYTES:
        pytest.skip(f"needs {FULL_DUPLEX_BYTES >> 30} GiB of available memory, this host has "
                    f"{_available_bytes() / 2**30:.1f} GiB (the rdma-lab VM has 2 GiB)")
    run(t, _exchange_sizes, 2, [256 << 20], timeout=120)


def _ordering_and_tags(comm, mem_type, step):
    peer = 1 - comm.rank
    ch = comm.channel(peer)
    if comm.rank == 0:
        # Many messages per tag, tags interleaved; large and small mixed.
        bufs, reqs = [], []
        for i in range(40):
            for tag in (1, 2, 3):
                bufs.append(_filled(mem_type, 10 + i * step * tag, i * 10 + tag))
                reqs.append(ch.isend(_ref(bufs[-1]), tag=tag))
        _wait(comm, reqs, 30)
        return None
    # Receive tag 3 first, then 1, then 2: messages of one tag arrive in order.
    got = {}
    for tag in (3, 1, 2):
        for i in range(40):
            n = 10 + i * step * tag
            buf = _alloc(mem_type, n)
            _wait(comm, [ch.irecv(_ref(buf), tag=tag)], 30)
            got[(tag, i)] = bool(np.array_equal(_host(mem_type, buf), _pattern(n, i * 10 + tag)))
    assert all(got.values()), [k for k, v in got.items() if not v]
    return len(got)


def test_ordering_and_tags(transport):
    step = _sized(transport, 1000 << 10) >> 10     # messages up to 117 KB, or 7.5 KB
    assert run(transport, _ordering_and_tags, 2, step)[1] == 120


def _many_in_flight(comm, mem_type):
    """Post many receives before any send: all complete, each into its own buffer."""
    peer = 1 - comm.rank
    ch = comm.channel(peer)
    bufs = [_alloc(mem_type, 1000 + i) for i in range(64)]
    recvs = [ch.irecv(_ref(b), tag=5) for b in bufs]
    srcs = [_filled(mem_type, 1000 + i, comm.rank + i) for i in range(64)]
    sends = [ch.isend(_ref(s), tag=5) for s in srcs]
    _wait(comm, recvs + sends, 30)
    return all(np.array_equal(_host(mem_type, b), _pattern(1000 + i, peer + i))
               for i, b in enumerate(bufs))


def test_many_messages_in_flight(transport):
    assert run(transport, _many_in_flight, 2) == [True, True]


def _backpressure(comm, mem_type, size):
    """Many large sends before any receive is posted: the sender must wait for room (socket
    buffers, slots, credits), never overrun; every byte arrives once receives are posted."""
    peer = 1 - comm.rank
    ch = comm.channel(peer)
    count = 48
    if comm.rank == 0:
        bufs = [_filled(mem_type, size, i) for i in range(count)]
        reqs = [ch.isend(_ref(b), tag=11) for b in bufs]
        _wait(comm, reqs, 60)
        return sum(r.done for r in reqs)
    time.sleep(0.5)            # the sender has queued everything by now
    ok = 0
    for i in range(count):
        into = _alloc(mem_type, size)
        _wait(comm, [ch.irecv(_ref(into), tag=11)], 60)
        ok += bool(np.array_equal(_host(mem_type, into), _pattern(size, i)))
    return ok


def test_backpressure_many_large_sends_before_any_receive(transport):
    assert run(transport, _backpressure, 2, _sized(transport, 1 << 20)) == [48, 48]


def _progress_without_receive(comm, mem_type, big):
    """Rank 0 queues a large send to rank 1 and then waits only for a message from rank 2,
    which rank 2 sends only after rank 1 got rank 0's message: rank 0's send must progress
    while it waits for something else (one progress engine, no ``extra=`` channels)."""
    small = 8
    if comm.rank == 0:
        data = _filled(mem_type, big, 3)
        s = comm.channel(1).isend(_ref(data), tag=1)
        got = _alloc(mem_type, small)
        _wait(comm, [comm.channel(2).irecv(_ref(got), tag=2)], 60)
        _wait(comm, [s], 60)
        return bool(np.array_equal(_host(mem_type, got), _pattern(small, 9)))
    if comm.rank == 1:
        time.sleep(0.3)     # rank 0 is waiting on rank 2 by now, with its send queued
        into = _alloc(mem_type, big)
        _wait(comm, [comm.channel(0).irecv(_ref(into), tag=1)], 60)
        note = _filled(mem_type, small, 5)
        _wait(comm, [comm.channel(2).isend(_ref(note), tag=3)], 60)
        return bool(np.array_equal(_host(mem_type, into), _pattern(big, 3)))
    note = _alloc(mem_type, small)
    _wait(comm, [comm.channel(1).irecv(_ref(note), tag=3)], 60)
    reply = _filled(mem_type, small, 9)
    _wait(comm, [comm.channel(0).isend(_ref(reply), tag=2)], 60)
    return True


def test_send_progresses_while_waiting_for_another_peer(transport):
    big = _sized(transport, 32 << 20)
    assert run(transport, _progress_without_receive, 3, big) == [True, True, True]


def _buffer_freed_and_reused(comm, mem_type, large):
    """Send from a buffer, free it, send again from new memory (often at the same address):
    the receiver must get the new bytes (no stale registration or mapping)."""
    peer = 1 - comm.rank
    ch = comm.channel(peer)
    ok = []
    for size in (4096, large):
        for round_ in range(3):
            seed = 100 * round_ + comm.rank
            if comm.rank == 0:
                buf = _filled(mem_type, size, seed)
                _wait(comm, [ch.isend(_ref(buf), tag=4)], 30)
                del buf                   # freed; the next allocation may reuse the address
            else:
                into = _alloc(mem_type, size)
                _wait(comm, [ch.irecv(_ref(into), tag=4)], 30)
                ok.append(bool(np.array_equal(_host(mem_type, into),
                                              _pattern(size, 100 * round_))))
    return all(ok)


def test_buffer_freed_and_reused(transport):
    assert run(transport, _buffer_freed_and_reused, 2, _sized(transport, 4 << 20)) == [True] * 2


def _deadline(comm, mem_type):
    ch = comm.channel(1 - comm.rank)
    buf = _alloc(mem_type, 16)
    start = time.monotonic()
    try:
        _wait(comm, [ch.irecv(_ref(buf), tag=99)], 0.5)
    except WaitTimeout as e:
        result = (time.monotonic() - start, len(e.pending))
    else:
        return None
    _store_barrier(comm, "deadline")   # neither rank may close before the other timed out
    return result


def test_deadline_expires(transport):
    for elapsed, pending in run(transport, _deadline, 2):
        assert pending == 1
        assert 0.5 <= elapsed < 10


def _size_mismatch(comm, mem_type):
    peer = 1 - comm.rank
    ch = comm.channel(peer)
    out = _filled(mem_type, 100 + comm.rank * 100_000, 1)
    into = _alloc(mem_type, 100 + peer * 100_000 + 1)   # one byte too many, both sides
    s = ch.isend(_ref(out))
    r = ch.irecv(_ref(into))
    try:
        _wait(comm, [r, s], 10)
    except MessageSizeMismatch as e:
        return str(e)
    except PeerLost:
        return "peer-lost"   # the other side broke the connection first
    return None


def test_size_mismatch_raises(transport):
    results = run(transport, _size_mismatch, 2)
    assert any(r and "posted a receive of" in r for r in results), results
    assert all(r is not None for r in results)


def _peer_dies(comm, mem_type):
    peer = 1 - comm.rank
    ch = comm.channel(peer)
    hello_out, hello_in = _filled(mem_type, 8, comm.rank), _alloc(mem_type, 8)
    _wait(comm, [ch.irecv(_ref(hello_in), tag=1), ch.isend(_ref(hello_out), tag=1)], 30)
    if comm.rank == 1:     # connected (connections are lazy): now vanish
        time.sleep(0.3)
        if _in_process(comm.transport_of(0)):
            return None    # a thread-rank cannot die alone: it leaves (closes its transport)
        os._exit(3)        # a process-rank dies without finalize
    buf = _alloc(mem_type, 1 << 20)
    start = time.monotonic()
    try:
        _wait(comm, [ch.irecv(_ref(buf))], 30)
    except PeerLost as e:
        return (time.monotonic() - start, e.peer, str(e))
    return None


def test_peer_death_raises_peer_lost(transport):
    outcomes = run(transport, _peer_dies, 2, expect_failure=True)
    kind, value = ("ok", outcomes[0]) if _in_process(transport[1]) else outcomes[0]
    assert kind == "ok", value
    elapsed, peer, message = value
    assert peer == 1 and "peer rank 1" in message
    assert elapsed < 10   # noticed long before the 30 s deadline


def _late_receive_for_set_aside_message(comm, mem_type):
    """A large tag-0 message is being set aside (no receive for it yet) when its receive is
    posted: that receive must get it, in order (regression: it used to be stranded)."""
    peer = 1 - comm.rank
    ch = comm.channel(peer)
    big = 8 << 20
    if comm.rank == 0:
        a, b = _filled(mem_type, big, 1), _filled(mem_type, 16, 2)
        _wait(comm, [ch.isend(_ref(a), tag=0), ch.isend(_ref(b), tag=1)], 30)
        return True
    time.sleep(0.3)
    first, second = _alloc(mem_type, 16), _alloc(mem_type, big)
    r1 = ch.irecv(_ref(first), tag=1)       # the tag-0 message is read aside meanwhile
    comm._peers.engine.progress()
    r0 = ch.irecv(_ref(second), tag=0)      # posted while it is still arriving
    _wait(comm, [r1, r0], 30)
    return bool(np.array_equal(_host(mem_type, second), _pattern(big, 1))
                and np.array_equal(_host(mem_type, first), _pattern(16, 2)))


@pytest.mark.parametrize("variant", ["shm-copy", *DEFAULTS])
def test_receive_posted_while_message_is_set_aside(variant, monkeypatch):
    t = _usable(variant, HOST, monkeypatch)
    assert run(t, _late_receive_for_set_aside_message, 2) == [True, True]


def _message_outlives_its_sender(comm, mem_type):
    """Rank 1 sends three small messages and leaves. Rank 0 had read two of them aside while
    receiving the third; a receive for a message that never came reports the peer as gone
    (the channel breaks), and the two held messages are still delivered after that: MPI
    delivers what was sent."""
    ch = comm.channel(1 - comm.rank)
    if comm.rank == 1:
        msgs = [_filled(mem_type, 16, k) for k in range(3)]
        _wait(comm, [ch.isend(_ref(msgs[0]), tag=1), ch.isend(_ref(msgs[1]), tag=2),
                     ch.isend(_ref(msgs[2]), tag=3)], 30)
        time.sleep(0.2)
        return None            # leaves: the harness closes this rank's transports
    last = _alloc(mem_type, 16)
    _wait(comm, [ch.irecv(_ref(last), tag=3)], 30)   # tags 1 and 2 are held meanwhile
    try:
        _wait(comm, [ch.irecv(_ref(_alloc(mem_type, 16)), tag=4)], 10)
        outcome = "no error"
    except (PeerLost, WaitTimeout) as e:
        outcome = type(e).__name__
    got = []
    for tag in (1, 2):
        into = _alloc(mem_type, 16)
        _wait(comm, [ch.irecv(_ref(into), tag=tag)], 5)
        got.append(bool(np.array_equal(_host(mem_type, into), _pattern(16, tag - 1))))
    return got + [outcome]


def test_held_messages_outlive_their_sender(transport):
    got = run(transport, _message_outlives_its_sender, 2)[0]
    assert got[:2] == [True, True], got
    assert got[2] == "PeerLost", got


def _any_source(comm, mem_type):
    """Receives from any source, below the algorithms: ranks 1 and 2 each send 4 messages
    (eager and large sizes) with one tag; rank 0 posts alternatives on both channels for each
    receive, some before the messages arrive and some after (held). Every message lands
    exactly once, in its source's order, and the losing alternatives never receive bytes."""
    from pycoll.transports.matching import AnySource

    sizes = [8, 4096, 1 << 20, 24]
    if comm.rank != 0:
        ch = comm.channel(0)
        reqs = [ch.isend(_ref(_filled(mem_type, n, 10 * comm.rank + k)), tag=5)
                for k, n in enumerate(sizes)]
        _wait(comm, reqs, 60)
        _store_barrier(comm, "any-done")
        return None
    chans = {p: comm.channel(p) for p in (1, 2)}
    got = {1: [], 2: []}
    for i in range(2 * len(sizes)):
        if i == 3:
            time.sleep(0.3)          # let the rest arrive first: matched from held messages
        # each source's next message has a known size: post the size both would need only
        # when it is the same, else receive from the one whose next size is known to be it
        nxt = {p: sizes[len(got[p])] for p in got if len(got[p]) < len(sizes)}
        n = min(nxt.values())
        srcs = [p for p in nxt if nxt[p] == n]
        into = _alloc(mem_type, n)
        group = AnySource()
        reqs = []
        for p in srcs:
            if group.matched is None:
                reqs.append(chans[p].irecv_any(_ref(into), 5, group))
        _wait(comm, reqs, 60)
        winner = srcs[reqs.index(group.matched)]
        losers = [r for r in reqs if r is not group.matched]
        assert all(r.done and r.error is None and r.bytes_done == 0 for r in losers), losers
        k = len(got[winner])
        assert np.array_equal(_host(mem_type, into), _pattern(n, 10 * winner + k)), (i, winner)
        got[winner].append(n)
    assert got == {1: sizes, 2: sizes}, got
    _store_barrier(comm, "any-done")
    return "ok"


def test_receive_from_any_source(transport):
    assert run(transport, _any_source, 3)[0] == "ok"


def _one_sided(comm, mem_type):
    """Rank 1 registers a region and sends its record; rank 0 puts two pieces into it with
    notices; rank 1 sees the notices in order, and the bytes are in place when it does. A put
    outside the region fails on the writer without touching the peer."""
    import json

    ch = comm.channel(1 - comm.rank)
    transport = ch.transport
    size = 3 << 20
    record_bytes = np.zeros(512, dtype=np.uint8)
    if comm.rank == 1:
        region = _alloc(mem_type, size)
        _host(mem_type, region)[...] = 0
        record = json.dumps(transport.register(_ref(region))).encode()
        record_bytes[:len(record)] = np.frombuffer(record, dtype=np.uint8)
        _wait(comm, [ch.isend(_ref(record_bytes), tag=1)], 30)
        notices, deadline = [], time.monotonic() + 30
        while len(notices) < 2 and time.monotonic() < deadline:
            notices += transport.notifications()
            time.sleep(0.001)
        got = _host(mem_type, region)
        ok = (bool(np.array_equal(got[1000:1000 + (2 << 20)], _pattern(2 << 20, 5)))
              and bool(np.array_equal(got[:16], _pattern(16, 6)))
              and not got[16:1000].any() and not got[1000 + (2 << 20):].any())
        _wait(comm, [ch.isend(_ref(record_bytes[:1]), tag=2)], 30)   # done: rank 0 may leave
        return notices, ok
    _wait(comm, [ch.irecv(_ref(record_bytes), tag=1)], 30)
    remote = json.loads(bytes(record_bytes).rstrip(b"\0"))
    big, small = _filled(mem_type, 2 << 20, 5), _filled(mem_type, 16, 6)
    _wait(comm, [ch.put(_ref(big), remote, 1000, notify=42),
                 ch.put(_ref(small), remote, 0, notify=43)], 30)
    bad = ch.put(_ref(small), remote, size - 8, notify=44)       # 8 bytes past the end
    refused = bad.done and "does not fit" in str(bad.error)
    _wait(comm, [ch.irecv(_ref(record_bytes[:1]), tag=2)], 30)
    return refused


def _put_refused(comm, mem_type):
    """Rank 1 exposes a region (a real registration where the transport has one); rank 0's
    put into it must be refused with a reason."""
    import json

    ch = comm.channel(1 - comm.rank)
    record = np.zeros(512, dtype=np.uint8)
    if comm.rank == 1:
        region = _alloc(mem_type, 64)
        try:
            remote = ch.transport.register(_ref(region))
        except Exception:   # noqa: BLE001 - a transport without one-sided support
            remote = {"addr": 0, "nbytes": 64}
        raw = json.dumps(remote).encode()
        record[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        _wait(comm, [ch.isend(_ref(record), tag=1)], 30)
        _wait(comm, [ch.irecv(_ref(record[:1]), tag=2)], 30)
        return "rank 1"
    _wait(comm, [ch.irecv(_ref(record), tag=1)], 30)
    remote = json.loads(bytes(record).rstrip(b"\0"))
    try:
        req = ch.put(_ref(_filled(mem_type, 16, 1)), remote, 0, notify=1)
        message = str(req.error)
    except Exception as e:   # noqa: BLE001 - the message is checked
        message = str(e)
    _wait(comm, [ch.isend(_ref(record[:1]), tag=2)], 30)
    return message


def test_one_sided_put_with_notification(transport):
    variant, name = transport[0], transport[1]
    if transport[3] == CUDA:
        pytest.skip("one-sided puts move host memory only (cuda_ipc: two-sided device copies)")
    if not registry.transport_class(name).capabilities.one_sided:
        # Not declared: put is refused, clearly, never silently dropped.
        assert "not supported" in run(transport, _put_refused, 2)[0]
        return
    if variant in ("shm-copy", "shm-tiny"):
        # Cross-memory attach disabled (PYCOLL_SHM_CMA=0): put is refused, saying why.
        assert "not permitted" in run(transport, _put_refused, 2)[0]
        return
    refused, (notices, ok) = run(transport, _one_sided, 2)
    assert refused
    assert notices == [(0, 42), (0, 43)]
    assert ok
