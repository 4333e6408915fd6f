"""A CPU simulator of the CUDA device runtime pycoll uses: CI's stand-in for CuPy and a GPU.

Selected by ``PYCOLL_CUDA_SIMULATOR=1`` (``pycoll.cuda.runtime.cupy()`` then returns this
module instead of CuPy). It is shaped like the few parts of CuPy that ``pycoll.cuda`` and the
``cuda_ipc`` transport call, so those code paths themselves run on every CI machine: their
logic, their ordering on streams and events, and the lifetimes of IPC handles and mappings.
It is a simulator, in the spirit of numba's ``NUMBA_ENABLE_CUDASIM``: a run on it is never a
run on a GPU, and says so (``pycoll.info``, every error it raises).

What it models, because pycoll's correctness depends on it:

* device memory lives in the process but at addresses no host code can touch (above the
  48-bit user address space): code that treats a device pointer as a host one crashes here
  too, and ``cudaMemcpyKind`` is checked against the addresses;
* zero-byte arrays have pointer 0, as CuPy's do;
* streams run in order, each on its own queue, executed by one "device" thread per process
  that interleaves the streams at random and delays work at random: nothing queued is done
  when the host queues it, and only events, stream waits and synchronisation order things;
* events: ``done`` when the work before their last ``record`` has run; IPC event handles
  opened by another process see the same generations (the peer's counters are read with
  ``process_vm_readv``);
* IPC memory handles name the whole allocation (not the pointer they were asked for), and
  a peer's opened memory is read with ``process_vm_readv`` and written (from host memory:
  windows) with ``process_vm_writev``;
* a thread has no current context until a runtime call makes the device current
  (``cudaSetDevice``, an allocation, a copy, ...); driver calls on such a thread fail with
  ``CUDA_ERROR_INVALID_CONTEXT`` (201), as CuPy's ``with Device(0)`` leaves a fresh thread
  whose current device is already 0;
* a process forked after CUDA was initialised in its parent cannot use it
  (``cudaErrorInitializationError``), as with CUDA;
* CuPy 14's ``ExternalStream`` warns that it is deprecated.

What it does not: the CUDA C reduction kernels (``pycoll.cuda.kernels``) are replaced by the
host reductions of ``pycoll.buffers.reduction`` (their device bodies are only compiled on a
GPU); peer access, several devices, timing, memory limits and real concurrency are not
simulated. One simulated device, cuda:0.
"""
from __future__ import annotations

import bisect
import ctypes
import os
import random
import struct
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np

from ..buffers.reduction import ReduceOp, finish, prepare, reducer
from ..envvars import env_float

SIMULATOR = True
__version__ = "pycoll-cuda-simulator"

uint8, uint16, int64, float32 = np.uint8, np.uint16, np.int64, np.float32

_DEVICE_BASE = 1 << 48           # own allocations: never a host address on x86-64/arm64
_MAPPED_BASE = 1 << 52           # peers' memory opened through IPC handles
_ALIGN = 512
#: how long a host wait (``synchronize``) may take before the simulator says it is stuck
_STUCK_S = 120.0
_CONTEXT_ERROR = 201             # CUDA_ERROR_INVALID_CONTEXT
_VALUE_ERROR = 1                 # CUDA_ERROR_INVALID_VALUE
_NOT_INITIALIZED = 3             # CUDA_ERROR_NOT_INITIALIZED

_MEM_MAGIC, _EVENT_MAGIC = b"PYCSIMM", b"PYCSIME"
_MEM_HANDLE = struct.Struct("<7sxqQQ")      # magic, pid, host address, size
_EVENT_HANDLE = struct.Struct("<7sxqQ")     # magic, pid, host address of [recorded, done]


class CUDARuntimeError(RuntimeError):
    """An error of the simulated runtime (CuPy's ``CUDARuntimeError`` counterpart)."""

    def __init__(self, name: str, detail: str) -> None:
        super().__init__(f"{name}: {detail} (pycoll CUDA simulator, not a GPU)")
        self.name = name


