"""Jobs of ranks across namespace hosts, shared by the multihost tests and
``benchmarks/multihost_faults.py``.

* ``_env`` ... ``_run_job``: start ranks (torchrun-style variables, the store on host 0) on
  ``NamespaceHosts`` and collect what they wrote (``rank_job.py``).
* ``fault_trial``: one run of ``fault_rank.py`` (2 x 2 or 4 x 1-2 ranks looping on 8 B / 1 MiB
  allreduces) with one fault injected once every rank finished its first collectives:

  - ``link-down``: host 1's ``eth0`` goes down (a pulled cable); every rank is a survivor,
    host 1's ranks lost every other rank and the others lost host 1's;
  - ``host-kill``: SIGKILL to every rank process of host 1; the other hosts' ranks survive;
  - ``partition``: the first half of the hosts can no longer reach the second half
    (``NamespaceHosts.partition``), each half still itself; every rank is a survivor.

  Each survivor must raise ``PeerLost`` (``PeerLostAbort`` included), ``CollectiveTimeout`` or
  ``Aborted`` naming a rank on the other side of the cut, within ``bound_seconds(dead_ms)``
  of the injection (``FaultTrial.problems``).
* ``launcher_trial``: the same job under ``python -m pycoll.run --nnodes 2``; host 1's
  launcher and ranks are killed, and node 0's launcher must exit non-zero naming them.

Every process started is SIGKILLed (its process group) and reaped before a trial returns,
and the fault is undone (link up, partition healed), so one ``NamespaceHosts`` serves many
trials.
"""
from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from pycoll.testing import free_port
from pycoll.testing.hosts import NamespaceHosts

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("rank_job.py")
FAULT_JOB = Path(__file__).with_name("fault_rank.py")


