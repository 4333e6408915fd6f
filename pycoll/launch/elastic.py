"""What ``pycoll.run --elastic`` outlives: ranks lost while enough of the job runs on.

Without ``--elastic`` the first rank that fails ends the job (``supervisor.py``). Under it,
a rank that exits non-zero or is killed by a signal is *lost* and the job goes on, as long
as at least ``min_ranks`` ranks are still running: the survivors are expected to catch the
error (``PeerLost``, ``Aborted``, ``Revoked``) and shrink their communicator
(docs/elastic.md). The launcher's store outlives every rank, so they still can.

The policy judges each rank's end once, in the order the supervisor's polls see them (ranks
that end between two polls are judged together):

* a failure after which at least ``min_ranks`` ranks still run: lost; one line, carry on;
* a failure after which some ranks run, but fewer than ``min_ranks``: the job is over; the
  supervisor tears the rest down and exits with the failing rank's code;
* a failure after which no rank runs: nobody outlived it, so it is not a loss but the
  job's result;
* every rank ended: exit code 0 when every rank that was not lost exited 0, else the first
  such failure's code; a summary line when any rank was lost or failed.
"""
from __future__ import annotations

import subprocess
from collections.abc import Sequence

from .outcomes import describe_exit, exit_code, notice

__all__ = ["ElasticPolicy"]


class ElasticPolicy:
    """The judge of one host's ranks under ``--elastic``; ``Supervisor.watch`` calls
    ``judge`` on every poll."""

    def __init__(self, nprocs: int, min_ranks: int, *, first_rank: int = 0) -> None:
        self.nprocs = nprocs
        self.min_ranks = min_ranks
        self.first_rank = first_rank            # global rank of this host's first rank
        self.lost: list[int] = []               # global ranks, in the order they were lost
        self.failed: list[tuple[int, int]] = []  # (rank, returncode): failed, not lost
        self._judged: set[int] = set()          # local indices whose end was judged

    def judge(self, procs: Sequence[subprocess.Popen]) -> int | None:
        """Judge the ranks that ended since the last call. Returns the job's exit code once
        it is over (the caller tears down any rank still running), else None."""
        ended = [i for i, p in enumerate(procs) if i not in self._judged and p.poll() is not None]
        if not ended:
            return None
        self._judged.update(ended)
        running = sum(p.returncode is None for p in procs)
        failures = [i for i in ended if procs[i].returncode != 0]
        if failures and running >= self.min_ranks:
            for i in failures:
                self.lost.append(self.first_rank + i)
                notice(f"{self._rank_ended(i, procs[i])}; {running} of {self.nprocs} ranks run "
                       f"on (--elastic, --min-ranks {self.min_ranks})")
        elif failures and running > 0:
            first = procs[failures[0]]
            notice(f"{self._rank_ended(failures[0], first)}; fewer than {self.min_ranks} ranks "
                   f"are left ({running} running, --min-ranks {self.min_ranks}): terminating "
                   "them")
            return exit_code(first.returncode)
        else:
            self.failed.extend((self.first_rank + i, procs[i].returncode) for i in failures)
        if running == 0 and len(self._judged) == self.nprocs:
            return self._done(procs)
        return None

    def _rank_ended(self, local: int, proc: subprocess.Popen) -> str:
        return f"rank {self.first_rank + local} (pid {proc.pid}) {describe_exit(proc.returncode)}"

    def _done(self, procs: Sequence[subprocess.Popen]) -> int:
        """Every rank ended: the summary line and the job's exit code."""
        if self.lost or self.failed:
            finished = sum(p.returncode == 0 for p in procs)
            lost = f"ranks {self.lost} lost" if self.lost else "no rank lost"
            failed = "".join(f", rank {rank} {describe_exit(code)}"
                             for rank, code in self.failed)
            notice(f"elastic job done: {lost}, {finished} finished with 0{failed}")
        return exit_code(self.failed[0][1]) if self.failed else 0
