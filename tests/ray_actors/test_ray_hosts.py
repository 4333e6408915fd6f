"""Ray across hosts: a head and a worker node, each on its own network-namespace host
(``pycoll.testing.hosts``), and a 2-rank allreduce placed with ``strategy="SPREAD"``.

Each node declares one CPU, so SPREAD (and the CPUs alone) put one rank on each host: the
ranks talk tcp over the namespaces' private addresses, as on a real cluster, and rank 0's
store listens on its node's address as Ray names it. The driver runs on host 0 (only the
namespaces can reach each other). Every ``ray start`` runs in a session of its own and its
whole group is stopped at the end; the test then checks, by a tag in their environment, that
no process of the cluster is left.
"""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'pycoll[ray]')")

from cluster_procs import TAG, tagged_processes, wait_gone  # noqa: E402

from pycoll.testing.hosts import (  # noqa: E402
    NamespaceHosts,
    driver_results,
    host_marks,
    stop_group,
    wait_for_text,
)

pytestmark = host_marks(240)
JOB = Path(__file__).with_name("ray_job.py")
RAY = str(Path(sys.executable).with_name("ray"))
GCS_PORT = 6379             # inside host 0's own network namespace: nothing else is there
WORLD = 2


def _env(tag: str, token: str) -> dict:
    """The nodes' and the driver's environment: one Ray token of this test's own for all
    three (Ray's RPC, which carries pycoll's job secret between the actors, checks it)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYCOLL_", "MASTER_", "SLURM_", "RAY_"))}
    env.update({TAG: tag, "OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN": token})
    return env


def test_allreduce_across_two_namespace_hosts(tmp_path):
    tag = uuid.uuid4().hex
    token = secrets.token_hex(32)
    temp = Path(tempfile.mkdtemp(prefix="pycoll-ray-"))   # short: Ray's sockets live in it
    procs: list[subprocess.Popen] = []
    logs: list[Path] = []

    def start(host: int, argv: list[str], name: str, hosts: NamespaceHosts) -> subprocess.Popen:
        log = tmp_path / f"{name}.log"
        logs.append(log)
        with open(log, "wb") as out:
            proc = hosts.popen(host, argv, env=_env(tag, token), stdout=out,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        procs.append(proc)
        return proc

    def node(i: int, hosts: NamespaceHosts) -> list[str]:
        return [RAY, "start", "--block", "--node-ip-address", hosts.addresses[i],
                "--num-cpus", "1", "--object-store-memory", str(80 << 20),
                "--temp-dir", str(temp / f"h{i}"), "--disable-usage-stats"]

    try:
        with NamespaceHosts(2) as hosts:
            try:
                head = f"{hosts.addresses[0]}:{GCS_PORT}"
                proc = start(0, node(0, hosts) + ["--head", "--port", str(GCS_PORT),
                                                  "--include-dashboard=false"], "head", hosts)
                wait_for_text(logs[0], "Ray runtime started", proc, 90)
                proc = start(1, node(1, hosts) + ["--address", head], "worker", hosts)
                wait_for_text(logs[1], "Ray runtime started", proc, 90)
                driver = start(0, [sys.executable, str(JOB), head, str(WORLD)], "driver", hosts)
                results = driver_results(driver, logs[-1], 180)
            finally:
                for proc in reversed(procs):
                    stop_group(proc)
        left = wait_gone(tagged_processes(tag), 30)
        assert not left, f"processes of the Ray cluster outlived its ray start: {left}"
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert [r["rank"] for r in results] == list(range(WORLD))
    assert all(r["size"] == WORLD and r["exact"] for r in results), results
    assert sorted(r["node"] for r in results) == hosts.addresses, results   # SPREAD: one each
    assert sorted(r["host"] for r in results) == hosts.hostnames, results
    assert all("tcp" in r["transports"] for r in results), results          # crossed the bridge
