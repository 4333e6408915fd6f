"""One-sided windows (docs/windows.md) with real ranks: processes over shm, tcp (emulated
by the target's progress) and verbs (in the Soft-RoCE VM), threads over inproc.

Results are compared with numpy references computed from the same seeds; nothing is timed.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

import pycoll
from pycoll import InvalidArgument, InvalidDtype, PeerLost, WindowError
from pycoll.testing import run_ranks, run_threads
from pycoll.transports.verbs.device import probe

N = 16   # elements per rank's block


def run(transport, fn, n, *args, **kw):
    """``fn(comm, *args)`` on ``n`` ranks: processes (shm, tcp), or threads (inproc)."""
    if transport == "inproc":
        kw.pop("expect_failure", None)
        return run_threads(fn, n, *args, timeout=kw.pop("timeout", 120), **kw)
    return run_ranks(fn, n, *args, env={"PYCOLL_TRANSPORTS": transport},
                     timeout=kw.pop("timeout", 120), **kw)


_VERBS, _NO_VERBS = probe()
#: verbs needs an RDMA device (elsewhere its cases skip): the Soft-RoCE VM runs them
NO_VERBS = (f"verbs is not usable here: {_NO_VERBS}; run bash tests/verbs/run_in_vm.sh --cmd "
            "'python3 -m pytest -q tests/core/test_windows.py -k verbs' (Soft-RoCE VM)")
WINDOWED = ["shm", "inproc", "tcp",
            pytest.param("verbs", marks=pytest.mark.skipif(_VERBS is None, reason=NO_VERBS))]


def _open(comm, buf, allocate):
    """(window, its memory on this rank): ``comm.window(buf)``, or with ``allocate`` a window
    pycoll allocates (``allocate_window``; shm peers map it), started from ``buf``'s values."""
    if not allocate:
        return comm.window(buf), buf
    win = comm.allocate_window(buf.size, buf.dtype)
    assert win.local.shape == buf.shape and not win.local.any()    # zeroed
    win.local[:] = buf
    comm.barrier()                                  # no origin writes before this
    return win, win.local


#: window kinds: on the user's buffer, and allocated by pycoll
KINDS = [pytest.param(False, id="window"), pytest.param(True, id="allocated")]


# -- put, get, signal -------------------------------------------------------------------------
def _put_get_signal(comm, allocate=False):
    r, s = comm.rank, comm.size
    win, buf = _open(comm, np.zeros(N * s, dtype=np.float64), allocate)
    with win:
        for t in range(s):                        # my block into every rank's window
            win.put(np.full(N, r + 1.0) + np.arange(N), t, offset=r * N)
        win.fence()
        mine = buf.copy()
        got = np.zeros(N * s)
        win.get(got, (r + 1) % s)                 # the whole of my right neighbour's window
        part = np.zeros(3)
        win.get(part, (r - 1) % s, offset=N * s - 3)
        win.fence()                               # nobody writes until everyone has read
        for t in range(s):
            if t != r:
                win.signal(t, r + 1)
        total = sum(q + 1 for q in range(s) if q != r)
        counter = win.wait_signal(total, timeout=60)
    return mine, got, part, counter, total


@pytest.mark.parametrize("allocate", KINDS)
@pytest.mark.parametrize("transport", WINDOWED)
@pytest.mark.parametrize("n", [2, 3, 8])
def test_put_get_and_signal(transport, n, allocate):
    if allocate and n == 8 and transport != "shm":
        pytest.skip("allocated windows at 8 ranks: shm (its mapped path) is enough")
    expected = np.concatenate([np.full(N, q + 1.0) + np.arange(N) for q in range(n)])
    for mine, got, part, counter, total in run(transport, _put_get_signal, n, allocate):
        np.testing.assert_array_equal(mine, expected)
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(part, expected[-3:])
        assert counter == total


# -- concurrent accumulates into one target ---------------------------------------------------
ROUNDS = 20


def _contribution(rank, k, count):
    return np.random.default_rng(1000 * rank + k).integers(-50, 50, count, dtype=np.int64)


