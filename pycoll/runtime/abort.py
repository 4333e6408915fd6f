"""Abort through the store: a rank that fails tells every other rank, so nobody waits forever.

NCCL leaves this to the application (``ncclCommGetAsyncError`` + ``ncclCommAbort``); users of
torch.distributed mostly see the consequence, a hang that ends at a 30-minute timeout naming
nobody. pycoll does it for every communicator:

* **post**: when a collective fails on a rank (timeout, lost peer, size mismatch, a bug or a
  ``KeyboardInterrupt`` inside the collective), or the process exits with an uncaught
  exception, that rank writes one record to the rendezvous store under
  ``pycoll/<communicator name>/abort``::

      {"rank": 2, "collective": "allreduce", "seq": 17, "error": "PeerLost: ...",
       "kind": "PeerLost", "lost": 3, "host": "...", "pid": 1234, "time": 1712345678.9}

  The write is a ``compare_set`` against "missing", so the first failure wins and later ones
  only read it back: the record always names the *root* failure, not its echoes.
* **poll**: every rank's wait loop (``transports.base.wait_all``, through ``Peers.check``)
  calls :meth:`AbortWatch.poll` when it is idle; the poll reads the store at most every
  ``PYCOLL_ABORT_POLL_MS`` (default 100 ms) through a store client of its own (created on first
  use: the shared client serialises calls with a lock, and another thread may hold it in a
  long blocking ``get``). A record from another rank raises :class:`AbortSignal`, which the
  communicator turns into :class:`pycoll.Aborted` with this rank's collective and sequence
  number.

The hot path never touches the store: a collective that completes without idling never
polls, and an idle one polls at most ten times a second (one localhost round trip each).
"""
from __future__ import annotations

import json
import math
import os
import socket
import time
from typing import Any

from rendezvous import Store

from .. import debug
from ..envvars import env_float
from ..errors import InvalidArgument

#: default of ``PYCOLL_ABORT_POLL_MS``: how often an idle wait loop reads the abort record
DEFAULT_POLL_MS = 100.0
#: how long a store whose port refuses connections may stay gone before a waiting rank
#: gives up on it (meanwhile the transports may name the rank that died, a better answer)
STORE_GONE_FATAL_SECONDS = 1.0
#: deadline of one abort-record round trip: short, so a dead store never stalls a wait loop
#: (a slow store just means a later poll)
ABORT_CLIENT_TIMEOUT = 1.0


class AbortSignal(Exception):
    """Raised inside the wait loop when another rank's abort record shows up.

    Internal: the communicator converts it into :class:`pycoll.Aborted`, which carries the
    collective and sequence number this rank was in.
    """

    def __init__(self, record: dict[str, Any]) -> None:
        super().__init__(record.get("error", "aborted"))
        self.record = record


def poll_interval() -> float:
    """Seconds between two polls of the abort record: ``PYCOLL_ABORT_POLL_MS`` / 1000.

    Read when an :class:`AbortWatch` is created, never at import, so a bad value cannot
    break ``import pycoll``; it raises :class:`pycoll.InvalidArgument` naming the variable.
    """
    ms = env_float("PYCOLL_ABORT_POLL_MS", DEFAULT_POLL_MS, minimum=0.0)
    if not 0.0 < ms < math.inf:
        raise InvalidArgument(f"PYCOLL_ABORT_POLL_MS={os.environ.get('PYCOLL_ABORT_POLL_MS')!r} "
                              "must be a number of milliseconds > 0 (default 100)")
    return ms / 1000.0


def abort_key(name: str) -> str:
    return f"pycoll/{name}/abort"


def clone_client(store: Store, timeout: float) -> Store:
    """A second connection to the same store server, or the store itself if it cannot clone."""
    try:
        from rendezvous import PrefixStore, TCPStore
    except ImportError:  # pragma: no cover
        return store
    if isinstance(store, TCPStore):
        return store.clone(timeout)
    if isinstance(store, PrefixStore):
        return PrefixStore(store.prefix, clone_client(store.underlying_store, timeout))
    return store


def _store_errors() -> tuple[type[BaseException], ...]:
    try:
        from rendezvous import StoreError
        return (StoreError, OSError)
    except ImportError:  # pragma: no cover
        return (OSError,)


