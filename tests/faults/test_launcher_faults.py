"""pycoll.run: a failing rank brings the job down, the launcher exits non-zero and names it."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(90)

SCRIPT = textwrap.dedent("""
    import time, numpy as np, pycoll
    comm = pycoll.init(timeout=60)
    a = np.ones(16, np.float32)
    pycoll.allreduce(a)
    if comm.rank == 3:
        time.sleep(0.3)
        pycoll.allreduce(np.ones((4, 4), np.float32)[:, 1])   # InvalidArgument, uncaught
    t = time.monotonic()
    try:
        pycoll.allreduce(a)
    except pycoll.PycollError as e:
        print(f"RESULT rank={comm.rank} after={time.monotonic() - t:.2f} "
              f"{type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
        raise SystemExit(1)
""")


def _env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYCOLL_", "OMPI_", "PMI_", "SLURM_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    return env


def test_launcher_names_the_first_failing_rank(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = {**_env(), "PYCOLL_TRACE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "pycoll.run", "-n", "4", str(script)],
                          capture_output=True, text=True, timeout=80, env=env)
    assert proc.returncode != 0
    assert "InvalidArgument: tensor is not C-contiguous" in proc.stderr
    # Whichever process exits first, the launcher names rank 3, which failed first.
    assert "first failure (pycoll abort record): rank 3" in proc.stderr, proc.stderr
    results = [line for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    for line in results:   # the others (those not yet torn down) were told why, promptly
        assert "Aborted" in line or "PeerLost" in line, line
        assert "rank 3" in line, line
        assert float(line.split("after=")[1].split()[0]) < 15, line