def _accumulate(comm, op, allocate=False):
    r, s = comm.rank, comm.size
    win, buf = _open(comm, np.full(N * s, 3 if op == "prod" else 7, dtype=np.int64), allocate)
    for k in range(ROUNDS):                       # every rank, the whole of rank 0's window
        src = _contribution(r, k, N * s)
        if op == "prod":
            src = np.where(src % 2 == 0, 1, -1).astype(np.int64)
        win.accumulate(src, 0, op=op)
        win.accumulate(np.full(N, k + 1, dtype=np.int64), (r + 1) % s, offset=r * N, op=op)
    win.fence()
    out = buf.copy()
    win.close()
    return out


@pytest.mark.parametrize("transport", WINDOWED)
@pytest.mark.parametrize("n,op,allocate", [(2, "sum", False), (4, "sum", False),
                                           (8, "sum", False), (4, "max", False),
                                           (3, "prod", False), (4, "sum", True),
                                           (3, "prod", True)])
def test_concurrent_accumulates_match_numpy(transport, n, op, allocate):
    ufunc = {"sum": np.add, "max": np.maximum, "prod": np.multiply}[op]
    start = 3 if op == "prod" else 7
    ref = [np.full(N * n, start, dtype=np.int64) for _ in range(n)]
    for k in range(ROUNDS):
        for q in range(n):
            src = _contribution(q, k, N * n)
            if op == "prod":
                src = np.where(src % 2 == 0, 1, -1).astype(np.int64)
            ufunc(ref[0], src, out=ref[0])
            block = ref[(q + 1) % n][q * N:(q + 1) * N]
            ufunc(block, np.full(N, k + 1, dtype=np.int64), out=block)
    for rank, out in enumerate(run(transport, _accumulate, n, op, allocate)):
        np.testing.assert_array_equal(out, ref[rank], err_msg=f"rank {rank}")


# -- refusals: nothing moves ------------------------------------------------------------------
def _refusals(comm, allocate=False):
    r, s = comm.rank, comm.size
    win, buf = _open(comm, np.full(N, -1.0), allocate)
    target = (r + 1) % s
    errors = []
    attempts = [
        lambda: win.put(np.ones(N + 1), target),                      # longer than the window
        lambda: win.put(np.ones(4), target, offset=N - 3),            # runs past the end
        lambda: win.put(np.ones(4), target, offset=-1),
        lambda: win.accumulate(np.ones(2), target, offset=N - 1),
        lambda: win.get(np.zeros(2), target, offset=N - 1),
        lambda: win.put(np.ones(4, dtype=np.float32), target),        # wrong dtype
        lambda: win.accumulate(np.ones(4, dtype=np.int64), target),
        lambda: win.get(np.zeros(4, dtype=np.float32), target),
        lambda: win.put(np.ones(4), s),                               # not a rank
        lambda: win.accumulate(np.ones(4), target, op="avg"),         # not one step
    ]
    for attempt in attempts:
        try:
            attempt()
            errors.append(None)
        except (InvalidArgument, InvalidDtype) as e:
            errors.append((type(e).__name__, str(e)))
    win.fence()
    untouched = bool((buf == -1.0).all())
    dst = np.full(4, 5.0)
    try:
        win.get(dst, target, offset=N - 3)
    except InvalidArgument:
        pass
    win.close()
    try:
        win.put(np.ones(1), target)
        closed = None
    except WindowError as e:
        closed = str(e)
    return errors, untouched, dst.tolist(), closed


@pytest.mark.parametrize("allocate", KINDS)
@pytest.mark.parametrize("transport", WINDOWED)
def test_out_of_bounds_and_dtype_refused_with_nothing_written(transport, allocate):
    for rank, (errors, untouched, dst, closed) in enumerate(run(transport, _refusals, 3,
                                                                 allocate)):
        assert None not in errors, errors
        target = (rank + 1) % 3
        for kind, message in errors[:5]:
            assert kind == "InvalidArgument"
            assert f"rank {rank}" in message and f"target rank {target}" in message
            assert "nothing was moved" in message
        assert "window of 16 float64 elements" in errors[1][1]
        for kind, message in errors[5:8]:
            assert kind == "InvalidDtype" and "float64" in message
        assert untouched
        assert dst == [5.0] * 4
        assert closed is not None and "was closed" in closed


def _mixed_dtypes(comm):
    dtype = np.float64 if comm.rank == 0 else np.float32
    try:
        comm.window(np.zeros(4, dtype=dtype))
    except InvalidDtype as e:
        return str(e)
    return None


def test_window_of_mixed_dtypes_refused_on_every_rank():
    for message in run("shm", _mixed_dtypes, 2):
        assert message is not None and "rank 1: float32" in message


