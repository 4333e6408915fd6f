"""Counts, bytes, errors and latencies of one communicator's collectives, tallied when the
metrics endpoint is scraped (``comm/metrics.py``), never on the call path.

At each scrape, the records the flight recorder took since the last one (each call's number,
collective, size, state, start and end times, which it takes anyway) are folded into running
totals. The call path pays nothing for the metrics. The price: a call that left the ring
(``PYCOLL_FLIGHT_RECORDER`` records, 500 by default) before a scrape saw it is counted in
``pycoll_collectives_unrecorded_total`` rather than by collective and size; the exact total is
the communicator's numbering (``pycoll_collectives_numbered_total``). With recording off
(``PYCOLL_FLIGHT_RECORDER=0``) only those two are there. A fast-path call takes no end time,
so only the calls that have one are in the latency histogram (its ``_count``).
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
    """Running totals of one communicator, per (collective, size class)."""

    def __init__(self) -> None:
        self.folded = 0          # the highest collective number folded in
        self.unrecorded = 0
        #: (collective, size class) -> [calls, bytes, errors, sum_s, timed, *bucket counts]
        self.rows: dict[tuple[str, str], list[float]] = {}
        self._lock = threading.Lock()   # two scrapes at once fold each record once

    def update(self, ex: Execution) -> None:
        with self._lock:
            self._update(ex)

    def _update(self, ex: Execution) -> None:
        fr = ex.recorder
        busy = ex.idle.locked()
        # an inline call is recorded completed when it begins: while it runs its record is
        # judged running, else one that then fails would be counted a success
        running = ex.running_inline()
        # a record is a list reused in place: copy the fields before judging them
        recs = [(r[SEQ], r[INFO], STARTED if r is running else r[STATE], r[T_STARTED],
                 r[T_ENDED])
                for r in (fr.records() if fr is not None else [])]
        recs = [r for r in recs if not r[1].p2p and r[0] > self.folded]
        recs.sort(key=lambda r: r[0])
        for seq, info, state, started, ended in recs:
            finished = state in (COMPLETED, FAILED) or seq < ex.seq or not busy
            if not finished:
                break                   # the running call: next scrape
            if seq > self.folded + 1:
                self.unrecorded += seq - self.folded - 1
            self.folded = seq
            row = self.rows.setdefault((info.collective, size_class(info.nbytes)),
                                       [0.0] * (5 + len(BUCKETS)))
            row[0] += 1
            row[1] += info.nbytes
            if state == FAILED:
                row[2] += 1
            if started and ended and ended >= started:
                took = ended - started
                row[3] += took
                row[4] += 1
                for i, bound in enumerate(BUCKETS):
                    if took <= bound:
                        row[5 + i] += 1
        if not busy and ex.seq > self.folded:   # calls done with no record left (or none)
            self.unrecorded += ex.seq - self.folded
            self.folded = ex.seq


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
           each("pycoll_collective_calls_total", lambda r: int(r[0])))
    family("pycoll_collective_bytes", "counter", "bytes of this rank's buffer, summed",
           each("pycoll_collective_bytes_total", lambda r: int(r[1])))
    family("pycoll_collective_errors", "counter", "collectives that failed",
           each("pycoll_collective_errors_total", lambda r: int(r[2])))
    hist: list[str] = []
    for ex, t in tallies:
        for (c, k), row in sorted(t.rows.items()):
            lab = dict(rank=rank, communicator=ex.name, collective=c, size_class=k)
            for i, bound in enumerate(BUCKETS):
                hist.append(f"pycoll_collective_latency_seconds_bucket"
                            f"{_labels(**lab, le=repr(bound))} {int(row[5 + i])}")
            hist.append(f"pycoll_collective_latency_seconds_bucket{_labels(**lab, le='+Inf')}"
                        f" {int(row[4])}")
            hist.append(f"pycoll_collective_latency_seconds_count{_labels(**lab)} {int(row[4])}")
            hist.append(f"pycoll_collective_latency_seconds_sum{_labels(**lab)} {row[3]!r}")
    family("pycoll_collective_latency_seconds", "histogram",
           "start to end of the calls that record an end (not the fast path)", hist)
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
