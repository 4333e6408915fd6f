"""What ``pycoll.run --elastic`` outlives: ranks lost while enough of the job runs on, and
the replacements ``--max-restarts`` starts for them.

Without ``--elastic`` the first rank that fails ends the job (``supervisor.py``). Under it,
a rank that exits non-zero or is killed by a signal is *lost* and the job goes on, as long
as at least ``min_ranks`` ranks are still running: the survivors are expected to catch the
error (``PeerLost``, ``Aborted``, ``Revoked``) and shrink their communicator
(docs/elastic.md). The launcher's store outlives every rank, so they still can.

The policy judges each process's end once, in the order the supervisor's polls see them
(processes that end between two polls are judged together):

* a failure after which some ranks still run, and fewer than ``max_restarts`` replacements
  were started so far: a replacement starts at once (the lost process's command and
  environment, with ``PYCOLL_JOIN=1``: it waits in the lobby until the survivors call
  ``grow``). It counts as running from then on, here for ``min_ranks`` too, and its own
  failure is a loss like any other;
* a failure after which at least ``min_ranks`` ranks (replacements included) still run:
  lost; one line, carry on;
* a failure after which some ranks run, but fewer than ``min_ranks``: the job is over; the
  supervisor tears the rest down and exits with the failing rank's code;
* a failure after which no rank runs: nobody outlived it, so it is not a loss but the
  job's result (and nobody is left to admit a replacement); a lost *host* is the exception
  when at least ``min_ranks`` ranks finished with 0 before node 0 saw the loss (a loss
  shows only after the store's keepalive, and the ranks' own sockets may see it first):
  they outlived it, so its ranks are lost and the finished ranks' result stands;
* only replacements run, and every one of them still waits in the lobby: nobody is left to
  call ``grow``, so they are ended (*withdrawn*) rather than left waiting for their
  ``pycoll.init`` deadline;
* every process ended (or only withdrawn ones run): exit code 0 when every process that was
  not lost or withdrawn exited 0, else the first such failure's code (and when nobody
  finished at all, the last loss's); a summary line when any rank was lost or failed.

Processes are named by the rank they were started as: ``rank 2``; its replacement is
``rank 2'``, that one's replacement ``rank 2''``. A replacement's rank in the grown
communicator is whatever ``grow`` gives it (the next free number), not necessarily 2.

On several hosts (``--nnodes``) each launcher judges its own processes, but against the
whole job (``Job``; ``nodes.ElasticJob`` reads the other hosts' launchers from the store):
"ranks still running" counts every host's, the restarts are one budget for the job, and a
host whose launcher is gone is judged by node 0 (``lose_host``), whose launcher starts the
replacements for its ranks. A launcher's own code then says only how its own processes
ended; node 0 combines every host's (``combine``) into the job's.
"""
from __future__ import annotations

import functools
import subprocess
from collections.abc import Callable, Mapping, Sequence

from .outcomes import describe_exit, exit_code, notice

__all__ = ["ElasticPolicy", "replacement_environment"]

#: ``start(index, label, rank)``: spawn a replacement for process ``index`` (the supervisor)
StartReplacement = Callable[[int, str, int], subprocess.Popen]
#: how many processes wait in the job's lobby now (``joiners.py``)
LobbyCount = Callable[[], int]


class Job:
    """The rest of the job, as one host's policy sees it. This one is a job on one host:
    nobody runs elsewhere, and the restarts are counted here. ``nodes.ElasticJob`` is the
    same for a job on several hosts."""

    def __init__(self, max_restarts: int) -> None:
        self.max_restarts = max_restarts
        self.restarts = 0

    def elsewhere(self) -> tuple[int, int]:
        """(processes running on the other hosts, how many of them were started with the
        job rather than as replacements)."""
        return 0, 0

    def finished_elsewhere(self) -> int:
        """Processes that finished with 0 on the other hosts whose launchers are done."""
        return 0

    def restarts_left(self) -> int:
        return self.max_restarts - self.restarts

    def take_restart(self) -> int | None:
        """Claim one restart of the budget: its number (1..K), or None when none is left."""
        if self.restarts >= self.max_restarts:
            return None
        self.restarts += 1
        return self.restarts


def replacement_environment(env: Mapping[str, str], rank: int) -> dict[str, str]:
    """A lost process's environment for its replacement: the same rank variables (the
    library ignores them when joining), plus ``PYCOLL_JOIN=1`` and, for the program's
    information, the rank it replaces."""
    return {**env, "PYCOLL_JOIN": "1", "PYCOLL_REPLACES": str(rank)}


