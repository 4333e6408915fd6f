"""Where numba cannot load, the job still runs (the generic path) and says so once, in one line.

A job of three real ranks under ``pycoll.run``, with numba hidden (``sys.modules["numba"] =
None`` from a ``sitecustomize`` on PYTHONPATH: what a host without numba sees) or broken (a
``numba`` package first on the path whose import fails, as a missing libllvmlite does).
Every rank must compute the right result off the fast path, and the job's stderr must hold
exactly one warning line naming the reason and the cost. With numba, and with the path turned
off on purpose (``PYCOLL_FASTPATH=0``), there is no warning.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pycoll import fastpath

pytestmark = pytest.mark.timeout(120)

JOB = """
import numpy as np, pycoll
comm = pycoll.init()
g = np.full(1024, pycoll.get_rank() + 1, dtype=np.float32)
pycoll.allreduce(g)
print(f"rank {pycoll.get_rank()} sum {g[0]:g} fast {comm._fast is not None}", flush=True)
pycoll.finalize()
"""

WARNING = "RuntimeWarning: pycoll: the compiled one-host path is off"


def _job(tmp_path: Path, shim: str | None, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    paths = [str(Path(__file__).resolve().parents[2])]
    if shim == "hidden":
        (tmp_path / "hidden").mkdir()
        (tmp_path / "hidden" / "sitecustomize.py").write_text(
            "import sys\nsys.modules['numba'] = None\n")
        paths.insert(0, str(tmp_path / "hidden"))
    elif shim == "broken":
        (tmp_path / "broken" / "numba").mkdir(parents=True)
        (tmp_path / "broken" / "numba" / "__init__.py").write_text(
            "raise ImportError('libllvmlite.so: cannot open shared object file')\n")
        paths.insert(0, str(tmp_path / "broken"))
    full = {k: v for k, v in os.environ.items() if k != "PYCOLL_FASTPATH"}
    full.update(PYTHONPATH=os.pathsep.join(paths), **env)
    return subprocess.run([sys.executable, "-m", "pycoll.run", "-n", "3", str(script)],
                          env=full, capture_output=True, text=True, timeout=90, cwd=tmp_path)


def _ranks(out: str) -> dict[int, tuple[str, str]]:
    """rank -> (sum, fast) from the job's stdout (the ranks' lines may interleave)."""
    return {int(r): (s, f) for r, s, f in re.findall(r"rank (\d+) sum (\d+) fast (True|False)",
                                                      out)}


@pytest.mark.parametrize("shim, reason", [("hidden", "numba is not installed"),
                                          ("broken", "numba cannot be imported (ImportError: "
                                                     "libllvmlite.so")])
def test_without_a_loadable_numba_the_job_runs_generic_and_warns_once(tmp_path, shim, reason):
    done = _job(tmp_path, shim)
    assert done.returncode == 0, done.stderr
    assert _ranks(done.stdout) == {r: ("6", "False") for r in range(3)}, done.stdout
    lines = [line for line in done.stderr.splitlines() if WARNING in line]
    assert len(lines) == 1, done.stderr
    assert reason in lines[0] and "on 3 of 3 ranks" in lines[0]
    assert "5-7x slower below 64 KiB" in lines[0] and "PYCOLL_FASTPATH=0" in lines[0]


@pytest.mark.skipif(fastpath.unavailable_reason() is not None,
                    reason=f"the fast path is off here: {fastpath.unavailable_reason()}")
def test_with_numba_the_job_takes_the_fast_path_silently(tmp_path):
    done = _job(tmp_path, None)
    assert done.returncode == 0, done.stderr
    assert _ranks(done.stdout) == {r: ("6", "True") for r in range(3)}, done.stdout
    assert WARNING not in done.stderr


def test_a_path_turned_off_on_purpose_does_not_warn(tmp_path):
    done = _job(tmp_path, "hidden", PYCOLL_FASTPATH="0")
    assert done.returncode == 0, done.stderr
    assert _ranks(done.stdout) == {r: ("6", "False") for r in range(3)}, done.stdout
    assert WARNING not in done.stderr


def test_a_rank_alone_on_its_host_does_not_load_numba(tmp_path):
    """``--nnodes 2`` with one rank per launcher: each rank is told it is alone on its host
    (PYCOLL_LOCAL_WORLD_SIZE=1), so it publishes the path off without importing numba and
    nobody warns; its pair runs the generic path (both launchers are on this host here)."""
    from pycoll.testing import free_port

    script = tmp_path / "job.py"
    script.write_text(JOB.replace("pycoll.finalize()",
                                  "import sys\nprint('numba' in sys.modules)\npycoll.finalize()"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYCOLL_")}
    env.update(PYTHONPATH=str(Path(__file__).resolve().parents[2]), PYCOLL_TOKEN="a" * 32)
    port = str(free_port())
    launchers = [subprocess.Popen(
        [sys.executable, "-m", "pycoll.run", "--nnodes", "2", "--node-rank", str(i),
         "--master-addr", "127.0.0.1", "--master-port", port, "-n", "1", str(script)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        start_new_session=True) for i in range(2)]
    try:
        done = [p.communicate(timeout=90) for p in launchers]
    finally:
        for p in launchers:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    out = "".join(o for o, _ in done)
    err = "".join(e for _, e in done)
    assert [p.returncode for p in launchers] == [0, 0], err
    assert _ranks(out) == {0: ("3", "False"), 1: ("3", "False")}, out
    assert out.split().count("False") == 4 and "True" not in out, out   # numba not loaded
    assert WARNING not in err
