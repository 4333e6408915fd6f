"""Run tests/torch_backend/worker.py as N real rank processes (torch env:// style) and collect
results.

Each rank is a fresh ``python`` process with MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE set, as
torchrun and ``python -m pycoll.run`` do. Ranks write their outcome as JSON into a scratch
directory; every process is killed (its whole process group) and reaped before returning.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pycoll.testing import free_port  # noqa: F401 - re-exported for the tests

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "worker.py"


def run_scenario(scenario: str, world_size: int, *, timeout: float = 90.0,
                 env: dict | None = None) -> list[dict]:
    """Run ``worker.py scenario`` on ``world_size`` ranks; return each rank's result dict.

    A rank that wrote no result gets ``{"status": "missing", "exit": code, "output": ...}``.
    """
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="pycoll-torch-test-") as tmp:
        procs = []
        logs = []
        try:
            for r in range(world_size):
                e = dict(os.environ)
                for var in list(e):
                    if var.startswith(("PYCOLL_", "TORCHELASTIC_")):
                        del e[var]
                e.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                          "RANK": str(r), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(r),
                          "LOCAL_WORLD_SIZE": str(world_size), "OMP_NUM_THREADS": "1",
                          "PYTHONPATH": str(ROOT) + os.pathsep + e.get("PYTHONPATH", ""),
                          "PYCOLL_TEST_OUT": tmp})
                e.update(env or {})
                log = open(os.path.join(tmp, f"log{r}.txt"), "w+b")
                logs.append(log)
                procs.append(subprocess.Popen([sys.executable, str(WORKER), scenario],
                                              cwd=str(ROOT), env=e, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True))
            deadline = time.monotonic() + timeout
            for p in procs:
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        finally:
            for p in procs:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    p.wait(10)
        results = []
        for r, (p, log) in enumerate(zip(procs, logs)):
            log.seek(0)
            output = log.read().decode("utf-8", "replace")
            log.close()
            path = os.path.join(tmp, f"rank{r}.json")
            if os.path.exists(path):
                with open(path) as f:
                    res = json.load(f)
            else:
                res = {"status": "missing"}
            res["exit"] = p.returncode
            res["output"] = output[-6000:]
            results.append(res)
        return results


def describe(results: list[dict]) -> str:
    lines = []
    for r, res in enumerate(results):
        lines.append(f"--- rank {r}: status={res.get('status')} exit={res.get('exit')}")
        for k, v in res.items():
            if k not in ("output", "status", "exit"):
                lines.append(f"  {k}: {v}")
        lines.append(res.get("output", ""))
    return "\n".join(lines)
