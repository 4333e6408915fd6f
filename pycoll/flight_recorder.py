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

Recording is on the hot path of every collective, so it is a fixed-size ring of small lists
(one 9-slot list per collective, the communicator writes it inline: no method call, no dict,
one ``time.monotonic()`` beyond the one the deadline already takes). The state is implied by
the timestamps (started once ``T_STARTED`` is set, completed once ``T_ENDED`` is), so the
hot path writes only times; only a failure sets ``STATE`` explicitly, and a call of the fast
path (``pycoll/fastpath``, a few µs) marks its completion there instead of reading the clock
again (its dump entry has no end time and no duration: 0.04 µs, 3% of an 8-byte call).
Slow details are derived only when a dump is written: the dtype and algorithm come from the
collective's closure for records still in flight (completed records drop the closure at
once, so the recorder never keeps a user's tensor alive), and ``PYCOLL_DEBUG=DETAIL``
records the full fingerprint of each call.
"""
from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from typing import Any, Callable, Sequence

from .envvars import env_int

FORMAT = "pycoll-flight-recorder"
FORMAT_VERSION = 1
DEFAULT_CAPACITY = 500

SCHEDULED, STARTED, COMPLETED, FAILED = 0, 1, 2, 3
STATE_NAMES = ("scheduled", "started", "completed", "failed")

# Fields of a record (a list reused in place).
SEQ, COLLECTIVE, NBYTES, STATE, T_SCHEDULED, T_STARTED, T_ENDED, BODY, INFO = range(9)
_FIELDS = 9


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


class FlightRecorder:
    """A ring of the last ``capacity`` collectives of one communicator."""

    __slots__ = ("capacity", "ring", "count", "_algorithms")

    def __init__(self, capacity: int, algorithms: dict[str, dict[str, Callable]] | None = None
                 ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.ring: list[list | None] = [None] * capacity
        self.count = 0                 # records ever opened
        self._algorithms = algorithms or {}

    # -- hot path ------------------------------------------------------------------------
    def open(self, seq: int, collective: str, nbytes: int, body: Any) -> list:
        """Start a record (state ``scheduled``); the caller updates it in place.

        ``Communicator._execute`` inlines exactly this, to save the call.
        """
        rec = [seq, collective, nbytes, SCHEDULED, 0.0, 0.0, 0.0, body, None]
        i = self.count
        self.count = i + 1
        self.ring[i % self.capacity] = rec
        return rec

    @staticmethod
    def state(rec: list) -> int:
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
        info = rec[INFO] if isinstance(rec[INFO], dict) else {}
        if pending is not None:
            info["pending_peers"] = sorted(set(int(p) for p in pending))
        info["error"] = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        rec[INFO] = info

    def records(self) -> list[list]:
        """Live records, oldest first."""
        n = min(self.count, self.capacity)
        start = self.count - n
        return [r for r in (self.ring[(start + k) % self.capacity] for k in range(n))
                if r is not None]

    @property
    def dropped(self) -> int:
        return max(0, self.count - self.capacity)

    def snapshot(self) -> list[dict[str, Any]]:
        """The records as JSON-able dicts (wall-clock times), oldest first."""
        offset = time.time() - time.monotonic()
        out = []
        for rec in self.records():
            sched, start, end = rec[T_SCHEDULED], rec[T_STARTED], rec[T_ENDED]
            entry: dict[str, Any] = {
                "seq": rec[SEQ], "collective": rec[COLLECTIVE], "nbytes": rec[NBYTES],
                "state": STATE_NAMES[self.state(rec)],
                "scheduled_at": _wall(sched or start, offset),
                "started_at": _wall(start, offset),
                "ended_at": _wall(end, offset),
                "duration_s": round(end - start, 6) if start and end else None,
            }
            if self.state(rec) in (SCHEDULED, STARTED):
                entry["running_for_s"] = round(time.monotonic() - (start or sched), 6) \
                    if (start or sched) else None
            details = describe_body(rec[BODY], self._algorithms) if rec[BODY] is not None else {}
            entry["dtype"] = details.pop("dtype", None)
            entry["algorithm"] = details.pop("algorithm", None)
            entry.update(details)
            if isinstance(rec[INFO], dict):
                entry.update(rec[INFO])
            out.append(entry)
        return out

    def dump(self, *, rank: int, world_size: int, communicator: str, reason: str,
             error_type: str | None = None, job: str | None = None,
             extra: dict[str, Any] | None = None, path: str | None = None) -> str:
        """Write the records as one self-describing JSON file; return its path."""
        from . import __version__

        doc = {
            "format": FORMAT, "format_version": FORMAT_VERSION,
            "pycoll_version": __version__,
            "job": job, "communicator": communicator,
            "rank": rank, "world_size": world_size,
            "host": socket.gethostname(), "pid": os.getpid(),
            "dumped_at": time.time(),
            "reason": reason, "error_type": error_type,
            "capacity": self.capacity, "recorded": self.count, "dropped": self.dropped,
            "entries": self.snapshot(),
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


def describe_body(body: Any, algorithms: dict[str, dict[str, Callable]]) -> dict[str, Any]:
    """dtype, element count, algorithm, op and root of a collective, read from its closure
    (or, for a body that carries them, its ``flight_info``: the fast path's)."""
    info = getattr(body, "flight_info", None)
    if isinstance(info, dict):
        return dict(info)
    try:
        names = body.__code__.co_freevars
        cells = body.__closure__ or ()
    except AttributeError:
        return {}
    env: dict[str, Any] = {}
    for name, cell in zip(names, cells):
        try:
            env[name] = cell.cell_contents
        except ValueError:   # empty cell
            pass
    out: dict[str, Any] = {}
    for key in ("buf", "inp", "out"):
        b = env.get(key)
        if b is not None and isinstance(getattr(b, "dtype", None), str):
            out["dtype"], out["count"] = b.dtype, int(b.count)
            break
    else:
        arr = env.get("arr")
        if arr is not None and hasattr(arr, "dtype"):
            out["dtype"], out["count"] = str(arr.dtype), int(arr.size)
    for key in ("algorithm", "fn"):
        fn = env.get(key)
        if callable(fn):
            out["algorithm"] = _algorithm_name(fn, algorithms)
            break
    plans = env.get("plans")   # allreduce_coalesced: (dtype, members, fn, spec) per dtype
    if isinstance(plans, list) and plans and isinstance(plans[0], tuple):
        out["dtype"] = ",".join(str(p[0]) for p in plans)
        out["algorithm"] = ",".join(_algorithm_name(p[2], algorithms) for p in plans)
    if "rop" in env:
        out["op"] = str(env["rop"])
    if isinstance(env.get("root"), int):
        out["root"] = env["root"]
    return out


def _algorithm_name(fn: Callable, algorithms: dict[str, dict[str, Callable]]) -> str:
    for table in algorithms.values():
        for name, f in table.items():
            if f is fn:
                return name
    module = getattr(fn, "__module__", "") or ""
    return module.rsplit(".", 1)[-1] or getattr(fn, "__name__", "?")


def dump(comm: Any, reason: str = "requested") -> str | None:
    """Dump ``comm``'s flight recorder now (e.g. from a signal handler); return the path."""
    return comm._dump_flight_recorder(reason, None)  # noqa: SLF001
