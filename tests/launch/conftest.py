"""Shared by the launcher's tests: a real ``python -m pycoll.run`` on a script of the test's,
reaped whatever happens, and the check that none of its processes outlived it.

Every launcher runs in its own session and is SIGKILLed with its ranks (PR_SET_PDEATHSIG) if
a test fails before it exits; every wait has a deadline.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pycoll.transports.shm.cma import process_exited

REPO = Path(__file__).resolve().parents[2]
DEADLINE = 60.0                 # "did not hang"

#: ``run(script, launcher_args, *script_args)`` -> (exit code, stderr, output folder)
RunJob = Callable[..., tuple[int, str, Path]]


def launcher_env() -> dict[str, str]:
    """This process's environment without PYCOLL_* variables, importing this checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYCOLL_")}
    # ranks must import pycoll / rendezvous from this checkout whatever the install state
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


@pytest.fixture
def run_job(tmp_path: Path) -> RunJob:
    """Runs the launcher on ``script`` (its text) with ``launcher_args``; the script gets
    the output folder and ``script_args``. Reaps the launcher whatever happens."""
    outdir = tmp_path / "out"
    outdir.mkdir()
    started: list[subprocess.Popen] = []

    def run(script: str, launcher_args: list, *script_args: str,
            deadline: float = DEADLINE) -> tuple[int, str, Path]:
        path = tmp_path / "rank.py"
        path.write_text(script)
        proc = subprocess.Popen(
            [sys.executable, "-m", "pycoll.run", *map(str, launcher_args), str(path),
             str(outdir), *script_args],
            cwd=tmp_path, env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True)
        started.append(proc)
        try:
            out, err = proc.communicate(timeout=deadline)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            pytest.fail(f"launcher did not exit within {deadline} s\n{out}\n{err}")
        return proc.returncode, err, outdir

    yield run
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)     # its ranks die with it (PDEATHSIG)
            proc.wait()


def assert_all_gone(outdir: Path, within: float = 10.0) -> None:
    """Every process that left a ``pid.*`` file in ``outdir`` has exited (SIGKILLs the
    others, then fails)."""
    pids = [int(p.read_text()) for p in outdir.glob("pid.*") if p.suffix != ".tmp"]
    deadline = time.monotonic() + within
    while any(not process_exited(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [p for p in pids if not process_exited(p)]
    for p in alive:         # never leave them behind, even when failing
        os.kill(p, signal.SIGKILL)
    assert not alive, f"processes still alive: {alive}"


@pytest.fixture
def all_gone() -> Callable[..., None]:
    return assert_all_gone


@pytest.fixture
def run_cli(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess]:
    """``run_cli(*args, **env)``: ``python -m pycoll.run *args`` to its end (for the usage
    errors, refused before any rank starts)."""
    def run(*args: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pycoll.run", *args], cwd=tmp_path,
                              env={**launcher_env(), **env}, capture_output=True, text=True,
                              timeout=DEADLINE)
    return run