# -- the process's simulated driver: initialisation, fork, the thread's context ----------------
_tls = threading.local()
_state_lock = threading.Lock()
_initialised_pid: int | None = None


def _init() -> None:
    """cuInit: once per process; a child forked after it cannot use the device."""
    global _initialised_pid
    pid = os.getpid()
    if _initialised_pid is None:
        with _state_lock:
            if _initialised_pid is None:
                _initialised_pid = pid
    elif _initialised_pid != pid:
        raise CUDARuntimeError(
            "cudaErrorInitializationError",
            f"process {pid} was forked from process {_initialised_pid} after CUDA was "
            "initialised there; CUDA cannot be used in such a child: start processes that use "
            "device memory with the 'spawn' start method")


def _runtime_call() -> None:
    """Every runtime API call but the device queries makes the primary context current."""
    _init()
    _tls.context = True


def _forked() -> bool:
    return _initialised_pid is not None and _initialised_pid != os.getpid()


# -- memory ----------------------------------------------------------------------------------
class _Allocation:
    """A device allocation: host bytes behind a simulated device address range."""

    def __init__(self, base: int, size: int, pid: int = 0, remote: int = 0) -> None:
        self.base, self.size = base, size
        self.pid, self.remote = pid, remote       # opened from a peer: its pid and address
        self.host = np.zeros(size, dtype=np.uint8) if not pid else None

    def host_address(self) -> int:
        assert self.host is not None
        return int(self.host.ctypes.data)


class _AddressSpace:
    """Simulated device address ranges of this process (own and opened), by base."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bases: list[int] = []
        self.allocs: dict[int, _Allocation] = {}
        self.next = {False: _DEVICE_BASE, True: _MAPPED_BASE}

    def add(self, size: int, pid: int = 0, remote: int = 0) -> _Allocation:
        with self.lock:
            opened = bool(pid)
            base = self.next[opened]
            self.next[opened] = base + (size + 2 * _ALIGN - 1) // _ALIGN * _ALIGN
            alloc = _Allocation(base, size, pid, remote)
            bisect.insort(self.bases, base)
            self.allocs[base] = alloc
        return alloc

    def remove(self, base: int) -> None:
        with self.lock:
            if self.allocs.pop(base, None) is not None:
                self.bases.pop(bisect.bisect_left(self.bases, base))

    def find(self, ptr: int) -> _Allocation | None:
        with self.lock:
            i = bisect.bisect_right(self.bases, ptr) - 1
            if i < 0:
                return None
            alloc = self.allocs[self.bases[i]]
        return alloc if ptr < alloc.base + max(alloc.size, 1) else None


_space = _AddressSpace()


def _is_device(ptr: int) -> bool:
    return ptr >= _DEVICE_BASE


def _locate(ptr: int, nbytes: int, what: str) -> tuple[_Allocation, int]:
    alloc = _space.find(ptr)
    if alloc is None or ptr + nbytes > alloc.base + alloc.size:
        raise CUDARuntimeError("cudaErrorInvalidValue",
                               f"{what}: {nbytes} bytes at {ptr:#x} are not inside one live "
                               "device allocation")
    return alloc, ptr - alloc.base


class _Memory:
    """An owned allocation (freed when the last array over it goes). Like an allocation
    from CuPy's pool, which calls no runtime API when it has memory at hand, it makes no
    context current."""

    def __init__(self, size: int) -> None:
        _init()
        self.size = size
        if size == 0:
            self.ptr = 0
            return
        alloc = _space.add(size)
        self.ptr = alloc.base
        weakref.finalize(self, _space.remove, alloc.base)


class UnownedMemory:
    def __init__(self, ptr: int, size: int, owner: Any, device_id: int = -1) -> None:
        self.ptr, self.size, self.owner = ptr, size, owner


class MemoryPointer:
    def __init__(self, mem: Any, offset: int) -> None:
        self.mem = mem
        self.ptr = mem.ptr + offset if mem.ptr else 0


def _host_view(ptr: int, nbytes: int, dtype: np.dtype) -> np.ndarray:
    """The device bytes as a host array (device thread only: the 'kernel' side)."""
    if nbytes == 0:
        return np.empty(0, dtype=dtype)
    alloc, off = _locate(ptr, nbytes, "kernel argument")
    if alloc.host is None:
        raise CUDARuntimeError("cudaErrorNotSupported",
                               "kernels on a peer's IPC memory are not simulated")
    return alloc.host[off:off + nbytes].view(dtype)


# -- process_vm_readv: a peer's device memory and event counters ----------------------------
class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)


def _peer_read(pid: int, remote: int, local: int, nbytes: int, write: bool = False) -> None:
    """Copy between a peer's memory and ours (``write``: ours into the peer's, as a copy
    into a peer's memory opened through an IPC handle does: one-sided windows)."""
    call = _libc.process_vm_writev if write else _libc.process_vm_readv
    done = 0
    while done < nbytes:
        li = _IoVec(local + done, nbytes - done)
        ri = _IoVec(remote + done, nbytes - done)
        got = call(pid, ctypes.byref(li), 1, ctypes.byref(ri), 1, 0)
        if got <= 0:
            err = ctypes.get_errno()
            raise CUDARuntimeError("cudaErrorIllegalAddress",
                                   f"{'writing' if write else 'reading'} process {pid}'s "
                                   f"memory failed ({os.strerror(err) if err else 'no bytes'})")
        done += got