class ElasticPolicy:
    """The judge of one host's processes under ``--elastic``; ``Supervisor.watch`` calls
    ``judge`` on every poll."""

    def __init__(self, nprocs: int, min_ranks: int, *, first_rank: int = 0,
                 max_restarts: int = 0, job: Job | None = None, world: int | None = None
                 ) -> None:
        self.nprocs = nprocs
        self.world = world or nprocs            # ranks the job started with, every host's
        self.min_ranks = min_ranks
        self.max_restarts = max_restarts
        self.job = job if job is not None else Job(max_restarts)
        self.several_hosts = job is not None
        self.restarts = 0                       # replacements started here
        # per process (the supervisor's order): the rank it was started as, and how many
        # replacements deep it is (0: started with the job)
        self.ranks = [first_rank + i for i in range(nprocs)]
        self.depths = [0] * nprocs
        self.lost: list[tuple[str, int]] = []   # (name, returncode), in the order lost
        self.failed: list[tuple[str, int]] = []  # (label, returncode): failed, not lost
        self.withdrawn: list[str] = []          # replacements ended while in the lobby
        self.lost_hosts: list[str] = []         # other hosts' processes lost with their host
        self._judged: set[int] = set()          # indices whose end was judged
        #: the process (or host) whose loss left fewer than ``min_ranks``: the job is over
        self.over: str | None = None
        #: what ``_done`` found: this host's code, processes finished with 0, last loss's code
        self.result: dict[str, int] = {}

    def label(self, index: int) -> str:
        """``rank 2`` for a process started with the job, ``rank 2'`` for its replacement."""
        return f"rank {self._name(index)}"

    def _name(self, index: int) -> str:
        return f"{self.ranks[index]}" + "'" * self.depths[index]

    def names(self, procs: Sequence[subprocess.Popen]) -> list[str]:
        """The names of the processes still running (``2``, ``2'``): what a host publishes."""
        return [self._name(i) for i, p in enumerate(procs) if p.returncode is None]

    def judge(self, procs: Sequence[subprocess.Popen], start: StartReplacement | None = None,
              lobby: LobbyCount | None = None) -> int | None:
        """Judge the processes that ended since the last call, starting replacements with
        ``start``. Returns the job's exit code once it is over (the caller tears down any
        process still running), else None. ``lobby`` counts the processes waiting to join
        (withdrawing replacements nobody can admit); without it they are left to their
        deadline."""
        ended = [i for i, p in enumerate(procs) if i not in self._judged and p.poll() is not None]
        if ended:
            self._judged.update(ended)
            here = sum(p.returncode is None for p in procs)
            failures = [i for i in ended if procs[i].returncode != 0]
            running = here + (self.job.elsewhere()[0] if failures else 0)
            restarts = min(len(failures), self.job.restarts_left()) if running else 0
            if failures and running and running + restarts >= self.min_ranks:
                for i in failures:
                    self._lose(i, procs[i], running, start)
            elif failures and running > 0:
                first = procs[failures[0]]
                self.over = self.label(failures[0])
                notice(f"{self._ended(failures[0], first)}; {self._too_few(running)}")
                return exit_code(first.returncode)
            else:
                self.failed.extend((self.label(i), procs[i].returncode) for i in failures)
            if here == 0 and len(self._judged) == len(procs):
                return self._done(procs)
        return self._withdraw_unadmitted(procs, lobby)

    def _too_few(self, running: int) -> str:
        left = (f", {self.job.restarts_left()} restarts left" if self.max_restarts else "")
        return (f"fewer than {self.min_ranks} ranks are left ({running} running{left}, "
                f"--min-ranks {self.min_ranks}): terminating them")

    def _flags(self) -> str:
        return f"--elastic, --min-ranks {self.min_ranks}"

    def _lose(self, index: int, proc: subprocess.Popen, running: int,
              start: StartReplacement | None) -> None:
        """A loss, replaced by ``start`` when given and a restart is left."""
        self.lost.append((self._name(index), proc.returncode))
        number = self.job.take_restart() if start is not None else None
        if number is None:
            spent = (f"; no restarts left (--max-restarts {self.max_restarts})"
                     if self.max_restarts else "")
            notice(f"{self._ended(index, proc)}; {running} of {self.world} ranks run on "
                   f"({self._flags()}){spent}")
            return
        assert start is not None
        notice(f"{self._ended(index, proc)}; {running} of {self.world} ranks run on and a "
               f"replacement starts ({self._flags()}, --max-restarts {self.max_restarts})")
        rank = self.ranks[index]

        def spawn(label: str) -> subprocess.Popen:
            return start(index, label, rank)
        self._replace(rank, self.depths[index] + 1, number, spawn)

    def _replace(self, rank: int, depth: int, number: int,
                 spawn: Callable[[str], subprocess.Popen]) -> None:
        """Start replacement ``number`` of the job's budget, for ``rank``, ``depth`` deep."""
        self.restarts += 1
        self.ranks.append(rank)
        self.depths.append(depth)
        replacement = spawn(self.label(len(self.ranks) - 1))
        notice(f"started a replacement for rank {rank} (pid {replacement.pid}, restart "
               f"{number} of {self.max_restarts}); it joins when the survivors call grow()")

    def lose_host(self, host: str, names: Sequence[str], procs: Sequence[subprocess.Popen],
                  start: Callable[[str, int], subprocess.Popen]) -> int | None:
        """Another host's launcher is gone, and with it its processes ``names`` (node 0
        judges it: ``nodes.ElasticJob.lost_hosts``). As for a loss here: while at least
        ``min_ranks`` ranks run on, each is replaced on this host while restarts are left
        (``start(label, rank)``); else the job's exit code (the caller tears down)."""
        self.lost_hosts.extend(names)
        running = sum(p.returncode is None for p in procs) + self.job.elsewhere()[0]
        listed = ", ".join(names) or "none"
        if running == 0:
            # Every other rank ended before the loss was seen here: a pulled cable shows
            # only after the store's keepalive, and the ranks' own sockets may see it first,
            # shrink and finish. Those that finished with 0 outlived the host; at least
            # ``min_ranks`` of them make the job's result theirs (``combine``)
            finished = sum(p.returncode == 0 for p in procs) + self.job.finished_elsewhere()
            if finished >= self.min_ranks:
                notice(f"host {host} was lost with ranks [{listed}] after the other ranks had "
                       f"ended, {finished} of them with 0 ({self._flags()}): they outlived "
                       "it, and their result is the job's")
                return None
        if running == 0 or running + min(len(names), self.job.restarts_left()) < self.min_ranks:
            self.over = f"ranks [{listed}] of host {host}"
            notice(f"host {host} was lost with ranks [{listed}]; {self._too_few(running)}")
            return 1
        restarts = (" and replacements start on this host while restarts are left "
                    f"(--max-restarts {self.max_restarts})" if self.max_restarts else "")
        notice(f"host {host} was lost with ranks [{listed}] (its launcher's lease on the "
               "store ended: the connection closed, or keepalive found it cut off); "
               f"{running} of {self.world} ranks run on ({self._flags()}){restarts}")
        for name in names:
            number = self.job.take_restart()
            if number is None:
                break
            rank = int(name.rstrip("'"))
            depth = len(name) - len(name.rstrip("'")) + 1
            self._replace(rank, depth, number, functools.partial(_spawn_for, start, rank))
        return None

    def _withdraw_unadmitted(self, procs: Sequence[subprocess.Popen],
                             lobby: LobbyCount | None) -> int | None:
        """When only replacements run and all of them wait in the lobby, nobody can admit
        them: the job is over (the caller ends them)."""
        live = [i for i, p in enumerate(procs) if p.returncode is None]
        if not live or lobby is None or any(self.depths[i] == 0 for i in live):
            return None
        running, originals = self.job.elsewhere()
        if originals or lobby() < len(live) + running:
            return None
        for i in live:
            self.withdrawn.append(self.label(i))
            notice(f"{self.label(i)} (pid {procs[i].pid}) still waits to join, and no rank "
                   "runs that could admit it (grow()): ending it")
        return self._done(procs)

    def _ended(self, index: int, proc: subprocess.Popen) -> str:
        return f"{self.label(index)} (pid {proc.pid}) {describe_exit(proc.returncode)}"

    def _done(self, procs: Sequence[subprocess.Popen]) -> int:
        """Every process ended (or only withdrawn ones run): the summary and exit code. On
        several hosts the code is this host's (a failure here, else 0): whether the job as a
        whole saw its end is node 0's to say (``combine``)."""
        finished = sum(p.returncode == 0 for p in procs)
        if self.lost or self.failed or self.withdrawn or self.lost_hosts:
            lost = (f"ranks [{', '.join(name for name, _ in self.lost)}] lost" if self.lost
                    else "no rank lost")
            hosts = (f", ranks [{', '.join(self.lost_hosts)}] lost with their host"
                     if self.lost_hosts else "")
            started = {0: "no replacement", 1: "1 replacement"}.get(
                self.restarts, f"{self.restarts} replacements")
            restarts = (f", {started} started (--max-restarts {self.max_restarts})"
                        if self.max_restarts else "")
            failed = "".join(f", {label} {describe_exit(code)}" for label, code in self.failed)
            withdrawn = "".join(f", {label} never admitted" for label in self.withdrawn)
            where = " on this host" if self.several_hosts else ""
            notice(f"elastic job done{where}: {lost}{hosts}{restarts}, {finished} finished "
                   f"with 0{failed}{withdrawn}")
        last_loss = exit_code(self.lost[-1][1]) if self.lost else 0
        code = exit_code(self.failed[0][1]) if self.failed else 0
        self.result = {"code": code, "finished": finished, "last_loss": last_loss}
        if not self.several_hosts and not self.failed and finished == 0 and self.lost:
            return last_loss                        # nobody saw the job to its end
        return code


def _spawn_for(start: Callable[[str, int], subprocess.Popen], rank: int,
               label: str) -> subprocess.Popen:
    return start(label, rank)


def combine(results: Sequence[Mapping[str, int]]) -> int:
    """The job's exit code from every host's ``ElasticPolicy.result`` (node 0's first): the
    first host's failure; else 0 when some process finished with 0; else, nobody having
    seen the job to its end, the last loss's code."""
    for r in results:
        if r.get("code"):
            return int(r["code"])
    if any(r.get("finished") for r in results):
        return 0
    losses = [int(r["last_loss"]) for r in results if r.get("last_loss")]
    return losses[-1] if losses else 0
