"""python -m pycoll.status from another host: 8 ranks on two namespace hosts (launched by
``python -m pycoll.run --nnodes 2``), rank 6 (on host 1) stops in user code; the tool, run on a
third host that reaches only the store's address, names it, the call and its number, while the
job runs on and finishes correctly."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pycoll.testing import free_port
from pycoll.testing.hosts import NamespaceHosts, available

ok, why = available()
pytestmark = [pytest.mark.skipif(not ok, reason=f"namespace hosts unavailable: {why}"),
              pytest.mark.timeout(300)]

JOB = str(Path(__file__).parent.parent / "observability" / "status_job.py")
TOKEN = "status-hosts-secret"


def test_status_from_another_host_names_the_rank_in_user_code(tmp_path: Path) -> None:
    release = tmp_path / "release"
    port = free_port()
    env = {**os.environ, "PYCOLL_TOKEN": TOKEN, "SLEEPER": "6", "RELEASE": str(release),
           "FAILED": str(tmp_path / "failed")}
    with NamespaceHosts(3) as hosts:
        store = f"{hosts.addresses[0]}:{port}"
        procs = []
        logs = [tmp_path / f"launcher{h}.txt" for h in range(2)]
        try:
            for h in range(2):
                argv = [sys.executable, "-m", "pycoll.run", "--nnodes", "2", "--node-rank",
                        str(h), "--master-addr", hosts.addresses[0], "--master-port", str(port),
                        "-n", "4", "--timeout", "120", JOB]
                with open(logs[h], "w") as log:
                    procs.append(hosts.popen(h, argv, env=env, stdout=log,
                                             stderr=subprocess.STDOUT))
            end = time.monotonic() + 180
            report = None
            while time.monotonic() < end:
                r = hosts.run(2, [sys.executable, "-m", "pycoll.status", store, "--json"],
                              env=env, timeout=120)
                if r.returncode == 0:
                    report = json.loads(r.stdout)
                    if report["hung"] is not None:
                        break
                time.sleep(0.3)
            assert report is not None and report["hung"] is not None, report
            hung = report["hung"]
            assert (hung["collective"], hung["seq"], hung["waiting_for"]) == \
                ("allreduce", 51, [6]), hung
            row = report["ranks"][6]
            assert row["state"] == "outside" and row["host"] == "pchost1", row
            assert {r["host"] for r in report["ranks"]} == {"pchost0", "pchost1"}
            print(f"status from host 2 took {report['took_s']} s")
            release.touch()
            for h, p in enumerate(procs):
                assert p.wait(timeout=180) == 0, logs[h].read_text()[-3000:]
            text = logs[0].read_text() + logs[1].read_text()
            assert all(f"rank {r} done" in text for r in range(8)), text[-3000:]
        finally:
            release.touch()
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