# -- what a window cannot outlive -------------------------------------------------------------
def _target_dies(comm, threads, allocate=False):
    win, _ = _open(comm, np.zeros(N), allocate)
    comm.barrier()
    if comm.rank == 1:
        if not threads:
            os._exit(0)                  # a process that dies without a word
        comm.finalize()                  # a thread: its transport closes
        return None
    deadline = time.monotonic() + 60
    ops = [("put", lambda: win.put(np.ones(N), 1)), ("flush", lambda: win.flush(1)),
           ("accumulate", lambda: win.accumulate(np.ones(N), 1)),
           ("signal", lambda: win.signal(1))]
    while time.monotonic() < deadline:
        for name, op in ops:
            try:
                op()
            except PeerLost as e:
                return e.peer, str(e), name
        time.sleep(0.01)
    return "no PeerLost within 60 s"


@pytest.mark.parametrize("allocate", KINDS)
@pytest.mark.parametrize("transport", WINDOWED)
def test_dead_target_raises_peer_lost_naming_it(transport, allocate):
    """Over shm an allocated window is mapped by the origin, so a put into a dead target
    returns (its pages outlive it): the flush after it, or an accumulate (the operations
    that ask whether the target lives), raises (docs/windows.md). Which of the two sees the
    exit first depends on when the kernel reports it: a loaded host let an accumulate win."""
    outcomes = run(transport, _target_dies, 2, transport == "inproc", allocate,
                   expect_failure=True, timeout=120)
    first = outcomes[0][1] if transport != "inproc" else outcomes[0]
    peer, message, op = first
    assert peer == 1
    assert "target rank 1 is gone" in message and "rank 0" in message
    if allocate and transport == "shm":
        assert op in ("flush", "accumulate"), first


def _after_finalize(comm):
    win = comm.window(np.zeros(4))
    sub = comm.split(0)
    sub_win = sub.window(np.zeros(4))
    sub.finalize()
    try:
        sub_win.put(np.ones(4), 0)
    except WindowError as e:
        return str(e), repr(win)
    return None


def test_windows_of_a_finalized_communicator_refuse():
    for message, world_repr in run("shm", _after_finalize, 2):
        assert "finalized communicator" in message
        assert "open" in world_repr


def _world_window(comm):
    buf = np.zeros(2, dtype=np.int32)
    win = pycoll.window(buf)
    win.accumulate(np.array([1, comm.rank], dtype=np.int32), 0)
    win.fence()
    out = buf.copy()
    win.close()
    return out.tolist()


def test_module_level_window_on_the_default_world():
    assert run("shm", _world_window, 3)[0] == [3, 3]


