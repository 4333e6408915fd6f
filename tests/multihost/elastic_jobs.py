"""Elastic trials across namespace hosts: ranks are lost, the survivors shrink and go on.

Shared by ``test_elastic_hosts.py`` and ``benchmarks/elastic_hosts.py``. A trial runs
``elastic_rank.py`` on ``HOSTS`` x ``PER_HOST`` ranks (ranks of one host talk shm, of
different hosts tcp) with the store in a namespace host of its own (``python -m rendezvous
serve``, ``PYCOLL_STORE_EXTERNAL=1``): it is no rank's process, so it outlives any of them,
and no rank's fault can cut it off from the others. Once every rank finished its first
checked steps, after a random 50-1000 ms more of the loop, one fault:

* ``kill``: SIGKILL to one rank, drawn at random;
* ``host``: SIGKILL to every rank of one host, drawn at random;
* ``cable``: one host's ``eth0`` goes down (``NamespaceHosts.link``): its ranks are cut off
  from the store and from the other hosts. They are lost, not survivors: they must end by
  themselves (``Excluded`` or another error), never hang.

The judge (``ElasticTrial.problems``): every survivor ended on a shrunk communicator of the
same size (the world less the lost ranks), ranked 0..m-1, whose checked collectives and
closing agree went through; no collective anywhere returned a wrong result; no survivor waited
until its deadline (a ``CollectiveTimeout`` means the loss went unnoticed); every survivor
exited 0 and every cut-off rank exited by itself within ``EXIT_LIMIT`` s of the fault (a
process still running then is a hang: its stacks are dumped into its log, then it is killed).

Measured per survivor: *detection*, the fault to the survivor's first error (for a pulled
cable that is the link-down detection), and *recovery*, that error to its first successful
collective on the shrunk communicator (``time.monotonic``: one clock for every namespace).

Every process is SIGKILLed (its process group) and reaped, and the cable plugged in again,
before a trial returns, so one ``NamespaceHosts(HOSTS + 1)`` serves many trials.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from pycoll.testing.hosts import NamespaceHosts, stop_group, wait_for_text

from .jobs import DEAD_MS, _env, _not_ready, _rank_env, _reap, _start_logged, _tail

ELASTIC_JOB = Path(__file__).with_name("elastic_rank.py")
AGREE_JOB = Path(__file__).with_name("agree_rank.py")
FAULTS = ("kill", "host", "cable")
HOSTS, PER_HOST = 4, 2
TOKEN = "elastic-hosts-secret"
#: the ranks' collective and shrink deadline: far above any recovery, so that a wait that
#: ends at it shows as a failure, not as a slow recovery
TIMEOUT = 30.0
#: seconds after the fault by which every survivor has recovered and exited, and every
#: cut-off rank has exited by itself; a process still running then is hung
EXIT_LIMIT = 60.0
#: seconds after the fault when a rank still running writes its stacks into its log
STACKS_AFTER = 20.0
#: ranks waiting in a collective when the fault comes: a random moment in this range (s)
#: after the last rank said it was ready
FAULT_DELAY = (0.05, 1.0)


@dataclass
class ElasticTrial:
    """What one trial did and saw (see the module docstring)."""

    fault: str
    world: int
    lost: list[int] = field(default_factory=list)       # ranks killed or cut off
    target: str = ""                                     # "rank 5", "host 2"
    injected: float = 0.0                                # time.monotonic() of the fault
    results: dict[int, dict] = field(default_factory=dict)   # rank -> elastic<rank>.json
    #: rank -> (exit code, seconds from the fault); (None, None): was still running
    exits: dict[int, tuple[int | None, float | None]] = field(default_factory=dict)
    logs: dict[int, str] = field(default_factory=dict)   # tails of the problem ranks' logs
    setup_error: str = ""

    @property
    def survivors(self) -> list[int]:
        return [r for r in range(self.world) if r not in self.lost]

    def detection(self) -> list[float]:
        """Seconds from the fault to each survivor's first error."""
        return [self.results[r]["t_error"] - self.injected for r in self.survivors
                if self.results.get(r, {}).get("t_error") is not None]

    def recovery(self) -> list[float]:
        """Seconds from each survivor's first error to its first collective on the shrunk
        communicator."""
        return [res["t_first_ok"] - res["t_error"]
                for res in (self.results.get(r, {}) for r in self.survivors)
                if res.get("t_first_ok") is not None and res.get("t_error") is not None]

    def cutoff_exits(self) -> list[float]:
        """Seconds from a pulled cable to the exit of each of its host's ranks."""
        if self.fault != "cable":
            return []
        seconds = (self.exits.get(r, (None, None))[1] for r in self.lost)
        return [t for t in seconds if t is not None]

    def lost_details(self) -> dict[int, dict]:
        """How each lost rank ended: what it raised, when it stopped (``end_s``: wrote its
        result; ``exit_s``: its process ended; seconds after the fault), and the tail of
        its log (its stacks, when it was still running ``STACKS_AFTER`` s after the fault)."""
        details = {}
        for r in self.lost:
            res = self.results.get(r) or {}
            code, seconds = self.exits.get(r, (None, None))
            slow = seconds is None or seconds > STACKS_AFTER
            details[r] = {"outcome": res.get("outcome"), "error": res.get("error"),
                          "last_error": res.get("last_error", "")[:300],
                          "end_s": (None if res.get("t_end") is None
                                    else round(res["t_end"] - self.injected, 3)),
                          "exit_code": code,
                          "exit_s": None if seconds is None else round(seconds, 3),
                          "log": self.logs.get(r, "")[-4000:] if slow else ""}
        return details

    def problems(self) -> list[str]:
        if self.setup_error:
            return [f"{self.fault}: setup: {self.setup_error}"]
        bad = []
        want = self.world - len(self.lost)
        for r in self.survivors:
            res = self.results.get(r)
            code, seconds = self.exits.get(r, (None, None))
            if res is None:
                bad.append(f"survivor rank {r}: no result; exit code {code}: "
                           f"{self.logs.get(r, '')[-2000:]}")
                continue
            if res["outcome"] != "recovered":
                bad.append(f"survivor rank {r}: {res['outcome']} (first error {res['error']}: "
                           f"{res['message'][:400]}; recovering: {res['recover_errors']}; "
                           f"{res.get('last_error', '')[:600]}) "
                           f"{res.get('traceback', '')[-800:]}")
            elif "CollectiveTimeout" in (res["error"] + res["recover_errors"]):
                bad.append(f"survivor rank {r}: waited until its {TIMEOUT:g} s deadline (the "
                           f"loss was not noticed): first error {res['error']}: "
                           f"{res['message'][:1200]}; recovering: {res['recover_errors']}")
            elif code != 0:
                bad.append(f"survivor rank {r}: recovered but exit code {code} "
                           f"({seconds} s after the fault): {self.logs.get(r, '')[-1500:]}")
        for r in self.lost:
            res = self.results.get(r) or {}
            if res.get("outcome") in ("recovered", "wrong", "no-fault"):
                bad.append(f"lost rank {r} ({self.target}): {res['outcome']} on a communicator "
                           f"of {res.get('final_size')}: {res.get('error')}")
            if self.fault == "cable" and self.exits.get(r, (None, None))[0] is None:
                bad.append(f"cut-off rank {r}: still running {EXIT_LIMIT:g} s after the "
                           f"cable was pulled (killed); its log: {self.logs.get(r, '')[-2000:]}")
        ended = [self.results[r] for r in self.survivors
                 if self.results.get(r, {}).get("outcome") == "recovered"]
        if len(ended) == len(self.survivors):
            sizes = {res["final_size"] for res in ended}
            ranks = sorted(res["final_rank"] for res in ended)
            if sizes != {want} or ranks != list(range(want)):
                bad.append(f"survivors ended on sizes {sorted(sizes)} with ranks {ranks}, "
                           f"expected {want} ranks 0..{want - 1}")
        return [f"{self.fault} ({self.target}): {p}" for p in bad]