class AbortWatch:
    """Posts and polls one communicator's abort record."""

    def __init__(self, store: Store, name: str, rank: int,
                 timeout: float = ABORT_CLIENT_TIMEOUT, world_rank: int | None = None) -> None:
        self.store = store
        self.name = name
        self.rank = rank
        #: this rank in the tree's root communicator (as channels and lost peers are named)
        self.world_rank = rank if world_rank is None else world_rank
        self.key = abort_key(name)
        self.timeout = timeout
        self.interval = poll_interval()
        self._client: Any = None
        self._owns_client = False
        self._next_poll = 0.0
        self._gone_since = 0.0     # when the store was first found gone (0: it is not)
        self.record: dict[str, Any] | None = None   # the record seen or posted, once known
        register_exit_marker()

    # -- the dedicated client ----------------------------------------------------------------
    def client(self, connect_timeout: float | None = None) -> Any:
        """The watch's own connection. ``connect`` makes it at init, with the job's patience
        (a store crowded by strangers may take a while to answer); afterwards every round
        trip gets only ``timeout``, so a dead store never stalls a wait loop."""
        if self._client is None:
            client = clone_client(self.store, connect_timeout or self.timeout)
            self._owns_client = client is not self.store
            if self._owns_client:
                base = client
                while hasattr(base, "underlying_store"):
                    base = base.underlying_store
                if hasattr(base, "timeout"):
                    base.timeout = self.timeout
            self._client = client
        return self._client

    def connect(self, timeout: float) -> None:
        """Open the watch's connection now (at init), not at the first idle poll."""
        try:
            self.client(connect_timeout=timeout)
        except _store_errors() as e:
            debug.logger.info("abort watch: no connection to the store yet (%s)", e)

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None and self._owns_client:
            try:
                inner = getattr(client, "underlying_store", client)
                inner.close()
            except Exception:  # noqa: BLE001 - closing must not fail
                pass

    # -- polling (called from the wait loop while idle) --------------------------------------
    def poll(self) -> None:
        """Raise :class:`AbortSignal` if another rank posted an abort record.

        Rate-limited: at most one store round trip per ``interval``.
        """
        now = time.monotonic()
        if now < self._next_poll:
            return
        self._next_poll = now + self.interval
        record = self.fetch()
        if record is not None and (record.get("rank") != self.rank
                                   or record.get("kind") == "Revoked"):
            raise AbortSignal(record)     # another rank's failure, or this rank's revoke

    def fetch(self) -> dict[str, Any] | None:
        """The abort record, or None; raises AbortSignal if the store stays unreachable."""
        if self.record is not None:
            return self.record
        if self._gone_since:
            self._give_up_on_gone_store("its port refuses connections")
            return None
        try:
            client = self.client()
            if not client.check([self.key]):
                return None
            raw = client.get(self.key, timeout=self.timeout)
        except _store_errors() as e:
            # slow (a crowded server, a flood of strangers) is not gone: only a refused
            # connection counts, and then the transports get a moment to name the dead rank
            debug.logger.info("abort poll: store did not answer (%s)", e)
            if self.store_gone():
                self._gone_since = time.monotonic()
            return None
        self.record = _parse(raw)
        return self.record

    def _give_up_on_gone_store(self, why: str) -> None:
        if time.monotonic() - self._gone_since < STORE_GONE_FATAL_SECONDS:
            return
        raise AbortSignal({
            "rank": None, "collective": None, "seq": None, "kind": "StoreUnreachable",
            "error": f"the rendezvous store at {getattr(self._base(), 'address', '?')} is gone "
                     f"({why}); the process that hosts it (rank 0, unless a launcher runs "
                     "the store) has died"})

    # -- posting ----------------------------------------------------------------------------
    def post(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """Publish ``record`` unless another rank already did; return the record that won.

        Returns None when the store cannot be reached (the failure is still raised locally).
        """
        if self._gone_since or self.store_gone():
            debug.logger.info("abort: the store is gone (connection refused); the failure is "
                              "raised here only")
            return None
        record = dict(record)
        record.setdefault("rank", self.rank)
        record.setdefault("world_rank", self.world_rank)
        record.setdefault("host", socket.gethostname())
        record.setdefault("pid", os.getpid())
        record.setdefault("time", time.time())
        mine = json.dumps(record, default=str)
        try:
            stored = self.client().compare_set(self.key, "", mine)
        except _store_errors() as e:
            debug.logger.info("abort: could not post the abort record (%s)", e)
            return None
        self.record = _parse(stored)
        return self.record


    def stalled_on(self, seq: int, waiting_for: list[int], size: int,
                   window: float) -> list[int] | None:
        """Which ranks the whole job waits for, when this rank's call ``seq`` timed out
        waiting for ``waiting_for``.

        Every rank whose call times out says for whom it waited (one key each); after a
        short ``window`` for the others' deadlines to pass too, the ranks that some rank
        waits for and that reported nothing themselves are the ones everybody is stuck on
        (a rank in other code, or still in an earlier call): the direct neighbours of the
        stuck rank know it, this lets the others name it too. None if it cannot tell.
        """
        prefix = f"pycoll/{self.name}/stalled/{seq}/"
        try:
            client = self.client()
            self.report_stall(seq, waiting_for)
            keys = [prefix + str(r) for r in range(size)]
            deadline = time.monotonic() + window
            waits: dict[int, list[int]] = {}
            while True:
                present = [r for r in range(size) if r not in waits and client.check([keys[r]])]
                for r, raw in zip(present, client.multi_get([keys[r] for r in present],
                                                            timeout=self.timeout)
                                  if present else []):
                    waits[r] = [int(p) for p in _parse_list(raw)]
                waited = {p for ps in waits.values() for p in ps}
                silent = sorted(waited - set(waits))
                if silent and all(r in waits or r in silent for r in range(size)):
                    return silent      # everyone else reported: no need to wait longer
                if time.monotonic() >= deadline:
                    return silent or None
                time.sleep(0.05)
        except _store_errors() as e:
            debug.logger.info("stall analysis: store unavailable (%s)", e)
            return None

    def report_stall(self, seq: int, waiting_for: list[int]) -> None:
        """Say for whom this rank's call ``seq`` was waiting when it failed (``stalled_on``);
        a rank aborted by another's timeout says it too, or it would look stuck itself."""
        try:
            self.client().set(f"pycoll/{self.name}/stalled/{seq}/{self.rank}",
                              json.dumps(sorted(waiting_for)))
        except _store_errors() as e:
            debug.logger.info("stall report: store unavailable (%s)", e)

    def store_gone(self) -> bool:
        """Whether the store server is certainly gone: its port refuses connections (its
        process died; typically rank 0, which hosts it). A slow or crowded server is not
        gone: only a refusal counts, and the check costs one local connect, not the client's
        retry loop (which waits out its whole timeout for a server that may still start)."""
        host, port = getattr(self._base(), "host", None), getattr(self._base(), "port", None)
        if host is None or port is None:
            return False
        try:
            socket.create_connection((host, port), timeout=0.5).close()
        except ConnectionRefusedError:
            return True
        except OSError:
            return False
        return False

    def _base(self) -> Any:
        store = self.store
        while hasattr(store, "underlying_store"):
            store = store.underlying_store
        return store


def _parse_list(raw: bytes | str) -> list:
    try:
        value = json.loads(raw)
    except ValueError:
        return []
    return [v for v in value if isinstance(v, int)] if isinstance(value, list) else []


def _parse(raw: bytes | str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
        if isinstance(value, dict):
            return value
    except ValueError:
        pass
    return {"rank": None, "error": repr(raw)[:200]}


def describe_record(record: dict[str, Any]) -> str:
    """One sentence: who failed, in what, and why ("rank 2 failed in allreduce #17: ...")."""
    who = record.get("rank")
    what = record.get("collective")
    seq = record.get("seq")
    where = f" in {what} #{seq}" if what else ""
    if who is None:
        return str(record.get("error"))
    host = record.get("host")
    at = f" (host {host}, pid {record.get('pid')})" if host else ""
    return f"rank {who}{at} failed{where}: {record.get('error')}"


def lost_rank(record: dict[str, Any]) -> int | None:
    """The rank whose death caused the abort, if that was the cause."""
    lost = record.get("lost")
    return int(lost) if isinstance(lost, int) else None


# -- leaving with an uncaught exception ----------------------------------------------------
_exiting = False


def _mark_exiting() -> None:
    global _exiting
    _exiting = True


def exiting_with() -> BaseException | None:
    """The uncaught exception the interpreter is exiting with, when called from atexit.

    ``sys.last_value`` is set once Python has printed an uncaught exception's traceback, and
    atexit handlers (``pycoll.finalize`` among them) run after that. Outside interpreter exit
    the value may be stale (an interactive session), so it only counts while exiting.
    """
    import sys

    if not _exiting:
        return None
    return getattr(sys, "last_value", None)


_registered = False


def register_exit_marker(again: bool = False) -> None:
    """atexit runs handlers last-registered-first: registered when the first communicator is
    created (after pycoll.world registered its finalize), and ``again`` whenever finalize is
    registered anew, the marker says "exiting" before finalize runs."""
    global _registered
    if again or not _registered:
        import atexit

        atexit.unregister(_mark_exiting)
        atexit.register(_mark_exiting)
        _registered = True
