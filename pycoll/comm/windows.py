"""One-sided windows: ``Communicator.window(buffer)`` (docs/windows.md).

Every rank exposes one buffer; any rank may then ``put`` into, ``get`` from and
``accumulate`` into any rank's window, and ``signal`` a counter the target waits on, without
the target taking part. Made and closed collectively. Each pair's transport does the moving
through its window hooks (``transports/windows.py``), chosen by ``Capabilities.windows``:
a transport without them refuses the window at creation, on every rank alike.

Safety is checked here, before any byte moves: the target's size and dtype are known from
the creation's exchange, so an out-of-range offset, a wrong dtype, a closed window or one
whose communicator was shrunk or finalized is an error on the caller with nothing written.
"""
from __future__ import annotations

import json
import time
from typing import Any, Protocol

import numpy as np

from ..buffers.memory import CUDA, HOST, MemRef
from ..buffers.reduction import OpLike, check_op_dtype, parse_op, reducer
from ..buffers.tensors import Buffer, as_buffer
from ..errors import InvalidArgument, InvalidDtype, PeerLost, PycollError, TransportError
from ..runtime.compiled import load
from ..runtime.work import Work
from ..timeouts import as_seconds
from ..transports.base import Channel
from ..transports.registry import capabilities
from ..transports.windows import ACCUMULATE_OPS, ExposedWindow, RemoteWindow, Update, wait_until

#: the copies into mapped windows, compiled where setup.py built them (``mapped.py``)
MappedWindow = load("pycoll.comm.mapped")[0].MappedWindow
#: how often ``flush`` asks whether a target whose window this process maps is alive
LIVENESS_SECONDS = 0.01
_monotonic = time.monotonic


class WindowComm(Protocol):
    """What a window uses of its communicator (``Communicator``)."""

    rank: int
    size: int
    name: str
    timeout: float

    def barrier(self, *, timeout: float | None = None) -> Any: ...

    def allgatherv(self, input: Any, *, timeout: float | None = None) -> Any: ...

    def transport_of(self, peer: int) -> str: ...

    def channel(self, peer: int) -> Channel: ...

    def forget_window(self, win: Window) -> None: ...

    def window_progress(self, post: Any, deadline: float) -> None:
        """``transports.base.WindowProgress``: post requests and progress until they are
        done, serialised with this communicator's calls (tcp's emulated windows)."""

    def serve_windows(self) -> None: ...


class WindowError(PycollError):
    """A window refused an operation: closed, invalidated, or not supported here."""


