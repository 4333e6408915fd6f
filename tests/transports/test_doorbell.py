"""The shm doorbell's wake protocol (``pycoll/transports/shm/doorbell.py``): no lost wake-up.

A waiter announces itself, re-checks its condition, then sleeps on the futex; a peer that
published something rings, which wakes it only when announced. Each interleaving is forced
here: a ring before the announcement, between the announcement and the sleep, during the
sleep (another process rings once the waiter is seen blocked in ``FUTEX_WAIT``), after the
withdrawal. The sleeps have long timeouts, so a lost wake-up shows as a test that runs into
its pytest timeout, never as a timed assertion. The last test runs the same through the
progress engine over shm: a receive that waits is woken by the sender's ring, not by a timer.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pycoll.buffers.memory import MemRef
from pycoll.testing import run_ranks
from pycoll.transports.progress import WaitPolicy
from pycoll.transports.shm import doorbell
from pycoll.transports.shm.doorbell import SEQUENCE, WAITERS, Doorbell

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not doorbell.SUPPORTED, reason="needs Linux futexes and memfd")]
ROOT = Path(__file__).resolve().parents[2]
LONG = 3600.0        # a sleep only a ring can end within the test's timeout


def _blocked_in_futex_wait(pid: int, tid: int) -> bool:
    """Whether thread ``tid`` of ``pid`` sleeps in ``futex(FUTEX_WAIT)`` (op 0: shared, as
    the doorbell's; the interpreter's own locks use private futexes)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/syscall") as f:
            fields = f.read().split()
    except OSError:
        return False
    return len(fields) > 2 and fields[0] == str(doorbell.SYS_FUTEX) and int(fields[2], 16) == 0


def _pair() -> tuple[Doorbell, Doorbell]:
    own = Doorbell.create()
    assert own is not None and own.fd is not None
    peer = Doorbell.attach(os.getpid(), own.fd, own.token)   # a second mapping, as a peer's
    assert peer is not None
    return own, peer


def test_a_ring_without_a_waiter_costs_no_wake():
    own, peer = _pair()
    try:
        peer.ring()                               # published before anyone waits
        assert own.words[SEQUENCE] == 0           # nobody announced: no bump, no system call
        sequence = own.announce()                 # the waiter's re-check now sees the data
        assert own.words[WAITERS] == 1
        own.withdraw()
        peer.ring()                               # after the withdrawal: nothing to wake
        assert own.words[SEQUENCE] == sequence and own.words[WAITERS] == 0
    finally:
        peer.close()
        own.close()


def test_a_ring_between_the_announcement_and_the_sleep_is_not_lost():
    own, peer = _pair()
    try:
        sequence = own.announce()
        peer.ring()                  # the re-check missed it; the futex compares in the kernel
        own.sleep(sequence, LONG)    # returns at once (a lost wake-up: the pytest timeout)
        own.withdraw()
        assert own.words[SEQUENCE] == (sequence + peer._step) & 0xFFFFFFFF
    finally:
        peer.close()
        own.close()


RINGER = """
import os, sys, time
sys.path.insert(0, sys.argv[3])
from pycoll.transports.shm.doorbell import Doorbell
from tests.transports.test_doorbell import _blocked_in_futex_wait
pid, fd, token = int(sys.argv[1]), int(sys.argv[2]), sys.argv[4]
bell = Doorbell.attach(pid, fd, token)
assert bell is not None, "cannot map the waiter's doorbell"
while not _blocked_in_futex_wait(pid, pid):    # the waiter is asleep in the futex now
    time.sleep(0.001)
bell.ring()
print("RANG")
"""