def start_store(hosts: NamespaceHosts, out: Path) -> tuple[subprocess.Popen, int]:
    """``python -m rendezvous serve`` on the last namespace host (the store's); (process,
    port)."""
    log_path = out / "store.txt"
    argv = [sys.executable, "-m", "rendezvous", "serve", "--host", hosts.addresses[-1],
            "--port", "0", "--log-level", "WARNING"]
    with open(log_path, "w") as log:
        proc = hosts.popen(hosts.k - 1, argv, env=_env(PYCOLL_TOKEN=TOKEN), stdout=log,
                           stderr=subprocess.STDOUT)
    try:
        wait_for_text(log_path, "rendezvous listening on", proc, 30.0)
    except BaseException:
        stop_group(proc, grace=2.0)
        raise
    line = next(ln for ln in log_path.read_text().splitlines() if "listening on" in ln)
    return proc, int(line.rsplit(":", 1)[1])


def _rank_on(hosts: NamespaceHosts, h: int, job: Path, out: Path, rank: int, per_host: int,
             world: int, port: int, **extra: str) -> subprocess.Popen:
    """``job OUT`` as ``rank`` on host ``h``, a client of the store ``start_store`` started."""
    env = _rank_env(hosts, rank, rank % per_host, per_host, world, port, PYCOLL_TOKEN=TOKEN,
                    PYCOLL_STORE_EXTERNAL="1", PYCOLL_MASTER_ADDR=hosts.addresses[-1],
                    PYCOLL_MASTER_PORT=str(port), **extra)
    return _start_logged(hosts, h, job, out, rank, env)


