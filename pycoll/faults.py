"""What a communicator does when something goes wrong.

Mixed into ``Communicator``; split out because it is its own concern:

* the abort record: the first rank whose collective fails posts what happened to the store,
  and every other rank's wait loop notices it (``pycoll/abort.py``), so nobody waits for a
  collective that cannot finish;
* turning a low-level failure (deadline, lost peer, size mismatch) into the error the user
  sees, with rank, collective, sequence number, peer and a hint attached;
* the flight recorder dump named in that error (``pycoll/flight_recorder.py``);
* ``PYCOLL_DEBUG=DETAIL``: comparing every collective's fingerprint across ranks first.
"""
from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from . import debug
from .abort import AbortSignal, AbortWatch, describe_record, lost_rank
from .algorithms import ALGORITHMS
from .errors import (Aborted, CollectiveMismatch, CollectiveTimeout, PeerLost, PeerLostAbort,
                     PycollError, TransportError, describe)
from .flight_recorder import FlightRecorder, capacity_from_env
from .transports.progress import WaitTimeout

# Point-to-point operations: only two ranks take part, so DETAIL fingerprints skip them.
P2P = frozenset({"send", "recv", "batch_p2p"})
# What a DETAIL fingerprint compares across ranks (besides the collective's own sequence).
_FINGERPRINT_FIELDS = ("collective", "dtype", "count", "root", "op")