def test_a_waiter_asleep_in_another_process_is_woken_by_a_ring():
    own = Doorbell.create()
    assert own is not None and own.fd is not None
    os.set_inheritable(own.fd, True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ringer = subprocess.Popen([sys.executable, "-c", RINGER, str(os.getpid()), str(own.fd),
                               str(ROOT), own.token], env=env, stdout=subprocess.PIPE, text=True,
                              pass_fds=(own.fd,))
    try:
        sequence = own.announce()
        own.sleep(sequence, LONG)        # only the other process's ring ends this in time
        own.withdraw()
        out, _ = ringer.communicate(timeout=30)
        assert ringer.returncode == 0 and "RANG" in out
        assert own.words[SEQUENCE] != sequence
    finally:
        if ringer.poll() is None:
            ringer.kill()
            ringer.wait()
        own.close()


def test_attach_maps_only_the_doorbell_the_owner_published(tmp_path):
    """``attach`` checks that ``/proc/<pid>/fd/<fd>`` is a pycoll doorbell memfd holding the
    published token: a reused pid may name any file of the same user there, which ``ring``
    would write into."""
    own = Doorbell.create()
    assert own is not None and own.fd is not None
    other = tmp_path / "page"
    other.write_bytes(bytes(doorbell.PAGE))          # a same-sized file, not a doorbell
    fd = os.open(other, os.O_RDWR)
    stranger = Doorbell.create()                     # another pycoll doorbell
    assert stranger is not None and stranger.fd is not None
    try:
        assert Doorbell.attach(os.getpid(), fd, own.token) is None
        assert Doorbell.attach(os.getpid(), stranger.fd, own.token) is None
        assert Doorbell.attach(os.getpid(), own.fd, "") is None
        peer = Doorbell.attach(os.getpid(), own.fd, own.token)
        assert peer is not None
        peer.close()
        assert other.read_bytes() == bytes(doorbell.PAGE)    # nothing written into it
    finally:
        os.close(fd)
        own.close()
        stranger.close()


def _woken_by_the_sender(comm):
    """Rank 1 waits for a message with no liveness wake-up before its deadline; rank 0
    sends it only once rank 1 sleeps on its doorbell."""
    peer = 1 - comm.rank
    ch = comm.channel(peer)
    pids = np.array([os.getpid(), 0], dtype=np.int64)
    got = np.zeros(2, dtype=np.int64)
    engine = comm._peers.engine
    # connect both ways first: a channel still connecting is polled, not slept on
    reqs = [ch.isend(MemRef.of(pids), tag=1), ch.irecv(MemRef.of(got), tag=1)]
    engine.wait(reqs, time.monotonic() + 30)
    WaitPolicy.liveness_seconds = LONG
    data = np.zeros(4, dtype=np.int64)
    if comm.rank == 0:
        deadline = time.monotonic() + 30
        while not _blocked_in_futex_wait(int(got[0]), int(got[0])):
            assert time.monotonic() < deadline, "rank 1 never slept on its doorbell"
            time.sleep(0.001)
        data[:] = 7
        engine.wait([ch.isend(MemRef.of(data), tag=2)], time.monotonic() + 30)
    else:
        # a lost wake-up runs into this deadline (WaitTimeout), as liveness checks are off
        engine.wait([ch.irecv(MemRef.of(data), tag=2)], time.monotonic() + 40)
    return int(data.sum())


def test_the_progress_engine_sleeps_on_the_doorbell_and_the_sender_wakes_it():
    assert run_ranks(_woken_by_the_sender, 2, env={"PYCOLL_TRANSPORTS": "shm"},
                     timeout=55) == [28, 28]


def _offered_doorbells(comm):
    """The doorbell each transport of this rank offers its waits, once its channel is up."""
    comm.allreduce(np.ones(4, np.float32))
    return {t.name: t.doorbell() is not None for t in comm._peers.engine.transports}


def test_cuda_ipc_offers_no_doorbell(monkeypatch):
    """A cuda_ipc receive completes when its CUDA copy event finishes, which rings no bell:
    a wait on its channels polls (on pycoll's CUDA simulator where no GPU is), while shm's
    channels, the same otherwise, offer theirs."""
    from pycoll.testing import cuda_env
    from pycoll.transports import registry
    env = cuda_env()
    for key, value in env.items():          # cuda_ipc's probe reads them
        monkeypatch.setenv(key, value)
    record, why = registry.transport_class("cuda_ipc").probe()
    if record is None:
        pytest.skip(f"cuda_ipc is not usable here: {why}")
    assert run_ranks(_offered_doorbells, 2, env=dict(env, PYCOLL_TRANSPORTS="cuda_ipc"),
                     timeout=55) == [{"cuda_ipc": False}] * 2
    assert run_ranks(_offered_doorbells, 2, env={"PYCOLL_TRANSPORTS": "shm"},
                     timeout=55) == [{"shm": True}] * 2