def _peer_counters(pid: int, address: int) -> tuple[int, int]:
    out = np.zeros(2, dtype=np.int64)
    _peer_read(pid, address, int(out.ctypes.data), 16)
    return int(out[0]), int(out[1])


# -- streams, events, the device thread ------------------------------------------------------
class _Queue:
    """One stream's work, in order."""

    def __init__(self, handle: int) -> None:
        self.handle = handle
        self.work: deque[tuple[str, Any]] = deque()
        self.queued = 0
        self.ran = 0
        self.error: CUDARuntimeError | None = None


class _Device:
    """The simulated GPU of this process: one thread running the streams' queues."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.queues: dict[int, _Queue] = {}
        self.thread: threading.Thread | None = None
        self.next_handle = 0x5000
        self.null = self.queue(0)
        for legacy in (1, 2):          # legacy and per-thread default streams
            self.queues[legacy] = self.null
        self.delay_s = env_float("PYCOLL_CUDA_SIMULATOR_DELAY_US", 200.0, minimum=0.0) * 1e-6
        self.rng = random.Random()

    def queue(self, handle: int | None = None) -> _Queue:
        with self.cond:
            if handle is None:
                handle = self.next_handle
                self.next_handle += 16
            q = self.queues[handle] = _Queue(handle)
        return q

    def submit(self, q: _Queue, kind: str, item: Any, runtime_api: bool = True) -> int:
        """Queue work on ``q``; ``runtime_api``: the call is a runtime API call (it makes the
        context current), not a kernel launch (CuPy launches through the driver API)."""
        if runtime_api:
            _runtime_call()
        else:
            _init()
        with self.cond:
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="pycoll-cuda-simulator",
                                               daemon=True)
                self.thread.start()
            q.work.append((kind, item))
            q.queued += 1
            self.cond.notify_all()
            return q.queued

    @staticmethod
    def _ready(kind: str, item: Any) -> bool:
        if kind != "wait":
            return True
        event, target = item
        try:
            return event.completed() >= target
        except CUDARuntimeError:
            return True            # the peer is gone: its copy will fail and say so

    def _run(self) -> None:
        while True:
            with self.cond:
                while True:
                    ready = [q for q in self.queues.values() if q.work
                             and self._ready(*q.work[0])]
                    if ready:
                        break
                    waiting = any(q.work for q in self.queues.values())
                    self.cond.wait(0.0005 if waiting else None)
                q = self.rng.choice(ready)
                kind, item = q.work[0]
            if kind != "wait" and self.delay_s and self.rng.random() < 0.3:
                time.sleep(self.rng.uniform(0, self.delay_s))   # work finishes late
            try:
                if kind == "run":
                    item()
            except CUDARuntimeError as e:
                q.error = q.error or e
            except Exception as e:  # noqa: BLE001 - a simulated kernel's failure is sticky
                q.error = q.error or CUDARuntimeError("cudaErrorLaunchFailure", repr(e))
            with self.cond:
                q.work.popleft()
                q.ran += 1
                self.cond.notify_all()

    def wait_for(self, q: _Queue, ticket: int, what: str) -> None:
        """Block the host until ``q`` ran its first ``ticket`` items."""
        deadline = time.monotonic() + _STUCK_S
        with self.cond:
            while q.ran < ticket:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CUDARuntimeError(
                        "simulator stuck", f"{what} waited {_STUCK_S:.0f} s for stream "
                        f"{q.handle:#x}: its work waits for an event that never completes")
                self.cond.wait(min(left, 0.05))
        if q.error is not None:
            raise q.error


_device_of_pid: dict[int, _Device] = {}


def _dev() -> _Device:
    _init()
    dev = _device_of_pid.get(os.getpid())
    if dev is None:
        with _state_lock:
            dev = _device_of_pid.setdefault(os.getpid(), _Device())
    return dev


def _queue_of(handle: int) -> _Queue:
    dev = _dev()
    q = dev.queues.get(handle)
    if q is None:
        raise CUDARuntimeError("cudaErrorInvalidResourceHandle",
                               f"no stream with handle {handle:#x} in this process")
    return q


class Stream:
    """A stream (``non_blocking`` is accepted; the null stream is one more queue here)."""

    def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False
                 ) -> None:
        _runtime_call()
        q = _dev().null if null else _dev().queue()
        self.ptr = q.handle

    def __enter__(self) -> Stream:
        stack = getattr(_tls, "streams", None)
        if stack is None:
            stack = _tls.streams = []
        stack.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _tls.streams.pop()

    def synchronize(self) -> None:
        q = _queue_of(self.ptr)
        _dev().wait_for(q, q.queued, "Stream.synchronize")

    def wait_event(self, event: Event) -> None:
        runtime.streamWaitEvent(self.ptr, event.ptr, 0)

    def record(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event


def _wrap(ptr: int) -> Stream:
    _queue_of(ptr)
    stream = Stream.__new__(Stream)
    stream.ptr = ptr
    return stream


class ExternalStream(Stream):
    """Deprecated by CuPy 14, with the same warning."""

    def __init__(self, ptr: int, device_id: int = -1) -> None:
        warnings.warn("ExternalStream is deprecated. Use Stream.from_external() instead",
                      DeprecationWarning, stacklevel=2)
        _queue_of(ptr)
        self.ptr = ptr


def get_current_stream() -> Stream:
    stack = getattr(_tls, "streams", None)
    return stack[-1] if stack else _wrap(0)


class _EventState:
    """[generations recorded, generations completed]: in this process's memory, where a
    peer that opened the event's IPC handle reads them."""

    def __init__(self) -> None:
        self.counts = np.zeros(2, dtype=np.int64)

    def recorded(self) -> int:
        return int(self.counts[0])

    def completed(self) -> int:
        return int(self.counts[1])


