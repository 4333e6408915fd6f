"""Several hosts on one machine: network namespaces with their own hostname, /etc/hosts,
address and (optionally shaped) link, created and always removed by the test itself.

Ranks on one namespace host talk shared memory, ranks on different ones tcp over the
namespaces' private addresses, as on real machines (``pycoll.testing.hosts``).
"""
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
from pycoll.testing.hosts import NETNS_ETC, NamespaceHosts, available

from .jobs import _all_succeed, _env, _rank_env, _reap, _results, _run_job, _start

ok, why = available()
pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not ok, reason=f"namespace hosts unavailable: {why}")]
ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("rank_job.py")


def _ours() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [ln.split()[0] for ln in out.splitlines() if ln.startswith(f"pycoll-{os.getpid()}-")]


def test_hosts_have_their_own_names_addresses_and_go_away():
    with NamespaceHosts(3, rate="2gbit") as hosts:
        assert len(_ours()) == 4                              # 3 hosts and the switch
        for i in range(3):
            res = hosts.run(i, ["sh", "-c", "hostname; getent hosts pchost0 pchost1 pchost2; "
                                            "ip -4 -o addr show eth0; tc qdisc show dev eth0"])
            assert res.returncode == 0, res.stderr
            lines = res.stdout.splitlines()
            assert lines[0] == f"pchost{i}"
            assert all(f"{hosts.addresses[j]} " in res.stdout for j in range(3))
            assert f"inet {hosts.addresses[i]}/24" in res.stdout
            assert "rate 2Gbit" in res.stdout
        # the machine's own interfaces are untouched: no address of ours exists outside
        outside = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True)
        assert not any(a in outside.stdout for a in hosts.addresses)
    assert _ours() == []
    left = os.listdir(NETNS_ETC) if os.path.isdir(NETNS_ETC) else []
    assert not [n for n in left if n.startswith(f"pycoll-{os.getpid()}-")], left


