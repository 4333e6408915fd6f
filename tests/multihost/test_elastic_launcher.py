"""``python -m pycoll.run --elastic --nnodes K``: one launcher per namespace host, a host
lost mid-job, and the job goes on (or ends, saying why).

* a host killed (its launcher and its ranks, SIGKILL): node 0 finds the host's launcher
  gone through its lease on the store, counts its ranks lost, starts their replacements
  itself (``--max-restarts``), and the survivors' ``grow`` admits them: every process ends
  on the grown world with a checked allreduce, and both remaining launchers exit 0;
* a host's cable pulled: the same host lost (found by the store's keepalive); its own
  launcher loses the store and ends its ranks, saying so;
* node 0's host killed: the store is gone with it; the other launcher says so and exits 1;
* fewer than ``--min-ranks`` ranks left job-wide after a host is lost: node 0 ends the job.

Real launchers, ranks and sockets in network namespaces (``NamespaceHosts``); the rank
program is ``elastic_launch_rank.py``. Every process is killed and reaped before a test
returns.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pycoll.testing import free_port
from pycoll.testing.hosts import NamespaceHosts, available

from .jobs import _env

ok, why = available()
pytestmark = [pytest.mark.skipif(not ok, reason=f"namespace hosts unavailable: {why}"),
              pytest.mark.timeout(240)]

RANK = Path(__file__).with_name("elastic_launch_rank.py")
PER_HOST = 2
#: a launcher's end after the fault: the store's keepalive (~4 s) or a store call's limit
#: (3 s), the survivors' shrink and grow with process starts on 2 loaded cores
WAIT = 120.0


class Job:
    """K launchers of one elastic job, one per namespace host; ``close`` reaps them all."""

    def __init__(self, hosts: NamespaceHosts, out: Path, *launcher_args: str,
                 grow: int = 0) -> None:
        self.hosts, self.out = hosts, out
        port = free_port()
        env = _env(PYCOLL_TOKEN="elastic-launcher-secret", PYCOLL_SOCKET_DEAD_MS="3000")
        self.launchers: list[subprocess.Popen] = []
        for h in range(hosts.k):
            argv = [sys.executable, "-m", "pycoll.run", "--elastic", "--nnodes", str(hosts.k),
                    "--node-rank", str(h), "--master-addr", hosts.addresses[0],
                    "--master-port", str(port), "-n", str(PER_HOST), "--timeout", "200",
                    *launcher_args, str(RANK), str(out), str(grow)]
            with open(out / f"launcher{h}.txt", "w") as log:
                self.launchers.append(hosts.popen(h, argv, env=env, stdout=log,
                                                  stderr=subprocess.STDOUT))

    def log(self, h: int) -> str:
        return (self.out / f"launcher{h}.txt").read_text(errors="replace")

    def files(self, kind: str) -> dict[str, dict]:
        return {p.name.split(".", 1)[1]: json.loads(p.read_text())
                for p in self.out.glob(f"{kind}.*") if not p.name.endswith(".tmp")}

    def wait_ready(self) -> None:
        world = self.hosts.k * PER_HOST
        deadline = time.monotonic() + 90
        while len(self.files("ready")) < world:
            dead = [h for h, p in enumerate(self.launchers) if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                pytest.fail(f"ranks not ready ({sorted(self.files('ready'))} of {world}); "
                            f"launchers ended: {dead}\n" + "\n".join(
                                self.log(h)[-2000:] for h in range(self.hosts.k)))
            time.sleep(0.05)

    def kill_host(self, h: int) -> None:
        """SIGKILL host ``h``'s launcher and every rank on it (each in a session of its
        own), as a host that loses power."""
        os.killpg(self.launchers[h].pid, signal.SIGKILL)
        for rec in self.files("pid").values():
            if rec["host"] == self.hosts.hostnames[h]:
                _kill_group(rec["pid"])

    def wait(self, hosts: list[int]) -> dict[int, int | None]:
        """The exit codes of the launchers of ``hosts`` (None: still running at ``WAIT``)."""
        deadline = time.monotonic() + WAIT
        while (any(self.launchers[h].poll() is None for h in hosts)
               and time.monotonic() < deadline):
            time.sleep(0.1)
        return {h: self.launchers[h].poll() for h in hosts}

    def close(self) -> None:
        for p in self.launchers:
            _kill_group(p.pid)
            p.wait(10)
        for rec in self.files("pid").values():
            _kill_group(rec["pid"])


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _run(hosts_count: int, tmp_path: Path, fault, *launcher_args: str, grow: int = 0,
         watch: list[int]) -> tuple[Job, dict[int, int | None]]:
    with NamespaceHosts(hosts_count) as hosts:
        job = Job(hosts, tmp_path, *launcher_args, grow=grow)
        try:
            job.wait_ready()
            (tmp_path / "fault.json").write_text(json.dumps({"t": time.monotonic()}))
            fault(job)
            codes = job.wait(watch)
        finally:
            job.close()
            for h in range(hosts_count):
                hosts.link(h, up=True)
    return job, codes


def _logs(job: Job) -> str:
    return "\n".join(f"--- launcher {h}\n{job.log(h)[-3000:]}" for h in range(job.hosts.k))


def test_a_lost_host_is_replaced_on_node_0_and_the_job_grows_back(tmp_path):
    job, codes = _run(3, tmp_path, lambda j: j.kill_host(2), "--max-restarts", "2", grow=2,
                      watch=[0, 1])
    assert codes == {0: 0, 1: 0}, _logs(job)
    log0 = job.log(0)
    assert "pycoll.run: host pchost2 (node 2) was lost with ranks [4, 5]" in log0, _logs(job)
    assert "replacements start on this host while restarts are left" in log0
    assert "started a replacement for rank 4" in log0 and "restart 2 of 2" in log0
    results = job.files("result")
    originals = {k: v for k, v in results.items() if not k.startswith("r")}
    replacements = [v for k, v in results.items() if k.startswith("r")]
    assert sorted(originals) == ["0", "1", "2", "3"], _logs(job)
    for rec in originals.values():
        assert rec["shrunk"][1:] == [4, 10.0] and rec["last"][1:] == [6, 21.0], rec
    assert len(replacements) == 2, _logs(job)
    for rec in replacements:   # started by node 0's launcher, on node 0's host
        assert rec["host"] == "pchost0" and rec["replaces"] in ("4", "5"), rec
        assert rec["last"][1:] == [6, 21.0], rec
    assert sorted(rec["last"][0] for rec in results.values()) == list(range(6))
    assert "elastic job done" in log0


def test_a_pulled_cable_loses_the_host_and_its_launcher_says_why(tmp_path):
    job, codes = _run(3, tmp_path, lambda j: j.hosts.link(2, up=False), watch=[0, 1, 2])
    assert codes[0] == 0 and codes[1] == 0, _logs(job)
    assert codes[2] not in (None, 0), _logs(job)
    assert "cannot be reached" in job.log(2) and "cannot outlive its store" in job.log(2)
    assert "host pchost2 (node 2) was lost with ranks [4, 5]" in job.log(0), _logs(job)
    results = job.files("result")
    assert sorted(results) == ["0", "1", "2", "3"], _logs(job)
    for rec in results.values():
        assert rec["shrunk"][1:] == [4, 10.0] and rec["last"] == rec["shrunk"], rec


def test_losing_node_0_ends_the_job_with_an_error_that_says_so(tmp_path):
    job, codes = _run(2, tmp_path, lambda j: j.kill_host(0), watch=[1])
    assert codes == {1: 1}, _logs(job)
    log1 = job.log(1)
    assert (f"pycoll.run: the job's store at {job.hosts.addresses[0]}:" in log1
            and "(node 0's launcher) cannot be reached" in log1
            and "an elastic job cannot outlive its store" in log1), _logs(job)


def test_fewer_than_min_ranks_left_across_hosts_ends_the_job(tmp_path):
    job, codes = _run(2, tmp_path, lambda j: j.kill_host(1), "--min-ranks", "3", watch=[0])
    # whether host 0's two survivors had shrunk and finished before the launcher judged the
    # loss, or were torn down, the job ends with the loss's verdict
    assert codes == {0: 1}, _logs(job)
    assert re.search(r"host pchost1 \(node 1\) was lost with ranks \[2, 3\]; fewer than 3 "
                     r"ranks are left \([02] running, --min-ranks 3\)", job.log(0)), _logs(job)
