"""What one communicator's execution is doing now, read from another thread (``pycoll.status``).

Everything here reads state the call path keeps anyway and writes nothing: the execution's
numbering (``Execution.seq``), its run lock (``Execution.idle``, held while a call runs,
inline or on the worker), the record of the call running inline (``running_inline``) and the
flight recorder's ring (``FlightRecorder``: each record's start and end times). Reading them
without a lock from another thread is safe under the GIL (each read is one object's field,
and a record is a list reused in place): the worst a race gives is a snapshot a call old.
The call path pays nothing for being looked at.

The arrivals (``arrivals``: each recent collective's sequence number and its start time on
this rank's monotonic clock) are what ``pycoll.status`` compares across ranks to name
stragglers; the start times are the ones the flight recorder takes for every call.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .flight_recorder import COMPLETED, FAILED, INFO, SEQ, STATE, T_ENDED, T_SCHEDULED, T_STARTED

if TYPE_CHECKING:
    from .execution import Execution

#: the most recent collectives whose arrival times a snapshot carries
ARRIVALS = 1000
#: calls/s and bytes/s are averaged over the calls that started this long ago at most
RATE_WINDOW_S = 10.0


def snapshot(execution: Execution, arrivals: int = ARRIVALS) -> dict[str, Any]:
    """One communicator's state as a JSON-able dict (docs/observability.md, "States").

    ``state``: ``in_collective`` (a call runs: ``collective``, ``seq``, ``waiting_s``, and on
    the generic path ``pending_peers``, the peers whose messages it still waits for),
    ``outside`` (no call runs: ``outside_s`` since the last call ended, ``after``: that call),
    ``failed`` (the communicator failed: ``error``) or ``finalized``.
    """
    ex = execution
    now = time.monotonic()
    out: dict[str, Any] = {"name": ex.name, "rank": ex.rank, "size": ex.size,
                           "seq": ex.seq, "p2p_seq": ex.p2p_seq, "now": now}
    fr = ex.recorder
    records = fr.records() if fr is not None else []
    running = ex.running_inline()
    busy = ex.idle.locked()
    current = running if busy else None
    if busy and current is None:     # the generic path: the oldest call started, not ended
        for rec in reversed(records[-64:]):
            if rec[T_ENDED] or rec[STATE] in (COMPLETED, FAILED):
                break
            if rec[T_STARTED]:
                current = rec
    done = [r for r in records if r is not current and r[T_STARTED]
            and not r[INFO].p2p and r[STATE] != FAILED]
    last = done[-1] if done else None
    out["last_completed_seq"] = last[SEQ] if last is not None else 0
    out["last_completed"] = last[INFO].collective if last is not None else None
    if ex.failed is not None:
        out["state"] = "failed"
        out["error"] = str(ex.failed)
    elif ex.closed:
        out["state"] = "finalized"
    elif busy:
        out["state"] = "in_collective"
        if current is not None:
            info = current[INFO]
            began = current[T_STARTED] or current[T_SCHEDULED]
            out.update(collective=info.collective, seq=current[SEQ], p2p=info.p2p,
                       nbytes=info.nbytes, waiting_s=round(now - began, 6) if began else None)
            if current is not running:    # messages still awaited (the fast path has none)
                out["pending_peers"] = sorted({r.channel.peer for r in list(ex.peers.posted)
                                               if not r.done})
        else:                             # recording is off: the number is all there is
            out.update(collective=None, seq=ex.seq, waiting_s=None)
    else:
        out["state"] = "outside"
        if last is not None:
            # a fast call has no end time (it takes µs): its start stands for its end
            ended = last[T_ENDED] or last[T_STARTED]
            out["outside_s"] = round(now - ended, 6)
            out["after"] = {"collective": last[INFO].collective, "seq": last[SEQ]}
    recent = [r for r in records if r[T_STARTED] and now - r[T_STARTED] <= RATE_WINDOW_S]
    if recent:
        span = max(now - recent[0][T_STARTED], 1e-3)
        out["calls_per_s"] = round(len(recent) / span, 3)
        out["bytes_per_s"] = round(sum(r[INFO].nbytes for r in recent) / span, 3)
    else:
        out["calls_per_s"] = out["bytes_per_s"] = 0.0
    out["arrivals"] = [[r[SEQ], r[INFO].collective, r[T_STARTED]] for r in done[-arrivals:]]
    return out
