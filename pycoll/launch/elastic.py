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
  job's result (and nobody is left to admit a replacement);
* only replacements run, and every one of them still waits in the lobby: nobody is left to
  call ``grow``, so they are ended (*withdrawn*) rather than left waiting for their
  ``pycoll.init`` deadline;
* every process ended (or only withdrawn ones run): exit code 0 when every process that was
  not lost or withdrawn exited 0, else the first such failure's code (and when nobody
  finished at all, the last loss's); a summary line when any rank was lost or failed.

Processes are named by the rank they were started as: ``rank 2``; its replacement is
``rank 2'``, that one's replacement ``rank 2''``. A replacement's rank in the grown
communicator is whatever ``grow`` gives it (the next free number), not necessarily 2.
"""
from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence

from .outcomes import describe_exit, exit_code, notice

__all__ = ["ElasticPolicy", "replacement_environment"]

#: ``start(index, label, rank)``: spawn a replacement for process ``index`` (the supervisor)
StartReplacement = Callable[[int, str, int], subprocess.Popen]
#: how many processes wait in the job's lobby now (``lobby.py``)
LobbyCount = Callable[[], int]


def replacement_environment(env: Mapping[str, str], rank: int) -> dict[str, str]:
    """A lost process's environment for its replacement: the same rank variables (the
    library ignores them when joining), plus ``PYCOLL_JOIN=1`` and, for the program's
    information, the rank it replaces."""
    return {**env, "PYCOLL_JOIN": "1", "PYCOLL_REPLACES": str(rank)}


class ElasticPolicy:
    """The judge of one host's processes under ``--elastic``; ``Supervisor.watch`` calls
    ``judge`` on every poll."""

    def __init__(self, nprocs: int, min_ranks: int, *, first_rank: int = 0,
                 max_restarts: int = 0) -> None:
        self.nprocs = nprocs
        self.min_ranks = min_ranks
        self.max_restarts = max_restarts
        self.restarts = 0                       # replacements started so far
        # per process (the supervisor's order): the rank it was started as, and how many
        # replacements deep it is (0: started with the job)
        self.ranks = [first_rank + i for i in range(nprocs)]
        self.depths = [0] * nprocs
        self.lost: list[tuple[str, int]] = []   # (name, returncode), in the order lost
        self.failed: list[tuple[str, int]] = []  # (label, returncode): failed, not lost
        self.withdrawn: list[str] = []          # replacements ended while in the lobby
        self._judged: set[int] = set()          # indices whose end was judged

    def label(self, index: int) -> str:
        """``rank 2`` for a process started with the job, ``rank 2'`` for its replacement."""
        return f"rank {self._name(index)}"

    def _name(self, index: int) -> str:
        return f"{self.ranks[index]}" + "'" * self.depths[index]

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
            running = sum(p.returncode is None for p in procs)
            failures = [i for i in ended if procs[i].returncode != 0]
            restarts = min(len(failures), self.max_restarts - self.restarts) if running else 0
            if failures and running and running + restarts >= self.min_ranks:
                for i in failures:
                    self._lose(i, procs[i], running, start if self._restarts_left() else None)
            elif failures and running > 0:
                first = procs[failures[0]]
                left = (f", {self.max_restarts - self.restarts} restarts left"
                        if self.max_restarts else "")
                notice(f"{self._ended(failures[0], first)}; fewer than {self.min_ranks} ranks "
                       f"are left ({running} running{left}, --min-ranks {self.min_ranks}): "
                       "terminating them")
                return exit_code(first.returncode)
            else:
                self.failed.extend((self.label(i), procs[i].returncode) for i in failures)
            if running == 0 and len(self._judged) == len(procs):
                return self._done(procs)
        return self._withdraw_unadmitted(procs, lobby)

    def _restarts_left(self) -> bool:
        return self.restarts < self.max_restarts

    def _lose(self, index: int, proc: subprocess.Popen, running: int,
              start: StartReplacement | None) -> None:
        """A loss, replaced by ``start`` when given (restarts remain)."""
        self.lost.append((self._name(index), proc.returncode))
        flags = f"--elastic, --min-ranks {self.min_ranks}"
        if start is None:
            spent = (f"; no restarts left (--max-restarts {self.max_restarts})"
                     if self.max_restarts else "")
            notice(f"{self._ended(index, proc)}; {running} of {self.nprocs} ranks run on "
                   f"({flags}){spent}")
            return
        notice(f"{self._ended(index, proc)}; {running} of {self.nprocs} ranks run on and a "
               f"replacement starts ({flags}, --max-restarts {self.max_restarts})")
        self.restarts += 1
        rank = self.ranks[index]
        self.ranks.append(rank)
        self.depths.append(self.depths[index] + 1)
        replacement = start(index, self.label(len(self.ranks) - 1), rank)
        notice(f"started a replacement for rank {rank} (pid {replacement.pid}, restart "
               f"{self.restarts} of {self.max_restarts}); it joins when the survivors call "
               "grow()")

    def _withdraw_unadmitted(self, procs: Sequence[subprocess.Popen],
                             lobby: LobbyCount | None) -> int | None:
        """When only replacements run and all of them wait in the lobby, nobody can admit
        them: the job is over (the caller ends them)."""
        live = [i for i, p in enumerate(procs) if p.returncode is None]
        if (not live or lobby is None or any(self.depths[i] == 0 for i in live)
                or lobby() < len(live)):
            return None
        for i in live:
            self.withdrawn.append(self.label(i))
            notice(f"{self.label(i)} (pid {procs[i].pid}) still waits to join, and no rank "
                   "runs that could admit it (grow()): ending it")
        return self._done(procs)

    def _ended(self, index: int, proc: subprocess.Popen) -> str:
        return f"{self.label(index)} (pid {proc.pid}) {describe_exit(proc.returncode)}"

    def _done(self, procs: Sequence[subprocess.Popen]) -> int:
        """Every process ended (or only withdrawn ones run): the summary and exit code."""
        finished = sum(p.returncode == 0 for p in procs)
        if self.lost or self.failed or self.withdrawn:
            lost = (f"ranks [{', '.join(name for name, _ in self.lost)}] lost" if self.lost
                    else "no rank lost")
            started = {0: "no replacement", 1: "1 replacement"}.get(
                self.restarts, f"{self.restarts} replacements")
            restarts = (f", {started} started (--max-restarts {self.max_restarts})"
                        if self.max_restarts else "")
            failed = "".join(f", {label} {describe_exit(code)}" for label, code in self.failed)
            withdrawn = "".join(f", {label} never admitted" for label in self.withdrawn)
            notice(f"elastic job done: {lost}{restarts}, {finished} finished with "
                   f"0{failed}{withdrawn}")
        if self.failed:
            return exit_code(self.failed[0][1])
        if finished == 0 and self.lost:
            return exit_code(self.lost[-1][1])      # nobody saw the job to its end
        return 0
