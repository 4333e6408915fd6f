"""Hostile input against the surfaces added since the last sweep: any-source receives and
persistent plans (issue 32, part 5; the launcher's token file is tests/launch, the verbs setup
port tests/verbs/test_hostile.py, the rest in docs/troubleshooting.md's "Hostile input").

Every case runs real ranks (forked processes, real sockets and shared memory) and checks the
three things a hostile input must never cost: a clear error on every rank it reaches, no hang
(every wait has a short deadline), and no byte written into the user's buffer.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from pycoll.testing import run_ranks
from pycoll.testing.strangers import knock

pytestmark = pytest.mark.timeout(90)

UNTOUCHED = -7.0


def _outcome(fn):
    """("ok", value) or (exception type name, its message on one line)."""
    try:
        return "ok", fn()
    except Exception as e:  # noqa: BLE001 - reported to the test
        return type(e).__name__, " ".join(str(e).split())


# -- any-source receives ----------------------------------------------------------------------
def _anysource_wrong_size(comm, sent, posted):
    if comm.rank == 0:
        buf = np.full(posted, UNTOUCHED, dtype=np.float32)
        got = _outcome(lambda: comm.recv(buf, None, tag=3, timeout=10))
        return got, bool((buf == UNTOUCHED).all())
    return _outcome(lambda: comm.send(np.arange(sent, dtype=np.float32), 0, tag=3, timeout=10))


@pytest.mark.parametrize("transport", ["tcp", "shm"])
@pytest.mark.parametrize("sent,posted", [(8, 4), (4, 8), (1 << 21, 1 << 20)],
                         ids=["larger", "smaller", "larger-8MiB"])
def test_anysource_message_of_another_size(transport, sent, posted):
    """A sender that sends more (or fewer) bytes than the any-source receive posted: the
    receiver fails naming the sender and both sizes; its buffer keeps every old byte (the
    size is checked before a byte is copied, for eager and large messages alike). The
    sender learns it when its message is still in flight (it fails naming the receiver's
    error); a send already handed over completes, as MPI's does."""
    out = run_ranks(_anysource_wrong_size, 2, sent, posted,
                    env={"PYCOLL_TRANSPORTS": transport}, collective_timeout=10)
    (kind, text), untouched = out[0]
    assert kind == "MessageSizeMismatch", text
    assert "recv #1" in text and "peer rank 1" in text, text
    assert f"sent {sent * 4} bytes" in text and f"receive of {posted * 4} bytes" in text, text
    assert untouched
    sender, why = out[1]
    assert sender == "ok" or "rank 0" in why and "MessageSizeMismatch" in why, why


def _anysource_other_communicator(comm):
    # rank 1 sends on a sub-communicator with the tag the world's any-source receive waits for
    sub = comm.split(0, comm.rank)
    if comm.rank == 0:
        buf = np.full(4, UNTOUCHED, dtype=np.float32)
        world = _outcome(lambda: comm.recv(buf, None, tag=3, timeout=2))
        untouched = bool((buf == UNTOUCHED).all())
        sub.recv(buf, 1, tag=3, timeout=10)         # the message was the sub's all along
        return world, untouched, buf.tolist()
    sub.send(np.arange(4, dtype=np.float32), 0, tag=3, timeout=10)
    time.sleep(4)       # stay until rank 0's receive timed out (leaving would fail it sooner)
    return None


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_anysource_ignores_another_communicators_message(transport):
    """A message of another communicator over the same pair, same user tag: the world's
    any-source receive does not take it (it times out, clearly, with its buffer untouched),
    and the receive it was meant for still gets it."""
    out = run_ranks(_anysource_other_communicator, 2, env={"PYCOLL_TRANSPORTS": transport},
                    collective_timeout=20)
    (kind, text), untouched, later = out[0]
    assert kind == "CollectiveTimeout" and "recv #1" in text, text
    assert untouched and later == [0.0, 1.0, 2.0, 3.0]


def _anysource_with_strangers(comm):
    if comm.rank == 0:
        addr = json.loads(comm._store.get("pycoll/world//hello/0"))["addr"]["tcp"]
        got_in: list[int] = []
        knocker = threading.Thread(target=lambda: got_in.append(
            knock((addr["host"], addr["port"]))))
        knocker.start()
        buf = np.full(1 << 16, UNTOUCHED, dtype=np.float32)
        src = comm.recv(buf, None, tag=5, timeout=20)
        knocker.join()
        return src, float(buf[0]), float(buf[-1]), got_in
    time.sleep(1.0)                             # the strangers come first
    comm.send(np.full(1 << 16, 42.0, dtype=np.float32), 0, tag=5, timeout=20)
    return None


def test_anysource_receive_survives_strangers_on_the_data_port():
    """While an any-source receive waits, strangers knock on the receiver's data port (the
    port the peers dial in to): none of them is taken for a rank, and the receive gets the
    real sender's message."""
    out = run_ranks(_anysource_with_strangers, 2, env={"PYCOLL_TRANSPORTS": "tcp"},
                    collective_timeout=20)
    src, first, last, got_in = out[0]
    assert (src, first, last) == (1, 42.0, 42.0), out[0]
    # the three talking strangers got in (some of the flood may find the backlog full: fine)
    assert got_in and got_in[0] >= 3, got_in