class Window:
    """This rank's view of a window: every rank's exposed buffer, reachable one-sidedly.

    Operations (``put``, ``get``, ``accumulate``, ``signal``) are complete at the origin and
    at the target when they return, on every transport that offers windows today; ``flush``
    therefore only checks, and ``fence`` (collective) is a barrier: after it, every rank sees
    every operation made before it.
    """

    def __init__(self, comm: WindowComm, buf: Any, infos: list[dict[str, Any]],
                 exposed: dict[str, ExposedWindow], remotes: dict[int, RemoteWindow],
                 local: RemoteWindow, number: int, timeout: float) -> None:
        self.comm = comm
        self.rank = comm.rank
        self.size = comm.size
        #: this rank's buffer (a numpy view of the memory the window exposes)
        self.local = buf.array
        self.dtype = buf.dtype
        self.itemsize = buf.itemsize
        #: element count of every rank's window
        self.counts = [int(info["count"]) for info in infos]
        self.name = f"window {number} of {comm.name}"
        self.timeout = timeout
        self._exposed = exposed
        self._remotes = remotes
        self._local = local
        self._invalid: str | None = None
        #: target -> its window where this process maps it (allocated over shm, and this
        #: rank's own host memory): ``put``/``get`` try a copy there first (``mapped.py``)
        self._direct: dict[int, Any] = {}   # mapped.MappedWindow
        if type(buf.array) is np.ndarray:
            np_dtype = buf.array.dtype
            for peer, remote in remotes.items():
                mapped = remote.direct()
                if mapped is not None and mapped[0].nbytes % self.itemsize == 0:
                    self._direct[peer] = MappedWindow(mapped[0].view(np_dtype), mapped[1])
            if buf.array.flags.c_contiguous:
                self._direct[self.rank] = MappedWindow(buf.array.reshape(-1),
                                                       np.zeros(2, np.uint64))
        #: the mapped targets, whose death their copies cannot see: ``flush`` asks them
        #: all at most every ``LIVENESS_SECONDS`` and raises for those found dead
        self._watched = {peer: remotes[peer] for peer in self._direct if peer != self.rank}
        self._next_watch = 0.0
        self._dead: dict[int, PycollError] = {}

    # -- checks ------------------------------------------------------------------------------
    def _usable(self, what: str) -> None:
        if self._invalid is not None:
            raise WindowError(f"rank {self.rank}: {self.name}: {what} refused: the window "
                              f"{self._invalid}")

    def _target(self, target: int, what: str) -> RemoteWindow:
        self._usable(what)
        if isinstance(target, bool) or not isinstance(target, (int, np.integer)) \
                or not 0 <= int(target) < self.size:
            raise InvalidArgument(f"rank {self.rank}: {self.name}: {what}: target={target!r} is "
                                  f"not a rank of the communicator (0..{self.size - 1})")
        target = int(target)
        return self._local if target == self.rank else self._remotes[target]

    def _span(self, obj: Any, target: int, offset: int, what: str, writable: bool
              ) -> tuple[Buffer, int, int]:
        """(buffer, byte offset, bytes) of an operation, checked against the target's window."""
        buf = as_buffer(obj, name="buffer", writable=writable)
        if buf.dtype != self.dtype:
            raise InvalidDtype(f"rank {self.rank}: {self.name}: {what} to target rank {target}: "
                               f"the buffer is {buf.dtype}, the window {self.dtype}: nothing "
                               "was moved; convert the buffer to the window's dtype")
        count = buf.count
        limit = self.counts[target]
        if (isinstance(offset, bool) or not isinstance(offset, (int, np.integer))
                or offset < 0 or offset + count > limit):
            raise InvalidArgument(
                f"rank {self.rank}: {self.name}: {what} of {count} elements at offset "
                f"{offset!r} does not fit target rank {target}'s window of {limit} {self.dtype} "
                f"elements (offsets 0..{max(limit - count, 0)} fit {count}): nothing was moved")
        if buf.mem_type != HOST and buf.mem_type != CUDA:
            raise InvalidArgument(f"rank {self.rank}: {self.name}: {what}: the buffer is "
                                  f"{buf.where} memory; windows move host and CUDA memory")
        return buf, int(offset) * self.itemsize, count * self.itemsize

    def _host(self, buf: Buffer, what: str, reads: bool) -> tuple[Any, Any]:
        """The host bytes an operation moves: a host buffer itself; a device buffer staged
        through a host copy (after the work queued on the caller's stream), with the
        function that copies the result back (a get's)."""
        if buf.mem_type == HOST:
            return buf.array, None
        from ..cuda.windows import stage
        return stage(buf, f"rank {self.rank}: {self.name}: {what}", reads)

    def _transfer(self, remote: RemoteWindow, buf: Buffer, at: int, what: str,
                  write: bool) -> Any:
        """The transport's part of a put (``write``) or a get, staged if ``buf`` is on a
        device."""
        host, back = self._host(buf, what, reads=write)
        view = memoryview(host).cast("B")
        deadline = self._deadline(None)
        if write:
            return lambda: remote.write(at, view, deadline)

        def get() -> None:
            remote.read(at, view, deadline)
            if back is not None:
                back()
        return get

    def _run(self, target: int, what: str, fn: Any, async_op: bool = False,
             output: Any = None) -> Work | None:
        """Run the transport's part of an operation; with ``async_op`` its ``Work`` handle,
        already finished (every operation completes before it returns today), holding a
        transport failure for ``wait`` to raise (argument errors raise at once, as for
        collectives)."""
        if not async_op:
            self._move(target, what, fn)
            return None
        work = Work(f"window {what}", 0, self.rank, output)
        try:
            self._move(target, what, fn)
        except PycollError as e:
            work.finish(e)
        else:
            work.finish(None)
        return work

    def _move(self, target: int, what: str, fn: Any) -> None:
        try:
            fn()
        except PeerLost as e:
            raise PeerLost(f"rank {self.rank}: {self.name}: {what}: target rank {target} is "
                           f"gone ({e}); the window is unusable: close it and shrink or "
                           "restart the job", peer=target) from e
        except TransportError as e:
            raise TransportError(f"rank {self.rank}: {self.name}: {what} with target rank "
                                 f"{target} failed: {e}", peer=target) from e

    def _deadline(self, timeout: float | None) -> float:
        return time.monotonic() + (as_seconds(timeout) or self.timeout)

    # -- one-sided operations ---------------------------------------------------------------
    def put(self, src: Any, target: int, offset: int = 0, *, async_op: bool = False
            ) -> Work | None:
        """Copy ``src`` into ``target``'s window from element ``offset``."""
        direct = self._direct.get(target) if type(target) is int else None
        if direct is not None and not async_op and direct.put(src, offset):
            return None
        remote = self._target(target, "put")
        buf, at, _ = self._span(src, target, offset, "put", writable=False)
        return self._run(target, "put", self._transfer(remote, buf, at, "put", True), async_op)

    def get(self, dst: Any, target: int, offset: int = 0, *, async_op: bool = False
            ) -> Work | None:
        """Copy ``len(dst)`` elements of ``target``'s window from element ``offset`` into
        ``dst``."""
        direct = self._direct.get(target) if type(target) is int else None
        if direct is not None and not async_op and direct.get(dst, offset):
            return None
        remote = self._target(target, "get")
        buf, at, _ = self._span(dst, target, offset, "get", writable=True)
        return self._run(target, "get", self._transfer(remote, buf, at, "get", False),
                         async_op, dst)

    def accumulate(self, src: Any, target: int, offset: int = 0, op: OpLike = "sum", *,
                   timeout: float | None = None, async_op: bool = False) -> Work | None:
        """``window[offset:offset+len(src)] op= src`` on ``target``, element-wise atomic with
        respect to every other accumulate into those elements (not to puts)."""
        remote = self._target(target, "accumulate")
        reduce_op = parse_op(op)
        if reduce_op.name not in ACCUMULATE_OPS:
            raise InvalidArgument(f"rank {self.rank}: {self.name}: accumulate: op "
                                  f"{reduce_op.name!r} is not one element-wise step; use one "
                                  f"of {', '.join(ACCUMULATE_OPS)}")
        check_op_dtype(reduce_op, self.dtype)
        buf, at, nbytes = self._span(src, target, offset, "accumulate", writable=False)
        host, _ = self._host(buf, "accumulate", reads=True)
        apply = Update(reduce_op.name, self.dtype, host, reducer(reduce_op, self.dtype))
        deadline = self._deadline(timeout)
        return self._run(target, "accumulate",
                         lambda: remote.update(at, nbytes, apply, deadline), async_op)

    def signal(self, target: int, value: int = 1, *, timeout: float | None = None,
               async_op: bool = False) -> Work | None:
        """Add ``value`` to ``target``'s signal counter, after every operation this rank made
        before it is visible at the target (they are complete when they return)."""
        remote = self._target(target, "signal")
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise InvalidArgument(f"rank {self.rank}: {self.name}: signal: value={value!r} "
                                  "must be an integer >= 0")
        deadline = self._deadline(timeout)
        return self._run(target, "signal", lambda: remote.add_signal(int(value), deadline),
                         async_op)

    def signals(self) -> int:
        """This rank's signal counter: the sum of every value signalled to it so far."""
        self._usable("signals")
        return sum(w.signals() for w in self._exposed.values()) % (1 << 64)

    def wait_signal(self, value: int, *, timeout: float | None = None) -> int:
        """Wait until this rank's signal counter reaches ``value`` (counters only grow: wait
        for the running total, e.g. ``k * blocks`` after round ``k``); returns the counter."""
        self._usable("wait_signal")
        seen = [0]

        def reached() -> bool:
            self._usable("wait_signal")
            self.comm.serve_windows()         # tcp's signals arrive through progress
            seen[0] = self.signals()
            return seen[0] >= value
        try:
            wait_until(reached, self._deadline(timeout),
                       f"signal value {value} on rank {self.rank}'s {self.name}")
        except PycollError as e:
            if isinstance(e, WindowError):
                raise
            raise type(e)(f"rank {self.rank}: {self.name}: wait_signal({value}): the counter "
                          f"is still {seen[0]} at the deadline; did the signalling ranks run "
                          "(and signal as many times as waited for)?") from None
        return seen[0]

    def flush(self, target: int | None = None) -> None:
        """Local and remote completion of this rank's operations (to ``target``, or to all).
        Every operation completes before it returns today, so this only checks the window."""
        if self._invalid is None and (target is None or (
                type(target) is int and 0 <= target < self.size)):
            if self._watched and (self._dead or _monotonic() >= self._next_watch):
                self._check_watched(target)
            return
        if target is not None:
            self._target(target, "flush")
        self._usable("flush")

    def _check_watched(self, target: int | None) -> None:
        """Ask every mapped target whether it lives, when due (a system call or two each:
        not at every flush); raise ``PeerLost`` for the flushed one(s) found dead."""
        now = _monotonic()
        if now >= self._next_watch:
            self._next_watch = now + LIVENESS_SECONDS
            for peer, remote in self._watched.items():
                if peer not in self._dead:
                    try:
                        self._move(peer, "flush", remote.check_alive)
                    except PycollError as e:
                        self._dead[peer] = e
        for peer in self._dead if target is None else (target,):
            if peer in self._dead:
                raise self._dead[peer]

    def fence(self, *, timeout: float | None = None) -> None:
        """Collective: every rank's operations before the fence are complete and visible on
        every rank after it."""
        self._usable("fence")
        self.comm.barrier(timeout=timeout)

    # -- life --------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._invalid is not None

    def close(self, *, timeout: float | None = None) -> None:
        """Collective: wait for every rank (so no origin still reaches this rank's memory),
        then release the window. The buffer is the user's again."""
        if self._invalid is None:
            try:
                self.comm.barrier(timeout=timeout)
            finally:
                self.invalidate("was closed")
        else:
            self.invalidate(self._invalid)

    def invalidate(self, why: str) -> None:
        """Release the window without waiting for the other ranks (the communicator does it
        at finalize and when a shrink replaces it); later operations raise ``WindowError``
        saying ``why``."""
        if self._invalid is None:
            self._invalid = why
        self._direct = {}
        for remote in list(self._remotes.values()) + [self._local]:
            remote.close()
        for exposed in self._exposed.values():
            exposed.close()
        self._remotes, self._exposed = {}, {}
        self.comm.forget_window(self)

    def __enter__(self) -> Window:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            self.invalidate("was left by an exception")

    def __repr__(self) -> str:
        state = "open" if self._invalid is None else self._invalid
        return (f"Window({self.name}, rank {self.rank}/{self.size}, {self.dtype}, "
                f"{self.counts[self.rank]} elements, {state})")


