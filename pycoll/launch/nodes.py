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

Under ``--elastic`` (``ElasticJob``) a failed rank is judged against the whole job instead:

* every launcher publishes the names of its running processes (``2``, ``2'``) whenever they
  change, so that "ranks still running" counts every host's;
* the restarts are one counter in the store (``--max-restarts`` is the job's budget);
* every launcher but node 0's holds a *lease* on ``alive/<node>`` (the ranks' failure
  detector, ``TCPStore.lease``): the store marks it gone the moment the launcher's
  connection closes, or after about four keepalive periods behind a pulled cable. Node 0
  reads the leases, judges a host gone with its launcher, records it under ``lost-nodes``,
  and starts the replacements for its ranks itself (the one host the job cannot lose: it
  holds the store);
* every launcher posts its ranks' outcome under ``result/<node>`` before it says finished;
  node 0 outlives them all and combines the outcomes into the job's exit code;
* a launcher that loses the store ends its ranks and says so: the job cannot outlive it.
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import time
from typing import TYPE_CHECKING, Any

from ..errors import PycollError
from .elastic_policy import Job

if TYPE_CHECKING:
    from rendezvous import TCPStore

KEY = "pycoll-run/"
#: a running job's store calls get this long for an answer (``JobControl.torch_port``)
CALL_SECONDS = 3.0


class JobControl:
    """One launcher's view of a multi-node job (a client of the job's store)."""

    def __init__(self, host: str, port: int, token: str, node_rank: int, nnodes: int,
                 timeout: float = 120.0, *, elastic: bool = False) -> None:
        from rendezvous import TCPStore

        self.node_rank = node_rank
        self.nnodes = nnodes
        self.address = f"{host}:{port}"
        self.store: TCPStore = TCPStore(host, port, token=token, timeout=timeout)
        self._claim_node_rank()
        self._next_poll = 0.0
        self._next_look = 0.0
        #: node 0's store stopped answering (host cut off, or node 0 gone): later calls
        #: return at once, so this launcher still tears its ranks down and exits in time
        self.unreachable = False
        self._lease: TCPStore | None = None
        self._published: list[str] | None = None
        if elastic and node_rank != 0:
            # on a connection of its own that makes no other call (``TCPStore.lease``)
            self._lease = TCPStore(host, port, token=token, timeout=timeout)
            self._lease.lease(KEY + f"alive/{node_rank}", "1", "0", keepalive_ms=1000)

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

    def call(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` on the store, or None once it is (or just became) unreachable."""
        if self.unreachable:
            return None
        try:
            return fn(*args)
        except Exception:  # noqa: BLE001 - node 0 gone or cut off: go on without it
            self.unreachable = True
            return None

    def report_failure(self, rank: int | str, exit_text: str, code: int) -> None:
        record = json.dumps({"rank": rank, "host": socket.gethostname(), "exit": exit_text,
                             "code": code, "node": self.node_rank})
        self.call(self.store.compare_set, KEY + "failed", "", record)

    def failure_elsewhere(self, interval: float = 0.2) -> dict | None:
        """A failure another node posted (rate-limited store round trip), or None."""
        now = time.monotonic()
        if now < self._next_poll:
            return None
        self._next_poll = now + interval
        self.call(self.store.add, KEY + f"beat/{self.node_rank}", 1)   # this launcher lives
        if not self.call(self.store.check, [KEY + "failed"]):
            return None
        raw = self.call(self.store.get, KEY + "failed")
        record = json.loads(raw) if raw else {}
        return record if record and record.get("node") != self.node_rank else None

    def abort_record(self) -> str | None:
        """The world communicator's abort record, described (the first failing collective)."""
        if not self.call(self.store.check, ["pycoll/world/abort"]):
            return None
        raw = self.call(self.store.get, "pycoll/world/abort")
        try:
            from ..runtime.abort import _parse, describe_record
            return describe_record(_parse(raw)) if raw else None
        except Exception:  # noqa: BLE001 - a report must never break the launcher
            return None

    def finish(self, wait: float, beat_timeout: float) -> None:
        """Say this node is done; node 0 keeps the store up until every node said so, or
        stopped beating for ``beat_timeout`` seconds (a launcher tearing its ranks down does
        not beat: more than its grace period), or ``wait`` seconds passed. The lease goes
        last, so that node 0 never takes a finished node for a lost one."""
        self.call(self.store.set, KEY + f"finished/{self.node_rank}", "1")
        if self.node_rank == 0:
            self.call(self._await_others, time.monotonic() + wait, beat_timeout)
        for client in (self.store, self._lease):
            try:
                if client is not None:
                    client.close()
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

    # -- elastic jobs (``ElasticJob``) -----------------------------------------------------
    def publish(self, names: list[str]) -> None:
        """This host's running processes by name (``2``, ``2'``), when they changed."""
        if names != self._published:
            self._published = names
            self.call(self.store.set, KEY + f"procs/{self.node_rank}", json.dumps(names))

    def _read(self, key: str) -> Any:
        """The JSON under ``key``, or None when it is not there (or the store is gone)."""
        if not self.call(self.store.check, [key]):
            return None
        raw = self.call(self.store.get, key)
        return json.loads(raw) if raw else None

    def lost_nodes(self) -> dict[str, dict]:
        """The hosts node 0 judged lost: node -> {"host", "names"}."""
        return self._read(KEY + "lost-nodes") or {}

    def finished(self, node: int) -> bool:
        return bool(self.call(self.store.check, [KEY + f"finished/{node}"]))

    def running_on(self, node: int, nprocs: int) -> list[str]:
        """What ``node`` runs, as it last published (before it did: its ``nprocs`` ranks)."""
        names = self._read(KEY + f"procs/{node}")
        return names if names is not None else [str(node * nprocs + i) for i in range(nprocs)]

    def others_running(self) -> list[int]:
        """The other nodes that neither finished nor were lost (node 0 waits for them)."""
        lost = self.lost_nodes()
        return [n for n in range(self.nnodes) if n != self.node_rank and str(n) not in lost
                and not self.finished(n)]

    def newly_lost(self, interval: float = 0.2) -> dict[int, dict]:
        """Node 0: the hosts whose launcher's lease says gone and that never said
        finished, each once (rate-limited to one look per ``interval``): node ->
        {"host", "names"}, also recorded under ``lost-nodes`` for the other launchers."""
        now = time.monotonic()
        if now < self._next_look:
            return {}
        self._next_look = now + interval
        lost = self.lost_nodes()
        found: dict[int, dict] = {}
        for node in range(1, self.nnodes):
            if str(node) in lost:
                continue
            alive = self.call(self.store.check, [KEY + f"alive/{node}"])
            if not alive or bytes(self.call(self.store.get, KEY + f"alive/{node}") or b"1") \
                    != b"0" or self.finished(node):
                continue            # not started yet, alive, or done (it says so first)
            holder = bytes(self.call(self.store.get, KEY + f"node/{node}") or b"?").decode()
            found[node] = {"host": holder.split(" (")[0],
                           "names": self._read(KEY + f"procs/{node}") or []}
        if found:
            lost.update({str(n): v for n, v in found.items()})
            self.call(self.store.set, KEY + "lost-nodes", json.dumps(lost))
        return found

    def waiting_joiners(self) -> int:
        """Processes waiting to join the job (``joiners.joiners_in``), 0 if the store is gone."""
        from .joiners import joiners_in
        return int(self.call(joiners_in, self.store) or 0)

    def post_result(self, result: dict[str, int]) -> None:
        self.call(self.store.set, KEY + f"result/{self.node_rank}", json.dumps(result))

    def results(self) -> list[dict[str, int]]:
        """Every other node's posted outcome, in node order (lost nodes have none)."""
        got = (self._read(KEY + f"result/{n}") for n in range(self.nnodes)
               if n != self.node_rank)
        return [r for r in got if r]


class ElasticJob(Job):
    """A job on several hosts, as one host's ``ElasticPolicy`` sees the others: their
    running processes as their launchers published them (lost and finished hosts run
    none), and the job's one restart counter."""

    def __init__(self, control: JobControl, nprocs: int, max_restarts: int) -> None:
        super().__init__(max_restarts)
        self.control = control
        self.nprocs = nprocs

    def elsewhere(self) -> tuple[int, int]:
        names = [name for n in self.control.others_running()
                 for name in self.control.running_on(n, self.nprocs)]
        return len(names), sum("'" not in name for name in names)

    def finished_elsewhere(self) -> int:
        return sum(int(r.get("finished", 0)) for r in self.control.results())

    def restarts_left(self) -> int:
        taken = self.control.call(self.control.store.add, KEY + "restarts", 0)
        return max(0, self.max_restarts - int(taken or 0)) if taken is not None else 0

    def take_restart(self) -> int | None:
        if self.max_restarts == 0:
            return None
        number = self.control.call(self.control.store.add, KEY + "restarts", 1)
        return int(number) if number is not None and number <= self.max_restarts else None
