"""CUDA IPC transport: same-host ranks move device memory GPU to GPU, no host copy.

It is the shared-memory transport (``shm/``: slots, rendezvous completion words, peer
liveness) with one more message kind, added by ``CudaIpcChannel`` through the shm channel's
hooks (shm itself knows nothing of devices). Host messages travel exactly as over shm; a
device message is a rendezvous:

1. the sender records an interprocess event on pycoll's stream (after the kernels that
   produced the data) and puts into a slot the IPC handle of the allocation holding the
   data, the data's offset in it (pool allocators hand out pieces of larger allocations:
   torch's caching allocator and CuPy's pool both do, and the handle only names the base),
   and the event's handle;
2. the receiver opens the handle (once per allocation: mappings are cached), makes its
   stream wait for the sender's event (a GPU-side wait), and queues one device-to-device copy
   from the peer's memory into the receive buffer. The receive is complete as soon as the
   copy is queued: everything that reads the buffer afterwards is queued behind it on the same
   stream;
3. when the copy has run (an event polled by progress), the receiver sets the rendezvous
   completion word, and the sender's request completes: its buffer is its own again.

The host-side sequence number in the completion word is what orders re-recorded events
(an event has no generation number of its own). Same device or different devices of one
host both work (``cudaIpcMemLazyEnablePeerAccess``; one GPU shared by several ranks is the
case NCCL also treats as peer-to-peer). Memory from ``cudaMallocManaged`` or VMM allocations
(torch's ``expandable_segments``) cannot be exported with legacy IPC handles; the sender then
raises a clear error (use the default allocator, or host memory).

A rank that passes device memory where its peer passes host memory (or the reverse) is
refused on both sides with an error, never a silent reinterpretation.
"""
from __future__ import annotations

import ctypes
import os
import struct
from collections import OrderedDict, deque
from typing import Any, NamedTuple

from ..buffers.memory import CUDA, HOST, MemRef
from ..errors import TransportError
from .base import Capabilities, OpenContext, PeerInfo, Request
from .shm.channel import ShmChannel
from .shm.segment import DONE_BASE, FIRST_EXTENSION_KIND, RNDV_WINDOW, Segment
from .shm.transport import ShmTransport

#: the slot kind of a device buffer's announcement (after shm's own kinds)
DEVICE = FIRST_EXTENSION_KIND
# mem handle, event handle, offset in the allocation, sender device, sender pid
DEVICE_BODY = struct.Struct("<64s64sqqq")
_MAX_MAPPINGS = 256          # opened peer allocations kept mapped (least recently used go)


def _address_range(ptr: int) -> tuple[int, int]:
    """(base, size) of the allocation holding device address ``ptr`` (cuMemGetAddressRange:
    CuPy has no binding for it; numba uses the same driver call)."""
    lib = _libcuda()
    base, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
    status = lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size),
                                         ctypes.c_uint64(ptr))
    if status != 0:
        raise TransportError(f"cuda_ipc: cuMemGetAddressRange({ptr:#x}) failed with CUresult "
                             f"{status}: not memory of the current device's context?")
    return int(base.value), int(size.value)


_lib: Any = None


def _libcuda() -> Any:
    global _lib
    if _lib is None:
        _lib = ctypes.CDLL("libcuda.so.1")
        _lib.cuMemGetAddressRange_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64),
                                                 ctypes.POINTER(ctypes.c_size_t),
                                                 ctypes.c_uint64]
        _lib.cuMemGetAddressRange_v2.restype = ctypes.c_int
    return _lib