def open_window(comm: WindowComm, obj: Any, number: int, timeout: float | None,
                allocate: tuple[int, np.dtype] | None = None) -> Window:
    """``Communicator.window``: expose ``obj`` and attach to every peer's window. With
    ``allocate`` (count, dtype) instead, ``Communicator.allocate_window``: the memory is made
    here, by the first transport to a peer that allocates memory its peers map (shm), or
    by numpy where none does."""
    rank, size = comm.rank, comm.size
    limit = as_seconds(timeout, "timeout") or comm.timeout
    buf = as_buffer(obj, name="buffer", writable=True) if allocate is None else None
    problem, mem = _memory(buf) if buf is not None else ("", None)
    if mem is not None and mem.mem_type != HOST and size == 1:
        problem = ("its buffer is device memory and a world of one has no transport that "
                   "exposes it")
    mem_type, where = (buf.mem_type, buf.where) if buf is not None else (HOST, "host")
    transports: dict[str, Any] = {}
    for peer in range(size):
        if peer == rank or problem:
            continue
        name = comm.transport_of(peer)
        caps = capabilities(name)
        if caps is None or not caps.windows:
            problem = (f"its transport to rank {peer} ({name}) has no window support yet "
                       "(transports with it: those whose capabilities say windows)")
        elif not caps.moves(mem_type):
            problem = (f"its buffer is {where} memory, which its transport to rank {peer} "
                       f"({name}) cannot expose (device windows need cuda_ipc to every peer: "
                       "one host; elsewhere expose a host buffer, device buffers can still be "
                       "put, got and accumulated from)")
        elif name not in transports:
            transports[name] = comm.channel(peer).transport
    exposed: dict[str, ExposedWindow] = {}
    if allocate is not None:
        count, np_dtype = allocate
        maker = "" if problem else next(
            (n for n in transports if getattr(capabilities(n), "window_memory", False)), "")
        array = np.zeros(0 if problem else count, np_dtype)
        if maker:
            try:
                made = transports[maker].allocate_window(count * np_dtype.itemsize)
            except (OSError, PycollError) as err:
                problem = f"its window memory could not be allocated ({err})"
            else:
                exposed[maker] = made
                assert made.memory is not None
                array = made.memory.view(np_dtype)
        buf = as_buffer(array, name="buffer", writable=True)
        mem = MemRef.of(buf.array)
    assert buf is not None
    if not problem and mem is not None:
        try:
            for name, transport in transports.items():
                if name not in exposed:
                    exposed[name] = transport.expose_window(mem, buf.dtype, buf.array.dtype)
        except BaseException:
            for e in exposed.values():
                e.close()
            raise
    mine = {"count": buf.count, "dtype": buf.dtype, "problem": problem,
            "records": {name: e.record for name, e in exposed.items()}}
    try:
        infos = _exchange(comm, mine, limit)
        refused = [(r, i["problem"]) for r, i in enumerate(infos) if i["problem"]]
        if refused:
            r, why = refused[0]
            raise WindowError(f"rank {rank}: window: rank {r} cannot take part: {why}")
        dtypes = {i["dtype"] for i in infos}
        if len(dtypes) > 1:
            listed = ", ".join(f"rank {r}: {i['dtype']}" for r, i in enumerate(infos))
            raise InvalidDtype(f"rank {rank}: window: the ranks' buffers differ in dtype "
                               f"({listed}): every rank must expose the same dtype")
        remotes: dict[int, RemoteWindow] = {}
        try:
            for peer in range(size):
                if peer != rank:
                    name = comm.transport_of(peer)
                    remotes[peer] = comm.channel(peer).attach_window(
                        infos[peer]["records"][name], comm.window_progress)
        except BaseException:
            for remote in remotes.values():
                remote.close()
            raise
        if not exposed:            # a world of one: its only window is its own memory
            exposed[""] = _Solo(mem)
        # this rank's own accumulates take the locks of a transport whose origins copy
        # themselves (shm), and what tcp's progress applies goes through the same handle
        first = next((n for n, e in exposed.items() if not e.served), next(iter(exposed)))
        local = exposed[first].local()
        for e in exposed.values():
            e.apply_through(local)
        comm.barrier(timeout=limit)       # everyone attached: the names may go
    except BaseException:
        for e in exposed.values():
            e.close()
        raise
    for e in exposed.values():
        e.seal()
    return Window(comm, buf, infos, exposed, remotes, local, number, limit)