# -- persistent plans -------------------------------------------------------------------------
def _plan_mismatch(comm, what, n):
    count = n if comm.rank == 0 or what != "count" else 2 * n
    dtype = np.int32 if what == "dtype" and comm.rank == 1 else np.float32
    op = "max" if what == "op" and comm.rank == 1 else "sum"
    a = np.full(count, UNTOUCHED, dtype=dtype)
    plan = comm.allreduce_init(a, op, timeout=10)
    return plan.path, _outcome(plan.run), bool((a == UNTOUCHED).all())


@pytest.mark.parametrize("n", [4, 1 << 20], ids=["small", "4MiB"])
@pytest.mark.parametrize("what", ["count", "dtype", "op"])
def test_plan_started_with_mismatched_buffers(what, n):
    """Ranks whose plans disagree (element count, dtype, op): every rank fails naming the
    peer, and no buffer is written, on the fast path's one-slot and CMA paths alike."""
    out = run_ranks(_plan_mismatch, 2, what, n, collective_timeout=10)
    for rank, (path, (kind, text), untouched) in enumerate(out):
        assert path.startswith("fastpath"), path
        assert kind == "CollectiveMismatch", text
        assert f"peer rank {1 - rank}" in text and "allreduce #1" in text, text
        assert untouched


def _stay_until(marker):
    """Stay alive, calling nothing, until the other rank's call has timed out and it wrote
    ``marker`` (a fixed sleep could end first on a loaded host, and the other rank would
    then see a lost peer instead of its timeout)."""
    deadline = time.monotonic() + 60
    while not os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.05)


def _plan_started_by_one_rank(comm, others, marker):
    a = np.full(4, UNTOUCHED, dtype=np.float32)
    plan = comm.allreduce_init(a, timeout=3)
    if comm.rank == 0:
        got = _outcome(plan.run)
        Path(marker).touch()
    elif others == "barrier":
        got = _outcome(lambda: comm.barrier(timeout=3))
    else:
        _stay_until(marker)
        got = None
    return got, bool((a == UNTOUCHED).all())


@pytest.mark.parametrize("others", ["barrier", "nothing"])
def test_plan_started_by_one_rank_only(others, tmp_path):
    """Rank 0 runs its plan; rank 1 calls another collective (both fail, naming each other)
    or nothing (rank 0 times out naming rank 1). No buffer is written."""
    out = run_ranks(_plan_started_by_one_rank, 2, others, str(tmp_path / "timed-out"),
                    collective_timeout=10)
    (kind, text), untouched = out[0]
    assert untouched and out[1][1]
    if others == "barrier":
        assert kind == "CollectiveMismatch" and "peer rank 1 published barrier #1" in text, text
        assert out[1][0][0] == "CollectiveMismatch", out[1]
    else:
        assert kind == "CollectiveTimeout" and "peer rank(s) [1]" in text, text


def _plan_memory_replaced(comm, how, ranks, marker=None):
    if how == "torch-set":
        import torch
        t = torch.full((4,), 1.0 + comm.rank)
        plan = comm.allreduce_init(t, timeout=3)
        plan.run()
        if comm.rank in ranks:
            t.set_(torch.full((4,), UNTOUCHED))
        got = _outcome(plan.run)
        return got, t.tolist()
    a = np.full(4, 1.0 + comm.rank, dtype=np.float32)
    plan = comm.allreduce_init(a, timeout=3)
    plan.run()
    if comm.rank in ranks:        # reallocates: the plan's view would point at freed memory
        a.resize(1 << 20, refcheck=False)
        a[:] = UNTOUCHED
    got = _outcome(lambda: plan.start().wait() if how == "numpy-resize-start" else plan.run())
    if marker is not None:          # one rank replaced its memory: it failed at once
        if comm.rank in ranks:
            _stay_until(marker)
        else:
            Path(marker).touch()
    return got, a[:4].tolist()


@pytest.mark.parametrize("how", ["torch-set", "numpy-resize", "numpy-resize-start"])
def test_plan_buffer_replaced_between_runs(how):
    """The tensor's memory is replaced after allreduce_init (torch's set_, numpy's resize
    without its reference check, which frees the old memory): before, the plan reduced into
    the old memory (a stale result; with numpy a write into freed memory: both ranks crashed
    with SIGSEGV). Now the run raises before any byte moves and the new memory is
    untouched."""
    if how == "torch-set":
        pytest.importorskip("torch")
    out = run_ranks(_plan_memory_replaced, 2, how, (0, 1), collective_timeout=10)
    for rank, ((kind, text), values) in enumerate(out):
        assert kind == "InvalidArgument", text
        assert f"rank {rank}: allreduce plan" in text and "no longer holds" in text, text
        assert values == [UNTOUCHED] * 4


def test_plan_buffer_replaced_on_one_rank(tmp_path):
    """Only rank 0's memory was replaced: it fails at once; rank 1's run times out naming
    rank 0 (it never joined the call), and keeps its own values."""
    out = run_ranks(_plan_memory_replaced, 2, "numpy-resize", (0,), str(tmp_path / "timed-out"),
                    collective_timeout=10)
    (kind0, text0), values0 = out[0]
    (kind1, text1), values1 = out[1]
    assert kind0 == "InvalidArgument" and values0 == [UNTOUCHED] * 4, text0
    assert kind1 == "CollectiveTimeout" and "peer rank(s) [0]" in text1, text1
    assert values1 == [3.0] * 4        # the first run's sum, not touched by the second