class DeviceIpc:
    """The device half of the transport: export on the sending side, open and copy on the
    receiving side; one per transport (per rank)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._mappings: OrderedDict[tuple[int, bytes], int] = OrderedDict()   # -> base
        self._events: dict[bytes, int] = {}        # peer event handle -> opened event
        self._send_events: dict[int, tuple[Any, bytes]] = {}   # device -> (event, handle)

    def _send_event(self, device: int) -> tuple[Any, bytes]:
        found = self._send_events.get(device)
        if found is None:
            from ..cuda import runtime
            cp = runtime.cupy()
            with cp.cuda.Device(device):
                event = cp.cuda.Event(block=False, disable_timing=True, interprocess=True)
                handle = bytes(cp.cuda.runtime.ipcGetEventHandle(event.ptr))
            found = self._send_events[device] = (event, handle)
        return found

    def export(self, mem: MemRef, peer: int) -> bytes:
        """The slot body announcing ``mem`` to ``peer`` (records the ready event)."""
        from ..cuda import runtime
        cp = runtime.cupy()
        device = int(mem.device or 0)
        with cp.cuda.Device(device):
            base, _size = _address_range(mem.ptr)
            try:
                handle = bytes(cp.cuda.runtime.ipcGetMemHandle(base))
            except Exception as e:  # noqa: BLE001 - CUDARuntimeError
                raise TransportError(
                    f"rank {self.rank}: cuda_ipc: the buffer sent to rank {peer} cannot be "
                    f"shared with another process ({e}); managed memory and VMM allocations "
                    "(torch expandable_segments) have no legacy IPC handle: use the default "
                    "allocator, or set PYCOLL_TRANSPORTS=shm to stage through host memory",
                    peer=peer) from None
            event, event_handle = self._send_event(device)
            event.record(runtime.pycoll_stream(device))
        return DEVICE_BODY.pack(handle, event_handle, mem.ptr - base, device, os.getpid())

    def read(self, mem: MemRef, body: bytes, peer: int) -> Any:
        """Queue the copy of the peer's announced buffer into ``mem``; returns the event that
        completes when the copy has run."""
        from ..cuda import runtime
        cp = runtime.cupy()
        rt = cp.cuda.runtime
        handle, event_handle, offset, _src_device, pid = DEVICE_BODY.unpack(body)
        if pid == os.getpid():
            raise TransportError(f"rank {self.rank}: cuda_ipc: rank {peer} is this same process; "
                                 "CUDA cannot open its own IPC handles", peer=peer)
        device = int(mem.device or 0)
        with cp.cuda.Device(device):
            base = self._open(device, handle, peer)
            event = self._events.get(event_handle)
            if event is None:
                event = self._events[event_handle] = rt.ipcOpenEventHandle(event_handle)
            stream = runtime.pycoll_stream(device)
            rt.streamWaitEvent(stream.ptr, event, 0)
            rt.memcpyAsync(mem.ptr, base + offset, mem.nbytes, runtime.DEFAULT, stream.ptr)
            done = cp.cuda.Event(block=False, disable_timing=True)
            done.record(stream)
        return done

    def _open(self, device: int, handle: bytes, peer: int) -> int:
        key = (device, handle)
        base = self._mappings.get(key)
        if base is not None:
            self._mappings.move_to_end(key)
            return base
        from ..cuda import runtime
        rt = runtime.cupy().cuda.runtime
        try:
            base = int(rt.ipcOpenMemHandle(handle))
        except Exception as e:  # noqa: BLE001 - CUDARuntimeError
            raise TransportError(
                f"rank {self.rank}: cuda_ipc: cannot map rank {peer}'s device memory ({e}); "
                "the GPUs may not be peer-accessible: set PYCOLL_TRANSPORTS=shm to stage "
                "through host memory", peer=peer) from None
        self._mappings[key] = base
        if len(self._mappings) > _MAX_MAPPINGS:
            (old_device, _), old = self._mappings.popitem(last=False)
            runtime.synchronize(old_device)   # no copy may still read from it
            rt.ipcCloseMemHandle(old)
        return base

    @staticmethod
    def finished(event: Any) -> bool:
        return bool(event.done)

    def close(self) -> None:
        try:
            from ..cuda import runtime
            rt = runtime.cupy().cuda.runtime
            for device in {d for d, _ in self._mappings}:
                runtime.synchronize(device)
            for base in self._mappings.values():
                rt.ipcCloseMemHandle(base)
            for event in self._events.values():
                rt.eventDestroy(event)
        except Exception:  # noqa: BLE001 - closing at exit: the driver may be gone already
            pass
        self._mappings.clear()
        self._events.clear()


class DeviceNotice(NamedTuple):
    """A device buffer's announcement held for a receive not yet posted."""

    body: bytes
    seq: int


