"""Bootstrap: from a rendezvous store to a table of ranks and lazily opened channels.

One store round: every rank opens the transports usable here (``registry.probe_all``),
publishes one record (host, machine, pid, world size, per transport its probe record and
address) under ``hello/<rank>``; rank 0 reads them all, checks the world size, and publishes
one compact table (hosts, machines, probe records: no addresses); every rank reads that one
key. The store thus serves O(world size) bytes per rank instead of every rank reading every
record, and a rank fetches a peer's addresses only when it first talks to that peer.

``Connections`` is the channel table of a communicator *tree*: the world and every
sub-communicator made from it share it (through ``ChannelView``, which renumbers ranks), so
``split`` and ``new_group`` open no sockets and create no segments. A channel is opened on
first use; its transport is the registry's choice for that pair, which every rank computes
identically from the table.
"""
from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Sequence

from rendezvous import Store, StoreTimeout

from .. import debug, fastpath
from ..errors import InvalidArgument
from ..timeouts import watched_multi_get
from ..transports import registry
from ..transports.base import Capabilities, Channel, OpenContext, PeerInfo, Transport
from ..transports.progress import ProgressEngine, WaitPolicy
from .topology import host_identity, machine_identity


class RankTable:
    """What every rank knows about every rank after the bootstrap (no addresses)."""

    def __init__(self, hosts: list[str], machines: list[str], records: list[dict],
                 keys: list[tuple[int, int, int]]) -> None:
        self.hosts = hosts            # per rank
        self.machines = machines      # per rank
        self.records = records        # per rank: transport name -> probe record
        self.keys = keys              # per rank: (host, machine, records) indices: equal keys,
        self._infos: dict[int, PeerInfo] = {}   # equal transport choices

    @property
    def size(self) -> int:
        return len(self.hosts)

    def info(self, rank: int) -> PeerInfo:
        found = self._infos.get(rank)
        if found is None:
            found = self._infos[rank] = PeerInfo(rank, self.hosts[rank], self.machines[rank],
                                                 self.records[rank])
        return found


def _encode_table(records: list[dict], size: int) -> str:
    hosts: dict[str, int] = {}
    machines: dict[str, int] = {}
    probes: dict[str, int] = {}
    rows = []
    for rec in records:
        rows.append([hosts.setdefault(rec["host"], len(hosts)),
                     machines.setdefault(rec["machine"], len(machines)),
                     probes.setdefault(json.dumps(rec["tp"], sort_keys=True), len(probes))])
    bad = {r: rec["size"] for r, rec in enumerate(records) if rec["size"] != size}
    return json.dumps({"size": size, "bad_sizes": bad, "hosts": list(hosts),
                       "machines": list(machines), "probes": list(probes), "rows": rows})


def _decode_table(raw: str | bytes, rank: int, size: int) -> RankTable:
    t = json.loads(raw)
    if t["size"] != size or t["bad_sizes"]:
        sizes = {int(r): s for r, s in t["bad_sizes"].items()}
        sizes.setdefault(0, t["size"])
        others = sorted({s for s in sizes.values() if s != size})
        raise InvalidArgument(
            f"rank {rank}: world size mismatch at init: this rank has {size}, but ranks "
            f"{sorted(r for r, s in sizes.items() if s != size)} have {others}")
    hosts, machines = t["hosts"], t["machines"]
    probes = [json.loads(p) for p in t["probes"]]
    rows = [tuple(row) for row in t["rows"]]
    return RankTable([hosts[h] for h, _, _ in rows], [machines[m] for _, m, _ in rows],
                     [probes[p] for _, _, p in rows], rows)


def open_transports(ctx: OpenContext, names: Sequence[str],
                    records: dict[str, dict]) -> dict[str, Transport]:
    """Open every transport that probed usable (cheap: a listener, a path prefix)."""
    opened: dict[str, Transport] = {}
    try:
        for name in names:
            if name in records:
                opened[name] = registry.transport_class(name)(ctx)
    except BaseException:
        for t in opened.values():
            t.close()
        raise
    return opened


