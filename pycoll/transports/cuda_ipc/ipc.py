"""The device half of the CUDA IPC transport: a sender exports the allocation holding its
buffer (IPC memory handle, offset, ready event); a receiver opens it (mappings cached) and
queues the device-to-device copy on pycoll's stream."""
from __future__ import annotations

import os
import struct
from collections import OrderedDict
from typing import Any

from ...buffers.memory import MemRef
from ...errors import TransportError

# mem handle, event handle, offset in the allocation, sender device, sender pid
DEVICE_BODY = struct.Struct("<64s64sqqq")
_MAX_MAPPINGS = 256          # opened peer allocations kept mapped (least recently used go)


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
            from ...cuda import runtime
            cp = runtime.cupy()
            with cp.cuda.Device(device):
                event = cp.cuda.Event(block=False, disable_timing=True, interprocess=True)
                handle = bytes(cp.cuda.runtime.ipcGetEventHandle(event.ptr))
            found = self._send_events[device] = (event, handle)
        return found

    def export(self, mem: MemRef, peer: int) -> bytes:
        """The slot body announcing ``mem`` to ``peer`` (records the ready event)."""
        from ...cuda import runtime
        cp = runtime.cupy()
        device = int(mem.device or 0)
        if mem.nbytes == 0:
            # an empty array has pointer 0 (CuPy's empty(0)): no allocation, nothing to share
            return DEVICE_BODY.pack(b"", b"", 0, device, os.getpid())
        handle, offset = self.share(mem.ptr, device, f"the buffer sent to rank {peer}", peer)
        with cp.cuda.Device(device):
            event, event_handle = self._send_event(device)
            event.record(runtime.pycoll_stream(device))
        return DEVICE_BODY.pack(handle, event_handle, offset, device, os.getpid())

    def share(self, ptr: int, device: int, what: str, peer: int = -1
              ) -> tuple[bytes, int]:
        """The IPC memory handle of the allocation holding ``ptr`` and ``ptr``'s offset in it
        (a handle names a whole allocation)."""
        from ...cuda import runtime
        cp = runtime.cupy()
        runtime.make_current(device)      # before the driver call (async: a fresh thread)
        with cp.cuda.Device(device):
            try:
                base, _size = runtime.address_range(ptr)
            except runtime.DriverError as e:
                raise TransportError(f"rank {self.rank}: cuda_ipc: {e}: not memory of the "
                                     "current device's context?", peer=peer) from None
            try:
                return bytes(cp.cuda.runtime.ipcGetMemHandle(base)), ptr - base
            except Exception as e:  # noqa: BLE001 - CUDARuntimeError
                raise TransportError(
                    f"rank {self.rank}: cuda_ipc: {what} cannot be shared with another process "
                    f"({e}); managed memory and VMM allocations (torch expandable_segments) "
                    "have no legacy IPC handle: use the default allocator, or set "
                    "PYCOLL_TRANSPORTS=shm to stage through host memory", peer=peer) from None

    def map_window(self, device: int, handle: bytes, peer: int) -> int:
        """Map a peer's window allocation for as long as the window is open (outside the
        cache of message mappings, whose least recently used ones are closed; CUDA counts
        the opens of one handle, so a mapping both hold stays until both closed it)."""
        from ...cuda import runtime
        runtime.make_current(device)
        cp = runtime.cupy()
        with cp.cuda.Device(device):
            try:
                return int(cp.cuda.runtime.ipcOpenMemHandle(handle))
            except Exception as e:  # noqa: BLE001 - CUDARuntimeError
                raise TransportError(
                    f"rank {self.rank}: cuda_ipc: cannot map rank {peer}'s device window "
                    f"({e}); the GPUs may not be peer-accessible", peer=peer) from None

    @staticmethod
    def unmap_window(device: int, base: int) -> None:
        from ...cuda import runtime
        try:
            cp = runtime.cupy()
            with cp.cuda.Device(device):
                cp.cuda.runtime.ipcCloseMemHandle(base)
        except Exception:  # noqa: BLE001 - closing at exit: the driver may be gone already
            pass

    def read(self, mem: MemRef, body: bytes, peer: int) -> Any:
        """Queue the copy of the peer's announced buffer into ``mem``; returns the event that
        completes when the copy has run (None: an empty message, nothing to copy)."""
        from ...cuda import runtime
        cp = runtime.cupy()
        rt = cp.cuda.runtime
        handle, event_handle, offset, _src_device, pid = DEVICE_BODY.unpack(body)
        if mem.nbytes == 0:          # sizes matched: the sender's is empty too
            return None
        if pid == os.getpid():
            raise TransportError(f"rank {self.rank}: cuda_ipc: rank {peer} is this same process; "
                                 "CUDA cannot open its own IPC handles", peer=peer)
        device = int(mem.device or 0)
        runtime.make_current(device)
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
        from ...cuda import runtime
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

    def to_host(self, mem: MemRef, address: int) -> None:
        """Copy ``mem`` to host ``address`` on pycoll's stream and wait for it (a small
        message's way into a slot: after the work queued before it on that stream)."""
        if mem.nbytes:
            from ...cuda import runtime
            device = int(mem.device or 0)
            runtime.make_current(device)
            runtime.memcpy(address, mem.ptr, mem.nbytes, runtime.DEVICE_TO_HOST, device)
            runtime.synchronize(device)

    def from_host(self, mem: MemRef, address: int) -> None:
        """Copy ``mem.nbytes`` from host ``address`` into ``mem`` and wait for it (the slot
        it comes from is reused as soon as this returns)."""
        if mem.nbytes:
            from ...cuda import runtime
            device = int(mem.device or 0)
            runtime.make_current(device)
            runtime.memcpy(mem.ptr, address, mem.nbytes, runtime.HOST_TO_DEVICE, device)
            runtime.synchronize(device)

    @staticmethod
    def finished(event: Any) -> bool:
        return bool(event.done)

    @staticmethod
    def wait(event: Any) -> None:
        """Block until the copy behind ``event`` has run."""
        event.synchronize()

    def close(self) -> None:
        try:
            from ...cuda import runtime
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
