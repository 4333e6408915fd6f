"""Flight recorder: the last N collectives of each communicator, dumped as JSON on failure.

torch's NCCL flight recorder showed what a post-mortem needs (pytorch #117883): every rank
keeps a ring of recent collectives with their state and timings, and writes it out when
something goes wrong, self-describing enough to be merged with the other ranks' dumps later
(``python -m pycoll.trace``).

* ``PYCOLL_FLIGHT_RECORDER=N`` keeps the last N collectives per communicator (default 500;
  0 disables recording and dumps).
* ``PYCOLL_TRACE_DIR`` is where dumps go (default ``$TMPDIR/pycoll-traces-<uid>``). A dump is
  written when a collective times out, loses a peer, aborts or fails otherwise, and the
  error message names the file.

Recording is on the hot path of every collective, so it is a fixed-size ring of small lists,
one per call, whose fields are named below (``SEQ`` ... ``NOTES``). A record holds the call's
``CallInfo`` (``runtime.calls``: collective, bytes, dtype, count, op, root, algorithm; never a
user's tensor) and its times. The state is implied by the timestamps (started once
``T_STARTED`` is set, completed once ``T_ENDED`` is), so the hot path writes only times; only
a failure sets ``STATE`` explicitly. A call of the fast path (``pycoll/fastpath``, a few µs)
is written as completed when it starts, without a second clock read (its dump entry has no
end time and no duration); the one still running when a dump is taken shows as started (its
execution says which). ``PYCOLL_DEBUG=DETAIL`` adds each call's fingerprint to its notes.
"""
from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..envvars import env_int
from .calls import CallInfo
from .compiled import load

# a record's states (``STATE_NAMES``), defined with the class that opens records
if TYPE_CHECKING:
    from .state import COMPLETED, FAILED, SCHEDULED, STARTED, RecorderState
else:
    _state = load("pycoll.runtime.state")[0]
    RecorderState = _state.RecorderState
    SCHEDULED, STARTED, COMPLETED, FAILED = (_state.SCHEDULED, _state.STARTED,
                                             _state.COMPLETED, _state.FAILED)

FORMAT = "pycoll-flight-recorder"
FORMAT_VERSION = 1
DEFAULT_CAPACITY = 500

STATE_NAMES = ("scheduled", "started", "completed", "failed")

# Fields of a record (a list reused in place)
SEQ, INFO, STATE, T_SCHEDULED, T_STARTED, T_ENDED, NOTES = range(7)


def capacity_from_env() -> int:
    """``PYCOLL_FLIGHT_RECORDER``: collectives kept per communicator (0 disables recording).

    Raises :class:`pycoll.InvalidArgument` naming the variable for a value that is not an
    integer >= 0.
    """
    return env_int("PYCOLL_FLIGHT_RECORDER", DEFAULT_CAPACITY, minimum=0)


def trace_dir() -> str:
    """Where dumps go: ``PYCOLL_TRACE_DIR`` or a per-user directory under the temp dir."""
    path = os.environ.get("PYCOLL_TRACE_DIR")
    if not path:
        path = os.path.join(tempfile.gettempdir(), f"pycoll-traces-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


class FlightRecorder(RecorderState):
    """A ring of the last ``capacity`` calls of one communicator; ``open`` (a record's start)
    and the ring are ``state.RecorderState``'s, compiled with the fast path's call."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        super().__init__(capacity)

    # -- hot path: ``open`` (RecorderState) ----------------------------------------------
    @staticmethod
    def state(rec: list, running: list | None = None) -> int:
        """The state of ``rec``; ``running`` is the record of a call running inline now
        (its record says completed from the start)."""
        if rec is running and rec[STATE] == COMPLETED:
            return STARTED
        if rec[STATE] in (FAILED, COMPLETED):   # COMPLETED: a fast call (no end time)
            return rec[STATE]
        if rec[T_ENDED]:
            return COMPLETED
        return STARTED if rec[T_STARTED] else SCHEDULED

    # -- failure path --------------------------------------------------------------------
    @staticmethod
    def fail(rec: list, pending: Sequence[int] | None, error: BaseException | str) -> None:
        """Mark ``rec`` failed, with the peers it was still waiting for."""
        rec[T_ENDED] = time.monotonic()
        rec[STATE] = FAILED
        notes = rec[NOTES] if rec[NOTES] is not None else {}
        if pending is not None:
            notes["pending_peers"] = sorted(set(int(p) for p in pending))
        notes["error"] = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        rec[NOTES] = notes

    def records(self) -> list[list]:
        """Live records, oldest first."""
        n = min(self.count, self.capacity)
        start = self.count - n
        return [r for r in (self.ring[(start + k) % self.capacity] for k in range(n))
                if r is not None]

    @property
    def dropped(self) -> int:
        return max(0, self.count - self.capacity)

    def snapshot(self, running: list | None = None) -> list[dict[str, Any]]:
        """The records as JSON-able dicts (wall-clock times), oldest first (``running``: see
        ``state``)."""
        offset = time.time() - time.monotonic()
        out = []
        for rec in self.records():
            sched, start, end = rec[T_SCHEDULED], rec[T_STARTED], rec[T_ENDED]
            info: CallInfo = rec[INFO]
            entry: dict[str, Any] = {
                "seq": rec[SEQ], "collective": info.collective, "nbytes": info.nbytes,
                "state": STATE_NAMES[self.state(rec, running)],
                "scheduled_at": _wall(sched or start, offset),
                "started_at": _wall(start, offset),
                "ended_at": _wall(end, offset),
                "duration_s": round(end - start, 6) if start and end else None,
            }
            if self.state(rec, running) in (SCHEDULED, STARTED):
                entry["running_for_s"] = round(time.monotonic() - (start or sched), 6) \
                    if (start or sched) else None
            fields = info.fields()
            entry["dtype"] = fields.pop("dtype", None)
            entry["algorithm"] = fields.pop("algorithm", None)
            entry.update(fields)
            if rec[NOTES] is not None:
                entry.update(rec[NOTES])
            out.append(entry)
        return out

    def dump(self, *, rank: int, world_size: int, communicator: str, reason: str,
             error_type: str | None = None, job: str | None = None,
             extra: dict[str, Any] | None = None, path: str | None = None,
             running: list | None = None) -> str:
        """Write the records as one self-describing JSON file; return its path."""
        from .._version import __version__

        doc = {
            "format": FORMAT, "format_version": FORMAT_VERSION,
            "pycoll_version": __version__,
            "job": job, "communicator": communicator,
            "rank": rank, "world_size": world_size,
            "host": socket.gethostname(), "pid": os.getpid(),
            "dumped_at": time.time(),
            "reason": reason, "error_type": error_type,
            "capacity": self.capacity, "recorded": self.count, "dropped": self.dropped,
            "entries": self.snapshot(running),
        }
        if extra:
            doc.update(extra)
        if path is None:
            safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in communicator)
            stem = f"pycoll-trace-{job}-{safe}" if job else f"pycoll-trace-{safe}"
            path = os.path.join(trace_dir(), f"{stem}-rank{rank}.json")
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1, default=str)
        os.replace(tmp, path)
        return path


def _wall(t: float, offset: float) -> float | None:
    return round(t + offset, 6) if t else None


def dump(comm: Any, reason: str = "requested") -> str | None:
    """Dump ``comm``'s flight recorder now (e.g. from a signal handler); return the path
    (``Communicator.dump_flight_recorder``)."""
    return comm.dump_flight_recorder(reason)
