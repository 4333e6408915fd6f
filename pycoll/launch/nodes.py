"""Several ``pycoll.run`` launchers, one per host, running one job (``--nnodes``).

The launcher of node 0 hosts the job's store; every launcher (node 0's too) talks to it
through a ``JobControl``, which is how the launchers act as one:

* node 0 picks the port of torch's own store (``MASTER_PORT`` for env:// users) and
  publishes it; the others read it, so every rank of every host gets the same one;
* the first launcher whose local rank fails posts ``{rank, host, exit}`` (first wins); every
  other launcher sees it within a poll interval, terminates its own ranks, names the failed
  rank and host, and exits non-zero;
* every launcher says when it is finished, and node 0 keeps the store up until all have,
  or until a node's launcher stops beating (each beats on every poll, ~5 times a second):
  a host that died never says "finished", and must not hold node 0 for long.

The job secret never travels on a command line: every node's launcher reads ``PYCOLL_TOKEN``
from its own environment (or ``--token-file``) and hands it to its ranks in theirs.
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import time
from typing import TYPE_CHECKING, Any

from ..errors import PycollError

if TYPE_CHECKING:
    from rendezvous import TCPStore

KEY = "pycoll-run/"
#: a running job's store calls get this long for an answer (``JobControl.torch_port``)
CALL_SECONDS = 3.0


class JobControl:
    """One launcher's view of a multi-node job (a client of the job's store)."""

    def __init__(self, host: str, port: int, token: str, node_rank: int, nnodes: int,
                 timeout: float = 120.0) -> None:
        from rendezvous import TCPStore

        self.node_rank = node_rank
        self.nnodes = nnodes
        self.store: TCPStore = TCPStore(host, port, token=token, timeout=timeout)
        self._claim_node_rank()
        self._next_poll = 0.0
        #: node 0's store stopped answering (host cut off, or node 0 gone): later calls
        #: return at once, so this launcher still tears its ranks down and exits in time
        self.unreachable = False

    def _claim_node_rank(self) -> None:
        """Claim this node rank in the store (first wins): a second launcher given the same
        ``--node-rank`` (a copy-paste slip, or an intruder holding the secret) would start
        ranks that collide with the first one's and fail the job with confusing errors;
        it stops here instead, before starting any rank, naming who holds the rank."""
        me = f"{socket.gethostname()} (pid {os.getpid()}, {secrets.token_hex(4)})"
        holder = bytes(self.store.compare_set(KEY + f"node/{self.node_rank}", "", me)).decode()
        if holder != me:
            self.store.close()
            raise PycollError(
                f"node rank {self.node_rank} of this job is already taken by the launcher on "
                f"{holder}: two launchers were given --node-rank {self.node_rank}. Give each "
                f"host its own --node-rank in [0, {self.nnodes}); this launcher started no "
                "rank")

    def torch_port(self, pick: int | None) -> int:
        """Node 0 publishes ``pick``; every node returns the published port. From here
        on, a store call that gets no answer within ``CALL_SECONDS`` marks the store out of
        reach (startup may wait long for node 0; a running job must not)."""
        if self.node_rank == 0:
            self.store.set(KEY + "torch-port", str(pick))
        port = int(self.store.get(KEY + "torch-port"))
        self.store.set_timeout(CALL_SECONDS)
        return port

    def _call(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` on the store, or None once it is (or just became) unreachable."""
        if self.unreachable:
            return None
        try:
            return fn(*args)
        except Exception:  # noqa: BLE001 - node 0 gone or cut off: go on without it
            self.unreachable = True
            return None

    def report_failure(self, rank: int, exit_text: str, code: int) -> None:
        record = json.dumps({"rank": rank, "host": socket.gethostname(), "exit": exit_text,
                             "code": code, "node": self.node_rank})
        self._call(self.store.compare_set, KEY + "failed", "", record)

    def failure_elsewhere(self, interval: float = 0.2) -> dict | None:
        """A failure another node posted (rate-limited store round trip), or None."""
        now = time.monotonic()
        if now < self._next_poll:
            return None
        self._next_poll = now + interval
        self._call(self.store.add, KEY + f"beat/{self.node_rank}", 1)   # this launcher lives
        if not self._call(self.store.check, [KEY + "failed"]):
            return None
        raw = self._call(self.store.get, KEY + "failed")
        record = json.loads(raw) if raw else {}
        return record if record and record.get("node") != self.node_rank else None

    def abort_record(self) -> str | None:
        """The world communicator's abort record, described (the first failing collective)."""
        if not self._call(self.store.check, ["pycoll/world/abort"]):
            return None
        raw = self._call(self.store.get, "pycoll/world/abort")
        try:
            from ..runtime.abort import _parse, describe_record
            return describe_record(_parse(raw)) if raw else None
        except Exception:  # noqa: BLE001 - a report must never break the launcher
            return None

    def finish(self, wait: float, beat_timeout: float) -> None:
        """Say this node is done; node 0 keeps the store up until every node said so, or
        stopped beating for ``beat_timeout`` seconds (a launcher tearing its ranks down does
        not beat: more than its grace period), or ``wait`` seconds passed."""
        self._call(self.store.set, KEY + f"finished/{self.node_rank}", "1")
        if self.node_rank == 0:
            self._call(self._await_others, time.monotonic() + wait, beat_timeout)
        try:
            self.store.close()
        except Exception:  # noqa: BLE001
            pass

    def _await_others(self, deadline: float, beat_timeout: float) -> None:
        waiting = set(range(1, self.nnodes))
        beats: dict[int, tuple[int, float]] = {}     # node -> (last count, when it changed)
        while waiting and time.monotonic() < deadline:
            for node in list(waiting):
                if self.store.check([KEY + f"finished/{node}"]):
                    waiting.discard(node)
                    continue
                count, now = int(self.store.add(KEY + f"beat/{node}", 0)), time.monotonic()
                last = beats.get(node)
                if last is None or count != last[0]:
                    beats[node] = (count, now)
                elif now - last[1] > beat_timeout:
                    waiting.discard(node)          # its launcher is gone with its host
            time.sleep(0.05)