class Connections:
    """Lazily opened channels to every peer of a root communicator (shared by its groups)."""

    def __init__(self, rank: int, table: RankTable, order: Sequence[str],
                 transports: dict[str, Transport], missing: dict[str, str], store: Store,
                 timeout: float) -> None:
        self.rank = rank
        self.size = table.size
        self.table = table
        self.order = list(order)
        self.transports = transports
        self.missing = missing
        self.store = store
        self.timeout = timeout
        self.engine = ProgressEngine()
        for t in transports.values():
            self.engine.add(t)
        self.channels = ChannelMap(self._open)
        self._choice: dict[int, str] = {}
        self._addresses: dict[int, dict] = {}
        self._address_store: Store | None = None
        self._lock = threading.Lock()

    @classmethod
    def bootstrap(cls, store: Store, rank: int, size: int, *, timeout: float,
                  token: str | None, master_addr: str | None,
                  host: str | None = None,
                  watch: Callable[[], None] | None = None) -> Connections:
        """One store round: every rank publishes its hello, rank 0 builds the table, every
        rank reads it. ``watch`` (while a shrink builds a communicator of survivors) is called
        while waiting and raises when a rank the round waits for is gone."""
        deadline = time.monotonic() + timeout
        order = registry.allowed_transports()
        records, missing = registry.probe_all(order)
        if not records:
            raise InvalidArgument(f"rank {rank}: no allowed transport is usable here: "
                                  + "; ".join(f"{n}: {why}" for n, why in missing.items()))
        holder: list[Connections] = []
        ctx = OpenContext(rank, size, token, master_addr,
                          lambda name, peer: bool(holder) and holder[0].transport_for(peer) == name)
        transports = open_transports(ctx, order, records)
        try:
            # beside the transports' records, this rank's limits for the compiled one-host
            # path: every rank sees every rank's, so all agree which calls take it
            hello = {"host": host or host_identity(rank), "machine": machine_identity(),
                     "pid": os.getpid(), "size": size,
                     "tp": dict(records, fastpath=fastpath.probe_record()),
                     "addr": {n: t.address() for n, t in transports.items()}}
            store.set(f"hello/{rank}", json.dumps(hello))
            if rank == 0:
                raw = _hellos(store, size, timeout, max(0.001, deadline - time.monotonic()),
                              watch)
                recs = [json.loads(v) for v in raw]
                store.set("table", _encode_table(recs, size))
            remaining = max(0.001, deadline - time.monotonic())
            table = _decode_table(watched_multi_get(store, ["table"], remaining, watch)[0],
                                  rank, size)
            conn = cls(rank, table, order, transports, missing, store, timeout)
            holder.append(conn)
            conn.transports_in_use()    # every pair reachable, or fail now
        except BaseException:
            for t in transports.values():
                t.close()
            raise
        # Real processes per machine (virtual node layouts aside) decide how waiters spin.
        me = table.machines[rank]
        WaitPolicy.configure(sum(m == me for m in table.machines))
        for t in transports.values():
            t.configure(WaitPolicy.crowded)
        return conn

    # -- choices -----------------------------------------------------------------------------
    def transport_for(self, peer: int) -> str:
        """The registry's choice for (this rank, peer); identical on every rank."""
        name = self._choice.get(peer)
        if name is None:
            a, b = self.table.info(self.rank), self.table.info(peer)
            name = registry.choose(a, b, self.order)
            if name is None:
                raise registry.no_transport(a, b, self.order, self.missing)
            self._choice[peer] = name
        return name

    def transports_in_use(self, members: Sequence[int] | None = None) -> list[str]:
        """Every transport some pair of ``members`` (default: all ranks) uses; the same list
        on every rank. Raises, on every rank alike, if some pair has no transport at all.

        Ranks are grouped by what the choice looks at (host, machine, probe records), so the
        work grows with the number of hosts, not with the square of the world size.
        """
        table = self.table
        reps: dict[tuple, int] = {}
        counts: dict[tuple, int] = {}
        for r in (range(self.size) if members is None else members):
            key = table.keys[r]
            reps.setdefault(key, r)
            counts[key] = counts.get(key, 0) + 1
        names = set()
        keys = list(reps)
        for i, ka in enumerate(keys):
            for kb in keys[i:]:
                if ka == kb and counts[ka] < 2:
                    continue       # a lone rank needs no transport to itself
                a, b = table.info(reps[ka]), table.info(reps[kb])
                if ka == kb:       # two members of one class: like any two of them
                    b = PeerInfo(b.rank + 1, b.host, b.machine, b.records)
                name = registry.choose(a, b, self.order)
                if name is None:
                    raise registry.no_transport(a, b, self.order, self.missing)
                names.add(name)
        return [n for n in self.order if n in names]

    def capabilities_in_use(self, members: Sequence[int] | None = None) -> list[Capabilities]:
        return [registry.transport_class(n).capabilities for n in self.transports_in_use(members)]

    # -- channels ----------------------------------------------------------------------------
    def _address(self, peer: int) -> dict:
        """The peer's published addresses. Read through a store connection of our own: the
        communicator's may be held by another thread for a long blocking call (a ``split``
        waiting for ranks that first need this very channel)."""
        found = self._addresses.get(peer)
        if found is None:
            if self._address_store is None:
                from ..runtime.abort import clone_client
                self._address_store = clone_client(self.store, self.timeout)
            raw = self._address_store.get(f"hello/{peer}", timeout=self.timeout)
            found = self._addresses[peer] = json.loads(raw)["addr"]
        return found

    def _open(self, peer: int) -> Channel:
        if not 0 <= peer < self.size or peer == self.rank:
            raise KeyError(peer)
        name = self.transport_for(peer)
        address = self._address(peer)[name]       # no lock held across the store round trip
        with self._lock, self.engine.lock:
            ch = self.transports[name].connect(peer, address, time.monotonic() + self.timeout)
        debug.logger.info("channel to rank %d over %s (opened on first use)", peer, name)
        return ch

    def open_counts(self) -> dict[str, int]:
        """Channels opened so far, per transport (tcp: connected sockets)."""
        return {name: t.connections() for name, t in self.transports.items()}

    def held_memory(self) -> dict[str, dict[str, int]]:
        """Segment and registered bytes per transport (``Transport.held_memory``)."""
        with self.engine.lock:
            return {name: t.held_memory() for name, t in self.transports.items()}

    def close(self, farewell: int | None = None) -> None:
        """Close every channel; ``farewell``: the lost rank this rank leaves over, told to
        every peer (``Transport.farewell``)."""
        with self.engine.lock:
            for t in self.transports.values():
                t.farewell = farewell
                t.close()
        self.engine.close()
        self.channels.clear()
        extra, self._address_store = self._address_store, None
        if extra is not None:   # close our own connection, never the communicator's
            mine = getattr(extra, "underlying_store", extra)
            if mine is not getattr(self.store, "underlying_store", self.store):
                try:
                    mine.close()
                except Exception:   # noqa: BLE001 - teardown must not fail
                    pass


