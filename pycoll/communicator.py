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
from typing import Any, Callable

import numpy as np

from . import debug
from .algorithms import ALGORITHMS
from .algorithms.primitives import Peers, ReduceSpec, ScratchPool
from .errors import (CollectiveTimeout, InvalidArgument, PeerLost, PycollError, TransportError,
                     describe)
from .reduction import OpLike, check_op_dtype, finish, parse_op, prepare, reducer
from .tensors import as_buffer
from .topology import assign_transports, host_identity, transport_choice
from .transports.base import Channel, Transport, WaitTimeout
from .tuning import Selector
from .work import Executor, Work

DEFAULT_TIMEOUT = 300.0


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


class Communicator:
    """A group of ranks that run collectives together.

    Create one with ``pycoll.init()`` (the world) or ``Communicator.create``. Every method is
    a collective: all ranks of the communicator must call it in the same order.
    """

    def __init__(self, rank: int, size: int, *, store: Any = None, name: str = "world",
                 channels: dict[int, Channel] | None = None,
                 transports: list[Transport] | None = None,
                 timeout: float = DEFAULT_TIMEOUT, owns_store: bool = False,
                 peer_transport: dict[int, str] | None = None) -> None:
        self.rank = rank
        self.size = size
        self.name = name
        self.timeout = float(timeout)
        self._store = store
        self._owns_store = owns_store
        self._channels = dict(channels or {})
        self._transports = list(transports or [])
        self._peer_transport = dict(peer_transport or {})
        self._selector = Selector(ALGORITHMS, [t.capabilities for t in self._transports])
        self._segment_bytes = _segment_override()
        self._scratch = ScratchPool()
        self._executor = Executor(name)
        self._seq = 0
        self._failed: BaseException | None = None
        self._closed = False
        self._choice_cache: dict[tuple[str, int], str] = {}
        self._reducers: dict[tuple[Any, str], ReduceSpec] = {}

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def create(cls, store: Any, rank: int, size: int, *, name: str = "world",
               timeout: float = DEFAULT_TIMEOUT, token: str | None = None,
               master_addr: str | None = None, owns_store: bool = False) -> "Communicator":
        """Connect ``size`` ranks that share ``store``; every rank calls this collectively."""
        if size < 1 or not 0 <= rank < size:
            raise InvalidArgument(f"rank {rank} is outside a world of size {size}")
        debug.configure(rank)
        if size == 1:
            return cls(rank, 1, store=store, name=name, timeout=timeout, owns_store=owns_store)
        from rendezvous import PrefixStore

        deadline = time.monotonic() + timeout
        scoped = PrefixStore(f"pycoll/{name}/", store)
        choice = transport_choice()
        hello = {"host": host_identity(), "pid": os.getpid(), "size": size}
        records = _exchange(scoped, "hello", rank, size, hello, timeout)
        sizes = {r: rec["size"] for r, rec in enumerate(records) if rec["size"] != size}
        if sizes:
            raise InvalidArgument(f"rank {rank}: world size mismatch at init: this rank has "
                                  f"{size}, but ranks {sorted(sizes)} have {sorted(set(sizes.values()))}")
        per_peer = assign_transports(rank, [rec["host"] for rec in records], choice)
        transports: list[Transport] = []
        try:
            shm_peers = sorted(p for p, t in per_peer.items() if t == "shm")
            tcp_peers = sorted(p for p, t in per_peer.items() if t == "tcp")
            if shm_peers:
                from .transports.shm import ShmTransport
                transports.append(ShmTransport(rank, shm_peers))
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
        return cls(rank, size, store=store, name=name, channels=channels, transports=transports,
                   timeout=timeout, owns_store=owns_store, peer_transport=per_peer)

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
            spec = ReduceSpec(reducer(op, dtype), lambda a: finish(op, dtype, a, size))
            self._reducers[key] = spec
        return spec

    def _execute(self, collective: str, nbytes: int, body: Callable[[Peers], None],
                 timeout: float | None, async_op: bool) -> Work | None:
        if self._closed:
            raise PycollError(f"rank {self.rank}: {collective} called after finalize()")
        if self._failed is not None:
            raise PycollError(f"rank {self.rank}: {collective} refused: this communicator failed "
                              f"earlier ({self._failed}); create a new one (re-init)")
        self._seq += 1
        seq = self._seq
        limit = self.timeout if timeout is None else float(timeout)

        def task() -> None:
            self._run(collective, seq, nbytes, body, limit)

        if not async_op and self._executor.run_inline_if_idle():
            try:
                task()
            finally:
                self._executor.release()
            return None
        work = Work(collective, seq, self.rank)
        self._executor.submit(task, work)
        if not async_op:
            work.wait()
            return None
        return work

    def _run(self, collective: str, seq: int, nbytes: int, body: Callable[[Peers], None],
             limit: float) -> None:
        peers = Peers(self.rank, self.size, self._channels, time.monotonic() + limit,
                      self._segment_bytes, self._scratch)
        try:
            body(peers)
        except WaitTimeout as e:
            waiting = sorted({r.channel.peer for r in e.pending})
            done = sum(r.bytes_done for r in e.pending)
            total = sum(r.nbytes for r in e.pending)
            err = CollectiveTimeout(
                f"{describe(self.rank, collective, seq)}: timed out after {limit:g} s waiting for "
                f"peer rank(s) {waiting} ({done} of {total} bytes of the pending messages done). "
                "Hint: a peer is stuck, slow, or called a different collective; raise the "
                "timeout only if the peers are merely busy.")
            self._failed = err
            raise err from None
        except PeerLost as e:
            err = PeerLost(f"{describe(self.rank, collective, seq, peer=e.peer)}: {e}. Hint: "
                           "look at that rank's output for the first error; the job cannot "
                           "continue without it.", peer=e.peer)
            self._failed = err
            raise err from None
        except TransportError as e:
            err = type(e)(f"{describe(self.rank, collective, seq, peer=e.peer)}: {e}", peer=e.peer)
            self._failed = err
            raise err from None

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
        if debug.detail_enabled():
            debug.logger.debug("allreduce #%d: %d bytes %s op=%s algo=%s", self._seq + 1,
                               buf.nbytes, buf.dtype, rop, name)

        def body(peers: Peers) -> None:
            prepare(rop, buf.dtype, arr)
            if size == 1 or arr.size == 0:
                spec.finish(arr)
                return
            algorithm(peers, arr, spec)

        return self._execute("allreduce", buf.nbytes, body, timeout, async_op)

    def barrier(self, *, timeout: float | None = None, async_op: bool = False) -> Work | None:
        """Return once every rank has entered the barrier."""
        token = np.zeros(1, dtype=np.uint8)

        def body(peers: Peers) -> None:
            if self.size > 1:
                ALGORITHMS["allreduce"]["recursive_doubling"](
                    peers, token, self._reduce_spec(parse_op("max"), "uint8"))

        return self._execute("barrier", 0, body, timeout, async_op)

    # -- teardown ----------------------------------------------------------------------------
    def finalize(self, timeout: float = 30.0) -> None:
        """Release channels, sockets and shared memory; the store server goes last."""
        if self._closed:
            return
        self._closed = True
        self._executor.close()
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
        if self._owns_store and store is not None:
            store.close()

    close = finalize

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.finalize()

    def __repr__(self) -> str:
        return (f"<pycoll.Communicator {self.name} rank {self.rank}/{self.size} "
                f"transport={self.transport_summary()}>")
