"""Segments of a job killed during setup do not stay in /dev/shm (hardening, item 7).

Rank 0 creates its inbox for rank 1 on its first collective; rank 1 never gets there (it
sleeps), so nobody maps the segment and nothing unlinks it: killing the job then used to
leave the segments behind (6 x 2 MiB in the report). Now the launcher sweeps its ranks'
segments once it has reaped them, and any later pycoll process sweeps segments whose creator
is dead (names carry the creator's pid and pid namespace).
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


def _segments(pids):
    return [f for pid in pids for f in glob.glob(f"/dev/shm/pycoll-{pid}-*")]


def _start(tmp_path, cmd_prefix):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYCOLL_")}
    env.update(PYTHONPATH=str(ROOT), PYCOLL_TRANSPORTS="shm")
    proc = subprocess.Popen(cmd_prefix + [str(job), str(tmp_path)], env=env,
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
    run_ranks(_noop, 2, env={"PYCOLL_TRANSPORTS": "shm"})
    assert _segments(pids) == []
