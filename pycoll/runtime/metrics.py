"""Counts, bytes, errors and latencies of one communicator's collectives, tallied when the
metrics endpoint is scraped (``comm/metrics.py``), never on the call path.

At each scrape, the records the flight recorder took since the last one (each call's number,
collective, size, state, start and end times, which it takes anyway) are folded into running
totals. The call path pays nothing for the metrics. The price: a call that left the ring
(``PYCOLL_FLIGHT_RECORDER`` records, 500 by default) before a scrape saw it is counted in
``pycoll_collectives_unrecorded_total`` rather than by collective and size, and is in no
latency histogram (the histograms sample what the ring still held); the exact total is the
communicator's numbering (``pycoll_collectives_numbered_total``). With recording off
(``PYCOLL_FLIGHT_RECORDER=0``) only those two are there.

A fast-path call takes one clock read, at its start, and none at its end (a second read would
be added work on a call of a few µs). Its latency is bounded instead by what the recorder has
anyway: calls of one communicator run one at a time, so a call ended before the next one
started. Such a call goes into the histogram with ``timing="next_call"`` (start to the next
call's start: an upper bound, tight in a loop of calls, the whole step in a loop that computes
between them); a call with an end time has ``timing="measured"``. The last fast call waits
for its successor (a later scrape); one whose successor left the ring untimed is not timed.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from .flight_recorder import COMPLETED, FAILED, INFO, SEQ, STARTED, STATE, T_ENDED, T_STARTED

if TYPE_CHECKING:
    from .execution import Execution

#: (upper bound in bytes, label) of each size class; larger calls are "gt16MiB"
SIZE_CLASSES = ((1 << 10, "le1KiB"), (64 << 10, "le64KiB"), (1 << 20, "le1MiB"),
                (16 << 20, "le16MiB"))
#: latency histogram bucket bounds, seconds
BUCKETS = (1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0)


def size_class(nbytes: int) -> str:
    for bound, label in SIZE_CLASSES:
        if nbytes <= bound:
            return label
    return "gt16MiB"


class Tally:
    """Running totals of one communicator, per (collective, size class), and its latency
    histograms, per (collective, size class, timing)."""

    def __init__(self) -> None:
        self.folded = 0          # the highest collective number folded in
        self.unrecorded = 0
        #: (collective, size class) -> [calls, bytes, errors]
        self.rows: dict[tuple[str, str], list[int]] = {}
        #: (collective, size class, timing) -> [sum_s, count, *bucket counts]
        self.hist: dict[tuple[str, str, str], list[float]] = {}
        #: the last fast call folded in, still waiting for its successor's start: (its
        #: number, (collective, size class), its start)
        self.pending: tuple[int, tuple[str, str], float] | None = None
        self._lock = threading.Lock()   # two scrapes at once fold each record once

    def update(self, ex: Execution) -> None:
        with self._lock:
            self._update(ex)

    def _time(self, key: tuple[str, str], timing: str, took: float) -> None:
        row = self.hist.setdefault((*key, timing), [0.0] * (2 + len(BUCKETS)))
        row[0] += took
        row[1] += 1
        for i, bound in enumerate(BUCKETS):
            if took <= bound:
                row[2 + i] += 1

    def _next_call(self, seq: int, key: tuple[str, str], started: float,
                   starts: dict[int, float], numbered: int) -> None:
        """Time fast call ``seq`` by its successor's start, or keep it pending until a
        scrape sees that start (``starts``: the ring's numbers and start times, 0 for a
        call not started yet)."""
        nxt = starts.get(seq + 1)
        if nxt:
            self.pending = None
            self._time(key, "next_call", max(0.0, nxt - started))
        elif nxt is not None or seq >= numbered:
            self.pending = (seq, key, started)   # no successor yet, or not started yet
        else:
            self.pending = None                  # its successor left the ring: not timed

    def _update(self, ex: Execution) -> None:
        fr = ex.recorder
        busy = ex.idle.locked()
        # an inline call is recorded completed when it begins: while it runs its record is
        # judged running, else one that then fails would be counted a success
        running = ex.running_inline()
        numbered = ex.seq
        # a record is a list reused in place: copy the fields before judging them
        every = [(r[SEQ], r[INFO], STARTED if r is running else r[STATE], r[T_STARTED],
                  r[T_ENDED])
                 for r in (fr.records() if fr is not None else [])]
        starts = {r[0]: r[3] for r in every}
        if self.pending is not None:
            self._next_call(*self.pending, starts, numbered)
        recs = sorted((r for r in every if not r[1].p2p and r[0] > self.folded),
                      key=lambda r: r[0])
        for seq, info, state, started, ended in recs:
            finished = state in (COMPLETED, FAILED) or seq < numbered or not busy
            if not finished:
                break                   # the running call: next scrape
            if seq > self.folded + 1:
                self.unrecorded += seq - self.folded - 1
            self.folded = seq
            key = (info.collective, size_class(info.nbytes))
            row = self.rows.setdefault(key, [0, 0, 0])
            row[0] += 1
            row[1] += info.nbytes
            if state == FAILED:
                row[2] += 1
            if started and ended and ended >= started:
                self._time(key, "measured", ended - started)
            elif started and state == COMPLETED:    # a fast call: no end time taken
                self._next_call(seq, key, started, starts, numbered)
        if not busy and numbered > self.folded:   # calls done with no record left (or none)
            self.unrecorded += numbered - self.folded
            self.folded = numbered


def _labels(**kv: Any) -> str:
    def esc(v: Any) -> str:
        return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in kv.items()) + "}"


def openmetrics(rank: int, tallies: list[tuple[Execution, Tally]],
                stragglers: list[dict[str, Any]] | None) -> str:
    """The OpenMetrics text exposition of ``tallies`` (brought up to date here) and, where
    given, the job's stragglers."""
    for ex, tally in tallies:
        tally.update(ex)
    out: list[str] = []

    def family(name: str, kind: str, text: str, samples: list[str]) -> None:
        out.append(f"# TYPE {name} {kind}")
        out.append(f"# HELP {name} {text}")
        out.extend(samples)

    def each(suffix: str, pick: Any) -> list[str]:
        return [f"{suffix}{_labels(rank=rank, communicator=ex.name, collective=c, size_class=k)}"
                f" {pick(row)}" for ex, t in tallies for (c, k), row in sorted(t.rows.items())]

    family("pycoll_collective_calls", "counter", "collectives completed or failed",
           each("pycoll_collective_calls_total", lambda r: r[0]))
    family("pycoll_collective_bytes", "counter", "bytes of this rank's buffer, summed",
           each("pycoll_collective_bytes_total", lambda r: r[1]))
    family("pycoll_collective_errors", "counter", "collectives that failed",
           each("pycoll_collective_errors_total", lambda r: r[2]))
    hist: list[str] = []
    for ex, t in tallies:
        for (c, k, timing), row in sorted(t.hist.items()):
            lab = dict(rank=rank, communicator=ex.name, collective=c, size_class=k,
                       timing=timing)
            for i, bound in enumerate(BUCKETS):
                hist.append(f"pycoll_collective_latency_seconds_bucket"
                            f"{_labels(**lab, le=repr(bound))} {int(row[2 + i])}")
            hist.append(f"pycoll_collective_latency_seconds_bucket{_labels(**lab, le='+Inf')}"
                        f" {int(row[1])}")
            hist.append(f"pycoll_collective_latency_seconds_count{_labels(**lab)} {int(row[1])}")
            hist.append(f"pycoll_collective_latency_seconds_sum{_labels(**lab)} {row[0]!r}")
    family("pycoll_collective_latency_seconds", "histogram",
           "start to end (timing=measured), or for a fast-path call, which takes no end "
           "time, start to the next call's start (timing=next_call: an upper bound)", hist)
    family("pycoll_collectives_numbered", "counter", "collectives this communicator numbered",
           [f"pycoll_collectives_numbered_total{_labels(rank=rank, communicator=ex.name)} "
            f"{ex.seq}" for ex, _ in tallies])
    family("pycoll_collectives_unrecorded", "counter",
           "collectives that left the flight recorder before a scrape saw them",
           [f"pycoll_collectives_unrecorded_total{_labels(rank=rank, communicator=ex.name)} "
            f"{t.unrecorded}" for ex, t in tallies])
    family("pycoll_communicator_failed", "gauge", "1 once the communicator failed",
           [f"pycoll_communicator_failed{_labels(rank=rank, communicator=ex.name)} "
            f"{int(ex.failed is not None)}" for ex, _ in tallies])
    if stragglers is not None:
        family("pycoll_straggler_late_fraction", "gauge",
               "of the recent calls, the fraction this rank arrived last in",
               [f"pycoll_straggler_late_fraction"
                f"{_labels(rank=s['rank'], collective=s['collective'])} {s['late_fraction']}"
                for s in stragglers])
        family("pycoll_straggler_median_late_seconds", "gauge",
               "median time the others waited for this rank alone",
               [f"pycoll_straggler_median_late_seconds"
                f"{_labels(rank=s['rank'], collective=s['collective'])} "
                f"{s['median_late_ms'] / 1e3}" for s in stragglers])
    out.append("# EOF")
    return "\n".join(out) + "\n"