def _example(comm):
    import importlib.util
    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "window_blocks.py")
    spec = importlib.util.spec_from_file_location("window_blocks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(comm)


def test_the_block_transfer_example_runs():
    """examples/window_blocks.py, the example docs/windows.md shows."""
    assert run("shm", _example, 2) == [0, 8]


def _after_shrink(comm, allocate=False):
    win, _ = _open(comm, np.zeros(4), allocate)
    new = comm.shrink()
    try:
        win.put(np.ones(4), (comm.rank + 1) % comm.size)
        refused = None
    except WindowError as e:
        refused = str(e)
    buf = np.zeros(4)
    with new.window(buf) as again:                 # the successor makes its own
        again.accumulate(np.ones(4), 0)
        again.fence()
        total = buf.tolist()
    new.finalize()
    return refused, total


@pytest.mark.parametrize("allocate", KINDS)
@pytest.mark.parametrize("transport", WINDOWED)
def test_windows_of_a_shrunk_communicator_refuse(transport, allocate):
    outcomes = run(transport, _after_shrink, 3, allocate)
    for refused, _total in outcomes:
        assert refused is not None and "a shrink or grow replaced" in refused
    assert outcomes[0][1] == [3.0] * 4


def _non_blocking(comm):
    r, s = comm.rank, comm.size
    buf = np.zeros(s, dtype=np.int64)
    win = comm.window(buf)
    works = [win.put(np.array([r + 1]), t, offset=r, async_op=True) for t in range(s)]
    for w in works:
        w.wait(timeout=30)
    win.fence()                              # every put is in before anyone accumulates
    works.append(win.accumulate(np.ones(s, dtype=np.int64), 0, async_op=True))
    works[-1].wait(timeout=30)
    win.fence()
    dst = np.zeros(s, dtype=np.int64)
    got = win.get(dst, (r + 1) % s, async_op=True).result(timeout=30)
    done = all(w.is_completed() and w.is_success() for w in works)
    win.close()
    return done, got is dst, dst.tolist()


@pytest.mark.parametrize("transport", WINDOWED)
def test_non_blocking_forms_return_work_handles(transport):
    n = 3
    for rank, (done, same, got) in enumerate(run(transport, _non_blocking, n)):
        assert done and same
        expected = [q + 1 for q in range(n)]
        if (rank + 1) % n == 0:
            expected = [v + n for v in expected]
        assert got == expected


# -- tcp: what the target's progress serves ---------------------------------------------------
def _malformed_requests(comm):
    """Rank 0 sends requests that a buggy (but authenticated) peer could: the target refuses
    each with an error status and writes nothing; a stranger's frames on its port never get
    past the handshake."""
    import json
    import socket
    import struct

    from pycoll.tags import WINDOW_TAG
    from pycoll.transports.tcp import window as tw
    from pycoll.transports.tcp.channel import HEADER
    buf = np.full(N, -1.0)
    win = comm.window(buf)
    address = comm.channel(1 - comm.rank).transport.address()
    addresses = [json.loads(bytes(p)) for p in comm.allgatherv(
        np.frombuffer(json.dumps(address).encode(), dtype=np.uint8))]
    refusals = []
    if comm.rank == 0:
        remote = win._remotes[1]
        deadline = time.monotonic() + 60
        data = memoryview(np.ones(N + 4).tobytes())
        attempts = [
            dict(kind=tw.PUT, offset=8, nbytes=N * 8, payload=data[:N * 8]),     # past the end
            dict(kind=tw.PUT, offset=-8, nbytes=8, payload=data[:8]),
            dict(kind=tw.PUT, offset=0, nbytes=16, payload=data[:8]),            # short data
            dict(kind=tw.PUT, offset=0, nbytes=8, payload=data[:8], code=0),     # dtype
            dict(kind=tw.ACCUMULATE, offset=4, nbytes=8, payload=data[:8]),      # misaligned
            dict(kind=tw.ACCUMULATE, offset=0, nbytes=8, payload=data[:8], op=99),
            dict(kind=tw.ACCUMULATE, offset=0, nbytes=8, payload=data[:8], op=4),  # band: float
            dict(kind=9, offset=0, nbytes=0),
            dict(kind=tw.GET, offset=N * 8 - 8, nbytes=16, into=memoryview(bytearray(16))),
        ]
        for a in attempts:
            kind, offset, nbytes = a.pop("kind"), a.pop("offset"), a.pop("nbytes")
            try:
                remote.request(kind, offset, nbytes, deadline, **a)
                refusals.append(None)
            except pycoll.TransportError as e:
                refusals.append(str(e))
        wid, remote.wid = remote.wid, 999                                  # no such window
        try:
            remote.request(tw.SIGNAL, 0, 0, deadline, value=1)
            refusals.append(None)
        except pycoll.TransportError as e:
            refusals.append(str(e))
        remote.wid = wid
        # a stranger: the forged put must never reach the window
        forged = tw.HEAD.pack(tw.PUT, 0, 13, 1, 0, 0, 8, 0) + struct.pack("<d", 7.0)
        peer = addresses[1]
        with socket.create_connection((peer["host"], peer["port"]), timeout=10) as s:
            try:
                s.sendall(HEADER.pack(WINDOW_TAG, len(forged)) + forged)
                s.settimeout(10)
                s.recv(16)
            except OSError:
                pass
    win.fence()
    untouched = bool((buf == -1.0).all()) or buf.tolist()
    win.fence()                                  # everyone has looked
    win.put(np.arange(N, dtype=np.float64), 1 - comm.rank)                  # still works
    win.fence()
    works = buf.tolist() == list(range(N))
    win.close()
    return refusals, untouched, works


def test_tcp_target_refuses_malformed_requests_and_strangers():
    for rank, (refusals, untouched, works) in enumerate(run("tcp", _malformed_requests, 2)):
        assert untouched is True and works, (rank, untouched, works)
        if rank == 0:
            assert None not in refusals, refusals
            assert all("peer rank 1 refused" in r and "nothing was written" in r
                       for r in refusals), refusals
            assert "outside its window" in refusals[0]
            assert "dtype differs" in refusals[3]
            assert "not open there" in refusals[-1]


def _busy_target(comm, flag):
    """Over tcp a target serves only inside pycoll: a get to a rank computing in user code
    waits for it, until the deadline; once the target enters pycoll, it is served."""
    buf = np.full(4, float(comm.rank + 1))
    win = comm.window(buf, timeout=2)
    comm.barrier()
    if comm.rank == 1:
        with open(flag + ".busy", "w"):           # out of pycoll from here on
            pass
        deadline = time.monotonic() + 60
        while not os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.01)                      # "computing": no pycoll call
        win.fence(timeout=60)
        win.fence(timeout=60)
        win.close(timeout=60)
        return None
    deadline = time.monotonic() + 60
    while not os.path.exists(flag + ".busy") and time.monotonic() < deadline:
        time.sleep(0.01)
    dst = np.zeros(4)
    try:
        win.get(dst, 1)
        first = None
    except pycoll.CollectiveTimeout as e:
        first = str(e)
    with open(flag, "w"):
        pass
    win.fence(timeout=60)
    win.get(dst, 1)                              # rank 1 now waits in the fence: served
    win.fence(timeout=60)
    from pycoll.tags import WINDOW_TAG
    late = [t for t, _n, _p in comm.channel(1).matcher.unexpected if t >= WINDOW_TAG]
    win.close(timeout=60)
    return first, dst.tolist(), late


