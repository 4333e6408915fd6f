"""A flood of idle connections to the store does not hurt a healthy job (hardening, item 5).

Before, strangers holding a few hundred silent connections to the store while a job started
made the abort poller's lazy connects fail; three failures counted as "store dead" and every
rank raised ``Aborted: the rendezvous store ... is unreachable`` (the first allreduce took
25.6 s). Now the poller connects at init, only a refused connection means "gone", and a
server short of descriptors drops connections that never authenticated, not its ranks'.
"""
from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pycoll.testing import free_port

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]

JOB = """
import resource, sys, time
import numpy as np
resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))   # a server that runs short of fds
import pycoll
comm = pycoll.init(timeout=60)
a = np.ones(1 << 12, np.float32)
t0 = time.monotonic()
comm.allreduce(a)
first = time.monotonic() - t0
for _ in range(50):
    time.sleep(0.01)            # idle waits: the abort poller runs
    comm.allreduce(a)
comm.barrier()
print("DONE", comm.rank, round(first, 3), float(a[0]), flush=True)
"""


def test_idle_connection_flood_at_startup(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 4096)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    port = free_port()
    job = tmp_path / "job.py"
    job.write_text(JOB)
    procs, flood = [], []
    start = time.monotonic()
    try:
        for r in range(3):
            env = {k: v for k, v in os.environ.items() if not k.startswith("PYCOLL_")}
            env.update(MASTER_ADDR="127.0.0.1", PYCOLL_MASTER_PORT=str(port), RANK=str(r),
                       MASTER_PORT=str(free_port()),
                       WORLD_SIZE="3", PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen([sys.executable, str(job)], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, start_new_session=True))
            if r == 0:      # rank 0 hosts the store: flood it as soon as it listens
                deadline = time.monotonic() + 20
                while len(flood) < 400 and time.monotonic() < deadline:
                    try:
                        flood.append(socket.create_connection(("127.0.0.1", port), timeout=1))
                    except OSError:
                        time.sleep(0.01)
        outputs = [p.communicate(timeout=90) for p in procs]
        elapsed = time.monotonic() - start
    finally:
        for s in flood:
            s.close()
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait(10)
    assert len(flood) >= 300, len(flood)
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-3000:]
        done = [ln.split() for ln in out.splitlines() if ln.startswith("DONE")]
        assert done and abs(float(done[0][3]) / 3.0 ** 51 - 1) < 1e-5, out + err[-2000:]
        assert float(done[0][2]) < 10.0, out      # the first allreduce: was 25.6 s
    # the strangers never authenticate: without room made for the ranks they would wait for
    # the server's handshake deadline (10 s) to drop them
    assert elapsed < 8.0, elapsed
