"""The communicator: it owns a group of ranks' state and offers the collectives.

A ``Communicator`` is made of parts it owns and hands to each other, nothing inherited but
what the collectives compute (``Collectives``, ``FusedCollectives``: stateless, written
against the parts):

* ``bootstrap.Connections``: the rank table and the lazily opened channels of a communicator
  tree (the world and every group made from it share one, renumbering ranks);
* ``planning.Planner``: argument checks, memory-type routing and algorithm choice, all
  before any byte moves;
* ``runtime.execution.Execution``: sequence numbers, tags, the flight recorder, inline or
  queued runs, deadlines, and (through ``runtime.failures.Failures``) what happens on
  failure;
* ``fastpath.runner.FastPath``: the compiled one-host path, given the execution, the peers
  and the memory ops, and nothing else of the communicator;
* ``topology``: which ranks share a node, for the hierarchical algorithms.

Every collective method is a collective: all ranks of the communicator call it in the same
order.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import numpy as np

from rendezvous import Store, StoreError

from .. import debug, fastpath
from ..algorithms import ALGORITHMS, link_probe
from ..algorithms.cost import Hierarchy, LinkModel
from ..algorithms.primitives import Peers
from ..algorithms.selection import Selector
from ..buffers.memops import HostOps
from ..envvars import env_bool, env_int
from ..errors import (
    CollectiveMismatch,
    CollectiveTimeout,
    InvalidArgument,
    PycollError,
    TransportError,
)
from ..fastpath.runner import FastPath
from ..runtime.execution import Execution
from ..runtime.failures import Failures
from ..runtime.flight_recorder import FlightRecorder, capacity_from_env
from ..runtime.metrics import Tally, openmetrics
from ..runtime.status import snapshot
from ..tags import SEQ_MASK, SEQ_SHIFT
from ..timeouts import as_seconds
from ..transports import registry
from ..transports.base import Channel, Request
from ..transports.progress import WaitTimeout
from . import lobby, metrics, status
from .bootstrap import ChannelView, Connections
from .collectives import Collectives
from .fused import FusedCollectives
from .groups import GroupMaker
from .integrity import sample_every
from .membership import Lease, Membership, alive_key, gone_keys
from .persistent import PersistentCollectives
from .planning import Planner, reduction_defaults
from .recovery import Elastic, base_name
from .topology import hierarchy_members, host_identity, is_uniform, node_layout, ring_crossings
from .variants import VariantCollectives
from .windows import Window, open_window

DEFAULT_TIMEOUT = 300.0
#: how long a failed communicator's finalize tries to reach the store (it may be cut off)
FAILED_FINALIZE_SECONDS = 2.0
#: how long finalize (or a shrink, a grow) waits for every rank to publish a last one-way
#: broadcast (to check it)
SETTLE_AT_FINALIZE_SECONDS = 5.0

Timeout = float | timedelta | None


class Communicator(Collectives, FusedCollectives, VariantCollectives, PersistentCollectives):
    """A group of ranks that run collectives together.

    Create one with ``pycoll.init()`` (the world), ``Communicator.create`` (any store), or
    ``split`` / ``new_group`` of an existing one. Every method is a collective: all ranks of
    the communicator must call it in the same order.
    """

    def __init__(self, rank: int, size: int, *, store: Store | None = None, name: str = "world",
                 connections: Connections | None = None, members: Sequence[int] | None = None,
                 timeout: float = DEFAULT_TIMEOUT, owns_store: bool = False,
                 token: str | None = None, master_addr: str | None = None,
                 hosts: Sequence[str] | None = None, comm_id: int = 0,
                 root_name: str | None = None, deterministic: bool | None = None,
                 accumulate: str | None = None, compress: str | None = None,
                 lease: Lease | None = None,
                 watch: Callable[[], None] | None = None) -> None:
        self.rank = rank
        self.size = size
        self.name = name
        self.timeout = float(timeout)
        self._store = store
        self._owns_store = owns_store
        self._conn = connections
        self._is_root = members is None
        #: whether finalize closes the channels: a root's own, or a shrink's successor's
        #: that shares its predecessor's (``_release`` hands them over)
        self._owns_conn = self._is_root
        self._members = list(range(size)) if members is None else list(members)
        self._token = token
        self._master_addr = master_addr
        # Message tags carry the communicator's id: a root is 0, every group of the tree gets
        # a distinct one (allocated through the store), so groups sharing channels never
        # match each other's messages.
        self._comm_id = comm_id
        self._root_name = root_name or name
        # 0: each transport's own segment size; PYCOLL_SEGMENT_BYTES overrides it job-wide
        self._segment_bytes = (env_int("PYCOLL_SEGMENT_BYTES", 0, minimum=1)
                               if os.environ.get("PYCOLL_SEGMENT_BYTES", "").strip() else 0)
        self._ops = HostOps()
        self._hosts = list(hosts or [host_identity()] * size)
        self._layout = node_layout(self._hosts)
        self._hier: dict[str, Peers | None] = {}
        caps = connections.capabilities_in_use(self._members) if connections else []
        self._plan = Planner(rank, size, Selector(ALGORITHMS, caps,
                                                  hierarchy=self._hierarchy_model()), caps,
                             **reduction_defaults(deterministic, accumulate, compress))
        capacity = capacity_from_env()
        failures = Failures(rank, size, name, store, token, self.timeout,
                            self.transport_summary,
                            FlightRecorder(capacity) if capacity else None,
                            world_rank=self._members[rank])
        #: what a ``with`` block around the communicator raised (posted at finalize)
        self._exit_error: BaseException | None = None
        channels: dict[int, Channel]
        if connections is not None:
            channels = (connections.channels if self._is_root
                        else ChannelView(connections.channels, self._members))
            engine = connections.engine
        else:
            from ..transports.progress import ProgressEngine
            channels, engine = {}, ProgressEngine()
        self._peers = Peers(rank, size, channels, 0.0, self._segment_bytes, self._ops, engine,
                            check=failures.check, layout=self._layout, subgroup=self._subgroup,
                            absent=self._absent_peers if failures.abort is not None else None)
        self._exec = Execution(rank, size, name, self.timeout, comm_id, self._peers, failures)
        self._groups: GroupMaker[Communicator] = GroupMaker(
            rank, size, name, store, self._root_name, self._exec, self._plan.check_rank,
            self._child)
        #: this rank's lease on its alive key (root communicators over pycoll's store)
        self._lease = lease
        membership = (Membership(self._root_name, self._members, self._hosts[rank],
                                 lambda w: connections.table.hosts[w],
                                 lambda w: connections.table.records[w].get("pid"))
                      if connections is not None and store is not None else None)
        self._elastic: Elastic[Communicator] = Elastic(
            rank, size, name, store, self._exec, failures, membership, self._make_successor,
            self._release, {"deterministic": self.deterministic, "accumulate": self.accumulate,
                            "compress": self.compress},
            quiet=self._quiet, draw_id=self._groups.draw_id)
        #: made by shrink or grow: each rank's number in the communicator this one replaced
        #: (None: a joiner); None otherwise
        self.previous_ranks: list[int | None] | None = None
        self._fast = self._fast_path(watch)
        self._integrity_every = sample_every()
        #: this rank's status port (root communicators over a store, ``comm/status.py``)
        self._status: status.Responder | None = None
        self._metrics: metrics.MetricsServer | None = None
        self._tallies: dict[int, tuple[Execution, Tally]] = {}
        #: rank 0's straggler survey for the metrics page (``_metrics_text``)
        self._survey_cache: status.SurveyCache | None = None
        self._straggler_log: status.StragglerLog | None = None
        #: the open windows (``window``): invalidated when this communicator is finalized
        #: or replaced by a shrink or grow
        self._windows: list[Window] = []
        self._windows_made = 0

    def _fast_path(self, watch: Callable[[], None] | None) -> FastPath | None:
        """The compiled one-host path, when every member shares this host and one transport
        whose capabilities allow it (``Capabilities.fast_path``), and can run it (each rank's
        limits are in its bootstrap record, so every rank decides alike)."""
        conn = self._conn
        if conn is None or self._store is None or len(set(self._hosts)) != 1:
            return None
        try:
            used = conn.transports_in_use(self._members)
        except PycollError:
            return None
        if len(used) != 1 or not registry.transport_class(used[0]).capabilities.fast_path:
            return None
        records = [conn.table.records[m].get("fastpath", {}) for m in self._members]
        limit, chunked, cma = fastpath.agreed_limits(records, self.size)
        if not limit:
            off = [r for r, rec in enumerate(records) if not rec.get("fast")]
            declared = any(rec.get("alone") for rec in records)   # no numba to blame
            if off and off[0] == self.rank and self._is_root and not declared:
                fastpath.warn_if_missing(len(off), self.size)
            return None
        from rendezvous import PrefixStore

        from ..fastpath.segment import SharedSlots
        # made now, while every member is here: a lazy segment would make the first fast
        # call wait for rank 0, which a rank stuck in another call never lets happen
        slots = SharedSlots.setup(PrefixStore(f"pycoll/{self.name}/fastpath/", self._store),
                                  self.rank, self.size, limit, self.timeout, watch)
        if slots is None:
            return None
        return FastPath(self._exec, self._peers, self._members, self._ops, limit, chunked, cma,
                        slots)

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def create(cls, store: Store | None, rank: int, size: int, *, name: str = "world",
               timeout: Timeout = DEFAULT_TIMEOUT, token: str | None = None,
               master_addr: str | None = None, owns_store: bool = False,
               host: str | None = None, deterministic: bool | None = None,
               accumulate: str | None = None, compress: str | None = None,
               watch: Callable[[], None] | None = None) -> Communicator:
        """Join ``size`` ranks that share ``store``; every rank calls this collectively.

        One store round (see ``bootstrap``); no connection is opened until a collective
        needs it. ``host`` is this rank's node identity (default: detected).
        ``deterministic`` and ``accumulate``: the defaults of this communicator's reducing
        calls (default ``PYCOLL_DETERMINISTIC``, ``PYCOLL_ACCUMULATE``; docs/numerics.md).
        ``watch``: called while the store round waits, raises when it is hopeless (a
        shrink's build: a survivor died).
        """
        limit = as_seconds(timeout) or DEFAULT_TIMEOUT
        if (isinstance(size, bool) or isinstance(rank, bool) or size < 1
                or not 0 <= rank < size):
            raise InvalidArgument(f"rank {rank} is outside a world of size {size}")
        debug.configure(rank)
        numerics = reduction_defaults(deterministic, accumulate, compress)
        if size == 1:
            return cls(rank, 1, store=store, name=name, timeout=limit, owns_store=owns_store,
                       token=token, master_addr=master_addr, **numerics)
        if store is None:
            raise InvalidArgument(f"rank {rank}: a communicator of {size} ranks needs a store "
                                  "every rank shares (rendezvous.TCPStore, LocalStore, or "
                                  "torch's through pycoll.launch.torch_store)")
        from rendezvous import PrefixStore

        scoped = PrefixStore(f"pycoll/{name}/", store)
        # before the store round: once anyone can see this communicator, its ranks' deaths
        # are visible to the elastic calls (comm/membership.py)
        lease = Lease(store, alive_key(name, rank), limit)
        try:
            conn = Connections.bootstrap(scoped, rank, size, timeout=limit, token=token,
                                         master_addr=master_addr, host=host, watch=watch)
        except BaseException:
            lease.close()
            raise
        debug.logger.info("communicator %s: %d ranks; transports in use: %s; allowed: %s",
                          name, size, ", ".join(conn.transports_in_use()) or "none",
                          ", ".join(conn.order))
        try:
            comm = cls(rank, size, store=store, name=name, connections=conn, timeout=limit,
                       owns_store=owns_store, hosts=conn.table.hosts, token=token,
                       master_addr=master_addr, lease=lease, watch=watch, **numerics)
            comm._measure_links(scoped, limit, watch)
            address = comm.store_address
            if address is not None:    # a store others can reach: a port they can ask
                comm._status = status.start(store, address, name, rank, size, token,
                                            comm.status)
                comm._straggler_log = status.start_log(address, name, rank, token)
            comm._metrics = metrics.start(store, name, rank, comm._metrics_text)
            return comm
        except BaseException:   # a failing constructor must not leak open transports
            conn.close()
            lease.close()
            raise

    # -- groups (comm/groups.py) ------------------------------------------------------------
    def split(self, color: int | None, key: int = 0, *, name: str | None = None,
              timeout: Timeout = None) -> Communicator | None:
        """Collectively split into communicators of the ranks that passed the same ``color``.

        Ranks are ordered by ``key`` (then by rank) in the new communicator; ``color=None``
        (or negative) opts out and returns None. Like ``MPI_Comm_split``. The new
        communicator shares this one's channels (no new sockets or segments); its messages
        carry its own id, so collectives on different communicators never interfere.
        """
        limit = as_seconds(timeout, "timeout") or self.timeout
        self._raise_unsettled(limit, quiet=False)
        return self._groups.split(color, key, name, limit)

    def subgroup(self, ranks: Sequence[int], *, name: str,
                 timeout: Timeout = None) -> Communicator:
        """A communicator of ``ranks`` (this communicator's ranks, in that order) that only
        its members call, each with the same ``ranks`` and ``name``.

        What ``split`` makes (shared channels, its own message id, finalized with this
        communicator) without a round over every rank: the members agree on the group's id
        through the store, under a key made from ``name``. For callers that create groups on
        members only, as torch.distributed calls a backend; ``name`` must be unique among
        this communicator's subgroups and the same on every member (torch's group name).
        """
        return self._groups.subgroup(ranks, name,
                                     as_seconds(timeout, "timeout") or self.timeout)

    def _child(self, members: Sequence[int], name: str, comm_id: int,
               limit: float) -> Communicator:
        """The group of ``members`` (ranks of this communicator) over this communicator's
        channels, for ``GroupMaker``: it shares the channels and never closes them."""
        child = Communicator(members.index(self.rank), len(members), store=self._store,
                             name=name, connections=self._conn,
                             members=[self._members[m] for m in members], timeout=limit,
                             token=self._token, master_addr=self._master_addr,
                             hosts=[self._hosts[m] for m in members], comm_id=comm_id,
                             root_name=self._root_name, deterministic=self.deterministic,
                             accumulate=self.accumulate, compress=self.compress)
        # From now on two communicators (maybe two threads) share the channels.
        self._peers.engine.share(self._exec.executor.idle())
        return child

    # -- elastic (comm/recovery.py, comm/lobby.py, docs/elastic.md) ------------------------
    def revoke(self, reason: str = "") -> None:
        """Revoke this communicator: every pending and later call on it raises ``Revoked``
        on every rank that can still be reached (a waiting rank within
        ``PYCOLL_ABORT_POLL_MS``), naming this rank and ``reason``. Not collective: any rank
        may call it, once or more. A failed collective revokes its communicator by itself.
        """
        self._elastic.revoke(str(reason) or f"rank {self.rank} called revoke()")

    def agree(self, flag: int = 1, *, timeout: Timeout = None) -> tuple[int, frozenset[int]]:
        """A fault-tolerant agreement (ULFM's ``MPIX_Comm_agree``), also on a failed or
        revoked communicator: every surviving rank returns the same ``(value, gone)``:
        ``value`` the bitwise AND of the flags of the ranks that took part, ``gone`` the
        ranks (of this communicator) known dead, even when ranks die during the agreement.
        Collective over the live ranks; it ends once each rank took part or died, or raises
        ``CollectiveTimeout`` naming the ranks that did neither. ``Excluded`` on a rank the
        others found gone (cut off from the store)."""
        return self._elastic.agree(flag, as_seconds(timeout, "timeout") or self.timeout)

    def shrink(self, exclude: Sequence[int] = (), *, timeout: Timeout = None) -> Communicator:
        """A new communicator of the surviving ranks: every rank not known dead and not in
        ``exclude``, renumbered in order (like ``MPIX_Comm_shrink``, ``ncclCommShrink``).

        Call it on every surviving rank after a collective failed (``PeerLost``,
        ``Aborted``, ``Revoked``), or on a working communicator to drop ranks (``exclude``,
        the same list on every caller; excluded ranks do not call it). It revokes this
        communicator, agrees on who is gone, builds the new communicator (its channels,
        fast path and cost model) and checks that every survivor has it; a rank that dies
        meanwhile is left out by a new attempt. This communicator and its groups then refuse
        every call with ``Revoked``. A rank the others found gone gets ``Excluded``."""
        limit = as_seconds(timeout, "timeout") or self.timeout
        self._raise_unsettled(min(limit, SETTLE_AT_FINALIZE_SECONDS), quiet=True)
        return self._elastic.shrink(exclude, limit)

    def grow(self, count: int | None = None, *, timeout: Timeout = None) -> Communicator:
        """A new communicator of this one's ranks (same numbers) plus processes waiting to
        join (``Communicator.join`` / ``pycoll.init(join=True)``), numbered after them in
        arrival order. Collective over this communicator's ranks, which must all be alive
        (``shrink`` first). ``count``: admit that many, waiting for them until ``timeout``;
        None: admit whoever waits now, and return this communicator itself when nobody
        does (cheap enough to call every few steps). Like shrink, it commits only when every
        participant built the new communicator; this one and its groups are then revoked."""
        limit = as_seconds(timeout, "timeout") or self.timeout
        self._raise_unsettled(min(limit, SETTLE_AT_FINALIZE_SECONDS), quiet=True)
        grown = lobby.grow(self._elastic, count, limit)
        return self if grown is None else grown

    def joiners_waiting(self) -> int:
        """How many processes wait to join (``join``) this communicator's family now: one
        look at the store, not collective (ranks may see different counts: let ``grow``,
        which agrees, decide)."""
        return lobby.waiting(self._elastic)

    @classmethod
    def join(cls, store: Store, *, name: str = "world", timeout: Timeout = DEFAULT_TIMEOUT,
             token: str | None = None, master_addr: str | None = None,
             host: str | None = None) -> Communicator:
        """Join a running job's communicator ``name`` (its base name: "world" also finds
        "world~3") from a new process: wait until its ranks call ``grow``, then return the
        grown communicator (this process's rank follows theirs)."""

        limit = as_seconds(timeout) or DEFAULT_TIMEOUT

        def make(rank: int, size: int, full_name: str, watch: Callable[[], None],
                 extra: dict) -> Communicator:
            return cls.create(store, rank, size, name=full_name, timeout=limit, token=token,
                              master_addr=master_addr, host=host, watch=watch,
                              **extra.get("numerics", {}))

        return lobby.join(store, base_name(name), make, limit)

    def _absent_peers(self, world_ranks: list[int]) -> list[int]:
        """Which of ``world_ranks`` the store's leases say are gone (``Peers.absent``)."""
        abort = self._exec.failures.abort
        if abort is None:
            return []
        try:
            keys = [alive_key(self._root_name, w) for w in world_ranks]
            return [world_ranks[i] for i in gone_keys(abort.client(), keys)]
        except (StoreError, OSError) as e:
            debug.logger.info("lease check failed (%s); the deadline decides", e)
            return []

    def _make_successor(self, rank: int, size: int, name: str, watch: Callable[[], None],
                        extra: dict) -> Communicator:
        """The communicator a shrink or grow builds. A shrink whose ranks all were quiet
        (``extra["share"]``: ``comm/recovery.py``) makes it over this communicator's channels,
        as a group of the survivors with a fresh message id (its own fast path and cost
        model; no new socket or channel segment). Otherwise a fresh bootstrap among its
        ranks, new channels included: a failed call leaves the pairs it used out of step."""
        if extra.get("share") and self._conn is not None:
            previous = extra["previous"]
            return Communicator(rank, size, store=self._store, name=name,
                                connections=self._conn,
                                members=[self._members[p] for p in previous],
                                timeout=self.timeout, token=self._token,
                                master_addr=self._master_addr,
                                hosts=[self._hosts[p] for p in previous],
                                comm_id=int(extra["comm_id"]), root_name=self._root_name,
                                deterministic=self.deterministic, accumulate=self.accumulate,
                                compress=self.compress, watch=watch)
        return Communicator.create(self._store, rank, size, name=name, timeout=self.timeout,
                                   token=self._token, master_addr=self._master_addr,
                                   host=self._hosts[self.rank], watch=watch,
                                   deterministic=self.deterministic, accumulate=self.accumulate,
                                   compress=self.compress)

    def _quiet(self) -> bool:
        """Never failed and nothing in flight, here and in every group made from here: the
        channels are in step, a shrink may share them."""
        return all(c._exec.failed is None and not c._exec.executor.busy()
                   for c in [self, *self._groups.children] if not c.closed)

    def _release(self, successor: Communicator) -> None:
        """A shrink or grow replaced this communicator by ``successor``: its groups are
        revoked too, its segments and store client are let go, its channels and lease too
        unless the successor shares them (they pass to it, as the store server it may host
        does: the successor shuts them down at its finalize)."""
        revoked = self._exec.failed
        self._invalidate_windows("belongs to a communicator that a shrink or grow replaced")
        for child in self._groups.children:
            if child._exec.failed is None:
                child._exec.failed = revoked
            child._release(successor)
        self._groups.children.clear()
        successor._owns_store, self._owns_store = self._owns_store, False
        self._exec.close()           # finalize has nothing left to do
        if self._fast is not None:
            self._fast.close()
        if self._owns_conn and self._conn is not None:
            if successor._conn is self._conn:        # shared: the channels and lease go on
                successor._owns_conn = True
                successor._lease, self._lease = self._lease, None
            else:
                self._conn.close()
            self._owns_conn = False
        self._exec.failures.close()
        self._close_status()
        if self._lease is not None:
            self._lease.close()

    # -- one-sided windows (docs/windows.md) -------------------------------------------------
    def window(self, buffer: Any, *, timeout: Timeout = None) -> Window:
        """Collective: expose ``buffer`` (host memory; every rank the same dtype, sizes
        may differ) as this rank's part of a one-sided window, and return the ``Window``
        through which any rank puts into, gets from and accumulates into any rank's part."""
        self._windows_made += 1
        win = open_window(self, buffer, self._windows_made, as_seconds(timeout, "timeout"))
        self._windows.append(win)
        return win

    def allocate_window(self, count: int, dtype: Any = "float32", *,
                        timeout: Timeout = None) -> Window:
        """Collective: as ``window``, on ``count`` zeroed elements of ``dtype`` that pycoll
        allocates (MPI's ``Win_allocate``), readable and writable as the window's ``local``.
        Where ranks share a host (shm) the memory is one that peers map, so a put or get
        between them is a plain copy (docs/windows.md)."""
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
            raise InvalidArgument(f"rank {self.rank}: allocate_window: count={count!r} must "
                                  "be an integer >= 0")
        try:
            np_dtype = np.dtype(dtype)
        except TypeError:
            raise InvalidArgument(f"rank {self.rank}: allocate_window: dtype={dtype!r} is not "
                                  "a numpy dtype") from None
        self._windows_made += 1
        win = open_window(self, None, self._windows_made, as_seconds(timeout, "timeout"),
                          allocate=(int(count), np_dtype))
        self._windows.append(win)
        return win

    def window_progress(self, post: Callable[[], tuple[list[Request], list[Request]]],
                        deadline: float) -> None:
        """``transports.base.WindowProgress`` for this communicator's windows: run between
        its calls (never inside one: a call on the worker thread may be waiting on the same
        channels), post, progress every transport until the awaited requests are done, and
        withdraw what of the rest is still pending (a get's bytes a refusal never sent; on
        a timeout, the reply: a late one is then held and ignored)."""
        idle = self._exec.idle
        if not idle.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise CollectiveTimeout(f"rank {self.rank}: a window operation waited for a call "
                                    f"of communicator {self.name} to end past its deadline")
        engine = self._peers.engine
        reqs: list[Request] = []
        try:
            with engine.lock:
                reqs, awaited = post()
            try:
                engine.wait(awaited, deadline, self._exec.failures.check)
            except WaitTimeout as e:
                raise CollectiveTimeout(
                    f"deadline passed waiting for peer rank(s) {e.peers} to answer: over tcp "
                    "a target serves window requests only while it is inside a pycoll call "
                    "(docs/windows.md); is it computing, or stuck?") from None
        finally:
            try:
                with engine.lock:
                    for req in reqs:
                        if req.done:
                            continue
                        matcher = req.channel.matcher
                        if req.kind == "recv" and req in matcher.posted:
                            matcher.posted.remove(req)     # nothing of it landed
                            req.fail(TransportError("withdrawn", peer=req.channel.peer))
                        else:       # half moved: the pair is out of step
                            req.channel.abandon(TransportError(
                                f"rank {self.rank}: a window operation with peer rank "
                                f"{req.channel.peer} ended with bytes still in flight; the "
                                "pair is closed", peer=req.channel.peer))
            finally:
                idle.release()

    def serve_windows(self) -> None:
        """One progress pass, unless a call runs (it progresses already): what a waiting
        ``Window.wait_signal`` does so that tcp's origins are served meanwhile."""
        idle = self._exec.idle
        if idle.acquire(blocking=False):
            try:
                self._peers.engine.progress()
            finally:
                idle.release()

    def forget_window(self, win: Window) -> None:
        """A window was closed or invalidated (``Window.invalidate`` calls it)."""
        if win in self._windows:
            self._windows.remove(win)

    def _invalidate_windows(self, why: str) -> None:
        for win in list(self._windows):
            win.invalidate(why)

    def new_group(self, ranks: Sequence[int], *, timeout: Timeout = None) -> Communicator | None:
        """A communicator of ``ranks`` (this communicator's ranks, in that order).

        Every rank of this communicator must call it (members and non-members alike), in
        the same order as other group creations; non-members get None.
        """
        ranks = [self._plan.check_rank(r, "ranks", "new_group") for r in ranks]
        if len(set(ranks)) != len(ranks):
            raise InvalidArgument(f"rank {self.rank}: new_group: ranks {ranks} has duplicates")
        member = self.rank in ranks
        return self.split(0 if member else None, ranks.index(self.rank) if member else 0,
                          timeout=timeout)

    # -- introspection -----------------------------------------------------------------------
    def get_rank(self) -> int:
        return self.rank

    def get_world_size(self) -> int:
        return self.size

    def transport_of(self, peer: int) -> str:
        """The transport that serves ``peer`` (the same answer on both ranks)."""
        if self._conn is None:
            raise InvalidArgument(f"rank {self.rank}: a world of one has no peers")
        self._plan.check_rank(peer, "peer", "transport_of")
        return self._conn.transport_for(self._members[peer])

    @property
    def store_address(self) -> tuple[str, int] | None:
        """(host, port) of the store this communicator bootstrapped through; None for a store
        without one (an in-process ``LocalStore``, a torch store behind an adapter)."""
        host, port = getattr(self._store, "host", None), getattr(self._store, "port", None)
        return (host, int(port)) if host is not None and port is not None else None

    def status(self) -> dict[str, Any]:
        """What this rank is doing now, as ``python -m pycoll.status`` shows it: host, pid,
        transports, and the state of this communicator and of its groups (each a
        ``runtime.status.snapshot``; docs/observability.md). Safe to call from any thread:
        it only reads what the call path keeps anyway."""
        comms = [snapshot(self._exec)]
        comms += [snapshot(child._exec) for child in list(self._groups.children)]
        return {"rank": self.rank, "size": self.size, "host": self._hosts[self.rank],
                "pid": os.getpid(), "transport": self.transport_summary(),
                "communicators": comms}

    def stats(self, timeout: float = 2.0) -> dict[str, Any]:
        """The job's persistent stragglers, as ``python -m pycoll.status`` names them:
        ``{"stragglers": [{"rank", "collective", "calls", "late_fraction",
        "median_late_ms"}], "ranks": [a row per rank]}`` for this communicator's root.

        Not collective: it asks every rank's status port (``comm/status.py``; each answers
        from a thread of its own, in ``timeout`` seconds at most), so any rank may call it at
        any time, and it costs a round of queries (docs/observability.md).
        """
        if self._store is None or self.size == 1:
            return {"stragglers": [], "ranks": []}
        size, rows = status.survey(self._store, self._root_name, self._token, timeout)
        found = status.stragglers(rows, size)
        for row in rows:
            row.pop("communicators", None)
        return {"stragglers": found, "ranks": rows}

    def _metrics_text(self) -> str:
        """The metrics endpoint's page (``comm/metrics.py``): this communicator and its
        groups, tallied now from their flight recorders; on rank 0, the job's stragglers."""
        # the live communicators only: a group finalized or dropped leaves the page (and
        # its execution is not kept alive by it)
        tallies = {}
        for ex in [self._exec] + [c._exec for c in list(self._groups.children) if not c.closed]:
            kept = self._tallies.get(id(ex))
            tallies[id(ex)] = kept if kept is not None and kept[0] is ex else (ex, Tally())
        self._tallies = tallies
        found = None
        address = self.store_address
        if self.rank == 0 and address is not None and env_bool("PYCOLL_STATUS", True):
            if self._survey_cache is None:
                root, token = self._root_name, self._token
                self._survey_cache = status.SurveyCache(
                    lambda: status.job_stragglers(address, root, token),
                    status.METRICS_SURVEY_SECONDS)
            found = self._survey_cache.get()
        return openmetrics(self.rank, list(tallies.values()), found)

    def _close_status(self) -> None:
        log, self._straggler_log = self._straggler_log, None
        if log is not None:
            log.close()
        server, self._metrics = self._metrics, None
        if server is not None:
            server.close()
        responder, self._status = self._status, None
        if responder is not None:
            responder.close()

    def transport_summary(self) -> str:
        """E.g. "shm" or "shm(3 peers), tcp(4 peers)"; "none" for a world of one."""
        counts: dict[str, int] = {}
        for p in range(self.size):
            if p != self.rank:
                t = self.transport_of(p)
                counts[t] = counts.get(t, 0) + 1
        if not counts:
            return "none"
        if len(counts) == 1:
            return next(iter(counts))
        return ", ".join(f"{t}({n} peers)" for t, n in sorted(counts.items()))

    def channel(self, peer: int) -> Channel:
        """The channel to ``peer``, opened on first use (transport tests and diagnostics;
        collectives never need it)."""
        self._plan.check_rank(peer, "peer", "channel")
        if peer == self.rank:
            raise InvalidArgument(f"rank {self.rank}: no channel to itself")
        return self._peers.channels[peer]

    def open_channels(self) -> dict[str, int]:
        """Channels opened so far by this communicator tree, per transport (tcp: connected
        sockets). Connections are lazy: a peer gets one when an algorithm first uses it."""
        return self._conn.open_counts() if self._conn is not None else {}

    def held_memory(self) -> dict[str, dict[str, int]]:
        """Bytes held for communication on this rank, per transport (the whole communicator
        tree's channels, as ``open_channels``), plus ``fastpath``: this communicator's own
        shared segment. Each entry: ``segment`` (shared memory mapped) and ``registered``
        (memory registered with a NIC or exposed to one-sided puts)."""
        held = self._conn.held_memory() if self._conn is not None else {}
        if self._fast is not None:
            held["fastpath"] = {"segment": self._fast.segment_bytes(), "registered": 0}
        return held

    def topology_summary(self) -> str:
        """E.g. "2 nodes x 4 ranks" or "1 node"."""
        nodes = {n for n, _ in self._layout}
        if len(nodes) == 1:
            return "1 node"
        return (f"{len(nodes)} nodes x {self.size // len(nodes)} ranks" if is_uniform(self._layout)
                else f"{len(nodes)} nodes (uneven)")

    # -- hierarchy ---------------------------------------------------------------------------
    def _hierarchy_model(self) -> Hierarchy | None:
        """The two-level cost model, when the layout is several equal nodes."""
        if self._conn is None or not is_uniform(self._layout):
            return None
        node = hierarchy_members(self._layout, 0, "node")
        cross = hierarchy_members(self._layout, 0, "cross")
        table, order = self._conn.table, self._conn.order
        m = self._members
        intra = registry.choose(table.info(m[node[0]]), table.info(m[node[1]]), order)
        inter = registry.choose(table.info(m[cross[0]]), table.info(m[cross[1]]), order)
        if intra is None or inter is None:
            return None
        caps = registry.transport_class
        return Hierarchy(len(cross), len(node),
                         LinkModel.from_capabilities([caps(intra).capabilities]),
                         LinkModel.from_capabilities([caps(inter).capabilities]))

    def _measure_links(self, store: Store, limit: float,
                       watch: Callable[[], None] | None = None) -> None:
        """On several equal nodes, feed the cost model measured (or declared) intra- and
        inter-node links (``link_probe``): what decides flat against hierarchical."""
        model = self._plan.selector.hierarchy
        if model is None or not link_probe.enabled():
            return
        links = link_probe.probe_links(self._peers, store, self.rank, self._layout,
                                       self._comm_id, limit, watch)
        intra = replace(model.intra, alpha=links["intra"].alpha, beta=links["intra"].beta)
        inter = replace(model.inter, alpha=links["inter"].alpha, beta=links["inter"].beta)
        self._plan.selector.hierarchy = replace(model, intra=intra, inter=inter)
        # flat algorithms cross the slowest link; a flat ring's edges between nodes share
        # each node's network link (several of them when ranks are placed round-robin)
        shared = ring_crossings(self._layout)
        self._plan.selector.link = replace(
            self._plan.selector.link, alpha=max(intra.alpha, inter.alpha),
            beta=max(intra.beta, inter.beta * shared))
        debug.logger.info("links measured: inside a node %.1f us, %.2f GB/s; between nodes "
                          "%.1f us, %.2f GB/s (a flat ring crosses each node's link %d times)",
                          intra.alpha * 1e6, links["intra"].gbps, inter.alpha * 1e6,
                          links["inter"].gbps, shared)

    def _subgroup(self, kind: str) -> Peers | None:
        """Node-local (``"node"``) or cross-node (``"cross"``) peers for hierarchical
        algorithms: a renumbered view of this communicator's channels, made locally (every
        rank knows the layout), with the running call's deadline and tag."""
        if kind not in self._hier:
            sub = None
            if is_uniform(self._layout):
                members = hierarchy_members(self._layout, self.rank, kind)
                sub = Peers(members.index(self.rank), len(members),
                            ChannelView(self._peers.channels, members), 0.0, self._segment_bytes,
                            self._ops, self._peers.engine, check=self._exec.failures.check)
            self._hier[kind] = sub
        sub = self._hier[kind]
        if sub is not None:
            sub.deadline, sub.tag = self._peers.deadline, self._peers.tag
            sub.posted = self._peers.posted      # a failure abandons these requests too
        return sub

    # -- state ------------------------------------------------------------------------------
    @property
    def deterministic(self) -> bool:
        """Whether this communicator's reducing calls fold in rank order by default
        (``deterministic=`` of ``init``/``create``, ``PYCOLL_DETERMINISTIC``)."""
        return self._plan.deterministic

    @property
    def accumulate(self) -> str:
        """How half-precision sums accumulate by default: "fp32" or "dtype"."""
        return self._plan.accumulate

    @property
    def compress(self) -> str | None:
        """The wire format of float sums, allgathers and broadcasts by default
        (``compress=`` of ``init``/``create``, ``PYCOLL_COMPRESS``; None: the buffers' own
        bytes; docs/numerics.md)."""
        return self._plan.compress

    @property
    def seq(self) -> int:
        """Collectives started on this communicator so far (the last one's number, as
        errors and the flight recorder name it; point-to-point calls count apart)."""
        return self._exec.seq

    @property
    def failed(self) -> BaseException | None:
        """The error that failed this communicator (None while it works); once set, every
        call is refused: create a new communicator."""
        return self._exec.failed

    @property
    def closed(self) -> bool:
        """Whether ``finalize`` has run (every later call is refused)."""
        return self._exec.closed

    def on_worker_thread(self) -> bool:
        """Whether the calling thread is this communicator's worker, where asynchronous
        calls run and the callbacks of their work handles too (a callback there must not
        wait on a later call of the same communicator)."""
        return self._exec.on_worker()

    def dump_flight_recorder(self, reason: str = "requested") -> str | None:
        """Write the flight recorder's dump now (e.g. from a signal handler); its path (None
        when recording is off, ``PYCOLL_FLIGHT_RECORDER=0``)."""
        return self._exec.dump(reason)

    # -- teardown ----------------------------------------------------------------------------
    def finalize(self, timeout: float = 30.0) -> None:
        """Release channels, sockets and shared memory; the store server goes last.

        A group made by ``split``/``new_group`` releases only itself: the channels belong to
        the communicator it was made from, which closes them (and its groups) when finalized.
        """
        execution = self._exec
        if execution.closed:
            return
        self._invalidate_windows("belongs to a finalized communicator")
        disagreed = self._settle(min(timeout, SETTLE_AT_FINALIZE_SECONDS), quiet=True)
        execution.close()
        if self._fast is not None:
            self._fast.close()
        failures = execution.failures
        if execution.failed is None:
            failures.announce_exit(self._exit_error, execution.seq)
        lost = self._lost_rank()
        for child in self._groups.children:
            lost = lost if lost is not None else child._lost_rank()
            try:        # a group's disagreement is raised once this one is released too
                child.finalize()
            except CollectiveMismatch as e:
                disagreed = disagreed or e
        self._groups.children.clear()
        if self._owns_conn and self._conn is not None:
            self._conn.close(farewell=lost)
        store = self._store
        if store is not None and self.size > 1:
            try:
                from rendezvous import PrefixStore
                scoped = PrefixStore(f"pycoll/{self.name}/", store)
                failed = lost is not None or execution.failed is not None
                if failed and hasattr(store, "set_timeout"):
                    # after a failure the store may be out of reach (a rank cut off from node
                    # 0): a short try, not the whole init timeout before this process can exit
                    store.set_timeout(FAILED_FINALIZE_SECONDS)
                scoped.add("finalized", 1)
                if self._owns_store and getattr(store, "server", None) is not None:
                    # Ranks may still be talking to the server (reading the abort record
                    # that names the root cause, above all): wait for all of them, except a
                    # rank the job already knows is dead, which never finalizes.
                    record = failures.abort.record if failures.abort is not None else None
                    gone = 1 if record and record.get("lost") is not None else 0
                    self._await_finalized(scoped, self.size - gone, timeout, failed)
            except Exception as e:  # the server may already be gone; finalize must not fail
                debug.logger.info("finalize: store unreachable (%s)", e)
        failures.close()
        self._close_status()
        if self._lease is not None:
            self._lease.close()
        if self._owns_store and store is not None:
            store.close()
        if disagreed is not None:
            raise disagreed

    def _settle(self, limit: float, *, quiet: bool) -> BaseException | None:
        """Settle the fast path's last one-way broadcast if no later call has: what the next
        call would do first (``FastPath.settle``: wait, ``limit`` seconds at most, until
        every rank has published it, and compare their codes). Finalize, split, shrink and
        grow do it, so that a disagreement it hides is raised on every rank even when no call
        follows it. The failure fails this communicator as the broadcast's own would have
        (``Execution.fail``: the error names this rank, the peer, the broadcast and its
        sequence number; the abort record), and is returned. ``quiet``: only a disagreement
        counts; a peer that is gone or late is logged (no reason for finalize or a shrink,
        which must work after failures, to fail)."""
        fast, execution = self._fast, self._exec
        if fast is None or not fast.unsettled or execution.failed is not None:
            return None
        call, seq = fast.pending_call, 0
        try:
            with execution.executor.idle():     # not while the worker runs a call
                if not fast.unsettled:
                    return None
                call, seq = fast.pending_call, (int(fast.pending[1]) >> SEQ_SHIFT) & SEQ_MASK
                fast.settle(time.monotonic() + limit)
        except Exception as e:  # noqa: BLE001 - reported as the broadcast's failure
            if quiet and not isinstance(e, CollectiveMismatch):
                debug.logger.info("rank %d: %s: the last broadcast was not checked (%s)",
                                  self.rank, self.name, e)
                return None
            assert call is not None
            return execution.fail(call.info, seq, limit, e, None, None)
        return None

    def _raise_unsettled(self, limit: float, *, quiet: bool) -> None:
        """``_settle``, raising what it finds (before a split, a shrink, a grow)."""
        err = self._settle(limit, quiet=quiet)
        if err is not None:
            raise err

    close = finalize

    @staticmethod
    def _await_finalized(scoped: Store, expected: int, timeout: float, failed: bool) -> None:
        """The store's owner waits for ``expected`` ranks to finalize, at most ``timeout``.

        After a failure the job cannot know how many ranks are still out there: a pulled
        cable cuts off every rank of a host, not only the one the abort record names, and
        those never arrive. So a failed job waits only while ranks keep arriving: at most
        ``FAILED_FINALIZE_SECONDS`` after the last one (ranks that reach the store read the
        abort record and finalize within a few hundred ms of each other).
        """
        start = time.monotonic()
        deadline = start + timeout
        count, last_change = -1, start
        while True:
            now = time.monotonic()
            seen = scoped.add("finalized", 0)
            if seen != count:
                count, last_change = seen, now
            if (count >= expected or now >= deadline
                    or (failed and now - last_change >= FAILED_FINALIZE_SECONDS)):
                return
            time.sleep(0.01)

    def _lost_rank(self) -> int | None:
        """The rank whose loss failed this communicator, if that was it."""
        return self._exec.failures.lost_rank(self._exec.failed)

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        if isinstance(exc[1], BaseException):
            self._exit_error = exc[1]
        self.finalize()

    def __repr__(self) -> str:
        return (f"<pycoll.Communicator {self.name} rank {self.rank}/{self.size} "
                f"transport={self.transport_summary()}>")
