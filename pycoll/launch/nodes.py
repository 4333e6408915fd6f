"""Several ``pycoll.run`` launchers, one per host, running one job (``--nnodes``).

The launcher of node 0 hosts the job's store; every launcher (node 0's too) talks to it
through a ``JobControl``, which is how the launchers act as one:

* node 0 picks the port of torch's own store (``MASTER_PORT`` for env:// users) and
  publishes it; the others read it, so every rank of every host gets the same one;
* the first launcher whose local rank fails posts ``{rank, host, exit}`` (first wins); every
  other launcher sees it within a poll interval, terminates its own ranks, names the failed
  rank and host, and exits non-zero;
* every launcher says when it is finished, and node 0 keeps the store up until all have.

The job secret never travels on a command line: every node's launcher reads ``PYCOLL_TOKEN``
from its own environment (or ``--token-file``) and hands it to its ranks in theirs.
"""
from __future__ import annotations

import json
import socket
import time
from typing import Any, Optional

KEY = "pycoll-run/"


class JobControl:
    """One launcher's view of a multi-node job (a client of the job's store)."""

    def __init__(self, host: str, port: int, token: str, node_rank: int, nnodes: int,
                 timeout: float = 120.0) -> None:
        from rendezvous import TCPStore

        self.node_rank = node_rank
        self.nnodes = nnodes
        self.store: Any = TCPStore(host, port, token=token, timeout=timeout)
        self._next_poll = 0.0

    def torch_port(self, pick: Optional[int]) -> int:
        """Node 0 publishes ``pick``; every node returns the published port."""
        if self.node_rank == 0:
            self.store.set(KEY + "torch-port", str(pick))
        return int(self.store.get(KEY + "torch-port"))

    def report_failure(self, rank: int, exit_text: str, code: int) -> None:
        record = json.dumps({"rank": rank, "host": socket.gethostname(), "exit": exit_text,
                             "code": code, "node": self.node_rank})
        try:
            self.store.compare_set(KEY + "failed", "", record)
        except Exception:  # noqa: BLE001 - the store may be gone with node 0: still fail here
            pass

    def failure_elsewhere(self, interval: float = 0.2) -> Optional[dict]:
        """A failure another node posted (rate-limited store round trip), or None."""
        now = time.monotonic()
        if now < self._next_poll:
            return None
        self._next_poll = now + interval
        try:
            if not self.store.check([KEY + "failed"]):
                return None
            record = json.loads(self.store.get(KEY + "failed"))
        except Exception:  # noqa: BLE001 - node 0 gone: the ranks will notice their peers
            return None
        return record if record.get("node") != self.node_rank else None

    def abort_record(self) -> Optional[str]:
        """The world communicator's abort record, described (the first failing collective)."""
        try:
            if not self.store.check(["pycoll/world/abort"]):
                return None
            from ..abort import _parse, describe_record
            return describe_record(_parse(self.store.get("pycoll/world/abort")))
        except Exception:  # noqa: BLE001 - a report must never break the launcher
            return None

    def finish(self, wait: float) -> None:
        """Say this node is done; node 0 keeps the store up until every node said so."""
        try:
            self.store.add(KEY + "finished", 1)
            if self.node_rank == 0:
                deadline = time.monotonic() + wait
                while (int(self.store.add(KEY + "finished", 0)) < self.nnodes
                       and time.monotonic() < deadline):
                    time.sleep(0.05)
        except Exception:  # noqa: BLE001 - teardown must not fail
            pass
        try:
            self.store.close()
        except Exception:  # noqa: BLE001
            pass