class ChannelMap(dict):
    """peer -> Channel, opening the channel on first lookup (a dict hit on the hot path)."""

    def __init__(self, opener: Callable[[int], Channel]) -> None:
        super().__init__()
        self._opener = opener

    def __missing__(self, peer: int) -> Channel:
        ch = self._opener(peer)
        self[peer] = ch
        return ch


class ChannelView(dict):
    """A sub-communicator's channels: its rank i is ``members[i]`` of the parent's table."""

    def __init__(self, parent: dict, members: Sequence[int]) -> None:
        super().__init__()
        self._parent = parent
        self._members = list(members)

    def __missing__(self, peer: int) -> Channel:
        if not 0 <= peer < len(self._members):
            raise KeyError(peer)
        ch = self._parent[self._members[peer]]
        self[peer] = ch
        return ch


def _hellos(store: Store, size: int, timeout: float, remaining: float,
            watch: Callable[[], None] | None) -> list[bytes]:
    """Every rank's hello (rank 0 waits for them), or a ``StoreTimeout`` naming the ranks
    that never joined and the usual reasons: not started, another store, another secret
    (the store's log says "authentication failed" for the last)."""
    try:
        return watched_multi_get(store, [f"hello/{r}" for r in range(size)], remaining, watch)
    except StoreTimeout as e:
        missing = [r for r in range(size) if not store.check([f"hello/{r}"])]
        shown = ", ".join(map(str, missing[:16])) + (" ..." if len(missing) > 16 else "")
        raise StoreTimeout(
            f"rank 0: init: rank(s) [{shown}] ({len(missing)} of {size}) never joined within "
            f"{timeout:g} s. Were they started, pointed at this store, and given the same job "
            f"secret (PYCOLL_TOKEN)? The store logs a client with another secret as "
            f"'authentication failed'. ({e})") from None