def test_hosts_of_a_killed_test_are_swept():
    """A test process killed with its namespaces up: the next NamespaceHosts removes them."""
    code = ("import time; from pycoll.testing.hosts import NamespaceHosts\n"
            "h = NamespaceHosts(2).__enter__(); print(h.names[0], flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        name = proc.stdout.readline().strip()
        assert name.startswith("pycoll-")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert name in listed                                   # left behind by the kill
    with NamespaceHosts(1):
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert name not in listed


@pytest.mark.parametrize("hosts_n,per_host", [(2, 2), (4, 2)])
def test_collectives_across_namespace_hosts(hosts_n, per_host, tmp_path):
    with NamespaceHosts(hosts_n) as hosts:
        results = _run_job(hosts, per_host, tmp_path)
    for res in results:
        r = res["rank"]
        assert res["host"] == f"pchost{r // per_host}", res
        for key in ("allreduce", "broadcast", "allgather", "alltoall", "big"):
            assert res[key], (key, res)
        for p, transport in res["transports"].items():
            same_host = int(p) // per_host == r // per_host
            assert transport == ("shm" if same_host else "tcp"), res


FAILING_JOB = """
import os, sys, time
import numpy as np
import pycoll
comm = pycoll.init(timeout=30)
a = np.ones(4)
comm.allreduce(a)
if comm.rank == comm.size - 1:
    sys.exit(5)                       # one rank of the last host fails
for _ in range(100):
    comm.allreduce(a)
    time.sleep(0.05)
"""


def _launchers(hosts: NamespaceHosts, script: list[str], per_host: int):
    port = free_port()
    env = _env(PYCOLL_TOKEN="multi-node-secret")
    procs: list[subprocess.Popen] = []
    try:
        for h in range(hosts.k):
            argv = [sys.executable, "-m", "pycoll.run", "--nnodes", str(hosts.k), "--node-rank",
                    str(h), "--master-addr", hosts.addresses[0], "--master-port", str(port),
                    "-n", str(per_host), "--timeout", "90", *script]
            procs.append(_start(hosts, h, argv, env, merge=False))
        outs = [p.communicate(timeout=110) for p in procs]
    finally:
        _reap(procs)
    return procs, outs


def test_pycoll_run_on_several_hosts(tmp_path):
    """One launcher per host (--nnodes/--node-rank), ranks numbered across hosts, the store
    on node 0, the secret from each launcher's environment (never a command line)."""
    with NamespaceHosts(2) as hosts:
        procs, outs = _launchers(hosts, [str(JOB), str(tmp_path)], 2)
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out + err[-3000:]
    for res in _results(tmp_path, 4):
        assert res["host"] == f"pchost{res['rank'] // 2}", res
        assert all(res[k] for k in ("allreduce", "broadcast", "allgather", "alltoall", "big"))
        assert all(res["others"].values()), res["others"]
        assert sorted(res["transports"].values()) == ["shm", "tcp", "tcp"], res


def test_failing_rank_on_one_host_ends_the_job_everywhere(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text(FAILING_JOB)
    start = time.monotonic()
    with NamespaceHosts(2) as hosts:
        procs, outs = _launchers(hosts, [str(script)], 2)
    elapsed = time.monotonic() - start
    assert all(p.returncode != 0 for p in procs), [(p.returncode, e[-2000:]) for p, (_, e) in
                                                   zip(procs, outs)]
    for _, err in outs:
        assert "rank 3" in err, err[-3000:]                   # named on every host
    assert elapsed < 60, elapsed


def test_several_hosts_need_a_secret():
    proc = subprocess.run([sys.executable, "-m", "pycoll.run", "--nnodes", "2", "--node-rank",
                           "1", "--master-addr", "10.1.2.3", "--master-port", "29999", "-n",
                           "1", "x.py"], capture_output=True, text=True, timeout=30,
                          env={k: v for k, v in os.environ.items() if k != "PYCOLL_TOKEN"})
    assert proc.returncode == 2 and "PYCOLL_TOKEN" in proc.stderr, proc.stderr


def test_slurm_environment_across_hosts(tmp_path):
    """Tasks as srun starts them on 2 nodes x 2 tasks: no MASTER_ADDR; rank 0's host comes
    from SLURM_STEP_NODELIST ("pchost[0-1]", resolved through each host's /etc/hosts) and the
    store port from the job id."""
    per_host, world = 2, 4
    procs: list[subprocess.Popen] = []
    with NamespaceHosts(2) as hosts:
        try:
            for h in range(2):
                for local in range(per_host):
                    env = _env(SLURM_PROCID=str(h * per_host + local), SLURM_NTASKS=str(world),
                               SLURM_LOCALID=str(local), SLURM_NODEID=str(h),
                               SLURM_TASKS_PER_NODE="2(x2)", SLURM_STEP_NODELIST="pchost[0-1]",
                               SLURM_JOB_ID="4321", SLURM_STEP_ID="0",
                               PYCOLL_TOKEN="slurm-test-secret")
                    procs.append(_start(hosts, h, [sys.executable, str(JOB), str(tmp_path)],
                                        env))
            _all_succeed(procs, 100)
        finally:
            _reap(procs)
    for r, res in enumerate(_results(tmp_path, world)):
        assert res["host"] == f"pchost{r // per_host}" and res["allreduce"] and res["big"], res


NSEXEC = """#!/bin/sh
# hydra's launcher-exec: [options] HOST COMMAND... -> COMMAND on namespace host HOST
while [ "${1#-}" != "$1" ]; do shift; done
host=$1; shift
ns=$(printenv "PCNS_$host")
exec ip netns exec "$ns" unshare --uts sh -c "hostname $host; exec $*"
"""

MPI_JOB = """
import json, os, socket, sys, numpy as np
import pycoll
comm = pycoll.init(timeout=30)          # no MASTER_ADDR: rank 0's address travels over MPI
a = np.ones(4) * (comm.rank + 1)
comm.allreduce(a)
with open(os.path.join(sys.argv[1], f"mpi{comm.rank}.json"), "w") as f:
    json.dump([comm.size, socket.gethostname(), a.tolist(), comm.transport_summary()], f)
"""


def test_mpiexec_across_hosts_without_master_addr(tmp_path):
    """MPICH's hydra starts 2 x 2 ranks on two namespace hosts (its launcher-exec enters the
    other host's namespace, as ssh would); plain pycoll.init() bootstraps over MPI."""
    mpiexec = Path(sys.executable).parent / "mpiexec"
    if not mpiexec.exists():
        pytest.skip("mpiexec (mpich wheel) not installed")
    pytest.importorskip("mpi4py")
    nsexec = tmp_path / "nsexec.sh"
    nsexec.write_text(NSEXEC)
    nsexec.chmod(0o755)
    job = tmp_path / "job.py"
    job.write_text(MPI_JOB)
    with NamespaceHosts(2) as hosts:
        env = _env(**{f"PCNS_{h}": n for h, n in zip(hosts.hostnames, hosts.names)})
        res = hosts.run(0, [str(mpiexec), "-launcher", "ssh", "-launcher-exec", str(nsexec),
                            "-hosts", "pchost0:2,pchost1:2", "-n", "4", sys.executable,
                            str(job), str(tmp_path)], env=env, timeout=90)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    for rank in range(4):
        size, host, values, transports = json.loads((tmp_path / f"mpi{rank}.json").read_text())
        assert size == 4 and host == f"pchost{rank // 2}", (rank, host)
        assert values == [10.0] * 4 and transports == "shm(1 peers), tcp(2 peers)", transports


LINK_JOB = """
import json, os, sys, time
import numpy as np
import pycoll
comm = pycoll.init(timeout=120)
out = sys.argv[1]
a = np.ones(1 << 16, np.float32)
start = None
try:
    for i in range(100000):
        comm.allreduce(a)
        if i == 20:
            open(os.path.join(out, f"ready{comm.rank}"), "w").close()
            start = time.monotonic()
        time.sleep(0.002)
    result = ["no error", 0.0]
except pycoll.PycollError as e:
    result = [type(e).__name__ + ": " + str(e)[:400], time.monotonic() - (start or 0)]
with open(os.path.join(out, f"link{comm.rank}.json"), "w") as f:
    json.dump(result, f)
"""


def test_a_pulled_cable_is_noticed_in_seconds(tmp_path):
    """Host 1's link goes down mid-job (ip link set eth0 down): host 0's ranks raise naming
    host 1's ranks within ~15 s (PYCOLL_SOCKET_DEAD_MS 5 s here), far below the 120 s
    collective timeout and the kernel's 15 minutes of retransmissions."""
    job = tmp_path / "link.py"
    job.write_text(LINK_JOB)
    with NamespaceHosts(2) as hosts:
        procs: list[subprocess.Popen] = []
        try:
            port = free_port()
            for h in range(2):
                env = _rank_env(hosts, h, 0, 1, 2, port, PYCOLL_TOKEN="link-test",
                                PYCOLL_SOCKET_DEAD_MS="5000")
                procs.append(_start(hosts, h, [sys.executable, str(job), str(tmp_path)], env))
            deadline = time.monotonic() + 60
            while not (tmp_path / "ready0").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            hosts.link(1, up=False)
            pulled = time.monotonic()
            try:
                procs[0].wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
            noticed = time.monotonic() - pulled
        finally:
            _reap(procs)
    message, _ = json.loads((tmp_path / "link0.json").read_text())
    assert ("PeerLost" in message or "CollectiveTimeout" in message
            or "Aborted" in message), message
    assert "rank 1" in message, message
    assert noticed < 30, (noticed, message)


def test_torchrun_on_several_hosts_uses_torchs_store(tmp_path):
    """torchrun --nnodes 2 on two namespace hosts: pycoll bootstraps over torchrun's own
    agent store (no second port guessed as MASTER_PORT+1), namespaced by run and restart."""
    port = free_port()
    with NamespaceHosts(2) as hosts:
        procs = [_start(hosts, h, [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                                   "--node-rank", str(h), "--master-addr", "pchost0",
                                   "--master-port", str(port), "--nproc-per-node", "2",
                                   str(JOB), str(tmp_path)], _env()) for h in range(2)]
        try:
            _all_succeed(procs, 110)
        finally:
            _reap(procs)
    for r, res in enumerate(_results(tmp_path, 4)):
        assert res["host"] == f"pchost{r // 2}" and res["allreduce"] and res["big"], res
        assert res["store"] == "TorchStoreAdapter", res
        assert sorted(res["transports"].values()) == ["shm", "tcp", "tcp"], res