def elastic_trial(hosts: NamespaceHosts, fault: str, out: Path,
                  rng: random.Random | None = None, dead_ms: int = DEAD_MS) -> ElasticTrial:
    """One trial of ``fault`` on ``hosts`` (``HOSTS`` + 1 namespace hosts: the last one
    holds the store); ``out``: an empty directory for the ranks' files and logs."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
    if hosts.k != HOSTS + 1:
        raise ValueError(f"an elastic trial needs {HOSTS + 1} namespace hosts, not {hosts.k}")
    rng = rng or random.Random()
    world = HOSTS * PER_HOST
    trial = ElasticTrial(fault, world)
    procs: dict[int, subprocess.Popen] = {}
    store: subprocess.Popen | None = None
    cut: int | None = None
    try:
        store, port = start_store(hosts, out)
        for r in range(world):
            procs[r] = _rank_on(hosts, r // PER_HOST, ELASTIC_JOB, out, r, PER_HOST, world,
                                port, PYCOLL_SOCKET_DEAD_MS=str(dead_ms),
                                ELASTIC_TIMEOUT=str(TIMEOUT),
                                ELASTIC_LOOP_SECONDS=str(120 + 5 * world))
        trial.setup_error = _not_ready(out, procs)
        if trial.setup_error:
            return trial
        time.sleep(rng.uniform(*FAULT_DELAY))
        if fault == "kill":
            trial.lost = [rng.randrange(world)]
            trial.target = f"rank {trial.lost[0]}"
        else:
            h = rng.randrange(HOSTS)
            trial.lost = list(range(h * PER_HOST, (h + 1) * PER_HOST))
            trial.target = f"host {h}"
        trial.injected = time.monotonic()
        if fault == "cable":
            cut = trial.lost[0] // PER_HOST
            hosts.link(cut, up=False)
        else:
            for r in trial.lost:
                os.killpg(procs[r].pid, signal.SIGKILL)
        _watch_exits(trial, procs)
        for r in range(world):
            path = out / f"elastic{r}.json"
            if path.exists():
                trial.results[r] = json.loads(path.read_text())
        for r in range(world):
            if r in trial.survivors or fault == "cable":
                res = trial.results.get(r)
                if res is None or res["outcome"] != "recovered" or trial.exits[r][0] != 0:
                    trial.logs[r] = _tail(out / f"log{r}.txt", 6000)
    finally:
        _reap(list(procs.values()))
        if store is not None:
            stop_group(store, grace=2.0)
        if cut is not None:
            hosts.link(cut, up=True)
    return trial


def _watch_exits(trial: ElasticTrial, procs: dict[int, subprocess.Popen]) -> None:
    """Record every rank's exit (code, seconds after the fault) until all exited or
    ``EXIT_LIMIT``. A rank still running ``STACKS_AFTER`` s after the fault, and again at
    the limit, gets SIGUSR1: ``elastic_rank.py`` then writes every thread's stack into its
    log (faulthandler), so a slow exit and a hang both show where they wait; at the limit
    the hung ones are then killed by the caller."""
    dumped: set[int] = set()

    def dump(ranks: list[int]) -> None:
        for r in ranks:
            try:
                os.kill(procs[r].pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass

    deadline = trial.injected + EXIT_LIMIT
    while len(trial.exits) < len(procs) and time.monotonic() < deadline:
        for r, p in procs.items():
            if r not in trial.exits and p.poll() is not None:
                trial.exits[r] = (p.returncode, time.monotonic() - trial.injected)
        if time.monotonic() > trial.injected + STACKS_AFTER and not dumped:
            dumped.update(r for r in procs if r not in trial.exits)
            dump(sorted(dumped))
        time.sleep(0.02)
    hung = [r for r in procs if r not in trial.exits]
    for r in hung:
        trial.exits[r] = (None, None)
    if hung:
        dump(hung)
        time.sleep(1.0)            # the stacks reach the logs


def cut_off_in_agree(hosts: NamespaceHosts, out: Path, dead_ms: int = DEAD_MS,
                     wait: float = 60.0) -> dict:
    """Ranks 0 and 1 on hosts 0 and 1 (``hosts.k`` == 3: the store on host 2) loop on
    ``agree`` (``agree_rank.py``); host 1's cable is pulled: what rank 1, cut off from the
    store in the middle of an agreement, raised (``agree_rank.py``'s json) and ``exit_s``,
    how long after the fault its process ended (None: still running after ``wait`` s)."""
    procs: dict[int, subprocess.Popen] = {}
    store, port = start_store(hosts, out)
    try:
        for r in range(2):
            procs[r] = _rank_on(hosts, r, AGREE_JOB, out, r, 1, 2, port,
                                PYCOLL_SOCKET_DEAD_MS=str(dead_ms))
        setup = _not_ready(out, procs)
        if setup:
            raise AssertionError(setup)
        time.sleep(0.3)
        injected = time.monotonic()
        hosts.link(1, up=False)
        try:
            procs[1].wait(wait)
        except subprocess.TimeoutExpired:
            pass
        code = procs[1].poll()
        path = out / "error1.json"
        seen = json.loads(path.read_text()) if path.exists() else {}
        return dict(seen, exit_s=None if code is None else time.monotonic() - injected,
                    error_s=seen["t"] - injected if seen else None,
                    log=_tail(out / "log1.txt", 3000))
    finally:
        _reap(list(procs.values()))
        stop_group(store, grace=2.0)
        hosts.link(1, up=True)
