"""``CudaIpcTransport``: the shm transport plus device memory moved through CUDA IPC."""
from __future__ import annotations

from typing import Any

from ...buffers.memory import CUDA, HOST, MemRef
from ..base import Capabilities, OpenContext, PeerInfo
from ..shm.doorbell import Doorbell
from ..shm.transport import ShmTransport
from ..windows import ExposedWindow
from .channel import CudaIpcChannel
from .ipc import DeviceIpc
from .window import CudaIpcExposedWindow


class CudaIpcTransport(ShmTransport):
    """shm, plus device memory moved GPU to GPU through CUDA IPC handles."""

    name = "cuda_ipc"
    channel_class = CudaIpcChannel
    capabilities = Capabilities("cuda_ipc", latency_us=10.0, bandwidth_gbps=100.0,
                                same_host_only=True, one_sided=True,
                                memory_types=frozenset({HOST, CUDA}),
                                segment_bytes=4 << 20, fast_path=True, windows=True)

    def __init__(self, ctx: OpenContext) -> None:
        super().__init__(ctx)
        self.device = DeviceIpc(ctx.rank)

    @classmethod
    def probe(cls) -> tuple[dict[str, Any] | None, str]:
        record, why = super().probe()
        if record is None:
            return None, why
        from ...cuda.runtime import missing_reason
        missing = missing_reason()        # initialises no CUDA: host-only jobs probe it too
        if missing is not None:
            return None, missing
        return record, ""

    @classmethod
    def details(cls) -> dict[str, Any] | None:
        """shm's details and the device runtime it would use (CuPy, or pycoll's CPU
        simulator): named without initialising CUDA."""
        from ...cuda import runtime
        return {**(super().details() or {}), "device runtime": runtime.runtime_name()}

    def expose_window(self, mem: MemRef, dtype: str = "", np_dtype: Any = None
                      ) -> ExposedWindow:
        """A host window is shm's; a device window adds its allocation's IPC handle
        (``window.py``)."""
        if mem.mem_type == HOST:
            return super().expose_window(mem, dtype, np_dtype)
        self._windows += 1
        return CudaIpcExposedWindow(f"{self._prefix}-win{self._windows}", mem.ptr, mem.nbytes,
                                    int(mem.device or 0), self.rank, self.device)

    @staticmethod
    def can_connect(a: PeerInfo, b: PeerInfo) -> bool:
        return ShmTransport.can_connect(a, b)

    def doorbell(self) -> Doorbell | None:
        """None: a device receive completes when its CUDA copy event has finished, and
        nothing rings the bell for that, so a waiter asleep on it would sleep until its
        liveness check; the engine polls instead."""
        return None

    def close(self) -> None:
        super().close()
        self.device.close()