class _PeerEvent:
    def __init__(self, pid: int, address: int) -> None:
        self.pid, self.address = pid, address

    def recorded(self) -> int:
        return _peer_counters(self.pid, self.address)[0]

    def completed(self) -> int:
        return _peer_counters(self.pid, self.address)[1]


_events: dict[int, Any] = {}
_event_ids = iter(range(0xE000, 1 << 62, 16))


def _event(ptr: int) -> Any:
    found = _events.get(ptr)
    if found is None:
        raise CUDARuntimeError("cudaErrorInvalidResourceHandle", f"no event {ptr:#x}")
    return found


class Event:
    def __init__(self, block: bool = False, disable_timing: bool = False,
                 interprocess: bool = False) -> None:
        _runtime_call()
        self.state = _EventState()
        self.interprocess = interprocess
        self.ptr = next(_event_ids)
        _events[self.ptr] = self

    def recorded(self) -> int:
        return self.state.recorded()

    def completed(self) -> int:
        return self.state.completed()

    def record(self, stream: Stream | None = None) -> None:
        q = _queue_of((stream or get_current_stream()).ptr)
        counts = self.state.counts
        counts[0] += 1
        generation = int(counts[0])

        def complete() -> None:
            counts[1] = max(int(counts[1]), generation)
        _dev().submit(q, "run", complete)

    @property
    def done(self) -> bool:
        _runtime_call()
        return self.completed() >= self.recorded()

    def synchronize(self) -> None:
        deadline = time.monotonic() + _STUCK_S
        while not self.done:
            if time.monotonic() > deadline:
                raise CUDARuntimeError("simulator stuck", "Event.synchronize never completed")
            time.sleep(0.0002)


