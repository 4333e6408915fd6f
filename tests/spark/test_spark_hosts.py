"""Spark barrier mode across hosts: a standalone master and two workers, each worker on its
own network-namespace host (``pycoll.testing.hosts``), and a 4-rank allreduce over them.

Each host runs one worker with 2 cores, so the 4 barrier tasks are 2 executors' Python
workers on 2 hosts: ranks on one host talk shared memory, ranks on different hosts tcp over
the namespaces' private addresses, as on a real cluster. The driver runs on host 0 (only
the namespaces can reach each other). Every process is started in its own session and its
whole group is killed at the end.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install "
                                                "'pycoll[spark]')")

from pycoll.testing.hosts import (  # noqa: E402
    NamespaceHosts,
    driver_results,
    host_marks,
    stop_group,
    wait_for_text,
)

JAVA = shutil.which("java") is not None or bool(os.environ.get("JAVA_HOME"))
pytestmark = [
    *host_marks(240),
    pytest.mark.skipif(not JAVA, reason="Spark needs a Java runtime: no java on PATH and "
                                        "JAVA_HOME is not set"),
]
JOB = Path(__file__).with_name("spark_job.py")
SPARK_HOME = Path(pyspark.__file__).parent
MASTER_PORT = 7077          # inside host 0's own network namespace: nothing else is there
WORLD = 4


def _env(host_addr: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYCOLL_", "MASTER_", "SLURM_", "SPARK_", "PYSPARK_"))}
    env.update(SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP=host_addr,
               PYSPARK_PYTHON=sys.executable, SPARK_DAEMON_MEMORY="256m",
               OMP_NUM_THREADS="1", SPARK_NO_DAEMONIZE="1")
    return env


def test_allreduce_across_two_namespace_hosts(tmp_path):
    procs: list[subprocess.Popen] = []
    logs: list[Path] = []

    def start(host: int, argv: list[str], name: str, hosts: NamespaceHosts) -> subprocess.Popen:
        log = tmp_path / f"{name}.log"
        logs.append(log)
        with open(log, "wb") as out:
            proc = hosts.popen(host, argv, env=_env(hosts.addresses[host]), stdout=out,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        procs.append(proc)
        return proc

    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    with NamespaceHosts(2) as hosts:
        try:
            master_url = f"spark://{hosts.addresses[0]}:{MASTER_PORT}"
            master = start(0, [spark_class, "org.apache.spark.deploy.master.Master",
                               "--host", hosts.addresses[0], "--port", str(MASTER_PORT),
                               "--webui-port", "0"], "master", hosts)
            wait_for_text(logs[0], "I have been elected leader", master, 60)
            for i in range(2):
                work = tmp_path / f"work{i}"
                work.mkdir()
                start(i, [spark_class, "org.apache.spark.deploy.worker.Worker",
                          "--host", hosts.addresses[i], "--cores", str(WORLD // 2),
                          "--memory", "1g", "--work-dir", str(work), "--webui-port", "0",
                          master_url], f"worker{i}", hosts)
            for i in range(2):
                wait_for_text(logs[1 + i], "Successfully registered with master", procs[1 + i], 60)
            driver = start(0, [sys.executable, str(JOB), master_url, str(WORLD)], "driver",
                           hosts)
            results = driver_results(driver, logs[-1], 150)
        finally:
            for proc in reversed(procs):
                stop_group(proc)
    assert [r["rank"] for r in results] == list(range(WORLD))
    assert all(r["size"] == WORLD and r["exact"] for r in results), results
    by_host: dict[str, list[int]] = {}
    for r in results:
        by_host.setdefault(r["host"], []).append(r["rank"])
    assert sorted(by_host) == hosts.hostnames, results            # both hosts took part
    assert all(len(ranks) == WORLD // 2 for ranks in by_host.values()), results
    assert all("tcp" in r["transports"] for r in results), results  # crossed the bridge
