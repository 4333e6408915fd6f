"""Who of a job's ranks is alive, as the store sees it: one lease per rank.

Every rank of a root communicator (size > 1, over pycoll's ``TCPStore`` or a prefix of one)
holds a *lease* (``TCPStore.lease``) on ``pycoll/<root>/alive/<rank>``: the key reads "1"
while the rank's connection to the store is open, and the store server sets it to "0" the
moment that connection closes. A process that exits or is killed closes its sockets at once
(the kernel does it, SIGKILL included); a host behind a pulled cable or powered off is found
by the server's keepalive probes (``LEASE_PROBE_MS``, about four periods).

That makes the store the failure detector of the elastic calls (``revoke``/``agree``/
``shrink``, docs/elastic.md): every rank reads the same keys, so every rank sees the same
deaths, and a live rank cut off from the store is treated as dead (it is *fenced*: the
others go on without it, and it learns so from ``Excluded`` when it next asks).

A store without leases (torch's, an in-process ``LocalStore``) falls back to what a rank can
see itself: a rank on its own host whose process has exited. A rank on another host is then
never found dead, and an agreement waits for it until its deadline.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rendezvous import Store

from .. import debug
from ..errors import PeerLost
from ..runtime.abort import clone_client
from ..transports.shm.cma import process_exited

ALIVE = b"1"
GONE = b"0"
#: how often the store server probes an idle lease's connection (the kernel's unit is 1 s)
LEASE_PROBE_MS = 1000


def alive_key(root_name: str, world_rank: int) -> str:
    return f"pycoll/{root_name}/alive/{world_rank}"


def _store_errors() -> tuple[type[BaseException], ...]:
    from rendezvous import StoreError
    return (StoreError, OSError, AttributeError)


class Lease:
    """This process's lease on ``key`` (its rank's alive key, or a joiner's), on a
    connection of its own that makes no other call (a reconnect would not renew it: the
    holder would count as gone)."""

    def __init__(self, store: Store, key: str, timeout: float) -> None:
        self.key = key
        self.client: Any = None
        try:
            client: Any = clone_client(store, timeout)
        except _store_errors() as e:
            debug.logger.info("no lease on %s: %s", self.key, e)
            return
        if client is store:          # the store cannot make a connection of its own
            return
        try:
            client.lease(self.key, ALIVE, GONE, keepalive_ms=LEASE_PROBE_MS)
        except _store_errors() as e:
            debug.logger.info("no lease on %s (the store has none): %s", self.key, e)
            _close(client)
            return
        self.client = client

    def close(self) -> None:
        """Give the lease up: the key reads "0" (the holder left)."""
        client, self.client = self.client, None
        if client is not None:
            _close(client)


def _close(client: Any) -> None:
    try:
        inner = getattr(client, "underlying_store", client)
        inner.close()
    except Exception:  # noqa: BLE001 - closing must not fail
        pass


class Membership:
    """Which members of one communicator are gone. ``members`` are the world ranks (as the
    root communicator numbers them) of the communicator's ranks, ``root_name`` names the
    root whose leases count, ``hosts``/``pids`` (per world rank) serve the fallback."""

    def __init__(self, root_name: str, members: Sequence[int], my_host: str,
                 hosts: Callable[[int], str], pids: Callable[[int], int | None]) -> None:
        self.root_name = root_name
        self.members = list(members)
        self.my_host = my_host
        self.hosts = hosts
        self.pids = pids

    def gone(self, client: Store, ranks: Sequence[int] | None = None) -> set[int]:
        """The ranks of this communicator (0 .. size-1; ``ranks``: only these) that are gone:
        their lease says so, or, without a lease, their process on this host has exited."""
        ranks = list(range(len(self.members)) if ranks is None else ranks)
        keys = self.keys(ranks)
        gone = {ranks[i] for i in gone_keys(client, keys)}
        leased = (set(ranks) if client.check(keys)
                  else {r for r, k in zip(ranks, keys) if client.check([k])})
        for r in set(ranks) - leased:
            w = self.members[r]
            pid = self.pids(w)
            if self.hosts(w) == self.my_host and pid is not None and process_exited(pid):
                gone.add(r)
        return gone

    def keys(self, ranks: Sequence[int]) -> list[str]:
        """The alive keys of ``ranks`` (of this communicator)."""
        return [alive_key(self.root_name, self.members[r]) for r in ranks]


def gone_keys(client: Store, keys: Sequence[str]) -> list[int]:
    """Which of ``keys`` (lease keys) say their holder is gone (absent keys do not). One
    round trip when every key exists (the usual case: leases are taken at init), else one
    per key."""
    if not keys:
        return []
    if client.check(list(keys)):
        values = client.multi_get(list(keys), timeout=1.0)
        return [i for i, v in enumerate(values) if bytes(v) == GONE]
    present = [i for i, k in enumerate(keys) if client.check([k])]
    values = client.multi_get([keys[i] for i in present], timeout=1.0) if present else []
    return [i for i, v in zip(present, values) if bytes(v) == GONE]


def watch_keys(client: Store, keys: Sequence[str], names: Sequence[str],
               what: str) -> Callable[[], None]:
    """A ``watch`` for ``timeouts.watched_multi_get``: raises ``PeerLost`` naming the first
    holder of ``keys`` (described by ``names``) found gone; ``what``: the wait."""
    def check() -> None:
        gone = gone_keys(client, keys)
        if gone:
            raise PeerLost(f"{what}: {names[gone[0]]} is gone (its store lease was lost)",
                           peer=None)
    return check
