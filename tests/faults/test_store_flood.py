"""A flood of idle connections to the store does not hurt a healthy job (hardening, item 5).

Before, strangers holding a few hundred silent connections to the store while a job started
made the abort poller's lazy connects fail; three failures counted as "store dead" and every
rank raised ``Aborted: the rendezvous store ... is unreachable`` (the first allreduce took
25.6 s). Now the poller connects at init, only a refused connection means "gone", and a
server short of descriptors drops connections that never authenticated, not its ranks'.

The store here runs standalone (``python -m rendezvous serve``) with 200 descriptors and a
handshake deadline of 100 s, so "the ranks got in because room was made" and "the ranks got in
because the deadline dropped the strangers" are 100 s apart, not a few seconds that a busy
machine can eat.
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

pytestmark = pytest.mark.timeout(180)
HANDSHAKE_DEADLINE = 100.0
ROOT = Path(__file__).resolve().parents[2]

JOB = """
import sys, time
import numpy as np
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

    def short_of_fds():         # a store that runs short of descriptors
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYCOLL_")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    store = subprocess.Popen(
        [sys.executable, "-m", "rendezvous", "serve", "--port", str(port),
         "--handshake-timeout", str(HANDSHAKE_DEADLINE)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, preexec_fn=short_of_fds)
    try:
        assert store.stdout.readline().startswith("rendezvous listening"), store.stderr.read()
        start = time.monotonic()
        deadline = start + 20           # flood it as soon as it listens
        while len(flood) < 400 and time.monotonic() < deadline:
            try:
                flood.append(socket.create_connection(("127.0.0.1", port), timeout=1))
            except OSError:
                time.sleep(0.01)
        for r in range(3):
            renv = dict(env, MASTER_ADDR="127.0.0.1", PYCOLL_MASTER_PORT=str(port), RANK=str(r),
                        MASTER_PORT=str(free_port()), WORLD_SIZE="3", PYCOLL_STORE_EXTERNAL="1")
            procs.append(subprocess.Popen([sys.executable, str(job)], env=renv,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, start_new_session=True))
        outputs = [p.communicate(timeout=90) for p in procs]
        elapsed = time.monotonic() - start
    finally:
        for s in flood:
            s.close()
        for p in [*procs, store]:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait(10)
        store_log = store.stderr.read()
    assert len(flood) >= 300, len(flood)
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-3000:]
        done = [ln.split() for ln in out.splitlines() if ln.startswith("DONE")]
        assert done and abs(float(done[0][3]) / 3.0 ** 51 - 1) < 1e-5, out + err[-2000:]
        assert float(done[0][2]) < 20.0, out      # the first allreduce: was 25.6 s
    # the strangers never authenticate: without room made for the ranks they would wait for
    # the store's handshake deadline to drop them
    assert "had not authenticated" in store_log, store_log[-3000:]
    assert elapsed < HANDSHAKE_DEADLINE / 2, (elapsed, store_log[-3000:])
