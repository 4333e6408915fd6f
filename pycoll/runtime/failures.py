"""What a communicator does when something goes wrong: ``Failures``, owned by its execution.

* the abort record: the first rank whose call fails posts what happened to the store, and
  every other rank's wait loop notices it (``abort.py``), so nobody waits for a collective
  that cannot finish;
* turning a low-level failure (deadline, lost peer, size mismatch) into the error the user
  sees, with rank, collective, sequence number, peer and a hint attached;
* the flight recorder's dump, named in that error (``flight_recorder.py``);
* ``PYCOLL_DEBUG=DETAIL``: comparing every collective's fingerprint across ranks first.
"""
from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

from rendezvous import Store

from .. import debug
from ..errors import (
    Aborted,
    CollectiveMismatch,
    CollectiveTimeout,
    PeerLost,
    PeerLostAbort,
    PycollError,
    Revoked,
    TransportError,
    describe,
)
from ..transports.progress import WaitTimeout
from .abort import AbortSignal, AbortWatch, describe_record, exiting_with, lost_rank
from .calls import FINGERPRINT_FIELDS, CallInfo
from .flight_recorder import NOTES, FlightRecorder


class Failures:
    """Failure reporting of one communicator (rank ``rank`` of ``size``, named ``name``).

    ``store`` is the job's store (None for a world of one: nobody to tell), ``token`` the job
    secret (it names the job in dump file names, hashed), ``transports`` says which
    transports serve this rank (for dumps) and ``recorder`` is the communicator's flight
    recorder (None: recording is off).
    """

    def __init__(self, rank: int, size: int, name: str, store: Store | None,
                 token: str | None,
                 timeout: float, transports: Callable[[], str],
                 recorder: FlightRecorder | None, world_rank: int | None = None) -> None:
        self.rank = rank
        self.size = size
        self.name = name
        self.recorder = recorder
        self._store = store
        self._token = token
        self._transports = transports
        self.abort = (AbortWatch(store, name, rank, world_rank=world_rank)
                      if store is not None and size > 1 else None)
        if self.abort is not None:
            self.abort.connect(timeout)
        #: what the wait loops call while idle: raises ``AbortSignal`` on an abort record
        self.check = self.abort.poll if self.abort is not None else None
        #: ``PYCOLL_DEBUG=DETAIL``: every collective's fingerprint is compared first
        self.detail = self.abort is not None and debug.detail_enabled()
        self._fingerprints = 0
        self._job: str | None = None

    # -- a failed call ---------------------------------------------------------------------
    def explain(self, info: CallInfo, seq: int, limit: float, e: BaseException,
                waiting: list[int] | None
                ) -> tuple[BaseException, dict[str, Any], list[int] | None]:
        """The error to raise for ``e`` inside call ``seq``, what to post as the abort record
        (empty: nothing, the call was aborted by another rank's record) and the peers the
        call was still waiting for."""
        collective = info.collective
        where = describe(self.rank, collective, seq)
        pending: list[int] | None = None
        core = f"{type(e).__name__}: {e}"
        lost: int | None = None
        err: BaseException
        if isinstance(e, AbortSignal):
            if waiting and self.abort is not None and self.size > 2:
                self.abort.report_stall(seq, waiting)   # for the ranks naming who stalls
            return self.aborted(where, e.record), {}, None
        if isinstance(e, WaitTimeout):
            pending = e.peers
            err, core = self._timed_out(where, seq, limit, e)
        elif isinstance(e, PeerLost):
            pending, lost = [e.peer] if e.peer is not None else None, e.peer
            err = PeerLost(f"{describe(self.rank, collective, seq, peer=e.peer)}: {e}. Hint: "
                           "look at that rank's output for the first error; the job cannot "
                           "continue without it.", peer=e.peer)
        elif isinstance(e, CollectiveMismatch) and e.peer is not None:   # seen in a message
            err = CollectiveMismatch(f"{where}: {e}. This rank called "
                                     f"{collective}({info.arguments()}).", peer=e.peer)
            core = f"CollectiveMismatch: {err}"
        elif isinstance(e, TransportError):
            pending = [e.peer] if e.peer is not None else None
            err = type(e)(f"{describe(self.rank, collective, seq, peer=e.peer)}: {e}", peer=e.peer)
        else:
            err = e     # CollectiveMismatch, a bug, KeyboardInterrupt...: raised unchanged
        record = {"collective": collective, "seq": seq, "kind": type(err).__name__,
                  "error": core[:2000], "lost": lost}
        return err, record, pending

    def _timed_out(self, where: str, seq: int, limit: float,
                   e: WaitTimeout) -> tuple[CollectiveTimeout, str]:
        pending = e.peers
        done = sum(r.bytes_done for r in e.pending)
        total = sum(r.nbytes for r in e.pending)
        progress = (f" ({done} of {total} bytes of the pending messages done)"
                    if e.pending else "")
        absent = sorted({r.channel.peer for r in e.pending if not r.channel.peer_joined()})
        core = (f"CollectiveTimeout: timed out after {limit:g} s waiting for peer rank(s) "
                f"{pending}")
        never = (f" Peer rank(s) {absent} never opened their side of the channel to this "
                 "rank: they are not in this call at all (a different root, collective or "
                 "communicator, or stuck before it)." if absent else "")
        stuck = (self.abort.stalled_on(seq, pending, self.size, min(5.0, max(2.0, limit / 2)))
                 if self.abort is not None and self.size > 2 and pending else None)
        if stuck and stuck != pending:
            never += (f" The whole job is waiting for rank(s) {stuck}: every rank that "
                      "timed out waits for them, directly or through others, and they "
                      "never reported (stuck in other code, or still in an earlier call).")
            core += f"; the whole job is waiting for rank(s) {stuck}"
        err = CollectiveTimeout(
            f"{where}: timed out after {limit:g} s waiting for peer rank(s) {pending}{progress}."
            f"{never} Hint: a peer is stuck, slow, or called a different collective; raise "
            "the timeout only if the peers are merely busy.")
        return err, core

    def publish(self, err: BaseException, record: dict[str, Any], seq: int,
                first_seen: BaseException) -> BaseException:
        """Post ``record`` as the job's abort record unless another rank was first; then say
        in ``err`` what that first failure was (or, for a peer that merely left after it,
        raise the abort instead). Returns the error to raise."""
        if not record or self.abort is None:
            return err
        winner = self.abort.post(record)
        if winner is None or winner.get("rank") in (None, self.rank):
            return err
        if isinstance(err, PeerLost) and err.peer is not None and err.peer != lost_rank(winner):
            # Another rank failed first; our peer most likely left because of that failure
            # (it failed or was aborted, then closed its channels): say why.
            where = describe(self.rank, record["collective"], seq)
            return self.aborted(where, winner, also=f"{type(first_seen).__name__}: {first_seen}")
        if isinstance(err, PycollError) and not isinstance(err, CollectiveMismatch):
            err.args = (f"{err.args[0]}\n(The first failure reported to the store: "
                        f"{describe_record(winner)})",) + err.args[1:]
        return err

    def aborted(self, where: str, record: dict, also: str | None = None) -> Aborted:
        """The ``Aborted`` (``PeerLostAbort`` when a rank is gone) for another rank's abort
        ``record``, seen by this rank at ``where``."""
        lost = lost_rank(record)
        failed = record.get("rank")
        failed_world = record.get("world_rank", failed)
        if record.get("kind") == "Revoked":
            host = f" (host {record.get('host')}, pid {record.get('pid')})"
            return Revoked(f"{where}: the communicator was revoked by rank {failed}{host}: "
                           f"{record.get('reason')}. Hint: shrink it (comm.shrink(), "
                           "docs/elastic.md) or finalize it",
                           failed_rank=failed_world if isinstance(failed_world, int) else None,
                           record=record)
        text = f"{where}: aborted: {describe_record(record)}"
        if lost is not None:
            text += f". Rank {lost} is gone (lost by rank {failed})"
        if also:
            text += f". Then this rank saw: {also}"
        text += (". Hint: the first failure is on rank "
                 f"{failed if lost is None else lost}; look at its output for the cause."
                 if failed is not None else "")
        # named as lost ranks are: in the tree's root communicator (a group's own rank
        # would name another process)
        kind = PeerLostAbort if lost is not None else Aborted
        return kind(text, failed_rank=failed_world if isinstance(failed_world, int) else None,
                    lost_rank=lost, record=record)

    def attach_dump(self, err: BaseException, last_seq: int) -> None:
        """Dump the flight recorder and name the file in ``err``."""
        path = self.dump(f"{type(err).__name__}: {err}", err, last_seq)
        if path is None:
            return
        note = (f"Flight recorder: {path} (merge every rank's dump with: python -m "
                f"pycoll.trace {path.replace(f'rank{self.rank}.json', 'rank*.json')})")
        if isinstance(err, PycollError):
            err.args = (f"{err.args[0]}\n{note}",) + err.args[1:]
        elif hasattr(err, "add_note"):          # Python 3.11+
            err.add_note(note)

    def dump(self, reason: str, err: BaseException | None, last_seq: int,
             running: list | None = None) -> str | None:
        """Write the flight recorder's dump (``running``: the record of a call running
        inline now); its path (None: recording is off, or the dump could not be written,
        which is logged)."""
        fr = self.recorder
        if fr is None:
            return None
        try:
            return fr.dump(rank=self.rank, world_size=self.size, communicator=self.name,
                           reason=reason, error_type=type(err).__name__ if err else None,
                           job=self._job_id(), running=running,
                           extra={"transport": self._transports(), "last_seq": last_seq,
                                  "abort_record": self.abort.record if self.abort else None})
        except (OSError, ValueError, TypeError) as e:
            debug.logger.warning("could not write the flight recorder dump: %s", e)
            return None

    def _job_id(self) -> str | None:
        """A short, non-secret name for this job, the same on every rank (for dump names)."""
        if self._job is None:
            store = self._store
            host, port = getattr(store, "host", None), getattr(store, "port", None)
            if host is None:
                return None
            seed = f"{host}:{port}:{self._token or ''}".encode()
            self._job = hashlib.sha256(seed).hexdigest()[:10]
        return self._job

    # -- PYCOLL_DEBUG=DETAIL -----------------------------------------------------------------
    def compare_fingerprints(self, info: CallInfo, seq: int, deadline: float,
                             rec: list | None) -> None:
        """Check, through the store, that every rank runs the same call as this one."""
        from rendezvous import StoreTimeout

        assert self.abort is not None
        self._fingerprints += 1
        k = self._fingerprints
        collective = info.collective
        mine = dict(info.fingerprint(), call=k, seq=seq)
        if rec is not None:
            rec[NOTES] = {"fingerprint": mine}
        client = self.abort.client()
        prefix = f"pycoll/{self.name}/fingerprint"
        client.set(f"{prefix}/{k}/{self.rank}", json.dumps(mine))
        if k > 2:   # every rank has read call k-2's keys once anyone posts call k
            client.delete(f"{prefix}/{k - 2}/{self.rank}")
        keys = [f"{prefix}/{k}/{r}" for r in range(self.size)]
        while True:
            remaining = deadline - time.monotonic()
            try:
                raw = client.multi_get(keys, timeout=max(0.001, min(0.5, remaining)))
                break
            except StoreTimeout:
                self.abort.poll()
                if time.monotonic() >= deadline:
                    missing = [r for r in range(self.size) if not client.check([keys[r]])]
                    if missing:
                        raise CollectiveTimeout(
                            f"{describe(self.rank, collective, seq)}: PYCOLL_DEBUG=DETAIL: "
                            f"rank(s) {missing} never reached collective call {k} (this rank's "
                            f"{collective}); they are stuck, slow, or running other calls"
                        ) from None
        prints = [json.loads(v) for v in raw]
        shape = [tuple((f, str(p.get(f))) for f in FINGERPRINT_FIELDS) for p in prints]
        if len(set(shape)) == 1:
            return
        groups: dict[tuple, list[int]] = {}
        for r, sig in enumerate(shape):
            groups.setdefault(sig, []).append(r)

        def call(p: dict) -> str:
            args = ", ".join(f"{f}={p[f]}" for f in FINGERPRINT_FIELDS[1:] if f in p)
            return f"{p['collective']}({args}) [op #{p.get('seq')}]"

        said = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {','.join(map(str, rs))} called "
                         f"{call(prints[rs[0]])}" for rs in groups.values())
        diffs = []
        for f in FINGERPRINT_FIELDS:
            values = {str(p.get(f, "-")) for p in prints}
            if len(values) > 1:
                diffs.append(f"{f} ({' vs '.join(sorted(values))})")
        raise CollectiveMismatch(
            f"{describe(self.rank, collective, seq)}: collective mismatch at collective call {k} "
            f"(PYCOLL_DEBUG=DETAIL): {said}. They differ in: {', '.join(diffs)}. Hint: every "
            "rank must call the same collectives in the same order with matching tensors.")

    # -- revoking ----------------------------------------------------------------------------
    def revoke(self, reason: str, seq: int) -> Revoked:
        """Post a revocation as the abort record (unless a failure is there already: then
        the communicator is revoked by it) and return the error this rank's later calls
        raise. Every other rank's wait loop sees the record within ``PYCOLL_ABORT_POLL_MS``."""
        record: dict[str, Any] = {"collective": "revoke", "seq": seq, "kind": "Revoked",
                                  "reason": reason, "lost": None,
                                  "error": f"revoked the communicator: {reason}"}
        winner = self.abort.post(record) if self.abort is not None else None
        record = dict(record, rank=self.rank,
                      world_rank=self.abort.world_rank if self.abort else self.rank)
        if winner is not None and winner.get("rank") != self.rank:
            record = winner         # a failure or another revocation came first
        text = describe_record(record)
        return Revoked(f"communicator {self.name} is revoked: {text}. Hint: shrink it "
                       "(comm.shrink(), docs/elastic.md) or finalize it",
                       failed_rank=record.get("world_rank", record.get("rank")),
                       lost_rank=lost_rank(record), record=record)

    # -- leaving ----------------------------------------------------------------------------
    def announce_exit(self, err: BaseException | None, seq: int) -> None:
        """Leaving with an uncaught exception: post it, so ranks still waiting abort at once
        (``err``: what the ``with`` block raised; else whatever the process exits with)."""
        err = err or exiting_with()
        if err is None or self.abort is None:
            return
        last = f" (after {seq} operations)" if seq else ""
        self.abort.post({"collective": None, "seq": seq, "kind": type(err).__name__,
                         "error": f"left the communicator with an uncaught "
                                  f"{type(err).__name__}: {err}{last}"[:2000]})

    def lost_rank(self, failed: BaseException | None) -> int | None:
        """The rank whose loss failed the communicator, if that was it (numbered in the
        root communicator, like every channel's peer)."""
        peer = failed.peer if isinstance(failed, PeerLost) else None
        if peer is None and self.abort is not None and self.abort.record:
            peer = self.abort.record.get("lost")
        return peer if isinstance(peer, int) and peer >= 0 else None

    def close(self) -> None:
        if self.abort is not None:
            self.abort.close()
