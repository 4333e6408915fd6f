"""Segments of a job killed during setup do not stay in /dev/shm (hardening, item 7).

Rank 0 creates its inbox for rank 1 on its first collective; rank 1 never gets there (it
sleeps), so nobody maps the segment and nothing unlinks it: killing the job then used to
leave the segments behind (6 x 2 MiB in the report). Now the launcher sweeps its ranks'
segments once it has reaped them, and any later pycoll process sweeps segments whose creator
is dead (names carry the creator's pid and pid namespace), and so do the survivors of a rank
killed alone, at ``finalize``.

The session's own segment prefix (``PYCOLL_SHM_PREFIX``, set by tests/conftest.py) keeps
other pycoll processes on the host from sweeping the leftovers these tests count: the jobs
here carry it, and the tests look only at segments of that prefix.
"""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pycoll.testing import run_ranks
from pycoll.transports.shm.segment import SHM_DIR, segment_prefix

pytestmark = pytest.mark.timeout(90)
ROOT = Path(__file__).resolve().parents[2]

JOB = """
import os, sys, time
import numpy as np
import pycoll
comm = pycoll.init(timeout=60)
with open(os.path.join(sys.argv[1], f"pid{comm.rank}"), "w") as f:
    f.write(str(os.getpid()))
if comm.rank == 1:
    time.sleep(60)           # never maps rank 0's inbox
comm.allreduce(np.ones(4))   # rank 0 creates its inbox for rank 1, then waits
"""


PREFIX = os.environ["PYCOLL_SHM_PREFIX"]       # the session's (tests/conftest.py)


def _segments(pids):
    return [f for pid in pids for f in glob.glob(f"{SHM_DIR}/{segment_prefix(pid)}*")]


def _job_env(**extra):
    """A clean environment for a job of its own, with the session's segment prefix."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYCOLL_")}
    env.update(PYTHONPATH=str(ROOT), PYCOLL_TRANSPORTS="shm", PYCOLL_SHM_PREFIX=PREFIX, **extra)
    return env


def _start(tmp_path, cmd_prefix):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    proc = subprocess.Popen(cmd_prefix + [str(job), str(tmp_path)], env=_job_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 30
    pids = []
    while time.monotonic() < deadline:
        files = sorted(tmp_path.glob("pid*"))
        if len(files) == 2:
            pids = [int(f.read_text() or 0) for f in files]
            if all(pids) and _segments(pids[:1]):
                break
        time.sleep(0.05)
    return proc, pids


def test_launcher_removes_segments_of_ranks_killed_during_setup(tmp_path):
    proc, pids = _start(tmp_path, [sys.executable, "-m", "pycoll.run", "-n", "2"])
    try:
        assert _segments(pids), "rank 0 should have created its inbox by now"
        proc.send_signal(signal.SIGTERM)      # the user stops the job
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert _segments(pids) == []


def _noop(comm):
    return comm.rank


def test_later_jobs_sweep_segments_of_dead_processes(tmp_path):
    """kill -9 of the whole job (launcher included): nobody is left to clean up at once,
    but the next pycoll process that opens shared memory removes the leftovers."""
    proc, pids = _start(tmp_path, [sys.executable, "-m", "pycoll.run", "-n", "2"])
    try:
        assert _segments(pids)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 10
        while any(os.path.exists(f"/proc/{p}") for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    left = _segments(pids)
    assert left, "the kill -9 should have left segments (else this test proves nothing)"
    run_ranks(_noop, 2, env={"PYCOLL_TRANSPORTS": "shm", "PYCOLL_SHM_PREFIX": PREFIX})
    assert _segments(pids) == []


def test_jobs_of_another_prefix_leave_the_leftovers_alone():
    """A pycoll job with the default prefix (someone else's job on the host) does not
    sweep this session's leftovers (which these tests count), and a job of this prefix does.
    Without prefixes, any pycoll process running beside the tests swept them first."""
    probe = subprocess.Popen(["true"])               # a pid that is gone
    probe.wait()
    path = f"{SHM_DIR}/{segment_prefix(probe.pid)}0-{os.urandom(8).hex()}-from1"
    Path(path).write_bytes(b"\0" * 4096)
    try:
        run_ranks(_noop, 2, env={"PYCOLL_TRANSPORTS": "shm", "PYCOLL_SHM_PREFIX": "pycoll"})
        assert os.path.exists(path), "a job of another prefix swept this session's segment"
        run_ranks(_noop, 2, env={"PYCOLL_TRANSPORTS": "shm", "PYCOLL_SHM_PREFIX": PREFIX})
        assert not os.path.exists(path), "a job of this prefix left a dead process's segment"
    finally:
        if os.path.exists(path):
            os.unlink(path)



SURVIVOR_JOB = """
import os, sys, time
import numpy as np
import pycoll
comm = pycoll.init(timeout=60)
with open(os.path.join(sys.argv[1], f"pid{comm.rank}"), "w") as f:
    f.write(str(os.getpid()))
if comm.rank == 1:
    comm.allreduce(np.ones(4))   # creates its inbox for rank 0, then waits (and is killed)
go = os.path.join(sys.argv[1], "go")
deadline = time.monotonic() + 60
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.02)
pycoll.finalize()                # rank 0 never mapped rank 1's inbox
"""


def test_survivors_remove_the_segments_of_a_rank_killed_before_they_mapped_them(tmp_path):
    """No launcher to sweep (a fork harness, an MPI job): a rank killed after it made its
    inbox for a peer, before the peer mapped it, left that inbox behind. The survivors'
    finalize sweeps the segments of dead creators, as ``init`` does (CI saw it once in
    ``test_dead_peers``: an 8-rank broadcast left the victim's inboxes for ranks 1 and 2)."""
    from pycoll.testing import free_port
    job = tmp_path / "job.py"
    job.write_text(SURVIVOR_JOB)
    env = _job_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2")
    procs = [subprocess.Popen([sys.executable, str(job), str(tmp_path)],
                              env={**env, "RANK": str(r)}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, start_new_session=True)
             for r in range(2)]
    try:
        deadline = time.monotonic() + 30
        victim = 0
        while time.monotonic() < deadline and not victim:
            pidfile = tmp_path / "pid1"
            if pidfile.exists() and pidfile.read_text() and _segments([int(pidfile.read_text())]):
                victim = int(pidfile.read_text())
            time.sleep(0.05)
        assert victim, "rank 1 should have created its inbox for rank 0 by now"
        procs[1].kill()
        procs[1].wait(10)
        assert _segments([victim]), "the kill should have left the inbox (else this proves nothing)"
        (tmp_path / "go").touch()
        _, err = procs[0].communicate(timeout=60)
        assert procs[0].returncode == 0, err.decode()[-2000:]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
    assert _segments([victim]) == []