def _memory(buf: Buffer) -> tuple[str, MemRef | None]:
    """(why the buffer cannot be a window, or ""; the memory a transport exposes)."""
    if buf.mem_type == HOST:
        return "", MemRef.of(buf.array)
    if buf.mem_type != CUDA:
        return f"its buffer is {buf.where} memory (windows take host and CUDA memory)", None
    from ..cuda import runtime
    why = runtime.unavailable_reason()
    if why is not None:
        return f"its buffer is {buf.where} memory, which this process cannot use: {why}", None
    device = runtime.current_device_of(buf.array, buf.source, buf.device)
    ptr = runtime.device_pointer(buf.array, buf.source) if buf.nbytes else 0
    return "", MemRef.device_memory(ptr, buf.nbytes, device, owner=buf.array)


def _exchange(comm: WindowComm, mine: dict[str, Any], limit: float) -> list[dict[str, Any]]:
    """Every rank's record (JSON through ``allgatherv``: lengths may differ)."""
    data = np.frombuffer(json.dumps(mine).encode(), dtype=np.uint8)
    parts = comm.allgatherv(data, timeout=limit)
    return [json.loads(bytes(p)) for p in parts]


class _Solo(ExposedWindow, RemoteWindow):
    """A world of one: its only window is its own memory."""

    def __init__(self, mem: MemRef | None) -> None:
        self.view = mem.host_view() if mem is not None else memoryview(b"")
        self.count = 0
        self.record = {}

    def signals(self) -> int:
        return self.count

    def local(self) -> RemoteWindow:
        return self

    def write(self, offset: int, view: memoryview, deadline: float = 0.0) -> None:
        self.view[offset:offset + view.nbytes] = view.cast("B")

    def read(self, offset: int, view: memoryview, deadline: float = 0.0) -> None:
        view.cast("B")[:] = self.view[offset:offset + view.nbytes]

    def update(self, offset: int, nbytes: int, fn: Any, deadline: float) -> None:
        scratch = memoryview(bytearray(self.view[offset:offset + nbytes]))
        fn(scratch)
        self.view[offset:offset + nbytes] = scratch

    def add_signal(self, value: int, deadline: float) -> None:
        self.count += value

    def close(self) -> None:
        pass