def _env(**extra: str) -> dict:
    """The test's environment without any launcher's variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYCOLL_", "MASTER_", "SLURM_"))}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **extra)
    return env


def _start(hosts: NamespaceHosts, h: int, argv: list[str], env: dict,
           merge: bool = True) -> subprocess.Popen:
    return hosts.popen(h, argv, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT if merge else subprocess.PIPE, text=True)


def _reap(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


def _all_succeed(procs: list[subprocess.Popen], timeout: float) -> None:
    """Wait for every process (output merged) and require exit code 0 of each."""
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    for p, o in zip(procs, outs):
        assert p.returncode == 0, o[-3000:]


def _results(out: Path, world: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def _rank_env(hosts: NamespaceHosts, rank: int, local: int, per_host: int, world: int,
              port: int, **extra: str) -> dict:
    """torchrun-style variables of one rank, the store on host 0."""
    return _env(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local),
                LOCAL_WORLD_SIZE=str(per_host), MASTER_ADDR=hosts.addresses[0],
                MASTER_PORT=str(port), **extra)


def _run_job(hosts: NamespaceHosts, per_host: int, out: Path, master: str | None = None,
             job: Path = JOB, cyclic: bool = False, **extra: str) -> list[dict]:
    """``job`` (default rank_job.py) on every host; ``master``: the store's address (default
    host 0's IPv4 address); ``cyclic``: ranks dealt round-robin over the hosts (Slurm's
    cyclic distribution) instead of in blocks; ``extra``: more variables for every rank."""
    world = hosts.k * per_host
    port = free_port()
    procs: list[subprocess.Popen] = []
    try:
        for h in range(hosts.k):
            for local in range(per_host):
                rank = local * hosts.k + h if cyclic else h * per_host + local
                env = _rank_env(hosts, rank, local, per_host, world, port,
                                PYCOLL_TOKEN="namespace-test-secret", **extra)
                if master is not None:
                    env["MASTER_ADDR"] = master
                procs.append(_start(hosts, h, [sys.executable, str(job), str(out)], env))
        _all_succeed(procs, 100)
    finally:
        _reap(procs)
    return _results(out, world)


# -- faults across hosts ---------------------------------------------------------------------

CASES = ("link-down", "host-kill", "partition")
#: PYCOLL_SOCKET_DEAD_MS of the fault jobs: TCP_USER_TIMEOUT, keepalive probes every second
DEAD_MS = 3000
#: what passing the loss on may add to the dead-socket time (see bound_seconds)
SLACK_SECONDS = 9.0
#: the ranks' collective deadline: far above the bound, so a timeout would be a failure to
#: notice the fault, not its detection
JOB_TIMEOUT = 60.0
#: accepted errors (PeerLostAbort is both a PeerLost and an Aborted)
ACCEPTED = ("PeerLost", "CollectiveTimeout", "Aborted")


def bound_seconds(dead_ms: int = DEAD_MS) -> float:
    """The documented bound (docs/troubleshooting.md, "Faults across hosts"): every survivor
    raises within ``PYCOLL_SOCKET_DEAD_MS`` + one keepalive interval + 9 s of the fault
    (13 s at 3000 ms, 21 s at the default 10000 ms). Where the time goes:

    * the kernel fails a socket with unacknowledged data ``dead_ms`` after the fault
      (TCP_USER_TIMEOUT), an idle one at its first keepalive probe past ``dead_ms`` (probes
      every max(1, dead_ms / 5000) s, as ``netif.tune`` sets them);
    * ranks that still reach the store raise within a few hundred ms of that (the first posts
      the abort record, the others read it within a 100 ms poll);
    * ranks cut off from the store (host 1 after its cable is pulled, the far side of a
      partition) spend up to 1.5 s in each abort-record poll (1 s reply deadline, then a
      0.5 s "is the store gone" connect), during which the wait loop does not look at its
      sockets, and 1.5 s more failing to post their own record: up to 3 s per rank. A rank
      that learns the loss from a neighbour's farewell (the neighbour left because it lost a
      rank across the cut) comes up to 3 s after that neighbour; 3 such steps fit (on 4 x 2
      ranks the chain seen is at most 3 long: measured worst 10.8 s with dead_ms 3000, on 2
      cores under a load average of ~270; 9.3 s on a quiet machine).
    """
    return dead_ms / 1000.0 + max(1, dead_ms // 5000) + SLACK_SECONDS


def _wait_files(out: Path, names: list[str], procs: dict[int, subprocess.Popen] | None,
                until: float) -> list[str]:
    """Wait until every file in ``names`` exists (or ``until``); return the missing ones.
    Stops early when a process of ``procs`` (by rank) exited without writing its file."""
    while True:
        missing = [n for n in names if not (out / n).exists()]
        if not missing or time.monotonic() >= until:
            return missing
        if procs is not None:
            dead = [r for r, p in procs.items()
                    if p.poll() is not None and f"ready{r}" in missing]
            if dead:
                return missing
        time.sleep(0.02)


def _start_logged(hosts: NamespaceHosts, h: int, job: Path, out: Path, rank: int,
                  env: dict) -> subprocess.Popen:
    """``job OUT`` as ``rank`` on host ``h``, its output (merged) in ``OUT/log<rank>.txt``."""
    with open(out / f"log{rank}.txt", "w") as log:
        return hosts.popen(h, [sys.executable, str(job), str(out)], env=env, stdout=log,
                           stderr=subprocess.STDOUT)


def _not_ready(out: Path, procs: dict[int, subprocess.Popen]) -> str:
    """Wait until every rank of ``procs`` wrote ``OUT/ready<rank>`` (its first collectives
    went through); "" then, else a setup error naming the ranks that did not, with their
    logs' tails."""
    world = len(procs)
    missing = _wait_files(out, [f"ready{r}" for r in range(world)], procs,
                          time.monotonic() + 60 + 5 * world)
    if not missing:
        return ""
    return f"not ready: {missing}; " + " | ".join(
        f"rank {r}: {_tail(out / f'log{r}.txt', 600)}" for r in range(world)
        if f"ready{r}" in missing)


