"""The communicator: a set of ranks, a channel to each peer, and the collectives.

Setup (``Communicator.create``) takes two rounds through the rendezvous store: first every
rank publishes its host, which decides the transport per peer (shm on the same host, tcp
otherwise); then every rank publishes its transports' addresses and connects. After that the
store is touched only for control (abort, finalize), never for data.

Each collective call validates its input completely before any byte moves, takes the next
sequence number, picks an algorithm (``tuning.Selector``), and runs it under a deadline.
Failures are re-raised with rank, collective, sequence number, peer and progress attached.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Sequence

import numpy as np

from . import debug
from .algorithms import ALGORITHMS
from .algorithms.primitives import Peers, ReduceSpec, ScratchPool, collective_tag
from .errors import InvalidArgument, InvalidDtype, PycollError
from .faults import P2P, FaultHandling
from .reduction import (OpLike, check_op_dtype, finish, needs_finish, parse_op, prepare,
                        reducer)
from .tensors import as_buffer
from .topology import (assign_transports, host_identity, is_uniform, machine_identity,
                       node_layout, transport_choice)
from .transports.base import Channel, Transport, WaitPolicy
from .tuning import Hierarchy, LinkModel, Selector
from .work import Executor, Work

DEFAULT_TIMEOUT = 300.0


def _unchanged(_: np.ndarray) -> None:
    """The finishing step of every op but avg: nothing to do."""



def _segment_override() -> int:
    raw = os.environ.get("PYCOLL_SEGMENT_BYTES")
    if not raw:
        return 0
    value = int(raw)
    if value <= 0:
        raise InvalidArgument(f"PYCOLL_SEGMENT_BYTES={raw} must be a positive number of bytes")
    return value


def _exchange(store: Any, key: str, rank: int, size: int, value: dict, timeout: float) -> list[dict]:
    """Every rank publishes ``value``; return all ranks' values (an allgather via the store)."""
    store.set(f"{key}/{rank}", json.dumps(value))
    raw = store.multi_get([f"{key}/{r}" for r in range(size)], timeout=timeout)
    return [json.loads(v) for v in raw]


