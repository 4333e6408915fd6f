"""Bad input: a clear exception before any byte moves, and the other ranks are not left hanging.

Design (docs/troubleshooting.md): a validation error is local, like NCCL's InvalidArgument.
It is raised on the caller's thread before the collective takes a sequence number, so the
communicator stays usable and a program may catch it and go on. A rank that does not catch it
leaves: its channels close (peers waiting on it raise PeerLost naming it within a fraction of
a second) and, when the process exits with the uncaught exception, the abort record names the
error, so every other rank raises Aborted quoting it.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

import pycoll
from pycoll.testing import run_ranks

pytestmark = pytest.mark.timeout(90)

F32 = np.float32


def _cases(comm):
    n, me = comm.size, comm.rank
    other = (me + 1) % n
    ro = np.frombuffer(b"\0" * 64, dtype=F32)                 # read-only
    strided = np.zeros((8, 4), dtype=F32)[:, 1]               # non-contiguous
    ok = np.ones(8, dtype=F32)
    return {
        # allreduce
        "allreduce unknown op": lambda: comm.allreduce(ok.copy(), "median"),
        "allreduce bitwise op on float": lambda: comm.allreduce(ok.copy(), "band"),
        "allreduce max on complex": lambda: comm.allreduce(np.zeros(4, np.complex64), "max"),
        "allreduce object dtype": lambda: comm.allreduce(np.zeros(4, dtype=object)),
        "allreduce non-contiguous": lambda: comm.allreduce(strided),
        "allreduce read-only": lambda: comm.allreduce(ro),
        "allreduce not a tensor": lambda: comm.allreduce([1.0, 2.0]),
        "allreduce unknown algorithm": lambda: comm.allreduce(ok.copy(), algo="magic"),
        # broadcast
        "broadcast root -1": lambda: comm.broadcast(ok.copy(), -1),
        "broadcast root = world size": lambda: comm.broadcast(ok.copy(), n),
        "broadcast root not an int": lambda: comm.broadcast(ok.copy(), "0"),
        "broadcast root float": lambda: comm.broadcast(ok.copy(), 0.5),
        "broadcast root True (bools are not ranks)": lambda: comm.broadcast(ok.copy(), True),
        "alltoall own block sizes differ": lambda: comm.alltoall(
            np.zeros(n + 1, F32), np.ones(n, F32), [2 if r == me else 1 for r in range(n)],
            [1] * n),
        "broadcast read-only": lambda: comm.broadcast(ro, 0),
        "broadcast non-contiguous": lambda: comm.broadcast(strided, 0),
        # reduce
        "reduce root out of range": lambda: comm.reduce(ok.copy(), n + 3),
        "reduce bitwise op on float": lambda: comm.reduce(ok.copy(), 0, "bor"),
        # allgather
        "allgather output too small": lambda: comm.allgather(np.zeros(8 * n - 1, F32), ok),
        "allgather output dtype differs": lambda: comm.allgather(np.zeros(8 * n, np.float64), ok),
        "allgather output list too short": lambda: comm.allgather([np.zeros(8, F32)] * (n - 1), ok),
        "allgather output read-only":
            lambda: comm.allgather(np.frombuffer(b"\0" * 32 * n, F32), ok),
        # reduce_scatter
        "reduce_scatter input wrong size": lambda: comm.reduce_scatter(np.zeros(8, F32),
                                                                       np.ones(8 * n + 1, F32)),
        "reduce_scatter op unsupported for dtype": lambda: comm.reduce_scatter(
            np.zeros(8, F32), np.ones(8 * n, F32), "bxor"),
        # alltoall
        "alltoall rows not divisible": lambda: comm.alltoall(np.zeros(n * 2 + 1, F32),
                                                             np.ones(n * 2 + 1, F32)),
        "alltoall splits do not add up": lambda: comm.alltoall(
            np.zeros(n, F32), np.ones(n, F32), [1] * n, [2] * n),
        "alltoall splits wrong length": lambda: comm.alltoall(
            np.zeros(n, F32), np.ones(n, F32), [1] * (n + 1), [1] * n),
        "alltoall negative split": lambda: comm.alltoall(
            np.zeros(n, F32), np.ones(n, F32), [-1] + [1] * (n - 2) + [2], [1] * n),
        "alltoall dtype differs": lambda: comm.alltoall(np.zeros(n, np.int32), np.ones(n, F32)),
        # gather / scatter (the root checks the big buffer; every rank checks the root)
        "gather root out of range": lambda: comm.gather(np.zeros(8 * n, F32), ok, -2),
        "gather output wrong size": lambda: comm.gather(np.zeros(8 * n + 8, F32), ok, me),
        "scatter root out of range": lambda: comm.scatter(np.zeros(8, F32), ok, n),
        "scatter input wrong size": lambda: comm.scatter(np.zeros(8, F32), np.ones(3, F32), me),
        # point to point
        "send to itself": lambda: comm.send(ok, me),
        "send dst out of range": lambda: comm.send(ok, n),
        "send negative tag": lambda: comm.send(ok, other, -5),
        "recv src out of range": lambda: comm.recv(ok.copy(), -1),
        "recv into read-only": lambda: comm.recv(ro, other),
        # coalesced
        "allreduce_coalesced one read-only": lambda: comm.allreduce_coalesced([ok.copy(), ro]),
        "allreduce_coalesced op unsupported": lambda: comm.allreduce_coalesced(
            [np.ones(2, np.int32), ok.copy()], "band"),
    }


def _every_bad_input(comm):
    messages = {}
    for name, call in _cases(comm).items():
        seq = comm.seq
        try:
            call()
            messages[name] = "NO ERROR"
        except (ValueError, TypeError) as e:
            messages[name] = f"{type(e).__name__}: {e}"
            if comm.seq != seq:   # a sequence number is taken only when bytes may move
                messages[name] += " (AFTER a sequence number was taken)"
    a = np.ones(3, dtype=F32)
    comm.allreduce(a)              # nothing moved: the communicator is healthy
    messages["after"] = a.tolist()
    return messages


def test_every_bad_input_raises_before_any_byte_moves():
    results = run_ranks(_every_bad_input, 3, collective_timeout=20)
    for rank, messages in enumerate(results):
        assert messages.pop("after") == [3.0, 3.0, 3.0]
        for name, msg in messages.items():
            assert msg != "NO ERROR", f"rank {rank}: {name} was accepted"
            assert "AFTER" not in msg, f"rank {rank}: {name}: {msg}"
            assert msg.startswith(("InvalidArgument:", "InvalidDtype:")), (name, msg)
        assert "median" in messages["allreduce unknown op"]
        assert "contiguous" in messages["allreduce non-contiguous"]
        assert "read-only" in messages["allreduce read-only"]
        assert "read-only" in messages["recv into read-only"]
        assert "root=-1" in messages["broadcast root -1"]
        assert f"0..{len(results) - 1}" in messages["broadcast root = world size"]
        assert "itself" in messages["send to itself"]
        assert "band" in messages["allreduce bitwise op on float"]


def _one_rank_passes_bad_input(comm, bad_rank):
    a = np.ones(1 << 12, dtype=F32)
    comm.allreduce(a)
    if comm.rank == bad_rank:
        time.sleep(0.2)
        comm.allreduce(np.zeros((16, 4), dtype=F32)[:, 0])   # raises InvalidArgument, uncaught
    start = time.monotonic()
    try:
        comm.allreduce(a)
    except pycoll.PycollError as e:
        return type(e).__name__, str(e), time.monotonic() - start
    return "ok", "", time.monotonic() - start


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_other_ranks_are_not_left_hanging(transport):
    bad = 2
    outcomes = run_ranks(_one_rank_passes_bad_input, 4, bad, expect_failure=True,
                         collective_timeout=60, env={"PYCOLL_TRANSPORTS": transport})
    assert outcomes[bad][0] == "InvalidArgument", outcomes[bad]
    for rank, (kind, value) in enumerate(outcomes):
        if rank == bad:
            continue
        assert kind == "ok", value
        name, message, elapsed = value
        assert name in ("PeerLost", "PeerLostAbort", "Aborted"), (rank, name, message)
        assert f"rank {bad}" in message, message
        assert elapsed < 15, (rank, elapsed)      # long before the 60 s deadline


def _init_with_wrong_size(rank, port, q):
    import os
    os.environ["PYCOLL_STORE_EXTERNAL"] = "1"
    from pycoll.comm.communicator import Communicator
    from rendezvous import TCPStore
    store = TCPStore("127.0.0.1", port, timeout=5)
    try:
        Communicator.create(store, rank, 2 if rank == 0 else 3, timeout=3)
        q.put((rank, "ok", ""))
    except Exception as e:  # noqa: BLE001
        q.put((rank, type(e).__name__, str(e)))


def test_world_size_mismatch_at_init():
    import multiprocessing as mp

    from rendezvous import StoreServer
    server = StoreServer("127.0.0.1", 0).start()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_init_with_wrong_size, args=(r, server.port, q)) for r in (0, 1)]
    try:
        for p in procs:
            p.start()
        got = dict((r, (k, m)) for r, k, m in (q.get(timeout=30) for _ in procs))
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
        server.close()
    # Rank 0 (size 2) sees both hellos and refuses at once; rank 1 (size 3) waits for a third
    # rank that never comes and fails at its init deadline, naming the missing key.
    assert got[0][0] == "InvalidArgument" and "world size mismatch" in got[0][1], got
    assert got[1][0] != "ok", got