class Device:
    """``with Device(i)``: as CuPy, makes ``i`` current only if it is not already (so a
    fresh thread whose current device is 0 gets no context from ``with Device(0)``)."""

    def __init__(self, device: int | None = None) -> None:
        self.id = runtime.getDevice() if device is None else int(device)
        self.previous: list[int] = []

    def __enter__(self) -> Device:
        prev = runtime.getDevice()
        self.previous.append(prev)
        if prev != self.id:
            runtime.setDevice(self.id)
        return self

    def __exit__(self, *exc: Any) -> None:
        prev = self.previous.pop()
        if prev != runtime.getDevice():
            runtime.setDevice(prev)

    def synchronize(self) -> None:
        _runtime_call()
        dev = _dev()
        for q in list(dev.queues.values()):
            dev.wait_for(q, q.queued, "Device.synchronize")


# -- the runtime API ---------------------------------------------------------------------------
def _get_device_count() -> int:
    _init()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return 0 if visible is not None and visible.strip() in ("", "-1") else 1


def initialised() -> bool:
    """Whether this process initialised the (simulated) driver."""
    return _initialised_pid == os.getpid()


def _get_device() -> int:
    _init()
    return int(getattr(_tls, "device", 0))


def _set_device(device: int) -> None:
    if device != 0:
        raise CUDARuntimeError("cudaErrorInvalidDevice", f"device {device} (one simulated)")
    _runtime_call()
    _tls.device = device