class Communicator(FaultHandling):
    """A group of ranks that run collectives together.

    Create one with ``pycoll.init()`` (the world) or ``Communicator.create``. Every method is
    a collective: all ranks of the communicator must call it in the same order.
    """

    def __init__(self, rank: int, size: int, *, store: Any = None, name: str = "world",
                 channels: dict[int, Channel] | None = None,
                 transports: list[Transport] | None = None,
                 timeout: float = DEFAULT_TIMEOUT, owns_store: bool = False,
                 peer_transport: dict[int, str] | None = None, hosts: list[str] | None = None,
                 token: str | None = None, master_addr: str | None = None) -> None:
        self.rank = rank
        self.size = size
        self.name = name
        self.timeout = float(timeout)
        self._store = store
        self._owns_store = owns_store
        self._channels = dict(channels or {})
        self._transports = list(transports or [])
        self._peer_transport = dict(peer_transport or {})
        self._segment_bytes = _segment_override()
        self._scratch = ScratchPool()
        self._executor = Executor(name)
        self._seq = 0
        self._p2p_seq = 0
        self._failed: BaseException | None = None
        self._closed = False
        self._choice_cache: dict[tuple[str, int], str] = {}
        self._detail = debug.detail_enabled()
        self._hosts = list(hosts or [host_identity()] * size)
        self._token = token
        self._master_addr = master_addr
        self._groups_made = 0
        self._layout = node_layout(self._hosts)
        self._subgroups: dict[str, "Communicator | None"] = {}
        self._selector = Selector(ALGORITHMS, [t.capabilities for t in self._transports],
                                  hierarchy=self._hierarchy_model())
        self._reducers: dict[tuple[Any, str], ReduceSpec] = {}
        self._init_fault_handling()
        self._peers = Peers(self.rank, self.size, self._channels, 0.0, self._segment_bytes,
                            self._scratch, check=self._check, layout=self._layout,
                            subgroup=self._subgroup)

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def create(cls, store: Any, rank: int, size: int, *, name: str = "world",
               timeout: float = DEFAULT_TIMEOUT, token: str | None = None,
               master_addr: str | None = None, owns_store: bool = False,
               host: str | None = None) -> "Communicator":
        """Connect ``size`` ranks that share ``store``; every rank calls this collectively.

        ``host`` is this rank's node identity (default: detected); groups pass their
        parent's, so a virtual node layout carries over to them.
        """
        if size < 1 or not 0 <= rank < size:
            raise InvalidArgument(f"rank {rank} is outside a world of size {size}")
        debug.configure(rank)
        if size == 1:
            return cls(rank, 1, store=store, name=name, timeout=timeout, owns_store=owns_store,
                       token=token, master_addr=master_addr)
        from rendezvous import PrefixStore

        deadline = time.monotonic() + timeout
        scoped = PrefixStore(f"pycoll/{name}/", store)
        choice = transport_choice()
        hello = {"host": host or host_identity(rank), "machine": machine_identity(),
                 "pid": os.getpid(), "size": size}
        records = _exchange(scoped, "hello", rank, size, hello, timeout)
        sizes = {r: rec["size"] for r, rec in enumerate(records) if rec["size"] != size}
        if sizes:
            raise InvalidArgument(f"rank {rank}: world size mismatch at init: this rank has "
                                  f"{size}, but ranks {sorted(sizes)} have {sorted(set(sizes.values()))}")
        per_peer = assign_transports(rank, [rec["host"] for rec in records], choice)
        # Real processes per machine (virtual node layouts aside) decide how waiters spin.
        WaitPolicy.configure(sum(rec["machine"] == hello["machine"] for rec in records))
        transports: list[Transport] = []
        try:
            shm_peers = sorted(p for p, t in per_peer.items() if t == "shm")
            tcp_peers = sorted(p for p, t in per_peer.items() if t == "tcp")
            if shm_peers:
                from .transports.shm import ShmTransport
                transports.append(ShmTransport(rank, shm_peers, crowded=WaitPolicy.crowded))
            if tcp_peers:
                from .transports.tcp import TcpTransport
                transports.append(TcpTransport(rank, tcp_peers, token=token,
                                               master_addr=master_addr))
            mine = {t.capabilities.name: t.address() for t in transports}
            addresses = _exchange(scoped, "addr", rank, size, mine, timeout)
            channels: dict[int, Channel] = {}
            for t in transports:
                peers = t.peers  # type: ignore[attr-defined]
                channels.update(t.connect({p: addresses[p][t.capabilities.name] for p in peers},
                                          deadline))
        except BaseException:
            for t in transports:
                t.close()
            raise
        debug.logger.info("communicator %s: %d ranks; transports: %s", name, size,
                          ", ".join(f"rank {p}->{t}" for p, t in sorted(per_peer.items())))
        try:
            return cls(rank, size, store=store, name=name, channels=channels,
                       transports=transports, timeout=timeout, owns_store=owns_store,
                       peer_transport=per_peer, hosts=[rec["host"] for rec in records],
                       token=token, master_addr=master_addr)
        except BaseException:   # a failing constructor must not leak connected transports
            for t in transports:
                t.close()
            raise

    # -- groups ------------------------------------------------------------------------------
    def split(self, color: int | None, key: int = 0, *, name: str | None = None,
              timeout: float | None = None) -> "Communicator | None":
        """Collectively split into communicators of the ranks that passed the same ``color``.

        Ranks are ordered by ``key`` (then by rank) in the new communicator; ``color=None``
        (or negative) opts out and returns None. Like ``MPI_Comm_split``. Collectives on
        different communicators never interfere: each has its own channels.
        """
        limit = self.timeout if timeout is None else float(timeout)
        if name is None:
            self._groups_made += 1
            name = f"split{self._groups_made}"
        if self.size == 1 or self._store is None:
            members = [0]
            records = [{"color": color, "key": key}]
        else:
            from rendezvous import PrefixStore
            scoped = PrefixStore(f"pycoll/{self.name}/", self._store)
            records = _exchange(scoped, f"group/{name}", self.rank, self.size,
                                {"color": color, "key": key}, limit)
        if color is None or color < 0:
            return None
        members = sorted((r for r, rec in enumerate(records) if rec["color"] == color),
                         key=lambda r: (records[r]["key"], r))
        return Communicator.create(self._store, members.index(self.rank), len(members),
                                   name=f"{self.name}.{name}.{color}", timeout=limit,
                                   token=self._token, master_addr=self._master_addr,
                                   host=self._hosts[self.rank])

    def new_group(self, ranks: Sequence[int], *, timeout: float | None = None) -> "Communicator | None":
        """A communicator of ``ranks`` (this communicator's ranks, in that order).

        Every rank of this communicator must call it (members and non-members alike), in
        the same order as other group creations; non-members get None.
        """
        ranks = [int(r) for r in ranks]
        for r in ranks:
            self._check_rank(r, "ranks", "new_group")
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

    def transport_summary(self) -> str:
        """E.g. "shm" or "shm(3 peers), tcp(4 peers)"; "none" for a world of one."""
        counts: dict[str, int] = {}
        for t in self._peer_transport.values():
            counts[t] = counts.get(t, 0) + 1
        if not counts:
            return "none"
        if len(counts) == 1:
            return next(iter(counts))
        return ", ".join(f"{t}({n} peers)" for t, n in sorted(counts.items()))

    def selected_algorithm(self, collective: str, nbytes: int, algo: str | None = None) -> str:
        """The algorithm this communicator would run for ``collective`` on ``nbytes``."""
        if algo is None:
            key = (collective, nbytes)
            found = self._choice_cache.get(key)
            if found is None:
                found = self._selector.choose(collective, nbytes, self.size)
                if len(self._choice_cache) < 4096:
                    self._choice_cache[key] = found
            return found
        return self._selector.choose(collective, nbytes, self.size, algo)

    # -- execution ---------------------------------------------------------------------------
    def _reduce_spec(self, op: Any, dtype: str) -> ReduceSpec:
        key = (op, dtype)
        spec = self._reducers.get(key)
        if spec is None:
            size = self.size
            spec = ReduceSpec(reducer(op, dtype),
                              (lambda a: finish(op, dtype, a, size)) if needs_finish(op, size)
                              else _unchanged)
            self._reducers[key] = spec
        return spec

    def _execute(self, collective: str, nbytes: int, body: Callable[[Peers], None],
                 timeout: float | None, async_op: bool,
                 sig: tuple = (None, None, None, None)) -> Work | None:
        """Number, record and run one operation (inline when idle, else queued).

        ``sig`` is (dtype, element count, op, root): what DETAIL compares across ranks.
        """
        if self._closed:
            raise PycollError(f"rank {self.rank}: {collective} called after finalize()")
        if self._failed is not None:
            raise PycollError(f"rank {self.rank}: {collective} refused: this communicator failed "
                              f"earlier ({self._failed}); create a new one (re-init)")
        if collective in P2P:
            # Point-to-point calls involve only some ranks, so they have their own counter:
            # the collective sequence number (and the message tags derived from it) must
            # stay in step on every rank.
            self._p2p_seq += 1
            seq = self._p2p_seq
        else:
            self._seq += 1
            seq = self._seq
        limit = self.timeout if timeout is None else float(timeout)
        fr = self._flight
        rec = None
        if fr is not None:   # flight recorder, inlined: a few stores (see flight_recorder.py)
            rec = [seq, collective, nbytes, 0, 0.0, 0.0, 0.0, body, None]
            i = fr.count
            fr.count = i + 1
            fr.ring[i % fr.capacity] = rec
        fp = (self._fingerprint(collective, nbytes, sig)
              if self._detail and collective not in P2P else None)

        if not async_op and self._executor.run_inline_if_idle():
            try:
                self._run(collective, seq, nbytes, body, limit, rec, fp)
            finally:
                self._executor.release()
            return None

        def task() -> None:
            self._run(collective, seq, nbytes, body, limit, rec, fp)

        work = Work(collective, seq, self.rank)
        if rec is not None:
            rec[4] = time.monotonic()   # scheduled (queued behind other collectives)
        self._executor.submit(task, work)
        if not async_op:
            work.wait()
            return None
        return work

    def _run(self, collective: str, seq: int, nbytes: int, body: Callable[[Peers], None],
             limit: float, rec: list | None = None, fp: dict | None = None) -> None:
        if self._failed is not None:   # queued before an earlier collective failed
            raise PycollError(f"rank {self.rank}: {collective} #{seq} refused: this "
                              f"communicator failed earlier ({self._failed}); create a new one")
        start = time.monotonic()
        deadline = start + limit
        if rec is not None:
            rec[5] = start      # started
        # One Peers per communicator, re-armed for each call: tasks never overlap (the
        # executor runs one at a time), and building a fresh one costs more than a small
        # message takes.
        peers = self._peers
        peers.deadline = deadline
        peers.tag = collective_tag(seq, collective)
        peers._active.clear()
        try:
            if fp is not None:
                self._compare_fingerprints(collective, seq, fp, deadline, rec)
            body(peers)
        except BaseException as e:  # noqa: BLE001 - every failure is reported, then re-raised
            err = self._collective_failed(collective, seq, limit, e, rec)
            if err is e:
                raise
            raise err from None
        if rec is not None:
            rec[6] = time.monotonic()   # completed
            rec[7] = None       # drop the closure: never keep a user's tensor alive

    def _hierarchy_model(self) -> Hierarchy | None:
        """The two-level cost model, when the layout is several equal nodes."""
        if not is_uniform(self._layout):
            return None
        caps = {t.capabilities.name: t.capabilities for t in self._transports}
        intra = caps.get("shm") or caps.get("tcp")
        inter = caps.get("tcp")
        if intra is None or inter is None:
            return None
        nodes = len({n for n, _ in self._layout})
        return Hierarchy(nodes, self.size // nodes, LinkModel.from_capabilities([intra]),
                         LinkModel.from_capabilities([inter]))

    def _subgroup(self, kind: str) -> Peers | None:
        """``Peers.subgroup`` for the call in progress (same deadline and tag)."""
        return self._subgroup_peers(kind, self._peers.deadline, self._peers.tag)

    def _subgroup_peers(self, kind: str, deadline: float, tag: int) -> Peers | None:
        """Node-local or cross-node peers for hierarchical algorithms, created on first use.

        Creation is itself collective; it happens inside the first hierarchical collective,
        which every rank runs at the same point of its sequence.
        """
        if kind not in self._subgroups:
            comm = None
            if is_uniform(self._layout):
                node, local = self._layout[self.rank]
                color, key = (node, local) if kind == "node" else (local, node)
                comm = self.split(color, key, name=kind,
                                  timeout=max(1.0, deadline - time.monotonic()))
            self._subgroups[kind] = comm
        comm = self._subgroups[kind]
        if comm is None:
            return None
        return Peers(comm.rank, comm.size, comm._channels, deadline, comm._segment_bytes,
                     self._scratch, check=self._check, tag=tag)

    def topology_summary(self) -> str:
        """E.g. "2 nodes x 4 ranks" or "1 node"."""
        nodes = {n for n, _ in self._layout}
        if len(nodes) == 1:
            return "1 node"
        return (f"{len(nodes)} nodes x {self.size // len(nodes)} ranks" if is_uniform(self._layout)
                else f"{len(nodes)} nodes (uneven)")

    # -- collectives -----------------------------------------------------------------------
    def allreduce(self, tensor: Any, op: OpLike = "sum", *, algo: str | None = None,
                  timeout: float | None = None, async_op: bool = False) -> Work | None:
        """Reduce ``tensor`` across all ranks, in place; every rank gets the result."""
        buf = as_buffer(tensor)
        rop = parse_op(op)
        check_op_dtype(rop, buf.dtype)
        name = self.selected_algorithm("allreduce", buf.nbytes, algo)
        algorithm = ALGORITHMS["allreduce"][name]
        arr = buf.array
        spec = self._reduce_spec(rop, buf.dtype)
        size = self.size
        if self._detail:
            debug.logger.debug("allreduce #%d: %d bytes %s op=%s algo=%s", self._seq + 1,
                               buf.nbytes, buf.dtype, rop, name)

        def body(peers: Peers) -> None:
            prepare(rop, buf.dtype, arr)
            if size == 1 or arr.size == 0:
                spec.finish(arr)
                return
            algorithm(peers, arr, spec)

        return self._execute("allreduce", buf.nbytes, body, timeout, async_op,
                             (buf.dtype, buf.count, rop, None))

    def barrier(self, *, timeout: float | None = None, async_op: bool = False) -> Work | None:
        """Return once every rank has entered the barrier."""
        fn = ALGORITHMS["barrier"][self.selected_algorithm("barrier", 0)]

        def body(peers: Peers) -> None:
            if self.size > 1:
                fn(peers)

        return self._execute("barrier", 0, body, timeout, async_op)

    def broadcast(self, tensor: Any, root: int = 0, *, algo: str | None = None,
                  timeout: float | None = None, async_op: bool = False) -> Work | None:
        """Copy ``tensor`` from ``root`` into ``tensor`` on every other rank."""
        buf = as_buffer(tensor)
        self._check_rank(root, "root", "broadcast")
        fn = ALGORITHMS["broadcast"][self.selected_algorithm("broadcast", buf.nbytes, algo)]
        arr = buf.array

        def body(peers: Peers) -> None:
            if self.size > 1 and arr.size:
                fn(peers, arr, root)

        return self._execute("broadcast", buf.nbytes, body, timeout, async_op,
                             (buf.dtype, buf.count, None, root))

    def reduce(self, tensor: Any, root: int = 0, op: OpLike = "sum", *, algo: str | None = None,
               timeout: float | None = None, async_op: bool = False) -> Work | None:
        """Reduce ``tensor`` into ``tensor`` on ``root``.

        As in Gloo, the other ranks' buffers serve as workspace: after the call they may hold
        partial results.
        """
        buf = as_buffer(tensor)
        rop = parse_op(op)
        check_op_dtype(rop, buf.dtype)
        self._check_rank(root, "root", "reduce")
        fn = ALGORITHMS["reduce"][self.selected_algorithm("reduce", buf.nbytes, algo)]
        arr, spec = buf.array, self._reduce_spec(rop, buf.dtype)

        def body(peers: Peers) -> None:
            prepare(rop, buf.dtype, arr)
            if self.size == 1 or arr.size == 0:
                spec.finish(arr)
            else:
                fn(peers, arr, root, spec)

        return self._execute("reduce", buf.nbytes, body, timeout, async_op,
                             (buf.dtype, buf.count, rop, root))

    def allgather(self, output: Any, input: Any, *, algo: str | None = None,
                  timeout: float | None = None, async_op: bool = False) -> Work | None:
        """Concatenate every rank's ``input`` into ``output`` (rank order).

        ``output`` is one tensor with ``world_size`` times the elements of ``input``, or a
        list of ``world_size`` tensors shaped like ``input``.
        """
        inp = as_buffer(input, name="input", writable=False)
        outs = self._as_output_list(output, inp, "allgather")
        out = outs[0] if len(outs) == 1 else None
        fused = out.array if out is not None else np.empty(inp.count * self.size,
                                                           dtype=inp.array.dtype)
        bounds = [(i * inp.count, (i + 1) * inp.count) for i in range(self.size)]
        fn = ALGORITHMS["allgather"][self.selected_algorithm("allgather", fused.nbytes, algo)]

        def body(peers: Peers) -> None:
            a, b = bounds[self.rank]
            fused[a:b] = inp.array
            if self.size > 1 and inp.count:
                fn(peers, fused, bounds)
            if out is None:
                for i, o in enumerate(outs):
                    o.array[...] = fused[bounds[i][0]:bounds[i][1]]

        return self._execute("allgather", fused.nbytes, body, timeout, async_op,
                             (inp.dtype, inp.count, None, None))

    def reduce_scatter(self, output: Any, input: Any, op: OpLike = "sum", *,
                       algo: str | None = None, timeout: float | None = None,
                       async_op: bool = False) -> Work | None:
        """Reduce ``input`` across ranks and leave block ``rank`` of the result in ``output``.

        ``input`` has ``world_size`` times the elements of ``output`` (or is a list of
        ``world_size`` tensors shaped like ``output``); it is left unchanged.
        """
        out = as_buffer(output, name="output")
        rop = parse_op(op)
        check_op_dtype(rop, out.dtype)
        ins = self._as_output_list(input, out, "reduce_scatter", writable=False, name="input")
        fn = ALGORITHMS["reduce_scatter"][
            self.selected_algorithm("reduce_scatter", out.nbytes * self.size, algo)]
        spec = self._reduce_spec(rop, out.dtype)
        count = out.count

        def body(peers: Peers) -> None:
            work = (ins[0].array.copy() if len(ins) == 1
                    else np.concatenate([b.array for b in ins]))
            prepare(rop, out.dtype, work)
            if self.size == 1 or count == 0:
                spec.finish(work)
            else:
                fn(peers, work, spec)
            out.array[...] = work[self.rank * count:(self.rank + 1) * count]

        return self._execute("reduce_scatter", out.nbytes * self.size, body, timeout, async_op,
                             (out.dtype, out.count, rop, None))

    def alltoall(self, output: Any, input: Any, out_splits: Sequence[int] | None = None,
                 in_splits: Sequence[int] | None = None, *, algo: str | None = None,
                 timeout: float | None = None, async_op: bool = False) -> Work | None:
        """Send block i of ``input`` to rank i; block j of ``output`` comes from rank j.

        Blocks are cut along the first dimension: equal blocks by default, or
        ``in_splits`` / ``out_splits`` rows per rank (as torch's ``all_to_all_single``).
        """
        out = as_buffer(output, name="output")
        inp = as_buffer(input, name="input", writable=False)
        self._check_same_dtype(out, inp, "alltoall")
        out_bounds = self._split_bounds(output, out, out_splits, "out_splits")
        in_bounds = self._split_bounds(input, inp, in_splits, "in_splits")
        fn = ALGORITHMS["alltoall"][self.selected_algorithm("alltoall", inp.nbytes, algo)]

        def body(peers: Peers) -> None:
            src = inp.array
            if self.size > 1 and np.may_share_memory(out.array, src):
                src = src.copy()   # in place: blocks still to be sent would be overwritten
            if self.size == 1:
                out.array[...] = src
            else:
                fn(peers, out.array, src, out_bounds, in_bounds)

        return self._execute("alltoall", inp.nbytes, body, timeout, async_op,
                             (inp.dtype, None, None, None))

    def gather(self, output: Any, input: Any, root: int = 0, *, algo: str | None = None,
               timeout: float | None = None, async_op: bool = False) -> Work | None:
        """Collect every rank's ``input`` into ``output`` on ``root`` (ignored elsewhere)."""
        inp = as_buffer(input, name="input", writable=False)
        self._check_rank(root, "root", "gather")
        out = None
        if self.rank == root:
            outs = self._as_output_list(output, inp, "gather")
            out = outs
        fn = ALGORITHMS["gather"][self.selected_algorithm("gather", inp.nbytes * self.size, algo)]

        def body(peers: Peers) -> None:
            fused = None
            if out is not None:
                fused = (out[0].array if len(out) == 1
                         else np.empty(inp.count * self.size, dtype=inp.array.dtype))
            if self.size == 1:
                fused[...] = inp.array  # type: ignore[index]
            else:
                fn(peers, inp.array, fused, root)
            if out is not None and len(out) > 1:
                for i, o in enumerate(out):
                    o.array[...] = fused[i * inp.count:(i + 1) * inp.count]  # type: ignore[index]

        return self._execute("gather", inp.nbytes * self.size, body, timeout, async_op,
                             (inp.dtype, inp.count, None, root))

    def scatter(self, output: Any, input: Any, root: int = 0, *, algo: str | None = None,
                timeout: float | None = None, async_op: bool = False) -> Work | None:
        """Send block i of ``input`` on ``root`` (ignored elsewhere) to rank i's ``output``."""
        out = as_buffer(output, name="output")
        self._check_rank(root, "root", "scatter")
        ins = None
        if self.rank == root:
            ins = self._as_output_list(input, out, "scatter", writable=False, name="input")
        fn = ALGORITHMS["scatter"][self.selected_algorithm("scatter", out.nbytes * self.size, algo)]

        def body(peers: Peers) -> None:
            fused = None
            if ins is not None:
                fused = ins[0].array if len(ins) == 1 else np.concatenate([b.array for b in ins])
            if self.size == 1:
                out.array[...] = fused  # type: ignore[index]
            else:
                fn(peers, fused, out.array, root)

        return self._execute("scatter", out.nbytes * self.size, body, timeout, async_op,
                             (out.dtype, out.count, None, root))

    def send(self, tensor: Any, dst: int, tag: int = 0, *, timeout: float | None = None,
             async_op: bool = False) -> Work | None:
        """Send ``tensor`` to rank ``dst``; it must post a matching ``recv`` (same size, tag)."""
        buf = as_buffer(tensor, writable=False)
        self._check_peer(dst, "dst", "send", tag)
        arr = buf.array

        def body(peers: Peers) -> None:
            peers.wait([peers.isend(dst, arr, tag)])

        return self._execute("send", buf.nbytes, body, timeout, async_op)

    def recv(self, tensor: Any, src: int, tag: int = 0, *, timeout: float | None = None,
             async_op: bool = False) -> Work | None:
        """Receive into ``tensor`` the next message from rank ``src`` with ``tag``."""
        buf = as_buffer(tensor)
        self._check_peer(src, "src", "recv", tag)
        arr = buf.array

        def body(peers: Peers) -> None:
            peers.wait([peers.irecv(src, arr, tag)])

        return self._execute("recv", buf.nbytes, body, timeout, async_op)

    def batch_p2p(self, ops: Sequence[tuple[str, Any, int, int]], *,
                  timeout: float | None = None, async_op: bool = False) -> Work | None:
        """Post several sends and receives together, then wait for all of them.

        ``ops`` are ``("send" | "recv", tensor, peer, tag)`` tuples (like torch's
        ``batch_isend_irecv``): the order of sends against receives does not matter, so a
        batch ``[send to 1, recv from 1]`` on both ranks cannot deadlock, whatever the size.
        """
        plan = []
        total = 0
        for i, (kind, tensor, peer, tag) in enumerate(ops):
            if kind not in ("send", "recv"):
                raise InvalidArgument(f"rank {self.rank}: batch_p2p: ops[{i}] kind {kind!r} "
                                      "is not 'send' or 'recv'")
            buf = as_buffer(tensor, name=f"ops[{i}]", writable=kind == "recv")
            self._check_peer(peer, "peer", f"batch_p2p {kind}", tag)
            plan.append((kind == "send", buf.array, int(peer), int(tag)))
            total += buf.nbytes

        def body(peers: Peers) -> None:
            peers.wait([peers.isend(p, a, t) if is_send else peers.irecv(p, a, t)
                        for is_send, a, p, t in plan])

        return self._execute("batch_p2p", total, body, timeout, async_op)

    def allreduce_coalesced(self, tensors: Sequence[Any], op: OpLike = "sum", *,
                            algo: str | None = None, timeout: float | None = None,
                            async_op: bool = False) -> Work | None:
        """Allreduce many tensors through few transfers (Horovod's tensor fusion).

        Tensors are grouped by dtype, packed into one buffer per group, reduced together and
        unpacked: one collective's latency instead of one per tensor.
        """
        bufs = [as_buffer(t, name=f"tensors[{i}]") for i, t in enumerate(tensors)]
        rop = parse_op(op)
        groups: dict[str, list] = {}
        for b in bufs:
            check_op_dtype(rop, b.dtype)
            groups.setdefault(b.dtype, []).append(b)
        plans = []
        for dtype, members in groups.items():
            total = sum(b.nbytes for b in members)
            name = self.selected_algorithm("allreduce", total, algo)
            plans.append((dtype, members, ALGORITHMS["allreduce"][name],
                          self._reduce_spec(rop, dtype)))

        def body(peers: Peers) -> None:
            for dtype, members, fn, spec in plans:
                fused = np.concatenate([b.array for b in members])
                prepare(rop, dtype, fused)
                if self.size == 1 or fused.size == 0:
                    spec.finish(fused)
                else:
                    fn(peers, fused, spec)
                start = 0
                for b in members:
                    b.array[...] = fused[start:start + b.count]
                    start += b.count

        total = sum(b.nbytes for b in bufs)
        return self._execute("allreduce_coalesced", total, body, timeout, async_op,
                             (",".join(sorted(groups)), [b.count for b in bufs], rop, None))

    # -- argument checks (all run before any communication) ----------------------------------
    def _check_rank(self, value: Any, what: str, collective: str) -> None:
        if not isinstance(value, (int, np.integer)) or not 0 <= int(value) < self.size:
            raise InvalidArgument(f"rank {self.rank}: {collective}: {what}={value!r} is not a rank "
                                  f"of this communicator (0..{self.size - 1})")

    def _check_peer(self, peer: Any, what: str, op: str, tag: int) -> None:
        self._check_rank(peer, what, op)
        if int(peer) == self.rank:
            raise InvalidArgument(f"rank {self.rank}: {op} to/from itself ({what}={peer})")
        if not isinstance(tag, (int, np.integer)) or tag < 0:
            raise InvalidArgument(f"rank {self.rank}: {op}: tag must be an int >= 0, not {tag!r}")

    def _check_same_dtype(self, a: Any, b: Any, collective: str) -> None:
        if a.dtype != b.dtype:
            raise InvalidDtype(f"rank {self.rank}: {collective}: output dtype {a.dtype} differs "
                               f"from input dtype {b.dtype}")

    def _as_output_list(self, obj: Any, like: Any, collective: str, *, writable: bool = True,
                        name: str = "output") -> list:
        """One tensor of ``size * like.count`` elements, or a list of ``size`` tensors."""
        if isinstance(obj, (list, tuple)):
            if len(obj) != self.size:
                raise InvalidArgument(f"rank {self.rank}: {collective}: {name} list has "
                                      f"{len(obj)} tensors, expected world size {self.size}")
            bufs = [as_buffer(t, name=f"{name}[{i}]", writable=writable) for i, t in enumerate(obj)]
            for b in bufs:
                self._check_same_dtype(b, like, collective)
                if b.count != like.count:
                    raise InvalidArgument(
                        f"rank {self.rank}: {collective}: {name} tensors must have {like.count} "
                        f"elements each (like the other side), got {b.count}")
            return bufs
        buf = as_buffer(obj, name=name, writable=writable)
        self._check_same_dtype(buf, like, collective)
        if buf.count != like.count * self.size:
            raise InvalidArgument(
                f"rank {self.rank}: {collective}: {name} has {buf.count} elements; it needs "
                f"world size x {like.count} = {like.count * self.size}")
        return [buf]

    def _split_bounds(self, obj: Any, buf: Any, splits: Sequence[int] | None,
                      what: str) -> list[tuple[int, int]]:
        shape = tuple(getattr(obj, "shape", (buf.count,))) or (1,)
        rows = shape[0]
        row = buf.count // rows if rows else 0
        if splits is None:
            if rows % self.size:
                raise InvalidArgument(
                    f"rank {self.rank}: alltoall: first dimension {rows} is not divisible by the "
                    f"world size {self.size}; pass {what} to split it unevenly")
            splits = [rows // self.size] * self.size
        splits = [int(s) for s in splits]
        if len(splits) != self.size or any(s < 0 for s in splits) or sum(splits) != rows:
            raise InvalidArgument(
                f"rank {self.rank}: alltoall: {what}={splits} must be {self.size} non-negative "
                f"row counts adding up to the first dimension ({rows})")
        bounds, start = [], 0
        for s in splits:
            bounds.append((start * row, (start + s) * row))
            start += s
        return bounds

    # -- teardown ----------------------------------------------------------------------------
    def finalize(self, timeout: float = 30.0) -> None:
        """Release channels, sockets and shared memory; the store server goes last."""
        if self._closed:
            return
        self._closed = True
        self._executor.close()
        self._announce_exit()
        for sub in self._subgroups.values():
            if sub is not None:
                sub.finalize()
        self._subgroups.clear()
        for t in self._transports:
            t.close()
        self._transports.clear()
        self._channels.clear()
        store = self._store
        if store is not None and self.size > 1:
            try:
                from rendezvous import PrefixStore
                scoped = PrefixStore(f"pycoll/{self.name}/", store)
                scoped.add("finalized", 1)
                if self._owns_store and getattr(store, "server", None) is not None:
                    # Ranks may still be talking to the server: wait (briefly) for all of them.
                    deadline = time.monotonic() + timeout
                    while scoped.add("finalized", 0) < self.size and time.monotonic() < deadline:
                        time.sleep(0.01)
            except Exception as e:  # the server may already be gone; finalize must not fail
                debug.logger.info("finalize: store unreachable (%s)", e)
        if self._abort is not None:
            self._abort.close()
        if self._owns_store and store is not None:
            store.close()

    close = finalize

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: object) -> None:
        if isinstance(exc[1], BaseException):
            self._exit_error = exc[1]
        self.finalize()

    def __repr__(self) -> str:
        return (f"<pycoll.Communicator {self.name} rank {self.rank}/{self.size} "
                f"transport={self.transport_summary()}>")