class FaultHandling:
    """Failure reporting for ``Communicator`` (uses its rank, size, name, store, seq...)."""

    # what it reads of the communicator it is mixed into
    rank: int
    size: int
    name: str
    _store: Any
    _token: str | None
    _seq: int
    _failed: BaseException | None

    def transport_summary(self) -> str:
        raise NotImplementedError

    def _init_fault_handling(self) -> None:
        capacity = capacity_from_env()
        self._flight = FlightRecorder(capacity, ALGORITHMS) if capacity else None
        multi = self._store is not None and self.size > 1
        self._abort = AbortWatch(self._store, self.name, self.rank) if multi else None
        if self._abort is not None:
            self._abort.connect(getattr(self, "timeout", 60.0))
        self._check = self._abort.poll if self._abort is not None else None
        self._detail = multi and debug.detail_enabled()
        self._fp_seq = 0
        self._exit_error: BaseException | None = None
        self._job: str | None = None

    def _collective_failed(self, collective: str, seq: int, limit: float, e: BaseException,
                           rec: list | None, sig: tuple = (None, None, None, None),
                           waiting: list[int] | None = None) -> BaseException:
        """Turn a failure inside a collective into the error to raise; tell the other ranks.

        Marks the communicator failed, posts the abort record (first failure wins), attributes
        a lost peer that merely left after failing to the rank that really failed, and dumps
        the flight recorder, naming the file in the message.
        """
        where = describe(self.rank, collective, seq)
        pending: list[int] | None = None
        post = True
        core = f"{type(e).__name__}: {e}"
        lost: int | None = None
        err: BaseException
        if isinstance(e, AbortSignal):
            err = self._aborted(where, e.record)
            post = False
            if waiting and self._abort is not None and self.size > 2:
                self._abort.report_stall(seq, waiting)   # for the ranks naming who stalls
        elif isinstance(e, WaitTimeout):
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
            stuck = (self._abort.stalled_on(seq, pending, self.size,
                                            min(5.0, max(2.0, limit / 2)))
                     if self._abort is not None and self.size > 2 and pending else None)
            if stuck and stuck != pending:
                never += (f" The whole job is waiting for rank(s) {stuck}: every rank that "
                          "timed out waits for them, directly or through others, and they "
                          "never reported (stuck in other code, or still in an earlier call).")
                core += f"; the whole job is waiting for rank(s) {stuck}"
            err = CollectiveTimeout(
                f"{where}: timed out after {limit:g} s waiting for "
                f"peer rank(s) {pending}{progress}."
                f"{never} Hint: a peer is stuck, slow, or called a different collective; raise "
                "the timeout only if the peers are merely busy.")
        elif isinstance(e, PeerLost):
            pending, lost = [e.peer] if e.peer is not None else None, e.peer
            err = PeerLost(f"{describe(self.rank, collective, seq, peer=e.peer)}: {e}. Hint: "
                           "look at that rank's output for the first error; the job cannot "
                           "continue without it.", peer=e.peer)
        elif isinstance(e, CollectiveMismatch) and e.peer is not None:   # seen in a message
            fp = self._fingerprint(collective, 0, sig)
            args = ", ".join(f"{f}={fp[f]}" for f in _FINGERPRINT_FIELDS[1:] if f in fp)
            err = CollectiveMismatch(f"{where}: {e}. This rank called {collective}({args}).",
                                     peer=e.peer)
            core = f"CollectiveMismatch: {err}"
        elif isinstance(e, TransportError):
            pending = [e.peer] if e.peer is not None else None
            err = type(e)(f"{describe(self.rank, collective, seq, peer=e.peer)}: {e}", peer=e.peer)
        else:
            err = e     # CollectiveMismatch, a bug, KeyboardInterrupt...: raised unchanged
        self._failed = err
        if post and self._abort is not None:
            winner = self._abort.post({"collective": collective, "seq": seq,
                                       "kind": type(err).__name__, "error": core[:2000],
                                       "lost": lost})
            if winner is not None and winner.get("rank") not in (None, self.rank):
                if (isinstance(err, PeerLost) and err.peer is not None
                        and err.peer != lost_rank(winner)):
                    # Another rank failed first; our peer most likely left because of that
                    # failure (it failed or was aborted, then closed its channels): say why.
                    err = self._aborted(where, winner, also=f"{type(e).__name__}: {e}")
                elif isinstance(err, PycollError) and not isinstance(err, CollectiveMismatch):
                    err.args = (f"{err.args[0]}\n(The first failure reported to the store: "
                                f"{describe_record(winner)})",) + err.args[1:]
        self._failed = err
        if rec is not None:
            FlightRecorder.fail(rec, pending, err)
        path = self._dump_flight_recorder(f"{type(err).__name__}: {err}", err)
        if path is not None:
            note = (f"Flight recorder: {path} (merge every rank's dump with: python -m "
                    f"pycoll.trace {path.replace(f'rank{self.rank}.json', 'rank*.json')})")
            if isinstance(err, PycollError):
                err.args = (f"{err.args[0]}\n{note}",) + err.args[1:]
            else:
                err.add_note(note)
        return err

    def _aborted(self, where: str, record: dict, also: str | None = None) -> Aborted:
        lost = lost_rank(record)
        failed = record.get("rank")
        text = f"{where}: aborted: {describe_record(record)}"
        if lost is not None:
            text += f". Rank {lost} is gone (lost by rank {failed})"
        if also:
            text += f". Then this rank saw: {also}"
        text += (". Hint: the first failure is on rank "
                 f"{failed if lost is None else lost}; look at its output for the cause."
                 if failed is not None else "")
        kind = PeerLostAbort if lost is not None else Aborted
        return kind(text, failed_rank=failed if isinstance(failed, int) else None,
                    lost_rank=lost, record=record)

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

    def _dump_flight_recorder(self, reason: str, err: BaseException | None) -> str | None:
        fr = self._flight
        if fr is None:
            return None
        try:
            return fr.dump(rank=self.rank, world_size=self.size, communicator=self.name,
                           reason=reason, error_type=type(err).__name__ if err else None,
                           job=self._job_id(),
                           extra={"transport": self.transport_summary(), "last_seq": self._seq,
                                  "abort_record": self._abort.record if self._abort else None})
        except (OSError, ValueError, TypeError) as e:
            debug.logger.warning("could not write the flight recorder dump: %s", e)
            return None

    @staticmethod
    def _fingerprint(collective: str, nbytes: int, sig: tuple) -> dict:
        """What this rank is about to run (DETAIL only): ``sig`` is the collective's
        (dtype, element count, op, root), None where it does not apply."""
        dtype, count, op, root = sig
        fp: dict[str, Any] = {"collective": collective, "nbytes": nbytes}
        if dtype is not None:
            fp["dtype"] = dtype
        if count is not None and collective != "alltoall":   # uneven splits differ per rank
            fp["count"] = count
        if collective == "alltoall":
            fp.pop("nbytes")
        if op is not None:
            fp["op"] = str(op)
        if root is not None:
            fp["root"] = int(root)
        return fp

    def _compare_fingerprints(self, collective: str, seq: int, fp: dict, deadline: float,
                              rec: list | None) -> None:
        """PYCOLL_DEBUG=DETAIL: check that every rank runs the same call (through the store)."""
        from rendezvous import StoreTimeout

        assert self._abort is not None
        self._fp_seq += 1
        k = self._fp_seq
        mine = dict(fp, call=k, seq=seq)
        if rec is not None:
            rec[8] = {"fingerprint": mine}
        client = self._abort.client()
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
                self._abort.poll()
                if time.monotonic() >= deadline:
                    missing = [r for r in range(self.size) if not client.check([keys[r]])]
                    if missing:
                        raise CollectiveTimeout(
                            f"{describe(self.rank, collective, seq)}: PYCOLL_DEBUG=DETAIL: "
                            f"rank(s) {missing} never reached collective call {k} (this rank's "
                            f"{collective}); they are stuck, slow, or running other calls"
                        ) from None
        prints = [json.loads(v) for v in raw]
        shape = [tuple((f, str(p.get(f))) for f in _FINGERPRINT_FIELDS) for p in prints]
        if len(set(shape)) == 1:
            return
        groups: dict[tuple, list[int]] = {}
        for r, sig in enumerate(shape):
            groups.setdefault(sig, []).append(r)

        def call(p: dict) -> str:
            args = ", ".join(f"{f}={p[f]}" for f in _FINGERPRINT_FIELDS[1:] if f in p)
            return f"{p['collective']}({args}) [op #{p.get('seq')}]"

        said = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {','.join(map(str, rs))} called "
                         f"{call(prints[rs[0]])}" for rs in groups.values())
        diffs = []
        for f in _FINGERPRINT_FIELDS:
            values = {str(p.get(f, "-")) for p in prints}
            if len(values) > 1:
                diffs.append(f"{f} ({' vs '.join(sorted(values))})")
        raise CollectiveMismatch(
            f"{describe(self.rank, collective, seq)}: collective mismatch at collective call {k} "
            f"(PYCOLL_DEBUG=DETAIL): {said}. They differ in: {', '.join(diffs)}. Hint: every "
            "rank must call the same collectives in the same order with matching tensors.")

    def _announce_exit(self) -> None:
        """Leaving with an uncaught exception: post it, so ranks still waiting abort at once."""
        from .abort import exiting_with

        err = self._exit_error or exiting_with()
        if err is None or self._failed is not None or self._abort is None:
            return
        last = f" (after {self._seq} operations)" if self._seq else ""
        self._abort.post({"collective": None, "seq": self._seq, "kind": type(err).__name__,
                          "error": f"left the communicator with an uncaught "
                                   f"{type(err).__name__}: {err}{last}"[:2000]})