def test_tcp_get_waits_for_a_busy_target_until_its_deadline(tmp_path):
    first, got, late = run("tcp", _busy_target, 2, str(tmp_path / "go"))[0]
    assert first is not None and "peer rank(s) [1]" in first and "inside a pycoll call" in first
    assert got == [2.0] * 4
    assert late == []             # the timed-out get's reply came late: dropped, not held


def _load_example(name):
    import importlib.util
    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _param_server(comm, steps, dim):
    ps = _load_example("param_server")
    w_window, _ = ps.window_training(comm, steps, dim)
    w_allreduce, _ = ps.allreduce_training(comm, steps, dim)
    return w_window, w_allreduce


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_the_parameter_server_example_matches_allreduce_at_4_workers(transport):
    """examples/param_server.py: 4 workers accumulate into rank 0's window and get the
    weights; the same training with allreduce, and a numpy reference, agree."""
    ps = _load_example("param_server")
    steps, dim, workers = 5, 256, 4
    ref = np.zeros(dim)
    for step in range(steps):
        ref = ref - ps.LR * sum(ps.gradient(ref, r, step) for r in range(1, workers + 1)) / workers
    for w_window, w_allreduce in run(transport, _param_server, workers + 1, steps, dim):
        np.testing.assert_allclose(w_window, ref, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(w_allreduce, ref, rtol=1e-12, atol=1e-12)


CONTENDED = 1 << 13   # elements every rank adds into the same range of rank 0, many times


def _mixed_transports(comm, rounds):
    kinds = sorted({comm.transport_of(p) for p in range(comm.size) if p != comm.rank})
    buf = np.zeros(CONTENDED, dtype=np.int64)
    win = comm.window(buf)
    ones = np.ones(CONTENDED, dtype=np.int64)
    for _ in range(rounds):
        win.accumulate(ones, 0)
        if comm.rank == 0:              # rank 0 serves tcp only while it waits: a tcp round
            win.accumulate(ones, 2)     # trip of its own serves them while rank 1 (shm) adds
    win.fence()
    out = buf.copy()
    win.close()
    return kinds, out


def test_accumulates_from_shm_and_tcp_origins_are_atomic_together():
    """Two "hosts" of two ranks: each rank reaches its neighbour over shm and the others
    over tcp; rank 0's window takes concurrent accumulates into one range from both kinds
    of origin (tcp's target applies them through the same byte-range locks as shm's
    origins: without that, updates are lost)."""
    n, rounds = 4, 300
    hosts = {r: {"PYCOLL_HOST_ID": f"host{r // 2}"} for r in range(n)}
    outcomes = run_ranks(_mixed_transports, n, rounds, env={"PYCOLL_TRANSPORTS": "shm,tcp"},
                         rank_env=hosts, timeout=120)
    for kinds, _out in outcomes:
        assert kinds == ["shm", "tcp"], kinds
    assert (outcomes[0][1] == n * rounds).all(), np.unique(outcomes[0][1])
    assert (outcomes[2][1] == rounds).all()


def _large(comm):
    n = (1 << 20) + 3                      # striped over every socket of the pair
    peer = 1 - comm.rank
    buf = np.zeros(n, dtype=np.float32)
    with comm.window(buf) as win:
        win.put(np.arange(n, dtype=np.float32) + comm.rank, peer)
        win.fence()
        got = np.empty(n, dtype=np.float32)
        win.get(got, peer)
        win.fence()
    return (bool(np.array_equal(buf, np.arange(n, dtype=np.float32) + peer)),
            bool(np.array_equal(got, np.arange(n, dtype=np.float32) + comm.rank)))


def test_large_operations_over_several_tcp_sockets():
    results = run_ranks(_large, 2, env={"PYCOLL_TRANSPORTS": "tcp", "PYCOLL_SOCKET_NSOCKS": "3"},
                        timeout=120)
    assert results == [(True, True)] * 2


def _large_accumulate(comm):
    """Rank 1 accumulates 600 KB (verbs: several requests of whole elements, each in one
    eager message) into rank 0's window, twice, around rank 0's own accumulate."""
    n = 150_001
    buf = np.zeros(n, dtype=np.float32)
    with comm.window(buf) as win:
        src = np.arange(n, dtype=np.float32) % 97
        if comm.rank == 1:
            win.accumulate(src, 0)
            win.accumulate(src, 0)
        else:
            win.accumulate(np.ones(n, dtype=np.float32), 0)
        win.fence()
    return bool(np.array_equal(buf, 2 * src + 1)) if comm.rank == 0 else True


@pytest.mark.timeout(600)
def test_large_operations_over_verbs():
    """Over verbs: a 4 MiB put and get (RDMA WRITE and READ in several pieces of at most
    CHUNK_BYTES) and accumulates larger than one window request."""
    if _VERBS is None:
        pytest.skip(NO_VERBS)
    assert run("verbs", _large, 2, timeout=500) == [(True, True)] * 2
    assert run("verbs", _large_accumulate, 2, timeout=500) == [True, True]


def _oversized_request(comm):
    """A request frame longer than any open window of the target: the target breaks that
    pair's channel before reading it (no allocation of what the header claims) and stays
    up with its window untouched."""
    from pycoll.buffers.memory import MemRef
    from pycoll.tags import WINDOW_TAG
    from pycoll.transports.tcp import window as tw
    buf = np.full(N, -1.0)
    comm.window(buf)                  # stays open: the communicator holds it
    comm.barrier()
    if comm.rank == 0:
        frame = tw.HEAD.pack(tw.PUT, 0, 13, 1, 0, 0, 8 * N + 8, 0) + bytes(8 * N + 8)
        with comm._peers.engine.lock:
            req = comm.channel(1).isend(MemRef.of(frame), WINDOW_TAG)
        comm._peers.engine.wait([req], time.monotonic() + 30)
        return None
    ch = comm.channel(0)
    deadline = time.monotonic() + 60
    while ch.broken is None and time.monotonic() < deadline:
        comm.serve_windows()
        time.sleep(0.001)
    return str(ch.broken), bool((buf == -1.0).all())


def test_tcp_target_breaks_the_pair_on_an_oversized_request():
    outcomes = run_ranks(_oversized_request, 2, env={"PYCOLL_TRANSPORTS": "tcp"},
                         timeout=120, expect_failure=True)
    status, result = outcomes[1]
    assert status == "ok", result
    broken, untouched = result
    assert "malformed frame" in broken and untouched


# -- a target that released its window alone (issue 43, review finding 1) ---------------------
def _summed(comm):
    ones = np.ones(4)
    comm.allreduce(ones)
    return ones.tolist()


def _released_target(comm, allocate=False):
    """Rank 1 leaves the window on an exception (no barrier, as at finalize or shrink): its
    buffer is its own again; rank 0's operations on it must fail, naming rank 1, and write
    nothing, and the pair must still work afterwards (over verbs an RDMA access to the
    released region would break the pair)."""
    win, buf = _open(comm, np.zeros(N), allocate)
    comm.barrier()
    if comm.rank == 1:
        try:
            with win:
                raise RuntimeError("user code failed")
        except RuntimeError:
            pass
        comm.barrier()
        comm.barrier()                                   # rank 0 has tried
        untouched = bool((buf == 0).all())
        return untouched, _summed(comm)
    comm.barrier()                                       # rank 1 has released its window
    errors = []
    for attempt in (lambda: win.put(np.ones(N), 1),
                    lambda: win.accumulate(np.ones(N), 1),
                    lambda: win.get(np.zeros(N), 1),
                    lambda: win.signal(1),
                    lambda: win.put(np.ones(N), 1)):     # the first refusal broke nothing
        try:
            attempt()
            errors.append(None)
        except pycoll.PycollError as e:
            errors.append((type(e).__name__, e.peer, str(e)))
    comm.barrier()
    win.invalidate("the test ends")
    return errors, _summed(comm)


@pytest.mark.parametrize("allocate", KINDS)
@pytest.mark.parametrize("transport", WINDOWED)
def test_origin_refused_by_a_target_that_released_its_window(transport, allocate):
    (errors, summed0), (untouched, summed1) = run(transport, _released_target, 2, allocate)
    assert untouched is True
    for error in errors:
        assert error is not None, errors
        kind, peer, message = error
        assert kind == "TransportError", error
        assert peer == 1 and "target rank 1" in message and "rank 0" in message, error
    assert summed0 == summed1 == [2.0] * 4


def _invalidate_then_close(comm):
    win = comm.window(np.zeros(N))
    win.invalidate("the communicator ends")     # as finalize does; then the user closes it
    win.close()
    return win.closed


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_closing_an_invalidated_window_is_harmless(transport):
    assert run(transport, _invalidate_then_close, 2) == [True, True]


# -- accumulates from several threads of one process (review finding 2) -----------------------
THREADS, THREAD_ROUNDS = 4, 150


def _threaded_accumulates(comm):
    import threading
    buf = np.zeros(N, dtype=np.int64)
    win = comm.window(buf)
    errors = []

    def adder():
        try:
            for _ in range(THREAD_ROUNDS):                # rank 0's threads: its own window
                win.accumulate(np.ones(N, dtype=np.int64), 0)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))
    threads = [threading.Thread(target=adder) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    win.fence()
    out = buf.copy()
    win.close()
    return errors, out.tolist()


@pytest.mark.parametrize("transport", ["shm", "shm,tcp"])
def test_accumulates_from_threads_of_one_process_are_atomic(transport):
    results = run_ranks(_threaded_accumulates, 2, env={"PYCOLL_TRANSPORTS": transport},
                        timeout=300)
    errors, out = results[0]
    assert errors == []
    assert out == [2 * THREADS * THREAD_ROUNDS] * N


# -- a tcp target whose window lock is held keeps progressing (review finding 5) --------------
def _held_lock(comm):
    """Rank 1 holds its window's lock (as its own long accumulate would) while it progresses:
    rank 0's tcp accumulate is answered busy, not left waiting inside rank 1's progress; it
    goes through once the lock is free."""
    buf = np.zeros(N, dtype=np.int64)
    win = comm.window(buf)
    exposed = win._exposed["tcp"]
    if comm.rank == 1:
        exposed.lock.acquire()     # before rank 0 can send: its request finds the lock held
    comm.barrier()
    if comm.rank == 0:
        try:
            win.accumulate(np.ones(N, dtype=np.int64), 1, timeout=120)
            outcome = None
        except pycoll.PycollError as e:
            outcome = str(e)
        win.fence(timeout=120)
        win.close()
        return outcome
    deadline = time.monotonic() + 45
    while getattr(exposed, "busy", 0) == 0 and time.monotonic() < deadline:
        comm.serve_windows()                    # progress: rank 0's request is answered
        time.sleep(0.001)
    busy = getattr(exposed, "busy", 0)
    exposed.lock.release()
    win.fence(timeout=120)
    out = buf.tolist()
    win.close()
    return busy, out


def test_tcp_target_answers_busy_instead_of_waiting_for_its_window_lock():
    outcome, (busy, out) = run("tcp", _held_lock, 2, timeout=180)
    assert outcome is None, outcome
    assert busy > 0
    assert out == [1] * N


# -- a lying window record (review finding 12) -------------------------------------------------
def _lying_record(comm, victims):
    """Rank 0 attaches to rank 1 with records naming other files of the same user (4096
    bytes, as a control file): refused before anything is opened or written."""
    if comm.rank == 1:
        comm.barrier()
        return None
    ch = comm.channel(1)
    outcomes = []
    for victim in victims:
        record = {"pid": ch._peer_pid, "addr": 0, "nbytes": 8, "path": victim}
        try:
            remote = ch.attach_window(record)
        except pycoll.TransportError as e:
            outcomes.append(str(e))
            continue
        try:
            remote.add_signal(7, time.monotonic() + 10)
        finally:
            remote.close()
        outcomes.append(None)
    comm.barrier()
    return outcomes


def test_shm_window_record_naming_a_foreign_file_is_refused(tmp_path):
    from pycoll.transports.shm.segment import SHM_DIR, name_prefix
    victims = [str(tmp_path / "victim"), f"{SHM_DIR}/{name_prefix()}-victim-{os.getpid()}"]
    for victim in victims:
        with open(victim, "wb") as f:
            f.write(bytes(4096))
    try:
        outcomes = run("shm", _lying_record, 2, victims)[0]
        contents = [open(v, "rb").read() for v in victims]
    finally:
        for victim in victims:
            os.unlink(victim)
    assert all(c == bytes(4096) for c in contents)
    for outcome in outcomes:
        assert outcome is not None and "peer rank 1" in outcome and "refused" in outcome


# -- allocated windows: the copies that skip the transport -------------------------------------
def _shapes_and_strides(comm):
    """Puts and gets of 1-D and 2-D arrays, and strided ones (refused, as every buffer pycoll
    takes), into windows on both kinds of memory: the direct copies of an allocated window
    behave as the transport's; every result against numpy."""
    r, s = comm.rank, comm.size
    out = []
    for allocate in (False, True):
        win, local = _open(comm, np.zeros(32, dtype=np.float32), allocate)
        t = (r + 1) % s
        src = np.arange(64, dtype=np.float32) + 100 * r
        try:                                             # as every buffer: contiguous
            win.put(src[::2][:8], t, 0)
            refused_put = ""
        except InvalidArgument as e:
            refused_put = str(e)
        win.put(src[16:24], t, 0)
        win.put(src[:8].reshape(2, 4), t, 8)             # 2-D
        win.put(src[8:16].copy(), t, 16)                 # contiguous
        win.fence()
        out.append([local[:24].tolist(), refused_put])
        flat = np.zeros(8, dtype=np.float32)
        grid = np.zeros((2, 4), dtype=np.float32)
        strided = np.zeros(16, dtype=np.float32)
        win.get(flat, t, 16)
        win.get(grid, t, 8)
        try:                                             # as every get: never silently
            win.get(strided[::2], t, 0)                  # into a copy
            refused = ""
        except InvalidArgument as e:
            refused = str(e)
        out.append([flat.tolist(), grid.tolist(), refused, type(win._direct.get(t)).__name__])
        win.close()
    return out


def test_allocated_window_copies_match_numpy_for_every_layout():
    results = run("shm", _shapes_and_strides, 2)
    for rank, out in enumerate(results):
        origin = 1 - rank                                # who put into me
        src = np.arange(64, dtype=np.float32) + 100 * origin
        mine = np.concatenate([src[16:24], src[:8], src[8:16]]).tolist()
        theirs = np.concatenate([src[16:24], src[:8], src[8:16]]) + 100 * (rank - origin)
        for k, (allocate, direct) in enumerate([(False, "NoneType"), (True, "MappedWindow")]):
            assert out[2 * k][0] == mine, (rank, allocate)
            assert "not C-contiguous" in out[2 * k][1], out[2 * k]
            flat, grid, refused, kind = out[2 * k + 1]
            assert flat == theirs[16:24].tolist()
            assert grid == theirs[8:16].reshape(2, 4).tolist()
            assert "not C-contiguous" in refused, refused
            assert kind == direct, (rank, allocate, kind)   # mapped only where allocated


def _allocate_refusals(comm):
    errors = []
    for args in ((-1,), (2.5,), (True,), (4, "no-such-dtype")):
        try:
            comm.allocate_window(*args)
            errors.append(None)
        except InvalidArgument as e:
            errors.append(str(e))
    return errors


def test_allocate_window_refuses_bad_arguments_on_every_rank():
    for rank, errors in enumerate(run("shm", _allocate_refusals, 2)):
        assert None not in errors, errors
        assert all(e.startswith(f"rank {rank}: allocate_window") for e in errors), errors