def _memcpy_async(dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
    _runtime_call()
    if nbytes == 0:
        return
    want = {1: (False, True), 2: (True, False), 3: (True, True), 0: (False, False)}.get(kind)
    if want is not None and want != (_is_device(src), _is_device(dst)):
        raise CUDARuntimeError("cudaErrorInvalidValue",
                               f"memcpyAsync kind {kind} from {src:#x} to {dst:#x}: the "
                               "addresses are not of the memory the kind names")
    for ptr, what in ((src, "copy source"), (dst, "copy destination")):
        if _is_device(ptr):
            _locate(ptr, nbytes, what)
    dst_alloc = _space.find(dst) if _is_device(dst) else None
    if dst_alloc is not None and dst_alloc.pid and _is_device(src):
        raise CUDARuntimeError("cudaErrorNotSupported", "a device-to-device copy into a "
                               "peer's memory is not simulated (windows stage through host)")

    def copy() -> None:
        if dst_alloc is not None and dst_alloc.pid:
            _peer_read(dst_alloc.pid, dst_alloc.remote + (dst - dst_alloc.base), src, nbytes,
                       write=True)
            return
        d = _host_address(dst, nbytes, "copy destination")
        if _is_device(src):
            alloc, off = _locate(src, nbytes, "copy source")
            if alloc.pid:
                _peer_read(alloc.pid, alloc.remote + off, d, nbytes)
                return
            ctypes.memmove(d, alloc.host_address() + off, nbytes)
        else:
            ctypes.memmove(d, src, nbytes)
    _dev().submit(_queue_of(stream), "run", copy)


def _host_address(ptr: int, nbytes: int, what: str) -> int:
    if not _is_device(ptr):
        return ptr
    alloc, off = _locate(ptr, nbytes, what)
    return alloc.host_address() + off


def _ipc_get_mem_handle(ptr: int) -> bytes:
    _runtime_call()
    alloc, _off = _locate(ptr, 1, "ipcGetMemHandle")
    if alloc.pid:
        raise CUDARuntimeError("cudaErrorInvalidValue", "memory opened from a peer")
    # the handle names the whole allocation, whatever pointer inside it was passed
    return _MEM_HANDLE.pack(_MEM_MAGIC, os.getpid(), alloc.host_address(),
                            alloc.size).ljust(64, b"\0")


def _ipc_open_mem_handle(handle: bytes, flags: int = 1) -> int:
    _runtime_call()
    magic, pid, remote, size = _MEM_HANDLE.unpack_from(bytes(handle))
    if magic != _MEM_MAGIC:
        raise CUDARuntimeError("cudaErrorInvalidResourceHandle", "not a simulator handle")
    if pid == os.getpid():
        raise CUDARuntimeError("cudaErrorInvalidResourceHandle",
                               "a process cannot open its own IPC handle")
    return _space.add(size, pid, remote).base


def _ipc_close_mem_handle(ptr: int) -> None:
    _runtime_call()
    alloc = _space.find(ptr)
    if alloc is None or not alloc.pid or alloc.base != ptr:
        raise CUDARuntimeError("cudaErrorInvalidValue", f"{ptr:#x} is no opened IPC mapping")
    _space.remove(ptr)


def _ipc_get_event_handle(ptr: int) -> bytes:
    _runtime_call()
    event = _event(ptr)
    if not getattr(event, "interprocess", False):
        raise CUDARuntimeError("cudaErrorInvalidResourceHandle",
                               "the event was not created with interprocess=True")
    return _EVENT_HANDLE.pack(_EVENT_MAGIC, os.getpid(),
                              int(event.state.counts.ctypes.data)).ljust(64, b"\0")


def _ipc_open_event_handle(handle: bytes) -> int:
    _runtime_call()
    magic, pid, address = _EVENT_HANDLE.unpack_from(bytes(handle))
    if magic != _EVENT_MAGIC or pid == os.getpid():
        raise CUDARuntimeError("cudaErrorInvalidResourceHandle", "bad IPC event handle")
    ptr = next(_event_ids)
    _events[ptr] = _PeerEvent(pid, address)
    return ptr


def _stream_wait_event(stream: int, event: int, flags: int = 0) -> None:
    _runtime_call()
    found = _event(event)
    # waits for the work before the event's latest record, as cudaStreamWaitEvent
    target = found.recorded()
    _dev().submit(_queue_of(stream), "wait", (found, target))


def _event_record(event: int, stream: int) -> None:
    _runtime_call()
    found = _event(event)
    if not isinstance(found, Event):
        raise CUDARuntimeError("cudaErrorInvalidResourceHandle",
                               f"event {event:#x} was opened from another process")
    found.record(_wrap(stream))


def _event_destroy(event: int) -> None:
    _runtime_call()
    _events.pop(event, None)


def _pointer_attributes(ptr: int) -> SimpleNamespace:
    _runtime_call()
    return SimpleNamespace(device=0 if _space.find(ptr) is not None else -2, devicePointer=ptr)


runtime = SimpleNamespace(
    getDeviceCount=_get_device_count, getDevice=_get_device, setDevice=_set_device,
    memcpyAsync=_memcpy_async, ipcGetMemHandle=_ipc_get_mem_handle,
    ipcOpenMemHandle=_ipc_open_mem_handle, ipcCloseMemHandle=_ipc_close_mem_handle,
    ipcGetEventHandle=_ipc_get_event_handle, ipcOpenEventHandle=_ipc_open_event_handle,
    streamWaitEvent=_stream_wait_event, eventRecord=_event_record, eventDestroy=_event_destroy,
    pointerGetAttributes=_pointer_attributes, CUDARuntimeError=CUDARuntimeError)


class _Driver:
    """The driver entry points pycoll calls through ctypes (``libcuda.so.1``'s names)."""

    @staticmethod
    def cuMemGetAddressRange_v2(pbase: Any, psize: Any, ptr: Any) -> int:  # noqa: N802
        if _forked():
            return _NOT_INITIALIZED
        if not getattr(_tls, "context", False):
            return _CONTEXT_ERROR       # a driver call makes no context current
        address = int(ptr.value) if hasattr(ptr, "value") else int(ptr)
        alloc = _space.find(address)
        if alloc is None or alloc.pid:
            return _VALUE_ERROR
        pbase.contents.value = alloc.base
        psize.contents.value = alloc.size
        return 0


libcuda = _Driver()


def _alloc_pinned_memory(nbytes: int) -> np.ndarray:
    _runtime_call()
    return np.zeros(nbytes, dtype=np.uint8)


cuda = SimpleNamespace(
    Device=Device, Stream=Stream, ExternalStream=ExternalStream, Event=Event,
    UnownedMemory=UnownedMemory, MemoryPointer=MemoryPointer, runtime=runtime,
    get_current_stream=get_current_stream, alloc_pinned_memory=_alloc_pinned_memory)


# -- arrays ------------------------------------------------------------------------------------
def _enqueue(fn: Callable[[], None]) -> None:
    """Launch a 'kernel' on the current stream (a driver launch: no context made current)."""
    _dev().submit(_queue_of(get_current_stream().ptr), "run", fn, runtime_api=False)


class ndarray:  # noqa: N801 - CuPy's name
    """A C-contiguous device array. The host cannot read it (no ``__array__``): copy it out
    with ``asnumpy``, as with CuPy. Element-wise work is queued on the current stream."""

    def __init__(self, shape: Any, dtype: Any = float, memptr: MemoryPointer | None = None
                 ) -> None:
        self.shape = tuple(shape) if isinstance(shape, (tuple, list)) else (int(shape),)
        self.dtype = np.dtype(dtype)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.nbytes = self.size * self.dtype.itemsize
        self.data = memptr if memptr is not None else MemoryPointer(_Memory(self.nbytes), 0)
        if self.size == 0:
            self.data = MemoryPointer(UnownedMemory(0, 0, None), 0)

    ndim = property(lambda self: len(self.shape))
    itemsize = property(lambda self: self.dtype.itemsize)
    device = property(lambda self: Device(0))

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"simulator.ndarray(shape={self.shape}, dtype={self.dtype}, ptr={self.data.ptr:#x})"

    def __array__(self, *args: Any, **kw: Any) -> Any:
        raise TypeError("implicit conversion of (simulated) device memory to a numpy array is "
                        "not allowed; use asnumpy()")

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        current = get_current_stream().ptr
        return {"shape": self.shape, "typestr": self.dtype.str, "strides": None,
                "data": (self.data.ptr if self.size else 0, False), "version": 3,
                "stream": current or 1}

    def _at(self, offset_bytes: int, shape: tuple[int, ...], dtype: np.dtype) -> ndarray:
        if self.data.ptr == 0 or int(np.prod(shape)) == 0:
            return ndarray(shape, dtype, MemoryPointer(UnownedMemory(0, 0, None), 0))
        return ndarray(shape, dtype, MemoryPointer(self.data.mem,
                                                   self.data.ptr - self.data.mem.ptr
                                                   + offset_bytes))

    def __getitem__(self, key: Any) -> ndarray:
        if key is Ellipsis:
            return self
        if not isinstance(key, slice) or self.ndim != 1:
            raise TypeError(f"the simulator's arrays take 1-D slices only, not {key!r}")
        start, stop, step = key.indices(self.size)
        if step != 1:
            raise TypeError("the simulator's arrays take contiguous slices only")
        n = max(0, stop - start)
        return self._at(start * self.itemsize, (n,), self.dtype)

    def __setitem__(self, key: Any, value: Any) -> None:
        dst = self[key]
        if isinstance(value, ndarray):
            if value.size != dst.size:
                raise ValueError(f"cannot copy {value.size} elements into {dst.size}")

            def copy() -> None:       # CuPy's copy kernel (casting where dtypes differ)
                _kernel_view(dst)[...] = _kernel_view(value)
            _enqueue(copy)
            return
        scalar = np.asarray(value, dtype=dst.dtype)

        def fill() -> None:
            _kernel_view(dst)[...] = scalar
        _enqueue(fill)

    def view(self, dtype: Any) -> ndarray:
        dtype = np.dtype(dtype)
        if self.nbytes % dtype.itemsize:
            raise ValueError("the array's size is not a multiple of the new dtype's")
        return self._at(0, (self.nbytes // dtype.itemsize,), dtype)

    def reshape(self, *shape: Any) -> ndarray:
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple) else shape
        if -1 in shape:
            known = int(np.prod([s for s in shape if s != -1])) or 1
            shape = tuple(self.size // known if s == -1 else s for s in shape)
        return self._at(0, tuple(int(s) for s in shape), self.dtype)

    def ravel(self) -> ndarray:
        return self.reshape(-1)

    def copy(self) -> ndarray:
        out = ndarray(self.shape, self.dtype)
        out[...] = self
        return out

    def astype(self, dtype: Any) -> ndarray:
        out = ndarray(self.shape, dtype)
        out.reshape(-1)[...] = self.reshape(-1)
        return out

    def __imul__(self, factor: Any) -> ndarray:
        scalar = np.asarray(factor)

        def scale() -> None:
            v = _kernel_view(self)
            np.multiply(v, scalar.astype(v.dtype), out=v)
        _enqueue(scale)
        return self


def _kernel_view(arr: ndarray) -> np.ndarray:
    return _host_view(arr.data.ptr, arr.nbytes, arr.dtype).reshape(arr.shape)


def empty(shape: Any, dtype: Any = float) -> ndarray:
    return ndarray(shape, dtype)


def zeros(shape: Any, dtype: Any = float) -> ndarray:
    arr = ndarray(shape, dtype)
    arr[...] = 0
    return arr


def asarray(host: Any, dtype: Any = None) -> ndarray:
    """A device copy of ``host`` (queued on the current stream, as CuPy's)."""
    src = np.ascontiguousarray(np.asarray(host, dtype=dtype))
    arr = ndarray(src.shape, src.dtype)
    keep = src.copy()       # the source may change before the copy runs: copy what it is now

    def upload() -> None:
        if keep.nbytes:
            _kernel_view(arr)[...] = keep
    _enqueue(upload)
    return arr


def asnumpy(arr: ndarray) -> np.ndarray:
    """The array's bytes on the host, once the current stream ran what was queued on it."""
    out = np.empty(arr.shape, dtype=arr.dtype)
    if arr.nbytes:
        runtime.memcpyAsync(int(out.ctypes.data), arr.data.ptr, arr.nbytes, 2,
                            get_current_stream().ptr)
    get_current_stream().synchronize()
    return out


class ElementwiseKernel:
    """pycoll's reduction kernels, by name (``pycoll.cuda.kernels``), run as the host
    reductions of ``pycoll.buffers.reduction`` on the device thread: the CUDA C bodies are
    not simulated."""

    def __init__(self, in_params: str, out_params: str, operation: str, name: str = "kernel"
                 ) -> None:
        if not name.startswith("pycoll_"):
            raise CUDARuntimeError("cudaErrorNotSupported", f"kernel {name!r} is not simulated")
        self.name = name[len("pycoll_"):]

    def __call__(self, *args: Any) -> None:
        name = self.name
        if name.startswith("scale_") or name == "avg_int":
            factor, arr = args
            dtype = name[len("scale_"):] if name.startswith("scale_") else arr.dtype.name

            def run() -> None:
                host = _kernel_view(arr)
                if name == "avg_int":
                    finish(ReduceOp.AVG, dtype, host, int(factor))
                else:
                    prepare(ReduceOp.premul_sum(float(factor)), dtype, host)
        else:
            op, dtype = name.rsplit("_", 1)
            src, dst = args
            f = reducer(ReduceOp("sum" if op in ("avg", "premul_sum") else op), dtype)

            def run() -> None:
                f(_kernel_view(dst), _kernel_view(src))
        _enqueue(run)