def _tail(path: Path, n: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(no output)"


@dataclass
class FaultTrial:
    """What one trial saw: per survivor the json its rank wrote (fault_rank.py)."""

    case: str
    hosts: int
    per_host: int
    cut: list[set[int]]              # the ranks on each side of the fault
    survivors: list[int]
    injected: float = 0.0            # time.monotonic() just before the fault was injected
    results: dict[int, dict] = field(default_factory=dict)
    logs: dict[int, str] = field(default_factory=dict)   # output of ranks without a result
    exits: dict[int, float | None] = field(default_factory=dict)  # rank -> exit, s after
    setup_error: str = ""

    def other_side(self, rank: int) -> set[int]:
        return set().union(*(side for side in self.cut if rank not in side))

    def latencies(self) -> dict[int, float]:
        return {r: res["t"] - self.injected for r, res in self.results.items()
                if res.get("kind") != "none"}

    def named_ok(self, rank: int) -> bool:
        res = self.results.get(rank)
        if res is None or not any(k in ACCEPTED for k in res["kinds"]):
            return False
        named = set(res["named"])
        if "PeerLost" in res["kinds"]:            # the rank it blames must be across the cut
            return bool(named) and named <= self.other_side(rank)
        return bool(named & self.other_side(rank))

    def problems(self, bound: float) -> list[str]:
        if self.setup_error:
            return [f"{self.case}: setup: {self.setup_error}"]
        bad = []
        lat = self.latencies()
        for r in self.survivors:
            res = self.results.get(r)
            if res is None:
                bad.append(f"rank {r}: no error reported ({self.logs.get(r, '')[-600:]})")
                continue
            if res["kind"] == "none":
                bad.append(f"rank {r}: the job went on without an error")
                continue
            if not self.named_ok(r):
                bad.append(f"rank {r}: {res['kind']} naming {res['named']}, not a rank of "
                           f"{sorted(self.other_side(r))}: {res['message'][:500]}")
            if lat[r] > bound:
                bad.append(f"rank {r}: raised {lat[r]:.2f} s after the fault (bound "
                           f"{bound:g} s): {res['message'][:300]}")
        return bad


def fault_trial(hosts: NamespaceHosts, case: str, per_host: int, out: Path, *,
                dead_ms: int = DEAD_MS, wait: float | None = None,
                rng: random.Random | None = None, exit_wait: float = 0.0) -> FaultTrial:
    """One job of ``hosts.k`` x ``per_host`` ranks and one fault ``case`` (see the module
    docstring). ``out`` must be an empty directory; ``wait``: how long after the fault the
    survivors may take to report (default: the bound + 10 s); ``exit_wait``: then wait until
    that long after the fault for every rank process to exit (``exits``; None: still running)
    before killing what is left."""
    if case not in CASES:
        raise ValueError(f"unknown case {case!r}; one of {CASES}")
    rng = rng or random.Random()
    k, world = hosts.k, hosts.k * per_host
    ranks_of = [set(range(h * per_host, (h + 1) * per_host)) for h in range(k)]
    if case == "partition":
        groups = [list(range(k // 2)), list(range(k // 2, k))]
    else:
        groups = [[h for h in range(k) if h != 1], [1]]
    cut = [set().union(*(ranks_of[h] for h in g)) for g in groups]
    survivors = sorted(set(range(world)) - (ranks_of[1] if case == "host-kill" else set()))
    trial = FaultTrial(case, k, per_host, cut, survivors)
    wait = bound_seconds(dead_ms) + 10.0 if wait is None else wait
    port = free_port()
    procs: dict[int, subprocess.Popen] = {}
    injected = False
    try:
        for h in range(k):
            for local in range(per_host):
                r = h * per_host + local
                env = _rank_env(hosts, r, local, per_host, world, port,
                                PYCOLL_TOKEN="fault-test-secret",
                                PYCOLL_SOCKET_DEAD_MS=str(dead_ms),
                                FAULT_JOB_TIMEOUT=str(JOB_TIMEOUT))
                procs[r] = _start_logged(hosts, h, FAULT_JOB, out, r, env)
        trial.setup_error = _not_ready(out, procs)
        if trial.setup_error:
            return trial
        time.sleep(rng.uniform(0.02, 0.15))      # somewhere inside a collective
        trial.injected = time.monotonic()
        injected = True
        if case == "link-down":
            hosts.link(1, up=False)
        elif case == "host-kill":
            for r in sorted(ranks_of[1]):
                os.killpg(procs[r].pid, signal.SIGKILL)
        else:
            hosts.partition(groups)
        _wait_files(out, [f"fault{r}.json" for r in survivors], None,
                    trial.injected + wait)
        for r in survivors:
            path = out / f"fault{r}.json"
            if path.exists():
                trial.results[r] = json.loads(path.read_text())
            else:
                trial.logs[r] = _tail(out / f"log{r}.txt")
        while exit_wait and time.monotonic() < trial.injected + exit_wait:
            for r, p in procs.items():
                if r not in trial.exits and p.poll() is not None:
                    trial.exits[r] = time.monotonic() - trial.injected
            if len(trial.exits) == len(procs):
                break
            time.sleep(0.05)
        if exit_wait:
            for r in procs:
                trial.exits.setdefault(r, None)
    finally:
        _reap(list(procs.values()))
        if injected and case == "link-down":
            hosts.link(1, up=True)
        elif injected and case == "partition":
            hosts.heal()
    return trial


def _kill_rank(pid: int) -> None:
    """SIGKILL the process group of a rank a launcher started (not our child: its launcher
    or init reaps it), unless that pid is no longer a fault_rank.py process."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if FAULT_JOB.name.encode() not in f.read():
                return
        os.killpg(pid, signal.SIGKILL)
    except (OSError, ProcessLookupError):
        pass


@dataclass
class LauncherTrial:
    """Node 0's launcher after host 1's launcher and ranks were killed (``host-kill``), or
    both launchers after host 1's cable was pulled (``link-down``)."""

    injected: float = 0.0
    exit_code: int | None = None     # node 0's launcher; None: still running at the deadline
    exited: float = 0.0              # seconds from the fault to its exit
    stderr: str = ""
    #: node -> (exit code, seconds from the fault) of each launcher watched; (None, None):
    #: still running at the deadline
    launchers: dict[int, tuple[int | None, float | None]] = field(default_factory=dict)
    setup_error: str = ""
    results: dict[int, dict] = field(default_factory=dict)   # node 0's ranks' errors

    def problems(self, bound: float, lost: set[int]) -> list[str]:
        if self.setup_error:
            return [f"launcher: setup: {self.setup_error}"]
        if self.exit_code is None:
            return [f"node 0's launcher still ran {self.exited:.1f} s after host 1 was killed: "
                    f"{self.stderr[-1500:]}"]
        bad = []
        if self.exit_code == 0:
            bad.append("node 0's launcher exited 0")
        # its own lines (its ranks' tracebacks go to the same stream)
        own = "\n".join(ln for ln in self.stderr.splitlines() if ln.startswith("pycoll.run:"))
        mentioned = {int(x) for x in re.findall(r"\brank (\d+)", own)}
        if not (mentioned & lost or "pchost1" in own):
            bad.append(f"node 0's launcher names none of ranks {sorted(lost)} nor pchost1: "
                       f"{own[-1500:]}")
        if self.exited > bound:
            bad.append(f"node 0's launcher exited {self.exited:.1f} s after the kill (bound "
                       f"{bound:g} s), though it had named the failure: {own[-600:]}")
        return bad


def launcher_trial(hosts: NamespaceHosts, per_host: int, out: Path, *,
                   case: str = "host-kill", dead_ms: int = DEAD_MS,
                   wait: float = 60.0) -> LauncherTrial:
    """``python -m pycoll.run --nnodes 2`` on hosts 0 and 1 running fault_rank.py; once every
    rank is ready: ``host-kill`` SIGKILLs host 1's launcher (its process group) and its ranks
    (their own groups: the launcher puts each rank in a session of its own) and waits up to
    ``wait`` s for node 0's launcher; ``link-down`` takes host 1's link down and waits for
    both launchers."""
    if case not in ("host-kill", "link-down"):
        raise ValueError(f"unknown launcher case {case!r}")
    trial = LauncherTrial()
    port = free_port()
    env = _env(PYCOLL_TOKEN="fault-launcher-secret", PYCOLL_SOCKET_DEAD_MS=str(dead_ms),
               FAULT_JOB_TIMEOUT=str(JOB_TIMEOUT))
    world = 2 * per_host
    procs: list[subprocess.Popen] = []
    rank_pids: list[int] = []
    injected = False
    try:
        for h in range(2):
            argv = [sys.executable, "-m", "pycoll.run", "--nnodes", "2", "--node-rank", str(h),
                    "--master-addr", hosts.addresses[0], "--master-port", str(port),
                    "-n", str(per_host), "--timeout", "120", str(FAULT_JOB), str(out)]
            with open(out / f"launcher{h}.txt", "w") as log:
                procs.append(hosts.popen(h, argv, env=env, stdout=log,
                                         stderr=subprocess.STDOUT))
        missing = _wait_files(out, [f"ready{r}" for r in range(world)], None,
                              time.monotonic() + 60 + 5 * world)
        for r in range(world):
            if (out / f"ready{r}").exists():
                rank_pids.append(json.loads((out / f"ready{r}").read_text())["pid"])
        if missing:
            trial.setup_error = f"not ready: {missing}: " + " | ".join(
                _tail(out / f"launcher{h}.txt", 800) for h in range(2))
            return trial
        trial.injected = time.monotonic()
        injected = True
        if case == "host-kill":
            os.killpg(procs[1].pid, signal.SIGKILL)
            for pid in rank_pids[per_host:]:
                _kill_rank(pid)
            watch = [0]
        else:
            hosts.link(1, up=False)
            watch = [0, 1]
        while True:
            for h in watch:
                if h not in trial.launchers and procs[h].poll() is not None:
                    trial.launchers[h] = (procs[h].returncode,
                                          time.monotonic() - trial.injected)
            if len(trial.launchers) == len(watch) or time.monotonic() > trial.injected + wait:
                break
            time.sleep(0.05)
        for h in watch:
            trial.launchers.setdefault(h, (None, None))
        trial.exit_code, exited = trial.launchers[0]
        trial.exited = exited if exited is not None else time.monotonic() - trial.injected
        trial.stderr = _tail(out / "launcher0.txt", 100_000)
        for r in range(per_host):
            path = out / f"fault{r}.json"
            if path.exists():
                trial.results[r] = json.loads(path.read_text())
    finally:
        _reap(procs)
        for pid in rank_pids:          # ranks live in their own sessions
            _kill_rank(pid)
        if injected and case == "link-down":
            hosts.link(1, up=True)
    return trial
