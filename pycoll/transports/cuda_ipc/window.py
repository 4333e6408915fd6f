"""Windows over cuda_ipc: a rank's window may be device memory, which origins on the same
host reach by mapping it through a CUDA IPC memory handle.

Everything an origin must share besides the bytes is shm's (``shm/window.py``): the
one-page control file with the signal counter and the closed word, and the byte-range
locks that make accumulates atomic and let a release wait for copies in flight. Only the
copy differs: instead of cross-memory attach into the target's host memory, the origin
copies between its host bytes (a device source or destination is staged through host by
the ``Window``) and the target's allocation, opened once per window with
``cudaIpcOpenMemHandle``, and waits for the copy before it releases its lock. So an
operation is complete at the target when it returns, as over shm. An accumulate reads the
target's elements into host scratch, combines them there and writes them back, under the
exclusive lock over those bytes. The target's own operations copy to its own pointer.

A host window over cuda_ipc is shm's window (the transport is shm plus device memory).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...buffers.memory import view_address
from ...errors import TransportError
from ..shm.window import ShmExposedWindow, ShmRemoteWindow
from .ipc import DeviceIpc


class CudaIpcExposedWindow(ShmExposedWindow):
    """This rank's device window: shm's control file plus the allocation's IPC handle."""

    def __init__(self, path: str, ptr: int, nbytes: int, device: int, rank: int,
                 ipc: DeviceIpc) -> None:
        super().__init__(path, ptr, nbytes, rank)
        self.device = device
        handle, offset = ipc.share(ptr, device, "a window")
        self.record.update({"device_handle": handle.hex(), "device_offset": offset,
                            "device": device})

    def local(self) -> ShmRemoteWindow:
        return CudaIpcRemoteWindow(self.rank, self.record, self._ptr, self.device)


class CudaIpcRemoteWindow(ShmRemoteWindow):
    """A handle on a device window: ``base`` is where this process reaches its first byte
    (the target's own pointer, or its allocation mapped here plus the offset)."""

    def __init__(self, peer: int, record: dict[str, Any], base: int, device: int,
                 unmap: Callable[[], None] | None = None) -> None:
        super().__init__(peer, record, cma=False)
        self.addr = base
        self.device = device
        self._unmap = unmap

    def close(self) -> None:
        super().close()
        unmap, self._unmap = self._unmap, None
        if unmap is not None:
            unmap()

    def _copy(self, offset: int, view: memoryview, write: bool) -> None:
        if not view.nbytes:
            return
        from ...cuda import runtime
        here, there = view_address(view), self.addr + offset
        runtime.make_current(self.device)
        try:
            if write:
                runtime.memcpy(there, here, view.nbytes, runtime.HOST_TO_DEVICE, self.device)
            else:
                runtime.memcpy(here, there, view.nbytes, runtime.DEVICE_TO_HOST, self.device)
            runtime.synchronize(self.device)     # complete before the lock is released
        except Exception as e:  # noqa: BLE001 - CUDARuntimeError
            raise TransportError(f"cuda_ipc: copying {'into' if write else 'from'} peer rank "
                                 f"{self.peer}'s device window failed: {e}",
                                 peer=self.peer) from None


def attach(ipc: DeviceIpc, peer: int, record: dict[str, Any]) -> CudaIpcRemoteWindow:
    """An origin's handle on ``peer``'s device window (its allocation mapped here)."""
    try:
        handle = bytes.fromhex(str(record["device_handle"]))
        offset = int(record["device_offset"])
    except (KeyError, TypeError, ValueError):
        raise TransportError(f"cuda_ipc: peer rank {peer} sent a malformed device window "
                             "record", peer=peer) from None
    from ...cuda import runtime
    here = int(runtime.cupy().cuda.runtime.getDevice())
    base = ipc.map_window(here, handle, peer)
    try:
        return CudaIpcRemoteWindow(peer, record, base + offset, here,
                                   lambda: ipc.unmap_window(here, base))
    except BaseException:
        ipc.unmap_window(here, base)
        raise