class CudaIpcChannel(ShmChannel):
    """An shm channel that also moves device memory (see the module docstring): a send
    without a host view is announced in a ``DEVICE`` slot, and a receive copies from the
    peer's device memory on pycoll's stream."""

    transport: CudaIpcTransport
    message_kinds = (*ShmChannel.message_kinds, DEVICE)

    def __init__(self, transport: CudaIpcTransport, peer: int, inbox: Segment,
                 address: dict[str, Any]) -> None:
        super().__init__(transport, peer, inbox, address)
        self._device = transport.device
        self._device_reads: deque[tuple[Any, int]] = deque()   # (copy-done event, seq)

    # -- sending -------------------------------------------------------------------------
    def _send_unaddressable(self, req: Request, out: Segment, off: int) -> bool:
        if self._window_full():
            return False
        self._sends.popleft()
        try:
            body = self._device.export(req.mem, self.peer)
        except TransportError as err:
            req.fail(err)       # nothing was announced: the pair stays in step
            return True
        self._announce(req, out, off, DEVICE, body)
        return True

    # -- receiving -----------------------------------------------------------------------
    def _memory_fits(self, req: Request, kind: int) -> bool:
        if (req.view is None) == (kind == DEVICE):
            return True
        self._memory_mismatch(req, kind == DEVICE)
        return False

    def _start_message(self, req: Request | None, tag: int, total: int, kind: int, aux: int,
                       at: int) -> None:
        if kind != DEVICE:
            super()._start_message(req, tag, total, kind, aux, at)
            return
        body = bytes(self._in.data[at: at + DEVICE_BODY.size])
        if req is None:
            self._match.hold(tag, total, DeviceNotice(body, aux))
        else:
            self._device_read(req, body, aux)

    def _deliver_held(self, req: Request, nbytes: int, body: Any) -> None:
        if (req.view is None) != isinstance(body, DeviceNotice):
            self._memory_mismatch(req, isinstance(body, DeviceNotice))
        elif isinstance(body, DeviceNotice):
            if self._size_ok(req, nbytes):
                self._device_read(req, body.body, body.seq)
        else:
            super()._deliver_held(req, nbytes, body)

    def _device_read(self, req: Request, body: bytes, seq: int) -> None:
        """Queue the copy out of the peer's device memory; the receive is complete at once
        (whatever reads it is queued behind the copy), the sender once the copy has run."""
        try:
            done = self._device.read(req.mem, body, self.peer)
        except TransportError as err:
            self._break(err)
            req.fail(err)
            return
        self._device_reads.append((done, seq))
        self._active[self.peer] = self
        req.complete()

    def _finish_device_reads(self) -> bool:
        reads, moved = self._device_reads, False
        finished = self._device.finished
        while reads and finished(reads[0][0]):
            _, seq = reads.popleft()
            self._in.ctrl[DONE_BASE + seq % RNDV_WINDOW] = seq + 1
            moved = True
        return moved

    def _memory_mismatch(self, req: Request, device_sent: bool) -> None:
        sent, posted = ("device", "host") if device_sent else ("host", "device")
        self._refuse(req, TransportError(
            f"rank {self.peer} sent {sent} memory where this rank receives into {posted} "
            f"memory (tag {req.tag}): every rank must pass device buffers, or every rank host "
            "buffers, to one call", peer=self.peer))

    # -- progress ------------------------------------------------------------------------
    def progress(self) -> bool:
        moved = super().progress()
        if self._device_reads:
            moved = self._finish_device_reads() or moved
        return moved

    def busy(self) -> bool:
        return super().busy() or bool(self._device_reads)


class CudaIpcTransport(ShmTransport):
    """shm, plus device memory moved GPU to GPU through CUDA IPC handles."""

    name = "cuda_ipc"
    channel_class = CudaIpcChannel
    capabilities = Capabilities("cuda_ipc", latency_us=10.0, bandwidth_gbps=100.0,
                                same_host_only=True, one_sided=True,
                                memory_types=frozenset({HOST, CUDA}),
                                segment_bytes=4 << 20)

    def __init__(self, ctx: OpenContext) -> None:
        super().__init__(ctx)
        self.device = DeviceIpc(ctx.rank)

    @classmethod
    def probe(cls) -> tuple[dict[str, Any] | None, str]:
        record, why = super().probe()
        if record is None:
            return None, why
        from ..cuda.runtime import unavailable_reason
        missing = unavailable_reason()
        if missing is not None:
            return None, missing
        return record, ""

    @staticmethod
    def can_connect(a: PeerInfo, b: PeerInfo) -> bool:
        return ShmTransport.can_connect(a, b)

    def close(self) -> None:
        super().close()
        self.device.close()
