"""A /dev/shm too small for the job raises a clear error at setup, never SIGBUS (item 6).

The test runs a 2-rank job in a private mount namespace whose /dev/shm is a 1 MiB tmpfs (the
machine's /dev/shm is never touched). Segments are reserved with ``posix_fallocate`` when
they are created, so running out of room is an exception naming /dev/shm, its free space and
what to do, on the rank that creates the segment, and the other rank hears of it through
the abort record; nothing is killed by a signal and nothing is left behind.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(90)
ROOT = Path(__file__).resolve().parents[2]

JOB = """
import glob, sys
import numpy as np
import pycoll
from pycoll.testing import run_ranks

def body(comm):
    try:
        comm.allreduce(np.ones(1 << 16, np.float32))
        return "no error"
    except pycoll.PycollError as e:
        return f"{type(e).__name__}: {e}"

for rank, out in enumerate(run_ranks(body, 2, env={"PYCOLL_TRANSPORTS": "shm"},
                                     collective_timeout=20, timeout=60)):
    print("RANK", rank, out.replace(chr(10), " ")[:600])
print("LEFT", len(glob.glob("/dev/shm/pycoll-*")))
"""


def test_small_dev_shm_is_an_error_not_a_signal(tmp_path):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to give the job a private, small /dev/shm")
    job = tmp_path / "job.py"
    job.write_text(JOB)
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
           f"mount -t tmpfs -o size=1m tmpfs /dev/shm && exec {sys.executable} {job}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYCOLL_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=80, env=env)
    if "mount" in proc.stderr and proc.returncode != 0 and "RANK" not in proc.stdout:
        pytest.skip(f"cannot mount a private tmpfs here: {proc.stderr.strip()[:200]}")
    out = proc.stdout
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = [ln for ln in out.splitlines() if ln.startswith("RANK")]
    assert len(ranks) == 2, out
    for line in ranks:
        assert "no error" not in line and "signal" not in line, out
    text = " ".join(ranks)
    assert "/dev/shm" in text and "bytes free" in text and "PYCOLL_TRANSPORTS=tcp" in text, out
    assert "LEFT 0" in out, out
